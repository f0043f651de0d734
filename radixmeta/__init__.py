"""radixmeta: prefix trees for LLM serving (worker radix KV cache, router meta-tree)."""

from __future__ import annotations

from radixmeta import errors
from radixmeta._blocks import BlockStatus
from radixmeta._impl import backend as _backend
from radixmeta._impl import implementation
from radixmeta._types import CacheStats, DumpRecord, MetaItem
from radixmeta._workers import WorkerId
from radixmeta.cache import RadixCache
from radixmeta.events import EventLog
from radixmeta.meta import MetaTree
from radixmeta.router import Decision, Router, WorkerLoad

__version__ = "0.1.0"

Node = _backend.Node
MatchResult = _backend.MatchResult
EvictResult = _backend.EvictResult
MetaMatch = _backend.MetaMatch

__all__ = [
    "BlockStatus",
    "CacheStats",
    "Decision",
    "DumpRecord",
    "EventLog",
    "EvictResult",
    "MatchResult",
    "MetaItem",
    "MetaMatch",
    "MetaTree",
    "Node",
    "RadixCache",
    "Router",
    "WorkerId",
    "WorkerLoad",
    "errors",
    "implementation",
    "__version__",
]
