"""Every Router call is a transaction: what raises (a policy, a hook, the clock, a bad
argument) changes nothing; expire and remove_worker release what they must, then raise.

Each case states one failure; tests/test_router_machine.py injects the same failures at
random points of random traffic.
"""

from __future__ import annotations

import math
import pickle
from typing import Any

import numpy as np
import pytest
from _policies import First, LeastLoaded, Longest, Recorder
from test_router_machine import observed

from radixmeta import Router, WorkerId
from radixmeta.errors import (
    HookError,
    InputTypeError,
    InvalidInputError,
    PolicyError,
    RouterError,
)
from radixmeta.policies.base import Choice, Request, View


class Boom(Exception):
    """What the hostile policies and clocks raise."""


class Hooks(Recorder):
    """A Recorder whose on_dispatch raises for the ids in ``dispatch``, and whose on_finish
    raises for those in ``finish``."""

    def __init__(
        self, inner: Any, dispatch: set[str] | None = None, finish: set[str] | None = None
    ) -> None:
        super().__init__(inner)
        self.refuse_dispatch = dispatch if dispatch is not None else set()
        self.refuse_finish = finish if finish is not None else set()

    def on_dispatch(self, request: Request, worker: WorkerId, matched: int) -> None:
        if request.request_id in self.refuse_dispatch:
            raise Boom(request.request_id)
        super().on_dispatch(request, worker, matched)

    def on_finish(self, request: Request, worker: WorkerId) -> None:
        if request.request_id in self.refuse_finish:
            raise Boom(request.request_id)
        super().on_finish(request, worker)


class BatchHooks(Hooks):
    flat_groups = True

    def choose_batch(self, requests: Any, views: Any, groups: Any) -> list[Any]:
        return [self.choose(r, v) for r, v in zip(requests, views, strict=True)]


class Clock:
    def __init__(self, reading: Any = 100.0) -> None:
        self.reading = reading

    def __call__(self) -> Any:
        if isinstance(self.reading, BaseException):
            raise self.reading
        return self.reading


def fleet(policy: Any, mode: str = "exact", clock: Any = None) -> Router:
    router = Router(2, policy=policy, mode=mode, clock=clock or Clock())
    for name in ("a", "b"):
        router.add_worker(name, capacity=64)
    router.finish(router.dispatch([1, 2, 3, 4], request_id="warm").request_id)
    router.dispatch([1, 2, 5, 6], request_id="live")  # one request in flight throughout
    return router


@pytest.fixture(params=["exact", "approximate"])
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# -- dispatch --------------------------------------------------------------------------------
class Raises:
    def choose(self, request: Request, view: View) -> Any:
        msg = "choose"
        raise Boom(msg)


class BadReason:
    def __init__(self, reason: Any, detail: Any = ()) -> None:
        self.reason, self.detail = reason, detail

    def choose(self, request: Request, view: View) -> Any:
        return Choice(view.workers[0], self.reason, self.detail)


@pytest.mark.parametrize(
    ("policy", "error", "message"),
    [
        (Raises(), Boom, "choose"),
        (BadReason(7), PolicyError, "a reason must be a str"),
        (BadReason(None), PolicyError, "a reason must be a str"),
        (BadReason(b"affinity"), PolicyError, "a reason must be a str"),
        (BadReason("ok", detail=3), PolicyError, "it must be \\(name, number\\) pairs"),
    ],
)
def test_a_failing_policy_changes_nothing(
    mode: str, policy: Any, error: type, message: str
) -> None:
    router = fleet(LeastLoaded(), mode)
    before = observed(router)
    router.policy = policy
    with pytest.raises(error, match=message):
        router.dispatch([1, 2, 3, 4, 7, 8], request_id="x")
    with pytest.raises(error, match=message):
        router.dispatch_batch([[1, 2, 3, 4], {"tokens": [9, 9], "request_id": "y"}])
    router.policy = LeastLoaded()
    assert observed(router) == before  # metrics_text() renders too (a reason is always a str)
    assert router.dispatch([1, 2], request_id="x").request_id == "x"  # the id was not taken


def test_a_reason_given_as_a_list_of_pairs_is_taken() -> None:
    router = fleet(BadReason("fine", detail=[("n", 1.0)]))
    d = router.dispatch([1, 2])
    assert d.detail == (("n", 1.0),) and d.reason == "fine (n=1)"


def test_a_failing_on_dispatch_hook_changes_nothing(mode: str) -> None:
    policy = Hooks(Longest(), dispatch={"x"})
    router = fleet(policy, mode)
    before = observed(router)
    with pytest.raises(Boom):
        router.dispatch([1, 2, 3, 4, 7, 8], request_id="x")
    assert observed(router) == before
    assert [rid for rid, *_ in policy.dispatched] == ["warm", "live"]


@pytest.mark.parametrize(
    ("reading", "error", "message"),
    [
        (Boom("clock"), Boom, "clock"),
        (math.nan, InvalidInputError, "the router's clock must return finite seconds, got nan"),
        (math.inf, InvalidInputError, "finite seconds, got inf"),
        ("soon", InputTypeError, "a number of seconds, got str"),
        (None, InputTypeError, "a number of seconds, got NoneType"),
        (True, InputTypeError, "a number of seconds, got bool"),
    ],
)
def test_a_failing_clock_changes_nothing(
    mode: str, reading: Any, error: type, message: str
) -> None:
    clock = Clock()
    policy = Hooks(Longest())
    router = fleet(policy, mode, clock)
    before = observed(router)
    clock.reading = reading
    with pytest.raises(error, match=message):
        router.dispatch([1, 2, 3, 4, 7, 8])
    with pytest.raises(error, match=message):
        router.dispatch_batch([[1, 2, 3, 4], [1, 2, 3, 4, 9, 9]])
    with pytest.raises(error, match=message):
        router.expire(0)
    assert observed(router) == before
    assert len(policy.dispatched) == 2 and policy.finished == [("warm", router.workers[0])]


@pytest.mark.parametrize("reading", [np.float64(5.0), 7, 7.5])
def test_a_clock_may_return_any_finite_number(reading: Any) -> None:
    router = fleet(First(), clock=Clock(reading))
    d = router.dispatch([1, 2])
    assert router.expire(0) == ["live", d.request_id]  # dispatched at the clock's reading


# -- batches ---------------------------------------------------------------------------------
@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("refused", [0, 2, 3])
def test_a_batch_whose_hook_fails_is_taken_back(mode: str, batched: bool, refused: int) -> None:
    ids = [f"r{k}" for k in range(4)]
    policy = (BatchHooks if batched else Hooks)(Longest(), dispatch={ids[refused]})
    router = fleet(policy, mode)
    before = observed(router)
    items = [{"tokens": [1, 2, 3, 4, k, k], "request_id": rid} for k, rid in enumerate(ids)]
    with pytest.raises(Boom, match=ids[refused]):
        router.dispatch_batch(items)
    assert observed(router) == before
    # The requests told on_dispatch before the failure were told on_finish: the policy's
    # own accounting is back where it was too.
    told = [rid for rid, *_ in policy.dispatched if rid in ids]
    assert told == ids[:refused]
    assert [rid for rid, _ in policy.finished if rid in ids] == ids[:refused]
    policy.refuse_dispatch.clear()
    assert [d.request_id for d in router.dispatch_batch(items)] == ids


class FailsInSecondGroup(LeastLoaded):
    def choose(self, request: Request, view: View) -> Choice:
        if request.tokens[0] == 9:
            msg = "second group"
            raise Boom(msg)
        return super().choose(request, view)


def test_a_policy_that_fails_in_a_later_group_changes_nothing(mode: str) -> None:
    router = fleet(FailsInSecondGroup(), mode)
    before = observed(router)
    with pytest.raises(Boom):
        router.dispatch_batch([[1, 2, 3, 4], [1, 2, 3, 4, 5, 5], [9, 9, 9, 9]])
    assert observed(router) == before


# -- finish, expire, remove_worker -----------------------------------------------------------
def test_a_failing_on_finish_keeps_the_request_in_flight(mode: str) -> None:
    policy = Hooks(Longest(), finish={"live"})
    router = fleet(policy, mode)
    before = observed(router)
    with pytest.raises(Boom):
        router.finish("live", output_tokens=5)
    assert observed(router) == before
    policy.refuse_finish.clear()
    router.finish("live", output_tokens=5)
    assert router.in_flight == 0 and router.tree.hold_count == 0


def test_expire_releases_everything_then_raises_what_hooks_raised(mode: str) -> None:
    clock = Clock(100.0)
    policy = Hooks(Longest(), finish={"r1", "r3"})
    router = fleet(policy, mode, clock)
    for k in range(5):
        router.dispatch([1, 2, 3, 4, k, k], request_id=f"r{k}")
    clock.reading = 200.0
    with pytest.raises(HookError) as caught:
        router.expire(10)
    error = caught.value
    assert error.released == ["live", "r0", "r1", "r2", "r3", "r4"]
    assert [str(e) for e in error.errors] == ["r1", "r3"] and error.__cause__ is error.errors[0]
    assert "expire released 6 request(s)" in str(error) and "raised for 2 of them" in str(error)
    assert isinstance(error, RouterError) and isinstance(error, RuntimeError)
    assert router.in_flight == 0 and router.tree.hold_count == 0
    for w in router.workers:
        assert router.load(w).requests == router.load(w).prefill_tokens == 0
    assert {w["worker"]: w["expired"] for w in router.metrics()["workers"]} == {"a": 6, "b": 0}
    assert [rid for rid, _ in policy.finished] == ["warm", "live", "r0", "r2", "r4"]
    assert pickle.loads(pickle.dumps(error)).args == error.args


def test_remove_worker_drops_its_requests_then_raises_what_hooks_raised() -> None:
    policy = Hooks(First(), finish={"live"})
    router = fleet(policy)
    a = router.workers[0]
    with pytest.raises(HookError) as caught:
        router.remove_worker(a)
    assert caught.value.released == ["live"]
    assert router.workers == (router.worker("b"),) and router.in_flight == 0
    router.tree.check()


# -- the constructor -------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"clock": 5.0}, InputTypeError, "clock must be a callable returning seconds, got float"),
        ({"restart_window": -1}, InvalidInputError, "restart_window must be >= 0, got -1"),
        ({"restart_window": 1.5}, InputTypeError, "restart_window must be an integer"),
        ({"group_ratio": True}, InvalidInputError, "group_ratio must be a number in"),
        ({"group_ratio": math.nan}, InvalidInputError, "group_ratio must be a number in"),
        ({"group_ratio": -0.1}, InvalidInputError, "group_ratio must be a number in"),
        ({"group_slack": -1}, InvalidInputError, "group_slack must be >= 0"),
        ({"group_slack": 2.0}, InputTypeError, "group_slack must be an integer"),
        ({"source": object()}, InputTypeError, "source must be a ReplaySource"),
        ({"mode": "fast"}, InvalidInputError, "mode must be 'exact' or 'approximate'"),
        ({"policy": 3}, InputTypeError, "policy must be a built-in policy's name"),
        ({"policy": "nope"}, PolicyError, "nope"),
    ],
)
def test_every_constructor_argument_is_checked(
    arguments: dict[str, Any], error: type, message: str
) -> None:
    with pytest.raises(error, match=message):
        Router(**arguments)
