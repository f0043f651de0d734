"""``default``'s in-order batch path: a batch under ``IN_ORDER_BUDGET`` is decided as a
run of single dispatches would decide it, request by request, each seeing the earlier
ones' loads and pages (``radixmeta.policies._in_order``)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from _policies import load_fleet
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmeta import Router
from radixmeta.errors import PolicyError
from radixmeta.policies import _in_order
from radixmeta.policies import default as default_module
from radixmeta.policies.base import Request, View
from radixmeta.policies.default import IN_ORDER_BUDGET, IN_ORDER_COST, DefaultPolicy


@st.composite
def prompts(draw: st.DrawFn, page: int) -> list[int]:
    """A prompt built from a few shared stems (system prompts, earlier turns) and a tail,
    so batches share prefixes of many depths, some not on a page boundary."""
    stems = draw(st.lists(st.sampled_from([0, 1, 2]), max_size=3))
    out: list[int] = []
    for depth, stem in enumerate(stems):
        out += [100 * (depth + 1) + stem] * draw(st.sampled_from([page, 2 * page, 3 * page + 1]))
    out += draw(st.lists(st.integers(0, 3), max_size=2 * page + 1))
    return out or [7]


@st.composite
def fleets_and_batches(draw: st.DrawFn) -> dict[str, Any]:
    page = draw(st.sampled_from([1, 2, 4]))
    return {
        "page": page,
        "mode": draw(st.sampled_from(["exact", "approximate"])),
        "workers": draw(st.integers(1, 6)),
        "in_flight": draw(st.lists(st.tuples(prompts(page), st.booleans()), max_size=4)),
        "held": draw(st.lists(prompts(page), max_size=3)),
        "reports": draw(st.lists(st.tuples(st.integers(0, 6), st.floats(0, 1)), max_size=2)),
        "namespaces": draw(st.booleans()),
        "down": draw(st.booleans()),  # a worker down: the views align to the up ones
        "batches": draw(
            st.lists(st.lists(prompts(page), min_size=1, max_size=16), min_size=1, max_size=3)
        ),
    }


def twin(case: dict[str, Any]) -> Router:
    """A router in the case's state (in-flight requests, held pages, engine reports)."""
    router = Router(case["page"], policy="default", mode=case["mode"])
    # Approximate mode needs a capacity; one this large never cuts an expected length.
    capacity = 1 << 40 if case["mode"] == "approximate" else None
    workers = [router.add_worker(f"w{i}", capacity=capacity) for i in range(case["workers"])]
    load_fleet(router, workers, case)
    if case.get("down") and len(workers) > 1:
        router.mark_down(workers[0])
    return router


def items(case: dict[str, Any], batch: list[list[int]]) -> list[dict[str, Any]]:
    out = []
    for k, key in enumerate(batch):
        item: dict[str, Any] = {"tokens": np.array(key, dtype=np.uint32)}
        if case["namespaces"] and k % 3 == 2:
            item["namespace"] = "lora"
        out.append(item)
    return out


def batch_against_single(case: dict[str, Any]) -> None:
    """Both routers' decisions (worker, matched, reason), batch after batch."""
    batched, single = twin(case), twin(case)
    for batch in case["batches"]:
        got = batched.dispatch_batch(items(case, batch))
        want = [single.dispatch(**item) for item in items(case, batch)]
        assert [(d.worker, d.matched) for d in got] == [(d.worker, d.matched) for d in want]
        assert [d.label for d in got] == [d.label for d in want]
        assert [dict(d.detail) for d in got] == [dict(d.detail) for d in want]
    batched.close()
    single.close()


@settings(max_examples=150, deadline=None)
@given(case=fleets_and_batches())
def test_a_batch_under_the_budget_is_decided_as_single_dispatches(case: dict[str, Any]) -> None:
    assert 16 * (IN_ORDER_COST[0] + 6 * IN_ORDER_COST[1]) <= IN_ORDER_BUDGET
    batch_against_single(case)


def test_the_comparison_fails_without_the_in_order_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # The property above is not true of the packing: a system prompt shared by a batch
    # that packing keeps on one worker while single dispatches spread it as it loads.
    monkeypatch.setattr(default_module, "IN_ORDER_BUDGET", 0.0)
    stem = [9] * 64
    case = {
        "page": 1, "mode": "exact", "workers": 2, "in_flight": [], "held": [], "reports": [],
        "namespaces": False, "down": False, "batches": [[stem + [k] * 8 for k in range(8)]],
    }
    with pytest.raises(AssertionError):
        batch_against_single(case)


def test_a_batch_over_the_budget_is_packed() -> None:
    router = Router(1, policy="default")
    for i in range(4):
        router.add_worker(f"w{i}")
    fits = int(IN_ORDER_BUDGET / (IN_ORDER_COST[0] + 4 * IN_ORDER_COST[1]))
    small = router.dispatch_batch([np.array([k, k + 1], dtype=np.uint32) for k in range(fits)])
    assert {d.label for d in small} <= {"balance", "affinity", "spill"}
    large = router.dispatch_batch(
        [np.array([k, 5000 + k], dtype=np.uint32) for k in range(fits + 1)]
    )
    assert {d.label for d in large} == {"batch"}
    router.close()


def test_the_second_request_of_a_prefix_finds_it_where_the_first_went() -> None:
    # Two workers, one busy: the first request of a fresh prefix goes to the idle one,
    # and the second sees the prefix cached there (the view adds the first's pages).
    router = Router(1, policy="default")
    w0, w1 = router.add_worker("w0"), router.add_worker("w1")
    router.dispatch(np.arange(10_000, 10_500, dtype=np.uint32))  # busies one worker
    stem = list(range(2000))
    first, second = router.dispatch_batch(
        [np.array([*stem, 1], dtype=np.uint32), np.array([*stem, 2], dtype=np.uint32)]
    )
    assert first.worker == second.worker
    assert first.matched == 0 and second.matched == 2000
    assert second.label == "affinity"
    assert {w0, w1} >= {first.worker}
    router.close()


def view_of(workers: tuple[Any, ...], n: int) -> View:
    zeros = [0] * n
    return View(workers, zeros, zeros, zeros[:], zeros[:], zeros[:], [None] * n, [None] * n, 1)


def test_groups_without_partners_are_not_decided_in_order() -> None:
    router = Router(1, policy="default")
    workers = tuple(router.add_worker(f"w{i}") for i in range(2))
    requests = [Request(str(k), np.array([k], dtype=np.uint32)) for k in range(3)]
    views = [view_of(workers, 2)] * 3
    calls: list[int] = []

    def choose(request: Request, view: View) -> Any:
        calls.append(1)
        return view.workers[0]

    assert _in_order.decide_in_order(choose, requests, views, [([0, 1, 2], 0)]) is None
    assert not calls  # nothing decided
    # The policy then packs such groups.
    got = DefaultPolicy().choose_batch(requests, views, [([0, 1, 2], 0)])
    assert {c.reason for c in got} == {"batch"}
    router.close()


def test_a_choice_outside_the_view_raises_and_the_policy_is_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from radixmeta._batch import prefix_groups

    router = Router(1, policy="default")
    workers = tuple(router.add_worker(f"w{i}") for i in range(3))
    requests = [
        Request(str(k), np.array([k], dtype=np.uint32), expected_output=5) for k in range(3)
    ]
    views = [view_of(workers[:2], 2)] * 3
    found = prefix_groups([r.tokens for r in requests], None, None, 1, 0.5)
    with pytest.raises(PolicyError, match="not one of its view's workers"):
        _in_order.decide_in_order(lambda r, v: workers[2], requests, views, found)

    # choose raising on the second request: the rotation and the outputs counted by
    # the first are taken back.
    policy = DefaultPolicy()
    before = (policy._turn, policy._outputs[:])
    original = DefaultPolicy.choose
    calls = iter([False, True])

    def failing(self: DefaultPolicy, request: Request, view: View) -> Any:
        choice = original(self, request, view)
        if next(calls):
            msg = "boom"
            raise RuntimeError(msg)
        return choice

    monkeypatch.setattr(DefaultPolicy, "choose", failing)
    with pytest.raises(RuntimeError, match="boom"):
        policy.choose_batch(requests, views, found)
    assert (policy._turn, policy._outputs) == before
    router.close()
