"""Race a request's work against its client going away (the gateway and its stand-in)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def disconnected(receive: Callable[[], Awaitable[Any]]) -> None:
    """Return when the client disconnects (its request body was read already)."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def unless_disconnected(
    work: Coroutine[Any, Any, T], receive: Callable[[], Awaitable[Any]]
) -> T | None:
    """``work``'s result, or None once the client left first (``work`` is then cancelled)."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(receive))
    await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        gone.cancel()
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return None
