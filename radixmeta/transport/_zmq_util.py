"""Helpers shared by the ZeroMQ publisher and subscribers: checks, timing, contexts."""

from __future__ import annotations

import contextlib
import math
import socket
import time
from collections.abc import Mapping
from typing import Any

import zmq
import zmq.asyncio

from radixmeta.errors import InputTypeError, InvalidInputError

__all__ = [
    "DEFAULT_ENDPOINT",
    "SocketOptions",
    "Wakeup",
    "attach",
    "check_bind",
    "check_endpoint",
    "context_for",
    "deadline_after",
    "ms",
    "remaining",
]

#: Where a publisher listens when given no endpoint: loopback only, vLLM's port.
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"

#: Extra ``setsockopt`` options, applied before bind/connect.
SocketOptions = Mapping[int, int | bytes]


def check_endpoint(endpoint: object, name: str) -> str:
    """Return ``endpoint`` if it looks like a ZeroMQ endpoint (``scheme://...``)."""
    if not isinstance(endpoint, str) or "://" not in endpoint:
        msg = f"{name} must be a ZeroMQ endpoint like 'tcp://host:port', got {endpoint!r}"
        raise InvalidInputError(msg)
    return endpoint


def check_bind(bind: bool | None) -> bool | None:
    """Return ``bind`` if it is True, False or None."""
    if bind is not None and not isinstance(bind, bool):
        msg = f"bind must be True, False or None, got {bind!r}"
        raise InputTypeError(msg)
    return bind


def attach(
    sock: zmq.Socket[Any], endpoint: str, bind: bool, options: SocketOptions | None
) -> str:
    """Apply ``options``, then bind or connect; return the endpoint with its port resolved."""
    for option, value in (options or {}).items():
        sock.setsockopt(option, value)
    if bind:
        sock.bind(endpoint)
        return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))
    sock.connect(endpoint)
    return endpoint


def deadline_after(timeout: float | None) -> float | None:
    """The monotonic time ``timeout`` seconds from now, or None for no limit."""
    return None if timeout is None else time.monotonic() + timeout


def remaining(deadline: float | None) -> float | None:
    """Seconds left until ``deadline`` (never negative), or None for no limit."""
    return None if deadline is None else max(0.0, deadline - time.monotonic())


def ms(seconds: float | None) -> int | None:
    """Seconds as poll milliseconds, rounded up: 0.3 ms left must not become poll(0)."""
    return None if seconds is None else math.ceil(seconds * 1000)


class Wakeup:
    """A socket pair a poller watches, so close() in one thread ends a poll in another."""

    def __init__(self) -> None:
        self.reader, self._writer = socket.socketpair()
        self.reader.setblocking(False)
        self._writer.setblocking(False)

    def set(self) -> None:
        """Make :attr:`reader` readable, for good: it is never drained."""
        # Already full, or closed: either way nothing is left to wake.
        with contextlib.suppress(OSError):
            self._writer.send(b"\0")

    def close(self) -> None:
        self.reader.close()
        self._writer.close()


def context_for(context: zmq.Context[Any] | None) -> tuple[zmq.Context[Any], bool]:
    """Return the context to use and whether the caller owns (and terminates) it.

    A private context by default: terminating it on close() releases ports at once, so a
    "restarted" publisher can bind the same endpoint again. A caller may share one, which
    ``inproc://`` endpoints need (they connect only within one context). An asyncio
    context is used through a plain shadow of it, since these classes drive their sockets
    without futures and wait with a poller.
    """
    if context is None:
        return zmq.Context(), True
    if isinstance(context, zmq.asyncio.Context):
        return zmq.Context.shadow(context.underlying), False
    if not isinstance(context, zmq.Context):
        msg = f"context must be a zmq.Context, got {type(context).__name__}"
        raise InputTypeError(msg)
    return context, False
