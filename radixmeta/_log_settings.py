"""The EventLog's argument rules and messages, shared by both cores' logs.

Below the binding, like :mod:`radixmeta._keys` for the trees: the native log
(``_log_core.pxi``) and the reference (``_reference_log.py``) check their
arguments, pick a hash scheme and word a truncation the same way, here.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import numpy.typing as npt

from radixmeta import _hashing
from radixmeta._keys import check_int
from radixmeta.errors import InputTypeError, InvalidInputError, LogTruncatedError

__all__ = ["FORMS", "checked_hashes", "log_settings", "truncated"]

FORMS = ("path", "blocks")


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
        f"(capacity {capacity}) or discarded; resync from the cache's snapshot()"
    )
    return LogTruncatedError(msg, oldest)


def discard_past(through: int, next_seq: int) -> InvalidInputError:
    """The error of ``discard(through)`` past the newest record (both logs raise it)."""
    newest = "no record yet" if next_seq == 0 else f"the newest is {next_seq - 1}"
    msg = f"through_seq {through} names a record not written yet ({newest})"
    return InvalidInputError(msg)
