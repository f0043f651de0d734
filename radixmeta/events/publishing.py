"""A radixmeta worker's side of the fleet: its EventLog on the wire, and its cache's snapshots.

:class:`LogPublisher` is what an engine built on :class:`~radixmeta.RadixCache` runs: it
publishes the records its :class:`~radixmeta.EventLog` gathers, one batch per
:meth:`~LogPublisher.flush`, encoded by :mod:`radixmeta.wire.native`, through a
:class:`~radixmeta.transport.ZmqPublisher`; and it answers snapshot requests on the replay
socket with the cache's :meth:`~radixmeta.RadixCache.snapshot`, stamped with the batch it is
consistent with. A router (:class:`~radixmeta.events.subscription.FleetSubscription`) that lost more
than the replay buffer holds then rebuilds the worker instead of clearing it.

Why the stamp is right. Records are numbered by the log; batches by the publisher. Each
flush records the last log seq it published, under a lock that the snapshot takes too. A
snapshot (atomic with respect to the cache's other calls) is consistent with the log seq it
carries; if the log holds records past the last flush up to that seq, the snapshot publishes
them first, as one batch, so that a batch ends exactly where the snapshot stands. The engine
may keep changing the cache from its own thread meanwhile: what it does after the snapshot
is in later records, so later batches.
"""

from __future__ import annotations

import threading
from typing import Any

from radixmeta._records import Cleared, Record
from radixmeta.errors import InvalidInputError, LogTruncatedError
from radixmeta.transport._closable import ClosesOnExit
from radixmeta.transport.base import Snapshot
from radixmeta.transport.zmq import ZmqPublisher
from radixmeta.wire import native

__all__ = ["LogPublisher"]

# How often a snapshot of an empty cache is taken again when the log moved during it (its
# seq is then unknown); past this the request is answered with "none" and the router
# falls back to clearing the worker.
_ATTEMPTS = 8


class LogPublisher(ClosesOnExit):
    """Publish a cache's :class:`~radixmeta.EventLog` with the native codec; serve snapshots.

    Parameters
    ----------
    cache : RadixCache
        The worker's cache, with an event log attached. Batches carry the log's ``worker``
        and ``dp_rank``, which the router's worker name must match.
    endpoint : str, optional
        Where to publish (see :class:`~radixmeta.transport.ZmqPublisher`).
    replay_endpoint : str, optional
        Where the replay ROUTER binds; it also answers snapshot requests.
    snapshots : bool, default True
        Serve snapshots on the replay socket (only with a ``replay_endpoint``).
    **publisher_options
        Passed to :class:`~radixmeta.transport.ZmqPublisher` (``topic``, ``buffer_steps``,
        ``hwm``, ``bind``, ``context``, ``sockopts``...).

    Attributes
    ----------
    cache : RadixCache
    log : EventLog
    publisher : ZmqPublisher
        Publish only through :meth:`flush`: a batch sent around it would break the stamp
        of the snapshots.

    Raises
    ------
    InvalidInputError
        The cache has no event log, or ``snapshot=`` is given (this class supplies it).

    Notes
    -----
    Thread-safe: the engine calls :meth:`flush` from its own thread, or several, while the
    replay thread serves snapshots; a lock orders the two. A snapshot costs one
    ``cache.snapshot()`` (O(nodes + tokens)) under that lock, then its encoding outside it;
    replay requests wait meanwhile.

    Examples
    --------
    >>> from radixmeta import EventLog, RadixCache
    >>> cache = RadixCache(page_size=2, event_log=EventLog(worker="w0"))
    >>> with LogPublisher(cache, "tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*") as p:
    ...     _ = cache.insert([1, 2, 3, 4])
    ...     p.flush(), p.flush()
    ...     snapshot = p.snapshot()
    (0, None)
    >>> snapshot.seq, len(native.decode_batch(snapshot.payloads[0]).records)
    (0, 1)
    """

    def __init__(
        self,
        cache: Any,
        endpoint: str | None = None,
        *,
        replay_endpoint: str | None = None,
        snapshots: bool = True,
        **publisher_options: Any,
    ) -> None:
        log = getattr(cache, "event_log", None)
        if log is None:
            msg = "LogPublisher needs a cache with an event log: RadixCache(event_log=...)"
            raise InvalidInputError(msg)
        if "snapshot" in publisher_options:
            msg = "LogPublisher serves the cache's snapshots itself: pass snapshots=True or False"
            raise InvalidInputError(msg)
        self.cache = cache
        self.log = log
        self._lock = threading.Lock()  # orders flushes and snapshots
        self._published = -1  # the last log seq a batch carried
        self._batch: int | None = None  # the seq of that batch
        serve = snapshots and replay_endpoint is not None
        self.publisher = ZmqPublisher(
            endpoint,
            replay_endpoint=replay_endpoint,
            snapshot=self.snapshot if serve else None,
            **publisher_options,
        )

    def flush(self) -> int | None:
        """Publish what the log recorded since the last flush, as one batch.

        If the log dropped records before a flush published them (its capacity is too
        small for the flush interval), the batch is a resync instead: ``Cleared``, then
        the cache's snapshot, so every subscriber rebuilds the worker.

        Returns
        -------
        int or None
            The batch's seq; ``None`` when there was nothing to publish (or a resync
            found the cache changing too fast to take; the next flush tries again).

        Raises
        ------
        TransportClosedError
            The publisher is closed.
        """
        with self._lock:
            try:
                records = self.log.read(after=self._published)
            except LogTruncatedError:
                taken = self._take()
                return None if taken is None else self._publish_resync(*taken)
            return self._publish(records)

    def snapshot(self) -> Snapshot | None:
        """The cache's records as one native payload, stamped with the batch they match.

        The callable the replay socket calls for each snapshot request (safe from any
        thread). It may first publish the records that the cache holds and no batch has
        carried yet. Returns ``None`` (the request is answered with "none") before the
        first batch, or when an empty cache's seq could not be pinned down.
        """
        with self._lock:
            taken = self._take()
            if taken is None:
                return None
            records, stamp = taken
            if stamp > self._published:
                try:
                    self._publish(self.log.read(after=self._published), through=stamp)
                except LogTruncatedError:
                    self._publish_resync(records, stamp)
            if self._batch is None:
                return None
            batch = self._batch
        # Encoded outside the lock: the records are copies, and flushes need not wait.
        return Snapshot(batch, (self._encode(records),))

    def _take(self) -> tuple[list[Record], int] | None:
        """A snapshot of the cache and the log seq it is consistent with, or None."""
        for _ in range(_ATTEMPTS):
            before = self.log.next_seq
            records = list(self.cache.snapshot())
            if records:
                return records, records[0].seq  # stamped in the same atomic call
            if self.log.next_seq == before:  # nothing was logged around it
                return records, before - 1
        return None

    def _publish(self, records: list[Record], through: int | None = None) -> int | None:
        if through is not None:
            records = [r for r in records if r.seq <= through]
        if not records:
            return None
        seq = self.publisher.publish(self._encode(records))
        self._published, self._batch = records[-1].seq, seq
        return seq

    def _publish_resync(self, records: list[Record], stamp: int) -> int:
        barrier = Cleared(self.log.worker, self.log.dp_rank, stamp, 0)
        seq = self.publisher.publish(self._encode([barrier, *records]))
        self._published, self._batch = stamp, seq
        return seq

    def _encode(self, records: list[Record]) -> bytes:
        return native.encode_batch(records, worker=self.log.worker, dp_rank=self.log.dp_rank)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self.publisher.closed

    def close(self) -> None:
        """Close the publisher (idempotent, bounded)."""
        self.publisher.close()

    def __repr__(self) -> str:
        return (f"LogPublisher({self.publisher.endpoint!r}, worker={self.log.worker!r}, "
                f"dp_rank={self.log.dp_rank}, published={self._published})")
