"""A policy's ``rank`` is a pure read: the policy's state is equal before and after it.

``Router.dispatch(..., ranked=True)`` asks ``rank`` just before ``choose``; a Ray
Serve router asks it for every request. Preble's ``rank`` used to drop the events
older than its window (what ``choose`` does first) and Dynamo's swapped its generator
for a copy while it drew; both now only read. The states are compared whole, so a
rank that changed anything (an event dropped, a group deleted, a generator
advanced or replaced) fails here, and the ranking still starts with what ``choose``
then picks.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import FakeClock, request, view

from radixmeta.policies import create, worker_of
from radixmeta.policies.dynamo import DynamoCost
from radixmeta.policies.preble import PrebleE2


def preble_state(policy: PrebleE2) -> Any:
    """Everything a Preble policy keeps, as plain values."""

    def group(g: Any) -> Any:
        return (
            g.key,
            tuple(g.allocation),
            g.refs,
            g.count,
            g.hit,
            g.prompt,
            sorted(g.cost.items()),
            len(g.events),
            (g.bucket, g.now_sum, g.now_n, g.prev_sum, g.prev_n),
        )

    return (
        [(e.time, e.worker, e.cost, e.counted, e.hit, e.prompt) for e in policy._events],
        sorted((repr(k), group(g)) for k, g in policy._groups.items()),
        sorted(repr(k) for k in policy._active),
        sorted(policy._load.items()),
        sorted(policy._active_load.items()),
        sorted((w, list(lru.items())) for w, lru in policy._lru.items()),
        sorted(policy._held.items()),
        list(policy._pending),
        policy._routed,
    )


def dynamo_state(policy: DynamoCost) -> Any:
    return (policy._rng, policy._rng.getstate())


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(
            st.lists(st.sampled_from([0, 16, 48, 64]), min_size=2, max_size=5),
            st.integers(1, 6),  # prompt pages
            st.sampled_from([None, 0, 1]),  # prefix key
            st.sampled_from([0.5, 3.0, 8.0]),  # seconds since the last step
        ),
        min_size=1,
        max_size=12,
    )
)
def test_preble_rank_changes_nothing_even_with_events_past_the_window(
    steps: list[tuple[list[int], int, int | None, float]],
) -> None:
    clock = FakeClock()
    policy = create("preble_e2", clock=clock, window=5.0, rebalance_after=0)
    for k, (lengths, pages, key, gap) in enumerate(steps):
        clock.now += gap
        lengths = [min(x, pages * 16) for x in lengths]
        n = len(lengths)
        v = view(
            lengths,
            prefill=[100 * i for i in range(n)],
            capacities=[120] * n,
            page_size=16,
            prefix_key=key if max(lengths) else None,
        )
        r = request(pages * 16 + 3, f"r{k}", 10)
        before = preble_state(policy)
        ranking = policy.rank(r, v)
        assert preble_state(policy) == before
        assert sorted(w.index for w in ranking) == list(range(n))
        chosen = worker_of(policy.choose(r, v))  # drops the lapsed events itself
        assert ranking[0] == chosen
        policy.on_dispatch(r, chosen, v.lengths[v.workers.index(chosen)])
        policy._check()


def test_preble_rank_discounts_the_lapsed_load_as_choose_will() -> None:
    """Worker 0 is loaded by requests that leave the window before the next one."""
    clock = FakeClock()
    policy = create("preble_e2", clock=clock, window=10.0, rebalance=False)
    v = view([0, 0], page_size=16)
    for k in range(4):
        r = request(64, f"old{k}", 100)
        policy.on_dispatch(r, v.workers[0], 0)
    clock.now = 5.0
    policy.on_dispatch(request(64, "new", 1), v.workers[1], 0)
    # At 12 s the old four lapse: worker 0 is then the lighter one.
    clock.now = 12.0
    before = preble_state(policy)
    ranking = policy.rank(request(64, "next"), v)
    assert preble_state(policy) == before
    assert len(policy._events) == 5  # still there: choose drops them
    assert ranking[0] == v.workers[0]
    assert worker_of(policy.choose(request(64, "next"), v)) == v.workers[0]
    assert len(policy._events) == 1


def test_preble_rank_forgets_a_group_whose_events_all_lapse() -> None:
    """A group dropped by the window no longer confines an exploiting request."""
    clock = FakeClock()
    policy = create("preble_e2", clock=clock, window=10.0, rebalance=False)
    grouped = view([64, 0], page_size=16, prefix_key=7)
    r = request(80, "a")
    choice = policy.choose(r, grouped)
    policy.on_dispatch(r, worker_of(choice), 64)
    # The group is allocated to worker 0 alone; worker 1 now holds the whole prompt.
    # Once the group lapses its allocation no longer applies: the longest match wins.
    clock.now = 20.0
    both = view([64, 80], page_size=16, prefix_key=7)
    before = preble_state(policy)
    ranking = policy.rank(request(80, "b"), both)
    assert preble_state(policy) == before
    assert 7 in policy._groups
    chosen = worker_of(policy.choose(request(80, "b"), both))
    assert 7 not in policy._groups
    assert ranking[0] == chosen == both.workers[1]


@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_dynamo_rank_only_reads_its_generator(temperature: float) -> None:
    policy = create("dynamo_cost", temperature=temperature, overlap_score_weight=0.0, seed=4)
    v = view([0, 16, 32, 48], decode=[0, 0, 16, 16], page_size=16)
    for k in range(20):
        r = request(64, f"r{k}")
        before = dynamo_state(policy)
        rng = policy._rng
        ranking = policy.rank(r, v)
        assert policy._rng is rng
        assert dynamo_state(policy) == before
        assert ranking[0] == worker_of(policy.choose(r, v))
