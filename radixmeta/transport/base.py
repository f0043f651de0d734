"""What every transport hands out: messages, replay results and counters.

The transport moves ``(topic, seq, payload)`` batches and never looks inside a payload; the
codecs of :mod:`radixmeta.wire` do. ``seq`` numbers batches per publisher, from 0, one
step per batch, as vLLM and SGLang number them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

__all__ = [
    "Batch",
    "Message",
    "PublisherStats",
    "ReplayLayout",
    "ReplayResult",
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
        Replay requests dropped unanswered because of their framing.
    """

    messages: int = 0
    bytes: int = 0
    replays_served: int = 0
    replayed_messages: int = 0
    malformed_requests: int = 0


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
    """

    messages: int = 0
    bytes: int = 0
    malformed: int = 0
    dropped: int = 0
    replays_requested: int = 0
    replayed_messages: int = 0
    replay_timeouts: int = 0
    replay_malformed: int = 0
