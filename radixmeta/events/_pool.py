"""A few daemon threads that run the replayer's network calls (repairs, probes).

A replay or snapshot request may wait on a socket for its whole timeout; it must not
hold any lock meanwhile, nor delay the other workers' records. So each runs here, on a
thread of its own, and hands its answer back to the replayer, which applies it under
its lock at its next turn. Threads are made when calls come and leave after a second
with nothing to do, up to ``max_threads`` at once (calls beyond wait in order).

Every call is wrapped: an exception it lets out is logged and the thread goes on, so a
source that raises never leaves a dead thread or a call that never answers (the
replayer's calls catch their own errors first; this is the last line).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

__all__ = ["CallPool"]

logger = logging.getLogger("radixmeta.replay")

_LINGER = 1.0  # seconds an idle thread waits for a call before it leaves


class CallPool:
    """Run calls on up to ``max_threads`` daemon threads named ``name``.

    Parameters
    ----------
    name : str
    max_threads : int, default 8
    """

    def __init__(self, name: str, max_threads: int = 8) -> None:
        self.name = name
        self.max_threads = max_threads
        self._calls: deque[Callable[[], object]] = deque()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._threads: set[threading.Thread] = set()
        self._idle = 0
        self._closed = False

    def submit(self, call: Callable[[], object]) -> bool:
        """Queue ``call``; False (and nothing runs) once the pool is closed."""
        with self._lock:
            if self._closed:
                return False
            self._calls.append(call)
            if self._idle:
                self._ready.notify()
            elif len(self._threads) < self.max_threads:
                thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._threads.add(thread)
                thread.start()
            return True

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                deadline = time.monotonic() + _LINGER
                while not self._calls and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    self._idle += 1
                    self._ready.wait(left)
                    self._idle -= 1
                if not self._calls:
                    self._threads.discard(me)
                    return
                call = self._calls.popleft()
            try:
                call()
            except Exception:  # the calls catch their own; this keeps the thread alive
                logger.exception("a background replay call failed")

    @property
    def busy(self) -> int:
        """Calls queued or running."""
        with self._lock:
            return len(self._calls) + len(self._threads) - self._idle

    def close(self, timeout: float | None = 5.0) -> bool:
        """Take no more calls, drop the queued ones, and wait for the running ones.

        Returns whether every thread left within ``timeout`` seconds (a call that waits
        on a socket returns once its source is closed).
        """
        with self._lock:
            self._closed = True
            self._calls.clear()
            self._ready.notify_all()
            threads = list(self._threads)
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            thread.join(left)
        return not any(t.is_alive() for t in threads)
