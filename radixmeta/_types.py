"""Small result types and texts shared by both implementations (never on a hot path)."""

from __future__ import annotations

from dataclasses import dataclass

EVICTION_POLICIES = ("lru", "lfu", "fifo", "priority")
TAKE_EVICTED_DEPRECATION = (
    "take_evicted() is deprecated and returns only what the most recent insert freed: "
    "pass on_evict= to RadixCache to receive every slot the cache frees on its own"
)


@dataclass(frozen=True)
class CacheStats:
    """Cumulative counters of a :class:`~radixmeta.RadixCache` since creation or ``reset()``.

    Attributes
    ----------
    lookups : int
        Number of ``match_prefix`` calls.
    hit_tokens : int
        Sum of the matched lengths returned by ``match_prefix``.
    inserted_tokens : int
        Tokens newly stored by ``insert`` (already-cached prefixes not counted).
    evicted_tokens : int
        Tokens freed by ``evict`` and by capacity-driven eviction in ``insert``.
    """

    lookups: int = 0
    hit_tokens: int = 0
    inserted_tokens: int = 0
    evicted_tokens: int = 0
