"""The old path of the Replayer and its sources, now :mod:`radixmeta.events.replay`.

Kept so that ``from radixmeta.replay import ...`` goes on working: the names here are the
very objects of the events package (no warning; nobody is asked to move yet).
"""

from __future__ import annotations

from radixmeta.events.replay import (
    LogSource,
    Replayer,
    ReplaySource,
    ReplayStats,
    Unavailable,
    WorkerLag,
    batch_mark,
)

__all__ = [
    "LogSource",
    "ReplaySource",
    "ReplayStats",
    "Replayer",
    "Unavailable",
    "WorkerLag",
    "batch_mark",
]
