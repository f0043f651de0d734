"""What feeds an exact-mode router's tree: the replayer, its sources, the subscriptions
and the supervised background thread that runs the router's idle loop.

The router opens no socket itself: a :class:`~radixmeta.events.subscription.FleetSubscription`
it builds (``Router.subscribe``) receives the workers' events and hands them to the
replayer, and serves the replayer's gap repairs for its workers. The router keeps it
only to poll it in ``idle`` and to close it.

The background thread is supervised: a turn that raises is logged and counted, the
thread waits (backing off, up to a second) and goes on. Nothing from outside stops the
event path; ``Router.health()`` shows the thread's state and its last error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixmeta.events._throttle import ThrottledLog
from radixmeta.events.replay import Replayer, ReplaySource, Unavailable

if TYPE_CHECKING:
    from radixmeta._records import Record
    from radixmeta.events.subscription import FleetSubscription
    from radixmeta.meta import MetaTree

__all__ = ["EventFeed", "EventThread", "WorkerSources", "backoff"]

logger = logging.getLogger("radixmeta.router")

#: Messages one poll of a subscription takes at most: a backlog is applied turn by turn
#: (what waits past it stays in the socket's buffer, bounded by its high-water mark).
POLL_LIMIT = 4096
#: The longest wait between two turns of a thread whose turns keep failing.
MAX_BACKOFF = 1.0
#: The shortest wait after a failed turn, whatever the interval (0 included): a turn
#: that keeps failing never spins.
MIN_BACKOFF = 0.01


def backoff(interval: float, failures: int) -> float:
    """Seconds to wait after ``failures`` turns in a row raised.

    Doubles from ``max(interval, MIN_BACKOFF)`` up to :data:`MAX_BACKOFF`; the
    exponent is capped, so no count of failures overflows a float.
    """
    base = max(interval, MIN_BACKOFF)
    return min(MAX_BACKOFF, base * 2.0 ** min(failures, 32))


@dataclass
class WorkerSources:
    """The replayer's ReplaySource: each subscribed worker's subscription, else a fallback."""

    fallback: ReplaySource | None = None
    by_worker: dict[tuple[str, int], ReplaySource] = field(default_factory=dict)

    def _of(self, worker: str, dp_rank: int) -> ReplaySource | None:
        return self.by_worker.get((worker, dp_rank), self.fallback)

    def replay(
        self, worker: str, dp_rank: int, from_seq: int
    ) -> list[Record] | Unavailable | None:
        source = self._of(worker, dp_rank)
        if source is None:
            return Unavailable("no source serves this worker")
        return source.replay(worker, dp_rank, from_seq)

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | Unavailable | None:
        source = self._of(worker, dp_rank)
        if source is None:
            return Unavailable("no source serves this worker")
        return source.snapshot(worker, dp_rank)

    def can_replay(self, worker: str, dp_rank: int) -> bool:
        return self._can("can_replay", worker, dp_rank)

    def can_snapshot(self, worker: str, dp_rank: int) -> bool:
        return self._can("can_snapshot", worker, dp_rank)

    def _can(self, what: str, worker: str, dp_rank: int) -> bool:
        """The serving source's ``can_replay`` or ``can_snapshot``; True if it has none."""
        source = self._of(worker, dp_rank)
        if source is None:
            return False
        can = getattr(source, what, None)
        return True if can is None else bool(can(worker, dp_rank))


def _describe(exc: BaseException) -> str:
    """``repr(exc)``, or its type's name when its ``repr`` itself raises."""
    try:
        return repr(exc)
    except Exception:
        return f"<{type(exc).__name__} whose repr failed>"


class EventThread:
    """A daemon thread that calls ``turn`` every ``interval`` seconds until stopped.

    Supervised: an exception from a turn is logged (at a bounded rate), counted, and
    the next turn comes after a backoff (:func:`backoff`) that doubles from
    ``max(interval, MIN_BACKOFF)`` up to :data:`MAX_BACKOFF`, however many turns
    fail; a turn that succeeds resets it. ``interval`` 0 runs turns back to back
    while they succeed, never while they fail. Only the thread's own end (``stop``)
    ends it.

    Attributes
    ----------
    state : str
        ``"running"``, ``"backing off"`` (the last turn raised), ``"stopped"``, or
        ``"dead"`` (it ended some other way, which the supervision is there to prevent).
    turns, errors : int
        Turns run, and those that raised.
    last_error : str or None
        The last exception, as ``repr``.
    """

    def __init__(self, interval: float, turn: Callable[[], object], name: str) -> None:
        self.interval = interval
        self.state = "running"
        self.turns = 0
        self.errors = 0
        self.last_error: str | None = None
        self.last_turn: float | None = None  # monotonic time the last turn ended
        self._turn = turn
        self._stop = threading.Event()
        self._log = ThrottledLog(logger)
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        delay = self.interval
        failures = 0
        try:
            while not self._stop.wait(delay):
                try:
                    self._turn()
                except Exception as exc:  # logged, counted, backed off: never a silent death
                    failures += 1
                    self.errors += 1
                    self.last_error = _describe(exc)
                    self.state = "backing off"
                    delay = backoff(self.interval, failures)
                    if self._log.warning("turn", "the router's event turn failed: %r", exc):
                        logger.debug("the failed turn", exc_info=exc)
                else:
                    failures = 0
                    delay = self.interval
                    self.state = "running"
                self.turns += 1
                self.last_turn = time.monotonic()
        finally:
            self.state = "stopped" if self._stop.is_set() else "dead"

    @property
    def alive(self) -> bool:
        """Whether the thread runs."""
        return self.thread.is_alive()

    def stop(self) -> None:
        """Tell the thread to end after its current turn (join ``thread`` to wait)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        """Whether ``stop`` was called."""
        return self._stop.is_set()

    def health(self) -> dict[str, Any]:
        """The thread's state, as ``Router.health()["thread"]`` shows it."""
        since = None if self.last_turn is None else time.monotonic() - self.last_turn
        return {
            "state": self.state if self.alive or self.state != "running" else "dead",
            "alive": self.alive,
            "turns": self.turns,
            "errors": self.errors,
            "last_error": self.last_error,
            "seconds_since_turn": since,
        }


class EventFeed:
    """A router's replayer, the sources it asks, its subscriptions and its idle thread.

    Not locked: the router calls it under its own lock, except ``poll``, ``probe``
    and the thread's join and the subscriptions' ``close``, which it calls outside.

    Parameters
    ----------
    tree : MetaTree
    source : ReplaySource, optional
        Where gaps of the workers no subscription serves are asked for.
    restart_window : int
        See :class:`~radixmeta.events.Replayer`.
    max_pending : int
        See :class:`~radixmeta.events.Replayer`.
    probe_interval : float
        Seconds between two probes for lost tails (0: never).
    """

    def __init__(
        self,
        tree: MetaTree,
        source: ReplaySource | None,
        restart_window: int,
        max_pending: int,
        probe_interval: float,
    ) -> None:
        self.sources = WorkerSources(source)
        self.replayer = Replayer(
            tree, source=self.sources, restart_window=restart_window, max_pending=max_pending
        )
        self.subscriptions: list[FleetSubscription] = []
        self.probe_interval = probe_interval
        self._last_probe: float | None = None
        self._thread: EventThread | None = None
        self._log = ThrottledLog(logger)

    def attach(self, subscription: FleetSubscription) -> None:
        """Poll ``subscription`` from now on and ask it for its workers' gaps."""
        self.subscriptions.append(subscription)
        for key in subscription.sources:
            self.sources.by_worker[key] = subscription

    def detach(self, subscription: FleetSubscription) -> bool:
        """Stop polling ``subscription`` and asking it for gaps; False if it was not attached."""
        if subscription not in self.subscriptions:
            return False
        self.subscriptions.remove(subscription)
        for key in subscription.sources:
            if self.sources.by_worker.get(key) is subscription:
                del self.sources.by_worker[key]
        return True

    def serving(self, key: tuple[str, int]) -> FleetSubscription | None:
        """The attached subscription that feeds worker ``key`` (name, rank), if any."""
        for subscription in self.subscriptions:
            if key in subscription.sources:
                return subscription
        return None

    def poll(self) -> None:
        """Receive what every subscription has, without waiting (a bounded number each).

        A subscription that fails here (closed meanwhile, a socket error) is logged
        and passed over: the others are still polled.
        """
        for subscription in list(self.subscriptions):
            try:
                subscription.poll(0.0, max_messages=POLL_LIMIT)
            except Exception as exc:
                self._log.warning(
                    ("poll", id(subscription)), "polling a subscription failed: %r", exc
                )

    def probe_if_due(self) -> int:
        """Probe the quiet workers for lost tails, every ``probe_interval`` seconds.

        The probes run in the background (the replayer's threads): this never waits.
        """
        if not self.probe_interval:
            return 0
        now = time.monotonic()
        if self._last_probe is not None and now - self._last_probe < self.probe_interval:
            return 0
        self._last_probe = now
        return self.replayer.probe(quiet=self.probe_interval)

    @property
    def running(self) -> bool:
        """Whether the background thread was started and not told to stop."""
        return self._thread is not None and not self._thread.stopping

    @property
    def thread(self) -> EventThread | None:
        """The background thread last started (running or not), if any."""
        return self._thread

    def start(self, interval: float, turn: Callable[[], object]) -> None:
        """Call ``turn`` in a supervised thread every ``interval`` seconds until stopped."""
        if self.running:
            msg = "the router's background thread is already running"
            raise RuntimeError(msg)
        self._thread = EventThread(interval, turn, "radixmeta-router")

    def take_thread(self) -> threading.Thread | None:
        """Tell the background thread to stop; returns it, for the caller to join."""
        if not self.running:
            return None
        assert self._thread is not None
        self._thread.stop()
        return self._thread.thread

    def take_subscriptions(self) -> list[FleetSubscription]:
        """Detach every subscription; returns them, for the caller to close."""
        subscriptions, self.subscriptions = self.subscriptions, []
        for subscription in subscriptions:
            for key in subscription.sources:
                self.sources.by_worker.pop(key, None)
        return subscriptions
