"""Plain-Python conversion of keys and values, used by the reference implementation.

The native layer (``_core.pyx``) performs the same checks in compiled code; the
two must raise the same exception types with the same messages, which
``tests/test_errors.py`` asserts.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from radixmeta.errors import InputTypeError, InvalidInputError

TOKEN_LIMIT = 2**32
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


def _as_integer_list(obj: Any, name: str) -> list[int]:
    """Return the integers of a 1-D key or values argument, or raise."""
    if isinstance(obj, (str, bytes)):
        msg = f"{name} must be a sequence of integers, got {type(obj).__name__}"
        raise InputTypeError(msg)
    if not isinstance(obj, (list, tuple)):
        try:
            arr = np.asarray(obj)
        except Exception as exc:  # an object numpy cannot read at all
            msg = f"{name} must be a sequence of integers, got {type(obj).__name__}"
            raise InputTypeError(msg) from exc
        if arr.ndim == 0:  # a scalar, None, or an object numpy cannot read
            msg = f"{name} must be a sequence of integers, got {type(obj).__name__}"
            raise InputTypeError(msg)
        if arr.ndim != 1:
            msg = f"{name} must be 1-D, got an array with {arr.ndim} dimensions"
            raise InvalidInputError(msg)
        if arr.size == 0 and arr.dtype.kind == "f":
            return []  # np.asarray([]) and np.asarray(range(0)) are float64: still no tokens
        if arr.dtype.kind not in "iu":
            msg = f"{name} must hold integers, got dtype {arr.dtype}"
            raise InputTypeError(msg)
        return [int(x) for x in arr.tolist()]
    out = []
    for i, item in enumerate(obj):
        if isinstance(item, float) or not hasattr(item, "__index__"):
            msg = f"{name}[{i}] must be an integer, got {type(item).__name__}"
            raise InputTypeError(msg)
        out.append(operator.index(item))
    return out


def tokens(obj: Any) -> tuple[int, ...]:
    """Convert a key to a tuple of token ids in ``[0, 2**32)``."""
    ints = _as_integer_list(obj, "key")
    for i, value in enumerate(ints):
        if not 0 <= value < TOKEN_LIMIT:
            msg = f"key[{i}] = {value} is outside the token range [0, 2**32)"
            raise InvalidInputError(msg)
    return tuple(ints)


def values(obj: Any, key_length: int) -> tuple[int, ...]:
    """Convert KV slot values to a tuple of int64, checking the length against the key."""
    ints = _as_integer_list(obj, "values")
    if len(ints) != key_length:
        msg = f"values must have the same length as the key ({key_length}), got {len(ints)}"
        raise InvalidInputError(msg)
    for i, value in enumerate(ints):
        if not INT64_MIN <= value <= INT64_MAX:
            msg = f"values[{i}] = {value} is outside the int64 range"
            raise InvalidInputError(msg)
    return tuple(ints)


def check_int(name: str, value: Any, minimum: int) -> int:
    """Validate an integer argument (not bool) that must be at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        msg = f"{name} must be an integer, got {type(value).__name__}"
        raise InputTypeError(msg)
    number = int(value)
    if number < minimum:
        msg = f"{name} must be >= {minimum}, got {number}"
        raise InvalidInputError(msg)
    return number


def check_priority(value: Any) -> int:
    """Validate an eviction priority: any int64."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        msg = f"priority must be an integer, got {type(value).__name__}"
        raise InputTypeError(msg)
    number = int(value)
    if not INT64_MIN <= number <= INT64_MAX:
        msg = f"priority = {number} is outside the int64 range"
        raise InvalidInputError(msg)
    return number
