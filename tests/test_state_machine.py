"""Stateful model checking: native core, reference core and BruteForceCache side by side.

Every rule applies one call to every implementation and requires the same result,
or the same exception type and message; an invariant then runs ``check()`` on the
real caches and compares their whole observable state (sizes, node count, stats,
namespaces, items, and the node structure with lock counts). Each run ends by
evicting everything, which compares the eviction order of every remaining node.
Runs draw the page size (1 or 4), the eviction policy and an optional capacity.
"""

from __future__ import annotations

import doctest
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, find, given, settings
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

import radixmeta.testing
from radixmeta import _reference
from radixmeta._types import EVICTION_POLICIES
from radixmeta.errors import RadixMetaError, StaleNodeError
from radixmeta.testing import (
    BruteForceCache,
    EvictionLog,
    Unlock,
    operations,
    page_aligned_keys,
    run_operations,
    snapshot,
    token_sequences,
)

REFERENCE = _reference.CacheCore

# sampled_from keeps duplicates: half of the calls use the default namespace.
NAMESPACES = st.sampled_from([None, None, "a", 7])
# A key is (stem index, tokens dropped from the stem's end, tail). Stems are drawn once
# per run, so keys share prefixes of every length; the small drops and the frequent
# empty tails keep most keys on paths that other calls have cached.
KEYS = st.tuples(
    st.integers(0, 7),
    st.sampled_from([0, 0, 1, 2, 3, 4, 6, 9, 40]),
    st.just([]) | st.lists(st.integers(0, 2), min_size=1, max_size=5),
)

# Few distinct priorities, so that the tie-breaks of the priority policy matter.
PRIORITIES = st.sampled_from([0, 0, 1, -1, 2])

Outcome = tuple[Any, ...]


def structure_ends(cache: Any, namespace: Hashable) -> list[tuple[tuple[int, ...], int]]:
    """Turn ``_structure()`` (pre-order levels and labels) into (prefix end, locks)."""
    out: list[tuple[tuple[int, ...], int]] = []
    prefixes: list[tuple[int, ...]] = []
    for level, label, locks in cache._structure(namespace):
        del prefixes[level:]
        above = prefixes[-1] if prefixes else ()
        prefixes.append(above + tuple(int(t) for t in label))
        out.append((prefixes[-1], int(locks)))
    return out


class CacheMachine(RuleBasedStateMachine):
    """Drives ``CORES`` (real caches) and a BruteForceCache with the same calls."""

    CORES: tuple[type, ...] = (REFERENCE,)

    handles = Bundle("handles")

    @initialize(
        page_size=st.sampled_from([1, 4]),
        eviction=st.sampled_from(EVICTION_POLICIES),
        capacity=st.sampled_from([None, None, 0, 8, 16, 24, 32, 48]),
        refresh=st.booleans(),
        stems=token_sequences(vocab_size=3, max_size=6, max_stem_length=16, max_tail_length=4),
        initial=st.lists(st.tuples(KEYS, NAMESPACES, PRIORITIES), min_size=3, max_size=10),
    )
    def create(
        self,
        page_size: int,
        eviction: str,
        capacity: int | None,
        refresh: bool,
        stems: list[list[int]],
        initial: list[tuple[tuple[int, int, list[int]], Hashable, int]],
    ) -> None:
        # One log per side: what each hands to on_evict must agree after every step.
        self.logs = [EvictionLog() for _ in range(len(self.CORES) + 1)]
        self.caches = [
            cls(
                page_size,
                eviction=eviction,
                capacity=capacity,
                on_evict=log,
                refresh_split_tail=refresh,
            )
            for cls, log in zip(self.CORES, self.logs, strict=False)
        ]
        self.model = BruteForceCache(
            page_size,
            eviction=eviction,
            capacity=capacity,
            on_evict=self.logs[-1],
            refresh_split_tail=refresh,
        )
        self.sides: list[Any] = [*self.caches, self.model]
        self.stems = [s for s in stems if s] or [[0, 1, 2, 0]]
        self.next_slot = 1000
        # Hypothesis' swarm testing switches whole rules off in some runs; starting from
        # a populated tree keeps runs without the insert rule meaningful.
        for key, namespace, priority in initial:
            toks = self.key(key, as_array=False)
            results = self.call(
                lambda c, _, t=toks, ns=namespace, p=priority: c.insert(t, namespace=ns, priority=p)
            )
            assert len(set(results)) == 1, results

    # -- helpers ----------------------------------------------------------------------
    def key(self, spec: tuple[int, int, list[int]], as_array: bool) -> Any:
        index, drop, tail = spec
        stem = self.stems[index % len(self.stems)]
        key = stem[: max(0, len(stem) - drop)] + tail
        return np.array(key, dtype=np.int64) if as_array else key

    def call(self, fn: Callable[[Any, int], Any]) -> list[Any]:
        """Apply ``fn(side, index)`` to every side; require the same outcome kind."""
        outcomes: list[Outcome] = []
        for i, side in enumerate(self.sides):
            try:
                outcomes.append(("ok", fn(side, i)))
            except RadixMetaError as exc:
                outcomes.append(("error", type(exc), str(exc)))
        kinds = [o[0] for o in outcomes]
        if "error" in kinds:
            assert outcomes[1:] == outcomes[:-1], outcomes
            return [None] * len(outcomes)
        return [o[1] for o in outcomes]

    # -- rules ------------------------------------------------------------------------
    @rule(
        keys=st.lists(KEYS, min_size=1, max_size=3),
        namespace=NAMESPACES,
        priority=PRIORITIES,
        with_values=st.booleans(),
        as_array=st.booleans(),
        counted=st.one_of(st.just(0), st.integers(0, 12)),
    )
    def insert(
        self,
        keys: list[tuple[int, int, list[int]]],
        namespace: Hashable,
        priority: int,
        with_values: bool,
        as_array: bool,
        counted: int,
    ) -> None:
        # Up to three inserts per step, so that trees grow between evictions.
        for key in keys:
            toks = self.key(key, as_array)
            values = None
            if with_values:
                values = list(range(self.next_slot, self.next_slot + len(toks)))
                self.next_slot += len(toks)
            results = self.call(
                lambda c, _, t=toks, v=values: c.insert(
                    t, v, namespace=namespace, priority=priority, counted=counted
                )
            )
            assert len(set(results)) == 1, results

    @rule(
        target=handles,
        key=KEYS,
        namespace=NAMESPACES,
        as_array=st.booleans(),
        gather=st.booleans(),
    )
    def match(
        self, key: tuple[int, int, list[int]], namespace: Hashable, as_array: bool, gather: bool
    ) -> Any:
        toks = self.key(key, as_array)
        results = self.call(lambda c, _: c.match_prefix(toks, namespace=namespace, values=gather))
        lengths = {(r.length, r.node.length) for r in results}
        assert len(lengths) == 1, lengths
        values = [r.values for r in results]
        for v in values:
            if not gather:
                assert v is None
                continue
            assert v.dtype == np.int64
            np.testing.assert_array_equal(v, values[-1])
        return multiple(tuple(r.node for r in results))

    @rule(handle=handles)
    def lock(self, handle: tuple[Any, ...]) -> None:
        self.call(lambda c, i: c.lock(handle[i]))

    @rule(handle=handles)
    def unlock(self, handle: tuple[Any, ...]) -> None:
        self.call(lambda c, i: c.unlock(handle[i]))

    @rule(handle=handles)
    def path_values(self, handle: tuple[Any, ...]) -> None:
        got = self.call(lambda c, i: tuple(c.path_values(handle[i]).tolist()))
        assert len(set(got)) == 1, got

    @rule(handle=handles)
    def lock_count(self, handle: tuple[Any, ...]) -> None:
        try:
            self.model.lock_count(handle[-1])
        except StaleNodeError:  # stale on every side, for every handle method
            for cache, h in zip(self.caches, handle, strict=False):
                for method in (cache.lock, cache.unlock, cache.lock_count):
                    with pytest.raises(StaleNodeError):
                        method(h)
        counts = self.call(lambda c, i: (c.lock_count(handle[i]), handle[i].length))
        assert len(set(counts)) == 1, counts

    @rule(num_tokens=st.integers(0, 4))
    def evict(self, num_tokens: int) -> None:
        results = self.call(lambda c, _: c.evict(num_tokens))
        freed = [r.values.tolist() for r in results]
        assert freed[1:] == freed[:-1], freed
        assert {r.count for r in results} == {len(freed[0])}

    @precondition(lambda self: self.model.total_size >= 12)
    @rule(really=st.booleans())
    def reset(self, really: bool) -> None:
        # ``really`` halves how often a reset happens, so trees get time to grow.
        if really:
            self.call(lambda c, _: c.reset())

    def teardown(self) -> None:
        # Evicting everything at the end compares the eviction order of every node,
        # i.e. all the metadata, even in runs where the evict rule was switched off.
        if hasattr(self, "sides"):
            self.evict(10**9)
            self.all_agree()

    # -- invariant --------------------------------------------------------------------
    @invariant()
    def all_agree(self) -> None:
        for cache in self.caches:
            cache.check()
        self.model.check()
        states = [snapshot(side) for side in self.sides]
        assert states[1:] == states[:-1], states
        handed = [log.take() for log in self.logs]  # capacity evictions and resets
        assert handed[1:] == handed[:-1], handed
        for namespace in self.model.namespaces():
            expected = self.model.nodes(namespace=namespace)
            for cache in self.caches:
                assert structure_ends(cache, namespace) == expected


# Hypothesis' swarm testing makes many runs short, and one run is cheap (the trees stay
# small), so the machine gets several times the profile's example budget.
MACHINE_EXAMPLES_FACTOR = 4


def test_cache_machine(impl: type) -> None:
    """Native (with the reference as a second opinion) or reference, against the model."""
    cores = (impl,) if impl is REFERENCE else (impl, REFERENCE)
    machine = type("CacheMachine", (CacheMachine,), {"CORES": cores})
    budget = settings(max_examples=settings().max_examples * MACHINE_EXAMPLES_FACTOR)
    run_state_machine_as_test(machine, settings=budget)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    data=st.data(),
    page_size=st.sampled_from([1, 2, 4]),
    eviction=st.sampled_from(EVICTION_POLICIES),
    capacity=st.none() | st.integers(0, 30),
)
def test_operation_lists_agree(
    impl: type, data: st.DataObject, page_size: int, eviction: str, capacity: int | None
) -> None:
    """``run_operations`` gives the same outcomes on the core and on the model."""
    ops = data.draw(operations(page_size=page_size, namespaces=(None, "x")))
    cache = impl(page_size, eviction=eviction, capacity=capacity, on_evict=EvictionLog())
    model = BruteForceCache(page_size, eviction=eviction, capacity=capacity, on_evict=EvictionLog())
    assert run_operations(cache, ops) == run_operations(model, ops)
    cache.check()
    model.check()
    assert snapshot(cache) == snapshot(model)


# -- the testing kit itself -------------------------------------------------------------------
@given(page_aligned_keys(4))
def test_page_aligned_keys_are_aligned(keys: list[list[int]]) -> None:
    assert keys
    assert all(len(key) % 4 == 0 for key in keys)


def test_token_sequences_share_and_diverge() -> None:
    """The strategy finds lists where two sequences share 3 tokens and then differ."""

    def shares_then_diverges(seqs: list[list[int]]) -> bool:
        for a in seqs:
            for b in seqs:
                if len(a) > 3 and len(b) > 3 and a[:3] == b[:3] and a[3] != b[3]:
                    return True
        return False

    found = find(token_sequences(), shares_then_diverges, settings=settings(max_examples=500))
    assert shares_then_diverges(found)


def test_operations_give_unique_slots() -> None:
    @given(operations())
    def check(ops: list[Any]) -> None:
        slots = [v for op in ops if getattr(op, "values", None) for v in op.values]
        assert len(slots) == len(set(slots))
        assert all(v >= 1000 for v in slots)

    check()


def test_model_unlock_needs_a_lock_on_that_node() -> None:
    model = BruteForceCache()
    model.insert([1, 2, 3, 4])
    assert run_operations(model, [Unlock(0)]) == [None]  # no match handle yet: a no-op
    upper = model.match_prefix([1, 2]).node
    lower = model.match_prefix([1, 2, 3, 4]).node
    model.lock(lower)
    assert model.lock_count(upper) == 1
    with pytest.raises(RadixMetaError, match="node is not locked"):
        model.unlock(upper)
    model.unlock(lower)
    model.check()
    assert model.protected_size == 0


def test_testing_module_doctests() -> None:
    result = doctest.testmod(radixmeta.testing, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 5
    assert result.failed == 0


def test_model_has_the_core_api() -> None:
    def public(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_")}

    # The event log is checked cache by cache in test_event_log.py (replayed into a
    # MetaTree), not by the page model; a cache without values, against a twin that
    # keeps them, in test_cache_without_values.py.
    outside_the_model = {"memory_usage", "event_log", "snapshot", "store_values"}
    assert public(REFERENCE) - outside_the_model <= public(BruteForceCache)
