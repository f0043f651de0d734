"""Warnings at a bounded rate: one line per key and interval, with what was held back.

A worker that sends a malformed batch a thousand times a second must not write a thousand
log lines a second (a full disk is one more outage): each key (a worker and what went
wrong) logs its first occurrence at once, then at most once per ``interval``, and that
line says how many it held back since the last one. The counts themselves are kept by the
caller, exactly; only the log is thinned.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable

__all__ = ["ThrottledLog"]


class ThrottledLog:
    """Log through ``logger`` at most once per ``interval`` seconds per key.

    Parameters
    ----------
    logger : logging.Logger
    interval : float, default 10.0
        Seconds between two lines of one key.
    clock : callable, default time.monotonic
    """

    def __init__(
        self,
        logger: logging.Logger,
        interval: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        self.interval = interval
        self._clock = clock
        self._lock = threading.Lock()
        self._last: dict[Hashable, float] = {}
        self._held: dict[Hashable, int] = {}

    def warning(self, key: Hashable, msg: str, *args: object) -> bool:
        """Log ``msg % args`` as a warning unless ``key`` logged within the interval.

        Returns whether it was logged. A line after held-back ones ends with their count.
        """
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._held[key] = self._held.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._held.pop(key, 0)
        if held:
            msg += f" ({held} more like it in the last {self.interval:g} s not logged)"
        self.logger.warning(msg, *args)
        return True

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s state (its next line logs at once)."""
        with self._lock:
            self._last.pop(key, None)
            self._held.pop(key, None)
