"""Asking a worker's source for what the router lost: gap repairs and tail probes.

The :class:`~radixmeta.events.Replayer` decides *what* to ask (under its lock); this module
*asks* (on a thread of its own, holding no lock), and hands back an :class:`Answer` that
the replayer applies at its next turn. Two kinds of question:

* a **gap**: the records from ``from_seq`` up to, not including, the record that found the
  gap (``target``). A source may answer in part (a replay that timed out): what it sent
  is kept and the rest asked for again, a few times; if the answer still does not reach
  the target, a snapshot is asked for;
* a **probe**: whatever the source holds from ``from_seq`` on (``target`` None), asked
  once, to find batches lost at the tail of a burst, which show no gap until the worker
  sends again;
* a **snapshot** alone (``snapshot_only``): a worker left stale by a repair that failed
  asks for its snapshot again, now and then, to be rebuilt (see
  :data:`~radixmeta.events.replay.RESNAPSHOT_DELAYS`).

Nothing here raises for what a source does: a source that returns None, returns an
:class:`Unavailable` (which says why), or raises, is a source that could not help, and
the answer says why in words a person reads in the log and in ``Router.health()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from radixmeta._records import Record

__all__ = ["ATTEMPTS", "Answer", "Question", "Unavailable", "ask"]

#: Replay requests per gap before a snapshot is asked for.
ATTEMPTS = 3


class Unavailable(NamedTuple):
    """A source's answer "I cannot", with the reason (``"no replay endpoint"``...).

    A :class:`~radixmeta.events.ReplaySource` may return it from ``replay`` or ``snapshot``
    instead of None, so that the log and ``Router.health()`` say why a worker went stale.
    """

    reason: str


@dataclass(frozen=True)
class Question:
    """What to ask one worker's source: a gap (``target`` set) or a probe (``target`` None)."""

    worker: str
    dp_rank: int
    from_seq: int
    target: tuple[int, int] | None  # the (seq, index) that found the gap
    # A gap right after a reconnect may be a restart whose first batches were missed:
    # asked from seq 0 first, and from here (the cursor's next) if the source no longer
    # holds seq 0 (a publisher older than its buffer: the same stream, gone on).
    resume_from: int | None = None
    # Only the snapshot: a stale worker asking again to be rebuilt (no replay first).
    snapshot_only: bool = False


@dataclass
class Answer:
    """What the source said.

    Attributes
    ----------
    records : list of Record
        A gap's records from ``from_seq`` on, contiguous, all before the target; a probe's,
        as the source sent them.
    requests : int
        Replay requests made.
    reached : bool
        The records reach the target (the gap is filled).
    snapshot : list of Record or None
        The snapshot, when the gap could not be filled and the source served one.
    replay_problem, snapshot_problem : str or None
        Why the replay (or the snapshot) did not help.
    rebuilt : bool
        A question with ``resume_from``: the records go from seq 0 (the worker is
        to be cleared and rebuilt from them, a restart or not).
    """

    records: list[Record] = field(default_factory=list)
    requests: int = 0
    reached: bool = False
    snapshot: list[Record] | None = None
    replay_problem: str | None = None
    snapshot_problem: str | None = None
    rebuilt: bool = False

    def problem(self) -> str:
        """Both reasons as one phrase, for a log line (only the snapshot's, if only it was)."""
        parts = []
        if self.replay_problem is not None or self.snapshot_problem is None:
            parts.append(f"replay: {self.replay_problem or 'it did not reach the gap'}")
        if self.snapshot_problem is not None:
            parts.append(f"snapshot: {self.snapshot_problem}")
        return "; ".join(parts)


def ask(source: Any, question: Question) -> Answer:
    """Put ``question`` to ``source`` (a ReplaySource); never raises for what it does."""
    answer = Answer()
    if question.snapshot_only:
        answer.snapshot, answer.snapshot_problem = _snapshot(source, question)
        return answer
    if question.target is None:
        _probe(source, question, answer)
        return answer
    _fill(source, question, answer)
    if question.resume_from is not None:
        if answer.reached:
            answer.rebuilt = True
        elif not answer.records:
            # Seq 0 is gone (a publisher that has run past its buffer, so not one that
            # just restarted) or the source could not say: taken for the same stream,
            # whose gap is repaired from the cursor as any other.
            resumed = Question(
                question.worker, question.dp_rank, question.resume_from, question.target
            )
            requests = answer.requests
            answer = Answer()
            _fill(source, resumed, answer)
            answer.requests += requests
    if not answer.reached:
        answer.snapshot, answer.snapshot_problem = _snapshot(source, question)
    return answer


def _probe(source: Any, q: Question, answer: Answer) -> None:
    answer.requests += 1
    got, problem = _replay(source, q.worker, q.dp_rank, q.from_seq)
    if got is None:
        answer.replay_problem = problem
        return
    answer.records = [r for r in got if r.seq >= q.from_seq]


def _fill(source: Any, q: Question, answer: Answer) -> None:
    assert q.target is not None
    target = q.target
    last: tuple[int, int] | None = None
    wanted = q.from_seq
    for _ in range(ATTEMPTS):
        answer.requests += 1
        got, problem = _replay(source, q.worker, q.dp_rank, wanted)
        if got is None:
            answer.replay_problem = problem
            return
        if not got:
            answer.replay_problem = f"the source holds nothing from seq {wanted}"
            return
        if got[0].seq > wanted:
            answer.replay_problem = (
                f"the source's answer from seq {wanted} starts at seq {got[0].seq} (what "
                "comes before is gone from its buffer, or did not decode)"
            )
            return
        before = last
        for record in got:
            position = (record.seq, record.index)
            if position >= target:
                break
            if last is not None and position <= last:
                continue  # sent again in a later answer
            if last is not None and record.seq > last[0] + 1:
                # A hole inside one answer (a batch the source could not decode and
                # skipped): asked again, the source would send the same hole.
                answer.replay_problem = (
                    f"the source's answer skips seq {last[0] + 1}"
                    f"{'' if record.seq == last[0] + 2 else f'..{record.seq - 1}'} "
                    "(gone from its buffer, or did not decode)"
                )
                return
            answer.records.append(record)
            last = position
        if last is not None and target[0] in (last[0], last[0] + 1):
            answer.reached = True
            return
        if last == before:
            answer.replay_problem = f"the source's answer from seq {wanted} did not go on"
            return
        assert last is not None
        wanted = last[0] + 1  # a part came (a replay that timed out): ask for the rest
    answer.replay_problem = f"{ATTEMPTS} replay requests did not reach seq {target[0]}"


def _replay(source: Any, worker: str, rank: int, start: int) -> tuple[list[Record] | None, str]:
    try:
        got = source.replay(worker, rank, start)
    except Exception as exc:  # a source's failure is a source that could not help
        return None, f"the replay request failed: {exc!r}"
    if isinstance(got, Unavailable):
        return None, got.reason
    if got is None:
        return None, "the source cannot replay it"
    return list(got), ""


def _snapshot(source: Any, q: Question) -> tuple[list[Record] | None, str | None]:
    try:
        got = source.snapshot(q.worker, q.dp_rank)
    except Exception as exc:
        return None, f"the snapshot request failed: {exc!r}"
    if isinstance(got, Unavailable):
        return None, got.reason
    if got is None:
        return None, "no snapshot"
    snapshot = list(got)
    if not snapshot:
        return None, "the snapshot names no seq (an empty answer without its mark)"
    return snapshot, None
