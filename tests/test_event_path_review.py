"""Review findings on the supervised event path (issue 18), each pinned by a test.

The backoff of a thread whose turns keep failing is bounded and has a floor; the
reconnect sign is spent by the first record after it; ``replay``'s budget holds for
repair answers and snapshots too; a ``subscribe`` that raises changes nothing; a probe
that finds records in flight counts no gap; counters are exact under threads; a gap
right after a reconnect is checked as a possible restart; a central indexer's many
publishers on one endpoint are trusted by name when asked; an unreferenced subscriber
is collected.

Bounds on time here are liveness checks, never performance figures.
"""

from __future__ import annotations

import gc
import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from _ports import free_port_block

from radixmeta import EventLog, MetaTree, RadixCache, Router
from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.events import LogSource, Replayer, Stored, Unavailable
from radixmeta.events.ingest import engine_batch
from radixmeta.events.subscription import FleetSubscription, WorkerEndpoint
from radixmeta.router.feed import MAX_BACKOFF, MIN_BACKOFF, EventThread, backoff
from radixmeta.transport import ZmqPublisher, ZmqSubscriber
from radixmeta.wire import vllm

pytestmark = pytest.mark.timeout(60)

PAGE = 4


def until(condition: Callable[[], bool], seconds: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.005)


def key(k: int, n: int = PAGE) -> Any:
    return np.full(n, k, dtype=np.uint32)


# -- 1. the backoff ------------------------------------------------------------------------
@pytest.mark.parametrize("failures", [1, 10, 1023, 1024, 10**6])
@pytest.mark.parametrize("interval", [0.0, 0.01, 5.0])
def test_the_backoff_is_bounded_and_has_a_floor_however_many_turns_failed(
    interval: float, failures: int
) -> None:
    delay = backoff(interval, failures)
    assert MIN_BACKOFF <= delay <= MAX_BACKOFF


def test_a_thread_of_interval_zero_whose_turns_keep_failing_backs_off_and_lives() -> None:
    def broken() -> None:
        msg = "a persistent failure"
        raise RuntimeError(msg)

    thread = EventThread(0.0, broken, "radixmeta-test")
    try:
        until(lambda: thread.errors >= 3, what="three failed turns")
        # Without a floor it spins: 1,024 failures in a few ms, and the thread is dead.
        time.sleep(0.05)
        health = thread.health()
        assert (health["alive"], health["state"]) == (True, "backing off")
        assert health["errors"] < 1024
    finally:
        thread.stop()
        thread.thread.join(5.0)
    assert thread.health()["state"] == "stopped"


def test_a_router_started_with_interval_zero_survives_a_failing_idle() -> None:
    with Router(PAGE) as router:

        def broken(**budget: Any) -> None:
            msg = "a persistent failure"
            raise RuntimeError(msg)

        router.idle = broken  # type: ignore[method-assign]
        router.start(interval=0)
        until(lambda: router.health()["thread"]["errors"] >= 2, what="failed turns")
        time.sleep(0.05)
        assert router.health()["thread"]["alive"]
    assert router.health()["thread"]["state"] == "stopped"


# -- 2. the reconnect sign -----------------------------------------------------------------
def stored(seq: int, k: int, worker: str = "w0") -> Stored:
    return Stored(worker, 0, seq, key=key(k))


def test_a_duplicate_after_the_same_publisher_went_on_past_a_reconnect_is_a_duplicate() -> None:
    tree = MetaTree(PAGE)
    w = tree.add_worker("w0")
    with Replayer(tree) as replayer:
        replayer.submit([stored(s, s) for s in range(5)])
        replayer.replay()
        replayer.reconnected("w0")  # a network blip: the same publisher connects again
        replayer.submit([stored(5, 5), stored(6, 6)])  # and goes on
        replayer.replay()
        replayer.submit([stored(6, 6)])  # a re-delivered batch, within restart_window
        stats = replayer.replay()
        assert (stats.restarts, stats.duplicates, stats.stale) == (0, 1, 0)
        assert tree.held_tokens(w) == 7 * PAGE
        assert not replayer.lag()[0].stale


def test_a_new_stream_after_batches_still_queued_from_the_old_one_is_a_restart() -> None:
    tree = MetaTree(PAGE)
    w = tree.add_worker("w0")
    with Replayer(tree) as replayer:
        replayer.submit([stored(s, s) for s in range(5)])
        replayer.replay()
        replayer.reconnected("w0")  # seen before the old stream's tail was read
        replayer.submit([stored(5, 5), stored(6, 6)])  # the old publisher's last batches
        replayer.submit([stored(0, 100), stored(1, 101)])  # the restarted one's
        stats = replayer.replay()
        assert (stats.restarts, stats.duplicates) == (1, 0)
        assert tree.held_tokens(w) == 2 * PAGE
        assert tree.match(key(101)).length_of(w) == PAGE


class _SnapshotOnly(LogSource):
    """A source whose replay buffer no longer holds the gap: it is resynced by snapshot."""

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> Any:
        return Unavailable("the buffer is too short")


def test_a_snapshot_after_a_reconnect_covers_the_records_parked_behind_the_gap() -> None:
    log = EventLog(worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    tree = MetaTree(PAGE)
    w = tree.add_worker("w0")
    with Replayer(tree, source=_SnapshotOnly({("w0", 0): cache})) as replayer:
        for k in range(3):
            cache.insert([k] * PAGE)
        replayer.submit(log.read())
        replayer.replay()
        replayer.reconnected("w0")
        cache.insert([3] * PAGE)  # the same stream goes on
        replayer.submit(log.read()[-1:])
        replayer.replay()
        for k in range(4, 10):
            cache.insert([k] * PAGE)
        replayer.submit(log.read()[-2:])  # 8 and 9 arrive, 4..7 were lost: a snapshot
        stats = replayer.replay()
        assert (stats.gaps, stats.resyncs, stats.restarts, stats.stale) == (1, 1, 0, 0)
        assert stats.duplicates == 2  # 8 and 9, which the snapshot holds
        assert tree.held_tokens(w) == cache.total_size
        assert not replayer.lag()[0].stale


# -- 3. the budget holds for answers -------------------------------------------------------
def _a_worker_behind_by(records: int, source_kind: type[LogSource]) -> tuple[Any, ...]:
    log = EventLog(worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    tree = MetaTree(PAGE)
    w = tree.add_worker("w0")
    replayer = Replayer(tree, source=source_kind({("w0", 0): cache}))
    cache.insert([0] * PAGE)
    replayer.submit(log.read())
    replayer.replay()
    for k in range(1, records + 1):
        cache.insert([k % 251, k // 251, 1, 1])
    replayer.submit(log.read()[-1:])  # the last record, after a gap of all the others
    return log, cache, tree, w, replayer


@pytest.mark.parametrize("source_kind", [LogSource, _SnapshotOnly], ids=["replay", "snapshot"])
def test_an_answer_is_applied_within_the_budget_a_record_a_step(
    source_kind: type[LogSource],
) -> None:
    _, cache, tree, w, replayer = _a_worker_behind_by(500, source_kind)
    with replayer:
        replayer.replay(max_records=1)  # finds the gap and asks in the background
        until(lambda: replayer.asking == 0, what="the answer")
        stats = replayer.replay(max_records=1)  # takes the answer in, applies one record
        # Before the fix the whole answer went in at once, past max_records.
        assert stats.applied <= 1
        assert stats.pending > 400
        steps = 0
        while replayer.pending:
            assert replayer.replay(max_records=50).applied <= 50
            steps += 1
            assert steps < 100, "the answer never drained"
        assert tree.held_tokens(w) == cache.total_size
        assert not replayer.lag()[0].stale


# -- 4. a subscribe that raises changes nothing --------------------------------------------
def _refused_subscriptions(port: int) -> list[tuple[str, list[WorkerEndpoint], dict[str, Any]]]:
    live, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port + 1}"
    return [
        ("colliding ports", [WorkerEndpoint("w", live, replay, 2)], {"codec": "vllm"}),
        ("a worker twice", [WorkerEndpoint("w", live), WorkerEndpoint("w", replay)],
         {"codec": "native"}),
        ("a snapshot of vllm", [WorkerEndpoint("w", live, replay, snapshot=True)],
         {"codec": "vllm"}),
        ("a bad codec", [WorkerEndpoint("w", live)], {"codec": "nope"}),
        ("a bad name", [WorkerEndpoint(7, live)], {"codec": "native"}),  # type: ignore[arg-type]
    ]


@pytest.mark.parametrize("case", range(5))
def test_a_subscribe_that_raises_adds_no_worker(case: int) -> None:
    port = free_port_block(4)
    what, workers, options = _refused_subscriptions(port)[case]
    with Router(PAGE) as router:
        kept = router.add_worker("kept")
        with pytest.raises((InvalidInputError, InputTypeError)):
            router.subscribe(workers, **options)
        assert [w.name for w in router.tree.workers] == ["kept"], what
        assert router.dispatch([1, 2, 3, 4]).worker == kept
        assert router.health()["workers"][0]["worker"] == "kept"


def test_a_subscribe_whose_bind_fails_adds_no_worker() -> None:
    port = free_port_block(2)
    with ZmqPublisher(f"tcp://127.0.0.1:{port}", bind=True), Router(PAGE) as router:
        with pytest.raises(Exception, match=r"(?i)address|bind|use"):
            router.subscribe([WorkerEndpoint("w", f"tcp://127.0.0.1:{port}")],
                             codec="native", bind=True)
        assert list(router.tree.workers) == []


# -- 5. a probe that finds records in flight counts no gap ---------------------------------
def test_a_probe_that_finds_records_still_in_flight_counts_no_gap() -> None:
    log = EventLog(worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    tree = MetaTree(PAGE)
    w = tree.add_worker("w0")
    with Replayer(tree, source=LogSource({("w0", 0): cache})) as replayer:
        cache.insert([0] * PAGE)
        replayer.submit(log.read())
        replayer.replay()
        cache.insert([1] * PAGE)  # published while the probe is out: in flight
        assert replayer.probe() == 1
        until(lambda: replayer.asking == 0, what="the probe's answer")
        replayer.replay()  # the probe's find is applied
        replayer.submit(log.read()[-1:])  # and then its live copy arrives
        stats = replayer.replay()
        assert (stats.gaps, stats.duplicates) == (0, 1)
        assert replayer.worker_stats("w0").gaps == 0
        assert tree.held_tokens(w) == cache.total_size


def test_a_probe_that_finds_a_lost_tail_counts_a_gap_when_the_stream_goes_past_it() -> None:
    log = EventLog(worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    tree = MetaTree(PAGE)
    tree.add_worker("w0")
    with Replayer(tree, source=LogSource({("w0", 0): cache})) as replayer:
        cache.insert([0] * PAGE)
        replayer.submit(log.read())
        replayer.replay()
        cache.insert([1] * PAGE)  # lost on the live stream
        replayer.probe()
        until(lambda: replayer.asking == 0, what="the probe's answer")
        replayer.replay()
        cache.insert([2] * PAGE)
        replayer.submit(log.read()[-1:])  # the next batch arrives, the lost one never does
        assert replayer.replay().gaps == 1
        cache.insert([3] * PAGE)  # lost again, and the worker goes quiet
        replayer.probe()
        until(lambda: replayer.asking == 0, what="the probe's answer")
        replayer.replay()
        replayer.probe()  # still quiet at the next probe: it was lost
        until(lambda: replayer.asking == 0, what="the probe's answer")
        assert replayer.replay().gaps == 1
        assert replayer.stats.gaps == replayer.worker_stats("w0").gaps == 2


# -- 6. counters under threads; restarts per worker ----------------------------------------
def test_counts_moved_by_the_poll_thread_and_the_repair_threads_are_exact() -> None:
    port = free_port_block(1)
    workers = [WorkerEndpoint("w0", f"tcp://127.0.0.1:{port}")]
    calls, threads = 3000, 4
    with FleetSubscription(workers, codec="vllm", block_size=PAGE) as sub:
        log = EventLog(worker="w0", form="blocks")
        RadixCache(PAGE, event_log=log).insert([1] * PAGE)
        good = vllm.encode_batch(engine_batch(list(log.read()), block_size=PAGE))
        start = threading.Barrier(threads)

        def hammer() -> None:
            start.wait()
            for i in range(calls):
                # Live batches and replayed ones go through the same decoding and counts.
                sub._records("w0", 0, i, b"\xc1 not msgpack" if i % 2 else good)

        old = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)  # switch threads often: a lost update shows
        try:
            running = [threading.Thread(target=hammer) for _ in range(threads)]
            for t in running:
                t.start()
            for t in running:
                t.join(30)
        finally:
            sys.setswitchinterval(old)
        intake = sub.intake[("w0", 0)]
        assert intake.batches == calls * threads
        assert intake.decode_errors == sub.decode_errors == calls * threads // 2
        assert sub.converters[("w0", 0)].counts.batches == calls * threads // 2


def test_a_restart_the_transport_tells_counts_in_the_workers_stats_too() -> None:
    tree = MetaTree(PAGE)
    tree.add_worker("w0")
    with Replayer(tree) as replayer:
        replayer.submit([stored(0, 0)])
        replayer.replay()
        replayer.restart("w0")
        replayer.restart("nobody")  # not a worker of the tree: nothing to count
        assert replayer.worker_stats("w0").restarts == replayer.stats.restarts == 1


# -- 7. a gap right after a reconnect ------------------------------------------------------
def _reconnected_at_seq_2(source_cache: RadixCache) -> tuple[Any, ...]:
    """A worker whose records 0..2 (keys 0, 1, 2) were applied; its publisher reconnects."""
    tree = MetaTree(PAGE)
    w = tree.add_worker("w0")
    replayer = Replayer(tree, source=LogSource({("w0", 0): source_cache}))
    replayer.submit([stored(s, s) for s in range(3)])
    replayer.replay()
    replayer.reconnected("w0")
    return tree, w, replayer


def test_a_restart_first_seen_above_the_old_cursor_is_rebuilt_from_the_new_stream() -> None:
    log = EventLog(worker="w0")
    new_engine = RadixCache(PAGE, event_log=log)
    tree, w, replayer = _reconnected_at_seq_2(new_engine)
    with replayer:
        for k in range(100, 106):  # the restarted engine's seqs 0..5; only 5 arrives
            new_engine.insert([k] * PAGE)
        replayer.submit(log.read()[-1:])
        stats = replayer.replay()
        assert (stats.gaps, stats.resyncs, stats.stale) == (1, 1, 0)
        # Before the fix seqs 3, 4 of the new stream were laid onto the old view.
        assert tree.held_tokens(w) == new_engine.total_size
        assert tree.match(key(0)).length_of(w) == 0
        assert not replayer.lag()[0].stale


def test_a_gap_after_a_reconnect_whose_source_lost_seq_0_is_repaired_as_the_same_stream(
) -> None:
    log = EventLog(worker="w0", capacity=4)
    cache = RadixCache(PAGE, event_log=log)
    for k in range(3):
        cache.insert([k] * PAGE)
    tree, w, replayer = _reconnected_at_seq_2(cache)
    with replayer:
        for k in range(3, 6):  # 3 and 4 lost while the publisher was away; 0 leaves the log
            cache.insert([k] * PAGE)
        replayer.submit(log.read()[-1:])
        stats = replayer.replay()
        assert (stats.gaps, stats.resyncs, stats.restarts, stats.stale) == (1, 0, 0, 0)
        assert tree.held_tokens(w) == cache.total_size == 6 * PAGE


# -- 8. an unreferenced subscriber is collected, and its keeper ends -----------------------
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_subscriber_dropped_without_close_is_collected_and_its_keeper_ends() -> None:
    sub = ZmqSubscriber([f"tcp://127.0.0.1:{free_port_block(1)}"])
    collected, keeper = weakref.ref(sub), sub._keeper
    del sub
    gc.collect()
    # Before the fix the keeper thread held the subscriber: never collected, never ended.
    assert collected() is None
    keeper.join(5.0)
    assert not keeper.is_alive()
    gc.collect()  # what the subscriber left goes here, not in a later test
