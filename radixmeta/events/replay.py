"""Router-side replay of workers' event records into a MetaTree.

The A.4 design's weak consistency: workers commit what their caches store and
evict to a log, and the router replays that log into its meta-tree when it is
idle. :class:`Replayer` keeps a cursor per (worker, dp rank), applies records in
order within a budget, and repairs what the transport broke:

* a record already applied (its ``(seq, index)`` at or before the cursor) is a
  duplicate and is dropped;
* a record after a gap asks the source for the missing range; if the source
  cannot serve it, the worker is resynced from the source's snapshot, or, with
  none (vLLM and SGLang publishers keep no snapshot), cleared and marked stale
  until its next records, which become its new baseline;
* a sequence that goes back by more than ``restart_window`` is a restarted
  worker: it is cleared and starts again (a transport that knows of a restart
  for sure, say a new publisher id, calls :meth:`Replayer.restart`);
* ``Cleared`` is a barrier: everything the worker held before it goes.

A record that cannot apply (its parent was never seen, a hash conflict, a
malformed field) is counted, logged with its worker and seq, and skipped: the
replayer never raises for a record and never applies half of one, because each
MetaTree call is checked whole before it changes anything.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Protocol

from radixmeta._keys import check_int
from radixmeta._records import Cleared, Record, Removed, Stored, _Record
from radixmeta.errors import InputTypeError, LogTruncatedError, RadixMetaError

__all__ = ["LogSource", "ReplaySource", "ReplayStats", "Replayer", "WorkerLag", "batch_mark"]

logger = logging.getLogger("radixmeta.replay")
_REPLAY_ATTEMPTS = 3  # replay requests per gap before a resync

_Key = tuple[str, int]


class ReplaySource(Protocol):
    """Where a replayer asks for what it missed (both methods may return None: cannot).

    A wire batch that kept no record (every event left out) is answered with
    :func:`batch_mark` in its place, so the answer still shows that batch; an empty
    snapshot is answered the same way, ``[batch_mark(worker, dp_rank, seq)]``, so it still
    names the seq it is consistent with.
    """

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> list[Record] | None:
        """The worker's records from sequence ``from_seq`` on, in order, or None."""

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | None:
        """Records that rebuild the worker, all stamped with one seq, or None."""


@dataclass
class ReplayStats:
    """Counts of one :meth:`Replayer.replay` call (or, from ``Replayer.stats``, of all)."""

    applied: int = 0
    duplicates: int = 0
    gaps: int = 0
    replays_requested: int = 0
    resyncs: int = 0
    stale: int = 0  # resyncs that found no snapshot: the worker was cleared
    restarts: int = 0
    malformed: int = 0
    unknown_worker: int = 0
    pending: int = 0  # records still waiting when the call returned

    def add(self, other: ReplayStats) -> None:
        for f in fields(self):
            if f.name != "pending":
                setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))
        self.pending = other.pending

    def since(self, earlier: ReplayStats) -> ReplayStats:
        """The counts added after ``earlier`` (a copy of these stats taken before)."""
        return ReplayStats(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )


@dataclass(frozen=True)
class WorkerLag:
    """How far the tree is behind one worker's newest record."""

    worker: str
    dp_rank: int
    applied_seq: int | None
    newest_seq: int | None
    records: int  # records of this worker seen but not yet applied
    seconds: float  # age of the oldest of those
    stale: bool


@dataclass
class _Cursor:
    seq: int | None = None  # None: nothing applied yet (the next record is a baseline)
    index: int = 0
    stale: bool = False
    # After a resync from a snapshot stamped S, records of the gap (from its start to
    # S) that are still queued are duplicates, not a restart: (gap start, S).
    covered: tuple[int, int] | None = None
    newest: int | None = None
    waiting: deque[float] = field(default_factory=deque)  # arrival times of pending records
    stats: ReplayStats = field(default_factory=ReplayStats)  # this worker's counts, cumulative


class Replayer:
    """Apply workers' event records to a :class:`~radixmeta.MetaTree`, in order, within a budget.

    Parameters
    ----------
    meta_tree : MetaTree
        The tree to keep up to date. Records of workers it does not know are
        counted (``unknown_worker``) and skipped, so workers can be added and
        removed while records flow.
    source : ReplaySource, optional
        Where to ask for the records of a gap and for snapshots. Without one a
        gap is resynced as for a publisher with no snapshot.
    restart_window : int, default 16
        A sequence number lower than the worker's cursor by more than this
        means the worker restarted; a lower one within the window is a
        duplicate (a re-delivered or reordered batch). A worker that restarts
        before publishing this many batches is not recognised by its numbers
        alone: its old pages stay until evicted or cleared, which costs the
        router stale hits (a recompute), never a wrong answer.

    Examples
    --------
    >>> from radixmeta import EventLog, MetaTree, RadixCache
    >>> log = EventLog(worker="w0")
    >>> cache = RadixCache(event_log=log)
    >>> tree = MetaTree()
    >>> w0 = tree.add_worker("w0")
    >>> replayer = Replayer(tree, source=LogSource({("w0", 0): cache}))
    >>> cache.insert([1, 2, 3])
    0
    >>> replayer.submit(log.read())
    >>> replayer.replay().applied, tree.match([1, 2, 3]).length_of(w0)
    (1, 3)
    """

    def __init__(
        self, meta_tree: Any, *, source: ReplaySource | None = None, restart_window: int = 16
    ) -> None:
        self.tree = meta_tree
        self.source = source
        self.restart_window = check_int("restart_window", restart_window, 0)
        self.stats = ReplayStats()
        self._pending: deque[tuple[Record, float]] = deque()
        self._cursors: dict[_Key, _Cursor] = {}
        self._lock = threading.RLock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

    # -- intake ----------------------------------------------------------------------------
    def submit_batch(self, worker: str, dp_rank: int, seq: int, records: list[Record]) -> None:
        """Queue the records of one wire batch; a batch that kept none still moves the cursor.

        A converter may leave every event of a batch out (offload placeholders,
        other KV groups): without this mark the next batch would look like a gap.
        """
        if records:
            self.submit(records)
        else:
            self._enqueue([batch_mark(worker, dp_rank, seq)])

    def submit(self, records: Iterable[Record]) -> None:
        """Queue records for the next :meth:`replay` (cheap: nothing is applied here)."""
        records = list(records)
        for record in records:
            if not isinstance(record, (Stored, Removed, Cleared)):
                msg = f"records must be Stored, Removed or Cleared, got {type(record).__name__}"
                raise InputTypeError(msg)
        self._enqueue(records)

    def _enqueue(self, records: Iterable[Any]) -> None:
        now = time.monotonic()
        with self._lock:
            for record in records:
                cursor = self._cursors.setdefault((record.worker, record.dp_rank), _Cursor())
                if cursor.newest is None or record.seq > cursor.newest:
                    cursor.newest = record.seq
                cursor.waiting.append(now)
                self._pending.append((record, now))

    # -- replay ----------------------------------------------------------------------------
    def replay(
        self, max_records: int | None = None, max_seconds: float | None = None
    ) -> ReplayStats:
        """Apply pending records, oldest first, until none is left or the budget is spent.

        Parameters
        ----------
        max_records : int, optional
            Apply at most this many records (duplicates and skipped ones count).
        max_seconds : float, optional
            Stop once this much time has passed (checked between records).

        Returns
        -------
        ReplayStats
            What this call did; ``Replayer.stats`` accumulates them.
        """
        done = ReplayStats()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        with self._lock:
            handled = 0
            # Each worker's own counts move; this call's are their sum, taken
            # once per worker touched rather than once per record.
            before: dict[int, tuple[_Cursor, ReplayStats]] = {}
            while self._pending:
                if max_records is not None and handled >= max_records:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                record, _ = self._pending.popleft()
                cursor = self._cursors.setdefault((record.worker, record.dp_rank), _Cursor())
                if cursor.waiting:
                    cursor.waiting.popleft()
                if id(cursor) not in before:
                    before[id(cursor)] = (cursor, dataclasses.replace(cursor.stats))
                self._take(record, cursor, cursor.stats)
                handled += 1
            for cursor, earlier in before.values():
                done.add(cursor.stats.since(earlier))
            done.pending = len(self._pending)
            self.stats.add(done)
        return done

    def _take(self, record: Record, cursor: _Cursor, done: ReplayStats) -> None:
        worker = self._worker(record)
        if worker is None:
            done.unknown_worker += 1
            return
        if cursor.covered is not None and cursor.covered[0] <= record.seq <= cursor.covered[1]:
            done.duplicates += 1  # the snapshot that resynced the worker holds it
            return
        if cursor.seq is not None and self._restarted(record, cursor):
            done.restarts += 1
            self._clear(worker, cursor)
        if cursor.seq is None:
            if record.seq != 0 or record.index != 0:  # joined late: ask for the beginning
                self._repair(record, worker, cursor, done, from_seq=0)
                return
            self._apply(record, worker, cursor, done)
            return
        position = (record.seq, record.index)
        if position <= (cursor.seq, cursor.index):
            done.duplicates += 1
            return
        if self._follows(record, cursor):
            self._apply(record, worker, cursor, done)
            return
        done.gaps += 1
        self._repair(record, worker, cursor, done, from_seq=self._expected_seq(cursor))

    def _restarted(self, record: Record, cursor: _Cursor) -> bool:
        assert cursor.seq is not None
        return record.seq < cursor.seq - self.restart_window

    @staticmethod
    def _follows(record: Record, cursor: _Cursor) -> bool:
        """Contiguous: a later record of the same batch, or one of the next batch.

        A batch arrives whole (it is decoded whole or dropped), so indices within
        it may skip the events a converter left out; only a sequence can have gaps.
        """
        assert cursor.seq is not None
        return record.seq == cursor.seq or record.seq == cursor.seq + 1

    @staticmethod
    def _expected_seq(cursor: _Cursor) -> int:
        assert cursor.seq is not None
        return cursor.seq + 1

    def _repair(
        self, record: Record, worker: Any, cursor: _Cursor, done: ReplayStats, from_seq: int
    ) -> None:
        """Fill the gap before ``record`` from the source, or resync the worker.

        A source may answer in part (a replay that timed out): what it sent is
        applied and the rest asked for again, a few times, before resyncing.
        """
        for _ in range(_REPLAY_ATTEMPTS if self.source is not None else 0):
            done.replays_requested += 1
            missing = self.source.replay(record.worker, record.dp_rank, from_seq)  # type: ignore[union-attr]
            if not missing or missing[0].seq > from_seq:
                break  # the source no longer reaches back to the gap
            for earlier in missing:
                if (earlier.seq, earlier.index) >= (record.seq, record.index):
                    break
                if cursor.seq is None or (earlier.seq, earlier.index) > (cursor.seq, cursor.index):
                    self._apply(earlier, worker, cursor, done)
            if cursor.seq is not None and self._follows(record, cursor):
                self._apply(record, worker, cursor, done)
                return
            if cursor.seq is None:
                break
            from_seq = self._expected_seq(cursor)
        done.resyncs += 1
        snapshot = (
            None if self.source is None else self.source.snapshot(record.worker, record.dp_rank)
        )
        self._clear(worker, cursor)
        if snapshot is not None:
            for stored in snapshot:
                self._apply(stored, worker, cursor, done)
            if snapshot:
                cursor.seq, cursor.index = snapshot[0].seq, snapshot[0].index
                cursor.covered = (from_seq, snapshot[0].seq)
            if cursor.seq is not None and (record.seq, record.index) <= (cursor.seq, cursor.index):
                done.duplicates += 1  # the snapshot already holds it
                return
        else:
            done.stale += 1
            cursor.stale = True
            logger.warning(
                "worker (%r, dp_rank=%d): records before seq %d are lost and the source keeps "
                "no snapshot; its pages were cleared and it is stale until its next records",
                record.worker,
                record.dp_rank,
                record.seq,
            )
        self._apply(record, worker, cursor, done, baseline=True)

    def _apply(
        self,
        record: Record,
        worker: Any,
        cursor: _Cursor,
        done: ReplayStats,
        baseline: bool = False,
    ) -> None:
        """One record into the tree; it moves the cursor whether or not it could apply.

        A ``baseline`` record is the first after a resync with no snapshot: the
        worker stays stale until a record after it.
        """
        cursor.seq, cursor.index = record.seq, record.index
        if not baseline:
            cursor.stale = False
        if isinstance(record, _Mark):
            return
        try:
            _apply_record(self.tree, worker, record)
        except RadixMetaError as exc:
            done.malformed += 1
            logger.warning(
                "worker (%r, dp_rank=%d) record %d.%d skipped: %s",
                record.worker,
                record.dp_rank,
                record.seq,
                record.index,
                exc,
            )
            return
        done.applied += 1

    def _clear(self, worker: Any, cursor: _Cursor) -> None:
        self.tree.apply_cleared(worker)
        cursor.seq, cursor.index = None, 0
        cursor.covered = None

    def _worker(self, record: Record) -> Any:
        return self._worker_named(record.worker, record.dp_rank)

    def _worker_named(self, name: str, dp_rank: int) -> Any:
        try:
            return self.tree.worker(name, dp_rank)
        except RadixMetaError:
            return None

    # -- workers ---------------------------------------------------------------------------
    def restart(self, worker: str, dp_rank: int = 0) -> None:
        """The worker restarted (its sequence starts again): clear it and reset its cursor."""
        with self._lock:
            cursor = self._cursors.setdefault((worker, dp_rank), _Cursor())
            tree_worker = self._worker_named(worker, dp_rank)
            if tree_worker is not None:
                self._clear(tree_worker, cursor)
            self.stats.restarts += 1

    def forget(self, worker: str, dp_rank: int = 0) -> None:
        """Free a worker's cursor and its pending records (after ``remove_worker``)."""
        with self._lock:
            self._cursors.pop((worker, dp_rank), None)
            self._pending = deque(
                (r, t) for r, t in self._pending if (r.worker, r.dp_rank) != (worker, dp_rank)
            )

    def worker_stats(self, worker: str, dp_rank: int = 0) -> ReplayStats:
        """The counts of one worker's records, cumulative (a copy)."""
        with self._lock:
            cursor = self._cursors.get((worker, dp_rank))
            return ReplayStats() if cursor is None else dataclasses.replace(cursor.stats)

    def lag(self) -> list[WorkerLag]:
        """Per worker: the applied and newest seq, and the records and seconds behind."""
        now = time.monotonic()
        with self._lock:
            return [
                WorkerLag(
                    name,
                    rank,
                    c.seq,
                    c.newest,
                    len(c.waiting),
                    now - c.waiting[0] if c.waiting else 0.0,
                    c.stale,
                )
                for (name, rank), c in sorted(self._cursors.items())
            ]

    @property
    def pending(self) -> int:
        """Records waiting to be applied."""
        return len(self._pending)

    # -- background ------------------------------------------------------------------------
    def start(
        self,
        interval: float = 0.01,
        *,
        max_records: int | None = 10_000,
        max_seconds: float | None = 0.005,
    ) -> None:
        """Replay in a background thread every ``interval`` seconds, within the given budget."""
        if self._thread is not None:
            msg = "the replayer's background thread is already running"
            raise RuntimeError(msg)
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                self.replay(max_records=max_records, max_seconds=max_seconds)

        self._thread = threading.Thread(target=loop, name="radixmeta-replayer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the background thread (if any) and wait for it, at most ``timeout`` seconds."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout)

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Mark(_Record, frozen=True, gc=False, eq=False):
    """A batch that kept no record: it moves the worker's cursor, and nothing else."""


def batch_mark(worker: str, dp_rank: int, seq: int) -> Record:
    """The stand-in of a batch that kept no record, for a :class:`ReplaySource`'s answer."""
    return _Mark(worker, dp_rank, seq)  # type: ignore[return-value]


def _apply_record(tree: Any, worker: Any, record: Record) -> None:
    """One record as the matching MetaTree call (checked whole before it changes anything)."""
    if isinstance(record, Cleared):
        tree.apply_cleared(worker)
        return
    scope = _scope(record)
    if record.form == "path":
        op = tree.insert if isinstance(record, Stored) else tree.remove
        op(record.key, worker, start=record.start, **scope)
    elif isinstance(record, Stored):
        if record.extras is not None:
            scope["extras"] = record.extras
        tree.apply_stored(
            worker, record.parent_hash, record.block_hashes, record.token_ids, **scope
        )
    else:
        tree.apply_removed(worker, record.block_hashes, **_tier_only(record))


def _scope(record: Any) -> dict[str, Any]:
    """Keyword arguments for a record's namespace and tier, where they are not the default."""
    scope = _tier_only(record)
    if record.namespace is not None:
        scope["namespace"] = record.namespace
    return scope


def _tier_only(record: Any) -> dict[str, Any]:
    return {"tier": record.tier} if record.tier else {}


class LogSource:
    """A :class:`ReplaySource` over in-process caches and their :class:`~radixmeta.EventLog`.

    Parameters
    ----------
    caches : dict
        ``(worker, dp_rank) -> RadixCache``; each cache must have an event log.
    """

    def __init__(self, caches: dict[_Key, Any]) -> None:
        self.caches = dict(caches)

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> list[Record] | None:
        cache = self.caches.get((worker, dp_rank))
        if cache is None:
            return None
        with contextlib.suppress(LogTruncatedError):
            return list(cache.event_log.read(after=from_seq - 1))
        return None

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | None:
        cache = self.caches.get((worker, dp_rank))
        if cache is None:
            return None
        records = list(cache.snapshot())
        # An empty cache still says which seq it is consistent with: without it, the
        # record that found the gap would be applied on top, though the cache let it go.
        return records or [batch_mark(worker, dp_rank, cache.event_log.next_seq - 1)]
