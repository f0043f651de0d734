"""What every wire decoder checks before msgspec reads a message: one msgpack value, in limits.

msgspec recurses once per nested array or map and gives up at Python's
recursion limit with a ``RecursionError``, wherever that limit happens to be
on the caller's stack. So the decoders first walk the bytes once without
decoding them (``msgpack_check``: in C++ from the extension, else the
pure-Python rule of :mod:`radixmeta._reference_msgpack`, which answers the
same) and refuse, as a :class:`~radixmeta.errors.DecodeError`:

* arrays and maps nested more than :data:`MAX_DEPTH` deep (the batch array
  counts as one; the engines' batches nest fewer than 10);
* a header whose count or length the bytes left cannot hold (an item takes
  one byte at the least, a map entry two), before anything is allocated for
  it: ``dd ff ff ff ff``, an array of 2**32 - 1 items in 5 bytes, is refused
  at its header, and no decode allocates more than a small multiple of the
  message;
* a str that is not UTF-8, wherever it is (a map key, a field the decoder
  ignores), so that a batch does not decode or fail by where a bad string sits;
* truncated data, the unused byte ``0xc1`` and trailing bytes.

What is left for msgspec to refuse is values of the wrong type (and map keys
that cannot be dict keys, or bad msgpack timestamps, in fields taken as any
value), which the codecs word from msgspec's own message and path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixmeta.errors import DecodeError, InputTypeError

__all__ = ["MAX_DEPTH", "as_message", "check_structure", "structure_message"]

MAX_DEPTH = 64
"""Arrays and maps a wire message may nest; a message nested deeper raises DecodeError."""

_check: Callable[[Any, int], tuple[str, int, int, int] | None]
try:  # the compiled extension's one-pass check
    from radixmeta._core import msgpack_check as _check
except ImportError:  # no compiled extension: the same rule in Python
    from radixmeta._reference_msgpack import msgpack_check as _check


def as_message(data: Any) -> bytes | bytearray | memoryview:
    """``data`` as the decoders read it: bytes and bytearray as they are, a memoryview as
    its bytes (any format or shape, if contiguous).

    Raises
    ------
    InputTypeError
        ``data`` is not bytes, a bytearray or a memoryview, or is a view whose bytes
        are not contiguous.
    """
    if isinstance(data, (bytes, bytearray)):
        return data
    if isinstance(data, memoryview):
        if data.format == "B" and data.ndim == 1 and data.c_contiguous:
            return data
        try:
            return data.cast("B")
        except TypeError:
            msg = "data must be a contiguous buffer of bytes, got a non-contiguous memoryview"
            raise InputTypeError(msg) from None
    msg = f"data must be bytes, got {type(data).__name__}"
    raise InputTypeError(msg)


def _kind(header: int) -> tuple[str, str]:
    """What a header byte starts, and what its count counts."""
    if 0x90 <= header <= 0x9F or header in (0xDC, 0xDD):
        return "array", "item"
    if 0x80 <= header <= 0x8F or header in (0xDE, 0xDF):
        return "map", "entry"
    if 0xC4 <= header <= 0xC6:
        return "bin", "byte"
    if 0xC7 <= header <= 0xC9:
        return "ext", "byte"
    return "str", "byte"


def _count(n: int, unit: str) -> str:
    if n == 1:
        return f"1 {unit}"
    return f"{n} {unit[:-1]}ies" if unit.endswith("y") else f"{n} {unit}s"


def structure_message(data: Any) -> str | None:
    """Why ``data`` is not one msgpack value within the limits, worded; None when it is.

    Complexity: O(len(data)), one pass without decoding.
    """
    problem = _check(data, MAX_DEPTH)
    if problem is None:
        return None
    name, offset, claimed, header = problem
    if name == "truncated":
        return f"truncated msgpack: the data ends inside a value at offset {offset}"
    if name == "too_long":
        kind, unit = _kind(header)
        return (
            f"truncated msgpack: the {kind} at offset {offset} claims {_count(claimed, unit)}, "
            f"more than fit before the data ends at offset {len(data)}"
        )
    if name == "too_deep":
        kind, _ = _kind(header)
        return (
            f"malformed msgpack: the {kind} at offset {offset} is nested deeper than "
            f"{MAX_DEPTH} arrays and maps"
        )
    if name == "invalid_byte":
        return f"malformed msgpack: invalid opcode '\\xc1' at offset {offset}"
    if name == "invalid_utf8":
        return f"malformed msgpack: the str at offset {offset} is not valid UTF-8"
    return f"malformed msgpack: trailing characters at offset {offset}"


def check_structure(data: Any, where: str = "") -> None:
    """Raise :class:`DecodeError` (its message after ``where: ``) unless ``data`` passes."""
    message = structure_message(data)
    if message is not None:
        raise DecodeError(f"{where}: {message}" if where else message)
