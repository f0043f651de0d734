"""Event records: what a worker's cache stored, removed or cleared.

These are base types, below the binding: the cache produces them (the native
core builds them here, through :func:`make_record`, when its event log is read),
so the binding imports this module and nothing of the events package above it.
:mod:`radixmeta.events` re-exports them for the layers above. A record is
immutable, cheap (a msgspec Struct with no GC tracking) and picklable (by this
module's path, which is why they stay here). The event log's argument rules,
which both cores share too, are :mod:`radixmeta._log_settings`.

A record has one of two forms:

* the **token-path form** (what :class:`~radixmeta.EventLog` writes by default):
  ``key`` is the full path from the root to the end of the node, and ``start``
  where the node's own pages begin in it, exactly what
  ``MetaTree.insert/remove(key, worker, start=start)`` take;
* the **block form** (what engines send): ``block_hashes`` name the node's
  pages, ``parent_hash`` the page before them (None at the root), and
  ``token_ids`` hold those pages' tokens, as ``MetaTree.apply_stored`` takes.

Sequence numbers: an in-process log numbers records; on the wire engines number
batches, and a record is named by ``(seq, index)``, its position in the batch.
"""

from __future__ import annotations

from typing import Any, ClassVar

import msgspec
import numpy as np
import numpy.typing as npt

__all__ = ["Cleared", "Namespace", "Record", "Removed", "Stored"]

Namespace = str | int | bytes | None


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return a is not None and b is not None and np.array_equal(a, b)
    return bool(a == b)


class _Record(msgspec.Struct, frozen=True, gc=False, eq=False):
    """Fields every record has; equality compares arrays by value."""

    worker: str
    dp_rank: int
    seq: int

    kind: ClassVar[str] = ""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        return all(_same(getattr(self, f), getattr(other, f)) for f in self.__struct_fields__)

    def __hash__(self) -> int:  # arrays are not hashable: name a record by where it stands
        return hash((type(self).__name__, self.worker, self.dp_rank, self.seq, self.index))

    index: int = 0  # position within a wire batch (0 for an in-process log)


class Stored(_Record, frozen=True, gc=False, eq=False):
    """The worker now holds these pages.

    Attributes
    ----------
    tier : int
        0 for the device, 1 for host memory.
    namespace : str, int, bytes or None
        The cache namespace (LoRA adapter, cache salt) the pages belong to. A
        RadixCache namespace of another hashable type is carried as it is, but
        only these four cross a process boundary.
    key, start : numpy.ndarray of uint32, int
        Token-path form: the full path to the node's end, and where its own pages start.
    block_hashes, parent_hash, token_ids, extras
        Block form: a uint64 hash per page, the hash of the page before them
        (None at the root), the pages' tokens (uint32), and a uint64 extra tag
        per page (None when the engine hashes tokens only).
    """

    kind: ClassVar[str] = "stored"

    tier: int = 0
    namespace: Namespace = None
    key: npt.NDArray[np.uint32] | None = None
    start: int = 0
    block_hashes: npt.NDArray[np.uint64] | None = None
    parent_hash: int | None = None
    token_ids: npt.NDArray[np.uint32] | None = None
    extras: npt.NDArray[np.uint64] | None = None

    @property
    def form(self) -> str:
        """``"blocks"`` or ``"path"``."""
        return "blocks" if self.block_hashes is not None else "path"


class Removed(_Record, frozen=True, gc=False, eq=False):
    """The worker dropped these pages (the forms of :class:`Stored`; no tokens in block form)."""

    kind: ClassVar[str] = "removed"

    tier: int = 0
    namespace: Namespace = None
    key: npt.NDArray[np.uint32] | None = None
    start: int = 0
    block_hashes: npt.NDArray[np.uint64] | None = None

    @property
    def form(self) -> str:
        """``"blocks"`` or ``"path"``."""
        return "blocks" if self.block_hashes is not None else "path"


class Cleared(_Record, frozen=True, gc=False, eq=False):
    """The worker dropped everything it held (a cache reset)."""

    kind: ClassVar[str] = "cleared"


Record = Stored | Removed | Cleared


STORED, REMOVED, CLEARED = 0, 1, 2  # the kinds of the native ring (event_ring.hpp)


def make_record(
    kind: int,
    worker: str,
    dp_rank: int,
    seq: int,
    namespace: Any,
    path: npt.NDArray[np.uint32],
    start: int,
    page_size: int,
    hashes: npt.NDArray[np.uint64] | None,
) -> Record:
    """One log record from what the cache recorded: a node's full ``path`` and ``start``.

    With ``hashes`` (one per page of ``path``) the record is in block form,
    else in token-path form. Both cores' logs build their records here.
    """
    if kind == CLEARED:
        return Cleared(worker, dp_rank, seq)
    path.flags.writeable = False
    if hashes is None:
        if kind == STORED:
            return Stored(worker, dp_rank, seq, namespace=namespace, key=path, start=start)
        return Removed(worker, dp_rank, seq, namespace=namespace, key=path, start=start)
    first = start // page_size
    own = hashes[first:]
    own.flags.writeable = False
    if kind == REMOVED:
        return Removed(worker, dp_rank, seq, namespace=namespace, block_hashes=own)
    parent = int(hashes[first - 1]) if first else None
    return Stored(
        worker,
        dp_rank,
        seq,
        namespace=namespace,
        block_hashes=own,
        parent_hash=parent,
        token_ids=path[start:],
    )
