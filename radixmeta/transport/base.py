"""What every transport hands out: messages, replay results and counters.

The transport moves ``(topic, seq, payload)`` batches and never looks inside a payload; the
codecs of :mod:`radixmeta.wire` do. ``seq`` numbers batches per publisher, from 0, one
step per batch, as vLLM and SGLang number them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = [
    "Batch",
    "Message",
    "PublisherStats",
    "ReplayLayout",
    "ReplayResult",
    "Snapshot",
    "SnapshotSource",
    "SnapshotStatus",
    "SnapshotResult",
    "SubscriberStats",
]

#: The two replay reply layouts: ``"new"`` carries the topic frame (vLLM >= 0.26,
#: SGLang >= 0.5.22), ``"old"`` does not (vLLM <= 0.25, SGLang <= 0.5.20).
ReplayLayout = Literal["new", "old"]


class Batch(NamedTuple):
    """One published batch as a publisher's buffer and a replay hold it."""

    topic: bytes
    seq: int
    payload: bytes


class Message(NamedTuple):
    """One batch received live, with the index of the endpoint it came from.

    ``source`` indexes the subscriber's ``endpoints`` (or publishers, for the in-process
    queue); for a subscriber built from one worker's :func:`dp_endpoints` it is the dp rank.
    """

    source: int
    topic: bytes
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay request brought back, in the publisher's order.

    Attributes
    ----------
    source : int
        The endpoint (or publisher) index the replay was asked of.
    start_seq : int
        The first seq asked for.
    batches : tuple of Batch
        The batches received, each with ``seq >= start_seq``. With the old reply layout,
        which carries no topic, each ``topic`` is ``b""``.
    complete : bool
        The end marker arrived: ``batches`` is all the publisher held from ``start_seq``.
    timed_out : bool
        The timeout passed before the end marker; ``batches`` is what came until then.
    layout : {"new", "old"} or None
        The reply layout the publisher used; ``None`` when nothing arrived.
    malformed : int
        Reply messages that fit neither layout; they are skipped.
    """

    source: int
    start_seq: int
    batches: tuple[Batch, ...]
    complete: bool
    timed_out: bool
    layout: ReplayLayout | None = None
    malformed: int = 0

    @property
    def first_seq(self) -> int | None:
        """The seq of the first batch received, or ``None`` when there is none."""
        return self.batches[0].seq if self.batches else None

    @property
    def skipped(self) -> int:
        """How many seqs from ``start_seq`` on the publisher no longer held.

        A request older than the publisher's buffer is answered from the oldest batch it
        still has, so ``first_seq > start_seq``: the caller has lost those batches and must
        resync by other means. 0 when the reply started where it was asked to (or is empty).
        """
        first = self.first_seq
        return 0 if first is None else max(0, first - self.start_seq)


class Snapshot(NamedTuple):
    """A worker's state as a publisher serves it: payloads consistent with batch ``seq``.

    The payloads hold the effect of every batch the publisher sent up to and including
    ``seq``, and of none after it: a subscriber that applies them and then the batches
    from ``seq + 1`` on holds what the worker holds. Their encoding is the codec's (for
    radixmeta's own, native batches whose records are named ``(seq, index)``). No payload
    may be empty; there may be none (an empty state is also encoded by the codec).
    """

    seq: int
    payloads: Sequence[bytes]


#: What a publisher calls to serve a snapshot: a :class:`Snapshot` (or a
#: ``(seq, payloads)`` pair), or ``None`` when it has none to give right now.
SnapshotSource = Callable[[], Snapshot | tuple[int, Sequence[bytes]] | None]

#: How a snapshot request ended: ``"snapshot"`` (one arrived), ``"unavailable"`` (the
#: publisher answered that it has none) or ``"timed_out"`` (no answer in time: a publisher
#: that does not serve snapshots, such as vLLM's or SGLang's, never answers).
SnapshotStatus = Literal["snapshot", "unavailable", "timed_out"]


@dataclass(frozen=True, slots=True)
class SnapshotResult:
    """What a snapshot request brought back.

    Attributes
    ----------
    source : int
        The endpoint index the snapshot was asked of.
    status : {"snapshot", "unavailable", "timed_out"}
        See :data:`SnapshotStatus`.
    seq : int or None
        The batch the snapshot is consistent with; ``None`` unless ``status`` is
        ``"snapshot"``.
    payloads : tuple of bytes
        The snapshot's payloads, in the publisher's order (empty unless a snapshot came).
    malformed : int
        Reply messages that were no snapshot reply; they are skipped.
    """

    source: int
    status: SnapshotStatus
    seq: int | None = None
    payloads: tuple[bytes, ...] = ()
    malformed: int = 0

    @property
    def available(self) -> bool:
        """Whether a snapshot arrived (``status == "snapshot"``)."""
        return self.status == "snapshot"


@dataclass(slots=True)
class PublisherStats:
    """Live counters of a publisher (plain attributes, updated in place).

    Attributes
    ----------
    messages, bytes : int
        Batches published and their payload bytes.
    replays_served : int
        Well-formed replay requests answered (each with its end marker).
    replayed_messages : int
        Batches sent in replay replies.
    malformed_requests : int
        Requests (replay or snapshot) dropped unanswered because of their framing.
    snapshots_served : int
        Snapshot requests answered with a snapshot.
    snapshots_unavailable : int
        Snapshot requests answered with "none": no ``snapshot`` callable, or it returned
        ``None``, raised, or returned something that is no snapshot.
    snapshot_errors : int
        Of those, the calls that raised or returned something that is no snapshot (each
        is logged on ``radixmeta.transport.zmq``).
    """

    messages: int = 0
    bytes: int = 0
    replays_served: int = 0
    replayed_messages: int = 0
    malformed_requests: int = 0
    snapshots_served: int = 0
    snapshots_unavailable: int = 0
    snapshot_errors: int = 0


@dataclass(slots=True)
class SubscriberStats:
    """Live counters of a subscriber (plain attributes, updated in place).

    Attributes
    ----------
    messages, bytes : int
        Live batches delivered by ``recv`` and their payload bytes.
    malformed : int
        Live messages skipped because of their framing (not 3 frames, seq not 8 bytes).
    dropped : int
        Batches the subscriber knows it lost. Only the in-process queue can know (a cursor
        that fell off the buffer); ZeroMQ drops silently, which shows as a seq gap.
    replays_requested, replayed_messages : int
        Replay requests sent and batches they brought back.
    replay_timeouts : int
        Replays that ended by timeout, before the end marker.
    replay_malformed : int
        Replay reply messages skipped because of their framing.
    snapshots_requested : int
        Snapshot requests sent.
    snapshots_unavailable : int
        Snapshot requests the publisher answered with "none".
    snapshot_timeouts : int
        Snapshot requests that got no answer in time.
    snapshot_malformed : int
        Snapshot reply messages skipped because of their framing.
    """

    messages: int = 0
    bytes: int = 0
    malformed: int = 0
    dropped: int = 0
    replays_requested: int = 0
    replayed_messages: int = 0
    replay_timeouts: int = 0
    replay_malformed: int = 0
    snapshots_requested: int = 0
    snapshots_unavailable: int = 0
    snapshot_timeouts: int = 0
    snapshot_malformed: int = 0
