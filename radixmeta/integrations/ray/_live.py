"""The live router instances of this process, kept apart from the router's module.

Ray Serve registers a request router's module to be pickled by value (so that a
router class defined in a script reaches the replicas): everything that module's
class and functions reference is copied with it. A registry of live instances (with
their event loops and futures) must therefore live elsewhere: here, a module Ray
pickles by reference.
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ["add", "instances"]

_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def add(router: Any) -> None:
    """Register a router instance (forgotten when it is garbage-collected)."""
    _LIVE.add(router)


def instances() -> list[Any]:
    """The registered router instances that are still alive."""
    return list(_LIVE)
