"""Point a router at a live fleet: KV-event streams in, an up-to-date MetaTree out.

:class:`FleetSubscription` subscribes to every worker's stream (one ZeroMQ SUB
endpoint per dp rank), decodes each batch with the engine's codec, turns it into
records and feeds a :class:`~radixmeta.events.Replayer`, which applies them to the
:class:`~radixmeta.MetaTree` and repairs gaps through the workers' replay
sockets. It is what ``radixmeta listen`` runs.

A batch that does not decode is dropped whole and counted; the next batch of
that worker then shows a gap at its seq, so the replayer asks for it again.

A gap older than a worker's replay buffer is resynced from a snapshot when the
worker serves one (radixmeta's own publisher,
:class:`~radixmeta.events.publishing.LogPublisher`); a vLLM or SGLang worker is never
asked, and is cleared and marked stale until its next records instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixmeta._records import Record
from radixmeta.errors import DecodeError, InvalidInputError
from radixmeta.events.ingest import BatchConverter
from radixmeta.events.replay import Replayer, ReplayStats, batch_mark
from radixmeta.meta import MetaTree
from radixmeta.transport import SnapshotResult, ZmqSubscriber, dp_endpoints
from radixmeta.wire import native, sglang, vllm

__all__ = ["CODECS", "FleetSubscription", "WorkerEndpoint"]

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
    SGLang's rule), for the live and the replay endpoint alike.

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


class FleetSubscription:
    """Subscribe to a fleet's KV events and keep a MetaTree of what each worker holds.

    Parameters
    ----------
    workers : sequence of WorkerEndpoint
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
    replayer : Replayer, optional
        Feed this replayer (and its tree, whose page size must be
        ``block_size``) instead of a tree and replayer of the subscription's
        own: how a :class:`~radixmeta.Router` subscribes. Its owner registers
        the workers in the tree, sets where it asks for replays (this
        subscription is a :class:`~radixmeta.events.ReplaySource` for its
        workers) and chose its ``restart_window``, so that argument is unused.
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
    decode_errors, snapshot_failures : int
        Batches (live, replayed or of a snapshot) that did not decode; snapshots asked
        for that did not come, were refused or did not decode.
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
        if replayer is not None and replayer.tree.page_size != block_size:
            msg = (
                f"block_size {block_size} differs from the page size "
                f"{replayer.tree.page_size} of the replayer's tree"
            )
            raise InvalidInputError(msg)
        self.codec = codec
        self._decode = CODECS[codec]
        self.tree = MetaTree(block_size) if replayer is None else replayer.tree
        self.replay_timeout = replay_timeout
        self.snapshot_timeout = replay_timeout if snapshot_timeout is None else snapshot_timeout
        self.decode_errors = 0
        self.snapshot_failures = 0
        # One subscriber over every (worker, rank) endpoint; a message's source
        # index names its worker and rank.
        self.sources: list[tuple[str, int]] = []
        live: list[str] = []
        replays: list[str | None] = []
        self.serves_snapshots: list[bool] = []  # per source: whether to ask it for one
        for w in workers:
            ranks = dp_endpoints(w.endpoint, w.dp_size)
            replay_ranks = dp_endpoints(w.replay, w.dp_size) if w.replay else [None] * w.dp_size
            # Unless the worker says, a native one is asked and no other (they keep none).
            declared = codec == "native" if w.snapshot is None else w.snapshot
            asks = declared and w.replay is not None
            for rank, (endpoint, replay) in enumerate(zip(ranks, replay_ranks, strict=True)):
                if replayer is None:  # else the replayer's owner registered its workers
                    self.tree.add_worker(w.name, rank)
                self.sources.append((w.name, rank))
                live.append(endpoint)
                replays.append(replay)
                self.serves_snapshots.append(asks)
        self._index = {key: i for i, key in enumerate(self.sources)}
        self.converters = {key: BatchConverter(block_size, tiers=tiers) for key in self.sources}
        self.subscriber = ZmqSubscriber(
            live, topic=topic, replay_endpoints=replays, **subscriber_options
        )
        if replayer is None:
            replayer = Replayer(self.tree, source=self, restart_window=restart_window)
        self.replayer = replayer
        self._on_close = on_close

    # -- receiving ---------------------------------------------------------------------------
    def poll(self, timeout: float | None = 0.0, *, max_messages: int | None = None) -> int:
        """Receive what has arrived (waiting up to ``timeout`` for the first); returns messages."""
        received = 0
        wait = timeout
        while max_messages is None or received < max_messages:
            message = self.subscriber.recv(timeout=wait)
            if message is None:
                break
            received += 1
            wait = 0.0  # drain what is queued, without waiting again
            name, rank = self.sources[message.source]
            records = self._records(name, rank, message.seq, message.payload)
            if records is not None:
                self.replayer.submit_batch(name, rank, message.seq, records)
        return received

    def _records(self, name: str, rank: int, seq: int, payload: bytes) -> list[Record] | None:
        try:
            if self.codec == "native":
                return list(native.decode_batch(payload, seq=seq).records)
            batch = self._decode(payload)
        except DecodeError as exc:
            self.decode_errors += 1
            logger.warning("worker (%r, dp_rank=%d) batch %d dropped: %s", name, rank, seq, exc)
            return None
        return self.converters[(name, rank)].records(batch, worker=name, dp_rank=rank, seq=seq)

    def probe(self) -> int:
        """Ask each worker's replay socket for what followed its last applied batch.

        A batch lost at the end of a burst shows no gap until the worker sends
        again; an idle router probes now and then to find such tail losses.
        Returns the batches found (a quiet fleet costs one empty reply each).
        """
        applied = {(w.worker, w.dp_rank): w.applied_seq for w in self.replayer.lag()}
        found = 0
        for index, (name, rank) in enumerate(self.sources):
            if self.subscriber.replay_endpoints[index] is None:
                continue
            seq = applied.get((name, rank))
            start = 0 if seq is None else seq + 1
            result = self.subscriber.replay(index, start, timeout=self.replay_timeout)
            for batch in result.batches:
                records = self._records(name, rank, batch.seq, batch.payload)
                if records is not None:
                    self.replayer.submit_batch(name, rank, batch.seq, records)
                    found += 1
        return found

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
    def replay(self, worker: str, dp_rank: int, from_seq: int) -> list[Record] | None:
        """Ask the worker's replay socket for what it holds from ``from_seq`` (None: cannot)."""
        index = self._index.get((worker, dp_rank))
        if index is None or self.subscriber.endpoints is None:
            return None
        try:
            result = self.subscriber.replay(index, from_seq, timeout=self.replay_timeout)
        except InvalidInputError:  # this worker has no replay endpoint
            return None
        if not result.batches:
            return None
        out: list[Record] = []
        for batch in result.batches:
            records = self._records(worker, dp_rank, batch.seq, batch.payload)
            if records is None:  # it does not decode on replay either: the source cannot help
                return None
            # A batch that kept no record still moves the cursor past its seq.
            out.extend(records if records else [batch_mark(worker, dp_rank, batch.seq)])
        return out

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | None:
        """Ask the worker's replay socket for a snapshot, if it serves them (None: cannot).

        Only a worker that declares snapshots is asked (see :class:`WorkerEndpoint`):
        vLLM and SGLang publishers keep none. A snapshot that does not come in
        ``snapshot_timeout``, is refused, or does not decode is counted in
        ``snapshot_failures`` and logged, and the answer is None: the replayer then
        clears the worker and marks it stale. Never raises for what the worker sends.
        """
        index = self._index.get((worker, dp_rank))
        if index is None or not self.serves_snapshots[index]:
            return None
        result = self.subscriber.snapshot(index, timeout=self.snapshot_timeout)
        records = self._snapshot_records(worker, dp_rank, result)
        if records is None:
            self.snapshot_failures += 1
        return records

    def _snapshot_records(
        self, worker: str, dp_rank: int, result: SnapshotResult
    ) -> list[Record] | None:
        if result.seq is None:
            logger.warning("worker (%r, dp_rank=%d): no snapshot (%s)", worker, dp_rank,
                           result.status.replace("_", " "))
            return None
        records: list[Record] = []
        for payload in result.payloads:
            try:
                records.extend(native.decode_batch(payload, seq=result.seq).records)
            except DecodeError as exc:
                self.decode_errors += 1
                logger.warning("worker (%r, dp_rank=%d): snapshot at seq %d dropped: %s",
                               worker, dp_rank, result.seq, exc)
                return None
        # An empty state still names the seq it is consistent with (see ReplaySource).
        return records or [batch_mark(worker, dp_rank, result.seq)]

    # -- state -------------------------------------------------------------------------------
    def worker_state(self) -> list[dict[str, Any]]:
        """Per (worker, rank): tokens held, replay counts, lag and what conversion left out."""
        lag = {(w.worker, w.dp_rank): w for w in self.replayer.lag()}
        out = []
        for name, rank in self.sources:
            stats = self.replayer.worker_stats(name, rank)
            wl = lag.get((name, rank))
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
                    "restarts": stats.restarts,
                    "malformed": stats.malformed,
                    "lag_records": wl.records if wl else 0,
                    "lag_seconds": round(wl.seconds, 3) if wl else 0.0,
                    "newest_seq": wl.newest_seq if wl else None,
                    "skipped": self.converters[(name, rank)].counts.as_dict(),
                }
            )
        return out

    def close(self) -> None:
        """Close the sockets, then tell the owner given as ``on_close`` (idempotent)."""
        self.subscriber.close()
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close(self)

    def __enter__(self) -> FleetSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
