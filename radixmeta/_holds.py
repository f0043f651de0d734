"""The argument checks and messages of MetaTree holds and cursors, written once for both cores.

A *hold* is the router's optimistic mark: "this exact worker is about to hold
every page of this key", for a request in flight, until ``release``. A
*cursor* is what ``match(..., cursor=True)`` keeps so that a mark chosen after
the match (``MetaMatch.insert`` or ``MetaMatch.hold``) continues from the
match's walk. The native core, the pure-Python reference and the brute-force
model raise these same errors.
"""

from __future__ import annotations

from typing import Any

from radixmeta._keys import check_int
from radixmeta.errors import InvalidInputError, StaleHoldError, WorkerError

__all__ = ["approximate_hold", "check_hold", "no_cursor", "prefix_key", "stale_hold"]

HOLD_LIMIT = 2**64
_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_MASK = 2**64 - 1


def prefix_key(length: int, last_page: Any, tag: int, namespace: Any) -> int:
    """``MetaMatch.prefix_key``: FNV-1a (64-bit) over the longest matched length, the
    tokens of its last page, that page's extra tag and the namespace's hash.

    The native core computes the same value in C.
    """
    h = _FNV_OFFSET
    for value in (length, *(int(t) for t in last_page), tag, hash(namespace) & _MASK):
        h = ((h ^ value) * _FNV_PRIME) & _MASK
    return h


def check_hold(value: Any) -> int:
    """A hold id argument: an integer >= 0 (any value past ``2**64`` is simply not live)."""
    return check_int("hold", value, 0)


def stale_hold(hold: int) -> StaleHoldError:
    msg = (
        f"hold {hold} is not a live hold of this tree (released already, its worker "
        "removed, or never handed out)"
    )
    return StaleHoldError(msg)


def approximate_hold(worker: Any) -> WorkerError:
    msg = (
        f"{worker!r} is approximate: holds are for exact workers (an approximate worker's "
        "inserts already are the router's model of its cache)"
    )
    return WorkerError(msg)


def no_cursor() -> InvalidInputError:
    msg = "this match kept no cursor: match(..., cursor=True) to mark pages after it"
    return InvalidInputError(msg)
