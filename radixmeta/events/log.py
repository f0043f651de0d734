"""EventLog: a worker's eviction log, the A.4 design's committed queue.

The ring lives in the active backend (a C++ observer of the native tree, or the
reference's deque); this module gives it its public name and documentation.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from radixmeta._impl import backend

if TYPE_CHECKING:  # both backends have this API; the stub describes it
    from radixmeta._core import EventLogCore as _EventLogCore
else:
    _EventLogCore = backend.EventLogCore

__all__ = ["EventLog"]


class EventLog(_EventLogCore):
    """A bounded log of every node a :class:`~radixmeta.RadixCache` stores or removes.

    Attach it with ``RadixCache(..., event_log=log)``. Each node the cache
    stores (a new leaf of ``insert``) or removes (a leaf evicted by ``evict``,
    by capacity eviction, or dropped by ``reset``, which records one
    ``Cleared``) becomes one record, numbered by a sequence from 0. Records are
    kept in the core and become Python objects only when read. Replaying a
    cache's records into an empty :class:`~radixmeta.MetaTree` reproduces what
    the cache holds.

    Parameters
    ----------
    capacity : int, default 65536
        Records the ring holds; older ones are dropped, and a consumer that
        asks for them gets :class:`~radixmeta.errors.LogTruncatedError`.
    max_tokens : int, default 2**22
        Tokens all held records' paths may take; past it the oldest records
        are dropped too. Each record counts its node's whole path, so long
        prompts fill this first. Records share their paths' tokens in the
        core, so the tokens it actually keeps (4 bytes each) are at most
        twice this and usually far fewer.
    form : {"path", "blocks"}, default "path"
        ``"path"``: records carry the node's full token path and where its own
        pages start. ``"blocks"``: they name each page (the cache's page size is
        the block size) by a chained 64-bit hash, as engines publish them.
    hash : {"chain", "sglang"} or callable, optional
        Block form only. ``"chain"`` (the default) is cheap and computed by the
        core; ``"sglang"`` is SGLang's SHA-256 chain (0.5.6+), so a router
        outside radixmeta computes the same hashes; a callable takes
        ``(path_tokens, page_size)`` and returns one unsigned 64-bit hash per
        page of the path. A callable that also accepts a ``namespace`` keyword
        is given the record's namespace, for engines whose hashes depend on it
        (SGLang seeds a salted chain differently). Hashes are computed when
        records are read.
    worker : str, default ""
        The worker name the records carry.
    dp_rank : int, default 0
        The data-parallel rank the records carry.

    Notes
    -----
    With no log attached a cache pays nothing. With one, a record copies only
    the labels the ring does not hold yet (a stored leaf's own label; for a
    removed leaf usually nothing) and names the rest of its path in what
    earlier records copied, in memory the ring keeps and reuses; ``read``
    puts each path together. A producer that knows what every consumer has
    applied drops it with ``discard(through_seq)`` (O(records dropped)); a read
    from before what was discarded raises ``LogTruncatedError``, as for records
    the bounds dropped.

    Examples
    --------
    >>> from radixmeta import EventLog, RadixCache
    >>> log = EventLog(worker="w0")
    >>> cache = RadixCache(event_log=log)
    >>> cache.insert([1, 2, 3]), cache.insert([1, 2, 9])
    (0, 2)
    >>> [(r.kind, r.key.tolist(), r.start) for r in log.read()]
    [('stored', [1, 2, 3], 0), ('stored', [1, 2, 9], 2)]
    >>> cache.evict(1).count, log.read(after=1)[0].kind
    (1, 'removed')
    """

    __slots__ = ()
