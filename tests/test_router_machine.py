"""A Router under random traffic, side by side with a plain model of its loads.

Each worker is a real RadixCache with an EventLog (its "engine"): a dispatched prompt is
cached there now and then, and its records reach the router's replayer when the machine
replays. Rules dispatch (one by one and in batches), finish, expire, move requests to
decode, replay, add, remove and take workers down and up. After every step: every
decision named an up worker, the loads equal the model's, the router's holds are exactly
its requests in flight, the reported view equals what the engines reported, and the tree
checks. At the end every request finishes and every load and hold is back to zero.

Every Router call is a transaction: the policy is wrapped in a saboteur and the clock can
be told to fail, so that, at random points, ``choose`` (or ``choose_batch``) raises or
returns a Choice whose reason is not a str, ``on_dispatch`` or ``on_finish`` raises for
the k-th request, or the clock raises or reads NaN. A call that fails must leave the
router's whole observable state (loads, requests in flight, metrics, the Prometheus text,
the tree's items and holds) exactly as before it; ``expire`` releases everything it should
even when hooks fail, and then raises HookError naming what it released.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from _policies import LeastLoaded, Longest
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from radixmeta import EventLog, RadixCache, Router, WorkerId
from radixmeta.errors import HookError, InvalidInputError, NoWorkerError, PolicyError
from radixmeta.policies.base import Choice, Request, View

PAGE = 2


@dataclass
class Flight:
    worker: WorkerId
    tokens: int
    matched: int
    expected: int | None
    decode: int = -1


@dataclass
class Engine:
    """A worker's own cache, its event log, and the last seq the router was sent."""

    cache: RadixCache
    log: EventLog
    sent: int = -1


class Sabotage(Exception):
    """What a sabotaged policy hook or clock raises."""


class Clock:
    """A clock that moves when told, and fails when told (``fault``: raise, or read NaN)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.fault: str | None = None
        self.struck = False

    def __call__(self) -> float:
        self.struck = self.struck or self.fault is not None
        if self.fault == "raise":
            msg = "clock"
            raise Sabotage(msg)
        if self.fault == "nan":
            return float("nan")
        return self.now


class Saboteur:
    """Wraps a policy; fails where it is armed (``arm``), else passes everything through.

    ``fault`` is one of ``choose`` (raise), ``reason`` (a Choice whose reason is an int),
    ``on_dispatch`` or ``on_finish`` (raise on the ``at``-th call from now, counting
    from 0). ``told`` counts the hooks' calls by request id (dispatch +1, finish -1), so
    that a batch whose hook failed can be checked to have been taken back.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.fault: str | None = None
        self.at = 0
        self.struck = False
        self.told: dict[str, int] = {}

    def arm(self, fault: str | None, at: int = 0) -> None:
        self.fault, self.at, self.struck = fault, at, False

    def _strike(self, fault: str) -> bool:
        if self.fault != fault:
            return False
        if self.at > 0:
            self.at -= 1
            return False
        self.fault, self.struck = None, True
        return True

    def choose(self, request: Request, view: View) -> Any:
        if self._strike("choose"):
            msg = "choose"
            raise Sabotage(msg)
        choice = self.inner.choose(request, view)
        if self._strike("reason"):
            worker = choice.worker if isinstance(choice, Choice) else choice
            return Choice(worker, 7, ())  # type: ignore[arg-type]  # not a str: refused
        return choice

    def on_dispatch(self, request: Request, worker: WorkerId, matched: int) -> None:
        if self._strike("on_dispatch"):
            msg = "on_dispatch"
            raise Sabotage(msg)
        self.told[request.request_id] = self.told.get(request.request_id, 0) + 1

    def on_finish(self, request: Request, worker: WorkerId) -> None:
        if self._strike("on_finish"):
            msg = "on_finish"
            raise Sabotage(msg)
        self.told[request.request_id] = self.told.get(request.request_id, 0) - 1


class BatchSaboteur(Saboteur):
    """A Saboteur whose policy decides batches whole (the router's choose_batch path)."""

    flat_groups = True

    def choose_batch(
        self, requests: Sequence[Request], views: Sequence[View], groups: Any
    ) -> list[Any]:
        return [self.choose(r, v) for r, v in zip(requests, views, strict=True)]


def observed(router: Router) -> tuple[Any, ...]:
    """Everything a failed call must leave as it was (ages of pending records aside)."""
    metrics = router.metrics()
    for lag in metrics["replay"]["lag"]:
        del lag["seconds"], lag["last_applied"]  # ages: they move with time
    moving = ("replay_lag_seconds", "replay_last_applied_seconds")
    text = [
        line for line in router.metrics_text().splitlines() if not any(m in line for m in moving)
    ]
    tree = router.tree
    tree.check()
    items = [(k.tolist(), held, ns, host) for k, held, ns, _, host in tree.items()]
    holds = [tree.hold_tokens(w) for w in router.workers] if router.mode == "exact" else []
    loads = [router.load(w) for w in router.workers]
    return metrics, text, items, holds, tree.hold_count, tree.node_count, loads, router.in_flight


class RouterMachine(RuleBasedStateMachine):
    @initialize(
        approximate=st.booleans(),
        longest=st.booleans(),
        batched=st.booleans(),
        stems=st.lists(
            st.lists(st.integers(0, 3), min_size=2, max_size=10), min_size=2, max_size=5
        ),
    )
    def create(
        self, approximate: bool, longest: bool, batched: bool, stems: list[list[int]]
    ) -> None:
        self.clock = Clock()
        self.mode = "approximate" if approximate else "exact"
        inner = Longest() if longest else LeastLoaded()
        self.policy = BatchSaboteur(inner) if batched else Saboteur(inner)
        self.router = Router(
            PAGE, policy=self.policy, mode=self.mode, clock=self.clock, group_slack=2
        )
        self.stems = stems
        self.engines: dict[WorkerId, Engine] = {}
        self.flights: dict[str, Flight] = {}
        self.outputs: list[int] = []
        self.names = 0
        self.batches = 0
        for _ in range(2):
            self.add()

    # -- workers ---------------------------------------------------------------------------
    @precondition(lambda self: len(self.router.workers) < 5)
    @rule()
    def add(self) -> None:
        name = f"w{self.names}"
        self.names += 1
        w = self.router.add_worker(name, capacity=24 if self.mode == "approximate" else None)
        log = EventLog(worker=name)
        self.engines[w] = Engine(RadixCache(PAGE, event_log=log), log)

    @precondition(lambda self: len(self.router.workers) > 1)
    @rule(pick=st.integers(0, 100))
    def remove(self, pick: int) -> None:
        w = self.router.workers[pick % len(self.router.workers)]
        dropped = [rid for rid, f in self.flights.items() if f.worker == w]
        assert self.router.remove_worker(w) == len(dropped)
        for rid in dropped:
            del self.flights[rid]
        del self.engines[w]

    @rule(pick=st.integers(0, 100), up=st.booleans())
    def mark(self, pick: int, up: bool) -> None:
        w = self.router.workers[pick % len(self.router.workers)]
        (self.router.mark_up if up else self.router.mark_down)(w)

    # -- requests --------------------------------------------------------------------------
    def key(self, stem: int, tail: list[int]) -> list[int]:
        return self.stems[stem % len(self.stems)] + tail

    def record(self, decision: Any, key: list[int], expected: int | None) -> None:
        assert decision.worker in self.router.up
        assert 0 <= decision.matched <= len(key) and decision.matched % PAGE == 0
        assert decision.request_id not in self.flights
        self.flights[decision.request_id] = Flight(
            decision.worker, len(key), decision.matched, expected
        )

    @rule(
        stem=st.integers(0, 10),
        tail=st.lists(st.integers(0, 3), max_size=5),
        expected=st.none() | st.integers(0, 9),
        cache=st.booleans(),
    )
    def dispatch(self, stem: int, tail: list[int], expected: int | None, cache: bool) -> None:
        key = self.key(stem, tail)
        if not self.router.up:
            try:
                self.router.dispatch(key)
            except NoWorkerError:
                return
            msg = "dispatch with every worker down"
            raise AssertionError(msg)
        d = self.router.dispatch(key, expected_output=expected)
        self.record(d, key, expected)
        if cache:  # the engine cached the prompt: its events come at the next replay
            self.engines[d.worker].cache.insert(key)

    @precondition(lambda self: bool(self.router.up))
    @rule(batch=st.lists(st.tuples(st.integers(0, 10), st.lists(st.integers(0, 3), max_size=4)),
                         max_size=6))
    def dispatch_batch(self, batch: list[tuple[int, list[int]]]) -> None:
        keys = [self.key(stem, tail) for stem, tail in batch]
        for d, key in zip(self.router.dispatch_batch(keys), keys, strict=True):
            self.record(d, key, None)

    def pick(self, n: int) -> str | None:
        return list(self.flights)[n % len(self.flights)] if self.flights else None

    @rule(n=st.integers(0, 100))
    def prefill_done(self, n: int) -> None:
        rid = self.pick(n)
        if rid is None:
            return
        self.router.prefill_done(rid)
        f = self.flights[rid]
        if f.decode < 0:
            mean = sum(self.outputs) // len(self.outputs) if self.outputs else 0
            f.decode = f.tokens + (mean if f.expected is None else f.expected)

    @rule(n=st.integers(0, 100), output=st.integers(0, 20))
    def finish(self, n: int, output: int) -> None:
        rid = self.pick(n)
        if rid is None:
            return
        self.router.finish(rid, output_tokens=output)
        del self.flights[rid]
        if output:
            self.outputs.append(output)

    @rule(seconds=st.floats(0, 3), failing=st.none() | st.integers(0, 3))
    def tick_and_expire(self, seconds: float, failing: int | None) -> None:
        """Expire; with ``failing``, that on_finish raises: everything goes all the same."""
        self.clock.now += 1.0
        self.policy.arm(None if failing is None else "on_finish", failing or 0)
        try:
            expired = self.router.expire(older_than=seconds)
        except HookError as error:
            assert failing is not None and len(error.errors) == 1
            assert isinstance(error.__cause__, Sabotage)
            expired = error.released
        self.policy.arm(None)
        assert len(set(expired)) == len(expired)
        for rid in expired:
            del self.flights[rid]

    @rule(pick=st.integers(0, 100))
    def evict(self, pick: int) -> None:
        w = self.router.workers[pick % len(self.router.workers)]
        self.engines[w].cache.evict(PAGE * 2)

    @rule()
    def replay(self) -> None:
        if self.mode == "exact":
            for engine in self.engines.values():
                self.router.submit(engine.log.read(after=engine.sent))
                engine.sent = engine.log.next_seq - 1
        self.router.replay()

    # -- calls that fail: each must change nothing -------------------------------------------
    def sabotaged(self, call: Any, errors: tuple[type[BaseException], ...]) -> Any:
        """Run ``call`` with the sabotage armed. If it struck, the call must raise one of
        ``errors`` and change nothing (returns None); if it never struck (a batch with
        fewer calls than the one armed), the call's result."""
        before = observed(self.router)
        self.clock.struck = False
        try:
            result = call()
        except errors:
            assert self.policy.struck or self.clock.struck
            assert observed(self.router) == before
            return None
        finally:
            self.policy.arm(None)
            self.clock.fault = None
        assert not (self.policy.struck or self.clock.struck), "a sabotaged call did not raise"
        return result

    @precondition(lambda self: bool(self.router.up))
    @rule(
        stem=st.integers(0, 10),
        tail=st.lists(st.integers(0, 3), max_size=5),
        fault=st.sampled_from(["choose", "reason", "on_dispatch", "clock-raise", "clock-nan"]),
    )
    def failing_dispatch(self, stem: int, tail: list[int], fault: str) -> None:
        if fault.startswith("clock-"):
            self.clock.fault = fault.removeprefix("clock-")
        else:
            self.policy.arm(fault)
        result = self.sabotaged(
            lambda: self.router.dispatch(self.key(stem, tail), request_id="doomed"),
            (Sabotage, PolicyError, InvalidInputError),
        )
        assert result is None  # the policy and the clock are always asked
        assert self.policy.told.get("doomed", 0) == 0

    @precondition(lambda self: bool(self.router.up))
    @rule(
        batch=st.lists(
            st.tuples(st.integers(0, 10), st.lists(st.integers(0, 3), max_size=4)),
            min_size=1,
            max_size=6,
        ),
        fault=st.sampled_from(["choose", "reason", "on_dispatch", "clock-raise", "clock-nan"]),
        at=st.integers(0, 5),
    )
    def failing_batch(self, batch: list[tuple[int, list[int]]], fault: str, at: int) -> None:
        """A batch whose k-th choice or hook fails (or the clock): nothing dispatched, and
        the requests whose on_dispatch was told are told on_finish."""
        if fault.startswith("clock-"):
            self.clock.fault = fault.removeprefix("clock-")
        else:
            self.policy.arm(fault, at % len(batch))
        self.batches += 1
        ids = [f"doomed-{self.batches}-{k}" for k in range(len(batch))]
        items = [
            {"tokens": self.key(stem, tail), "request_id": rid}
            for (stem, tail), rid in zip(batch, ids, strict=True)
        ]
        told_before = dict(self.policy.told)
        decisions = self.sabotaged(
            lambda: self.router.dispatch_batch(items), (Sabotage, PolicyError, InvalidInputError)
        )
        if decisions is not None:  # the k-th call armed never came: a batch like any other
            keys = [self.key(stem, tail) for stem, tail in batch]
            for d, key in zip(decisions, keys, strict=True):
                self.record(d, key, None)
            return
        for rid in ids:  # dispatched then taken back, or never told
            assert self.policy.told.get(rid, 0) == told_before.get(rid, 0)

    @rule(n=st.integers(0, 100))
    def failing_finish(self, n: int) -> None:
        """on_finish raises: the request stays in flight, as it was."""
        rid = self.pick(n)
        if rid is None:
            return
        self.policy.arm("on_finish")
        assert self.sabotaged(lambda: self.router.finish(rid), (Sabotage,)) is None

    @rule(seconds=st.floats(0, 3))
    def failing_clock_in_expire(self, seconds: float) -> None:
        self.clock.now += 1.0
        self.clock.fault = "nan"
        expire = lambda: self.router.expire(older_than=seconds)  # noqa: E731
        assert self.sabotaged(expire, (InvalidInputError,)) is None

    # -- invariants ------------------------------------------------------------------------
    @invariant()
    def loads_and_views_agree(self) -> None:
        router = self.router
        router.tree.check()
        assert router.in_flight == len(self.flights)
        for w in router.workers:
            mine = [f for f in self.flights.values() if f.worker == w]
            load = router.load(w)
            assert load.requests == len(mine)
            assert load.prefill_tokens == sum(f.tokens - f.matched for f in mine if f.decode < 0)
            assert load.decode_tokens == sum(f.decode for f in mine if f.decode >= 0)
        if self.mode == "exact":
            assert router.tree.hold_count == len(self.flights)  # one hold per request in flight
            if router.replayer.pending == 0:
                for w, engine in self.engines.items():
                    if engine.sent == engine.log.next_seq - 1:  # all it did is reported
                        assert router.tree.held_tokens(w) == engine.cache.total_size
        else:
            assert router.tree.hold_count == 0
            for w in router.workers:
                capacity = router.load(w).capacity
                assert capacity is not None and router.tree.held_tokens(w) <= capacity

    def teardown(self) -> None:
        if not hasattr(self, "router"):
            return
        for rid in list(self.flights):
            self.router.finish(rid)
        assert self.router.in_flight == 0 and self.router.tree.hold_count == 0
        for w in self.router.workers:
            load = self.router.load(w)
            assert (load.requests, load.prefill_tokens, load.decode_tokens) == (0, 0, 0)
        self.router.close()


def test_router_machine() -> None:
    run_state_machine_as_test(RouterMachine)


def test_every_request_id_is_unique_and_set() -> None:
    router = Router(PAGE, policy=LeastLoaded())
    router.add_worker("a")
    ids = {router.dispatch(np.arange(4, dtype=np.uint32)).request_id for _ in range(100)}
    assert len(ids) == 100 and all(isinstance(i, str) and i for i in ids)
