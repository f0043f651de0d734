"""Validation and error messages for the KV-event block operations.

Shared by the native and the reference core so that both raise the same
exception types with the same messages (``tests/test_meta_errors.py``). The
native core converts well-formed input in compiled code and calls into this
module only to build an error.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import numpy as np

from radixmeta._keys import as_int, as_sequence, element
from radixmeta.errors import (
    BlockConflictError,
    InvalidInputError,
    StaleWorkerError,
    UnknownParentError,
)

HASH_MIN = -(2**63)
HASH_LIMIT = 2**64


class BlockStatus(IntEnum):
    """Outcome of one record of ``MetaTree.apply_events``."""

    APPLIED = 0
    UNKNOWN_PARENT = 1
    CONFLICT = 2
    INVALID = 3
    STALE_WORKER = 4


def block_hash(value: Any, name: str) -> int:
    """One hash as an unsigned 64-bit int; signed input is read as two's complement."""
    return _in_hash_range(as_int(name, value), name)


def _in_hash_range(number: int, name: str) -> int:
    if not HASH_MIN <= number < HASH_LIMIT:
        msg = f"{name} = {number} is outside the 64-bit hash range [-2**63, 2**64)"
        raise InvalidInputError(msg)
    return number % HASH_LIMIT


def parent_hash(value: Any) -> int | None:
    return None if value is None else block_hash(value, "parent_hash")


def block_hashes(obj: Any) -> list[int]:
    """A sequence (or 1-D integer array) of hashes as unsigned 64-bit ints.

    The input rules are those of keys (:mod:`radixmeta._keys`): exact lists and
    tuples element by element, arrays through numpy, anything else copied first.
    """
    seq = as_sequence(obj, "block_hashes")
    if isinstance(seq, np.ndarray):
        return [int(x) % HASH_LIMIT for x in seq.tolist()]
    return [
        _in_hash_range(element(item, "block_hashes", i), f"block_hashes[{i}]")
        for i, item in enumerate(tuple(seq))
    ]


DEVICE, HOST = 0, 1  # the storage tiers of a MetaTree page


def check_tier(tier: Any) -> int:
    """A tier: 0 (the device) or 1 (the host)."""
    number = as_int("tier", tier)
    if number not in (DEVICE, HOST):
        msg = f"tier must be 0 (device) or 1 (host), got {number}"
        raise InvalidInputError(msg)
    return number


def check_tiers(tier: Any) -> tuple[int, ...]:
    """``apply_cleared``'s tier: one of them, or None for both."""
    return (DEVICE, HOST) if tier is None else (check_tier(tier),)


def bad_token_count(n_tokens: int, n_blocks: int, page_size: int) -> InvalidInputError:
    msg = (
        f"token_ids holds {n_tokens} tokens; {n_blocks} blocks of page_size {page_size} "
        f"need exactly {n_blocks * page_size}"
    )
    return InvalidInputError(msg)


def unknown_parent(worker: Any, parent: int, namespace: Any) -> UnknownParentError:
    where = "" if namespace is None else f" in namespace {namespace!r}"
    msg = f"parent_hash {parent:#018x} names no block that {worker_label(worker)} holds{where}"
    return UnknownParentError(msg)


def repeated_hash(index: int, value: int) -> BlockConflictError:
    msg = f"block_hashes[{index}] = {value:#018x} appears earlier in the same event"
    return BlockConflictError(msg)


def cycle(index: int, value: int) -> BlockConflictError:
    msg = f"block_hashes[{index}] = {value:#018x} is the event's parent hash (a cycle)"
    return BlockConflictError(msg)


def names_other_page(worker: Any, index: int, value: int) -> BlockConflictError:
    msg = (
        f"block_hashes[{index}] = {value:#018x} already names a different block "
        f"of {worker_label(worker)}"
    )
    return BlockConflictError(msg)


# An ``apply_events`` record: its kind, then this many fields in all, then
# optionally a dict of keyword arguments of the method it stands for (these).
RECORD_FIELDS = {"stored": 5, "removed": 3, "cleared": 2}
RECORD_OPTIONS = {
    "stored": ("tier", "namespace", "extras"),
    "removed": ("tier",),
    "cleared": ("tier",),
}


def record_options(kind: str, options: Any, record: Any) -> dict[str, Any]:
    """The trailing options dict of an event record, checked against its kind."""
    if type(options) is not dict:
        raise not_a_record(record)
    allowed = RECORD_OPTIONS[kind]
    for key in options:
        if key not in allowed:
            names = ", ".join(repr(a) for a in allowed) or "none"
            msg = f"a {kind} record takes no option {key!r} (its options: {names})"
            raise InvalidInputError(msg)
    return options


def not_a_record(record: Any) -> InvalidInputError:
    return InvalidInputError(f"not an event record: {record!r}")


def renamed_block(worker: Any, index: int, value: int, old: int) -> BlockConflictError:
    msg = (
        f"block_hashes[{index}] = {value:#018x} names a block that {worker_label(worker)} "
        f"already names {old:#018x}"
    )
    return BlockConflictError(msg)


def worker_label(worker: Any) -> str:
    return f"worker ({worker.name!r}, dp_rank={worker.dp_rank})"


def record_status(exc: BaseException) -> BlockStatus:
    """The batch status of a record that raised ``exc``."""
    if isinstance(exc, UnknownParentError):
        return BlockStatus.UNKNOWN_PARENT
    if isinstance(exc, BlockConflictError):
        return BlockStatus.CONFLICT
    if isinstance(exc, StaleWorkerError):
        return BlockStatus.STALE_WORKER
    return BlockStatus.INVALID
