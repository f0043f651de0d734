"""The ZeroMQ subscribers (threads and asyncio): SUB sockets and a DEALER replay client.

The DEALER client asks the publisher's ROUTER for a replay (vLLM's request) or for a
snapshot (radixmeta's); each request gets a fresh DEALER and a run object that reads its
replies, so the thread and asyncio subscribers share everything but the waiting. Requests
may run in several threads at once (one per worker being repaired): each has its own
DEALER, and none holds a lock while it waits.

The thread subscriber also keeps a small *keeper* thread. A ZeroMQ socket handles its
peers' comings and goings only when its owning thread uses it: a SUB whose publisher
restarted sends it the subscription again only at the next ``recv``, so a batch the new
publisher sends before that is lost (and a bound SUB never attaches a new peer at all).
The keeper waits on the sockets' notification descriptors, and when one signals it takes
the socket lock (the one ``recv`` holds) and lets the sockets process what is pending:
the subscription goes out as soon as the connection is up, with no ``recv`` needed. It
also counts each endpoint's connections from the socket monitors (``connections``), which
tells a consumer that a publisher connected again, perhaps a new one. It holds the
subscriber weakly, so a subscriber dropped without ``close`` is still collected (and the
keeper ends).
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
import weakref
from collections import deque
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Any, Protocol

import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from radixmeta._keys import check_int
from radixmeta.errors import InputTypeError, InvalidInputError, TransportClosedError
from radixmeta.transport._closable import ClosesOnExit
from radixmeta.transport._endpoints import subscriber_binds
from radixmeta.transport._frames import (
    check_seq,
    check_timeout,
    check_topic,
    parse_live,
    parse_replay_reply,
    replay_request,
)
from radixmeta.transport._snapshot_frames import parse_snapshot_reply, snapshot_request
from radixmeta.transport._zmq_util import (
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
    Message,
    ReplayLayout,
    ReplayResult,
    Snapshot,
    SnapshotResult,
    SubscriberStats,
)

__all__ = ["AsyncZmqSubscriber", "ZmqSubscriber"]

_log = logging.getLogger("radixmeta.transport.zmq")

# Longest single wait of an asyncio call, so close() from another task takes effect.
_ASYNC_SLICE = 0.1
# How often wait_connected touches the SUB sockets (see _SubscriberBase._touch).
_CONNECT_POLL = 0.01
_MONITOR_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
# How long the keeper waits for the socket lock before it lets a running recv (whose poll
# processes the same pending commands) do the work, and how long close() waits for the
# requests and the keeper to notice.
_KEEPER_LOCK_WAIT = 0.05
_CLOSE_WAIT = 5.0


class _Run(Protocol):
    """The replies to one request, read as they arrive until ``complete``."""

    complete: bool

    def drain(self, dealer: zmq.Socket[Any]) -> None:
        """Read every reply already queued on ``dealer`` (never blocks)."""


class _ReplayRun:
    """The replies to one replay request, as they arrive."""

    __slots__ = ("batches", "complete", "layout", "malformed", "source", "start_seq")

    def __init__(self, source: int, start_seq: int) -> None:
        self.source = source
        self.start_seq = start_seq
        self.batches: list[Batch] = []
        self.complete = False
        self.layout: ReplayLayout | None = None
        self.malformed = 0

    def drain(self, dealer: zmq.Socket[Any]) -> None:
        """Read every reply already queued on ``dealer``, stopping at the end marker."""
        while not self.complete:
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, layout, batch = parse_replay_reply(frames)
            if kind == "malformed":
                self.malformed += 1
                continue
            self.layout = layout
            if batch is None:
                self.complete = True
            else:
                self.batches.append(batch)

    def result(self, stats: SubscriberStats) -> ReplayResult:
        stats.replays_requested += 1
        stats.replayed_messages += len(self.batches)
        stats.replay_malformed += self.malformed
        if not self.complete:
            stats.replay_timeouts += 1
        return ReplayResult(
            self.source,
            self.start_seq,
            tuple(self.batches),
            complete=self.complete,
            timed_out=not self.complete,
            layout=self.layout,
            malformed=self.malformed,
        )


class _SnapshotRun:
    """The reply to one snapshot request: a single message, after any malformed ones."""

    __slots__ = ("complete", "malformed", "snapshot", "source")

    def __init__(self, source: int) -> None:
        self.source = source
        self.complete = False
        self.snapshot: Snapshot | None = None
        self.malformed = 0

    def drain(self, dealer: zmq.Socket[Any]) -> None:
        """Read the queued replies until the first well-formed one."""
        while not self.complete:
            try:
                frames = dealer.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            kind, snapshot = parse_snapshot_reply(frames)
            if kind == "malformed":
                self.malformed += 1
                continue
            self.complete = True
            self.snapshot = snapshot

    def result(self, stats: SubscriberStats) -> SnapshotResult:
        stats.snapshots_requested += 1
        stats.snapshot_malformed += self.malformed
        if not self.complete:
            stats.snapshot_timeouts += 1
            return SnapshotResult(self.source, "timed_out", malformed=self.malformed)
        if self.snapshot is None:
            stats.snapshots_unavailable += 1
            return SnapshotResult(self.source, "unavailable", malformed=self.malformed)
        seq, payloads = self.snapshot
        return SnapshotResult(self.source, "snapshot", seq, tuple(payloads), self.malformed)


class _SubscriberBase:
    """Sockets, frame checks and bookkeeping shared by the thread and asyncio subscribers.

    Every socket is a plain pyzmq socket; the two subclasses differ only in how they wait
    (``zmq.Poller`` or ``zmq.asyncio.Poller``). Nothing here blocks.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        *,
        topic: bytes = b"",
        replay_endpoints: str | Sequence[str | None] | None = None,
        hwm: int = 100_000,
        bind: bool | None = None,
        context: zmq.Context[Any] | None = None,
        sockopts: SocketOptions | None = None,
    ) -> None:
        given = [endpoints] if isinstance(endpoints, str) else list(endpoints)
        if not given:
            msg = "endpoints must name at least one endpoint"
            raise InvalidInputError(msg)
        for i, endpoint in enumerate(given):
            check_endpoint(endpoint, f"endpoints[{i}]")
        self._given = tuple(given)
        self.replay_endpoints = self._check_replay_endpoints(replay_endpoints, len(given))
        self.topic = check_topic(topic)
        check_int("hwm", hwm, 0)
        check_bind(bind)
        self.stats = SubscriberStats()
        self._closed = False
        self._state_lock = threading.Lock()  # closed, the request count, the stats
        self._requests_done = threading.Condition(self._state_lock)
        self._requests = 0  # replay and snapshot requests in flight
        self._recv_lock = threading.Lock()  # the SUB and monitor sockets
        self._ready: deque[int] = deque()  # SUB sockets a poll found readable, in turn
        self._queued: set[int] = set()  # the same, as a set
        self._reads_since_poll = 0
        self._subs: list[zmq.Socket[Any]] = []
        self._monitors: list[zmq.Socket[Any]] = []
        self._peers = [0] * len(given)  # live connections per endpoint, from the monitors
        self._connections = [0] * len(given)  # connections ever made per endpoint
        self._ctx, self._owns_ctx = context_for(context)
        self._wakeup = Wakeup()
        resolved: list[str] = []
        try:
            for endpoint in given:
                sub = self._ctx.socket(zmq.SUB)
                self._subs.append(sub)
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt(zmq.RCVHWM, hwm)
                sub.setsockopt(zmq.SUBSCRIBE, self.topic)
                # Before bind/connect, so the monitor sees the first connection too.
                monitor = sub.get_monitor_socket(_MONITOR_EVENTS)
                monitor.setsockopt(zmq.LINGER, 0)
                self._monitors.append(monitor)
                binds = subscriber_binds(endpoint) if bind is None else bind
                resolved.append(attach(sub, endpoint, binds, sockopts))
        except BaseException:
            self._close_sockets()
            raise
        self.endpoints = tuple(resolved)
        self._sub_index = {sub: i for i, sub in enumerate(self._subs)}
        self._monitor_index = {monitor: i for i, monitor in enumerate(self._monitors)}
        # Every socket, and the wake-up: what a thread waits on, and a poll(0) refreshes.
        self._poller = zmq.Poller()
        for sock in (*self._subs, *self._monitors):
            self._poller.register(sock, zmq.POLLIN)
        self._poller.register(self._wakeup.reader, zmq.POLLIN)
        self._open_waiting()

    def _open_waiting(self) -> None:
        """Set up what the subclass waits with, once the sockets are open (here: nothing).

        The one constructor step the subclasses differ in, so they share the constructor
        (and its signature) instead of repeating it.
        """

    @staticmethod
    def _check_replay_endpoints(
        replay_endpoints: str | Sequence[str | None] | None, count: int
    ) -> tuple[str | None, ...]:
        if replay_endpoints is None:
            return (None,) * count
        listed = [replay_endpoints] if isinstance(replay_endpoints, str) else list(
            replay_endpoints
        )
        if len(listed) != count:
            msg = (f"replay_endpoints has {len(listed)} entries for {count} endpoints; "
                   "give one per endpoint (None for none)")
            raise InvalidInputError(msg)
        for i, endpoint in enumerate(listed):
            if endpoint is not None:
                check_endpoint(endpoint, f"replay_endpoints[{i}]")
        return tuple(listed)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def connected(self) -> tuple[bool, ...]:
        """Per endpoint, whether a peer was connected when the monitors were last read."""
        return tuple(peers > 0 for peers in self._peers)

    @property
    def connections(self) -> tuple[int, ...]:
        """Per endpoint, the connections made so far (handshakes the monitor saw).

        A count that grows past 1 means the publisher connected again: the same one
        after a network fault, or a restarted one whose numbering starts again. The
        monitor of an endpoint is read before each of its batches is, so a batch that
        a new connection brought is never returned before that connection is counted.
        """
        return tuple(self._connections)

    # -- non-blocking steps ----------------------------------------------------------------
    def _take(self) -> Message | None:
        """Return the next well-formed live message a poll found, or None. Never blocks."""
        if self._reads_since_poll >= len(self._subs) > 1:
            # A socket that always has more would otherwise be read forever, and one that
            # became readable since the last poll never found.
            self._note(self._poller.poll(0))
        ready = self._ready
        while ready:
            i = ready.popleft()
            self._read_monitor(i)  # a new connection is counted before its first batch
            try:
                frames = self._subs[i].recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                self._queued.discard(i)
                continue
            ready.append(i)  # it may hold more; behind the others, so each gets a turn
            self._reads_since_poll += 1
            batch = parse_live(frames)
            if batch is None:
                self.stats.malformed += 1
                _log.debug("malformed live message from %s: %d frames",
                           self.endpoints[i], len(frames))
                continue
            self.stats.messages += 1
            self.stats.bytes += len(batch.payload)
            return Message(i, batch.topic, batch.seq, batch.payload)
        return None

    def _note(self, events: Iterable[tuple[Any, int]]) -> None:
        """Record what a poll found: readable SUBs to read, monitor events to count."""
        self._reads_since_poll = 0
        for sock, _ in events:
            i = self._sub_index.get(sock)
            if i is not None:
                if i not in self._queued:
                    self._queued.add(i)
                    self._ready.append(i)
                continue
            i = self._monitor_index.get(sock)
            if i is not None:
                self._read_monitor(i)

    def _read_monitor(self, i: int) -> None:
        while True:
            try:
                frames = self._monitors[i].recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._peers[i] += 1
                self._connections[i] += 1
            elif event == zmq.EVENT_DISCONNECTED:
                self._peers[i] = max(0, self._peers[i] - 1)

    def _touch(self) -> bool:
        """Let each SUB process pending commands; return whether every endpoint has a peer.

        A SUB that *binds* attaches a new peer, and sends it the subscription, only when
        its owning thread uses the socket (reference note section 1.2: an untouched bound
        SUB received 0 of 3 batches). Reading ``EVENTS`` is such a use.
        """
        for sub in self._subs:
            sub.getsockopt(zmq.EVENTS)
        for i in range(len(self._monitors)):
            self._read_monitor(i)
        return all(peers > 0 for peers in self._peers)

    def _replay_target(self, source: int | str) -> tuple[int, str]:
        """Return ``(index, replay endpoint)`` for a source given by index or endpoint."""
        count = len(self.endpoints)
        if isinstance(source, str):
            for names in (self.endpoints, self._given, self.replay_endpoints):
                if source in names:
                    index = names.index(source)
                    break
            else:
                msg = f"{source!r} is none of this subscriber's endpoints"
                raise InvalidInputError(msg)
        elif isinstance(source, int) and not isinstance(source, bool):
            if not 0 <= source < count:
                msg = f"source {source} is outside [0, {count})"
                raise InvalidInputError(msg)
            index = source
        else:
            msg = f"source must be an endpoint index or string, got {type(source).__name__}"
            raise InputTypeError(msg)
        endpoint = self.replay_endpoints[index]
        if endpoint is None:
            msg = f"endpoint {index} ({self.endpoints[index]}) has no replay endpoint"
            raise InvalidInputError(msg)
        return index, endpoint

    def _open_request(self, endpoint: str, request: Sequence[bytes]) -> zmq.Socket[Any] | None:
        """Connect a fresh DEALER to ``endpoint`` and send ``request``; None if it failed.

        A fresh socket per request: replies that a timed-out request left in flight go to
        a closed socket, never into the next request's answer.
        """
        dealer: zmq.Socket[Any] = self._ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        # Unbounded receive queue: the reply is bounded by the publisher's buffer, and a
        # DEALER that pushed back would make the ROUTER drop part of it silently.
        dealer.setsockopt(zmq.RCVHWM, 0)
        try:
            dealer.connect(endpoint)
            dealer.send_multipart(request, zmq.NOBLOCK)
        except zmq.ZMQError as exc:
            _log.warning("request to %s failed: %s", endpoint, exc)
            dealer.close(linger=0)
            return None
        return dealer

    # -- closing ---------------------------------------------------------------------------
    def _mark_closed(self) -> bool:
        """Mark closed and wake waiters; return False if it already was."""
        with self._state_lock:
            if self._closed:
                return False
            self._closed = True
        self._wakeup.set()
        return True

    def _close_sockets(self) -> None:
        for sub in self._subs:
            sub.disable_monitor()
        for sock in (*self._monitors, *self._subs):
            sock.close(linger=0)
        self._monitors.clear()
        self._subs.clear()
        self._ready.clear()
        self._queued.clear()
        if self._owns_ctx:
            self._ctx.term()
        self._wakeup.close()


class ZmqSubscriber(_SubscriberBase, ClosesOnExit):
    """Receives a fleet's KV-event batches: one SUB socket per endpoint, a replay client.

    A worker with dp size N publishes on N endpoints (:func:`dp_endpoints`); give them all,
    and ``Message.source`` is the rank. Live messages must be exactly
    ``[topic, seq (8 bytes), payload]``; anything else is counted in
    ``stats.malformed`` and skipped, never raised. Thread-safe: ``recv`` (and
    ``wait_connected``) in one thread, ``replay`` and ``snapshot`` in any others (several
    at once, each on a connection of its own), ``close`` from any. A keeper thread
    re-subscribes to a publisher that restarted as soon as it is back, with no ``recv``
    needed (see the module's notes); ``close`` stops it.

    Parameters
    ----------
    endpoints : str or sequence of str
        The publishers' endpoints. Each is connected, or bound when it names no peer (a
        wildcard host or port: the central-indexer layout, :func:`subscriber_binds`).
    topic : bytes, default b""
        Topic prefix filter (ZeroMQ matches the first frame's prefix).
    replay_endpoints : str or sequence of (str or None), optional
        One replay endpoint per endpoint (``None`` where there is none).
    hwm : int, default 100_000
        Receive high-water mark per SUB socket; past it batches are dropped (a seq gap).
    bind : bool, optional
        Force binding (True) or connecting (False) every endpoint.
    context : zmq.Context, optional
        Default: a private context, terminated by :meth:`close`. Share one with the
        publishers to use ``inproc://`` endpoints.
    sockopts : mapping of int to int or bytes, optional
        Extra options for each SUB socket (``zmq.RCVBUF``, ``zmq.RECONNECT_IVL``...).

    Attributes
    ----------
    endpoints : tuple of str
        As bound or connected (an ephemeral port resolved).
    replay_endpoints : tuple of (str or None)
    topic : bytes
    stats : SubscriberStats
        Live counters.
    """

    def recv(self, timeout: float | None = None) -> Message | None:
        """Return the next live batch from any endpoint, or None on timeout or close.

        Endpoints take turns, so a busy one does not starve the others; each endpoint's
        batches come in the order it sent them.

        Parameters
        ----------
        timeout : float or None, default None
            Seconds; 0 only takes what has already arrived; ``None`` waits until a batch
            comes or another thread calls :meth:`close`.

        Complexity: one non-blocking read per batch, one poll over all sockets when none
        is waiting.
        """
        limit = check_timeout(timeout)
        deadline = deadline_after(limit)
        with self._recv_lock:
            polled = False
            while not self._closed:
                message = self._take()
                if message is not None:
                    return message
                left = remaining(deadline)
                if polled and left == 0.0:
                    return None
                self._note(self._poller.poll(ms(left)))
                polled = True
        return None

    def wait_connected(self, timeout: float | None = 5.0) -> bool:
        """Poll until every endpoint has a connected peer; True if so before the timeout.

        This is the reference note's section 1.2: the sockets are kept in use while the
        connections come up, so a bound SUB attaches its peers and sends them the
        subscription. The peer's PUB may still drop a batch sent at this very moment,
        because it applies the subscription a little later; a publisher that must lose
        nothing waits with :meth:`ZmqPublisher.wait_subscribers`, and a consumer of a
        foreign publisher recovers the start by :meth:`replay`.

        Parameters
        ----------
        timeout : float or None, default 5.0
            Seconds; ``None`` waits without limit (until :meth:`close`).

        Returns
        -------
        bool
            True once every endpoint has a peer; False on timeout or close.
        """
        limit = check_timeout(timeout)
        deadline = deadline_after(limit)
        with self._recv_lock:
            poller = zmq.Poller()
            for monitor in self._monitors:
                poller.register(monitor, zmq.POLLIN)
            poller.register(self._wakeup.reader, zmq.POLLIN)
            while not self._closed:
                if self._touch():
                    return True
                left = remaining(deadline)
                if left == 0.0:
                    return False
                wait = _CONNECT_POLL if left is None else min(left, _CONNECT_POLL)
                poller.poll(ms(wait))
        return False

    def replay(self, source: int | str, start_seq: int, *, timeout: float = 5.0) -> ReplayResult:
        """Ask a publisher's replay socket for every batch it holds from ``start_seq`` on.

        Speaks both reply layouts (with and without the topic frame) and stops at the
        end marker (the empty payload frame). If the publisher no longer holds
        ``start_seq``, the reply starts later: ``result.skipped > 0``. A replay socket that
        never answers costs ``timeout`` and yields ``timed_out=True`` with whatever came;
        nothing raises for what the peer does or does not send. Live batches keep
        queueing on the SUB sockets meanwhile. Replies are not filtered by ``topic``: a
        replay socket serves one publisher, and its whole answer is returned.

        Parameters
        ----------
        source : int or str
            The endpoint's index (the dp rank) or its live or replay endpoint string.
        start_seq : int
            The first seq wanted.
        timeout : float, default 5.0
            Seconds for the whole reply.

        Returns
        -------
        ReplayResult
            The batches in order, whether the end marker came (``complete``) or the
            timeout passed first (``timed_out``), the layout, and ``skipped``.

        Raises
        ------
        InvalidInputError, InputTypeError
            An unknown source, one without a replay endpoint, or a bad seq or timeout.
        TransportClosedError
            The subscriber is closed.

        Complexity: O(batches replayed); one connection per call.
        """
        index, endpoint = self._replay_target(source)
        check_seq(start_seq)
        limit = check_timeout(timeout)
        run = _ReplayRun(index, start_seq)
        self._exchange("replay", endpoint, replay_request(start_seq), run, limit)
        with self._state_lock:
            return run.result(self.stats)

    def snapshot(self, source: int | str, *, timeout: float = 5.0) -> SnapshotResult:
        """Ask a radixmeta publisher's replay socket for a snapshot of its worker.

        The request is radixmeta's own (see the transport documentation): ask only a
        publisher that serves snapshots. A vLLM or SGLang publisher drops it unanswered,
        which costs ``timeout``. Nothing raises for what the peer sends or does not send:
        malformed replies are counted and skipped, and no answer in time gives
        ``status="timed_out"``.

        Parameters
        ----------
        source : int or str
            The endpoint's index (the dp rank) or its live or replay endpoint string.
        timeout : float, default 5.0
            Seconds for the whole reply.

        Returns
        -------
        SnapshotResult
            ``status`` ``"snapshot"`` with ``seq`` and ``payloads``, ``"unavailable"``
            (the publisher has none) or ``"timed_out"``.

        Raises
        ------
        InvalidInputError, InputTypeError
            An unknown source, one without a replay endpoint, or a bad timeout.
        TransportClosedError
            The subscriber is closed.

        Complexity: O(snapshot bytes); one connection per call.
        """
        index, endpoint = self._replay_target(source)
        limit = check_timeout(timeout)
        run = _SnapshotRun(index)
        self._exchange("snapshot", endpoint, snapshot_request(), run, limit)
        with self._state_lock:
            return run.result(self.stats)

    def _exchange(
        self, what: str, endpoint: str, request: Sequence[bytes], run: _Run, limit: float | None
    ) -> None:
        """Send ``request`` on a fresh DEALER and feed the replies to ``run`` until done.

        No lock is held while it waits: requests to several publishers run at once.
        """
        deadline = deadline_after(limit)
        with self._state_lock:
            if self._closed:
                msg = f"{what} on a closed ZmqSubscriber"
                raise TransportClosedError(msg)
            self._requests += 1
        try:
            dealer = self._open_request(endpoint, request)
            if dealer is None:
                return
            try:
                poller = zmq.Poller()
                poller.register(dealer, zmq.POLLIN)
                poller.register(self._wakeup.reader, zmq.POLLIN)
                while not run.complete and not self._closed:
                    left = remaining(deadline)
                    if left == 0.0:
                        break
                    if poller.poll(ms(left)):
                        run.drain(dealer)
            finally:
                dealer.close(linger=0)
        finally:
            with self._state_lock:
                self._requests -= 1
                self._requests_done.notify_all()

    def _open_waiting(self) -> None:
        # The keeper's view of the sockets: their notification descriptors, read once
        # here by the thread that made them (a getsockopt is a use of the socket).
        self._selector = selectors.DefaultSelector()
        for sock in (*self._subs, *self._monitors):
            self._selector.register(int(sock.getsockopt(zmq.FD)), selectors.EVENT_READ)
        self._selector.register(self._wakeup.reader, selectors.EVENT_READ)
        # The keeper holds the subscriber weakly: one its owner dropped without close()
        # is still collected (its sockets with it), and the keeper then ends.
        self._keeper = threading.Thread(
            target=_keep,
            args=(weakref.ref(self), self._selector),
            name="radixmeta-zmq-keeper",
            daemon=True,
        )
        self._keeper.start()

    def _keep_turn(self) -> None:
        """One turn of the keeper, after a descriptor signalled (see ``_keep``)."""
        if not self._recv_lock.acquire(timeout=_KEEPER_LOCK_WAIT):
            return  # a recv holds the sockets: its poll processes the same
        try:
            if not self._closed:
                self._touch()
        finally:
            self._recv_lock.release()

    def close(self) -> None:
        """Close every socket with linger 0; a blocked call in another thread returns.

        Idempotent. Waits only for calls in flight to notice (they are woken at once).
        """
        if not self._mark_closed():
            return
        with self._state_lock:
            self._requests_done.wait_for(lambda: self._requests == 0, _CLOSE_WAIT)
        self._keeper.join(_CLOSE_WAIT)
        with self._recv_lock:
            self._selector.close()
            self._close_sockets()
        if self._requests:
            _log.warning("a replay request did not end within %g s of close()", _CLOSE_WAIT)

    def __repr__(self) -> str:
        return f"ZmqSubscriber({list(self.endpoints)!r}, closed={self._closed})"


def _keep(subscriber: weakref.ref[ZmqSubscriber], selector: selectors.BaseSelector) -> None:
    """Let the sockets process their peers' commands as soon as they come (see above).

    Holds the subscriber only for a turn: between turns it waits on the selector alone,
    and ends once the subscriber is closed or collected.
    """
    try:
        while True:
            sub = subscriber()
            if sub is None:
                break
            if sub.closed:
                return  # close() closes the selector with the sockets
            del sub
            if not selector.select(timeout=1.0):
                continue
            sub = subscriber()
            if sub is None:
                break
            if sub.closed:
                return
            sub._keep_turn()
            del sub
            # What a descriptor signalled is processed now; a descriptor may stay
            # readable a moment after, so do not spin on it.
            time.sleep(0.001)
    except Exception:  # the keeper must never take the subscriber down with it
        _log.exception("the subscriber's keeper thread stopped")
        return
    selector.close()  # collected unclosed: what the selector holds goes now, not at a gc


class AsyncZmqSubscriber(_SubscriberBase):
    """:class:`ZmqSubscriber` for asyncio: the same constructor, awaitable calls.

    ``recv``, ``replay``, ``snapshot`` and ``wait_connected`` are coroutines that never block
    the event loop (they wait with ``zmq.asyncio.Poller``); ``close`` is a plain method, and
    ``async with`` closes on exit. Run one ``recv`` at a time per subscriber (a ZeroMQ
    socket has one reader); a ``replay`` or ``snapshot`` may run in another task meanwhile.
    A call in flight when :meth:`close` is called returns within 0.1 s, and the
    sockets are closed as it leaves.
    """

    def _open_waiting(self) -> None:
        # Calls awaiting a poll. close() leaves the sockets to the last of them: closing
        # a socket under a pending asyncio poll would leave a reader on a dead descriptor.
        self._in_flight = 0
        # The same sockets without the wake-up pipe: asyncio waits in slices instead, since
        # two pending asyncio polls on one raw descriptor would steal each other's reader.
        self._async_poller = zmq.asyncio.Poller()
        for sock in (*self._subs, *self._monitors):
            self._async_poller.register(sock, zmq.POLLIN)

    async def recv(self, timeout: float | None = None) -> Message | None:
        """Return the next live batch, or None on timeout or close (see ZmqSubscriber)."""
        limit = check_timeout(timeout)
        deadline = deadline_after(limit)
        self._enter()
        try:
            polled = False
            while not self._closed:
                message = self._take()
                if message is not None:
                    return message
                left = remaining(deadline)
                if polled and left == 0.0:
                    return None
                self._note(await self._async_poller.poll(ms(_slice(left))))
                polled = True
            return None
        finally:
            self._leave()

    async def wait_connected(self, timeout: float | None = 5.0) -> bool:
        """Poll until every endpoint has a connected peer (see ZmqSubscriber)."""
        limit = check_timeout(timeout)
        deadline = deadline_after(limit)
        self._enter()
        try:
            poller = zmq.asyncio.Poller()
            for monitor in self._monitors:
                poller.register(monitor, zmq.POLLIN)
            while not self._closed:
                if self._touch():
                    return True
                left = remaining(deadline)
                if left == 0.0:
                    return False
                wait = _CONNECT_POLL if left is None else min(left, _CONNECT_POLL)
                await poller.poll(ms(wait))
            return False
        finally:
            self._leave()

    async def replay(
        self, source: int | str, start_seq: int, *, timeout: float = 5.0
    ) -> ReplayResult:
        """Replay from a publisher's replay socket (see :meth:`ZmqSubscriber.replay`)."""
        index, endpoint = self._replay_target(source)
        check_seq(start_seq)
        limit = check_timeout(timeout)
        run = _ReplayRun(index, start_seq)
        await self._exchange("replay", endpoint, replay_request(start_seq), run, limit)
        return run.result(self.stats)

    async def snapshot(self, source: int | str, *, timeout: float = 5.0) -> SnapshotResult:
        """Ask for a snapshot (see :meth:`ZmqSubscriber.snapshot`)."""
        index, endpoint = self._replay_target(source)
        limit = check_timeout(timeout)
        run = _SnapshotRun(index)
        await self._exchange("snapshot", endpoint, snapshot_request(), run, limit)
        return run.result(self.stats)

    async def _exchange(
        self, what: str, endpoint: str, request: Sequence[bytes], run: _Run, limit: float | None
    ) -> None:
        """Send ``request`` on a fresh DEALER and feed the replies to ``run`` until done."""
        deadline = deadline_after(limit)
        if self._closed:
            msg = f"{what} on a closed AsyncZmqSubscriber"
            raise TransportClosedError(msg)
        self._enter()
        try:
            dealer = self._open_request(endpoint, request)
            if dealer is None:
                return
            try:
                poller = zmq.asyncio.Poller()
                poller.register(dealer, zmq.POLLIN)
                while not run.complete and not self._closed:
                    left = remaining(deadline)
                    if left == 0.0:
                        break
                    if await poller.poll(ms(_slice(left))):
                        run.drain(dealer)
            finally:
                dealer.close(linger=0)
        finally:
            self._leave()

    def _enter(self) -> None:
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._closed and self._in_flight == 0 and self._subs:
            self._close_sockets()

    def close(self) -> None:
        """Close every socket with linger 0 (at once, or as the last call in flight leaves).

        Idempotent.
        """
        if self._mark_closed() and self._in_flight == 0:
            self._close_sockets()

    async def __aenter__(self) -> AsyncZmqSubscriber:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AsyncZmqSubscriber({list(self.endpoints)!r}, closed={self._closed})"


def _slice(left: float | None) -> float:
    return _ASYNC_SLICE if left is None else min(left, _ASYNC_SLICE)
