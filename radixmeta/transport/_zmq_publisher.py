"""The ZeroMQ publisher: vLLM's ``ZmqEventPublisher`` protocol, a subscription count, snapshots."""

from __future__ import annotations

import logging
import threading
from typing import Any

import zmq

from radixmeta._keys import check_int
from radixmeta.errors import InputTypeError, InvalidInputError, RadixMetaError, TransportClosedError
from radixmeta.transport._buffer import ReplayBuffer
from radixmeta.transport._closable import ClosesOnExit
from radixmeta.transport._endpoints import publisher_binds
from radixmeta.transport._frames import (
    check_payload,
    check_timeout,
    check_topic,
    end_marker,
    live_frames,
    parse_replay_request,
    replay_reply,
)
from radixmeta.transport._snapshot_frames import (
    check_snapshot,
    no_snapshot_reply,
    parse_snapshot_request,
    snapshot_reply,
)
from radixmeta.transport._zmq_util import (
    DEFAULT_ENDPOINT,
    SocketOptions,
    Wakeup,
    attach,
    check_bind,
    check_endpoint,
    context_for,
    deadline_after,
    ms,
    remaining,
)
from radixmeta.transport.base import (
    Batch,
    PublisherStats,
    ReplayLayout,
    Snapshot,
    SnapshotSource,
)

__all__ = ["ZmqPublisher"]

_log = logging.getLogger("radixmeta.transport.zmq")

# XPUB reports subscriptions; reading them every this many publishes keeps the socket's
# queue of subscription messages short without a syscall per publish.
_DRAIN_EVERY = 64
# How long close() waits for the replay thread. It only ever blocks in a poll that close()
# wakes, so this bound is never reached in practice; it keeps close() bounded regardless.
_JOIN_TIMEOUT = 5.0
# Longest hold of the PUB lock while waiting for subscribers, so publishers are not starved.
_SUBSCRIBE_POLL = 0.05


class ZmqPublisher(ClosesOnExit):
    """Publishes numbered batches the way a vLLM worker does, with an optional replay socket.

    Live messages go out as ``[topic, seq (8 bytes big-endian), payload]``, seq from 0 and
    up by one per batch. The latest ``buffer_steps`` batches are kept; a ROUTER socket on
    ``replay_endpoint`` answers ``[b"", start_seq]`` from a DEALER with every kept batch from
    ``start_seq`` on and an end marker, in the ``reply_format`` layout. Publishing runs in
    the caller's thread (serialized by a lock); replay requests are answered by a
    background thread, so they race live traffic exactly as vLLM's do. A malformed request
    gets no reply, as in vLLM.

    The replay socket also answers radixmeta's snapshot request (a frame layout no vLLM
    client sends, see the transport documentation): with what the ``snapshot`` callable
    returns, or with "none" when there is no callable or it has nothing to give. This is
    how a subscriber that fell off the buffer rebuilds a radixmeta worker instead of
    clearing it; :class:`~radixmeta.publishing.LogPublisher` wires it to a cache.

    The PUB socket is an XPUB, the same on the wire, so the publisher also sees
    subscriptions arrive (:meth:`wait_subscribers`): a test can wait until a subscriber is
    really listening before it publishes, instead of sleeping.

    Parameters
    ----------
    endpoint : str, optional
        Where to publish. With none, bind ``tcp://127.0.0.1:5557`` (loopback only). A given
        endpoint follows vLLM's rule (:func:`publisher_binds`): bound if it has ``*``,
        ``::``, ``0.0.0.0`` or is ``ipc://``/``inproc://``, else connected (llm-d's
        central indexer binds and workers connect). All interfaces are used only if the
        endpoint says so. ``tcp://127.0.0.1:*`` binds loopback on a free port.
    replay_endpoint : str, optional
        Where the replay ROUTER binds (it always binds), e.g. ``tcp://127.0.0.1:5558``.
        ``None``: no replay socket, as with vLLM's default.
    topic : bytes, default b""
        The first frame of every message (llm-d wants ``kv@<pod>@<model>``).
    buffer_steps : int, default 10_000
        How many batches replay can serve.
    hwm : int, default 100_000
        The PUB socket's send high-water mark; past it ZeroMQ drops batches for a slow
        subscriber, which shows up as a seq gap there.
    reply_format : {"new", "old"}, default "new"
        Replay layout: ``"new"`` sends the topic frame (vLLM >= 0.26, SGLang >= 0.5.22),
        ``"old"`` does not (vLLM <= 0.25, SGLang <= 0.5.20).
    bind : bool, optional
        Force binding (True) or connecting (False) the PUB endpoint, as SGLang 0.5.22's
        option does; ``None`` applies the rule above.
    context : zmq.Context, optional
        Default: a private context, terminated by :meth:`close`.
    sockopts : mapping of int to int or bytes, optional
        Extra options for the PUB socket (``zmq.SNDBUF``, TCP keepalive...).
    snapshot : callable, optional
        Called with no argument for each snapshot request; returns a
        :class:`~radixmeta.transport.base.Snapshot` ``(seq, payloads)``, the worker's state
        as payloads of the stream's codec that hold the effect of every batch up to and
        including ``seq`` and of none after it, or ``None`` for "none right now". Needs a
        ``replay_endpoint``. It runs on the replay thread while other threads may change
        the cache and publish: the caller must make the state and ``seq`` agree, by taking
        both under the lock that orders its cache changes and its :meth:`publish` calls
        (``seq`` is then the value :meth:`publish` last returned). It may call
        :meth:`publish` itself (to send what the state holds but no batch did yet). Replay
        requests wait while it runs, so it should copy under that lock and encode after.
        What it raises, or returns that is no snapshot, is logged and counted
        (``stats.snapshot_errors``) and answered with "none".

    Attributes
    ----------
    endpoint : str
        The PUB endpoint, with an ephemeral port resolved when bound.
    replay_endpoint : str or None
        The replay endpoint as bound.
    bound : bool
        Whether the PUB endpoint was bound.
    topic : bytes
    reply_format : {"new", "old"}
    stats : PublisherStats
        Live counters.

    Raises
    ------
    zmq.ZMQError
        An endpoint cannot be bound or connected (for example, the port is in use).
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        replay_endpoint: str | None = None,
        topic: bytes = b"",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        reply_format: ReplayLayout = "new",
        bind: bool | None = None,
        context: zmq.Context[Any] | None = None,
        sockopts: SocketOptions | None = None,
        snapshot: SnapshotSource | None = None,
    ) -> None:
        if snapshot is not None:
            if not callable(snapshot):
                msg = f"snapshot must be callable, got {type(snapshot).__name__}"
                raise InputTypeError(msg)
            if replay_endpoint is None:
                msg = "snapshot needs a replay_endpoint: snapshot requests arrive on it"
                raise InvalidInputError(msg)
        self._snapshot = snapshot
        if endpoint is None:
            endpoint, bind = DEFAULT_ENDPOINT, True if bind is None else bind
        check_endpoint(endpoint, "endpoint")
        if replay_endpoint is not None:
            check_endpoint(replay_endpoint, "replay_endpoint")
        if reply_format not in ("new", "old"):
            msg = f"reply_format must be 'new' or 'old', got {reply_format!r}"
            raise InvalidInputError(msg)
        self.topic = check_topic(topic)
        self.reply_format: ReplayLayout = reply_format
        self._buffer = ReplayBuffer(buffer_steps)
        check_int("hwm", hwm, 0)
        self.bound = publisher_binds(endpoint) if check_bind(bind) is None else bool(bind)
        self.stats = PublisherStats()
        self._pub_lock = threading.Lock()  # the PUB socket, seq order and subscriptions
        self._closed = False
        self._closing = False  # read by the replay thread
        self._subscriptions = 0
        self._replay: zmq.Socket[Any] | None = None
        self._thread: threading.Thread | None = None
        self._ctx, self._owns_ctx = context_for(context)
        self._wakeup = Wakeup()
        try:
            self._pub = self._ctx.socket(zmq.XPUB)
            self._pub.setsockopt(zmq.LINGER, 0)
            self._pub.setsockopt(zmq.SNDHWM, hwm)
            # VERBOSER: every subscribe and unsubscribe is reported, so the count is exact.
            self._pub.setsockopt(zmq.XPUB_VERBOSER, 1)
            self.endpoint = attach(self._pub, endpoint, self.bound, sockopts)
            self.replay_endpoint = None
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self._replay.setsockopt(zmq.LINGER, 0)
                # Room for a whole reply (every kept batch and the end marker) for two
                # clients: past its HWM a ROUTER drops silently, cutting replies short.
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self.replay_endpoint = attach(self._replay, replay_endpoint, True, None)
        except BaseException:
            self._release()
            raise
        if self._replay is not None:
            self._thread = threading.Thread(
                target=self._serve_replays,
                name=f"radixmeta-replay {self.replay_endpoint}",
                daemon=True,  # a publisher that is never closed must not block exit
            )
            self._thread.start()

    # -- publishing ------------------------------------------------------------------------
    @property
    def buffer_steps(self) -> int:
        """How many batches replay can serve."""
        return self._buffer.capacity

    @property
    def next_seq(self) -> int:
        """The seq of the next batch published (0 for a new or restarted publisher)."""
        return self._buffer.next_seq

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def publish(self, payload: bytes) -> int:
        """Send one batch, keep it for replay, and return its seq. O(1) plus the send.

        Never blocks on subscribers: past the high-water mark ZeroMQ drops the batch for
        the slow one (it stays in the replay buffer).

        Raises
        ------
        InputTypeError, InvalidInputError
            ``payload`` is not bytes-like, or is empty (an empty payload frame is the replay
            end marker, so no batch may have one).
        TransportClosedError
            The publisher is closed.
        """
        data = check_payload(payload)
        with self._pub_lock:
            if self._closed:
                msg = "publish on a closed ZmqPublisher"
                raise TransportClosedError(msg)
            seq = self._buffer.append(data)
            self._pub.send_multipart(live_frames(self.topic, seq, data))
            self.stats.messages += 1
            self.stats.bytes += len(data)
            if self.stats.messages % _DRAIN_EVERY == 0:
                self._drain_subscriptions()
        return seq

    @property
    def subscriptions(self) -> int:
        """The number of live subscriptions (one per subscriber socket and topic filter)."""
        with self._pub_lock:
            if not self._closed:
                self._drain_subscriptions()
            return self._subscriptions

    def wait_subscribers(self, count: int = 1, timeout: float | None = 5.0) -> bool:
        """Wait until at least ``count`` subscriptions have reached this publisher.

        Once it returns True, every later batch reaches those subscribers (until their
        high-water mark): unlike a sleep, this closes ZeroMQ's slow-joiner window. A
        subscriber that *binds* (central-indexer layout) must be polled meanwhile, by
        ``recv`` or :meth:`ZmqSubscriber.wait_connected`, or its subscription is never sent.

        Parameters
        ----------
        count : int, default 1
        timeout : float or None, default 5.0
            Seconds; ``None`` waits without limit.

        Returns
        -------
        bool
            True if ``count`` was reached, False on timeout or if the publisher is closed.
        """
        check_int("count", count, 0)
        limit = check_timeout(timeout)
        deadline = deadline_after(limit)
        while True:
            with self._pub_lock:
                if self._closed:
                    return False
                self._drain_subscriptions()
                if self._subscriptions >= count:
                    return True
                left = remaining(deadline)
                if left == 0.0:
                    return False
                # Short slices, so a publish in another thread waits at most one slice.
                self._pub.poll(ms(_SUBSCRIBE_POLL if left is None else min(left, _SUBSCRIBE_POLL)))

    def _drain_subscriptions(self) -> None:
        """Read the subscription messages XPUB has queued (lock held)."""
        while True:
            try:
                message = self._pub.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if message[:1] == b"\x01":
                self._subscriptions += 1
            elif message[:1] == b"\x00":
                self._subscriptions = max(0, self._subscriptions - 1)

    # -- replay ----------------------------------------------------------------------------
    def _serve_replays(self) -> None:
        """The replay thread: answer requests until close() wakes it. Owns the ROUTER."""
        router = self._replay
        assert router is not None
        poller = zmq.Poller()
        poller.register(router, zmq.POLLIN)
        poller.register(self._wakeup.reader, zmq.POLLIN)
        try:
            while not self._closing:
                if router in dict(poller.poll()):
                    self._answer_requests(router)
        except zmq.ZMQError as exc:  # the context went away under us: nothing to serve
            if not self._closing:
                _log.warning("replay socket %s stopped: %s", self.replay_endpoint, exc)
        finally:
            router.close(linger=0)

    def _answer_requests(self, router: zmq.Socket[Any]) -> None:
        while not self._closing:
            try:
                frames = router.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            request = parse_replay_request(frames)
            if request is not None:
                self._answer_replay(router, *request)
                continue
            client = parse_snapshot_request(frames)
            if client is not None:
                self._answer_snapshot(router, client)
                continue
            self.stats.malformed_requests += 1
            _log.debug("invalid request on %s: %d frames", self.replay_endpoint, len(frames))

    def _answer_replay(self, router: zmq.Socket[Any], client: bytes, start_seq: int) -> None:
        # Copied under the buffer's lock, sent without it: publishing never waits
        # for a replay to finish.
        for seq, payload in self._buffer.read(start_seq):
            if self._closing:
                return
            router.send_multipart(
                replay_reply(client, Batch(self.topic, seq, payload), self.reply_format)
            )
            self.stats.replayed_messages += 1
        # Counted before the end marker goes out: a client that has read the
        # marker must find the replay counted.
        self.stats.replays_served += 1
        router.send_multipart(end_marker(client, self.reply_format))

    def _answer_snapshot(self, router: zmq.Socket[Any], client: bytes) -> None:
        snapshot = self._take_snapshot()
        if self._closing:
            return
        # Counted before the reply goes out, as a replay is.
        if snapshot is None:
            self.stats.snapshots_unavailable += 1
            router.send_multipart(no_snapshot_reply(client))
        else:
            self.stats.snapshots_served += 1
            router.send_multipart(snapshot_reply(client, snapshot))

    def _take_snapshot(self) -> Snapshot | None:
        """Call the ``snapshot`` callable; None for none, and for what it got wrong."""
        if self._snapshot is None:
            return None
        try:
            value = self._snapshot()
            return None if value is None else check_snapshot(value)
        except RadixMetaError as exc:  # it returned no snapshot
            _log.warning("snapshot for %s refused: %s", self.replay_endpoint, exc)
        except Exception:  # the caller's code: it must not stop the replay thread
            _log.exception("snapshot callable for %s raised", self.replay_endpoint)
        self.stats.snapshot_errors += 1
        return None

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        """Close every socket (linger 0) and stop the replay thread. Idempotent, bounded."""
        with self._pub_lock:
            if self._closed:
                return
            self._closed = True
        self._release()

    def _release(self) -> None:
        self._closing = True
        thread_alive = False
        if self._thread is not None:
            self._wakeup.set()
            self._thread.join(_JOIN_TIMEOUT)
            thread_alive = self._thread.is_alive()
            if thread_alive:
                _log.error("replay thread of %s did not stop", self.replay_endpoint)
        elif self._replay is not None:  # the thread never started
            self._replay.close(linger=0)
        pub = getattr(self, "_pub", None)
        if pub is not None:
            pub.close(linger=0)
        if self._owns_ctx and not thread_alive:  # term() would wait for the thread's socket
            self._ctx.term()
        self._wakeup.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"next_seq={self.next_seq}"
        return (f"ZmqPublisher({self.endpoint!r}, replay_endpoint={self.replay_endpoint!r}, "
                f"{state})")
