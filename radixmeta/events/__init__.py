"""Events: the A.4 eviction log on the worker, its replay on the router.

This package gathers the event layer's public names: the records
(:class:`Stored`, :class:`Removed`, :class:`Cleared`), the worker-side
:class:`EventLog` (which the cache fills), and the router-side
:class:`Replayer` with its sources. One module per job:

* :mod:`radixmeta.events.log`: :class:`EventLog`, a cache's bounded, numbered log;
* :mod:`radixmeta.events.replay`: the :class:`Replayer` (gaps, restarts,
  resyncs) and its :class:`ReplaySource` protocol;
* :mod:`radixmeta.events.ingest`: engine events (vLLM, SGLang) into records;
* :mod:`radixmeta.events.publishing`: :class:`~radixmeta.events.publishing.LogPublisher`,
  a cache's log on a ZeroMQ publisher, with snapshots;
* :mod:`radixmeta.events.subscription`:
  :class:`~radixmeta.events.subscription.FleetSubscription`, many workers'
  streams into one replayer.

The records themselves are defined below the binding (``radixmeta._records``),
because the native core builds them when a log is read: the binding never imports
this package. The modules' old top-level paths (``radixmeta.replay``,
``radixmeta.log``...) re-export the same objects.
"""

from __future__ import annotations

from radixmeta._records import Cleared, Namespace, Record, Removed, Stored
from radixmeta.errors import LogTruncatedError
from radixmeta.events.log import EventLog
from radixmeta.events.replay import (
    LogSource,
    Replayer,
    ReplaySource,
    ReplayStats,
    Unavailable,
    WorkerLag,
)

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
    "Unavailable",
    "WorkerLag",
]
