"""A circuit breaker per engine: down after K consecutive failures, retried half-open.

States: **closed** (the engine takes traffic), **open** (it does not, until the wait is
over), **half-open** (one trial is allowed: a health check or a request). A success in any
state closes the breaker and resets the wait; a failure while half-open opens it again with
the wait doubled, up to a bound. The breaker holds no clock of its own (one is passed in),
so tests drive it by hand.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["CircuitBreaker"]


class CircuitBreaker:
    """Count an engine's consecutive failures and say whether it may take traffic.

    Parameters
    ----------
    failures_to_open : int
        Consecutive failures that open the breaker (K).
    open_seconds : float
        The wait before the first half-open trial.
    max_open_seconds : float
        The longest wait (each failed trial doubles it).
    clock : callable, default time.monotonic

    Examples
    --------
    >>> now = [0.0]
    >>> b = CircuitBreaker(2, 1.0, 4.0, clock=lambda: now[0])
    >>> b.failure(), b.failure(), b.state
    (False, True, 'open')
    >>> now[0] = 1.0
    >>> b.state, b.try_half_open(), b.state
    ('open', True, 'half-open')
    >>> b.failure(), b.wait
    (True, 2.0)
    >>> b.success(), b.state
    (True, 'closed')
    """

    def __init__(
        self,
        failures_to_open: int,
        open_seconds: float,
        max_open_seconds: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failures_to_open = failures_to_open
        self.open_seconds = open_seconds
        self.max_open_seconds = max_open_seconds
        self._clock = clock
        self.failures = 0  # consecutive
        self.opens = 0  # times it opened, for the metrics
        self.state = "closed"
        self.wait = open_seconds
        self.opened_at = 0.0

    def failure(self) -> bool:
        """Count a failure; returns True when this one opened the breaker (or kept it open)."""
        self.failures += 1
        if self.state == "half-open":
            self.wait = min(self.wait * 2, self.max_open_seconds)
            self._open()
            return True
        if self.state == "closed" and self.failures >= self.failures_to_open:
            self._open()
            return True
        return self.state == "open"

    def success(self) -> bool:
        """Count a success; returns True when it closed an open or half-open breaker."""
        was = self.state
        self.failures = 0
        self.state = "closed"
        self.wait = self.open_seconds
        return was != "closed"

    def try_half_open(self) -> bool:
        """An open breaker whose wait is over goes half-open: returns True then (one trial)."""
        if self.state == "open" and self._clock() - self.opened_at >= self.wait:
            self.state = "half-open"
            return True
        return False

    def _open(self) -> None:
        self.state = "open"
        self.opened_at = self._clock()
        self.opens += 1

    def __repr__(self) -> str:
        return f"CircuitBreaker(state={self.state!r}, failures={self.failures}, wait={self.wait})"
