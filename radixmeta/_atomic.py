"""Atomic calls for the pure-Python reference cores.

The native core is atomic because it holds the GIL for a whole tree operation
and reads all it returns before it creates any Python object. Plain Python code
can be interrupted between any two bytecodes, in two ways: another thread, and,
in the same thread, a garbage collection whose callbacks and finalizers may call
back into the tree. The first is kept out by a re-entrant lock per object; the
second by pausing the cyclic collector for the call, so that such code runs
before or after the operation, as it does with the native core.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable
from typing import Any, TypeVar

_F = TypeVar("_F", bound=Callable[..., Any])


def atomic(method: _F) -> _F:
    """Run ``method`` under ``self._mutex`` with the cyclic garbage collector paused."""

    @functools.wraps(method)
    def whole(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self._mutex:
            pause = gc.isenabled()  # nested calls find it paused and leave it so
            if pause:
                gc.disable()
            try:
                return method(self, *args, **kwargs)
            finally:
                if pause:
                    gc.enable()

    return whole  # type: ignore[return-value]
