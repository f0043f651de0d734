"""A Router under random traffic, side by side with a plain model of its loads.

Each worker is a real RadixCache with an EventLog (its "engine"): a dispatched prompt is
cached there now and then, and its records reach the router's replayer when the machine
replays. Rules dispatch (one by one and in batches), finish, expire, move requests to
decode, replay, add, remove and take workers down and up. After every step: every
decision named an up worker, the loads equal the model's, the router's holds are exactly
its requests in flight, the reported view equals what the engines reported, and the tree
checks. At the end every request finishes and every load and hold is back to zero.
"""

from __future__ import annotations

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
from radixmeta.errors import NoWorkerError

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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RouterMachine(RuleBasedStateMachine):
    @initialize(
        approximate=st.booleans(),
        longest=st.booleans(),
        stems=st.lists(
            st.lists(st.integers(0, 3), min_size=2, max_size=10), min_size=2, max_size=5
        ),
    )
    def create(self, approximate: bool, longest: bool, stems: list[list[int]]) -> None:
        self.clock = Clock()
        self.mode = "approximate" if approximate else "exact"
        policy = Longest() if longest else LeastLoaded()
        self.router = Router(PAGE, policy=policy, mode=self.mode, clock=self.clock, group_slack=2)
        self.stems = stems
        self.engines: dict[WorkerId, Engine] = {}
        self.flights: dict[str, Flight] = {}
        self.outputs: list[int] = []
        self.names = 0
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

    @rule(seconds=st.floats(0, 3))
    def tick_and_expire(self, seconds: float) -> None:
        self.clock.now += 1.0
        expired = self.router.expire(older_than=seconds)
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
