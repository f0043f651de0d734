"""The policies' ``rank`` hook and ``Router.dispatch(..., ranked=True)``.

``rank(request, view)`` lists every worker of the view, best first, the first being
what ``choose`` picks for the same view in the same state, and changes nothing: a
twin of the policy that is never asked to rank makes the same choices.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_cases import WORKERS, FakeClock, request, view, with_

from radixmeta import Router
from radixmeta.errors import InputTypeError, PolicyError
from radixmeta.policies import EngineLoad, Request, View, create, names, worker_of
from radixmeta.router.ranking import by_held

#: Every built-in with its defaults, and the variants whose ranking takes another path.
VARIANTS: list[tuple[str, dict[str, Any]]] = [
    *((name, {}) for name in names()),
    ("least_loaded", {"load": "tokens"}),
    ("longest_prefix", {"load": "tokens"}),
    ("power_of_two", {"load": "requests", "seed": 5}),
    ("cache_aware", {"preset": "rust"}),
    ("cache_aware", {"cache_threshold": 0.0, "balance_abs_threshold": 0.0}),
    ("dynamo_cost", {"temperature": 0.5, "seed": 3}),
    ("dynamo_cost", {"overlap_score_weight": 0.0}),  # many ties: drawn at random
    ("preble_e2", {"rebalance_after": 0, "window": 5.0}),
    ("default", {"work_weight": 0.0}),
    ("default", {"host_weight": 0.0}),
]


def build(name: str, params: dict[str, Any], clock: FakeClock) -> Any:
    return create(name, clock=clock, **params) if name == "preble_e2" else create(name, **params)


@st.composite
def request_and_view(draw: st.DrawFn, index: int) -> tuple[Request, View]:
    """A request and a view with small numbers, so that ties are common."""
    n = draw(st.integers(1, 8))
    page = draw(st.sampled_from([1, 16]))
    pages = draw(st.integers(0, 12))
    size = pages * page + draw(st.integers(0, page - 1))
    lengths = [draw(st.integers(0, pages)) * page for _ in range(n)]
    if draw(st.booleans()):
        host = None  # the router's case without a host tier: the same list
    else:
        host = [x + draw(st.integers(0, pages - x // page)) * page for x in lengths]
    small = st.integers(0, 6)
    tokens = st.sampled_from([0, 0, 16, 100, 4000])
    load = st.none() | st.builds(
        EngineLoad,
        queue_length=st.none() | small,
        kv_usage=st.none() | st.sampled_from([0.0, 0.5, 0.99]),
        running=st.none() | small,
        router_requests=st.none() | small,
    )
    v = view(
        lengths,
        host=host,
        requests=[draw(small) for _ in range(n)],
        prefill=[draw(tokens) for _ in range(n)],
        decode=[draw(tokens) for _ in range(n)],
        capacities=[draw(st.none() | st.sampled_from([0, 300, 60_000])) for _ in range(n)],
        reported=[draw(load) for _ in range(n)],
        page_size=page,
        prefix_key=draw(st.integers(0, 2)) if max(lengths) else None,
    )
    cut = draw(st.sampled_from(["none", "same", "cut"]))
    if cut == "same":
        v.expected = v.lengths
    elif cut == "cut":
        v.expected = [x - draw(st.integers(0, x // page)) * page for x in lengths]
    output = draw(st.none() | st.integers(0, 500))
    return request(size, f"r{index}", output), v


@pytest.mark.parametrize(("name", "params"), VARIANTS, ids=lambda x: str(x))
@given(
    cases=st.integers(1, 6).flatmap(
        lambda k: st.tuples(*(request_and_view(i) for i in range(k)))
    )
)
def test_rank_lists_every_worker_choose_first_and_changes_nothing(
    name: str, params: dict[str, Any], cases: tuple[tuple[Request, View], ...]
) -> None:
    clock, twin_clock = FakeClock(), FakeClock()
    policy = build(name, params, clock)
    twin = build(name, params, twin_clock)  # never ranks: its choices are the reference
    for step, (r, v) in enumerate(cases):
        clock.now = twin_clock.now = step * 2.0
        ranking = policy.rank(r, v)
        assert sorted(w.index for w in ranking) == list(range(len(v.workers)))
        assert all(w in v.workers for w in ranking)
        chosen = worker_of(policy.choose(r, v))
        assert ranking[0] == chosen
        assert worker_of(twin.choose(r, v)) == chosen
        for p in (policy, twin):
            if hasattr(p, "on_dispatch"):
                p.on_dispatch(r, chosen, v.lengths[v.workers.index(chosen)])


# -- the orders the rules give --------------------------------------------------------------


def names_of(workers: list[Any]) -> list[int]:
    return [w.index for w in workers]


def test_least_loaded_and_longest_prefix_rank_by_their_keys() -> None:
    v = view([0, 32, 32, 16], requests=[1, 3, 2, 0])
    assert names_of(create("least_loaded").rank(request(64), v)) == [3, 0, 2, 1]
    assert names_of(create("longest_prefix").rank(request(64), v)) == [2, 1, 3, 0]


def test_cache_aware_ranks_by_the_branch_it_takes() -> None:
    policy = create("cache_aware", balance_abs_threshold=2.0, balance_rel_threshold=1.0)
    matched = view([48, 0, 16, 48], requests=[2, 0, 1, 1])
    assert names_of(policy.rank(request(64), matched)) == [3, 0, 2, 1]  # affinity
    skewed = with_(matched, requests=[9, 0, 4, 5])
    assert names_of(policy.rank(request(64), skewed)) == [1, 2, 3, 0]  # balance
    cold = with_(matched, lengths=[0, 0, 16, 0])
    assert names_of(policy.rank(request(64), cold)) == [1, 2, 3, 0]  # miss: by load


def test_round_robin_ranks_the_coming_turns() -> None:
    policy = create("round_robin")
    v = view([0, 0, 0, 0])
    policy.choose(request(4), v)
    assert names_of(policy.rank(request(4), v)) == [1, 2, 3, 0]


def test_default_ranks_by_score_holder_then_the_cheapest_recompute() -> None:
    # Worker 2 holds the prompt; 0 and 3 are idle and cold; 1 is cold and busy.
    v = view([0, 0, 3000, 0], requests=[0, 4, 1, 0], prefill=[0, 9000, 100, 0])
    ranking = names_of(create("default").rank(request(3100), v))
    assert ranking[0] == 2 and ranking[-1] == 1 and sorted(ranking[1:3]) == [0, 3]


def test_dynamo_ranks_by_cost() -> None:
    v = view([64, 0, 32], prefill=[0, 0, 0], decode=[640, 0, 0], page_size=16)
    # Costs in blocks: 0 + 40 + 4, 4 + 0 + 4, 2 + 0 + 4.
    assert names_of(create("dynamo_cost").rank(request(64), v)) == [2, 1, 0]


# -- the router's entry point ----------------------------------------------------------------


def fleet(policy: Any = "default") -> Router:
    router = Router(4, policy=policy, mode="approximate")
    for name in "abcd":
        router.add_worker(name, capacity=10_000)
    return router


def test_dispatch_ranked_keeps_the_policy_order_with_the_chosen_worker_first() -> None:
    router = fleet("least_loaded")
    a, b, c, d = router.workers
    for _ in range(3):
        router.dispatch([1] * 8, ranked=False)  # a, b, c: one each
    router.report_load(a, queue_length=5)
    decision = router.dispatch([2] * 8, ranked=True)
    assert decision.worker is d
    assert decision.ranking == (d, b, c, a)
    assert router.dispatch([3] * 8).ranking is None  # not asked: not computed


def test_a_policy_without_rank_falls_back_to_held_tokens_then_load() -> None:
    class Last:
        def choose(self, request: Request, view: View) -> Any:
            return view.workers[-1]

    router = fleet(Last())
    a, b, c, d = router.workers
    prompt = list(range(32))
    router.tree.insert(prompt[:16], b)
    router.tree.insert(prompt[:8], c)
    router.dispatch([7] * 8)  # one request on d
    decision = router.dispatch(prompt, ranked=True)
    assert decision.worker is d
    assert decision.ranking == (d, b, c, a)
    assert by_held(decision._view) == [b, c, a, d]


def test_a_rank_that_disagrees_with_choose_is_overruled_by_the_choice() -> None:
    class Contrary:
        def choose(self, request: Request, view: View) -> Any:
            return view.workers[0]

        def rank(self, request: Request, view: View) -> list[Any]:
            return list(reversed(view.workers))

    router = fleet(Contrary())
    a, b, c, d = router.workers
    assert router.dispatch([1] * 8, ranked=True).ranking == (a, d, c, b)


@pytest.mark.parametrize(
    "bad",
    [
        lambda view: list(view.workers[:-1]),  # one missing
        lambda view: [view.workers[0]] * len(view.workers),  # repeated
        lambda view: [*view.workers[:-1], WORKERS[9]],  # a stranger
        lambda view: None,
        lambda view: [w.index for w in view.workers],  # not workers
    ],
)
def test_a_bad_ranking_raises_and_changes_nothing(bad: Any) -> None:
    class Bad:
        chosen = 0

        def choose(self, request: Request, view: View) -> Any:
            self.chosen += 1
            return view.workers[0]

        def rank(self, request: Request, view: View) -> Any:
            return bad(view)

    policy = Bad()
    router = fleet(policy)
    with pytest.raises(PolicyError, match="rank returned"):
        router.dispatch([1] * 8, request_id="x", ranked=True)
    assert router.in_flight == 0 and policy.chosen == 0
    assert max(router.tree.match([1] * 8).length_list) == 0
    assert router.dispatch([1] * 8, request_id="x").worker is router.workers[0]


def test_ranked_must_be_a_bool() -> None:
    router = fleet()
    with pytest.raises(InputTypeError, match="ranked must be a bool"):
        router.dispatch([1] * 8, ranked=1)  # type: ignore[arg-type]
    assert router.in_flight == 0
