"""radixmeta: prefix trees for LLM serving (worker radix KV cache, router meta-tree)."""

from __future__ import annotations

from radixmeta import errors
from radixmeta._impl import backend as _backend
from radixmeta._impl import implementation
from radixmeta._types import CacheStats
from radixmeta.cache import RadixCache

__version__ = "0.1.0"

Node = _backend.Node
MatchResult = _backend.MatchResult
EvictResult = _backend.EvictResult

__all__ = [
    "CacheStats",
    "EvictResult",
    "MatchResult",
    "Node",
    "RadixCache",
    "errors",
    "implementation",
    "__version__",
]
