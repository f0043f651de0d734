"""Routing policies on hand-built views: the registry, errors, and each simple policy's rule.

Preble E2, the default policy and the cost models have their own files.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_cases import WORKERS, FakeClock, detail, index_of, reason, request, view

from radixmeta import policies
from radixmeta.errors import InputTypeError, PolicyError, RadixMetaError
from radixmeta.policies import (
    CacheAware,
    Choice,
    DynamoCost,
    EngineLoad,
    Policy,
    Request,
    View,
    create,
    names,
    worker_of,
)

BUILT_INS = [
    "cache_aware",
    "default",
    "dynamo_cost",
    "least_loaded",
    "longest_prefix",
    "power_of_two",
    "preble_e2",
    "random",
    "round_robin",
]


def fresh(name: str) -> Policy:
    """A built-in with a fake clock where it takes one (tests never read the real time)."""
    if name == "preble_e2":
        return create(name, clock=FakeClock())
    return create(name)


# -- the registry --------------------------------------------------------------------------


def test_names_lists_every_built_in() -> None:
    assert names() == BUILT_INS
    assert names() == sorted(policies.POLICIES)


@pytest.mark.parametrize("name", BUILT_INS)
def test_create_builds_a_policy(name: str) -> None:
    policy = fresh(name)
    assert isinstance(policy, Policy)
    assert isinstance(policy, policies.POLICIES[name])
    assert repr(policy).startswith(type(policy).__name__ + "(")


def test_create_unknown_name() -> None:
    with pytest.raises(PolicyError, match=r"unknown policy 'nope'; the built-in policies are "):
        create("nope")
    with pytest.raises(ValueError, match="round_robin"):  # PolicyError is a ValueError
        create("Round_Robin")


def test_create_unknown_parameter_lists_the_accepted_ones() -> None:
    with pytest.raises(
        PolicyError, match=r"policy 'random' has no parameter 'sed'; it takes seed$"
    ):
        create("random", sed=1)
    with pytest.raises(PolicyError, match="it takes no parameters"):
        create("round_robin", seed=1)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        (
            "cache_aware",
            {"cache_threshold": 1.5},
            "cache_threshold must be finite and >= 0 and <= 1",
        ),
        ("cache_aware", {"balance_abs_threshold": -1}, "balance_abs_threshold must be finite"),
        ("cache_aware", {"balance_rel_threshold": math.inf}, "balance_rel_threshold must be"),
        ("cache_aware", {"preset": "python"}, "preset must be one of 'cli', 'rust', got 'python'"),
        ("least_loaded", {"load": "queue"}, "load must be one of 'requests', 'tokens'"),
        ("longest_prefix", {"load": "kv"}, "load must be one of"),
        ("power_of_two", {"load": ""}, "load must be one of"),
        ("dynamo_cost", {"temperature": -0.1}, "temperature must be finite and >= 0, got -0.1"),
        ("dynamo_cost", {"overlap_score_weight": math.nan}, "overlap_score_weight must be"),
        ("preble_e2", {"window": 0}, "window must be finite and > 0, got 0"),
        ("preble_e2", {"high_load_threshold": 0.5}, "high_load_threshold must be finite and >= 1"),
        ("preble_e2", {"min_group_requests": 0}, "min_group_requests must be"),
        ("preble_e2", {"prefill": "llama2"}, "unknown prefill model 'llama2'; known: "),
        ("default", {"host_weight": 2}, "host_weight must be finite and >= 0 and <= 1, got 2"),
        ("default", {"work_weight": -1}, "work_weight must be"),
        ("default", {"prefill": "nope"}, "unknown prefill model 'nope'"),
    ],
)
def test_bad_parameter_values(name: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError, match=message):
        create(name, **params)


@pytest.mark.parametrize(
    ("name", "params", "message"),
    [
        ("random", {"seed": 1.5}, "seed must be an int, got float"),
        ("random", {"seed": True}, "seed must be an int, got bool"),
        ("power_of_two", {"seed": "7"}, "seed must be an int, got str"),
        ("dynamo_cost", {"seed": None}, "seed must be an int, got NoneType"),
        ("cache_aware", {"cache_threshold": "0.3"}, "cache_threshold must be a number, got str"),
        ("least_loaded", {"load": 1}, "load must be a str, got int"),
        ("preble_e2", {"clock": 3.0}, "clock must be callable, got float"),
        ("preble_e2", {"rebalance": 1}, "rebalance must be a bool, got int"),
        ("preble_e2", {"default_output": 4.5}, "default_output must be an integer, got float"),
        ("default", {"prefill": 3}, "prefill model must be a name or a callable, got int"),
    ],
)
def test_bad_parameter_types(name: str, params: dict[str, Any], message: str) -> None:
    with pytest.raises(InputTypeError, match=message):
        create(name, **params)


def test_create_refuses_a_non_string_name() -> None:
    with pytest.raises(InputTypeError, match="policy name must be a str, got type"):
        create(policies.RoundRobin)  # type: ignore[arg-type]


def test_as_policy_takes_names_and_objects() -> None:
    assert isinstance(policies.as_policy("least_loaded"), policies.LeastLoaded)
    own = policies.Random(seed=3)
    assert policies.as_policy(own) is own
    with pytest.raises(PolicyError, match="unknown policy"):
        policies.as_policy("nope")
    with pytest.raises(InputTypeError, match=r"choose\(request, view\) method, got int"):
        policies.as_policy(3)  # type: ignore[arg-type]


def test_errors_are_radixmeta_errors() -> None:
    assert issubclass(PolicyError, RadixMetaError) and issubclass(PolicyError, ValueError)


# -- a policy a user writes ----------------------------------------------------------------


class FewestInFlight:
    """A user's policy in three lines, with no base class."""

    def choose(self, request: Request, view: View) -> Any:
        return min(zip(view.requests, view.workers, strict=True))[1]


def test_user_written_policy() -> None:
    policy = FewestInFlight()
    assert isinstance(policy, Policy)
    assert policies.as_policy(policy) is policy
    v = view([0, 0, 0], requests=[4, 1, 3])
    assert policy.choose(request(8), v) == WORKERS[1]
    assert worker_of(policy.choose(request(8), v)) == WORKERS[1]
    assert worker_of(Choice(WORKERS[2], "x")) == WORKERS[2]


# -- every built-in ------------------------------------------------------------------------


@pytest.mark.parametrize("name", BUILT_INS)
def test_one_worker_view(name: str) -> None:
    policy = fresh(name)
    for i, (size, length) in enumerate([(0, 0), (10, 0), (10, 8), (100, 96), (100, 100)]):
        v = view(
            [length], requests=[i], prefill=[7 * i], capacities=[50], prefix_key=length or None
        )
        r = request(size, f"r{i}")
        choice = policy.choose(r, v)
        assert worker_of(choice) == WORKERS[0]
        if hasattr(policy, "on_dispatch"):
            policy.on_dispatch(r, WORKERS[0], length)


@st.composite
def request_and_view(draw: st.DrawFn, index: int) -> tuple[Request, View]:
    n = draw(st.integers(1, 8))
    page = draw(st.sampled_from([1, 4, 16]))
    pages = draw(st.integers(0, 40))
    size = pages * page + draw(st.integers(0, page - 1))
    lengths = [draw(st.integers(0, pages)) * page for _ in range(n)]
    host = [length + draw(st.integers(0, pages - length // page)) * page for length in lengths]
    small = st.integers(0, 300)
    tokens = st.integers(0, 50_000)
    loads = EngineLoad(queue_length=3, kv_usage=0.5, running=2)
    v = view(
        lengths,
        host=host,
        requests=[draw(small) for _ in range(n)],
        prefill=[draw(tokens) for _ in range(n)],
        decode=[draw(tokens) for _ in range(n)],
        capacities=[draw(st.none() | st.integers(0, 60_000)) for _ in range(n)],
        reported=[draw(st.sampled_from([None, loads])) for _ in range(n)],
        page_size=page,
        prefix_key=draw(st.integers(0, 3)) if max(lengths) else None,
    )
    expected = draw(st.none() | st.integers(0, 500))
    return request(size, f"r{index}", expected), v


@given(
    cases=st.lists(st.integers(0, 10**6), min_size=1, max_size=8).flatmap(
        lambda ids: st.tuples(*(request_and_view(i) for i in range(len(ids))))
    )
)
def test_any_view_gets_one_of_its_workers(cases: tuple[tuple[Request, View], ...]) -> None:
    clock = FakeClock()
    built = [create(n, clock=clock) if n == "preble_e2" else create(n) for n in BUILT_INS]
    extra = [
        create("preble_e2", clock=clock, rebalance_after=0, window=5.0),
        create("dynamo_cost", temperature=0.5),
        create("least_loaded", load="tokens"),
        create("cache_aware", preset="rust"),
    ]
    for step, (r, v) in enumerate(cases):
        clock.now = step * 2.0
        for policy in built + extra:
            choice = policy.choose(r, v)
            assert worker_of(choice) in v.workers
            if isinstance(choice, Choice):
                assert choice.reason and all(isinstance(x, float) for _, x in choice.detail)
            if hasattr(policy, "on_dispatch"):
                policy.on_dispatch(r, worker_of(choice), v.lengths[index_of(v, choice)])


# -- round robin, random, least loaded, power of two ---------------------------------------


def test_round_robin_cycles_over_the_current_workers() -> None:
    policy = create("round_robin")
    v3, v2 = view([0, 0, 0]), view([0, 0])
    picks = [index_of(v3, policy.choose(request(4), v3)) for _ in range(4)]
    assert picks == [0, 1, 2, 0]
    assert index_of(v2, policy.choose(request(4), v2)) == 0  # turn 4 of 2 workers
    assert reason(policy.choose(request(4), v2)) == "round_robin"


def draws(policy: Policy, v: View, count: int = 60) -> list[int]:
    return [index_of(v, policy.choose(request(4, f"r{i}"), v)) for i in range(count)]


@pytest.mark.parametrize("name", ["random", "power_of_two"])
def test_same_seed_same_decisions(name: str) -> None:
    v = view([0] * 6, requests=[3, 1, 4, 1, 5, 9], prefill=[2, 7, 1, 8, 2, 8])
    assert draws(create(name, seed=11), v) == draws(create(name, seed=11), v)
    assert draws(create(name, seed=11), v) != draws(create(name, seed=12), v)
    assert draws(create(name), v) == draws(create(name, seed=0), v)  # the default seed is 0


def test_random_is_roughly_uniform() -> None:
    picks = draws(create("random", seed=5), view([0] * 4), count=400)
    assert all(70 < picks.count(i) < 130 for i in range(4))


def test_least_loaded_by_requests_or_tokens() -> None:
    v = view([0, 0, 0], requests=[2, 5, 2], prefill=[900, 10, 500], decode=[100, 10, 0])
    by_requests = create("least_loaded").choose(request(8), v)
    assert index_of(v, by_requests) == 0 and reason(by_requests) == "balance"
    assert detail(by_requests) == {"load": 2.0}
    by_tokens = create("least_loaded", load="tokens").choose(request(8), v)
    assert index_of(v, by_tokens) == 1 and detail(by_tokens) == {"load": 20.0}


def test_power_of_two_takes_the_lesser_of_two_distinct_workers() -> None:
    v = view([0, 0], prefill=[50, 10])
    assert set(draws(create("power_of_two", seed=1), v)) == {1}  # two of two: always the lesser
    v4 = view([0] * 4, requests=[0, 1, 2, 3])
    picks = draws(create("power_of_two", seed=2, load="requests"), v4, count=300)
    assert 3 not in picks  # the most loaded never wins a pair
    assert picks.count(0) > picks.count(1) > picks.count(2) > 0  # 3/6, 2/6, 1/6 of the pairs


# -- longest prefix, and its collapse ------------------------------------------------------


def test_longest_prefix_ties_go_to_the_least_loaded() -> None:
    policy = create("longest_prefix")
    v = view([8, 8, 0], requests=[3, 1, 0])
    choice = policy.choose(request(16), v)
    assert index_of(v, choice) == 1 and reason(choice) == "affinity"
    assert detail(choice) == {"matched": 8.0, "load": 1.0}
    v = view([0, 0, 0], requests=[3, 1, 0])
    assert index_of(v, policy.choose(request(16), v)) == 2
    assert reason(policy.choose(request(16), v)) == "balance"


def route_shared_root(policy: Policy, count: int = 40, workers: int = 4) -> list[int]:
    """Send ``count`` requests sharing a 64-token root; loads only grow (nothing finishes)."""
    root, tail = 64, 16
    holds = [False] * workers
    in_flight = [0] * workers
    picks = []
    for i in range(count):
        v = view(
            [root if h else 0 for h in holds],
            requests=in_flight,
            prefill=[tail * n for n in in_flight],
            prefix_key=1 if any(holds) else None,
        )
        r = request(root + tail, f"r{i}")
        choice = policy.choose(r, v)
        k = index_of(v, choice)
        if hasattr(policy, "on_dispatch"):
            policy.on_dispatch(r, v.workers[k], v.lengths[k])
        holds[k] = True  # the router's optimistic insert
        in_flight[k] += 1
        picks.append(k)
    return picks


def test_longest_prefix_collapses_onto_one_worker() -> None:
    picks = route_shared_root(create("longest_prefix"))
    assert picks == [0] * 40  # 40 in flight on worker 0, none anywhere else


def test_load_aware_policies_do_not_collapse() -> None:
    assert sorted(set(route_shared_root(create("least_loaded")))) == [0, 1, 2, 3]
    # cache_aware follows the match until the spread passes balance_abs_threshold (32 with
    # the Rust defaults), then balances: the 34th request is the first to leave worker 0.
    picks = route_shared_root(create("cache_aware", preset="rust"))
    assert picks[:33] == [0] * 33 and picks[33] != 0
    # with the CLI defaults (64) forty requests never get there
    assert route_shared_root(create("cache_aware")) == [0] * 40


# -- cache_aware: the rule at its boundaries -----------------------------------------------

PRESETS = {
    # preset: (cache_threshold, balance_abs, balance_rel, min and max loads at the rel boundary)
    "cli": (0.3, 64, 1.5, 200, 300),
    "rust": (0.5, 32, 1.1, 400, 440),
}


@pytest.mark.parametrize("preset", ["cli", "rust"])
def test_cache_aware_defaults(preset: str) -> None:
    threshold, spread, ratio, _, _ = PRESETS[preset]
    policy = create("cache_aware", preset=preset)
    assert isinstance(policy, CacheAware)
    assert (policy.cache_threshold, policy.balance_abs_threshold) == (threshold, spread)
    assert policy.balance_rel_threshold == ratio
    assert policies.CACHE_AWARE_PRESETS[preset] == (threshold, spread, ratio)


@pytest.mark.parametrize("preset", ["cli", "rust"])
def test_cache_aware_absolute_imbalance_boundary(preset: str) -> None:
    _, spread, _, _, _ = PRESETS[preset]
    policy = create("cache_aware", preset=preset)
    full = [0, 100]  # worker 1 holds the whole prompt
    at = view(full, requests=[0, spread])  # spread == threshold: balanced
    choice = policy.choose(request(100), at)
    assert (index_of(at, choice), reason(choice)) == (1, "affinity")
    over = view(full, requests=[0, spread + 1])
    choice = policy.choose(request(100), over)
    assert (index_of(over, choice), reason(choice)) == (0, "balance")
    assert detail(choice) == {"min_load": 0.0, "max_load": spread + 1.0}


@pytest.mark.parametrize("preset", ["cli", "rust"])
def test_cache_aware_relative_imbalance_boundary(preset: str) -> None:
    _, spread, _, low, high = PRESETS[preset]
    assert high - low > spread  # the absolute test passes on both sides
    policy = create("cache_aware", preset=preset)
    full = [0, 100]
    at = view(full, requests=[low, high])  # max == rel * min: balanced
    assert reason(policy.choose(request(100), at)) == "affinity"
    over = view(full, requests=[low, high + 1])
    choice = policy.choose(request(100), over)
    assert (index_of(over, choice), reason(choice)) == (0, "balance")


@pytest.mark.parametrize("preset", ["cli", "rust"])
def test_cache_aware_match_rate_boundary(preset: str) -> None:
    threshold, _, _, _, _ = PRESETS[preset]
    policy = create("cache_aware", preset=preset)
    matched = round(threshold * 100)
    at = view([0, matched, 0], requests=[2, 3, 1])  # rate == threshold: a miss
    choice = policy.choose(request(100), at)
    assert (index_of(at, choice), reason(choice)) == (2, "miss")  # the least loaded
    assert detail(choice) == {"match_rate": threshold, "load": 1.0}
    above = view([0, matched + 1, 0], requests=[2, 3, 1])
    choice = policy.choose(request(100), above)
    assert (index_of(above, choice), reason(choice)) == (1, "affinity")
    assert detail(choice) == {"match_rate": (matched + 1) / 100}


def test_cache_aware_details() -> None:
    policy = create("cache_aware", cache_threshold=0.0)
    empty = view([0, 0], requests=[1, 0])
    assert reason(policy.choose(request(0), empty)) == "miss"  # an empty prompt matches nothing
    v = view([4, 4, 0], requests=[3, 2, 0], page_size=4)
    choice = policy.choose(request(10), v)  # equal matches: the less loaded of them
    assert (index_of(v, choice), reason(choice)) == (1, "affinity")
    ties = view([0, 0, 0], requests=[1, 0, 0])
    assert index_of(ties, policy.choose(request(10), ties)) == 1  # load ties: the first


# -- dynamo_cost ---------------------------------------------------------------------------


def dynamo_formula(r: Request, v: View, weight: float) -> list[float]:
    size, block = len(r.tokens), v.page_size
    return [
        weight * (size - v.lengths[i] + v.prefill_tokens[i]) / block
        + v.decode_tokens[i] / block
        + math.ceil(size / block)
        for i in range(len(v.workers))
    ]


DYNAMO_VIEW = view(
    [64, 32, 0, 96],
    prefill=[300, 0, 0, 700],
    decode=[1000, 4000, 2500, 200],
    page_size=16,
)


@pytest.mark.parametrize("weight", [0.0, 0.5, 1.0, 2.0, 8.0])
def test_dynamo_cost_ranks_as_its_formula(weight: float) -> None:
    policy = create("dynamo_cost", overlap_score_weight=weight)
    assert isinstance(policy, DynamoCost)
    r = request(130)
    expected = dynamo_formula(r, DYNAMO_VIEW, weight)
    assert policy.costs(r, DYNAMO_VIEW) == pytest.approx(expected)
    choice = policy.choose(r, DYNAMO_VIEW)
    assert index_of(DYNAMO_VIEW, choice) == expected.index(min(expected))
    assert reason(choice) == "cost" and detail(choice)["cost"] == pytest.approx(min(expected))


def test_dynamo_cost_weights_change_the_winner() -> None:
    r = request(130)
    picks = {
        w: index_of(
            DYNAMO_VIEW, create("dynamo_cost", overlap_score_weight=w).choose(r, DYNAMO_VIEW)
        )
        for w in (0.0, 8.0)
    }
    # decode blocks alone favour worker 3 (its 700 waiting prefill tokens do not count);
    # weighted prefill favours worker 2, which holds nothing but has no queue
    assert picks == {0.0: 3, 8.0: 2}


def test_dynamo_cost_ties_and_temperature_are_seeded() -> None:
    tied = view([0, 0, 0, 0])
    for seed in (1, 2):
        a = draws(create("dynamo_cost", seed=seed), tied, 40)
        assert a == draws(create("dynamo_cost", seed=seed), tied, 40)
        assert len(set(a)) == 4  # ties drawn at random, not always the first
    v = DYNAMO_VIEW
    cold = draws(create("dynamo_cost", temperature=1e-9, seed=3), v, 40)
    assert set(cold) == {3}  # a vanishing temperature is the arg-min (costs 94, 265, 173, 67)
    warm = draws(create("dynamo_cost", temperature=100.0, seed=3), v, 400)
    assert warm == draws(create("dynamo_cost", temperature=100.0, seed=3), v, 400)
    assert all(60 < warm.count(i) < 140 for i in range(4))  # near uniform
    mid = draws(create("dynamo_cost", temperature=0.2, seed=4), v, 400)
    assert mid.count(3) > mid.count(0) > mid.count(2) > mid.count(1)  # cheaper: drawn more
