"""Router-side replay of workers' event records into a MetaTree.

The A.4 design's weak consistency: workers commit what their caches store and
evict to a log, and the router replays that log into its meta-tree when it is
idle. :class:`Replayer` keeps a cursor per configured (worker, dp rank), applies
records in order within a budget, and repairs what the transport broke:

* a record already applied (its ``(seq, index)`` at or before the cursor) is a
  duplicate and is dropped;
* a record after a gap asks the source for the missing range; if the source
  cannot serve it, the worker is resynced from the source's snapshot, or, with
  none (vLLM and SGLang publishers keep no snapshot), cleared and marked stale
  until its view is rebuilt (a ``Cleared`` event, a restart, a snapshot);
* a restart starts a new stream: after the transport saw the publisher reconnect
  (:meth:`Replayer.reconnected`), a record at or before where the cursor was then
  (batches still queued from the old stream come after that point and go on;
  records of the stream that went on past it are duplicates when they come again);
  without that sign, a sequence that goes back by more than ``restart_window``. The
  worker is cleared and starts again (a transport that knows of a restart for sure
  calls :meth:`Replayer.restart`). A gap right after a reconnect may be a restart
  whose first batches were missed: the source is asked from seq 0, and if it holds
  the stream from there the worker is rebuilt from it (else, a publisher past its
  buffer, the gap is repaired as any other);
* ``Cleared`` is a barrier: everything the worker held before it goes;
* a worker left stale by a repair whose snapshot failed (timed out, refused) asks
  for its snapshot again on its next record, or at the next probe if it is quiet,
  with a bounded backoff between tries (:data:`RESNAPSHOT_DELAYS`), for as long as
  it is stale and its source may serve one (``can_snapshot``). A try that fails
  changes nothing: the worker goes on, stale, from where it was.

The source is asked **outside every lock**, on threads of the replayer's own
(:mod:`radixmeta.events.repair`): while a worker waits for its repair it is
*repairing*, its records wait behind the gap, the tree keeps what it held, and
the other workers' records go on being applied. ``replay(max_seconds=B)`` returns
within the budget whatever a source does.

A record that cannot apply (its parent was never seen, a hash conflict, a
malformed field) is counted, logged (at a bounded rate) with its worker and seq,
and skipped: the replayer never raises for a record and never applies half of
one, because each MetaTree call is checked whole before it changes anything.
"""

from __future__ import annotations

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
from radixmeta.errors import InputTypeError, LogTruncatedError
from radixmeta.events._pool import CallPool
from radixmeta.events._throttle import ThrottledLog
from radixmeta.events.repair import Answer, Question, Unavailable, ask

__all__ = [
    "RESNAPSHOT_DELAYS",
    "LogSource",
    "ReplaySource",
    "ReplayStats",
    "Replayer",
    "Unavailable",
    "WorkerLag",
    "batch_mark",
]

logger = logging.getLogger("radixmeta.replay")

_Key = tuple[str, int]

#: Records one worker may have waiting (queued or behind its gap) before more are dropped.
DEFAULT_MAX_PENDING = 65_536

#: Seconds a stale worker waits before it asks for its snapshot again, after its first,
#: second... failed snapshot; the last repeats. Short enough that a worker whose snapshot
#: timed out once on a loaded machine is rebuilt within about 2 s of its next record; the
#: 2 s ceiling bounds what a dead replay socket costs: one request every 2 s, waiting on
#: a repair thread, never under a lock.
RESNAPSHOT_DELAYS = (0.25, 0.5, 1.0, 2.0)


class ReplaySource(Protocol):
    """Where a replayer asks for what it missed.

    Both methods may answer None ("cannot") or an :class:`Unavailable` that says why.
    They are called on the replayer's own threads, never under its lock, so they may
    wait on a socket (each within a timeout of its own).

    A wire batch that kept no record (every event left out) is answered with
    :func:`batch_mark` in its place, so the answer still shows that batch; an empty
    snapshot is answered the same way, ``[batch_mark(worker, dp_rank, seq)]``, so it still
    names the seq it is consistent with.

    A source may also have ``can_replay(worker, dp_rank) -> bool``: False spares the
    probes of a worker it could never answer for (one with no replay endpoint); and
    ``can_snapshot(worker, dp_rank) -> bool``: False spares a stale worker's repeated
    snapshot requests where none could come (a vLLM or SGLang publisher).
    """

    def replay(
        self, worker: str, dp_rank: int, from_seq: int
    ) -> list[Record] | Unavailable | None:
        """The worker's records from sequence ``from_seq`` on, in order, or None."""

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | Unavailable | None:
        """Records that rebuild the worker, all stamped with one seq, or None."""


@dataclass
class ReplayStats:
    """Counts of one :meth:`Replayer.replay` call (or, from ``Replayer.stats``, of all)."""

    applied: int = 0
    duplicates: int = 0
    gaps: int = 0  # gaps found, by a later record or by a probe of a tail that was lost
    replays_requested: int = 0
    resyncs: int = 0
    stale: int = 0  # resyncs that found no snapshot: the worker was cleared
    restarts: int = 0
    malformed: int = 0
    unknown_worker: int = 0
    dropped: int = 0  # records refused past max_pending (the worker resyncs instead)
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
    """How far the tree is behind one worker, and what state its view is in."""

    worker: str
    dp_rank: int
    applied_seq: int | None
    newest_seq: int | None
    records: int  # records of this worker seen but not yet applied
    seconds: float  # age of the oldest of those
    stale: bool  # records were lost for good: the view is partial until it is rebuilt
    repairing: bool = False  # a replay or snapshot request is in flight
    last_applied: float | None = None  # seconds since a record of it was applied
    last_error: str | None = None  # the last thing that went wrong with its records


class _Reconnected:
    """Queued in order with the records: the transport saw this worker's publisher
    connect again, so the record after it may start a new stream."""

    __slots__ = ("dp_rank", "worker")

    def __init__(self, worker: str, dp_rank: int) -> None:
        self.worker, self.dp_rank = worker, dp_rank


@dataclass(eq=False)
class _Cursor:
    key: _Key
    seq: int | None = None  # None: nothing applied yet (the next record is a baseline)
    index: int = 0
    stale: bool = False
    # After a resync from a snapshot stamped S, records of the gap (from its start to
    # S) that are still queued are duplicates, not a restart: (gap start, S). Cleared
    # once a record after S comes.
    covered: tuple[int, int] | None = None
    # The cursor's (seq, index) when the transport last saw the publisher connect
    # again, until the stream is past it by more than restart_window (then the window
    # rule alone tells a restart): a record at or before it starts a new stream. Records
    # after it that go back are duplicates of the stream that went on.
    reconnected: tuple[int, int] | None = None
    newest: int | None = None
    waiting: deque[float] = field(default_factory=deque)  # arrival times of pending records
    # Items behind a gap (or after those), in order: (record or mark, arrival or None).
    parked: deque[tuple[Any, float | None]] = field(default_factory=deque)
    repair: _Job | None = None
    ready: bool = False  # in the replayer's queue of cursors with parked items to take
    heard: float = 0.0  # when a record last arrived or a probe was last sent
    last_applied: float | None = None
    last_error: str | None = None
    stats: ReplayStats = field(default_factory=ReplayStats)  # this worker's counts, cumulative
    # The last record a probe brought, until the live stream shows whether it was lost
    # (a gap) or only in flight (its live copy comes: no gap).
    probed: tuple[int, int] | None = None
    # Records inside the parked answers beyond the one entry each is (see _Answered).
    answered_extra: int = 0
    # While stale: when the snapshot may be asked for again, and the tries that failed
    # since the worker went stale (which step of RESNAPSHOT_DELAYS comes next).
    resnapshot_at: float = 0.0
    resnapshot_failures: int = 0

    @property
    def backlog(self) -> int:
        """Records parked, counting each record of a parked answer."""
        return len(self.parked) + self.answered_extra


class _Answered:
    """A source's answer parked as one item, whose records are applied one a step.

    A gap's records go on from the cursor as if they had arrived live; a snapshot's
    (``covered_from`` set: where the gap began) rebuild the cleared worker, and once
    the last is applied the cursor stands at the snapshot's stamp.
    """

    __slots__ = ("covered_from", "records", "stamp")

    def __init__(self, records: Iterable[Record], covered_from: int | None = None) -> None:
        self.records: deque[Record] = deque(records)
        self.stamp = self.records[0]
        self.covered_from = covered_from


@dataclass(eq=False)
class _Job:
    cursor: _Cursor
    question: Question


class Replayer:
    """Apply workers' event records to a :class:`~radixmeta.MetaTree`, in order, within a budget.

    Parameters
    ----------
    meta_tree : MetaTree
        The tree to keep up to date. Only its workers have cursors: records of
        any other are counted (``unknown_worker``) and dropped as they arrive, so
        workers can be added and removed while records flow.
    source : ReplaySource, optional
        Where to ask for the records of a gap and for snapshots. Without one a
        gap is resynced as for a publisher with no snapshot.
    restart_window : int, default 16
        A sequence number lower than the worker's cursor by more than this
        means the worker restarted; a lower one within the window is a
        duplicate (a re-delivered or reordered batch). A transport that sees
        the publisher reconnect says so (:meth:`reconnected`), and a record
        after it that goes back to or before where the cursor was then starts a
        new stream whatever the window.
    max_pending : int, default 65536
        Records one worker may have waiting (queued, or behind its gap) before
        its further records are dropped (``dropped``): the worker then shows a
        gap and is repaired or resynced, instead of the queue growing.
    max_threads : int, default 8
        Threads that put questions to the source at once (repairs and probes).

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
        self,
        meta_tree: Any,
        *,
        source: ReplaySource | None = None,
        restart_window: int = 16,
        max_pending: int = DEFAULT_MAX_PENDING,
        max_threads: int = 8,
    ) -> None:
        self.tree = meta_tree
        self.source = source
        self.restart_window = check_int("restart_window", restart_window, 0)
        self.max_pending = check_int("max_pending", max_pending, 1)
        self.stats = ReplayStats()
        self._pending: deque[tuple[Any, float | None]] = deque()  # (item, arrival)
        self._cursors: dict[_Key, _Cursor] = {}
        self._lock = threading.RLock()
        self._changed = threading.Condition(self._lock)  # an answer came back
        self._answers: deque[tuple[_Job, Answer]] = deque()
        self._ready: deque[_Cursor] = deque()  # cursors whose parked items may go on
        self._asking = 0  # questions put to the source and not answered yet
        self._pool = CallPool("radixmeta-repair", check_int("max_threads", max_threads, 1))
        self._closed = False
        self._unreported = ReplayStats()  # counted on arrival, reported by the next replay
        self._log = ThrottledLog(logger)
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

    def reconnected(self, worker: str, dp_rank: int = 0) -> None:
        """The transport saw the worker's publisher connect again (after a disconnect).

        Queued in order with the records; it marks where the cursor is when it is
        taken. A later record at or before that point starts a new stream (the
        publisher restarted, its numbering with it); one after it goes on as usual
        (the same publisher back, or batches of the old stream still queued), and a
        copy of a record applied after the point is a duplicate. The point is
        forgotten once the cursor is more than ``restart_window`` past it (the
        window alone then tells a restart) or the worker is cleared.
        """
        self._enqueue([_Reconnected(worker, dp_rank)])

    def _enqueue(self, items: Iterable[Any]) -> None:
        now = time.monotonic()
        with self._lock:
            cursor: _Cursor | None = None
            for item in items:
                key = (item.worker, item.dp_rank)
                if cursor is None or cursor.key != key:
                    cursor = self._cursor(key)
                if cursor is None:  # not a worker of the tree: no cursor is made for it
                    self._unreported.unknown_worker += 1
                    continue
                if isinstance(item, _Reconnected):
                    cursor.newest = None  # the stream's numbering may start again
                    self._pending.append((item, None))
                    continue
                if len(cursor.waiting) >= self.max_pending:
                    self._drop(cursor, item)
                    continue
                newest = cursor.newest
                if newest is None or item.seq > newest or item.seq < newest - self.restart_window:
                    cursor.newest = item.seq
                cursor.heard = now
                cursor.waiting.append(now)
                self._pending.append((item, now))

    def _cursor(self, key: _Key) -> _Cursor | None:
        """The cursor of a worker of the tree (made on first use), else None."""
        cursor = self._cursors.get(key)
        if cursor is None and self._worker_named(*key) is not None:
            cursor = self._cursors[key] = _Cursor(key)
        return cursor

    def _drop(self, cursor: _Cursor, record: Any) -> None:
        """A record past ``max_pending``: refused, so the worker shows a gap and resyncs."""
        cursor.stats.dropped += 1
        self._unreported.dropped += 1
        cursor.last_error = f"more than {self.max_pending} records waiting: later ones dropped"
        self._log.warning(
            (cursor.key, "dropped"),
            "worker (%r, dp_rank=%d): more than %d records waiting, record %d.%d dropped "
            "(the worker is repaired or resynced once the queue drains)",
            record.worker,
            record.dp_rank,
            self.max_pending,
            record.seq,
            record.index,
        )

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
            Stop once this much time has passed (checked between records). The call
            never waits on a source: it returns within this budget.

        Returns
        -------
        ReplayStats
            What this call did; ``Replayer.stats`` accumulates them.

        Notes
        -----
        A gap's repair is asked for in the background, outside the lock; the
        worker's records wait behind it (the worker is ``repairing``) while the
        others' go on. What the source answers (a gap's records, a snapshot, a
        probe's find) is applied a record a step like any other, within the
        budget, ahead of the records parked behind the gap. With a budget the
        call returns when nothing more can be applied now; without either
        budget it also waits for the repairs (and probes) in flight and applies
        what they bring, so that, as before, one call leaves nothing pending
        that could be applied.
        """
        done = ReplayStats()
        deadline = None if max_seconds is None else time.monotonic() + max_seconds
        wait = max_records is None and max_seconds is None
        with self._lock:
            handled = 0
            # Each worker's own counts move; this call's are their sum, taken
            # once per worker touched rather than once per record.
            before: dict[int, tuple[_Cursor, ReplayStats]] = {}

            def touch(cursor: _Cursor) -> None:
                if id(cursor) not in before:
                    before[id(cursor)] = (cursor, dataclasses.replace(cursor.stats))

            while True:
                if max_records is not None and handled >= max_records:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if self._answers:
                    job, answer = self._answers.popleft()
                    touch(job.cursor)
                    self._settle(job, answer)
                    continue
                cursor = self._next_ready()
                if cursor is not None:
                    item, arrived = cursor.parked.popleft()
                    touch(cursor)
                    self._take(item, arrived, cursor)
                    handled += 1
                    continue
                if self._pending:
                    item, arrived = self._pending.popleft()
                    cursor = self._cursors.get((item.worker, item.dp_rank))
                    if cursor is None:  # forgotten while it waited
                        continue
                    if cursor.repair is not None or cursor.parked:
                        self._park(cursor, item, arrived)  # behind its worker's gap
                        continue
                    touch(cursor)
                    self._take(item, arrived, cursor)
                    handled += 1
                    continue
                if wait and self._asking and not self._closed:
                    # The wait releases the lock, and records may arrive meanwhile: what
                    # they count goes to _unreported, so take this call's counts first.
                    for cursor, earlier in before.values():
                        done.add(cursor.stats.since(earlier))
                    before.clear()
                    self._changed.wait(0.1)
                    continue
                break
            for cursor, earlier in before.values():
                done.add(cursor.stats.since(earlier))
            done.add(self._unreported)
            self._unreported = ReplayStats()
            done.pending = len(self._pending) + sum(c.backlog for c in self._cursors.values())
            self.stats.add(done)
        return done

    def _next_ready(self) -> _Cursor | None:
        """A cursor whose parked items may be taken now (no repair in flight), or None."""
        ready = self._ready
        while ready:
            cursor = ready[0]
            if cursor.parked and cursor.repair is None and self._cursors.get(cursor.key) is cursor:
                return cursor  # stays first until its parked items are taken
            ready.popleft()
            cursor.ready = False
        return None

    def _park(
        self, cursor: _Cursor, item: Any, arrived: float | None, *, first: bool = False
    ) -> None:
        if isinstance(item, _Answered):
            cursor.answered_extra += len(item.records) - 1
        if first:
            cursor.parked.appendleft((item, arrived))
        else:
            cursor.parked.append((item, arrived))
        if cursor.repair is None and not cursor.ready:
            cursor.ready = True
            self._ready.append(cursor)

    def _take(self, item: Any, arrived: float | None, cursor: _Cursor) -> None:
        """One queued item of a worker with no repair in flight; never raises."""
        if arrived is not None and cursor.waiting:
            cursor.waiting.popleft()
        try:
            self._handle(item, arrived, cursor)
        except Exception as exc:  # a bug or a tree that refused: counted, never fatal
            cursor.stats.malformed += 1
            self._failed(cursor, item, exc)

    def _handle(self, item: Any, arrived: float | None, cursor: _Cursor) -> None:
        done = cursor.stats
        if isinstance(item, _Answered):
            self._take_answered(item, cursor)
            return
        if isinstance(item, _Reconnected):
            cursor.reconnected = None if cursor.seq is None else (cursor.seq, cursor.index)
            return
        record: Record = item
        worker = self._worker_named(*cursor.key)
        if worker is None:
            done.unknown_worker += 1
            return
        if cursor.stale and self._resnapshot_due(cursor):
            # Rebuilt from a snapshot if one comes; the record waits behind it (taken
            # again after the answer, as a duplicate if the snapshot holds it).
            self._ask(cursor, record, arrived, from_seq=record.seq, snapshot_only=True)
            return
        position = (record.seq, record.index)
        if cursor.probed is not None and arrived is not None:
            self._judge_probe(cursor, lost=position > cursor.probed)
        # At or before where the cursor was when the publisher connected again: a new
        # stream (a batch still queued from the old one is after it, and goes on).
        new_stream = cursor.reconnected is not None and position <= cursor.reconnected
        if cursor.covered is not None and not new_stream:
            low, high = cursor.covered
            if low <= record.seq <= high:
                done.duplicates += 1  # the snapshot that resynced the worker holds it
                return
            if record.seq > high:
                cursor.covered = None  # passed: it must not hide a later restart
        if cursor.seq is not None and (
            new_stream or record.seq < cursor.seq - self.restart_window
        ):
            done.restarts += 1
            self._clear(worker, cursor)
        self._spend_reconnect(cursor)
        if cursor.seq is None:
            if record.seq != 0:  # joined late: ask for the beginning
                self._ask(cursor, record, arrived, from_seq=0)
                return
            cursor.stale = False  # a stream from its start: the view is whole again
            self._apply(record, worker, cursor)
            return
        if position <= (cursor.seq, cursor.index):
            done.duplicates += 1
            return
        if _follows(record, cursor):
            self._apply(record, worker, cursor)
            return
        done.gaps += 1
        if cursor.reconnected is not None:
            # A gap right after a reconnect: the same publisher lost batches while it
            # was away, or a restarted one whose first batches were missed (its seqs
            # already past the cursor). Check with the source: from seq 0 first.
            self._ask(cursor, record, arrived, from_seq=0, resume_from=cursor.seq + 1)
            return
        self._ask(cursor, record, arrived, from_seq=cursor.seq + 1)

    def _take_answered(self, answered: _Answered, cursor: _Cursor) -> None:
        """The next record of a source's answer; the rest stays first in the parked queue."""
        record = answered.records.popleft()
        if answered.records:
            cursor.parked.appendleft((answered, None))
            cursor.answered_extra -= 1
        worker = self._worker_named(*cursor.key)
        if worker is None:
            cursor.stats.unknown_worker += 1
            return
        if answered.covered_from is None:  # a gap's records: the cursor goes on through them
            if cursor.seq is None or (record.seq, record.index) > (cursor.seq, cursor.index):
                self._handle(record, None, cursor)
            return
        self._apply(record, worker, cursor)  # a snapshot's, onto the cleared worker
        if not answered.records:
            stamp = answered.stamp
            cursor.seq, cursor.index = stamp.seq, stamp.index
            cursor.covered = (answered.covered_from, stamp.seq)
            cursor.stale = False

    def _judge_probe(self, cursor: _Cursor, *, lost: bool) -> None:
        """Count what the last probe found as a gap if it was lost, not if it was in flight.

        Lost: the live stream went on past it without bringing it, or the worker
        stayed quiet until its next probe. In flight: its live copy came (a duplicate).
        """
        cursor.probed = None
        if lost:
            cursor.stats.gaps += 1

    def _spend_reconnect(self, cursor: _Cursor) -> None:
        """Forget the reconnect point once the window rule alone tells a restart.

        Past ``restart_window`` seqs beyond it, any record at or before it is lower
        than the cursor by more than the window; a cleared cursor has no point at all.
        """
        mark = cursor.reconnected
        if mark is not None and (cursor.seq is None or cursor.seq - self.restart_window > mark[0]):
            cursor.reconnected = None

    def _ask(
        self,
        cursor: _Cursor,
        record: Record,
        arrived: float | None,
        from_seq: int,
        resume_from: int | None = None,
        *,
        snapshot_only: bool = False,
    ) -> None:
        """Park ``record`` behind its gap and ask the source for the gap, off the lock."""
        if arrived is not None:
            cursor.waiting.appendleft(arrived)  # still waiting, behind the gap
        self._park(cursor, record, arrived, first=True)
        question = Question(
            record.worker,
            record.dp_rank,
            from_seq,
            (record.seq, record.index),
            resume_from,
            snapshot_only=snapshot_only,
        )
        job = _Job(cursor, question)
        cursor.repair = job
        if self.source is None or self._closed:
            reason = "no replay source" if self.source is None else "the replayer is closed"
            self._answers.append((job, Answer(replay_problem=reason)))
            return
        self._put(job)

    def _put(self, job: _Job) -> None:
        """Run ``job``'s question on a pool thread; its answer comes back through the lock."""
        source = self.source

        def run() -> None:
            try:
                answer = ask(source, job.question)
            except Exception as exc:  # ask catches what sources do; this is the last line
                answer = Answer(replay_problem=f"asking the source failed: {exc!r}")
            with self._lock:
                self._asking -= 1
                self._answers.append((job, answer))
                self._changed.notify_all()

        self._asking += 1
        if not self._pool.submit(run):
            self._asking -= 1
            self._answers.append((job, Answer(replay_problem="the replayer is closed")))

    def _settle(self, job: _Job, answer: Answer) -> None:
        """Apply what a source answered (under the lock); then the parked records go on."""
        cursor = job.cursor
        if cursor.repair is not job or self._cursors.get(cursor.key) is not cursor:
            return  # the worker was forgotten or restarted meanwhile: the answer is moot
        cursor.repair = None
        if cursor.parked and not cursor.ready:
            cursor.ready = True
            self._ready.append(cursor)
        try:
            if job.question.snapshot_only:
                self._settle_resnapshot(cursor, job.question, answer)
            elif job.question.target is None:
                self._settle_probe(cursor, answer)
            else:
                self._settle_gap(cursor, job.question, answer)
        except Exception as exc:
            cursor.stats.malformed += 1
            self._failed(cursor, None, exc)

    def _settle_probe(self, cursor: _Cursor, answer: Answer) -> None:
        found = [
            r for r in answer.records
            if cursor.seq is None or (r.seq, r.index) > (cursor.seq, cursor.index)
        ]
        if not found:
            return  # the usual answer of a quiet worker: nothing was lost
        if cursor.seq is not None and _follows(found[0], cursor):
            # The source goes on from the cursor: the same stream, so a copy of these
            # records arriving live later is a duplicate, not a restart.
            cursor.reconnected = None
        # A tail the live stream has not brought, lost or still in flight (published
        # while the probe was out): the live stream tells which (see _judge_probe).
        cursor.probed = (found[-1].seq, found[-1].index)
        cursor.stats.replays_requested += answer.requests
        self._park(cursor, _Answered(found), None, first=True)  # applied a record a step

    def _settle_gap(self, cursor: _Cursor, question: Question, answer: Answer) -> None:
        done = cursor.stats
        done.replays_requested += answer.requests
        worker = self._worker_named(*cursor.key)
        if worker is None:
            return  # removed from the tree: its parked records count as unknown
        if question.resume_from is not None:
            cursor.reconnected = None  # the source told which stream this is
        # What the source sent is applied by later turns, a record a step, ahead of
        # the records parked behind the gap: a large answer keeps the budget too.
        if answer.reached:
            if answer.rebuilt:  # the stream from seq 0, whichever publisher sent it
                done.resyncs += 1
                self._clear(worker, cursor)
            self._park(cursor, _Answered(answer.records), None, first=True)
            return  # the gap is filled: the parked records follow
        done.resyncs += 1
        self._clear(worker, cursor)  # what a part answer brought would go with it
        if answer.snapshot is not None:
            # The parked records at or before the stamp are duplicates (``covered``).
            resynced = _Answered(answer.snapshot, covered_from=question.from_seq)
            self._park(cursor, resynced, None, first=True)
            return
        done.stale += 1
        cursor.stale = True
        cursor.resnapshot_failures = 0
        cursor.resnapshot_at = time.monotonic() + RESNAPSHOT_DELAYS[0]
        assert question.target is not None
        lost = question.target[0]
        cursor.last_error = f"records before seq {lost} lost ({answer.problem()})"
        self._log.warning(
            (cursor.key, "stale"),
            "worker (%r, dp_rank=%d): records before seq %d are lost (%s); its pages were "
            "cleared and it is stale until its view is rebuilt (a snapshot, a Cleared "
            "event or a restart)",
            cursor.key[0],
            cursor.key[1],
            lost,
            answer.problem(),
        )
        # The record that found the gap is the new baseline (the worker stays stale).
        if cursor.parked:
            record, arrived = cursor.parked.popleft()
            if arrived is not None and cursor.waiting:
                cursor.waiting.popleft()
            self._apply(record, worker, cursor)

    def _resnapshot_due(self, cursor: _Cursor) -> bool:
        """Whether a stale worker may ask for its snapshot again now."""
        if self.source is None or self._closed or time.monotonic() < cursor.resnapshot_at:
            return False
        can_snapshot = getattr(self.source, "can_snapshot", None)
        if can_snapshot is None:
            return True
        try:
            return bool(can_snapshot(*cursor.key))
        except Exception as exc:  # the source's own failure: not asked now, and said why
            cursor.resnapshot_at = time.monotonic() + RESNAPSHOT_DELAYS[-1]
            cursor.last_error = f"stale: the source's can_snapshot raised {exc!r}"
            return False

    def _settle_resnapshot(self, cursor: _Cursor, question: Question, answer: Answer) -> None:
        """A stale worker's snapshot asked again: rebuilt from it, or stale a while longer."""
        worker = self._worker_named(*cursor.key)
        if worker is None or not cursor.stale:
            return  # removed, or rebuilt meanwhile (a Cleared record, a restart)
        cursor.stats.replays_requested += answer.requests
        if answer.snapshot is None:
            failures = cursor.resnapshot_failures = cursor.resnapshot_failures + 1
            delay = RESNAPSHOT_DELAYS[min(failures, len(RESNAPSHOT_DELAYS) - 1)]
            cursor.resnapshot_at = time.monotonic() + delay
            cursor.last_error = (
                f"stale: snapshot asked again, {answer.problem()} (next try in {delay:g} s)"
            )
            self._log.warning(
                (cursor.key, "resnapshot"),
                "worker (%r, dp_rank=%d) is still stale: %s; its snapshot is asked for "
                "again in %g s",
                cursor.key[0],
                cursor.key[1],
                answer.problem(),
                delay,
            )
            return  # its parked records go on, onto the stale view, as before the try
        cursor.stats.resyncs += 1
        self._clear(worker, cursor)
        # The parked records at or before the stamp are duplicates (``covered``).
        rebuilt = _Answered(answer.snapshot, covered_from=question.from_seq)
        self._park(cursor, rebuilt, None, first=True)

    def _apply(self, record: Record, worker: Any, cursor: _Cursor) -> None:
        """One record into the tree; it moves the cursor whether or not it could apply."""
        cursor.seq, cursor.index = record.seq, record.index
        if isinstance(record, _Mark):
            return
        try:
            _apply_record(self.tree, worker, record)
        except Exception as exc:
            cursor.stats.malformed += 1
            self._failed(cursor, record, exc)
            return
        cursor.stats.applied += 1
        cursor.last_applied = time.monotonic()
        if isinstance(record, Cleared):
            cursor.stale = False  # the worker holds nothing: the view is whole again

    def _failed(self, cursor: _Cursor, record: Any, exc: Exception) -> None:
        where = "" if record is None else f" record {record.seq}.{record.index}"
        cursor.last_error = f"{where.strip() or 'answer'} skipped: {exc}"
        self._log.warning(
            (cursor.key, type(exc).__name__),
            "worker (%r, dp_rank=%d)%s skipped: %s",
            cursor.key[0],
            cursor.key[1],
            where,
            exc,
        )

    def _clear(self, worker: Any, cursor: _Cursor) -> None:
        cursor.seq, cursor.index = None, 0
        cursor.covered = None
        cursor.reconnected = None  # a point in the numbering the worker no longer has
        cursor.probed = None
        self.tree.apply_cleared(worker)

    def _worker_named(self, name: str, dp_rank: int) -> Any:
        try:
            return self.tree.worker(name, dp_rank)
        except Exception:  # not a worker of the tree (or not a valid name at all)
            return None

    # -- probes ------------------------------------------------------------------------------
    def probe(self, *, quiet: float = 0.0) -> int:
        """Ask the source, in the background, what followed each worker's last record.

        A batch lost at the end of a burst shows no gap until the worker sends
        again, and a router started after the engines went quiet has heard
        nothing: a probe asks each worker's source for its records after the
        cursor (from 0 for a worker never heard). What comes back is applied by
        the next :meth:`replay` and counted in ``replays_requested``; a quiet
        worker costs one empty answer. A find is counted in the worker's
        ``gaps`` once the live stream shows it was lost: its next live record is
        past what the probe brought, or the worker stays quiet until its next
        probe. Records published while the probe was out (in flight, or still
        queued in the subscriber's socket) arrive live afterwards, as
        duplicates, and count no gap.

        Parameters
        ----------
        quiet : float, default 0.0
            Only workers with no record arrived (and no probe sent) for this
            many seconds; others are busy, and their gaps show by themselves.

        Returns
        -------
        int
            The probes sent. Workers with a repair in flight, or whose source
            says it cannot replay them (``can_replay``), are skipped.
        """
        if self.source is None:
            return 0
        can_replay = getattr(self.source, "can_replay", None)
        now = time.monotonic()
        sent = 0
        with self._lock:
            if self._closed:
                return 0
            for w in self.tree.workers:
                key = (w.name, w.dp_rank)
                cursor = self._cursor(key)
                if cursor is None or cursor.repair is not None or cursor.parked:
                    continue
                if quiet and now - cursor.heard < quiet:
                    continue
                if cursor.stale and self._resnapshot_due(cursor):
                    # A quiet stale worker is rebuilt without waiting for its next record.
                    cursor.heard = now
                    start = 0 if cursor.seq is None else cursor.seq + 1
                    question = Question(key[0], key[1], start, None, snapshot_only=True)
                    job = _Job(cursor, question)
                    cursor.repair = job
                    self._put(job)
                    sent += 1
                    continue
                if can_replay is not None and not can_replay(*key):
                    continue
                cursor.heard = now
                if cursor.probed is not None:  # quiet since the last probe's find: lost
                    self._judge_probe(cursor, lost=True)
                    self._unreported.gaps += 1  # counted outside replay: reported by the next
                start = 0 if cursor.seq is None else cursor.seq + 1
                job = _Job(cursor, Question(key[0], key[1], start, None))
                cursor.repair = job
                self._put(job)
                sent += 1
        return sent

    # -- workers ---------------------------------------------------------------------------
    def restart(self, worker: str, dp_rank: int = 0) -> None:
        """The worker restarted (its sequence starts again): clear it and reset its cursor."""
        with self._lock:
            cursor = self._cursor((worker, dp_rank))
            if cursor is not None:
                cursor.repair = None  # an answer about the old stream is moot
                cursor.parked = deque(
                    entry for entry in cursor.parked if not isinstance(entry[0], _Answered)
                )
                cursor.answered_extra = 0
                cursor.newest = None
                tree_worker = self._worker_named(worker, dp_rank)
                if tree_worker is not None:
                    self._clear(tree_worker, cursor)
                if cursor.parked and not cursor.ready:
                    cursor.ready = True
                    self._ready.append(cursor)
                cursor.stats.restarts += 1  # the worker's count and the total agree
                self.stats.restarts += 1

    def forget(self, worker: str, dp_rank: int = 0) -> None:
        """Free a worker's cursor and its pending records (after ``remove_worker``)."""
        with self._lock:
            self._cursors.pop((worker, dp_rank), None)
            self._pending = deque(
                (r, t) for r, t in self._pending if (r.worker, r.dp_rank) != (worker, dp_rank)
            )

    def report(self, worker: str, dp_rank: int, problem: str) -> None:
        """Note what went wrong with a worker's input before it became records.

        What a subscription could not decode, or dropped as another worker's, is
        not the replayer's to count, but a person asks one place what went wrong
        last: ``lag()`` (and ``Router.health()``) show it as ``last_error``.
        Ignored for a worker of no cursor.
        """
        with self._lock:
            cursor = self._cursor((worker, dp_rank))
            if cursor is not None:
                cursor.last_error = problem

    def worker_stats(self, worker: str, dp_rank: int = 0) -> ReplayStats:
        """The counts of one worker's records, cumulative (a copy)."""
        with self._lock:
            cursor = self._cursors.get((worker, dp_rank))
            return ReplayStats() if cursor is None else dataclasses.replace(cursor.stats)

    def lag(self) -> list[WorkerLag]:
        """Per worker: the applied and newest seq, the records and seconds behind, its state."""
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
                    c.repair is not None and _is_repair(c.repair.question),
                    None if c.last_applied is None else now - c.last_applied,
                    c.last_error,
                )
                for (name, rank), c in sorted(self._cursors.items())
            ]

    @property
    def pending(self) -> int:
        """Records waiting to be applied (queued, or behind a worker's gap)."""
        with self._lock:
            return len(self._pending) + sum(c.backlog for c in self._cursors.values())

    @property
    def asking(self) -> int:
        """Questions (repairs and probes) put to the source and not answered yet."""
        return self._asking

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
                try:
                    self.replay(max_records=max_records, max_seconds=max_seconds)
                except Exception:  # never a silent death: logged, and the loop goes on
                    logger.exception("the replayer's background turn failed")

        self._thread = threading.Thread(target=loop, name="radixmeta-replayer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the background thread (if any) and wait for it, at most ``timeout`` seconds."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the background thread and the source's threads (idempotent).

        Questions still queued are dropped; the ones a source is answering end when
        the source does (a subscription's requests end as soon as it is closed), and
        are waited for at most ``timeout`` seconds. Records can still be submitted and
        replayed; a gap then resyncs as with no source.
        """
        started = time.monotonic()
        self.stop(timeout)
        with self._lock:
            self._closed = True
            self._changed.notify_all()
        self._pool.close(max(0.0, timeout - (time.monotonic() - started)))

    def __enter__(self) -> Replayer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _is_repair(question: Question) -> bool:
    """A gap's repair or a stale worker's snapshot (the worker is *repairing*), not a probe."""
    return question.target is not None or question.snapshot_only


def _follows(record: Record, cursor: _Cursor) -> bool:
    """Contiguous: a later record of the same batch, or one of the next batch.

    A batch arrives whole (it is decoded whole or dropped), so indices within
    it may skip the events a converter left out; only a sequence can have gaps.
    """
    assert cursor.seq is not None
    return record.seq == cursor.seq or record.seq == cursor.seq + 1


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

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> list[Record] | Unavailable:
        cache = self.caches.get((worker, dp_rank))
        if cache is None:
            return Unavailable("the LogSource has no cache of this worker")
        try:
            return list(cache.event_log.read(after=from_seq - 1))
        except LogTruncatedError as exc:
            return Unavailable(
                f"the log no longer holds seq {from_seq} (its oldest is {exc.oldest_seq})"
            )

    def can_snapshot(self, worker: str, dp_rank: int) -> bool:
        """Whether the source has the worker's cache (it then always serves a snapshot)."""
        return (worker, dp_rank) in self.caches

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | Unavailable:
        cache = self.caches.get((worker, dp_rank))
        if cache is None:
            return Unavailable("the LogSource has no cache of this worker")
        records = list(cache.snapshot())
        # An empty cache still says which seq it is consistent with: without it, the
        # record that found the gap would be applied on top, though the cache let it go.
        return records or [batch_mark(worker, dp_rank, cache.event_log.next_seq - 1)]
