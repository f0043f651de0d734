"""What feeds an exact-mode router's tree: the replayer, its sources, the subscriptions
and the background thread that runs the router's idle loop.

The router opens no socket itself: a :class:`~radixmeta.events.subscription.FleetSubscription`
it builds (``Router.subscribe``) receives the workers' events and hands them to the
replayer, and serves the replayer's gap repairs for its workers. The router keeps it
only to poll it in ``idle`` and to close it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from radixmeta.events.replay import Replayer, ReplaySource

if TYPE_CHECKING:
    from radixmeta._records import Record
    from radixmeta.events.subscription import FleetSubscription
    from radixmeta.meta import MetaTree

__all__ = ["EventFeed", "WorkerSources"]


@dataclass
class WorkerSources:
    """The replayer's ReplaySource: each subscribed worker's subscription, else a fallback."""

    fallback: ReplaySource | None = None
    by_worker: dict[tuple[str, int], ReplaySource] = field(default_factory=dict)

    def _of(self, worker: str, dp_rank: int) -> ReplaySource | None:
        return self.by_worker.get((worker, dp_rank), self.fallback)

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> list[Record] | None:
        source = self._of(worker, dp_rank)
        return None if source is None else source.replay(worker, dp_rank, from_seq)

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | None:
        source = self._of(worker, dp_rank)
        return None if source is None else source.snapshot(worker, dp_rank)


class EventFeed:
    """A router's replayer, the sources it asks, its subscriptions and its idle thread.

    Not locked: the router calls it under its own lock, except ``poll`` and the
    thread's join and the subscriptions' ``close``, which it calls outside.

    Parameters
    ----------
    tree : MetaTree
    source : ReplaySource, optional
        Where gaps of the workers no subscription serves are asked for.
    restart_window : int
        See :class:`~radixmeta.events.Replayer`.
    """

    def __init__(self, tree: MetaTree, source: ReplaySource | None, restart_window: int) -> None:
        self.sources = WorkerSources(source)
        self.replayer = Replayer(tree, source=self.sources, restart_window=restart_window)
        self.subscriptions: list[FleetSubscription] = []
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()

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
        """Receive what every subscription has, without waiting."""
        for subscription in list(self.subscriptions):
            subscription.poll(0.0)

    @property
    def running(self) -> bool:
        """Whether the background thread was started and not stopped."""
        return self._thread is not None

    def start(self, interval: float, turn: Callable[[], object]) -> None:
        """Call ``turn`` in a background thread every ``interval`` seconds until ``stop``."""
        if self._thread is not None:
            msg = "the router's background thread is already running"
            raise RuntimeError(msg)
        self._stop.clear()

        def loop() -> None:
            while not self._stop.wait(interval):
                turn()

        self._thread = threading.Thread(target=loop, name="radixmeta-router", daemon=True)
        self._thread.start()

    def take_thread(self) -> threading.Thread | None:
        """Tell the background thread to stop; returns it, for the caller to join."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
        return thread

    def take_subscriptions(self) -> list[FleetSubscription]:
        """Detach every subscription; returns them, for the caller to close."""
        subscriptions, self.subscriptions = self.subscriptions, []
        return subscriptions
