"""Preble's E2 on hand-built views with a fake clock: exploit or explore, and rebalancing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import WORKERS, FakeClock, detail, index_of, reason, request, view

from radixmeta.policies import PrebleE2, create
from radixmeta.policies.costs import mistral_7b_a6000_prefill as prefill


def preble(**params: object) -> tuple[FakeClock, PrebleE2]:
    clock = FakeClock()
    policy = create("preble_e2", clock=clock, **params)
    assert isinstance(policy, PrebleE2)
    return clock, policy


def send(
    policy: PrebleE2,
    request_id: str,
    lengths: list[int],
    size: int,
    key: int | None,
    output: int | None = None,
    **fields: object,
) -> tuple[int, str, dict[str, float]]:
    """Choose for one request, apply the choice as the router would, return what happened."""
    v = view(lengths, prefix_key=key, **fields)  # type: ignore[arg-type]
    r = request(size, request_id, output)
    choice = policy.choose(r, v)
    k = index_of(v, choice)
    policy.on_dispatch(r, v.workers[k], v.lengths[k])
    return k, reason(choice), detail(choice)


def test_exploit_iff_the_missing_part_is_shorter_than_the_match() -> None:
    _, policy = preble(rebalance=False)
    policy.on_dispatch(request(8000, "load"), WORKERS[0], 0)  # worker 0 is busy
    # matched 50 of 100: missing 50 is not shorter, so explore by cost: the idle worker
    k, why, numbers = send(policy, "at", [50, 0], 100, 9)
    assert (k, why) == (1, "explore")
    assert numbers["missing"] == numbers["matched"] == 50.0
    assert numbers["cost"] == pytest.approx(
        numbers["load"] + numbers["eviction"] + numbers["prefill"]
    )
    # matched 51 of 100: exploit the only holder, however loaded (another prefix: the
    # explore above added worker 1 to prefix 9's allocation, as Preble adds a GPU to every
    # ancestor of what it routes there)
    k, why, numbers = send(policy, "above", [51, 0], 100, 10)
    assert (k, why) == (0, "exploit")
    assert numbers == {"matched": 51.0, "missing": 49.0}
    # with pages: 52 of 100 matched exploits, 48 explores
    _, paged = preble(rebalance=False)
    paged.on_dispatch(request(8000, "load"), WORKERS[0], 0)
    assert send(paged, "p1", [52, 0], 100, 11, page_size=4)[:2] == (0, "exploit")
    assert send(paged, "p2", [48, 0], 100, 12, page_size=4)[:2] == (1, "explore")


def test_explore_cost_terms() -> None:
    _, policy = preble(rebalance=False, tpot=0.01, default_output=10)
    k, why, numbers = send(policy, "a", [0, 0], 1000, None)
    assert (k, why) == (0, "explore")  # a tie at an empty window: the first worker
    assert numbers["load"] == 0.0 and numbers["prefill"] == pytest.approx(prefill(1000, 1000))
    k, _, numbers = send(policy, "b", [0, 0], 1000, None, output=20)
    assert k == 1  # worker 0 now carries request a: its prefill plus 10 tokens x 0.01 s
    _, _, numbers = send(policy, "c", [0, 0], 1000, None)
    expected = min(prefill(1000, 1000) + 0.1, prefill(1000, 1000) + 0.2)
    assert numbers["load"] == pytest.approx(expected)


def test_a_replicated_group_goes_to_its_cheapest_replica() -> None:
    _, policy = preble(rebalance=False)
    # workers 0 and 2 hold the prefix; the first request through it makes the group
    assert send(policy, "a", [80, 0, 80], 100, 3)[:2] == (0, "exploit")
    k, why, numbers = send(policy, "b", [80, 0, 80], 100, 3)
    assert (k, why) == (2, "exploit")  # the replica without request a's load
    assert "cost" in numbers
    assert send(policy, "c", [80, 0, 80], 100, 3)[0] in (0, 2)


def test_migration_moves_the_cheaper_group_to_the_idle_worker() -> None:
    _, policy = preble(rebalance_after=1)
    picks: dict[str, list[int]] = {"A": [], "B": []}
    for i in range(5):
        # two groups on worker 0; group A's requests are cheaper (shorter outputs)
        picks["A"].append(send(policy, f"A{i}", [90, 0], 100, 1, output=10)[0])
        picks["B"].append(send(policy, f"B{i}", [80, 0], 100, 2, output=45)[0])
    # once both groups count twice, worker 0 carries both and worker 1 nothing: group A is
    # allocated to worker 1 (and its windowed cost moves with it), group B stays
    assert picks == {"A": [0, 0, 1, 1, 1], "B": [0, 0, 0, 0, 0]}


def test_no_rebalancing_before_the_gate() -> None:
    _, policy = preble(rebalance_after=50)
    for i in range(40):  # 80 routed, below 50 per worker x 2 workers
        assert send(policy, f"A{i}", [90, 0], 100, 1, output=10)[0] == 0
        assert send(policy, f"B{i}", [80, 0], 100, 2, output=45)[0] == 0


@pytest.mark.parametrize("rising", [False, True])
def test_a_hot_group_is_replicated_only_when_its_ttft_rises(rising: bool) -> None:
    clock, policy = preble(rebalance_after=1, window=60.0)
    picks = []
    for i in range(20):
        clock.now = 3.0 * i  # two half-windows: [0, 30) and [30, 60)
        backlog = 20_000 if rising and clock.now >= 30 else 500
        picks.append(send(policy, f"r{i}", [900, 0, 0], 1000, 5, prefill=[backlog, 0, 0])[0])
    if not rising:
        # one group, steady queue: migrating it would only move the imbalance; stays put
        assert picks == [0] * 20
    else:
        # the first request of the second half doubles the group's estimated TTFT: after
        # it, replicas are added, and exploit takes the cheapest of them
        assert picks[:11] == [0] * 11
        assert set(picks[11:]) == {1, 2}


def test_the_window_forgets() -> None:
    clock, policy = preble(rebalance_after=1, window=60.0)
    for i in range(3):
        send(policy, f"A{i}", [90, 0], 100, 1, output=10)
        send(policy, f"B{i}", [80, 0], 100, 2, output=45)
    assert send(policy, "A-moved", [90, 0], 100, 1)[0] == 1  # migrated, as above
    clock.now = 61.0  # every request left the window: loads are 0, allocations reset
    k, why, numbers = send(policy, "A-later", [90, 0], 100, 1)
    assert (k, why) == (0, "exploit")  # the group follows the cache again
    k, _, numbers = send(policy, "fresh", [0, 0], 100, None)
    assert numbers["load"] == 0.0


def test_eviction_cost_of_the_groups_a_worker_would_lose() -> None:
    _, policy = preble(rebalance=False, tpot=0.0)
    for i in range(3):  # group 4 (600 cached, 100 new each) fills worker 0's predicted LRU
        send(policy, f"g{i}", [600], 700, 4, capacities=[250])
    _, why, numbers = send(policy, "big", [0], 100, None, capacities=[250])
    assert why == "explore"
    # 300 held + 100 new > 250: group 4 would go; miss rate 1/7, 3 requests, prefill of 600
    expected = (1 - 1800 / 2100) * 3 * prefill(600, 600)
    assert numbers["eviction"] == pytest.approx(expected)
    assert send(policy, "small", [0], 10, None, capacities=[None])[2]["eviction"] == 0.0
    _, off = preble(rebalance=False, eviction=False)
    for i in range(3):
        send(off, f"g{i}", [600], 700, 4, capacities=[250])
    assert send(off, "big", [0], 100, None, capacities=[250])[2]["eviction"] == 0.0


def test_a_dispatch_that_choose_did_not_decide_is_still_accounted() -> None:
    _, policy = preble(rebalance=False)
    policy.on_dispatch(request(1000, "elsewhere"), WORKERS[0], 0)
    assert send(policy, "next", [0, 0], 1000, None)[0] == 1


def test_a_dispatch_elsewhere_than_chosen_is_accounted_where_it_went() -> None:
    _, policy = preble(rebalance=False)
    v = view([90, 0], prefix_key=1)
    r = request(100, "moved")
    assert index_of(v, policy.choose(r, v)) == 0  # exploit the holder...
    policy.on_dispatch(r, WORKERS[1], 0)  # ...but the router sent it to worker 1
    # worker 1 joined group 1's allocation (two candidates: the detail has their cost) and
    # carries the load, so the next request of the group goes back to the idle holder
    k, why, numbers = send(policy, "next", [90, 0], 100, 1)
    assert (k, why) == (0, "exploit") and "cost" in numbers


@settings(max_examples=40)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # workers in the view, minus one
            st.integers(0, 4),  # prefix key (0: none)
            st.integers(1, 400),  # prompt tokens
            st.floats(0, 0.9),  # matched fraction on the holders
            st.floats(0, 8),  # seconds since the last request
            st.booleans(),  # dispatch where choose said (else to worker 0)
        ),
        max_size=60,
    ),
    st.sampled_from([1, 2, 3]),
)
def test_running_sums_match_the_window(
    steps: list[tuple[int, int, int, float, float, bool]], min_group: int
) -> None:
    clock, policy = preble(
        window=30.0, rebalance_after=1, min_group_requests=min_group, default_output=8
    )
    for n, (extra, key, size, fraction, gap, obey) in enumerate(steps):
        clock.now += gap
        workers = extra + 1
        matched = int(size * fraction) if key else 0
        lengths = [matched if (key + i) % 2 else 0 for i in range(workers)]
        if key and not any(lengths):
            lengths[0] = matched
        v = view(
            lengths,
            prefill=[(n * 37 + i * 101) % 3000 for i in range(workers)],
            capacities=[None if i == 1 else 900 for i in range(workers)],
            prefix_key=key if max(lengths) else None,
        )
        r = request(size, f"r{n}", expected_output=n % 5)
        k = index_of(v, policy.choose(r, v)) if obey else 0
        if not obey:
            policy.choose(r, v)
        policy.on_dispatch(r, v.workers[k], v.lengths[k])
        policy._check()
    clock.now += 31.0
    policy.choose(request(10), view([0]))
    policy._check()
    assert not policy._groups and not policy._load
