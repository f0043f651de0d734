"""In-process transport: the same batches, seqs and replay rules as ZeroMQ, with no socket.

For the simulator and for tests of whatever consumes a transport (the replayer): a
:class:`QueuePublisher` numbers batches from 0 into a bounded buffer, exactly as
:class:`~radixmeta.transport.zmq.ZmqPublisher` does, and a :class:`QueueSubscriber` reads
one or several publishers (one per dp rank, say) through the interface of
:class:`~radixmeta.transport.zmq.ZmqSubscriber`: ``recv`` gives a
:class:`~radixmeta.transport.base.Message`, ``replay`` a
:class:`~radixmeta.transport.base.ReplayResult`.

The buffer is the only queue. A subscriber keeps a cursor into it; if it reads too slowly
and its cursor falls off the oldest batch, it resumes at the oldest one and the seq jumps,
which is how a ZeroMQ subscriber past its high-water mark sees lost batches, except that
here the loss is also counted (``stats.dropped``). Publishing never blocks.

Example
-------
>>> pub = QueuePublisher(topic=b"kv@w0", buffer_steps=2)
>>> sub = pub.subscribe()
>>> [pub.publish(p) for p in (b"a", b"b", b"c")]
[0, 1, 2]
>>> sub.recv(timeout=0)       # seq 0 fell off a 2-batch buffer: the reader sees seq 1
Message(source=0, topic=b'kv@w0', seq=1, payload=b'b')
>>> sub.replay(0, 0).skipped  # a replay from 0 starts later, too
1
>>> sub.close(); pub.close()
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from radixmeta.errors import InvalidInputError, TransportClosedError
from radixmeta.transport._buffer import ReplayBuffer
from radixmeta.transport._closable import ClosesOnExit
from radixmeta.transport._frames import check_payload, check_seq, check_timeout, check_topic
from radixmeta.transport.base import (
    Batch,
    Message,
    PublisherStats,
    ReplayResult,
    SubscriberStats,
)

__all__ = ["QueuePublisher", "QueueSubscriber"]


class QueuePublisher(ClosesOnExit):
    """A bounded, thread-safe, in-process publisher of numbered batches.

    Parameters
    ----------
    topic : bytes, default b""
        The topic every batch carries.
    buffer_steps : int, default 10_000
        How many of the latest batches are kept for subscribers and replay.

    Attributes
    ----------
    topic : bytes
    stats : PublisherStats
        Live counters.
    """

    def __init__(self, *, topic: bytes = b"", buffer_steps: int = 10_000) -> None:
        self.topic = check_topic(topic)
        # restart() swaps in a new buffer; a reader finishes the old one, then starts the
        # new one at seq 0, as a ZeroMQ subscriber still holds what was sent before.
        self._buffer = ReplayBuffer(buffer_steps)
        self._lock = threading.Lock()
        self._listeners: set[threading.Event] = set()
        self._closed = False
        self.stats = PublisherStats()

    @property
    def buffer_steps(self) -> int:
        """How many batches the buffer keeps."""
        return self._buffer.capacity

    @property
    def next_seq(self) -> int:
        """The seq of the next batch published."""
        return self._buffer.next_seq

    @property
    def oldest_seq(self) -> int:
        """The oldest seq still held (equals :attr:`next_seq` when nothing is held)."""
        return self._buffer.oldest_seq

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def publish(self, payload: bytes) -> int:
        """Append one batch and return its seq. O(1); never blocks on slow readers.

        Raises
        ------
        InputTypeError, InvalidInputError
            ``payload`` is not bytes-like, or is empty (see :func:`check_payload`).
        TransportClosedError
            The publisher is closed.
        """
        data = check_payload(payload)
        with self._lock:
            if self._closed:
                msg = "publish on a closed QueuePublisher"
                raise TransportClosedError(msg)
            seq = self._buffer.append(data)
            self.stats.messages += 1
            self.stats.bytes += len(data)
            listeners = list(self._listeners)
        for wake in listeners:  # outside the lock: a reader never waits on a publisher
            wake.set()
        return seq

    def replay(self, start_seq: int) -> tuple[Batch, ...]:
        """Return every held batch with ``seq >= start_seq``, oldest first.

        A ``start_seq`` older than the buffer starts at the oldest batch held: the first
        seq is then later than asked, so the caller sees what it lost.
        O(batches returned).
        """
        check_seq(start_seq)
        with self._lock:
            items = self._buffer.read(start_seq)
            self.stats.replays_served += 1
            self.stats.replayed_messages += len(items)
        return tuple(Batch(self.topic, seq, payload) for seq, payload in items)

    def subscribe(self, *, start_seq: int | None = None) -> QueueSubscriber:
        """Return a subscriber to this publisher alone (see :class:`QueueSubscriber`)."""
        return QueueSubscriber(self, start_seq=start_seq)

    def restart(self) -> None:
        """Act as a restarted engine: empty the buffer and number from 0 again.

        Subscribers keep reading: after what they had not read yet, the next batch they
        get has seq 0, lower than the last one, which is how a restart shows on the wire.
        """
        with self._lock:
            self._buffer = ReplayBuffer(self._buffer.capacity)
            listeners = list(self._listeners)
        for wake in listeners:
            wake.set()

    def close(self) -> None:
        """Refuse further publishes. Subscribers may still read what is held. Idempotent."""
        with self._lock:
            self._closed = True
            listeners = list(self._listeners)
        for wake in listeners:
            wake.set()

    # -- used by QueueSubscriber -----------------------------------------------------------
    def _attach(self, wake: threading.Event) -> tuple[ReplayBuffer, int]:
        """Register a reader's wake-up event; return ``(buffer, next_seq)`` at this moment."""
        with self._lock:
            self._listeners.add(wake)
            return self._buffer, self._buffer.next_seq

    def _detach(self, wake: threading.Event) -> None:
        with self._lock:
            self._listeners.discard(wake)

    def _read_one(
        self, buffer: ReplayBuffer, cursor: int
    ) -> tuple[ReplayBuffer, int, tuple[int, bytes] | None]:
        """Return ``(buffer, cursor, batch)`` for a reader at ``cursor`` of ``buffer``.

        A reader of a buffer from before a restart reads it to its end, then continues at
        seq 0 of the current one.
        """
        with self._lock:
            current = self._buffer
        if buffer is not current:
            items = buffer.read(cursor, limit=1)
            if items:
                return buffer, cursor, items[0]
            buffer, cursor = current, 0
        items = buffer.read(cursor, limit=1)
        return buffer, cursor, items[0] if items else None


class QueueSubscriber(ClosesOnExit):
    """Reads one or several :class:`QueuePublisher` in order, with replay.

    Each publisher's batches come in seq order; across publishers ``recv`` takes them in
    turn, so one busy publisher does not starve the others. Thread-safe.

    Parameters
    ----------
    publishers : QueuePublisher or sequence of QueuePublisher
        The sources; ``Message.source`` is the index into this sequence.
    topic : bytes, default b""
        Topic prefix filter: a publisher whose topic does not start with it is not read.
    start_seq : int, optional
        Read from this seq of every publisher (a late joiner catching up). By default a
        subscriber sees only what is published after it subscribed, like a ZeroMQ SUB.

    Attributes
    ----------
    publishers : tuple of QueuePublisher
    topic : bytes
    stats : SubscriberStats
        Live counters; ``dropped`` counts batches that fell off a buffer before this
        subscriber read them.
    """

    def __init__(
        self,
        publishers: QueuePublisher | Sequence[QueuePublisher],
        *,
        topic: bytes = b"",
        start_seq: int | None = None,
    ) -> None:
        pubs = (publishers,) if isinstance(publishers, QueuePublisher) else tuple(publishers)
        if not pubs or not all(isinstance(p, QueuePublisher) for p in pubs):
            msg = "publishers must be a QueuePublisher or a non-empty sequence of them"
            raise InvalidInputError(msg)
        if start_seq is not None:
            check_seq(start_seq)
        self.publishers = pubs
        self.topic = check_topic(topic)
        self.stats = SubscriberStats()
        self._wake = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._next_source = 0  # round-robin start
        self._active = [p.topic.startswith(self.topic) for p in pubs]
        self._buffers: list[ReplayBuffer | None] = [None] * len(pubs)
        self._cursors = [0] * len(pubs)
        for i, pub in enumerate(pubs):
            if self._active[i]:
                self._buffers[i], next_seq = pub._attach(self._wake)
                self._cursors[i] = next_seq if start_seq is None else start_seq

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def recv(self, timeout: float | None = None) -> Message | None:
        """Return the next batch, or ``None`` after ``timeout`` seconds or once closed.

        Parameters
        ----------
        timeout : float or None, default None
            Seconds to wait; 0 polls; ``None`` waits until a batch comes or the subscriber
            is closed (from another thread).

        Complexity: O(number of publishers) per call.
        """
        limit = check_timeout(timeout)
        deadline = None if limit is None else time.monotonic() + limit
        while True:
            self._wake.clear()  # before looking, so a publish after the look wakes us
            with self._lock:
                if self._closed:
                    return None
                message = self._take()
            if message is not None:
                self._wake.set()  # another thread waiting on this subscriber re-checks
                return message
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return None
            self._wake.wait(remaining)

    def replay(
        self, source: int, start_seq: int, *, timeout: float | None = None
    ) -> ReplayResult:
        """Ask publisher ``source`` for its held batches from ``start_seq`` on.

        Always complete (the queue cannot lose a reply); ``timeout`` is accepted for
        the same call shape as :meth:`ZmqSubscriber.replay`. The live cursor is unchanged.
        """
        check_timeout(timeout)
        if isinstance(source, bool) or not isinstance(source, int):
            msg = f"source must be an int index, got {type(source).__name__}"
            raise InvalidInputError(msg)
        if not 0 <= source < len(self.publishers):
            msg = f"source {source} is outside [0, {len(self.publishers)})"
            raise InvalidInputError(msg)
        if self._closed:
            msg = "replay on a closed QueueSubscriber"
            raise TransportClosedError(msg)
        batches = self.publishers[source].replay(start_seq)
        self.stats.replays_requested += 1
        self.stats.replayed_messages += len(batches)
        return ReplayResult(source, start_seq, batches, complete=True, timed_out=False,
                            layout="new")

    def close(self) -> None:
        """Stop reading; a ``recv`` blocked in another thread returns ``None``. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for pub, active in zip(self.publishers, self._active, strict=True):
            if active:
                pub._detach(self._wake)
        self._wake.set()

    def _take(self) -> Message | None:
        """Return the next batch of the first publisher in turn that has one (lock held)."""
        count = len(self.publishers)
        for step in range(count):
            i = (self._next_source + step) % count
            pub, buffer = self.publishers[i], self._buffers[i]
            if buffer is None:  # not read: its topic does not match
                continue
            buffer, cursor, item = pub._read_one(buffer, self._cursors[i])
            self._buffers[i] = buffer
            if item is None:
                self._cursors[i] = cursor
                continue
            seq, payload = item
            self.stats.dropped += seq - cursor  # > 0 when the cursor fell off the buffer
            self._cursors[i] = seq + 1
            self._next_source = i + 1
            self.stats.messages += 1
            self.stats.bytes += len(payload)
            return Message(i, pub.topic, seq, payload)
        return None
