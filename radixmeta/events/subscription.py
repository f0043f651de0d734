"""Point a router at a live fleet: KV-event streams in, an up-to-date MetaTree out.

:class:`FleetSubscription` subscribes to every worker's stream (one ZeroMQ SUB
endpoint per dp rank), decodes each batch with the engine's codec, turns it into
records and feeds a :class:`~radixmeta.events.Replayer`, which applies them to the
:class:`~radixmeta.MetaTree` and repairs gaps through the workers' replay
sockets. It is what ``radixmeta listen`` runs.

Nothing a worker sends stops the stream. A batch is filed under the worker and
rank of the endpoint it arrived on: a native batch that names another is counted
(``identity_mismatch``) and dropped; an engine batch whose dp rank field differs is
counted and kept under the endpoint's rank. So each worker (and rank) needs an endpoint of
its own: the central-indexer layout, many publishers connected to one bound
endpoint, is for a bare :class:`~radixmeta.transport.ZmqSubscriber` only. A batch
that does not decode, or that fails in any other way, is dropped whole and counted
per worker (logged at a bounded rate); the next batch of that worker then shows a
gap at its seq, so the replayer asks for it again.

A gap older than a worker's replay buffer is resynced from a snapshot when the
worker serves one (radixmeta's own publisher,
:class:`~radixmeta.events.publishing.LogPublisher`); a vLLM or SGLang worker is never
asked, and is cleared and marked stale until its view is rebuilt instead.

Restarts: the subscriber's socket monitor sees each publisher connect; after a
publisher connects again, the replayer is told (:meth:`Replayer.reconnected`), and a
seq at or below the last applied then starts a new stream rather than being taken for
a duplicate.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from radixmeta._keys import check_int, check_seconds
from radixmeta._records import Record
from radixmeta.errors import DecodeError, InvalidInputError, TransportClosedError
from radixmeta.events._throttle import ThrottledLog
from radixmeta.events.ingest import BatchConverter
from radixmeta.events.replay import (
    DEFAULT_MAX_PENDING,
    Replayer,
    ReplayStats,
    Unavailable,
    batch_mark,
)
from radixmeta.meta import MetaTree
from radixmeta.transport import SnapshotResult, ZmqSubscriber, dp_endpoints
from radixmeta.wire import native, sglang, vllm

__all__ = ["CODECS", "FleetSubscription", "IntakeCounts", "WorkerEndpoint", "check_ports"]

logger = logging.getLogger("radixmeta.subscription")

CODECS: Mapping[str, Callable[[bytes], Any]] = {
    "vllm": vllm.decode_batch,
    "sglang": sglang.decode_batch,
    "native": native.decode_batch,
}


_SPEC = "NAME=ENDPOINT[,replay=ENDPOINT][,snapshot=yes|no]"
_SWITCH = {"yes": True, "no": False}


@dataclass(frozen=True)
class WorkerEndpoint:
    """One worker's streams: its name, live endpoint (rank 0's) and replay endpoint.

    With ``dp_size > 1`` rank ``r`` listens on the base port plus ``r`` (vLLM's and
    SGLang's rule), for the live and the replay endpoint alike: leave ``dp_size``
    ports free after each base (replay port >= live port + dp_size, or below the live
    port by as much), or two ranks share a port (:func:`check_ports`).

    ``snapshot`` says whether the worker's replay socket serves snapshots (radixmeta's
    extension of the protocol): ``None``, the default, leaves it to the codec (a
    ``"native"`` worker with a replay endpoint is asked, a vLLM or SGLang one never);
    ``False`` never asks (a radixmeta publisher older than snapshots); ``True`` needs a
    replay endpoint and the native codec.
    """

    name: str
    endpoint: str
    replay: str | None = None
    dp_size: int = 1
    snapshot: bool | None = None

    def __post_init__(self) -> None:
        if self.snapshot and self.replay is None:
            msg = f"worker {self.name!r}: snapshots are asked on the replay endpoint; give one"
            raise InvalidInputError(msg)

    @classmethod
    def parse(cls, spec: str, dp_size: int = 1) -> WorkerEndpoint:
        """Parse ``NAME=ENDPOINT[,replay=ENDPOINT][,snapshot=yes|no]`` (``--worker``)."""
        name, sep, rest = spec.partition("=")
        if not sep or not name or not rest:
            msg = f"a worker is {_SPEC}, got {spec!r}"
            raise InvalidInputError(msg)
        endpoint, *options = rest.split(",")
        replay = None
        snapshot = None
        for option in options:
            key, _, value = option.partition("=")
            if key == "replay" and value:
                replay = value
            elif key == "snapshot" and value in _SWITCH:
                snapshot = _SWITCH[value]
            else:
                msg = (f"unknown worker option {option!r} in {spec!r} "
                       "(replay=ENDPOINT or snapshot=yes|no)")
                raise InvalidInputError(msg)
        return cls(name, endpoint, replay, dp_size, snapshot)

    def endpoints(self) -> list[tuple[int, str, str | None]]:
        """``(rank, live, replay)`` for each dp rank, by the base-port-plus-rank rule."""
        live = dp_endpoints(self.endpoint, self.dp_size)
        replay = dp_endpoints(self.replay, self.dp_size) if self.replay else [None] * self.dp_size
        return [(rank, e, r) for rank, (e, r) in enumerate(zip(live, replay, strict=True))]


def check_ports(workers: Sequence[WorkerEndpoint]) -> None:
    """Refuse a layout in which two streams (live or replay, any rank) share an endpoint.

    vLLM and SGLang add the dp rank to the live and the replay port alike, so a
    replay port of live + 1 collides at ``dp_size`` 2: rank 1's live port is rank 0's
    replay port (vLLM then fails with "Address already in use"). Ephemeral ports
    (``:0``, ``:*``) are not checked.

    Raises
    ------
    InvalidInputError
        Two endpoints are the same; the message names both and the fix.
    """
    seen: dict[str, str] = {}
    for w in workers:
        for rank, live, replay in w.endpoints():
            for kind, endpoint in (("live", live), ("replay", replay)):
                if endpoint is None or endpoint.endswith((":0", ":*")):
                    continue
                what = f"worker {w.name!r} rank {rank}'s {kind} endpoint"
                other = seen.get(endpoint)
                if other is not None:
                    msg = (
                        f"{what} {endpoint} is also {other}: with dp_size {w.dp_size} each "
                        f"rank adds its rank to both ports, so leave {w.dp_size} ports "
                        "between a worker's live and replay base ports (e.g. replay = live + "
                        f"{max(w.dp_size, 2)}... or a separate range)"
                    )
                    raise InvalidInputError(msg)
                seen[endpoint] = what


@dataclass
class IntakeCounts:
    """Per worker and rank: batches received and those that never became records.

    Attributes
    ----------
    batches : int
        Batches received (live, replayed, probed).
    decode_errors : int
        Batches that did not decode (live, replayed or of a snapshot).
    identity_mismatch : int
        Batches that named another worker or rank than the endpoint they came on.
    failures : int
        Batches that failed in any other way (a converter or record error): dropped,
        as one that does not decode.
    """

    batches: int = 0
    decode_errors: int = 0
    identity_mismatch: int = 0
    failures: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class FleetSubscription:
    """Subscribe to a fleet's KV events and keep a MetaTree of what each worker holds.

    Parameters
    ----------
    workers : sequence of WorkerEndpoint
        Their endpoints must not collide (:func:`check_ports`).
    codec : {"vllm", "sglang", "native"}
        How the payloads are encoded.
    block_size : int
        The engines' block size, which becomes the tree's page size.
    topic : bytes, default b""
        The topic prefix to subscribe to.
    tiers : mapping, optional
        Medium to tier (see :class:`~radixmeta.events.ingest.BatchConverter`).
    replay_timeout : float, default 1.0
        Seconds a replay request may take.
    snapshot_timeout : float, optional
        Seconds a snapshot request may take; default ``replay_timeout``. One that times
        out, is refused or does not decode is counted (``snapshot_failures``) and the
        worker is cleared and marked stale, as one that serves no snapshot.
    restart_window : int, default 16
        See :class:`~radixmeta.events.Replayer`.
    max_pending : int, default 65536
        See :class:`~radixmeta.events.Replayer`.
    replayer : Replayer, optional
        Feed this replayer (and its tree, whose page size must be
        ``block_size``) instead of a tree and replayer of the subscription's
        own: how a :class:`~radixmeta.Router` subscribes. Its owner registers
        the workers in the tree, sets where it asks for replays (this
        subscription is a :class:`~radixmeta.events.ReplaySource` for its
        workers) and chose its ``restart_window`` and ``max_pending``, so those
        arguments are unused.
    on_close : callable, optional
        Called once, with the subscription, after ``close`` closed its sockets: how
        the router it feeds detaches it (stops polling it and asking it for gaps).
    **subscriber_options
        Passed to :class:`~radixmeta.transport.ZmqSubscriber` (``hwm``, ``context``...).

    Attributes
    ----------
    tree : MetaTree
    replayer : Replayer
        Its source is this subscription (:meth:`replay`, :meth:`snapshot`).
    subscriber : ZmqSubscriber
    sources : list of (str, int)
        ``(worker, dp_rank)`` per endpoint index.
    serves_snapshots : list of bool
        Per endpoint index, whether a gap past its buffer asks it for a snapshot.
    intake : dict
        ``(worker, dp_rank) -> IntakeCounts``.
    decode_errors, snapshot_failures : int
        Batches (live, replayed or of a snapshot) that did not decode, over every
        worker; snapshots asked for that did not come, were refused or did not decode.
    """

    def __init__(
        self,
        workers: Sequence[WorkerEndpoint],
        *,
        codec: str,
        block_size: int,
        topic: bytes = b"",
        tiers: Mapping[str | None, int] | None = None,
        replay_timeout: float = 1.0,
        snapshot_timeout: float | None = None,
        restart_window: int = 16,
        max_pending: int = DEFAULT_MAX_PENDING,
        replayer: Replayer | None = None,
        on_close: Callable[[FleetSubscription], object] | None = None,
        **subscriber_options: Any,
    ) -> None:
        if codec not in CODECS:
            msg = f"codec must be one of {', '.join(CODECS)}, got {codec!r}"
            raise InvalidInputError(msg)
        if not workers:
            msg = "a subscription needs at least one worker"
            raise InvalidInputError(msg)
        for w in workers:
            if w.snapshot and codec != "native":
                # vLLM and SGLang keep no snapshot: asking would only cost the timeout.
                msg = f"worker {w.name!r}: only the native codec's publishers serve snapshots"
                raise InvalidInputError(msg)
        check_ports(workers)
        if replayer is not None and replayer.tree.page_size != block_size:
            msg = (
                f"block_size {block_size} differs from the page size "
                f"{replayer.tree.page_size} of the replayer's tree"
            )
            raise InvalidInputError(msg)
        self.replay_timeout = check_seconds("replay_timeout", replay_timeout)
        self.snapshot_timeout = (
            self.replay_timeout
            if snapshot_timeout is None
            else check_seconds("snapshot_timeout", snapshot_timeout)
        )
        restart_window = check_int("restart_window", restart_window, 0)
        max_pending = check_int("max_pending", max_pending, 1)
        self.codec = codec
        self._decode = CODECS[codec]
        self.tree = MetaTree(block_size) if replayer is None else replayer.tree
        self.decode_errors = 0
        self.snapshot_failures = 0
        # One subscriber over every (worker, rank) endpoint; a message's source
        # index names its worker and rank.
        self.sources: list[tuple[str, int]] = []
        live: list[str] = []
        replays: list[str | None] = []
        self.serves_snapshots: list[bool] = []  # per source: whether to ask it for one
        dp_sizes: list[int] = []
        for w in workers:
            # Unless the worker says, a native one is asked and no other (they keep none).
            declared = codec == "native" if w.snapshot is None else w.snapshot
            asks = declared and w.replay is not None
            for rank, endpoint, replay in w.endpoints():
                self.sources.append((w.name, rank))
                live.append(endpoint)
                replays.append(replay)
                self.serves_snapshots.append(asks)
                dp_sizes.append(w.dp_size)
        if len(set(self.sources)) != len(self.sources):
            msg = "each worker may be given once (a name and its ranks are one stream each)"
            raise InvalidInputError(msg)
        self._index = {key: i for i, key in enumerate(self.sources)}
        self._dp_sizes = dp_sizes
        self.converters = {key: BatchConverter(block_size, tiers=tiers) for key in self.sources}
        self.intake = {key: IntakeCounts() for key in self.sources}
        # The poll thread and the replayer's repair threads both decode and convert (live
        # and replayed batches): the counts they move, and the converters', are shared.
        # Held only while a batch is decoded and counted, never over a socket wait.
        self._counting = threading.RLock()
        self._log = ThrottledLog(logger)
        self.subscriber = ZmqSubscriber(
            live, topic=topic, replay_endpoints=replays, **subscriber_options
        )
        if replayer is None:  # else the replayer's owner registered its workers
            for name, rank in self.sources:
                self.tree.add_worker(name, rank)
        self._owns_replayer = replayer is None
        if replayer is None:
            replayer = Replayer(
                self.tree, source=self, restart_window=restart_window, max_pending=max_pending
            )
        self.replayer = replayer
        self._connections = [0] * len(self.sources)  # per source: connections seen so far
        self._on_close = on_close

    # -- receiving ---------------------------------------------------------------------------
    def poll(self, timeout: float | None = 0.0, *, max_messages: int | None = None) -> int:
        """Receive what has arrived (waiting up to ``timeout`` for the first); returns messages.

        Never raises for what a worker sends: each batch that fails is counted and
        dropped (see :attr:`intake`). Returns 0 once the subscription is closed.
        """
        received = 0
        wait = timeout
        while max_messages is None or received < max_messages:
            try:
                message = self.subscriber.recv(timeout=wait)
            except TransportClosedError:
                break
            if message is None:
                break
            received += 1
            wait = 0.0  # drain what is queued, without waiting again
            self._take(message.source, message.seq, message.payload)
        return received

    def _take(self, index: int, seq: int, payload: bytes) -> None:
        """One live batch into the replayer; whatever fails is counted, never raised."""
        name, rank = self.sources[index]
        try:
            connections = self.subscriber.connections[index]
            if connections > self._connections[index]:
                if self._connections[index] > 0:  # connected again: perhaps a new stream
                    self.replayer.reconnected(name, rank)
                self._connections[index] = connections
            records = self._records(name, rank, seq, payload)
            if records is not None:
                self.replayer.submit_batch(name, rank, seq, records)
        except Exception as exc:  # nothing a worker sends may stop the rest
            self._failed(name, rank, seq, "failures", exc)

    def _records(self, name: str, rank: int, seq: int, payload: bytes) -> list[Record] | None:
        """The records of one batch of ``(name, rank)``, or None (counted and logged)."""
        with self._counting:
            return self._records_counted(name, rank, seq, payload)

    def _records_counted(
        self, name: str, rank: int, seq: int, payload: bytes
    ) -> list[Record] | None:
        intake = self.intake[(name, rank)]
        intake.batches += 1
        try:
            if self.codec == "native":
                batch = native.decode_batch(payload, seq=seq)
                if (batch.worker, batch.dp_rank) != (name, rank):
                    intake.identity_mismatch += 1
                    self._mismatch(name, rank, seq, f"worker {batch.worker!r} rank {batch.dp_rank}")
                    return None
                return list(batch.records)
            engine = self._decode(payload)
            if (
                self._dp_sizes[self._index[(name, rank)]] > 1
                and engine.dp_rank is not None
                and engine.dp_rank != rank
            ):
                # Counted and warned, but kept under the endpoint's rank: an engine's rank
                # field is not always its DP rank (SGLang 0.5.23's DP ranks, driven by its
                # DP controller, all name rank 0), and the endpoint is the rank it serves.
                intake.identity_mismatch += 1
                self._log.warning(
                    ((name, rank), "identity"),
                    "worker (%r, dp_rank=%d): batch %d names dp rank %d; filed under the "
                    "rank of the endpoint it came on",
                    name,
                    rank,
                    seq,
                    engine.dp_rank,
                )
            return self.converters[(name, rank)].records(
                engine, worker=name, dp_rank=rank, seq=seq
            )
        except DecodeError as exc:
            self.decode_errors += 1
            self._failed(name, rank, seq, "decode_errors", exc)
        except Exception as exc:  # a bug or a converter error: one batch lost
            self._failed(name, rank, seq, "failures", exc)
        return None

    def _mismatch(self, name: str, rank: int, seq: int, named: str) -> None:
        problem = f"batch {seq} names {named}, not the endpoint's: dropped"
        self.replayer.report(name, rank, problem)
        self._log.warning(
            ((name, rank), "identity"),
            "worker (%r, dp_rank=%d): batch %d names %s, but came on this worker's "
            "endpoint: dropped (a batch is filed under the endpoint it arrives on)",
            name,
            rank,
            seq,
            named,
        )

    def _failed(self, name: str, rank: int, seq: int, counter: str, exc: Exception) -> None:
        with self._counting:
            if counter == "failures":
                self.intake[(name, rank)].failures += 1
            else:
                self.intake[(name, rank)].decode_errors += 1
        self.replayer.report(name, rank, f"batch {seq} dropped: {exc}")
        self._log.warning(
            ((name, rank), counter),
            "worker (%r, dp_rank=%d) batch %d dropped: %s",
            name,
            rank,
            seq,
            exc,
        )

    def probe(self) -> int:
        """Ask each worker's replay socket, in the background, for what followed its last batch.

        A batch lost at the end of a burst shows no gap until the worker sends
        again; an idle router probes now and then to find such tail losses (see
        :meth:`Replayer.probe`). What comes back is applied by the next replay
        and counted in the worker's gaps and replays. Returns the probes sent.
        """
        return self.replayer.probe()

    def step(
        self,
        timeout: float | None = 0.0,
        *,
        max_records: int | None = None,
        max_seconds: float | None = None,
    ) -> ReplayStats:
        """Receive, then replay within the budget: one turn of a router's idle loop."""
        self.poll(timeout)
        return self.replayer.replay(max_records=max_records, max_seconds=max_seconds)

    # -- ReplaySource ----------------------------------------------------------------------
    def can_replay(self, worker: str, dp_rank: int) -> bool:
        """Whether the worker has a replay endpoint (and the subscription is open)."""
        index = self._index.get((worker, dp_rank))
        return (
            index is not None
            and not self.subscriber.closed
            and self.subscriber.replay_endpoints[index] is not None
        )

    def can_snapshot(self, worker: str, dp_rank: int) -> bool:
        """Whether a snapshot may be asked of the worker (see :class:`WorkerEndpoint`)."""
        index = self._index.get((worker, dp_rank))
        return index is not None and not self.subscriber.closed and self.serves_snapshots[index]

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> list[Record] | Unavailable:
        """Ask the worker's replay socket for what it holds from ``from_seq``.

        Returns the records, or an :class:`Unavailable` that says why not: no replay
        endpoint, a timeout with nothing received, a closed subscription, no batch
        that decodes. A replayed batch that does not decode (the publisher kept a
        garbage batch in its buffer) is skipped and counted as a live one is: the
        answer goes on with the batches after it, and the hole it leaves is the
        replayer's to repair (by a snapshot, where the worker serves one). Waits up
        to ``replay_timeout``; never raises for what the worker sends.
        """
        index = self._index.get((worker, dp_rank))
        if index is None:
            return Unavailable("not a worker of this subscription")
        if self.subscriber.replay_endpoints[index] is None:
            return Unavailable("no replay endpoint")
        try:
            result = self.subscriber.replay(index, from_seq, timeout=self.replay_timeout)
        except TransportClosedError:
            return Unavailable("the subscription is closed")
        if not result.batches:
            if result.timed_out:
                return Unavailable(f"replay timed out after {self.replay_timeout:g} s")
            return []  # the publisher holds nothing from there: complete, and empty
        out: list[Record] = []
        unusable: list[int] = []
        for batch in result.batches:
            records = self._records(worker, dp_rank, batch.seq, batch.payload)
            if records is None:  # counted and logged by _records; the rest may still help
                unusable.append(batch.seq)
                continue
            # A batch that kept no record still moves the cursor past its seq.
            out.extend(records if records else [batch_mark(worker, dp_rank, batch.seq)])
        if not out:
            return Unavailable(f"replayed batch {unusable[0]} is unusable (see the log)")
        return out

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | Unavailable:
        """Ask the worker's replay socket for a snapshot, if it serves them.

        Only a worker that declares snapshots is asked (see :class:`WorkerEndpoint`):
        vLLM and SGLang publishers keep none. A snapshot that does not come in
        ``snapshot_timeout``, is refused, or does not decode is counted in
        ``snapshot_failures`` and logged, and the answer is an :class:`Unavailable`
        that says which: the replayer then clears the worker and marks it stale.
        Never raises for what the worker sends.
        """
        index = self._index.get((worker, dp_rank))
        if index is None:
            return Unavailable("not a worker of this subscription")
        if not self.serves_snapshots[index]:
            why = "no replay endpoint" if self.subscriber.replay_endpoints[index] is None else (
                f"the {self.codec} publisher keeps none" if self.codec != "native"
                else "the worker is declared snapshot=no"
            )
            return Unavailable(f"no snapshot ({why})")
        try:
            result = self.subscriber.snapshot(index, timeout=self.snapshot_timeout)
        except TransportClosedError:
            return Unavailable("no snapshot (the subscription is closed)")
        with self._counting:
            records = self._snapshot_records(worker, dp_rank, result)
            if isinstance(records, Unavailable):
                self.snapshot_failures += 1
        return records

    def _snapshot_records(
        self, worker: str, dp_rank: int, result: SnapshotResult
    ) -> list[Record] | Unavailable:
        if result.seq is None:
            why = (
                f"the snapshot timed out after {self.snapshot_timeout:g} s"
                if result.status == "timed_out"
                else "no snapshot (the publisher has none)"
            )
            self._log.warning(((worker, dp_rank), "snapshot"),
                              "worker (%r, dp_rank=%d): %s", worker, dp_rank, why)
            return Unavailable(why)
        records: list[Record] = []
        for payload in result.payloads:
            try:
                batch = native.decode_batch(payload, seq=result.seq)
            except DecodeError as exc:
                self.decode_errors += 1
                self.intake[(worker, dp_rank)].decode_errors += 1
                self._log.warning(((worker, dp_rank), "snapshot"),
                                  "worker (%r, dp_rank=%d): snapshot at seq %d dropped: %s",
                                  worker, dp_rank, result.seq, exc)
                return Unavailable(f"the snapshot at seq {result.seq} does not decode")
            if (batch.worker, batch.dp_rank) != (worker, dp_rank):
                self.intake[(worker, dp_rank)].identity_mismatch += 1
                self._mismatch(worker, dp_rank, result.seq, f"worker {batch.worker!r} rank "
                               f"{batch.dp_rank} (a snapshot)")
                return Unavailable("the snapshot names another worker")
            records.extend(batch.records)
        # An empty state still names the seq it is consistent with (see ReplaySource).
        return records or [batch_mark(worker, dp_rank, result.seq)]

    # -- state -------------------------------------------------------------------------------
    def worker_state(self) -> list[dict[str, Any]]:
        """Per (worker, rank): tokens held, replay counts, lag, state and what was left out.

        The keys are documented with ``radixmeta listen --json-out`` (see the Events
        page): ``worker``, ``dp_rank``, ``tokens``, ``applied``, ``duplicates``,
        ``gaps``, ``replays``, ``resyncs``, ``stale``, ``repairing``, ``restarts``,
        ``malformed``, ``dropped``, ``lag_records``, ``lag_seconds``,
        ``last_applied_seconds``, ``newest_seq``, ``last_error``, ``block_size``
        (the engine's, when it differs from the router's), ``intake`` and ``skipped``.
        """
        lag = {(w.worker, w.dp_rank): w for w in self.replayer.lag()}
        out = []
        for name, rank in self.sources:
            stats = self.replayer.worker_stats(name, rank)
            wl = lag.get((name, rank))
            converter = self.converters[(name, rank)]
            out.append(
                {
                    "worker": name,
                    "dp_rank": rank,
                    "tokens": self.tree.held_tokens(self.tree.worker(name, rank)),
                    "applied": stats.applied,
                    "duplicates": stats.duplicates,
                    "gaps": stats.gaps,
                    "replays": stats.replays_requested,
                    "resyncs": stats.resyncs,
                    "stale": bool(wl and wl.stale),
                    "repairing": bool(wl and wl.repairing),
                    "restarts": stats.restarts,
                    "malformed": stats.malformed,
                    "dropped": stats.dropped,
                    "lag_records": wl.records if wl else 0,
                    "lag_seconds": round(wl.seconds, 3) if wl else 0.0,
                    "last_applied_seconds": (
                        None if wl is None or wl.last_applied is None
                        else round(wl.last_applied, 3)
                    ),
                    "newest_seq": wl.newest_seq if wl else None,
                    "last_error": wl.last_error if wl else None,
                    "block_size": converter.wrong_block_size,
                    "intake": self.intake[(name, rank)].as_dict(),
                    "skipped": converter.counts.as_dict(),
                }
            )
        return out

    def close(self) -> None:
        """Close the sockets, then tell the owner given as ``on_close`` (idempotent).

        A replayer of the subscription's own is closed too (its repairs end as the
        sockets close); a router's replayer is the router's to close.
        """
        self.subscriber.close()
        if self._owns_replayer:
            self.replayer.close(timeout=1.0)
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(self)

    def __enter__(self) -> FleetSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
