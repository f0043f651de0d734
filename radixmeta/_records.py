"""Event records: what a worker's cache stored, removed or cleared.

These sit below the trees because the cache produces them (through its event
log); :mod:`radixmeta.events` re-exports them for the layers above. A record is
immutable, cheap (a msgspec Struct with no GC tracking) and picklable.

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

import inspect
from typing import Any, ClassVar

import msgspec
import numpy as np
import numpy.typing as npt

from radixmeta import _hashing
from radixmeta._keys import check_int
from radixmeta.errors import InputTypeError, InvalidInputError, LogTruncatedError

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


def checked_hashes(hashes: Any, pages: int) -> npt.NDArray[np.uint64]:
    """A hash scheme's answer for ``pages`` pages, checked: one unsigned 64-bit hash each."""
    out = np.asarray(hashes)
    if out.shape != (pages,) or out.dtype.kind not in "iu":
        msg = (
            f"a hash scheme must return {pages} integer hashes (one per page), "
            f"got {out.dtype} of shape {out.shape}"
        )
        raise InvalidInputError(msg)
    return out.astype(np.uint64, copy=False)


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


FORMS = ("path", "blocks")


def log_settings(
    capacity: Any, max_tokens: Any, form: Any, hash: Any, worker: Any, dp_rank: Any
) -> tuple[int, int, str, Any, Any, str, int]:
    """Checked EventLog arguments, the same for both cores.

    Returns ``(capacity, max_tokens, form, scheme name or callable, hash
    callable or None, worker, dp_rank)``; the callable is None for the default
    chain (which the native core computes itself).
    """
    capacity = check_int("capacity", capacity, 1)
    max_tokens = check_int("max_tokens", max_tokens, 1)
    if form not in FORMS:
        msg = f"form must be 'path' or 'blocks', got {form!r}"
        raise InvalidInputError(msg)
    if not isinstance(worker, str):
        msg = f"worker must be a str, got {type(worker).__name__}"
        raise InputTypeError(msg)
    dp_rank = check_int("dp_rank", dp_rank, 0)
    if form == "path":
        if hash is not None:
            msg = "hash= applies to form='blocks' only"
            raise InvalidInputError(msg)
        return capacity, max_tokens, form, None, None, worker, dp_rank
    if hash is None or hash == "chain":
        return capacity, max_tokens, form, "chain", None, worker, dp_rank
    if isinstance(hash, str):
        if hash not in _hashing.SCHEMES:
            msg = f"hash must be 'chain', 'sglang' or a callable, got {hash!r}"
            raise InvalidInputError(msg)
        scheme = _with_namespace(_hashing.SCHEMES[hash])
        return capacity, max_tokens, form, hash, scheme, worker, dp_rank
    if not callable(hash):
        msg = f"hash must be 'chain', 'sglang' or a callable, got {type(hash).__name__}"
        raise InputTypeError(msg)
    return capacity, max_tokens, form, hash, _with_namespace(hash), worker, dp_rank


def _takes_namespace(fn: Any) -> bool:
    """Whether a hash callable accepts the ``namespace`` keyword (by name or ``**kwargs``)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: the plain form
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == "namespace" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in params
    )


def _with_namespace(fn: Any) -> Any:
    """``fn`` as a ``(path, page_size, namespace)`` callable, whichever form it takes.

    Pages of different namespaces are different blocks, and an engine's hash may
    say so (SGLang seeds salted chains differently); a scheme that does not care
    takes two arguments and is wrapped here, so both cores make one kind of call.
    """
    if _takes_namespace(fn):
        return lambda path, page, namespace: fn(path, page, namespace=namespace)
    return lambda path, page, namespace: fn(path, page)


def truncated(after: int, oldest: int, capacity: int) -> LogTruncatedError:
    msg = (
        f"records {after + 1} to {oldest - 1} were dropped from the log "
        f"(capacity {capacity}); resync from the cache's snapshot()"
    )
    return LogTruncatedError(msg, oldest)
