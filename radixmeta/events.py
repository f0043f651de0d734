"""Events: the A.4 eviction log on the worker, its replay on the router.

This module gathers the event layer's public names: the records
(:class:`Stored`, :class:`Removed`, :class:`Cleared`), the worker-side
:class:`EventLog` (which the cache fills, so it lives below the trees), and the
router-side :class:`Replayer` with its sources.
"""

from __future__ import annotations

from radixmeta._records import Cleared, Namespace, Record, Removed, Stored
from radixmeta.errors import LogTruncatedError
from radixmeta.log import EventLog
from radixmeta.replay import LogSource, Replayer, ReplaySource, ReplayStats, WorkerLag

__all__ = [
    "Cleared",
    "EventLog",
    "LogSource",
    "LogTruncatedError",
    "Namespace",
    "Record",
    "Removed",
    "ReplaySource",
    "ReplayStats",
    "Replayer",
    "Stored",
    "WorkerLag",
]
