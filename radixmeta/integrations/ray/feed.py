"""The exact-mode feed thread: every event socket of a router instance, in one thread.

A router instance subscribes to a replica when the replica first advertises its KV
events, which can be after the replica has published some: ZeroMQ's live socket
only delivers what is sent once it is connected, and a gap shows only when the
replica sends again. So the thread probes each new subscription's replay socket at
once (the replica's buffered batches, from the first), and every ``probe_every``
seconds after, besides running the router's ``idle`` turn. Probes wait on sockets,
so they run here, never on Serve's event loop and never under a lock; a removed
replica's subscription is closed here too, by the thread that uses its sockets. An
error in a turn is logged and counted, and the thread goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import TYPE_CHECKING, Any

from radixmeta._workers import WorkerId

if TYPE_CHECKING:
    from radixmeta.router import Router

__all__ = ["FeedThread"]

logger = logging.getLogger(__name__)


class FeedThread:
    """Run a router's replay turns and its subscriptions' probes in a daemon thread.

    Parameters
    ----------
    router : Router
        An exact-mode router.
    interval : float
        Seconds between two idle turns.
    probe_every : float, default 1.0
        Seconds between two probes of every subscription.
    """

    def __init__(self, router: Router, interval: float, probe_every: float = 1.0) -> None:
        self.router = router
        self.interval = interval
        self.probe_every = probe_every
        self.errors = 0
        self._changes: queue.SimpleQueue[tuple[str, WorkerId, Any]] = queue.SimpleQueue()
        self._followed: dict[WorkerId, Any] = {}
        self._thread = threading.Thread(target=self._run, name="radixmeta-ray-feed", daemon=True)
        self._thread.start()

    def follow(self, worker: WorkerId, subscription: Any) -> None:
        """Probe ``subscription`` (made for ``worker``) from now on, first at once."""
        self._changes.put(("follow", worker, subscription))

    def drop(self, worker: WorkerId) -> None:
        """Stop following ``worker`` and close its subscription (in the thread)."""
        self._changes.put(("drop", worker, None))

    def _apply_changes(self) -> list[Any]:
        fresh: list[Any] = []
        while True:
            try:
                change, worker, subscription = self._changes.get_nowait()
            except queue.Empty:
                return fresh
            if change == "follow":
                self._followed[worker] = subscription
                fresh.append(subscription)
            else:
                dropped = self._followed.pop(worker, None)
                if dropped is not None:
                    dropped.close()  # detaches it from the router too

    def _run(self) -> None:
        last_probe = time.monotonic()
        while not self.router.closed:
            try:
                for subscription in self._apply_changes():
                    subscription.probe()
                if time.monotonic() - last_probe >= self.probe_every:
                    last_probe = time.monotonic()
                    for subscription in list(self._followed.values()):
                        subscription.probe()
                self.router.idle()
            except Exception:  # a turn that fails is counted; the feed goes on
                self.errors += 1
                logger.exception("radixmeta Ray router: event feed turn failed")
            time.sleep(self.interval)
