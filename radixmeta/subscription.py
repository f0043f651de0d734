"""Point a router at a live fleet: KV-event streams in, an up-to-date MetaTree out.

:class:`FleetSubscription` subscribes to every worker's stream (one ZeroMQ SUB
endpoint per dp rank), decodes each batch with the engine's codec, turns it into
records and feeds a :class:`~radixmeta.events.Replayer`, which applies them to the
:class:`~radixmeta.MetaTree` and repairs gaps through the workers' replay
sockets. It is what ``radixmeta listen`` runs.

A batch that does not decode is dropped whole and counted; the next batch of
that worker then shows a gap at its seq, so the replayer asks for it again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixmeta._records import Record
from radixmeta.errors import DecodeError, InvalidInputError
from radixmeta.ingest import BatchConverter
from radixmeta.meta import MetaTree
from radixmeta.replay import Replayer, ReplayStats, batch_mark
from radixmeta.transport import ZmqSubscriber, dp_endpoints
from radixmeta.wire import native, sglang, vllm

__all__ = ["CODECS", "FleetSubscription", "WorkerEndpoint"]

logger = logging.getLogger("radixmeta.subscription")

CODECS: Mapping[str, Callable[[bytes], Any]] = {
    "vllm": vllm.decode_batch,
    "sglang": sglang.decode_batch,
    "native": native.decode_batch,
}


@dataclass(frozen=True)
class WorkerEndpoint:
    """One worker's streams: its name, live endpoint (rank 0's) and replay endpoint.

    With ``dp_size > 1`` rank ``r`` listens on the base port plus ``r`` (vLLM's and
    SGLang's rule), for the live and the replay endpoint alike.
    """

    name: str
    endpoint: str
    replay: str | None = None
    dp_size: int = 1

    @classmethod
    def parse(cls, spec: str, dp_size: int = 1) -> WorkerEndpoint:
        """Parse ``NAME=ENDPOINT[,replay=ENDPOINT]``, ``radixmeta listen``'s ``--worker``."""
        name, sep, rest = spec.partition("=")
        if not sep or not name or not rest:
            msg = f"a worker is NAME=ENDPOINT[,replay=ENDPOINT], got {spec!r}"
            raise InvalidInputError(msg)
        endpoint, *options = rest.split(",")
        replay = None
        for option in options:
            key, _, value = option.partition("=")
            if key != "replay" or not value:
                msg = f"unknown worker option {option!r} in {spec!r} (only replay=ENDPOINT)"
                raise InvalidInputError(msg)
            replay = value
        return cls(name, endpoint, replay, dp_size)


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
        Medium to tier (see :class:`~radixmeta.ingest.BatchConverter`).
    replay_timeout : float, default 1.0
        Seconds a replay request may take.
    restart_window : int, default 16
        See :class:`~radixmeta.events.Replayer`.
    replayer : Replayer, optional
        Feed this replayer (and its tree, whose page size must be
        ``block_size``) instead of a tree and replayer of the subscription's
        own: how a :class:`~radixmeta.Router` subscribes. Its owner registers
        the workers in the tree, sets where it asks for replays (this
        subscription is a :class:`~radixmeta.events.ReplaySource` for its
        workers) and chose its ``restart_window``, so that argument is unused.
    **subscriber_options
        Passed to :class:`~radixmeta.transport.ZmqSubscriber` (``hwm``, ``context``...).
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
        restart_window: int = 16,
        replayer: Replayer | None = None,
        **subscriber_options: Any,
    ) -> None:
        if codec not in CODECS:
            msg = f"codec must be one of {', '.join(CODECS)}, got {codec!r}"
            raise InvalidInputError(msg)
        if not workers:
            msg = "a subscription needs at least one worker"
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
        self.decode_errors = 0
        # One subscriber over every (worker, rank) endpoint; a message's source
        # index names its worker and rank.
        self.sources: list[tuple[str, int]] = []
        live: list[str] = []
        replays: list[str | None] = []
        for w in workers:
            ranks = dp_endpoints(w.endpoint, w.dp_size)
            replay_ranks = dp_endpoints(w.replay, w.dp_size) if w.replay else [None] * w.dp_size
            for rank, (endpoint, replay) in enumerate(zip(ranks, replay_ranks, strict=True)):
                if replayer is None:  # else the replayer's owner registered its workers
                    self.tree.add_worker(w.name, rank)
                self.sources.append((w.name, rank))
                live.append(endpoint)
                replays.append(replay)
        self._index = {key: i for i, key in enumerate(self.sources)}
        self.converters = {key: BatchConverter(block_size, tiers=tiers) for key in self.sources}
        self.subscriber = ZmqSubscriber(
            live, topic=topic, replay_endpoints=replays, **subscriber_options
        )
        if replayer is None:
            replayer = Replayer(self.tree, source=self, restart_window=restart_window)
        self.replayer = replayer

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

    def snapshot(self, worker: str, dp_rank: int) -> None:
        """vLLM and SGLang publishers keep no snapshot."""
        return None

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
        """Close the sockets (idempotent)."""
        self.subscriber.close()

    def __enter__(self) -> FleetSubscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
