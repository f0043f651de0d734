"""RadixCache: one worker's prefix cache of KV slots.

The hot operations (match, insert, lock, evict) live in the active backend's
``CacheCore`` (the native extension, or the pure-Python reference); this module
adds the conveniences that need no speed, written once for both.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from radixmeta._impl import backend

if TYPE_CHECKING:  # both backends have this API; the stub describes it
    from radixmeta._core import CacheCore as _CacheCore
    from radixmeta._core import Node
else:
    _CacheCore = backend.CacheCore

__all__ = ["RadixCache"]


class RadixCache(_CacheCore):
    """A radix tree over token ids that maps cached prefixes to KV-cache slots.

    Parameters
    ----------
    page_size : int, default 1
        Tokens per KV page. Keys are stored and matched in whole pages; a tail
        shorter than a page is never cached, and every length returned is a
        multiple of ``page_size``.
    eviction : {"lru", "lfu", "fifo", "priority"}, default "lru"
        Order in which unlocked leaves are freed by :meth:`evict`.
    capacity : int, optional
        Maximum number of cached tokens. When set, :meth:`insert` first evicts
        unlocked leaves to make room and raises
        :class:`~radixmeta.errors.CacheFullError` (changing nothing) when locked
        nodes make that impossible. Slots freed this way are collected until
        :meth:`take_evicted` is called.
    refresh_split_tail : bool, default False
        When a match or an insert ends inside a node and splits it, also stamp
        the lower half (the cached tokens past the cut) as just used, as
        SGLang's own trees do; by default only the matched path is stamped.
    on_evict : callable, optional
        Called with the slots (an int64 array) of every leaf that an eviction
        frees, from :meth:`evict` or an insert's capacity eviction, in place of
        collecting them for :meth:`take_evicted`.
    event_log : EventLog, optional
        A log that records every stored and removed page, for a router to
        replay (see the events page of the docs).
    store_values : bool, default True
        Keep each token's slot value. ``False`` keeps none (4 instead of 12
        bytes a cached token): every call that reads or returns slots
        (``match_prefix`` unless ``values=False``, ``insert`` with ``values``,
        :meth:`path_values`, :meth:`items`, :meth:`take_evicted`) then raises
        :class:`~radixmeta.errors.InvalidInputError`, as does ``on_evict``
        given with it, and :meth:`evict`'s result has ``values=None``.

    Raises
    ------
    InputTypeError
        An argument of the wrong type (``store_values`` not a bool).
    InvalidInputError
        An argument out of range, or ``on_evict`` with ``store_values=False``.

    Notes
    -----
    Thread safety: calls from several threads are atomic with respect to each
    other. The native core holds the GIL for a whole operation and never
    releases it midway (no lock of its own, so no extra cost); the pure-Python
    reference takes an internal re-entrant lock per call.

    Examples
    --------
    >>> from radixmeta import RadixCache
    >>> cache = RadixCache()
    >>> cache.insert([1, 2, 3, 4], [10, 11, 12, 13])
    0
    >>> m = cache.match_prefix([1, 2, 3, 9])
    >>> m.length, m.values.tolist()
    (3, [10, 11, 12])
    >>> with cache.locked(m.node):
    ...     cache.evict(100).count   # only the unlocked leaf below the match goes
    1
    """

    __slots__ = ()

    @contextmanager
    def locked(self, node: Node) -> Iterator[Node]:
        """Hold a lock on ``node`` (and so on its whole path) for the ``with`` block.

        Complexity: O(depth of the node in nodes), twice.
        """
        self.lock(node)
        try:
            yield node
        finally:
            self.unlock(node)

    def pretty(self, namespace: Hashable = None, *, max_tokens: int = 8) -> str:
        """Return the tree as indented text: one line per node, with its lock count.

        Complexity: O(n) in nodes.
        """
        lines = [repr(self)]
        for level, label, locks in self._structure(namespace):
            shown = " ".join(str(t) for t in label[:max_tokens].tolist())
            more = " ..." if len(label) > max_tokens else ""
            lock = f"  locked={locks}" if locks else ""
            lines.append(f"{'  ' * (level + 1)}[{len(label)}] {shown}{more}{lock}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (
            f"RadixCache(page_size={self.page_size}, eviction={self.eviction!r}, "
            f"capacity={self.capacity}, nodes={self.node_count}, tokens={self.total_size}, "
            f"evictable={self.evictable_size}, protected={self.protected_size})"
        )
