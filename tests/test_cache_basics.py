"""Example tests of the cache semantics, run on every implementation."""

from __future__ import annotations

import array
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from radixmeta import CacheStats, RadixCache
from radixmeta.errors import CacheFullError, InputTypeError, InvalidInputError, StaleNodeError


@pytest.fixture
def public(impl: type) -> type:
    """``impl`` with RadixCache's pure-Python conveniences (locked, pretty, repr) mixed in."""
    extras = {name: vars(RadixCache)[name] for name in ("locked", "pretty", "__repr__")}
    return type(
        "RadixCacheOn" + impl.__module__.rsplit(".", 1)[-1], (impl,), {"__slots__": (), **extras}
    )


def leaves(cache: Any, namespace: Any = None) -> list[tuple[list[int], list[int]]]:
    return [(t.tolist(), v.tolist()) for t, v in cache.items(namespace=namespace)]


def labels(cache: Any, namespace: Any = None) -> list[tuple[int, list[int], int]]:
    return [(lvl, lab.tolist(), locks) for lvl, lab, locks in cache._structure(namespace)]


def sizes(cache: Any) -> tuple[int, int, int]:
    return cache.evictable_size, cache.protected_size, cache.total_size


# -- pages, splits, insert results ------------------------------------------------------------
def test_page_alignment(impl: type) -> None:
    cache = impl(4)
    assert cache.insert(list(range(1, 11))) == 0  # 10 tokens: the 2-token tail is dropped
    assert cache.total_size == 8
    assert leaves(cache) == [(list(range(1, 9)), list(range(1, 9)))]
    assert cache.match_prefix(list(range(1, 11))).length == 8
    assert cache.match_prefix(list(range(1, 8))).length == 4  # 7 tokens: one whole page
    assert cache.match_prefix([1, 2, 3]).length == 0  # less than a page
    # a match that diverges inside the second page is rounded down to the first
    m = cache.match_prefix([1, 2, 3, 4, 5, 6, 0, 0])
    assert (m.length, m.values.tolist()) == (4, [1, 2, 3, 4])
    assert cache.insert([1, 2, 3]) == 0  # shorter than a page: nothing stored
    assert cache.total_size == 8
    cache.check()


def test_insert_in_pages_splits_only_at_page_boundaries(impl: type) -> None:
    cache = impl(2)
    cache.insert([1, 2, 3, 4, 5, 6])
    assert cache.insert([1, 2, 3, 9, 9, 9]) == 2  # diverges inside the second page
    assert labels(cache) == [(0, [1, 2], 0), (1, [3, 4, 5, 6], 0), (1, [3, 9, 9, 9], 0)]
    assert cache.node_count == 3
    cache.check()


def test_split_on_match(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2, 3, 4, 5, 6])
    assert cache.node_count == 1
    m = cache.match_prefix([1, 2, 3, 9])
    assert (m.length, m.node.length) == (3, 3)
    assert cache.node_count == 2  # the match ends on a node boundary
    assert labels(cache) == [(0, [1, 2, 3], 0), (1, [4, 5, 6], 0)]
    assert leaves(cache) == [([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6])]
    assert sizes(cache) == (6, 0, 6)
    cache.check()


def test_insert_returns_already_cached_length(impl: type) -> None:
    cache = impl()
    assert cache.insert([1, 2, 3]) == 0
    assert cache.insert([1, 2, 3, 4, 5]) == 3
    assert cache.insert([1, 2]) == 2  # a prefix: splits, stores nothing
    assert cache.insert([1, 2, 3, 4, 5]) == 5
    assert cache.insert([1, 7]) == 1
    assert cache.insert([]) == 0
    assert cache.stats.inserted_tokens == 6
    assert cache.total_size == 6
    assert labels(cache) == [(0, [1], 0), (1, [2], 0), (2, [3], 0), (3, [4, 5], 0), (1, [7], 0)]
    cache.check()


def test_values_default_to_token_ids_and_are_never_overwritten(impl: type) -> None:
    cache = impl()
    cache.insert([5, 6, 7])
    cache.insert([5, 6, 8], [50, 60, 80])
    cache.insert([5, 6, 7, 9], [0, 0, 0, 90])
    assert cache.match_prefix([5, 6, 7, 9]).values.tolist() == [5, 6, 7, 90]
    assert cache.match_prefix([5, 6, 8]).values.tolist() == [5, 6, 80]
    big = [2**63 - 1, -(2**63), -1]
    cache.insert([1, 2, 3], big)
    m = cache.match_prefix([1, 2, 3])
    assert m.values.dtype == np.int64
    assert m.values.tolist() == big


def test_match_result_and_handle(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2, 3])
    m = cache.match_prefix([1, 2, 3, 4])
    assert type(m.length) is int and m.length == 3
    assert isinstance(m.values, np.ndarray) and m.values.dtype == np.int64
    assert m.node.length == 3
    miss = cache.match_prefix([9])
    assert (miss.length, miss.values.tolist(), miss.node.length) == (0, [], 0)
    empty = cache.match_prefix([])
    assert (empty.length, empty.node.length) == (0, 0)


def test_handle_survives_a_split_above_it(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2, 3, 4])
    handle = cache.match_prefix([1, 2, 3, 4]).node
    cache.insert([1, 2, 9])  # splits the node the handle names; the handle keeps [3, 4]
    assert handle.length == 4
    cache.lock(handle)
    assert sizes(cache) == (1, 4, 5)
    assert labels(cache) == [(0, [1, 2], 1), (1, [3, 4], 1), (1, [9], 0)]
    cache.unlock(handle)
    cache.check()


# -- namespaces -----------------------------------------------------------------------------
def test_namespaces_never_share_nodes(impl: type) -> None:
    cache = impl()
    assert cache.insert([1, 2, 3]) == 0
    assert cache.insert([1, 2, 3], [7, 8, 9], namespace="lora-a") == 0
    assert cache.insert([1, 2], namespace=("lora", 2)) == 0
    assert (cache.node_count, cache.total_size) == (3, 8)
    assert cache.match_prefix([1, 2, 3], namespace="lora-a").values.tolist() == [7, 8, 9]
    assert cache.match_prefix([1, 2, 3]).values.tolist() == [1, 2, 3]
    assert cache.match_prefix([1, 2, 3], namespace="unknown").length == 0
    assert cache.namespaces() == [None, "lora-a", ("lora", 2)]  # a match creates none
    assert leaves(cache, "lora-a") == [([1, 2, 3], [7, 8, 9])]
    assert leaves(cache, "unknown") == []
    # eviction is global (least recently used first), but frees one namespace's node
    assert cache.evict(1).values.tolist() == [1, 2]
    assert cache.namespaces() == [None, "lora-a"]  # an emptied namespace is forgotten
    assert leaves(cache, ("lora", 2)) == []
    cache.check()


def test_insert_of_nothing_creates_no_namespace(impl: type) -> None:
    cache = impl(4)
    assert cache.insert([1, 2], namespace="short") == 0
    assert cache.namespaces() == [None]
    assert cache.node_count == 0
    cache.check()


def test_emptied_namespaces_cost_nothing(impl: type) -> None:
    """Per-user cache salts: each namespace is filled once and evicted whole."""
    cache = impl(capacity=8)
    for user in range(200):
        cache.insert([user, user + 1, user + 2, user + 3], namespace=f"salt-{user}")
    assert cache.namespaces() == [None, "salt-198", "salt-199"]
    cache.evict(8)
    assert (cache.namespaces(), cache.node_count) == ([None], 0)
    cache.check()
    # A namespace emptied and refilled by one insert counts as created anew.
    cache.insert([1, 2, 3, 4], namespace="a")
    cache.insert([5, 6, 7, 8], namespace="b")
    cache.match_prefix([5, 6, 7, 8], namespace="b")
    cache.insert([9, 9, 9, 9, 9, 9, 9, 9], namespace="a")  # evicts a's only leaf, then b's
    assert cache.namespaces() == [None, "a"]
    cache.check()


def test_a_zero_length_match_names_the_default_root(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2], namespace="n")
    handle = cache.match_prefix([7], namespace="n").node
    cache.evict(2)  # the namespace's root goes; the handle does not name it
    cache.lock(handle)
    assert cache.lock_count(handle) == 0
    cache.unlock(handle)


# -- locks ----------------------------------------------------------------------------------
def test_lock_and_unlock_move_sizes_like_sglang(impl: type) -> None:
    """Every 0 -> 1 lock transition moves a node's tokens to protected, 1 -> 0 back."""
    cache = impl()
    cache.insert([1, 2, 3, 4, 5, 6, 7, 8])
    cache.insert([1, 2, 3, 4, 9, 10, 11, 12])  # [1-4] + [5-8] + [9-12]
    b = cache.match_prefix([1, 2, 3, 4, 5, 6, 7, 8]).node
    c = cache.match_prefix([1, 2, 3, 4, 9, 10, 11, 12]).node
    a = cache.match_prefix([1, 2, 3, 4]).node
    assert sizes(cache) == (12, 0, 12)
    cache.lock(b)
    assert sizes(cache) == (4, 8, 12)
    cache.lock(c)  # [1-4] already locked: only [9-12] moves
    assert sizes(cache) == (0, 12, 12)
    cache.lock(b)  # a second lock moves nothing
    assert sizes(cache) == (0, 12, 12)
    assert [cache.lock_count(n) for n in (a, b, c)] == [3, 2, 1]
    cache.unlock(b)
    assert sizes(cache) == (0, 12, 12)
    cache.unlock(b)
    assert sizes(cache) == (4, 8, 12)
    cache.lock(a)
    cache.unlock(c)
    assert sizes(cache) == (8, 4, 12)
    cache.unlock(a)
    assert sizes(cache) == (12, 0, 12)
    assert [cache.lock_count(n) for n in (a, b, c)] == [0, 0, 0]
    cache.check()


def test_split_of_a_locked_node_keeps_the_lock_below(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2, 3, 4])
    whole = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(whole)
    upper = cache.match_prefix([1, 2]).node  # split: the upper half copies the count
    assert (cache.lock_count(upper), cache.lock_count(whole)) == (1, 1)
    assert sizes(cache) == (0, 4, 4)
    cache.unlock(whole)  # releases both halves
    assert sizes(cache) == (4, 0, 4)
    assert cache.lock_count(upper) == 0
    cache.check()


def test_root_handle_locks_nothing(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2])
    root = cache.match_prefix([7]).node
    cache.lock(root)
    assert cache.lock_count(root) == 0
    assert sizes(cache) == (2, 0, 2)
    cache.unlock(root)
    assert cache.evict(5).values.tolist() == [1, 2]


def test_locked_nodes_are_not_evicted(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2, 3])
    cache.insert([1, 2, 4])
    cache.insert([5])
    handle = cache.match_prefix([1, 2, 3]).node
    cache.lock(handle)
    assert sorted(cache.evict(100).values.tolist()) == [4, 5]
    assert leaves(cache) == [([1, 2, 3], [1, 2, 3])]
    assert sizes(cache) == (0, 3, 3)
    cache.unlock(handle)
    assert cache.evict(100).values.tolist() == [3, 1, 2]
    assert cache.node_count == 0


# -- eviction -------------------------------------------------------------------------------
def test_evict_frees_whole_leaves_and_parents_after_children(impl: type) -> None:
    cache = impl()
    cache.insert([1, 2, 3, 4], [10, 20, 30, 40])
    cache.insert([1, 2, 5, 6], [0, 0, 50, 60])  # [1 2] + [3 4] + [5 6]
    first = cache.evict(1)  # a whole leaf goes, overshooting the request
    assert (first.values.tolist(), first.count) == ([30, 40], 2)
    second = cache.evict(3)  # the last child, then its now childless parent
    assert second.values.tolist() == [50, 60, 10, 20]
    assert (second.count, cache.total_size, cache.node_count) == (4, 0, 0)
    assert cache.evict(5).values.tolist() == []
    assert cache.stats.evicted_tokens == 6


def test_evict_zero_frees_nothing(impl: type) -> None:
    cache = impl()
    cache.insert([1])
    result = cache.evict(0)
    assert (result.count, result.values.dtype, cache.total_size) == (0, np.int64, 1)


@pytest.mark.parametrize(
    ("eviction", "order"),
    [("lru", [2, 1, 3]), ("lfu", [2, 3, 1]), ("fifo", [1, 2, 3]), ("priority", [1, 3, 2])],
)
def test_eviction_policy_order(impl: type, eviction: str, order: list[int]) -> None:
    cache = impl(eviction=eviction)
    cache.insert([1], priority=0)  # created first
    cache.insert([2], priority=5)
    cache.insert([3], priority=1)
    cache.insert([1])
    cache.insert([1])  # [1]: three stores, then [3]: two, the most recent access
    cache.insert([3])
    assert [cache.evict(1).values.tolist() for _ in range(3)] == [[t] for t in order]


def test_ties_fall_back_to_last_access_then_serial(impl: type) -> None:
    cache = impl(eviction="lfu")
    cache.insert([1])
    cache.insert([2])
    cache.insert([3])
    cache.match_prefix([2])
    cache.match_prefix([1])  # one hit each (their stores): [3] was used least recently
    assert cache.evict(3).values.tolist() == [3, 2, 1]
    pri = impl(eviction="priority")
    for key in ([1], [2], [3]):
        pri.insert(key, priority=4)
    pri.match_prefix([1])  # same priority: least recently used first
    assert pri.evict(3).values.tolist() == [2, 3, 1]


def test_issue_21_lfu_counts_stores_not_matches(impl: type) -> None:
    """LFU counts the inserts through a node, as SGLang does; matches count nothing."""
    cache = impl(eviction="lfu")
    cache.insert([1, 2], [10, 11])  # stored once
    for _ in range(3):
        cache.insert([5, 6], [20, 21])  # stored three times
    for _ in range(5):
        cache.match_prefix([1, 2])  # looked up five times: still one hit
    assert cache.evict(1).values.tolist() == [10, 11]


def test_lfu_counted_skips_what_the_caller_already_stored(impl: type) -> None:
    """``counted``: a request's second insert counts only the nodes past its first."""
    cache = impl(eviction="lfu")
    cache.insert([7, 7], [0, 1])  # a request's first chunk: [7 7] has one hit
    cache.insert([7, 7, 8, 8], [0, 1, 2, 3], counted=2)  # its second: [7 7] not again
    cache.insert([9, 9], [4, 5])  # one hit, the most recent
    # One hit each: [8 8], then [7 7] (it becomes a leaf), by last access, then [9 9].
    assert [cache.evict(1).values.tolist() for _ in range(3)] == [[2, 3], [0, 1], [4, 5]]
    again = impl(eviction="lfu")
    again.insert([7, 7], [0, 1])
    again.insert([7, 7, 8, 8], [0, 1, 2, 3])  # counted=0: another request, [7 7] counts twice
    again.insert([9, 9], [4, 5])
    assert [again.evict(1).values.tolist() for _ in range(3)] == [[2, 3], [4, 5], [0, 1]]


def test_lfu_a_split_copies_the_count_into_the_upper_half(impl: type) -> None:
    cache = impl(eviction="lfu")
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3])
    cache.insert([1, 2, 3, 4], [0, 1, 2, 3])  # two hits
    cache.insert([5], [9])
    cache.insert([5], [9])
    cache.insert([5], [9])  # three hits
    cache.match_prefix([1, 2])  # splits: both halves keep two hits
    assert cache.evict(1).values.tolist() == [2, 3]  # the lower half, two hits, older
    assert cache.evict(1).values.tolist() == [0, 1]  # the upper half: two hits, before [5]


@pytest.mark.parametrize(
    ("counted", "error", "message"),
    [
        (-1, InvalidInputError, "counted must be >= 0, got -1"),
        ("2", InputTypeError, "counted must be an integer"),
    ],
)
def test_a_bad_counted_raises_before_any_change(
    impl: type, counted: Any, error: type, message: str
) -> None:
    cache = impl(eviction="lfu")
    with pytest.raises(error, match=message):
        cache.insert([1, 2], counted=counted)
    assert cache.total_size == 0 and cache.node_count == 0


def test_priority_is_max_propagated_along_the_path(impl: type) -> None:
    cache = impl(eviction="priority")
    cache.insert([1, 2, 3], priority=0)
    cache.insert([1, 2], priority=9)  # splits; the upper half [1 2] takes priority 9
    cache.insert([7], priority=5)
    assert cache.evict(10).values.tolist() == [3, 7, 1, 2]
    cache.insert([1, 2], priority=9)
    cache.insert([1, 2, 3], priority=0)  # a lower priority does not lower the path's
    cache.insert([7], priority=5)
    assert cache.evict(10).values.tolist() == [3, 7, 1, 2]


def test_split_copies_last_access_and_creation(impl: type) -> None:
    lru = impl(eviction="lru")
    lru.insert([1, 2, 3, 4])
    lru.insert([9])
    lru.match_prefix([1, 2])  # split: [1 2] is touched, [3 4] is not
    assert lru.evict(10).values.tolist() == [3, 4, 9, 1, 2]
    fifo = impl(eviction="fifo")
    fifo.insert([9])
    fifo.insert([1, 2, 3, 4])
    fifo.match_prefix([1, 2])  # split: [1 2] keeps the creation stamp of [1 2 3 4]
    old = fifo.match_prefix([9]).node
    fifo.lock(old)
    assert fifo.evict(1).values.tolist() == [3, 4]
    fifo.unlock(old)
    assert fifo.evict(10).values.tolist() == [9, 1, 2]  # [9] was created first


def test_capacity_evicts_before_insert_and_calls_on_evict(impl: type) -> None:
    calls: list[Any] = []
    cache = impl(capacity=6, on_evict=calls.append)
    assert (cache.capacity, cache.on_evict) == (6, calls.append)
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([4, 5, 6], [40, 50, 60])
    assert calls == []  # nothing evicted: no call
    cache.match_prefix([1, 2, 3])  # [1 2 3] was used last, so [4 5 6] goes first
    assert cache.insert([7, 8], [70, 80]) == 0
    assert sizes(cache) == (5, 0, 5)
    assert cache.stats.evicted_tokens == 3
    assert len(calls) == 1  # one call for the operation, with one int64 array
    assert calls[0].dtype == np.int64 and calls[0].tolist() == [40, 50, 60]
    # explicit evictions are returned, not handed to on_evict
    assert cache.evict(1).values.tolist() == [10, 11, 12]
    assert len(calls) == 1
    cache.check()


def test_on_evict_is_called_after_the_operation_and_may_raise(impl: type) -> None:
    seen: list[Any] = []

    def on_evict(slots: Any) -> None:
        # Called outside the core: the cache is usable, and already changed.
        seen.append((slots.tolist(), cache.total_size, cache.match_prefix([1, 2]).length))
        msg = "allocator is gone"
        raise RuntimeError(msg)

    cache = impl(capacity=2, on_evict=on_evict)
    cache.insert([1, 2], [5, 6])
    with pytest.raises(RuntimeError, match="allocator is gone"):
        cache.insert([3, 4], [7, 8])
    assert seen == [([5, 6], 2, 0)]
    assert leaves(cache) == [([3, 4], [7, 8])]  # the change stands
    cache.check()


def test_reset_hands_every_slot_to_on_evict(impl: type) -> None:
    calls: list[Any] = []
    cache = impl(on_evict=calls.append)
    cache.reset()
    assert calls == []
    cache.insert([5, 6], [50, 60], namespace="n")
    cache.insert([1, 2, 3], [10, 11, 12])
    cache.insert([1, 2, 4], [10, 11, 14])
    cache.reset()
    # Namespace by namespace, each in key order, a node before its children.
    assert [c.tolist() for c in calls] == [[10, 11, 12, 14, 50, 60]]


def test_on_evict_must_be_callable(impl: type) -> None:
    with pytest.raises(InputTypeError, match="on_evict must be callable or None, got int"):
        impl(on_evict=3)


def test_take_evicted_is_deprecated_and_holds_one_insert(impl: type) -> None:
    cache = impl(capacity=4)
    cache.insert([1, 2])
    cache.insert([5, 6])
    cache.match_prefix([5, 6])  # [1 2] is least recently used
    assert cache.insert([1, 2, 3]) == 2  # but it is extended, so [5 6] goes
    with pytest.warns(DeprecationWarning, match="pass on_evict="):
        assert cache.take_evicted().tolist() == [5, 6]
    cache.insert([9])  # fits
    cache.insert([8])  # evicts [3]
    cache.insert([7])  # evicts [1 2]: only the latest insert's slots are kept
    with pytest.warns(DeprecationWarning):
        assert cache.take_evicted().tolist() == [1, 2]
    assert leaves(cache) == [([7], [7]), ([8], [8]), ([9], [9])]


# -- stats, items, reset ----------------------------------------------------------------------
def test_stats(impl: type) -> None:
    cache = impl(2)
    assert cache.stats == CacheStats(0, 0, 0, 0)
    cache.insert([1, 2, 3, 4, 5])
    cache.insert([1, 2, 9, 9])
    cache.match_prefix([1, 2, 3, 4])
    cache.match_prefix([7, 7])
    cache.match_prefix([1, 2, 9], namespace="x")
    cache.evict(1)
    assert cache.stats == CacheStats(lookups=3, hit_tokens=4, inserted_tokens=6, evicted_tokens=2)
    cache.reset()
    assert cache.stats == CacheStats()


def test_items_are_leaves_in_lexicographic_order(impl: type) -> None:
    cache = impl()
    for key in ([3], [1, 5], [10], [1, 2], [2], [9], [1, 2, 2**32 - 1]):
        cache.insert(key, [-t for t in key])
    items = cache.items()
    assert [t.tolist() for t, _ in items] == [[1, 2, 2**32 - 1], [1, 5], [2], [3], [9], [10]]
    assert all(t.dtype == np.uint32 and v.dtype == np.int64 for t, v in items)
    assert items[0][1].tolist() == [-1, -2, -(2**32 - 1)]
    paged = impl(2)
    for key in ([1, 10, 5, 5], [1, 9, 0, 0], [1, 10, 4, 4]):
        paged.insert(key)
    assert [t.tolist() for t, _ in paged.items()] == [[1, 9, 0, 0], [1, 10, 4, 4], [1, 10, 5, 5]]


def test_reset_empties_the_cache_and_makes_handles_stale(impl: type) -> None:
    cache = impl(capacity=3)
    cache.insert([1, 2, 3])
    cache.insert([4, 5], namespace="n")  # evicts [1 2 3]
    handle = cache.match_prefix([4, 5], namespace="n").node
    cache.lock(handle)
    cache.reset()
    assert sizes(cache) == (0, 0, 0)
    assert (cache.node_count, cache.namespaces(), cache.stats) == (0, [None], CacheStats())
    assert (cache.page_size, cache.capacity, cache.eviction) == (1, 3, "lru")
    with pytest.raises(StaleNodeError):
        cache.unlock(handle)
    assert cache.insert([4, 5], namespace="n") == 0  # usable again
    cache.check()


# -- public conveniences on every implementation ---------------------------------------------
def test_pretty_and_repr(public: type) -> None:
    cache = public(eviction="fifo", capacity=100)
    cache.insert(list(range(1, 11)))
    cache.insert([1, 2, 11])
    cache.lock(cache.match_prefix([1, 2, 11]).node)
    assert repr(cache) == (
        "RadixCache(page_size=1, eviction='fifo', capacity=100, nodes=3, tokens=11, "
        "evictable=8, protected=3)"
    )
    assert cache.pretty(max_tokens=4).splitlines() == [
        repr(cache),
        "  [2] 1 2  locked=1",
        "    [8] 3 4 5 6 ...",
        "    [1] 11  locked=1",
    ]
    assert "[8] 3 4 5 6 7 8 9 10" in cache.pretty()
    assert cache.pretty(namespace="none").splitlines() == [repr(cache)]


def test_locked_context_manager(public: type) -> None:
    cache = public()
    cache.insert([1, 2])
    node = cache.match_prefix([1, 2]).node
    with cache.locked(node) as held:
        assert held is node
        assert sizes(cache) == (0, 2, 2)
    assert sizes(cache) == (2, 0, 2)
    with pytest.raises(KeyError), cache.locked(node):
        raise KeyError
    assert cache.lock_count(node) == 0


# -- accepted input types ---------------------------------------------------------------------
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6]
def _unaligned(k: list[int], dtype: Any) -> Any:
    """A view of the values one byte into a buffer, so no element is aligned."""
    data = np.array(k, dtype=dtype).tobytes()
    return np.frombuffer(b"\0" + data, dtype=dtype, offset=1)


KEY_TYPES: list[tuple[str, Callable[[list[int]], Any]]] = [
    ("list", list),
    ("tuple", tuple),
    ("array-I", lambda k: array.array("I", k)),
    ("array-i", lambda k: array.array("i", k)),
    ("array-q", lambda k: array.array("q", k)),
    ("array-B", lambda k: array.array("B", k)),
    ("memoryview", lambda k: memoryview(array.array("I", k))),
    ("memoryview-numpy", lambda k: memoryview(np.array(k, dtype=np.int64))),
    ("int8", lambda k: np.array(k, dtype=np.int8)),
    ("int16", lambda k: np.array(k, dtype=np.int16)),
    ("int32", lambda k: np.array(k, dtype=np.int32)),
    ("uint32", lambda k: np.array(k, dtype=np.uint32)),
    ("int64", lambda k: np.array(k, dtype=np.int64)),
    ("uint64", lambda k: np.array(k, dtype=np.uint64)),
    ("uint8", lambda k: np.array(k, dtype=np.uint8)),
    ("strided", lambda k: np.array([x for t in k for x in (t, 99)], dtype=np.int64)[::2]),
    ("reversed", lambda k: np.array(k[::-1], dtype=np.uint32)[::-1]),
    ("column", lambda k: np.array([k, k], dtype=np.int32).T[:, 1]),
    ("fortran-slice", lambda k: np.asfortranarray(np.array([k, k], dtype=np.int16))[0]),
    ("numpy-scalars", lambda k: [np.int64(t) for t in k]),
    ("range", lambda k: range(k[0], k[0] + len(k))),
    ("big-endian-int32", lambda k: np.array(k, dtype=">i4")),
    ("big-endian-uint64", lambda k: np.array(k, dtype=">u8")),
    ("unaligned-int64", lambda k: _unaligned(k, np.int64)),
    ("unaligned-int32", lambda k: _unaligned(k, np.int32)),
]


@pytest.mark.parametrize("make", [m for _, m in KEY_TYPES], ids=[n for n, _ in KEY_TYPES])
def test_accepted_key_types(impl: type, make: Callable[[list[int]], Any]) -> None:
    key = make(TOKENS)
    expected = list(range(3, 11)) if isinstance(key, range) else TOKENS
    cache = impl(2)
    assert cache.insert(key) == 0
    assert leaves(cache) == [(expected, expected)]
    m = cache.match_prefix(make(TOKENS))
    assert (m.length, m.values.tolist()) == (8, expected)
    assert cache.insert(make(TOKENS)) == 8


@pytest.mark.parametrize("make", [m for _, m in KEY_TYPES], ids=[n for n, _ in KEY_TYPES])
def test_accepted_value_types(impl: type, make: Callable[[list[int]], Any]) -> None:
    values = make(TOKENS)
    expected = list(range(3, 11)) if isinstance(values, range) else TOKENS
    cache = impl()
    cache.insert([20, 21, 22, 23, 24, 25, 26, 27], values)
    assert cache.match_prefix([20, 21, 22, 23, 24, 25, 26, 27]).values.tolist() == expected


def test_empty_keys_of_every_type(impl: type) -> None:
    cache = impl()
    empties = ([], (), range(0), array.array("I"), np.array([], np.int64), np.array([]))
    for empty in (*empties, memoryview(b"")):  # np.array([]) is float64, but holds no token
        assert cache.insert(empty) == 0
        assert cache.match_prefix(empty).length == 0
    assert cache.total_size == 0


def test_full_token_range(impl: type) -> None:
    cache = impl()
    top = [0, 2**31, 2**32 - 1]
    for make in (list, lambda k: np.array(k, dtype=np.uint32), lambda k: np.array(k, np.uint64)):
        cache.insert(make(top))
    assert leaves(cache) == [(top, top)]
    assert cache.match_prefix(np.array(top, dtype=np.int64)).length == 3


def test_namespaces_are_listed_in_creation_order(impl: type) -> None:
    """Only an insert that succeeds creates a namespace; failed inserts and lookups don't."""
    cache = impl(capacity=0)
    with pytest.raises(CacheFullError):
        cache.insert([1], namespace="late")
    cache.match_prefix([1], namespace="later")
    assert cache.items(namespace="latest") == []
    grown = impl()
    for namespace in ("a", "latest", "later", "late"):
        assert grown.insert([1], namespace=namespace) == 0
    assert cache.namespaces() == [None]
    assert grown.namespaces() == [None, "a", "latest", "later", "late"]


def test_path_values_are_what_a_match_gathers(impl: type) -> None:
    """path_values(node) of a node matched with values=False: the same slots, no clock tick."""
    cache = impl(2)
    cache.insert([1, 2, 3, 4, 5, 6], [10, 11, 12, 13, 14, 15])
    cache.insert([1, 2, 7, 7], [20, 21, 22, 23], namespace="ns")
    m = cache.match_prefix([1, 2, 3, 4, 9, 9], values=False)
    assert m.values is None
    stats = cache.stats
    assert cache.path_values(m.node).tolist() == [10, 11, 12, 13]
    assert cache.path_values(m.node).dtype == np.int64
    assert cache.stats == stats
    full = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert cache.path_values(full.node).tolist() == full.values.tolist()
    other = cache.match_prefix([1, 2, 7, 7], namespace="ns", values=False)
    assert cache.path_values(other.node).tolist() == [20, 21, 22, 23]
    root = cache.match_prefix([], values=False).node
    assert cache.path_values(root).tolist() == []
    cache.evict(100)
    with pytest.raises(StaleNodeError):
        cache.path_values(m.node)
    with pytest.raises(InputTypeError, match="node must be a Node handle, got int"):
        cache.path_values(3)


@pytest.mark.parametrize("refresh", [False, True])
def test_refresh_split_tail_stamps_the_cut_off_half(impl: type, refresh: bool) -> None:
    """With refresh_split_tail the tokens past a split count as just used (SGLang's LRU)."""
    cache = impl(eviction="lru", refresh_split_tail=refresh)
    assert cache.refresh_split_tail is refresh
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([5, 6, 7, 8], [14, 15, 16, 17])
    cache.match_prefix([1, 2, 9])  # splits [1, 2, 3, 4]: [3, 4] is the cut-off half
    expected = [14, 15, 16, 17] if refresh else [12, 13]
    assert cache.evict(1).values.tolist() == expected
    cache = impl(refresh_split_tail=refresh)
    cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    cache.insert([5, 6, 7, 8], [14, 15, 16, 17])
    cache.insert([1, 2, 9, 9], [20, 21, 22, 23])  # an insert's split stamps it the same way
    assert cache.evict(1).values.tolist() == expected  # the new leaf [9, 9] is newest
    cache.check()
    with pytest.raises(InputTypeError, match="refresh_split_tail must be a bool, got int"):
        impl(refresh_split_tail=1)
