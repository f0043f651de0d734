"""radixmeta: prefix trees for LLM serving (worker radix KV cache, router meta-tree)."""

from __future__ import annotations

from radixmeta import errors
from radixmeta._blocks import BlockStatus
from radixmeta._impl import backend as _backend
from radixmeta._impl import implementation
from radixmeta._types import CacheStats, DumpRecord, MetaItem
from radixmeta._workers import WorkerId
from radixmeta.cache import RadixCache
from radixmeta.log import EventLog
from radixmeta.meta import MetaTree

__version__ = "0.1.0"

Node = _backend.Node
MatchResult = _backend.MatchResult
EvictResult = _backend.EvictResult
MetaMatch = _backend.MetaMatch

__all__ = [
    "BlockStatus",
    "CacheStats",
    "DumpRecord",
    "EventLog",
    "EvictResult",
    "MatchResult",
    "MetaItem",
    "MetaMatch",
    "MetaTree",
    "Node",
    "RadixCache",
    "WorkerId",
    "errors",
    "implementation",
    "__version__",
]
