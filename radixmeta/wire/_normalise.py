"""Hashes and token ids between their wire forms and radixmeta's arrays.

Decoding side: msgspec has already checked the types, so these functions
convert, through ``array.array`` from the decoded list (a C loop of a few ns
a value that also checks the range) viewed by numpy without a copy. A value
out of range raises :class:`Invalid`, which sends the batch to the exact path
and its constrained types; hashes not in the engine's canonical form take a
per-value path.

Encoding side: events may have been built by hand, so hashes and tokens are
checked with the project's input rules and their messages.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from radixmeta._blocks import block_hash as _checked_hash
from radixmeta._blocks import block_hashes as _checked_hashes
from radixmeta._keys import TOKEN_LIMIT, as_sequence, element
from radixmeta.errors import InvalidInputError
from radixmeta.wire.types import WireHashes

_native_tokens: Callable[[bytes], npt.NDArray[np.uint32] | None] | None
try:  # the binding's msgpack token reader; the codecs work without it, only slower
    from radixmeta._core import msgpack_tokens as _native_tokens
except ImportError:  # no compiled extension
    _native_tokens = None

__all__ = [
    "Hashes",
    "Invalid",
    "canonical_signed",
    "canonical_unsigned",
    "decoded_tokens",
    "raw_token_ids",
    "flatten_pairs",
    "hash_array",
    "hash_list",
    "parent_value",
    "token_array",
    "u64",
]

HASH_MOD = 2**64
SIGNED_LIMIT = 2**63
_U32 = next(code for code in "IL" if array(code).itemsize == 4)  # 'I' on every common ABI
# dtype objects, not the scalar types: np.frombuffer then skips a conversion (half its cost).
_UINT32 = np.dtype(np.uint32)
_UINT64 = np.dtype(np.uint64)

# (block hashes as u64, parent as u64, the hashes as sent when not canonical)
Hashes = tuple[npt.NDArray[np.uint64], int | None, WireHashes | None]


class Invalid(Exception):
    """A decoded value msgspec's types cannot rule out; the message names the field."""


def u64(value: int | bytes) -> int:
    """One wire hash as unsigned 64 bits: two's complement, or the last 8 bytes big-endian."""
    if isinstance(value, bytes):
        return int.from_bytes(value[-8:], "big")
    return value % HASH_MOD


def _as_u64_array(values: list[Any]) -> npt.NDArray[np.uint64]:
    return np.array([u64(v) for v in values], dtype=np.uint64)


def canonical_unsigned(values: list[Any], parent: int | bytes | None) -> Hashes:
    """vLLM's hashes: canonical when every one is a non-negative int (the default since 0.10.2).

    Negative ints (Python ``hash()`` in vLLM 0.9 and 0.10) and raw digest
    ``bytes`` are normalised, and kept as sent in ``WireHashes``.
    """
    try:
        hashes = np.frombuffer(array("Q", values), _UINT64)
    except (OverflowError, TypeError):  # a negative int or bytes somewhere
        pass
    else:
        if parent is None or (type(parent) is int and parent >= 0):
            return hashes, parent, None
    return _as_u64_array(values), _parent_u64(parent), WireHashes(tuple(values), parent)


def canonical_signed(values: list[int], parent: int | None) -> Hashes:
    """SGLang's hashes: canonical when every one fits int64 (SGLang never sends more)."""
    try:
        # The int64 buffer read as uint64 is exactly the two's complement normalisation.
        hashes = np.frombuffer(array("q", values), _UINT64)
    except OverflowError:  # an unsigned value >= 2**63
        pass
    else:
        if parent is None or parent < SIGNED_LIMIT:
            return hashes, _parent_u64(parent), None
    return _as_u64_array(values), _parent_u64(parent), WireHashes(tuple(values), parent)


def _parent_u64(parent: int | bytes | None) -> int | None:
    return None if parent is None else u64(parent)


def raw_token_ids(raw: Any, fallback: msgspec.msgpack.Decoder[Any]) -> Any:
    """Token ids from their undecoded msgpack: a uint32 array when the native reader can
    take them (a plain array of ints: no Python int per token), else ``fallback``'s list.

    The fast path decodes ``token_ids`` as ``msgspec.Raw`` and comes here; the exact
    path decodes them as typed lists, which this passes through unchanged.
    """
    if not isinstance(raw, msgspec.Raw):
        return raw
    if _native_tokens is not None:
        tokens = _native_tokens(raw)
        if tokens is not None:
            return tokens
    return fallback.decode(raw)


def decoded_tokens(values: Any) -> npt.NDArray[np.uint32]:
    """A decoded token list as a uint32 array.

    Raises
    ------
    Invalid
        A value outside ``[0, 2**32)``: ``array`` checks the range in its C loop,
        and the exact path's constrained decode then names the value.
    TypeError
        A value is not an int (an SGLang bigram pair).
    """
    if isinstance(values, np.ndarray):  # read by the native reader already
        return values
    try:
        return np.frombuffer(array(_U32, values), _UINT32)
    except OverflowError:
        msg = "a token id is outside [0, 2**32)"
        raise Invalid(msg) from None


def flatten_pairs(items: list[Any], field: str) -> npt.NDArray[np.uint32]:
    """SGLang's bigram ``[[t0, t1], [t1, t2], ...]`` as ``[t0, t1, t2, ...]``.

    Raises
    ------
    Invalid
        Integers and pairs are mixed, an item is not a pair, or a pair does not
        continue the one before it (flattening would lose tokens).
    """
    flat: list[int] = []
    for i, item in enumerate(items):
        if not isinstance(item, list):
            msg = f"{field} mixes integers and pairs: {field}[{i}] = {item}"
            raise Invalid(msg)
        if len(item) != 2:
            msg = f"{field}[{i}] must be a pair of integers, got an array of {len(item)}"
            raise Invalid(msg)
        if not flat:
            flat.extend(item)
        elif item[0] != flat[-1]:
            msg = f"{field}[{i}] = {item} does not continue the pair before it, {items[i - 1]}"
            raise Invalid(msg)
        else:
            flat.append(item[1])
    return decoded_tokens(flat)


# -- encoding side: hand-built events are checked --------------------------------------------
def hash_array(obj: Any) -> npt.NDArray[np.uint64]:
    """``block_hashes`` as a uint64 array; lists are checked against [-2**63, 2**64)."""
    if isinstance(obj, np.ndarray) and obj.dtype == np.uint64 and obj.ndim == 1:
        return obj
    return np.array(_checked_hashes(obj), dtype=np.uint64).reshape(-1)


def hash_list(event: Any, signed: bool) -> list[int | bytes]:
    """An event's block hashes as the engine sends them (verbatim when ``wire_hashes`` is set)."""
    hashes = hash_array(event.block_hashes)
    wire = event.wire_hashes
    if wire is not None:
        if [u64(v) for v in wire.block_hashes] != hashes.tolist():
            msg = "wire_hashes.block_hashes do not normalise to block_hashes"
            raise InvalidInputError(msg)
        return list(wire.block_hashes)
    out: list[int | bytes] = (hashes.view(np.int64) if signed else hashes).tolist()
    return out


def parent_value(event: Any, signed: bool) -> int | bytes | None:
    """An event's parent hash as the engine sends it."""
    parent = event.parent_block_hash
    value = None if parent is None else _checked_hash(parent, "parent_block_hash")
    wire = event.wire_hashes
    if wire is not None:
        sent = wire.parent_block_hash
        if (None if sent is None else u64(sent)) != value:
            msg = "wire_hashes.parent_block_hash does not normalise to parent_block_hash"
            raise InvalidInputError(msg)
        return sent  # type: ignore[no-any-return]
    if value is not None and signed and value >= SIGNED_LIMIT:
        return value - HASH_MOD
    return value


def token_array(obj: Any, name: str) -> npt.NDArray[np.uint32]:
    """Token ids as a uint32 array, checked by radixmeta's input rules for keys."""
    if isinstance(obj, np.ndarray) and obj.dtype == np.uint32 and obj.ndim == 1:
        return obj
    seq = as_sequence(obj, name)
    if isinstance(seq, np.ndarray):
        values: list[Any] = seq.tolist()
    else:
        values = list(seq)
    out = []
    for i, item in enumerate(values):
        value = element(item, name, i)
        if not 0 <= value < TOKEN_LIMIT:
            msg = f"{name}[{i}] = {value} is outside the token range [0, 2**32)"
            raise InvalidInputError(msg)
        out.append(value)
    return np.array(out, dtype=np.uint32)
