"""The ``with`` block that every synchronous publisher and subscriber has.

Each transport class decides what closing means (sockets, threads, cursors) in its own
``close()``; leaving a ``with`` block only calls it, so that part is written once here.
"""

from __future__ import annotations

from types import TracebackType
from typing import TypeVar

__all__ = ["ClosesOnExit"]

_T = TypeVar("_T", bound="ClosesOnExit")


class ClosesOnExit:
    """A context manager that returns itself and calls ``close()`` on exit.

    The subclass defines ``close()``. Asyncio classes do not use this: their
    ``async with`` is ``__aenter__`` and ``__aexit__``.
    """

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self: _T) -> _T:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
