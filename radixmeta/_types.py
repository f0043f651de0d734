"""Small result types and texts shared by both implementations (never on a hot path)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from radixmeta._workers import WorkerId

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


class MetaItem(NamedTuple):
    """One node of a :class:`~radixmeta.MetaTree`, as ``MetaTree.items()`` lists it.

    Attributes
    ----------
    key : numpy.ndarray
        ``uint32`` tokens from the namespace's root to the end of the node.
    holders : tuple of WorkerId
        The workers holding every page of the node on the device, by ascending index.
    namespace : hashable
        The namespace the node is in (None, the default, unless one was given).
    extras : numpy.ndarray or None
        ``uint64`` extra tags of the path's pages, one per page of ``key``;
        None when every one is 0.
    host_holders : tuple of WorkerId
        The workers holding every page of the node on the host (tier 1).
    """

    key: npt.NDArray[np.uint32]
    holders: tuple[WorkerId, ...]
    namespace: Hashable = None
    extras: npt.NDArray[np.uint64] | None = None
    host_holders: tuple[WorkerId, ...] = ()


class DumpRecord(NamedTuple):
    """One record of ``MetaTree.dump(worker)``.

    ``tree.insert(r.key, worker, start=r.start, tier=r.tier, extras=r.extras,
    namespace=r.namespace)`` for each record, in order, rebuilds exactly what
    the worker held.

    Attributes
    ----------
    key : numpy.ndarray
        ``uint32`` tokens from the namespace's root to the end of a node the worker holds.
    start : int
        Where the node begins: the worker holds ``key[start:]``.
    namespace : hashable
        The node's namespace.
    extras : numpy.ndarray or None
        ``uint64`` extra tags of the path's pages; None when every one is 0.
    tier : int
        The tier the worker holds the pages on: 0 the device, 1 the host.
    """

    key: npt.NDArray[np.uint32]
    start: int
    namespace: Hashable = None
    extras: npt.NDArray[np.uint64] | None = None
    tier: int = 0

