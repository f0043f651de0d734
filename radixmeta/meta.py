"""MetaTree: the router's view of what every worker caches.

The operations live in the active backend's ``MetaCore`` (the native
extension, or the pure-Python reference); this module adds what needs no
speed, written once for both: pickling and the text forms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from radixmeta._impl import backend

if TYPE_CHECKING:  # both backends have this API; the stub describes it
    from radixmeta._core import MetaCore as _MetaCore
else:
    _MetaCore = backend.MetaCore

__all__ = ["MetaTree"]


class MetaTree(_MetaCore):
    """One radix tree over all workers' caches; each node records which workers hold it.

    Parameters
    ----------
    page_size : int, default 1
        Tokens per KV page. Keys are held and matched in whole pages; every
        length returned is a multiple of ``page_size``.

    Notes
    -----
    See the MetaTree page of the documentation for the rules (the gap rule,
    exact and approximate workers, block events) and the cost of each method.
    Calls from several threads are atomic with respect to each other, as for
    :class:`~radixmeta.RadixCache`.

    Examples
    --------
    >>> from radixmeta import MetaTree
    >>> tree = MetaTree(page_size=2)
    >>> a = tree.add_worker("worker-a")
    >>> b = tree.add_worker("worker-b")
    >>> tree.insert([1, 2, 3, 4, 5, 6], a)
    3
    >>> tree.insert([1, 2, 7, 7], b)
    2
    >>> m = tree.match([1, 2, 3, 4, 9, 9])
    >>> m.lengths.tolist(), m.best()[0].name
    ([4, 2], 'worker-a')
    """

    __slots__ = ()

    def __reduce__(self) -> tuple[Any, ...]:
        worker_state, workers = self._pickle_state()  # one consistent view, even with threads
        return (_restore, (type(self), self.page_size, worker_state, workers))

    def __repr__(self) -> str:
        return (
            f"MetaTree(page_size={self.page_size}, workers={len(self.workers)}, "
            f"nodes={self.node_count})"
        )


def _restore(
    cls: type[MetaTree], page_size: int, worker_state: Any, workers: list[Any]
) -> MetaTree:
    """Rebuild a pickled MetaTree: same workers (indices, generations), marks, recency, hashes."""
    tree = cls(page_size)
    tree._adopt_table(worker_state)
    slots = worker_state[0]
    for index, records, blocks in workers:
        worker = slots[index]
        # Records of an approximate worker come oldest first, so replaying
        # them in order rebuilds its recency order as well as its pages.
        for key, start, namespace, extras, tier in records:
            tree.insert(key, worker, start=start, tier=tier, extras=extras, namespace=namespace)
        for block_hash, key, namespace, extras in blocks:
            tree._bind_hash(worker, key, block_hash, namespace, extras)
    return tree
