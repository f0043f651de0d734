"""A worker's view that went wrong heals (issue 18's chaos misses), on real loopback ZeroMQ.

A radixmeta worker whose replay buffer holds a batch that does not decode, and whose
snapshot times out once, was left stale for good: the replay that crossed the garbage
batch threw every good batch of its answer away, the snapshot it fell back on timed
out, and no later batch asked again. Now a replayed batch that does not decode is
skipped and counted as a live one is (the hole it leaves is repaired by a snapshot),
and a stale worker asks for its snapshot again on its next batch or probe, with a
bounded backoff, off every lock, ``repairing`` meanwhile.

Bounds on time here are liveness checks, never performance figures.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from radixmeta import EventLog, MetaTree, RadixCache, Router
from radixmeta.events import LogSource, Replayer, Unavailable
from radixmeta.events.publishing import LogPublisher
from radixmeta.events.replay import RESNAPSHOT_DELAYS
from radixmeta.events.subscription import WorkerEndpoint
from radixmeta.transport import Snapshot

pytestmark = pytest.mark.timeout(60)

PAGE = 4
LOOPBACK = "tcp://127.0.0.1:*"
GARBAGE = b"\x91" * 200 + b"\xc1 garbage"  # what the chaos bench publishes 1 in 1,000


def until(condition: Callable[[], bool], seconds: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.005)


class SlowFirstSnapshot(LogPublisher):
    """A LogPublisher whose first snapshot answer comes after the router gave up on it."""

    def __init__(self, *args: Any, delay: float, **kw: Any) -> None:
        self.delay = delay
        self.asked = 0
        self.release = threading.Event()  # set before close: a sleeping answer ends
        super().__init__(*args, **kw)

    def snapshot(self) -> Snapshot | None:
        self.asked += 1
        if self.asked == 1:
            self.release.wait(self.delay)
        return super().snapshot()

    def close(self) -> None:
        self.release.set()
        super().close()


def mirrors(router: Router, name: str, cache: RadixCache) -> bool:
    w = router.worker(name)
    if router.tree.held_tokens(w) != cache.total_size:
        return False
    return all(
        router.tree.match(key, optimistic=False).length_of(w) == len(key)
        for key, _ in cache.items()
    )


def worker_health(router: Router, name: str) -> dict[str, Any]:
    (state,) = [w for w in router.health()["workers"] if w["worker"] == name]
    return state


def test_a_stale_worker_is_rebuilt_after_a_garbage_replay_and_a_snapshot_that_timed_out() -> None:
    """The chaos bench's run 2, deterministically: replay crosses a kept garbage batch,
    the snapshot times out once, and the worker's next batch asks for it again."""
    log = EventLog(worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    publisher = SlowFirstSnapshot(
        cache, LOOPBACK, replay_endpoint=LOOPBACK, buffer_steps=64, delay=0.5
    )
    try:
        with Router(PAGE, probe_interval=0) as router:
            sub = router.subscribe(
                [WorkerEndpoint("w0", publisher.publisher.endpoint,
                                publisher.publisher.replay_endpoint)],
                codec="native",
                replay_timeout=0.5,
                snapshot_timeout=0.3,
            )
            assert sub.subscriber.wait_connected(timeout=10)
            assert publisher.publisher.wait_subscribers(1, timeout=10)
            router.start(interval=0.002)
            cache.insert([1, 1, 1, 1, 2, 2, 2, 2])
            publisher.flush()  # seq 0
            until(lambda: mirrors(router, "w0", cache), what="the first batch")
            publisher.publisher.publish(GARBAGE)  # seq 1: dropped live, kept for replay
            cache.insert([3, 3, 3, 3])
            publisher.flush()  # seq 2: shows the gap at 1; its replay crosses the garbage
            until(lambda: sub.intake[("w0", 0)].decode_errors >= 2,
                  what="the garbage counted live and on replay")
            until(lambda: worker_health(router, "w0")["stale"], what="the stale flag")
            state = worker_health(router, "w0")
            assert "snapshot timed out" in state["last_error"], state
            assert publisher.asked == 1
            # Past the first backoff, the worker's next batch asks for its snapshot again.
            time.sleep(RESNAPSHOT_DELAYS[0] + 0.05)
            cache.insert([4, 4, 4, 4, 5, 5, 5, 5])
            publisher.flush()
            sent = time.monotonic()
            until(lambda: not worker_health(router, "w0")["stale"]
                  and mirrors(router, "w0", cache), seconds=5.0, what="the rebuild")
            assert time.monotonic() - sent < 2.0  # the bound, with room to spare
            assert publisher.asked == 2
            stats = router.replayer.worker_stats("w0")
            assert stats.resyncs >= 2 and stats.stale == 1, stats
            assert router.health()["thread"]["errors"] == 0
            cache.insert([6, 6, 6, 6])
            publisher.flush()  # and it follows on from the snapshot
            until(lambda: mirrors(router, "w0", cache), what="the batch after the rebuild")
            router.tree.check()
    finally:
        publisher.close()


# -- the re-asked snapshot, on the replayer alone ------------------------------------------
class FlakySnapshots(LogSource):
    """A LogSource that replays nothing (every gap falls to a snapshot), whose first
    ``failing`` snapshots fail, and whose snapshot answers can be held at a gate."""

    def __init__(self, caches: dict[tuple[str, int], RadixCache], failing: int,
                 can_snapshot: bool = True) -> None:
        super().__init__(caches)
        self.failing = failing
        self.asked = 0
        self.gate = threading.Event()
        self.gate.set()
        self._can_snapshot = can_snapshot

    def can_snapshot(self, worker: str, dp_rank: int) -> bool:
        return self._can_snapshot

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> Any:
        return Unavailable("the buffer is too short (scripted)")

    def snapshot(self, worker: str, dp_rank: int) -> Any:
        self.asked += 1
        assert self.gate.wait(10)
        if self.failing:
            self.failing -= 1
            return Unavailable("the snapshot timed out (scripted)")
        return super().snapshot(worker, dp_rank)


def key(k: int) -> Any:
    return np.full(PAGE, k, dtype=np.uint32)


def a_stale_worker(source_kind: Callable[..., FlakySnapshots], **kw: Any) -> tuple[Any, ...]:
    """w0 lost record 1 for good: its replay is refused and its first snapshot fails."""
    log = EventLog(worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    tree = MetaTree(PAGE)
    w = tree.add_worker("w0")
    source = source_kind({("w0", 0): cache}, **kw)
    replayer = Replayer(tree, source=source)
    for k in range(3):
        cache.insert([k] * PAGE)
    first, _lost, third = log.read()
    replayer.submit([first, third])
    stats = replayer.replay()  # waits for the repair: replay refused, snapshot failed
    assert (stats.gaps, stats.stale) == (1, 1)
    assert replayer.lag()[0].stale and source.asked == 1
    return log, cache, tree, w, source, replayer


def submit_next(replayer: Replayer, log: EventLog, cache: RadixCache, k: int) -> None:
    cache.insert([k] * PAGE)
    replayer.submit(log.read()[-1:])


def test_a_stale_worker_asks_again_after_a_bounded_backoff_and_a_failed_try_changes_nothing(
) -> None:
    log, cache, tree, w, source, replayer = a_stale_worker(FlakySnapshots, failing=2)
    with replayer:
        submit_next(replayer, log, cache, 3)  # within the first backoff: not asked
        replayer.replay()
        assert source.asked == 1 and tree.match(key(3)).length_of(w) == PAGE
        time.sleep(RESNAPSHOT_DELAYS[0] + 0.02)
        source.gate.clear()  # the next try waits on the "socket"
        submit_next(replayer, log, cache, 4)
        replayer.replay(max_seconds=0.01)
        until(lambda: source.asked == 2, what="the second snapshot request")
        (lag,) = replayer.lag()
        assert lag.repairing and lag.stale
        submit_next(replayer, log, cache, 5)
        started = time.monotonic()
        replayer.replay(max_seconds=0.01)  # returns at once: the request waits off the lock
        assert time.monotonic() - started < 0.5
        assert tree.match(key(5)).length_of(w) == 0  # parked behind the try
        source.gate.set()
        replayer.replay()  # the try failed: the parked records go on, onto the stale view
        (lag,) = replayer.lag()
        assert lag.stale and not lag.repairing
        assert lag.last_error is not None and "next try in 0.5 s" in lag.last_error
        for k in (2, 3, 4, 5):  # nothing it held since it went stale was cleared
            assert tree.match(key(k)).length_of(w) == PAGE, k
        assert tree.match(key(0)).length_of(w) == 0  # cleared when it went stale
        submit_next(replayer, log, cache, 6)  # within the second backoff (0.5 s)
        replayer.replay()
        assert source.asked == 2
        time.sleep(RESNAPSHOT_DELAYS[1] + 0.02)
        submit_next(replayer, log, cache, 7)  # this one asks, and the snapshot comes
        stats = replayer.replay()
        assert source.asked == 3 and stats.resyncs == 1
        assert stats.duplicates == 1  # record 7, which the snapshot holds
        assert not replayer.lag()[0].stale
        assert tree.held_tokens(w) == cache.total_size
        submit_next(replayer, log, cache, 8)  # and it follows on from the snapshot
        replayer.replay()
        assert tree.held_tokens(w) == cache.total_size
        tree.check()


def test_a_quiet_stale_worker_is_rebuilt_by_the_next_probe() -> None:
    _, cache, tree, w, source, replayer = a_stale_worker(FlakySnapshots, failing=1)
    with replayer:
        assert replayer.probe() == 1  # a probe of the tail, not the snapshot yet
        replayer.replay()
        assert source.asked == 1
        time.sleep(RESNAPSHOT_DELAYS[0] + 0.02)
        assert replayer.probe() == 1
        stats = replayer.replay()
        assert source.asked == 2 and stats.resyncs == 1
        assert not replayer.lag()[0].stale
        assert tree.held_tokens(w) == cache.total_size


def test_a_stale_worker_whose_source_serves_no_snapshot_is_not_asked_again() -> None:
    log, cache, tree, w, source, replayer = a_stale_worker(
        FlakySnapshots, failing=1, can_snapshot=False
    )
    with replayer:
        time.sleep(RESNAPSHOT_DELAYS[0] + 0.02)
        submit_next(replayer, log, cache, 3)
        replayer.replay()
        replayer.probe()
        replayer.replay()
        assert source.asked == 1
        (lag,) = replayer.lag()
        assert lag.stale and not lag.repairing
        assert tree.match(key(3)).length_of(w) == PAGE


# -- a replay across a garbage batch -------------------------------------------------------
class BrokenCanSnapshot(FlakySnapshots):
    def can_snapshot(self, worker: str, dp_rank: int) -> bool:
        msg = "the source cannot tell (scripted)"
        raise RuntimeError(msg)


def test_a_source_whose_can_snapshot_raises_loses_no_record() -> None:
    log, cache, tree, w, source, replayer = a_stale_worker(BrokenCanSnapshot, failing=1)
    with replayer:
        time.sleep(RESNAPSHOT_DELAYS[0] + 0.02)
        submit_next(replayer, log, cache, 3)
        stats = replayer.replay()
        assert stats.malformed == 0 and source.asked == 1
        assert replayer.probe() >= 0  # the probe path asks it too, and goes on
        replayer.replay()
        (lag,) = replayer.lag()
        assert lag.stale and lag.last_error is not None and "can_snapshot raised" in lag.last_error
        assert tree.match(key(3)).length_of(w) == PAGE


def test_a_replay_that_crosses_a_kept_garbage_batch_still_repairs_the_gap_before_it() -> None:
    """A vLLM-format worker (no snapshots): batch 1 is lost in transit and batch 3 is
    garbage kept in the replay buffer. The repair of the gap at 1 (found by batch 2)
    is answered with batches 1..4; the garbage after the gap used to make the whole
    answer unusable, and the worker stale. Now it is skipped and counted, and the gap
    is filled; the garbage's own gap, found by batch 4, has no snapshot to fall back on,
    so the worker goes stale only then, saying why."""
    from radixmeta.events.ingest import engine_batch
    from radixmeta.events.subscription import FleetSubscription
    from radixmeta.transport import ZmqPublisher
    from radixmeta.wire import vllm

    log = EventLog(worker="w0", form="blocks")
    cache = RadixCache(PAGE, event_log=log)
    seen = [-1]

    def batch() -> bytes:
        records = log.read(after=seen[0])
        seen[0] = records[-1].seq
        return vllm.encode_batch(engine_batch(list(records), block_size=PAGE))

    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, bind=True, buffer_steps=64) as pub,
        FleetSubscription(
            [WorkerEndpoint("w0", pub.endpoint, pub.replay_endpoint)],
            codec="vllm", block_size=PAGE, replay_timeout=2.0,
        ) as sub,
    ):
        assert sub.subscriber.wait_connected(timeout=10)
        assert pub.wait_subscribers(1, timeout=10)
        for k in range(3):
            cache.insert([k] * PAGE)
            pub.publish(batch())  # seqs 0, 1, 2
        pub.publish(GARBAGE)  # seq 3
        held = cache.total_size
        cache.insert([3] * PAGE)
        pub.publish(batch())  # seq 4
        assert sub.poll(timeout=10, max_messages=1) == 1  # seq 0
        assert sub.subscriber.recv(timeout=10) is not None  # seq 1, lost on the way
        assert sub.poll(timeout=10, max_messages=1) == 1  # seq 2: the gap at 1
        sub.replayer.replay()  # waits for the repair, whose answer holds the garbage
        w = sub.tree.worker("w0")
        (state,) = sub.worker_state()
        assert (state["gaps"], state["stale"], state["resyncs"]) == (1, False, 0), state
        assert sub.tree.held_tokens(w) == held
        assert state["intake"]["decode_errors"] == 1  # the garbage, on replay
        while sub.poll(timeout=0.2):  # the garbage live, then seq 4: the gap at 3
            pass
        sub.replayer.replay()
        (state,) = sub.worker_state()
        assert (state["gaps"], state["stale"]) == (2, True), state
        assert state["intake"]["decode_errors"] >= 2
        assert "skips seq 3" in state["last_error"] or "starts at seq 4" in state["last_error"]
        assert sub.tree.match([3] * PAGE).length_of(w) == PAGE  # batch 4, the new baseline
