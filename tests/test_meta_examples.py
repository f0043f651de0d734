"""Plain examples of the documented MetaTree behaviour, on every MetaCore.

The gap rule, ``start``, idempotent stored events, approximate eviction (least recent,
deepest first, cutting the last node), the ``best()`` tie rule, index reuse with a
generation bump, 1,024 workers, and ``dump`` / block-map replay (what pickling relies on).
"""

from __future__ import annotations

import gc
import inspect
import pickle
import re
import weakref
from typing import Any

import numpy as np
import pytest
from conftest import META_CORES, NATIVE_META, REFERENCE_META

from radixmeta import BlockStatus, MetaTree, WorkerId
from radixmeta.errors import (
    BlockConflictError,
    InvalidInputError,
    StaleWorkerError,
    UnknownParentError,
)


def plain(records: Any) -> list[tuple[Any, ...]]:
    """Records (items, dumps, block entries) with their arrays as lists."""
    return [tuple(x.tolist() if isinstance(x, np.ndarray) else x for x in r) for r in records]


def items(tree: Any) -> list[tuple[list[int], list[str]]]:
    """(key, holder names) of the default namespace's nodes."""
    return [(k.tolist(), [w.name for w in h]) for k, h, ns, *_ in tree.items() if ns is None]


def dump(tree: Any, worker: WorkerId) -> list[tuple[list[int], int]]:
    return [(k.tolist(), s) for k, s, *_ in tree.dump(worker)]


def entries(tree: Any, worker: WorkerId) -> list[tuple[int, list[int]]]:
    return [(h, k.tolist()) for h, k, *_ in tree._block_entries(worker)]


def state(tree: Any) -> Any:
    per_worker = {
        w: (plain(tree.dump(w)), tree.held_tokens(w), plain(tree._block_entries(w)))
        for w in tree.workers
    }
    return plain(tree.items()), tree.namespaces(), per_worker, tree.n_workers


def test_gap_rule(meta_impl: type) -> None:
    tree = meta_impl(2)
    w = tree.add_worker("w")
    key = [1, 2, 3, 4, 5, 6, 7, 8]
    assert tree.insert(key, w) == 4
    assert tree.remove(key[:4], w, start=2) == 1  # the worker evicted page 2 only
    m = tree.match(key)
    assert m.length_of(w) == 2 and m.tree_length == 8  # the gap stops the count
    assert dump(tree, w) == [([1, 2], 0), ([1, 2, 3, 4, 5, 6, 7, 8], 4)]  # deeper marks stay
    assert tree.insert(key[:4], w, start=2) == 1  # filling the gap...
    assert tree.match(key).length_of(w) == 8  # ...makes the deeper pages count again
    tree.check()


def test_gap_from_a_block_event(meta_impl: type) -> None:
    tree = meta_impl(2)
    w = tree.add_worker("w")
    tree.apply_stored(w, None, [11, 12, 13], [1, 2, 3, 4, 5, 6])
    assert tree.apply_removed(w, [12, 99]) == 1  # 99: never stored, skipped
    assert tree.match([1, 2, 3, 4, 5, 6]).length_of(w) == 2
    with pytest.raises(UnknownParentError):  # page 2 went, and its hash with it
        tree.apply_stored(w, 12, [14], [9, 9])
    assert tree.apply_stored(w, 11, [12], [3, 4]) == 1
    assert tree.match([1, 2, 3, 4, 5, 6]).length_of(w) == 6
    tree.check()


def test_start(meta_impl: type) -> None:
    tree = meta_impl(2)
    a, b = tree.add_worker("a"), tree.add_worker("b")
    assert tree.insert([1, 2, 3, 4, 5, 6], a, start=4) == 1
    # The pages before start are structure, held by nobody.
    assert items(tree) == [([1, 2, 3, 4], []), ([1, 2, 3, 4, 5, 6], ["a"])]
    m = tree.match([1, 2, 3, 4, 5, 6])
    assert (m.length_of(a), m.tree_length) == (0, 6)
    assert tree.insert([1, 2, 3, 4, 5, 6], b) == 3
    assert items(tree) == [([1, 2, 3, 4], ["b"]), ([1, 2, 3, 4, 5, 6], ["a", "b"])]
    # start == the key's whole-page length: nothing to mark, nothing created.
    assert tree.insert([1, 2, 9, 9, 9], a, start=4) == 0
    assert tree.node_count == 2
    # remove from start on: the upper part stays.
    assert tree.remove([1, 2, 3, 4, 5, 6, 7], b, start=2) == 2
    assert items(tree) == [([1, 2], ["b"]), ([1, 2, 3, 4], []), ([1, 2, 3, 4, 5, 6], ["a"])]
    assert tree.remove([1, 2, 3, 4, 5, 6], b, start=2) == 0  # repeating is harmless
    assert tree.remove([1, 2, 3, 4, 5, 6], a) == 1
    assert items(tree) == [([1, 2], ["b"])]  # freed: nothing held there, nothing below
    tree.check()


def test_cuts_only_where_marks_differ(meta_impl: type) -> None:
    tree = meta_impl(1)
    a, b = tree.add_worker("a"), tree.add_worker("b")
    tree.insert([1, 2, 3, 4], a)
    tree.insert([1, 2], a)  # changes no mark: no cut even though the key ends inside
    tree.remove([1, 2, 9], b)  # b holds nothing there: no cut
    assert items(tree) == [([1, 2, 3, 4], ["a"])]
    tree.insert([1, 2, 9], b)  # diverges inside: the new branch needs a node to hang from
    assert items(tree) == [([1, 2], ["a", "b"]), ([1, 2, 3, 4], ["a"]), ([1, 2, 9], ["b"])]
    tree.check()


def test_repeated_stored_event_changes_nothing(meta_impl: type) -> None:
    tree = meta_impl(4)
    w = tree.add_worker("decode-0")
    system, turn = list(range(100, 108)), [7, 7, 7, 7]
    big = 2**63 + 0xA1  # vLLM sends it unsigned, SGLang as the signed 64-bit value
    assert tree.apply_stored(w, None, [big, 0xA2], system) == 2
    assert tree.apply_stored(w, 0xA2, [0xB1], turn) == 1
    before = state(tree)
    assert tree.apply_stored(w, 0xA2, [0xB1], turn) == 0
    assert tree.apply_stored(w, None, [big - 2**64], system[:4]) == 0  # signed form
    assert tree.apply_stored(w, big - 2**64, [], []) == 0  # no blocks: a no-op
    assert tree.apply_events([("stored", w, 0xA2, [0xB1], turn)]).tolist() == [0]
    assert state(tree) == before
    # The same page under another hash: refused, never a silent rename.
    with pytest.raises(BlockConflictError, match="0x00000000000000b2 names a block that"):
        tree.apply_stored(w, 0xA2, [0xB2], turn)
    assert state(tree) == before
    assert tree.apply_stored(w, 0xB1, [0xC1], turn) == 1  # the old name still works
    tree.check()


def test_issue_8_a_second_hash_for_one_page_is_a_conflict(meta_impl: type) -> None:
    """Two images with equal placeholder tokens and no tags: the second hash is refused
    (it used to rename A's page, so B's removal dropped it and A's continuation failed)."""
    t = meta_impl(page_size=4)
    w = t.add_worker("w")
    img = [9, 9, 9, 9]
    t.apply_stored(w, None, [0xA], img)
    t.apply_stored(w, 0xA, [0xA1], [1, 2, 3, 4])
    before = state(t)
    message = (
        "block_hashes[0] = 0x000000000000000b names a block that worker ('w', dp_rank=0) "
        "already names 0x000000000000000a"
    )
    with pytest.raises(BlockConflictError, match=f"^{re.escape(message)}$"):
        t.apply_stored(w, None, [0xB], img)
    assert state(t) == before
    assert t.apply_events([("stored", w, None, [0xB], img)]).tolist() == [BlockStatus.CONFLICT]
    assert t.apply_removed(w, [0xB]) == 0  # B was never stored: A's page stays
    assert t.match([*img, 1, 2, 3, 4]).length_of(w) == 8
    assert t.apply_stored(w, 0xA, [0xA2], [5] * 4) == 1  # A's continuation stores fine
    # Another worker may name the same page by another hash (vLLM <= 0.28 seeds per process).
    v = t.add_worker("v")
    assert t.apply_stored(v, None, [0xB], img) == 1
    assert t.apply_stored(v, 0xB, [0xB1], [1, 2, 3, 4]) == 1
    assert t.match([*img, 1, 2, 3, 4]).lengths.tolist() == [8, 8]
    t.check()


def test_stored_pages_are_one_page_nodes(meta_impl: type) -> None:
    tree = meta_impl(2)
    a, b = tree.add_worker("a"), tree.add_worker("b")
    tree.insert([1, 2, 3, 4, 5, 6], a)
    tree.apply_stored(b, None, [7, 8], [1, 2, 3, 4])  # cuts a's node into block pages
    assert items(tree) == [
        ([1, 2], ["a", "b"]), ([1, 2, 3, 4], ["a", "b"]), ([1, 2, 3, 4, 5, 6], ["a"])
    ]  # fmt: skip
    tree.insert([1, 2, 3, 4, 5, 6], b)
    assert tree.node_count == 3  # nodes never merge
    tree.remove([1, 2, 3, 4], b)  # dropping a page by another route drops its hash
    assert tree._block_entries(b) == []
    tree.check()


def test_approximate_eviction_order(meta_impl: type) -> None:
    """Least recently used first; on one path, deepest first; the last node is cut."""
    tree = meta_impl()
    w = tree.add_worker("w", capacity=6)
    x = tree.add_worker("x")  # an exact worker on the same pages: never evicted
    tree.insert([1, 2, 3, 4], w)
    tree.insert([1, 2, 3, 4], x)
    tree.insert([1, 2, 9, 9], w)  # 6 tokens held: [1, 2] shared by both branches
    tree.match([1, 2, 3, 4], touch=True)  # this branch is recent now
    tree.insert([5, 5, 5], w)  # 9 > 6: three tokens go
    assert tree.held_tokens(w) == 6
    assert dump(tree, w) == [([1, 2, 3], 2), ([1, 2], 0), ([5, 5, 5], 0)]  # oldest first
    assert tree.match([1, 2, 9, 9]).length_of(w) == 2  # the least recent branch went first
    assert tree.match([1, 2, 3, 4]).lengths.tolist() == [3, 4]  # then its deepest page
    assert items(tree) == [
        ([1, 2], ["w", "x"]), ([1, 2, 3], ["w", "x"]), ([1, 2, 3, 4], ["x"]), ([5, 5, 5], ["w"])
    ]  # fmt: skip
    tree.insert([6, 6, 6, 6, 6, 6, 6], w)  # longer than the capacity: keeps its first 6
    assert dump(tree, w) == [([6, 6, 6, 6, 6, 6], 0)]
    assert tree.insert([7], tree.add_worker("z", capacity=0)) == 1  # counted, then evicted
    tree.check()


def test_touch_refreshes_only_counted_pages(meta_impl: type) -> None:
    tree = meta_impl()
    w = tree.add_worker("w", capacity=5)
    tree.insert([1, 2, 3, 4], w)
    tree.insert([8], w)
    tree.match([1, 2, 7], touch=True)  # [1, 2] is recent; [3, 4] is not
    tree.insert([9, 9], w)  # 7 > 5: the least recent pages go, [3, 4] first
    assert dump(tree, w) == [([8], 0), ([1, 2], 0), ([9, 9], 0)]
    tree.check()


def test_best_tie_rule(meta_impl: type) -> None:
    tree = meta_impl()
    assert tree.match([1, 2]).best() is None  # no workers
    a, b, c = (tree.add_worker(n) for n in "abc")
    assert tree.match([1, 2]).best() == (a, 0)  # everyone at 0: the lowest index
    tree.insert([1, 2], c)
    tree.insert([1, 2, 3], b)
    assert tree.match([1, 2]).best() == (b, 2)  # b and c tie: the lower index
    assert tree.match([1, 2, 3]).best() == (b, 3)
    tree.remove_worker(a)
    tree.remove_worker(b)
    assert tree.match([1, 2, 3]).best() == (c, 2)
    tree.remove_worker(c)
    assert tree.match([1]).best() is None
    assert tree.match([1]).lengths.tolist() == [0, 0, 0]


def test_index_reuse_bumps_the_generation(meta_impl: type) -> None:
    tree = meta_impl()
    a, b, c = (tree.add_worker(n) for n in "abc")
    tree.insert([1, 2], b)
    assert tree.remove_worker(b) == 2
    assert tree.workers == (a, c) and tree.n_workers == 3
    assert tree.match([1, 2]).lengths.tolist() == [0, 0, 0]  # a free index reads 0
    d = tree.add_worker("d", 3, capacity=10)
    assert d == WorkerId("d", 3, 1, 1)  # the lowest free index, its next generation
    assert tree.workers == (a, d, c) and tree.worker("d", 3) == d
    assert tree.held_tokens(d) == 0 and tree.capacity_of(d) == 10
    with pytest.raises(StaleWorkerError):
        tree.held_tokens(b)  # the old id of index 1 no longer works
    with pytest.raises(StaleWorkerError):
        tree.worker("b")
    again = tree.add_worker("b")
    assert again.index == 3 and again != b


def test_equal_ids_are_accepted(meta_impl: type) -> None:
    """Two trees never share WorkerIds meaningfully; equal ones (from a pickle) work."""
    tree, other = meta_impl(), meta_impl()
    w = tree.add_worker("w")
    v = other.add_worker("w")
    assert v == w and v is not w
    tree.insert([1], v)
    assert tree.held_tokens(w) == 1
    other.add_worker("x")
    with pytest.raises(StaleWorkerError):
        tree.held_tokens(other.worker("x"))


def test_a_thousand_workers(meta_impl: type) -> None:
    tree = meta_impl(2)
    workers = [tree.add_worker(f"w{i}") for i in range(1024)]
    shared = list(range(2, 34))  # 16 pages
    for i, w in enumerate(workers):
        depth = i % 17
        tree.insert([*shared[: 2 * depth], 1000 + i, 1000 + i], w)
    m = tree.match(shared)
    # Past 16 worker indices the native row is on the heap: the list, the lookups and
    # the array (made after them) all read it.
    assert m.length_list == [2 * (i % 17) for i in range(1024)]
    assert m.length_of(workers[1000]) == 2 * (1000 % 17) and m.best() == (workers[16], 32)
    assert m.lengths.tolist() == m.length_list and m.tree_length == 32
    rows = tree.match_many([shared[:6], [1000, 1000]])  # worker 0's key is its own page
    assert rows.shape == (2, 1024) and rows.dtype == np.int64
    assert rows[1].tolist() == [2] + [0] * 1023
    assert rows[0].tolist() == [min(2 * (i % 17), 6) for i in range(1024)]
    for w in workers[::2]:
        tree.remove_worker(w)
    assert tree.n_workers == 1024 and len(tree.workers) == 512
    m = tree.match(shared)
    assert m.best() == (workers[33], 32)  # the lowest odd index at depth 16 (33 % 17)
    assert tree.memory_usage() > 0
    tree.check()


def test_dump_replay_restores_pages_recency_and_hashes(meta_impl: type) -> None:
    tree = meta_impl(2)
    a = tree.add_worker("a")
    w = tree.add_worker("w", capacity=10)
    tree.insert([1, 2, 3, 4, 5, 6], a)
    tree.apply_stored(a, None, [0xA1, 0xA2], [1, 2, 3, 4])
    tree.insert([1, 2, 7, 7], w)
    tree.insert([1, 2, 3, 4, 8, 8], w)
    tree.apply_stored(w, None, [0xC1], [9, 9])
    tree.match([1, 2, 7, 7], touch=True)
    copy = meta_impl(2)
    for worker in tree.workers:
        twin = copy.add_worker(worker.name, worker.dp_rank, capacity=tree.capacity_of(worker))
        for key, start, namespace, extras, tier in tree.dump(worker):
            copy.insert(key, twin, start=start, tier=tier, extras=extras, namespace=namespace)
        for block_hash, key, namespace, extras in tree._block_entries(worker):
            copy._bind_hash(twin, key, block_hash, namespace, extras)
    assert state(copy) == state(tree)
    # Same recency: the next insert evicts the same pages on both.
    for t in (tree, copy):
        t.insert([5, 5, 5, 5], t.worker("w"))
    assert state(copy) == state(tree)
    copy.check()


# -- extra tags ------------------------------------------------------------------------------
def test_issue_8_images_with_equal_placeholders_are_different_pages(meta_impl: type) -> None:
    """With distinct extra tags, image B's page no longer steals A's continuation, removing B
    leaves A, and A's continuation stores fine."""
    t = meta_impl(page_size=4)
    w = t.add_worker("w")
    img = [9, 9, 9, 9]
    tag_a, tag_b = 0xA0A0, 2**64 - 1  # as the engine derives them from each image's hash
    t.apply_stored(w, None, [0xA], img, extras=[tag_a])
    t.apply_stored(w, 0xA, [0xA1], [1, 2, 3, 4])
    assert t.apply_stored(w, None, [0xB], img, extras=np.array([tag_b], dtype=np.uint64)) == 1
    query = [*img, 1, 2, 3, 4]
    assert t.match(query, extras=[tag_b, 0]).length_of(w) == 4  # B's page, not A's continuation
    assert t.match(query, extras=[tag_a, 0]).length_of(w) == 8
    assert t.match(query).length_of(w) == 0  # untagged placeholders are a third page
    assert t.apply_removed(w, [0xB]) == 1
    assert t.match(query, extras=[tag_a, 0]).length_of(w) == 8  # A is left
    assert t.apply_stored(w, 0xA, [0xA2], [5] * 4) == 1  # A's continuation stores fine
    assert [(h, e) for h, _, _, e in plain(t._block_entries(w))] == [
        (0xA, [tag_a]), (0xA1, [tag_a, 0]), (0xA2, [tag_a, 0])
    ]  # fmt: skip
    t.check()


def test_tagged_pages_are_one_page_nodes(meta_impl: type) -> None:
    tree = meta_impl(2)
    a, b = tree.add_worker("a"), tree.add_worker("b")
    key = [1, 2, 3, 4, 5, 6, 7, 8]
    assert tree.insert(key, a, extras=[0, 7, 0, 0]) == 4
    first = tree.items()[0]
    assert (first.key.tolist(), first.extras) == ([1, 2], None)
    assert [r.extras.tolist() for r in tree.items()[1:]] == [[0, 7], [0, 7, 0, 0]]
    assert tree.insert(key, b) == 4  # untagged: a branch of its own after [1, 2]
    assert tree.node_count == 4
    m = tree.match(key, extras=[0, 7, 0, 0])
    assert m.lengths.tolist() == [8, 2] and m.tree_length == 8
    assert tree.match(key, extras=[0, 7, 0, 9]).lengths.tolist() == [6, 2]
    assert tree.match_many([key, key], extras=[None, [0, 7, 0, 0]]).tolist() == [[2, 8], [8, 2]]
    assert tree.remove(key, a, extras=[0, 7, 0, 0], start=4) == 2
    assert tree.insert(key, a, extras=[0, 7, 0, 0], start=4) == 2
    # Tags of 0 everywhere are no tags: the same pages as no extras at all.
    assert tree.insert(key, b, extras=[0, 0, 0, 0]) == 0
    assert tree.dump(b)[0].extras is None
    tree.check()


# -- tiers -----------------------------------------------------------------------------------
def test_host_tier(meta_impl: type) -> None:
    """A worker holds pages on the device, the host or both; lengths count the device,
    host_lengths either; removals and clears go by tier."""
    tree = meta_impl(2)
    w, v = tree.add_worker("w"), tree.add_worker("v")
    key = [1, 2, 3, 4, 5, 6]
    assert tree.apply_stored(w, None, [0xA1, 0xA2, 0xA3], key) == 3
    assert tree.apply_stored(w, None, [0xA1, 0xA2, 0xA3], key, tier=1) == 3  # offloaded too
    assert tree.apply_removed(w, [0xA2]) == 1  # the device copy goes
    m = tree.match(key)
    assert (m.length_of(w), m.length_of(w, tier=1)) == (2, 6)
    assert tree.apply_stored(w, 0xA2, [0xB1], [7, 7]) == 1  # 0xA2 still names the host copy
    assert tree.apply_removed(w, [0xA2], tier=1) == 1  # now it is gone from both
    assert tree.match(key).host_lengths.tolist() == [2, 0]
    assert tree.insert(key, v, tier=1) == 3
    assert tree.held_tokens(v) == 0 and tree.held_tokens(v, tier=1) == 6
    assert tree.match_many([key], tier=1).tolist() == [[2, 6]]
    assert tree.match_many([key]).tolist() == [[2, 0]]
    assert [r.tier for r in tree.dump(w)] == [0, 0, 0, 1, 1]  # the device's records first
    assert tree.items(v)[0].host_holders == (w, v)
    assert tree.apply_cleared(w, tier=0) == 6  # its device pages
    assert tree.held_tokens(w, tier=1) == 4
    assert tree.apply_cleared(w) == 4  # None: both tiers
    assert tree.remove(key, v, tier=1) == 3 and tree.node_count == 0
    tree.check()


def test_host_pages_do_not_count_against_a_capacity(meta_impl: type) -> None:
    tree = meta_impl(1)
    w = tree.add_worker("w", capacity=2)
    tree.insert([1, 2, 3, 4], w, tier=1)
    tree.insert([1, 2, 3, 4], w)  # the device keeps its most recent 2 tokens' worth
    assert (tree.held_tokens(w), tree.held_tokens(w, tier=1)) == (2, 4)
    m = tree.match([1, 2, 3, 4], touch=True)
    assert (m.lengths.tolist(), m.host_lengths.tolist()) == ([2], [4])
    tree.check()


# -- namespaces ------------------------------------------------------------------------------
def test_namespaces_never_share_nodes(meta_impl: type) -> None:
    tree = meta_impl(2)
    a, b = tree.add_worker("a"), tree.add_worker("b")
    key = [1, 2, 3, 4]
    assert tree.insert(key, a) == 2
    assert tree.insert(key, b, namespace="lora-1") == 2  # the same tokens, another adapter
    assert tree.node_count == 2
    assert tree.match(key).lengths.tolist() == [4, 0]
    assert tree.match(key, namespace="lora-1").lengths.tolist() == [0, 4]
    assert tree.match(key, namespace="nobody").tree_length == 0  # creates nothing
    assert tree.match_many([key, key[:2]], namespace="lora-1").tolist() == [[0, 4], [0, 2]]
    assert tree.namespaces() == [None, "lora-1"]
    assert [(r.namespace, r.holders) for r in tree.items()] == [(None, (a,)), ("lora-1", (b,))]
    # A parent is looked up in the event's namespace; a removal finds a hash in any.
    tree.apply_stored(a, None, [0xA1], [5, 5], namespace=("salt", 7))
    with pytest.raises(UnknownParentError, match=r"holds in namespace 'lora-1'$"):
        tree.apply_stored(a, 0xA1, [0xA2], [6, 6], namespace="lora-1")
    assert tree.apply_stored(a, 0xA1, [0xA2], [6, 6], namespace=("salt", 7)) == 1
    assert tree.namespaces() == [None, "lora-1", ("salt", 7)]
    assert tree.apply_removed(a, [0xA1, 0xA2]) == 2
    assert tree.namespaces() == [None, "lora-1"]  # emptied: its root is gone
    assert tree.remove(key, b, namespace="lora-1") == 2
    assert tree.insert(key, b, start=4, namespace="new") == 0  # nothing to mark: no namespace
    assert (tree.namespaces(), tree.node_count) == ([None], 1)
    tree.check()


def test_emptied_namespaces_are_forgotten(meta_impl: type) -> None:
    """Every route that empties a namespace drops the tree's reference to its object."""

    class Salt:  # hashable by identity, and weakly referable
        pass

    tree = meta_impl(2)
    w, x = tree.add_worker("w"), tree.add_worker("x", capacity=2)

    def refused(salt: Salt) -> None:
        with pytest.raises(InvalidInputError):
            tree.insert([1, 2], w, namespace=salt, start=-1)

    routes = [
        lambda s: tree.match([1, 2], namespace=s, touch=True),
        lambda s: tree.insert([1, 2], w, start=2, namespace=s),
        lambda s: (tree.insert([1, 2], w, namespace=s), tree.remove([1, 2], w, namespace=s)),
        lambda s: (
            tree.apply_stored(w, None, [5], [1, 2], namespace=s),
            tree.apply_removed(w, [5]),
        ),
        lambda s: (tree.apply_stored(w, None, [6], [1, 2], namespace=s), tree.apply_cleared(w)),
        lambda s: (tree.insert([1, 2], x, namespace=s), tree.insert([3, 3], x)),  # evicted
        lambda s: tree.apply_events([("stored", w, None, [7], [1], {"namespace": s})]),  # invalid
        refused,
    ]
    for route in routes:
        salt = Salt()
        ref = weakref.ref(salt)
        route(salt)
        del salt
        gc.collect()
        assert ref() is None
    v = tree.add_worker("v")
    salt = Salt()
    tree.insert([1, 2], v, namespace=salt)
    assert tree.namespaces() == [None, salt]
    ref = weakref.ref(salt)
    tree.remove_worker(v)
    del salt
    gc.collect()
    assert ref() is None and tree.namespaces() == [None]
    tree.check()


class _RefTree(REFERENCE_META):  # a MetaTree on the reference core, whatever the backend
    __reduce__ = MetaTree.__reduce__


PICKLED: dict[str, type] = {"reference": _RefTree}
if NATIVE_META is not None:

    class _NativeTree(NATIVE_META):  # type: ignore[misc,valid-type]
        __slots__ = ()
        __reduce__ = MetaTree.__reduce__

    PICKLED["native"] = _NativeTree
assert set(PICKLED) == set(META_CORES)


@pytest.mark.parametrize("cls", list(PICKLED.values()), ids=list(PICKLED))
def test_pickle_round_trip(cls: type) -> None:
    tree = cls(2)
    a, gone = tree.add_worker("a"), tree.add_worker("gone")
    tree.remove_worker(gone)
    w = tree.add_worker("w", 1, capacity=6)
    tree.insert([1, 2, 3, 4], a, start=2)
    tree.apply_stored(w, None, [0xB1, -7], [1, 2, 5, 5])
    tree.insert([9, 9], w)
    tree.insert([1, 2, 3, 4], a, namespace="lora")
    tree.apply_stored(a, None, [0xC1], [1, 2], namespace=("salt", 1))
    tree.apply_stored(a, 0xC1, [0xC2, 0xC3], [7, 7, 7, 7], extras=[5, 0], namespace=("salt", 1))
    tree.insert([1, 2, 3, 4], w, extras=[0, 2**64 - 1])
    tree.apply_stored(a, None, [0xC1], [1, 2], tier=1, namespace=("salt", 1))
    tree.insert([5, 5, 5, 5], w, tier=1)
    copy = pickle.loads(pickle.dumps(tree))
    assert type(copy) is cls
    assert state(copy) == state(tree)
    assert copy.workers == tree.workers and copy.capacity_of(w) == 6
    assert copy.add_worker("new").index == 2  # the free-index heap came along
    copy.check()


# -- API parity of the cores ------------------------------------------------------------------
def _public(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def _parameters(func: Any) -> list[tuple[str, Any, Any]]:
    sig = inspect.signature(func)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


META_PRIVATE = ("_block_entries", "_bind_hash", "_worker_state", "_adopt_table")


def test_cores_have_the_same_documented_api() -> None:
    """Same public names and signatures on every MetaCore (and its MetaMatch); all documented."""
    ref = REFERENCE_META
    ref_match = type(ref().match([]))
    undocumented = []
    for cls in META_CORES.values():
        match_cls = type(cls().match([]))
        for mine, theirs in ((cls, ref), (match_cls, ref_match)):
            assert _public(mine) == _public(theirs), mine
            for name in sorted(_public(theirs)) + (list(META_PRIVATE) if mine is cls else []):
                attr, ref_attr = getattr(mine, name), getattr(theirs, name)
                if inspect.isdatadescriptor(ref_attr):
                    assert inspect.isdatadescriptor(attr), f"{mine.__name__}.{name}"
                else:
                    assert _parameters(attr) == _parameters(ref_attr), f"{mine.__name__}.{name}"
                if name in _public(theirs) and not (attr.__doc__ or "").strip():
                    undocumented.append(f"{mine.__module__}.{mine.__name__}.{name}")
    assert undocumented == []


def test_reentry_from_a_key_element_cannot_corrupt_the_tree(meta_impl: type) -> None:
    """An element whose __index__ calls the tree runs inside a call; both must stay sound."""
    tree = meta_impl(1)
    w = tree.add_worker("a")

    class RemovesTheWorker:
        def __index__(self) -> int:
            tree.remove_worker(w)
            return 7

    with pytest.raises(StaleWorkerError):
        tree.insert([1, 2, RemovesTheWorker()], w)
    tree.check()
    assert tree.node_count == 0

    tree = meta_impl(1)
    w, v = tree.add_worker("a"), tree.add_worker("b")

    class RunsAnotherEvent:
        def __index__(self) -> int:
            tree.apply_removed(v, list(range(1000)))  # converts into buffers of its own
            return 7

    tree.apply_stored(w, None, [10, 11, 12], [1, 2, RunsAnotherEvent()])
    assert entries(tree, w) == [
        (10, [1]),
        (11, [1, 2]),
        (12, [1, 2, 7]),
    ]
    tree.check()


def test_a_record_whose_objects_raise_does_not_stop_the_batch(meta_impl: type) -> None:
    tree = meta_impl(1)
    w = tree.add_worker("a")

    class BadLength:
        def __len__(self) -> int:
            raise ValueError

        def __iter__(self) -> Any:
            raise ValueError

    bad, good = ("stored", w, None, BadLength(), [1]), ("stored", w, None, [5], [1])
    statuses = tree.apply_events([bad, good])
    assert statuses.tolist() == [BlockStatus.INVALID, BlockStatus.APPLIED]
    assert tree.held_tokens(w) == 1
