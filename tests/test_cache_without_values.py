"""A cache that keeps no KV slot values (``store_values=False``), on both implementations.

The simulator never reads slot values, so its caches keep none. Such a cache
must behave exactly like one that does in everything but the slots: the same
structure, sizes, counters, eviction order and event records; every call that
reads or returns slots refuses with ``InvalidInputError``, before any change.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pytest
from conftest import NATIVE
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
    run_state_machine_as_test,
)

from radixmeta import RadixCache, _reference
from radixmeta._types import EVICTION_POLICIES
from radixmeta.errors import (
    CacheFullError,
    InputTypeError,
    InvalidInputError,
    RadixMetaError,
    StaleNodeError,
)

REFERENCE = _reference.CacheCore


def shape(cache: Any) -> tuple[Any, ...]:
    """Everything observable without slots: sizes, counters, namespaces, every node."""
    nodes = {
        ns: [(lvl, lab.tolist(), locks) for lvl, lab, locks in cache._structure(ns)]
        for ns in cache.namespaces()
    }
    return (
        cache.evictable_size,
        cache.protected_size,
        cache.total_size,
        cache.node_count,
        cache.stats,
        cache.namespaces(),
        nodes,
    )


def described(record: Any) -> tuple[Any, ...]:
    """A record as plain values (a ``Cleared`` has no key)."""
    if record.kind == "cleared":
        return (record.kind, record.seq)
    return (record.kind, record.seq, record.namespace, record.key.tolist(), record.start)


def both(impl: type, *args: Any, **kw: Any) -> tuple[Any, Any]:
    """A cache without values and its twin with them, made alike."""
    return impl(*args, store_values=False, **kw), impl(*args, **kw)


def grown(impl: type, **kw: Any) -> Any:
    cache = impl(2, store_values=False, **kw)
    cache.insert([1, 2, 3, 4, 5, 6])
    cache.insert([1, 2, 7, 8])
    cache.insert([9, 9], namespace="a")
    return cache


# -- the flag --------------------------------------------------------------------------------
def test_values_are_stored_by_default(impl: type) -> None:
    assert impl().store_values is True
    assert impl(store_values=True).store_values is True


def test_the_flag_is_read_only(impl: type) -> None:
    cache = impl(store_values=False)
    assert cache.store_values is False
    with pytest.raises(AttributeError):
        cache.store_values = True


@pytest.mark.parametrize("flag", [0, 1, "no", None, np.bool_(False)])
def test_a_flag_that_is_not_a_bool_is_refused(impl: type, flag: Any) -> None:
    with pytest.raises(InputTypeError, match="store_values must be a bool"):
        impl(store_values=flag)


def test_on_evict_needs_values(impl: type) -> None:
    with pytest.raises(InvalidInputError, match="on_evict needs slot values"):
        impl(on_evict=lambda slots: None, store_values=False)


def test_the_public_class_takes_the_flag() -> None:
    cache = RadixCache(4, store_values=False)
    assert cache.insert(range(8)) == 0
    assert "tokens=8" in repr(cache)
    assert "[8]" in cache.pretty()
    with cache.locked(cache.match_prefix(range(8), values=False).node):
        assert cache.evict(100).count == 0


# -- calls that read or return slots refuse, changing nothing --------------------------------
def test_match_with_values_is_refused_before_any_change(impl: type) -> None:
    cache = grown(impl)
    before = shape(cache)
    with pytest.raises(InvalidInputError, match=r"match_prefix\(values=True\) needs slot values"):
        cache.match_prefix([1, 2, 3, 4])  # would count a lookup and split a node
    with pytest.raises(InvalidInputError):
        cache.match_prefix([1, 2, 3, 4], values=True)
    assert shape(cache) == before


def test_match_without_values_gives_the_length_and_no_values(impl: type) -> None:
    bare, full = both(impl, 2)
    for c in (bare, full):
        c.insert([1, 2, 3, 4, 5, 6])
    got = bare.match_prefix([1, 2, 3, 4, 9, 9], values=False)
    want = full.match_prefix([1, 2, 3, 4, 9, 9])
    assert (got.length, got.node.length, got.values) == (4, 4, None)
    assert want.length == 4
    assert shape(bare) == shape(full)


def test_the_values_flag_of_match_is_still_checked(impl: type) -> None:
    cache = grown(impl)
    with pytest.raises(InputTypeError, match="values must be a bool"):
        cache.match_prefix([1, 2], values=1)


def test_insert_with_values_is_refused_before_any_change(impl: type) -> None:
    cache = grown(impl)
    before = shape(cache)
    with pytest.raises(InvalidInputError, match=r"insert\(values=\.\.\.\) needs slot values"):
        cache.insert([5, 5, 5, 5], [1, 2, 3, 4], namespace="new")
    assert shape(cache) == before
    assert "new" not in cache.namespaces()


def test_a_bad_key_is_reported_before_the_values(impl: type) -> None:
    cache = impl(store_values=False)
    with pytest.raises(ValueError, match="key"):
        cache.insert([-1, 2], [1, 2])


def test_insert_without_values_returns_the_cached_length(impl: type) -> None:
    bare, full = both(impl, 2)
    for key in ([1, 2, 3, 4], [1, 2, 3, 4, 5, 6], [1, 2, 9, 9, 9]):
        assert bare.insert(key) == full.insert(key)
    assert shape(bare) == shape(full)


def test_path_values_is_refused(impl: type) -> None:
    cache = grown(impl)
    node = cache.match_prefix([1, 2, 3, 4], values=False).node
    before = shape(cache)
    with pytest.raises(InvalidInputError, match=r"path_values\(\) needs slot values"):
        cache.path_values(node)
    assert shape(cache) == before


def test_path_values_checks_the_handle_first(impl: type) -> None:
    cache = grown(impl)
    with pytest.raises(InputTypeError, match="node must be a Node handle"):
        cache.path_values("not a node")


def test_items_is_refused(impl: type) -> None:
    cache = grown(impl)
    with pytest.raises(InvalidInputError, match=r"items\(\) needs slot values"):
        cache.items()
    with pytest.raises(InvalidInputError):
        cache.items(namespace="a")


def test_take_evicted_is_refused_without_a_warning(impl: type) -> None:
    cache = impl(1, capacity=2, store_values=False)
    cache.insert([1, 2])
    cache.insert([3, 4])  # evicts [1, 2] for capacity
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InvalidInputError, match=r"take_evicted\(\) needs slot values"):
            cache.take_evicted()


# -- eviction: a count, no values ------------------------------------------------------------
def test_evict_counts_tokens_and_returns_no_values(impl: type) -> None:
    bare, full = both(impl, 2)
    for c in (bare, full):
        c.insert([1, 2, 3, 4, 5, 6])
        c.insert([1, 2, 7, 8])
        c.insert([4, 4])
    for want in (1, 3, 0, 100):
        got, ref = bare.evict(want), full.evict(want)
        assert got.values is None
        assert got.count == ref.count == len(ref.values)
        assert shape(bare) == shape(full)
    assert bare.total_size == 0
    assert repr(bare.evict(1)) == "EvictResult(count=0)"


def test_evict_still_checks_its_argument(impl: type) -> None:
    cache = grown(impl)
    before = shape(cache)
    with pytest.raises(InvalidInputError, match="num_tokens must be >= 0"):
        cache.evict(-1)
    with pytest.raises(InputTypeError):
        cache.evict("3")
    assert shape(cache) == before


def test_evict_frees_locked_nothing(impl: type) -> None:
    cache = grown(impl)
    node = cache.match_prefix([1, 2, 3, 4, 5, 6], values=False).node
    cache.lock(node)
    freed = cache.evict(100)
    assert freed.values is None and freed.count == 4  # [7, 8] and [9, 9]
    assert cache.total_size == cache.protected_size == 6
    cache.unlock(node)
    assert cache.evict(100).count == 6


def test_capacity_eviction_matches_a_cache_with_values(impl: type) -> None:
    bare, full = both(impl, 2, capacity=8)
    keys = [[1, 2, 3, 4], [1, 2, 5, 6], [7, 7, 7, 7], [8, 8, 1, 1, 2, 2], [1, 2, 3, 4, 9, 9]]
    for key in keys:
        assert bare.insert(key) == full.insert(key)
        assert shape(bare) == shape(full)
        assert bare.total_size <= 8


def test_a_full_cache_refuses_an_insert_unchanged(impl: type) -> None:
    cache = impl(1, capacity=4, store_values=False)
    cache.insert([1, 2, 3, 4])
    cache.lock(cache.match_prefix([1, 2, 3, 4], values=False).node)
    before = shape(cache)
    with pytest.raises(CacheFullError):
        cache.insert([5, 6])
    assert shape(cache) == before


@pytest.mark.parametrize("store", [True, False])
def test_an_insert_that_evicts_a_namespace_forgets_it(impl: type, store: bool) -> None:
    """An insert whose capacity eviction empties a namespace releases it.

    Seen from outside: a namespace that comes back is a new one, listed last (the
    binding released emptied namespaces only when slots were freed, so without
    values it kept the old entry and its place).
    """
    cache = impl(2, capacity=4, store_values=store)
    cache.insert([1, 1, 2, 2], namespace="a")
    assert cache.namespaces() == [None, "a"]
    cache.insert([3, 3], namespace="b")  # evicts all of "a" (one 4-token leaf)
    assert cache.namespaces() == [None, "b"]
    cache.insert([6, 6], namespace="a")  # fits: a new "a", after "b"
    assert cache.namespaces() == [None, "b", "a"]
    cache.insert([5, 5, 5, 5])  # the default namespace: evicts "b", then "a"
    assert cache.namespaces() == [None]
    cache.check()


# -- everything else works as with values ----------------------------------------------------
def test_lock_unlock_and_sizes_as_with_values(impl: type) -> None:
    bare, full = both(impl, 2)
    nodes = []
    for c in (bare, full):
        c.insert([1, 2, 3, 4, 5, 6])
        c.insert([1, 2, 3, 4, 7, 8])
        nodes.append(c.match_prefix([1, 2, 3, 4], values=False).node)
    for c, node in zip((bare, full), nodes, strict=True):
        c.lock(node)
        assert c.lock_count(node) == 1
    assert shape(bare) == shape(full)
    for c, node in zip((bare, full), nodes, strict=True):
        c.unlock(node)
    assert shape(bare) == shape(full)


def test_reset_makes_handles_stale(impl: type) -> None:
    cache = grown(impl)
    node = cache.match_prefix([1, 2, 3, 4], values=False).node
    cache.reset()
    assert (cache.total_size, cache.node_count, cache.namespaces()) == (0, 0, [None])
    with pytest.raises(StaleNodeError):
        cache.lock(node)
    assert cache.insert([1, 2]) == 0


@pytest.mark.parametrize("eviction", EVICTION_POLICIES)
def test_eviction_order_as_with_values(impl: type, eviction: str) -> None:
    bare, full = both(impl, 1, eviction=eviction)
    keys = [[1, 2, 3], [1, 2, 4], [5, 6], [1, 7], [5, 6, 8], [9]]
    for i, key in enumerate(keys):
        for c in (bare, full):
            c.insert(key, priority=i % 3)
            c.match_prefix(keys[(i * 2) % len(keys)], values=False)
    while full.total_size:
        assert bare.evict(1).count == full.evict(1).count
        assert shape(bare) == shape(full)


def test_event_records_as_with_values(impl: type) -> None:
    log_cls = _reference.EventLogCore if impl is REFERENCE else NATIVE.EventLogCore
    logs = [log_cls(worker="w"), log_cls(worker="w")]
    bare = impl(2, capacity=6, event_log=logs[0], store_values=False)
    full = impl(2, capacity=6, event_log=logs[1])
    for key in ([1, 2, 3, 4], [1, 2, 5, 6], [7, 7, 7, 7], [1, 2]):
        for c in (bare, full):
            c.insert(key)
    for c in (bare, full):
        c.evict(2)
    got, want = ([(r.kind, r.seq, r.key.tolist(), r.start) for r in log.read()] for log in logs)
    assert got == want and any(kind == "removed" for kind, *_ in got)
    assert [r.key.tolist() for r in bare.snapshot()] == [r.key.tolist() for r in full.snapshot()]


def test_a_cache_without_values_takes_less_memory(impl: type) -> None:
    bare, full = both(impl, 1)
    rng = np.random.default_rng(7)
    for _ in range(50):
        key = rng.integers(0, 1000, 400).astype(np.uint32)
        bare.insert(key)
        full.insert(key)
    assert bare.total_size == full.total_size > 10_000
    # Native: 4 bytes a token instead of 12; the reference keeps empty value tuples.
    assert bare.memory_usage() < full.memory_usage() * 0.75


# -- the second machine: native and oracle, both without values, and a twin with values ------
NAMESPACES = st.sampled_from([None, None, "a", 7])
KEYS = st.lists(st.integers(0, 3), min_size=0, max_size=14)


class WithoutValuesMachine(RuleBasedStateMachine):
    """Caches made with ``store_values=False`` (``CORES``) and a reference cache that keeps
    values, driven with the same calls: outcomes, structure and event records agree."""

    CORES: tuple[type, ...] = (REFERENCE,)
    handles = Bundle("handles")

    @initialize(
        page_size=st.sampled_from([1, 2]),
        eviction=st.sampled_from(EVICTION_POLICIES),
        capacity=st.sampled_from([None, None, 0, 6, 12, 20]),
        refresh=st.booleans(),
    )
    def create(self, page_size: int, eviction: str, capacity: int | None, refresh: bool) -> None:
        def log_for(cls: type) -> Any:
            module = _reference if cls is REFERENCE else NATIVE
            assert module is not None
            return module.EventLogCore(capacity=64, worker="w")

        kinds = [*self.CORES, REFERENCE]
        self.logs = [log_for(cls) for cls in kinds]
        self.sides = [
            cls(
                page_size,
                eviction=eviction,
                capacity=capacity,
                refresh_split_tail=refresh,
                event_log=log,
                store_values=i == len(self.CORES),  # only the twin keeps values
            )
            for i, (cls, log) in enumerate(zip(kinds, self.logs, strict=True))
        ]
        self.bare = self.sides[:-1]

    def call(self, fn: Callable[[Any, int], Any], sides: list[Any] | None = None) -> list[Any]:
        """``fn(side, index)`` on every side: the same result, or the same error."""
        outcomes = []
        for i, side in enumerate(self.sides if sides is None else sides):
            try:
                outcomes.append(("ok", fn(side, i)))
            except RadixMetaError as exc:
                outcomes.append(("error", type(exc), str(exc)))
        if any(o[0] == "error" for o in outcomes):
            assert outcomes[1:] == outcomes[:-1], outcomes
            return [None] * len(outcomes)
        return [o[1] for o in outcomes]

    @rule(key=KEYS, namespace=NAMESPACES, priority=st.sampled_from([0, 1, -1]))
    def insert(self, key: list[int], namespace: Hashable, priority: int) -> None:
        got = self.call(lambda c, _: c.insert(key, namespace=namespace, priority=priority))
        assert len(set(got)) == 1, got

    @rule(key=KEYS, namespace=NAMESPACES)
    def insert_with_values_is_refused(self, key: list[int], namespace: Hashable) -> None:
        before = [shape(c) for c in self.bare]
        for c in self.bare:
            with pytest.raises(InvalidInputError):
                c.insert(key, list(range(len(key))), namespace=namespace)
        assert [shape(c) for c in self.bare] == before

    @rule(target=handles, key=KEYS, namespace=NAMESPACES)
    def match(self, key: list[int], namespace: Hashable) -> Any:
        got = self.call(lambda c, _: c.match_prefix(key, namespace=namespace, values=False))
        assert len({(m.length, m.node.length) for m in got}) == 1
        assert all(m.values is None for m in got)
        return multiple(tuple(m.node for m in got))

    @rule(handle=handles)
    def lock(self, handle: tuple[Any, ...]) -> None:
        self.call(lambda c, i: c.lock(handle[i]))

    @rule(handle=handles)
    def unlock(self, handle: tuple[Any, ...]) -> None:
        self.call(lambda c, i: c.unlock(handle[i]))

    @rule(handle=handles)
    def path_values_is_refused(self, handle: tuple[Any, ...]) -> None:
        for c, h in zip(self.bare, handle, strict=False):
            try:
                c.lock_count(h)  # a handle evicted since its match is stale, and says so first
            except StaleNodeError:
                with pytest.raises(StaleNodeError):
                    c.path_values(h)
                continue
            with pytest.raises(InvalidInputError):  # a live handle: refused for its values
                c.path_values(h)

    @rule(num_tokens=st.integers(0, 6))
    def evict(self, num_tokens: int) -> None:
        got = self.call(lambda c, _: c.evict(num_tokens))
        assert len({r.count for r in got}) == 1, got
        assert all(r.values is None for r in got[:-1])

    @rule(through=st.integers(-1, 200))
    def discard(self, through: int) -> None:
        got = self.call(lambda c, i: self.logs[i].discard(through))
        assert len(set(got)) == 1, got

    @precondition(lambda self: self.sides[-1].total_size >= 8)
    @rule()
    def reset(self) -> None:
        self.call(lambda c, _: c.reset())

    @invariant()
    def agree(self) -> None:
        for c in self.sides:
            c.check()
        shapes = [shape(c) for c in self.sides]
        assert shapes[1:] == shapes[:-1], shapes
        states = [
            (len(log), log.oldest_seq, log.next_seq, log.held_tokens) for log in self.logs
        ]
        assert states[1:] == states[:-1], states
        records = [[described(r) for r in log.read()] for log in self.logs]
        assert records[1:] == records[:-1], records


def test_without_values_machine(impl: type) -> None:
    """Native and reference without values (or the reference alone), against a twin
    reference cache that keeps them."""
    cores = (impl,) if impl is REFERENCE else (impl, REFERENCE)
    machine = type("WithoutValuesMachine", (WithoutValuesMachine,), {"CORES": cores})
    run_state_machine_as_test(machine)
