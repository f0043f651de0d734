"""The router-side Replayer: cursors, duplicates, gaps, resyncs, restarts, budgets.

Workers are real RadixCaches with EventLogs; the transport is simulated by choosing which
records reach the replayer (dropped, repeated, reordered). After each repair the MetaTree
must equal the workers' true state, or the documented cleared-and-stale state.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from typing import Any

import msgspec
import numpy as np
import pytest

from radixmeta import EventLog, MetaTree, RadixCache
from radixmeta.errors import InputTypeError
from radixmeta.events import Cleared, LogSource, Replayer, ReplayStats, Stored
from radixmeta.replay import batch_mark


class NoSnapshots(LogSource):
    """A source like a vLLM or SGLang publisher: replay from a bounded buffer, no snapshot."""

    def snapshot(self, worker: str, dp_rank: int) -> None:
        return None


class Fleet:
    """Workers with logs, a MetaTree that should mirror them, and a replayer between."""

    def __init__(
        self, n: int = 2, *, capacity: int = 10_000, source: type | None = LogSource, **kw: Any
    ) -> None:
        self.logs = [
            EventLog(capacity=capacity, worker=f"w{i}", form=kw.get("form", "path"))
            for i in range(n)
        ]
        self.caches = [RadixCache(4, capacity=64, event_log=log) for log in self.logs]
        self.tree = MetaTree(4)
        self.ids = [self.tree.add_worker(f"w{i}") for i in range(n)]
        mapping = {(f"w{i}", 0): c for i, c in enumerate(self.caches)}
        self.replayer = Replayer(
            self.tree,
            source=None if source is None else source(mapping),
            restart_window=kw.get("restart_window", 64),
        )
        self.rng = random.Random(1)

    def traffic(self, steps: int) -> None:
        for _ in range(steps):
            cache = self.rng.choice(self.caches)
            key = [self.rng.randrange(3) for _ in range(self.rng.randrange(4, 24))]
            if self.rng.random() < 0.8:
                cache.insert(key)
            else:
                cache.evict(self.rng.randrange(4, 16))

    def assert_mirrors(self, *, stale: tuple[int, ...] = ()) -> None:
        self.tree.check()
        for i, (cache, w) in enumerate(zip(self.caches, self.ids, strict=True)):
            if i in stale:
                continue
            assert self.tree.held_tokens(w) == cache.total_size, f"worker {i}"
            for key, _ in cache.items():
                assert self.tree.match(key).length_of(w) == len(key)


def test_in_order_records_apply_and_duplicates_are_dropped() -> None:
    fleet = Fleet()
    fleet.traffic(40)
    records = [r for log in fleet.logs for r in log.read()]
    fleet.replayer.submit(records)
    again = [r for r in records if r.seq >= 10][:6]  # recent records, delivered twice
    fleet.replayer.submit(again)
    stats = fleet.replayer.replay()
    assert stats.applied == len(records)
    assert stats.duplicates == len(again) and stats.gaps == 0 and stats.pending == 0
    fleet.assert_mirrors()


def test_a_gap_is_filled_from_the_source() -> None:
    fleet = Fleet()
    fleet.traffic(40)
    records = fleet.logs[0].read()
    fleet.replayer.submit(records[:5] + records[12:])  # records 5..11 were lost
    fleet.replayer.submit(fleet.logs[1].read())
    stats = fleet.replayer.replay()
    assert (stats.gaps, stats.replays_requested, stats.resyncs) == (1, 1, 0)
    fleet.assert_mirrors()


def test_reordered_records_are_repaired() -> None:
    fleet = Fleet(1)
    fleet.traffic(30)
    records = fleet.logs[0].read()
    swapped = records[:]
    for i in range(0, len(swapped) - 1, 3):  # neighbours arrive out of order
        swapped[i], swapped[i + 1] = swapped[i + 1], swapped[i]
    fleet.replayer.submit(swapped)
    stats = fleet.replayer.replay()
    assert stats.gaps > 0 and stats.duplicates > 0 and stats.restarts == 0
    fleet.assert_mirrors()


def test_a_late_joiner_replays_from_the_beginning() -> None:
    fleet = Fleet(1)
    fleet.traffic(30)
    fleet.replayer.submit(fleet.logs[0].read()[-3:])  # the router saw only the last records
    stats = fleet.replayer.replay()
    assert stats.replays_requested == 1 and stats.resyncs == 0
    fleet.assert_mirrors()


def test_a_gap_the_log_no_longer_holds_resyncs_from_the_snapshot() -> None:
    fleet = Fleet(1, capacity=8)
    fleet.traffic(5)
    first = fleet.logs[0].read()
    fleet.replayer.submit(first)
    fleet.replayer.replay()
    fleet.traffic(60)  # the log wraps: what followed `first` is gone
    fleet.replayer.submit(fleet.logs[0].read()[-2:])
    stats = fleet.replayer.replay()
    assert (stats.gaps, stats.resyncs, stats.stale) == (1, 1, 0)
    fleet.assert_mirrors()


def test_an_empty_snapshot_still_names_its_seq() -> None:
    fleet = Fleet(1, capacity=2)
    cache, log = fleet.caches[0], fleet.logs[0]
    cache.insert([1, 1, 1, 1])
    fleet.replayer.submit(log.read())
    fleet.replayer.replay()
    for k in range(2, 5):
        cache.insert([k, k, k, k])
    found_gap = log.read()[-1]  # a store, which the cache then lets go with all the rest
    cache.evict(100)
    fleet.replayer.submit([found_gap])
    stats = fleet.replayer.replay()
    assert (stats.gaps, stats.resyncs, stats.stale, stats.duplicates) == (1, 1, 0, 1)
    assert cache.total_size == 0
    fleet.assert_mirrors()


def test_without_a_snapshot_the_worker_is_cleared_and_stale(caplog: Any) -> None:
    fleet = Fleet(2, capacity=8, source=NoSnapshots)
    fleet.traffic(4)
    for log in fleet.logs:
        fleet.replayer.submit(log.read())
    fleet.replayer.replay()
    fleet.traffic(80)
    for log in fleet.logs:
        fleet.replayer.submit(log.read()[-1:])  # everything in between fell off the buffer
    with caplog.at_level(logging.WARNING, logger="radixmeta.replay"):
        stats = fleet.replayer.replay()
    assert stats.stale == 2 and "stale until its view is rebuilt" in caplog.text
    assert "the log no longer holds seq" in caplog.text and "no snapshot" in caplog.text
    # The cleared worker holds only what its newest record says (here one node's pages).
    last = fleet.logs[0].read()[-1]
    expected = len(last.key) - last.start if isinstance(last, Stored) else 0
    assert fleet.tree.held_tokens(fleet.ids[0]) == expected
    fleet.tree.check()


def test_a_restarted_worker_is_cleared_and_starts_again() -> None:
    fleet = Fleet(1, restart_window=4)
    fleet.traffic(20)
    fleet.replayer.submit(fleet.logs[0].read())
    fleet.replayer.replay()
    # The worker restarts: a new cache and log, sequence numbers from 0.
    fleet.logs[0] = EventLog(worker="w0")
    fleet.caches[0] = RadixCache(4, capacity=64, event_log=fleet.logs[0])
    fleet.replayer.source = LogSource({("w0", 0): fleet.caches[0]})
    fleet.caches[0].insert([1, 1, 1, 1, 2, 2, 2, 2])
    fleet.replayer.submit(fleet.logs[0].read())
    stats = fleet.replayer.replay()
    assert stats.restarts == 1
    fleet.assert_mirrors()
    # A restart the transport knows of (a new publisher id) is signalled directly.
    fleet.replayer.restart("w0")
    assert fleet.tree.held_tokens(fleet.ids[0]) == 0
    assert fleet.replayer.stats.restarts == 2


def test_cleared_is_a_barrier() -> None:
    fleet = Fleet(1)
    fleet.traffic(20)
    fleet.caches[0].reset()
    fleet.caches[0].insert([2, 2, 2, 2])
    fleet.replayer.submit(fleet.logs[0].read())
    fleet.replayer.replay()
    assert any(isinstance(r, Cleared) for r in fleet.logs[0].read())
    fleet.assert_mirrors()


def test_unknown_workers_and_bad_records_are_counted_not_raised(caplog: Any) -> None:
    fleet = Fleet(1)
    ghost = EventLog(worker="ghost")
    RadixCache(event_log=ghost).insert([1, 2, 3, 4])
    fleet.replayer.submit(ghost.read())
    bad = Stored(
        "w0",
        0,
        0,
        block_hashes=np.array([5], np.uint64),
        parent_hash=77,
        token_ids=np.arange(4, dtype=np.uint32),
    )  # a parent nobody stored
    fleet.replayer.submit([bad])
    with caplog.at_level(logging.WARNING, logger="radixmeta.replay"):
        stats = fleet.replayer.replay()
    assert (stats.unknown_worker, stats.malformed, stats.applied) == (1, 1, 0)
    assert "record 0.0 skipped" in caplog.text
    with pytest.raises(InputTypeError, match="records must be Stored, Removed or Cleared"):
        fleet.replayer.submit(["stored"])


def test_budgets_and_lag() -> None:
    fleet = Fleet(2)
    fleet.traffic(40)
    records = [r for log in fleet.logs for r in log.read()]
    fleet.replayer.submit(records)
    first = fleet.replayer.replay(max_records=5)
    assert first.applied == 5 and first.pending == len(records) - 5
    lag = {w.worker: w for w in fleet.replayer.lag()}
    assert sum(w.records for w in lag.values()) == len(records) - 5
    assert all(w.seconds >= 0 for w in lag.values())
    assert fleet.replayer.replay(max_seconds=0).applied == 0  # no time: nothing applied
    rest = fleet.replayer.replay()
    assert rest.pending == 0 and fleet.replayer.stats.applied == len(records)
    per_worker = [fleet.replayer.worker_stats(f"w{i}").applied for i in range(2)]
    assert per_worker == [len(log.read()) for log in fleet.logs]
    assert fleet.replayer.worker_stats("nobody") == ReplayStats()
    assert all(w.records == 0 and w.applied_seq == w.newest_seq for w in fleet.replayer.lag())
    fleet.assert_mirrors()


def test_workers_can_come_and_go() -> None:
    fleet = Fleet(2)
    fleet.traffic(20)
    fleet.replayer.submit([r for log in fleet.logs for r in log.read()])
    fleet.tree.remove_worker(fleet.ids[1])
    fleet.replayer.forget("w1")
    stats = fleet.replayer.replay()
    assert stats.unknown_worker == 0  # w1's pending records were freed with its cursor
    assert [w.worker for w in fleet.replayer.lag()] == ["w0"]


@pytest.mark.timeout(30)
def test_background_replay_thread() -> None:
    fleet = Fleet(2)
    with fleet.replayer:
        fleet.replayer.start(interval=0.001)
        with pytest.raises(RuntimeError, match="already running"):
            fleet.replayer.start()
        for _ in range(5):
            fleet.traffic(10)
            for log in fleet.logs:
                seen = [w.newest_seq for w in fleet.replayer.lag() if w.worker == log.worker]
                after = seen[0] if seen and seen[0] is not None else None
                fleet.replayer.submit(log.read(after=after))
        deadline = time.monotonic() + 20
        while fleet.replayer.pending and time.monotonic() < deadline:
            time.sleep(0.005)
    assert not any(t.name == "radixmeta-replayer" for t in threading.enumerate())
    fleet.assert_mirrors()


def test_block_form_records_replay_too() -> None:
    fleet = Fleet(2, form="blocks")
    fleet.traffic(50)
    fleet.replayer.submit([r for log in fleet.logs for r in log.read()])
    stats = fleet.replayer.replay()
    assert stats.malformed == 0
    fleet.assert_mirrors()


def test_stats_accumulate() -> None:
    total = ReplayStats()
    total.add(ReplayStats(applied=2, gaps=1, pending=4))
    total.add(ReplayStats(applied=1, pending=0))
    assert (total.applied, total.gaps, total.pending) == (3, 1, 0)


def test_a_batch_that_kept_no_record_still_moves_the_cursor() -> None:
    fleet = Fleet(1)
    fleet.caches[0].insert([1, 2, 3, 4])
    records = fleet.logs[0].read()
    last = records[-1].seq
    fleet.replayer.submit(records)
    fleet.replayer.submit_batch("w0", 0, last + 1, [])  # every event of it was left out
    late = Stored("w0", 0, last + 2, key=np.array([5, 5, 5, 5], np.uint32))
    fleet.replayer.submit([late])
    stats = fleet.replayer.replay()
    assert (stats.gaps, stats.replays_requested) == (0, 0)
    assert fleet.replayer.lag()[0].applied_seq == last + 2


def test_records_of_one_batch_may_skip_indices() -> None:
    fleet = Fleet(1)
    a = Stored("w0", 0, 0, index=0, key=np.array([1, 1, 1, 1], np.uint32))
    b = Stored("w0", 0, 0, index=3, key=np.array([2, 2, 2, 2], np.uint32))
    c = Stored("w0", 0, 1, index=2, key=np.array([3, 3, 3, 3], np.uint32))
    fleet.replayer.submit([a, b, c, b])
    stats = fleet.replayer.replay()
    assert (stats.applied, stats.gaps, stats.duplicates) == (3, 0, 1)


# -- regressions found in review ------------------------------------------------------------
class FirstEventLeftOut(LogSource):
    """A source whose answer for the missing batch starts at index 1 (event 0 was left out)."""

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> Any:
        records = super().replay(worker, dp_rank, from_seq) or []
        return [msgspec.structs.replace(r, index=1) if r.seq == from_seq else r for r in records]

    def snapshot(self, worker: str, dp_rank: int) -> None:
        return None


class EmptyBatchAnswered(LogSource):
    """A source whose missing batch kept no record: it answers with the batch's mark."""

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> Any:
        records = super().replay(worker, dp_rank, from_seq) or []
        kept = [r for r in records if r.seq != from_seq]
        return [batch_mark(worker, dp_rank, from_seq), *kept]

    def snapshot(self, worker: str, dp_rank: int) -> None:
        return None


@pytest.mark.parametrize("source", [FirstEventLeftOut, EmptyBatchAnswered])
def test_a_complete_answer_is_accepted_whatever_its_first_index(source: type) -> None:
    log = EventLog(worker="w0")
    cache = RadixCache(event_log=log)
    tree = MetaTree()
    w = tree.add_worker("w0")
    replayer = Replayer(tree, source=source({("w0", 0): cache}))
    cache.insert([1, 2, 3])
    replayer.submit(log.read())
    replayer.replay()
    cache.insert([7, 8])
    cache.insert([9, 9])
    replayer.submit(log.read()[-1:])  # seq 1 lost, seq 2 arrives
    stats = replayer.replay()
    assert (stats.gaps, stats.resyncs) == (1, 0)
    assert tree.match([1, 2, 3]).length_of(w) == 3  # nothing was cleared


def test_stale_lasts_until_the_view_is_rebuilt() -> None:
    """Records after the new baseline do not make the view whole (what was lost is still
    lost); a Cleared event does, and so does a restart's stream from seq 0."""
    fleet = Fleet(1, capacity=2, source=NoSnapshots)
    fleet.caches[0].insert([1, 1, 1, 1])
    fleet.replayer.submit(fleet.logs[0].read())
    fleet.replayer.replay()
    for k in range(10):
        fleet.caches[0].insert([k, 5, 5, 5])
    fleet.replayer.submit(fleet.logs[0].read()[-1:])
    assert fleet.replayer.replay().stale == 1
    assert [w.stale for w in fleet.replayer.lag()] == [True]
    assert "records before seq" in (fleet.replayer.lag()[0].last_error or "")
    fleet.caches[0].insert([4, 4, 4, 4])
    fleet.replayer.submit(fleet.logs[0].read()[-1:])
    fleet.replayer.replay()
    assert [w.stale for w in fleet.replayer.lag()] == [True]  # still partial
    fleet.caches[0].reset()  # the engine cleared its cache: the view is exact again
    fleet.caches[0].insert([3, 3, 3, 3])
    fleet.replayer.submit(fleet.logs[0].read()[-2:])
    fleet.replayer.replay()
    assert [w.stale for w in fleet.replayer.lag()] == [False]
    fleet.assert_mirrors()


def test_records_a_snapshot_already_holds_are_duplicates_not_restarts() -> None:
    log = EventLog(worker="w0", capacity=8)
    cache = RadixCache(event_log=log)
    tree = MetaTree()
    w = tree.add_worker("w0")
    replayer = Replayer(tree, source=LogSource({("w0", 0): cache}))
    seen: list[Any] = []
    for k in range(100):
        cache.insert([k % 7, k, 1])
        if k % 5 == 0:
            cache.evict(2)
        seen += log.read(after=seen[-1].seq if seen else None)
    replayer.submit(seen[:6])
    replayer.replay()
    replayer.submit(seen[10:])  # 6..9 lost in transport; everything after arrived
    stats = replayer.replay()
    assert (stats.gaps, stats.resyncs, stats.restarts) == (1, 1, 0)
    assert tree.held_tokens(w) == cache.total_size


def test_a_restart_300_batches_after_a_snapshot_resync_is_applied() -> None:
    """The window a snapshot covers hides only the duplicates of that snapshot: once the
    stream has passed it, a restart's stream from seq 0 is a restart (issue 18: 0 of 20
    new batches were applied, 300 batches after a late joiner's resync)."""
    log = EventLog(worker="w0", capacity=8)
    cache = RadixCache(4, capacity=64, event_log=log)
    tree = MetaTree(4)
    w = tree.add_worker("w0")
    replayer = Replayer(tree, source=LogSource({("w0", 0): cache}), restart_window=16)
    rng = random.Random(18)

    def batch(into: RadixCache) -> None:
        into.insert([rng.randrange(3) for _ in range(rng.randrange(4, 24))])
        if rng.random() < 0.2:
            into.evict(rng.randrange(4, 16))

    for _ in range(40):
        batch(cache)
    # A late joiner: its first record is far past seq 0, which the log no longer holds,
    # so the replayer resyncs from the snapshot, which covers seqs 0 to its stamp.
    replayer.submit(log.read()[-1:])
    stats = replayer.replay()
    assert (stats.resyncs, stats.stale, stats.restarts) == (1, 0, 0)
    assert tree.held_tokens(w) == cache.total_size
    for _ in range(300):  # live, one batch at a time: each passes the covered window
        seen = log.read()[-1].seq
        batch(cache)
        replayer.submit(log.read(after=seen))
        replayer.replay()
    assert replayer.stats.restarts == 0 and tree.held_tokens(w) == cache.total_size
    # The worker restarts: a new cache and log, seqs from 0 again, and no transport
    # event says so. Every one of its 20 batches is applied.
    log = EventLog(worker="w0", capacity=8)
    cache = RadixCache(4, capacity=64, event_log=log)
    replayer.source = LogSource({("w0", 0): cache})
    applied = replayer.stats.applied
    published = 0
    for _ in range(20):
        seen = log.read()[-1].seq if log.read() else None
        batch(cache)
        new = log.read(after=seen)
        published += len(new)
        replayer.submit(new)
        replayer.replay()
        assert tree.held_tokens(w) == cache.total_size
    stats = replayer.stats
    assert stats.restarts == 1 and stats.applied - applied == published
    for key, _ in cache.items():
        assert tree.match(key).length_of(w) == len(key)
