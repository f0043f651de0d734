"""The input rules for keys, values and integer arguments, written once for both cores.

The reference implementation converts with these functions; the native layer
(``_core.pyx``) converts exact lists, tuples and arrays in compiled code and
calls :func:`as_sequence` for everything else, so the two raise the same
exception types with the same messages (``tests/test_errors.py`` and
``tests/test_hostile_inputs.py`` assert it). The rules:

* An exact ``list`` or ``tuple`` is converted element by element, in order,
  from a snapshot taken when the call starts (an element's ``__index__`` may
  change the container; the call sees it as it was).
* A numpy array, an object with the buffer protocol, or one that numpy reads
  through ``__array__`` / ``__array_interface__`` (torch tensors) is read as an
  array: 1-D, of an integer dtype (bool is not one).
* ``str``, ``bytes`` and ``bytearray`` are refused: text is not token ids
  (``numpy.frombuffer(data, numpy.uint8)`` states byte tokens explicitly).
* Anything else (list and tuple subclasses, ``range``, ``deque``, generators)
  is first copied with ``list(x)``, so a lying ``__len__`` or ``__getitem__``
  can never make the native core read out of bounds.
* Elements are converted in order and the first failure raises, naming its
  position. An element is an exact ``int`` or any object with ``__index__``
  except ``bool``; an exception raised by ``__index__`` propagates unchanged.
* An integer argument (``page_size``, ``priority``, ``start``, a hash...) is
  any object with ``__index__`` except ``bool``.
* A MetaTree's extra tags follow the same rules, one per page, each in
  ``[0, 2**64)``; None stands for all 0.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np

from radixmeta.errors import InputTypeError, InvalidInputError

TOKEN_LIMIT = 2**32
TAG_LIMIT = 2**64  # extra tags (what engines hash besides tokens) are uint64
# What one extra tag belongs to, in the messages of tags().
PER_PAGE = "whole page of the key"
PER_BLOCK = "block"
MAX_KEY_TOKENS = 2**32 - 1  # the cores store a key's length in 32 bits
INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1

_TEXT = (str, bytes, bytearray)
_BOOLS = (bool, np.bool_)


def _not_a_sequence(name: str, obj: Any) -> InputTypeError:
    return InputTypeError(f"{name} must be a sequence of integers, got {type(obj).__name__}")


def _is_array_like(obj: Any) -> bool:
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array__"):
        return True
    if hasattr(obj, "__array_interface__") or hasattr(obj, "__array_struct__"):
        return True
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True


def as_sequence(obj: Any, name: str) -> list[Any] | tuple[Any, ...] | np.ndarray:
    """``obj`` as an exact list or tuple, or as a 1-D integer array (checked).

    Parameters
    ----------
    obj : object
        A key, values or block-hash argument.
    name : str
        The argument's name in error messages.

    Raises
    ------
    InputTypeError
        ``obj`` is text, a scalar, not iterable, or an array of a non-integer dtype.
    InvalidInputError
        ``obj`` is an array of more than one dimension.
    """
    kind = type(obj)
    if kind is list or kind is tuple:
        return obj  # type: ignore[no-any-return]
    if isinstance(obj, _TEXT):
        raise _not_a_sequence(name, obj)
    if not _is_array_like(obj):
        try:
            return list(obj)
        except TypeError as exc:  # not iterable: a scalar, None, an arbitrary object
            raise _not_a_sequence(name, obj) from exc
    try:
        arr = np.asarray(obj)
    except Exception as exc:  # an object numpy cannot read at all
        raise _not_a_sequence(name, obj) from exc
    if arr.ndim == 0:  # a numpy scalar, or an object numpy wrapped as one
        raise _not_a_sequence(name, obj)
    if arr.ndim != 1:
        msg = f"{name} must be 1-D, got an array with {arr.ndim} dimensions"
        raise InvalidInputError(msg)
    if arr.size == 0 and arr.dtype.kind == "f":
        return np.empty(0, dtype=np.int64)  # np.asarray([]) is float64: still no integers
    if arr.dtype.kind not in "iu":
        msg = f"{name} must hold integers, got dtype {arr.dtype}"
        raise InputTypeError(msg)
    return arr


def element(item: Any, name: str, index: int) -> int:
    """One element of a list or tuple as a Python int (``__index__`` is honoured)."""
    if type(item) is int:
        return item
    if isinstance(item, _BOOLS) or not hasattr(type(item), "__index__"):
        msg = f"{name}[{index}] must be an integer, got {type(item).__name__}"
        raise InputTypeError(msg)
    return operator.index(item)


def _integers(
    seq: list[Any] | tuple[Any, ...] | np.ndarray, name: str, low: int, high: int, what: str
) -> tuple[int, ...]:
    """The elements of a sequence from :func:`as_sequence` as ints in ``[low, high]``."""
    if isinstance(seq, np.ndarray):
        ints: list[int] = seq.tolist()
        items: tuple[Any, ...] = tuple(ints)
    else:
        items = tuple(seq)  # a snapshot: an element's __index__ may change the list
    out = []
    for i, item in enumerate(items):
        value = element(item, name, i)
        if not low <= value <= high:
            msg = f"{name}[{i}] = {value} is outside {what}"
            raise InvalidInputError(msg)
        out.append(value)
    return tuple(out)


def check_key_length(n: int) -> None:
    """Refuse a key longer than the cores can index (2**32 - 1 tokens)."""
    if n > MAX_KEY_TOKENS:
        msg = f"key has {n} tokens; keys are limited to 2**32 - 1 tokens"
        raise InvalidInputError(msg)


def tokens(obj: Any, name: str = "key") -> tuple[int, ...]:
    """Convert a key to a tuple of token ids in ``[0, 2**32)`` (``name``: for messages)."""
    seq = as_sequence(obj, name)
    check_key_length(len(seq))  # before converting: a too-long array is never read
    return _integers(seq, name, 0, TOKEN_LIMIT - 1, "the token range [0, 2**32)")


def values(obj: Any, key_length: int) -> tuple[int, ...]:
    """Convert KV slot values to a tuple of int64, checking the length against the key."""
    seq = as_sequence(obj, "values")
    if len(seq) != key_length:
        msg = f"values must have the same length as the key ({key_length}), got {len(seq)}"
        raise InvalidInputError(msg)
    return _integers(seq, "values", INT64_MIN, INT64_MAX, "the int64 range")


def as_int(name: str, value: Any) -> int:
    """An integer argument: an ``int`` or any object with ``__index__``, never a bool."""
    if type(value) is int:
        return value
    if isinstance(value, _BOOLS) or not hasattr(type(value), "__index__"):
        msg = f"{name} must be an integer, got {type(value).__name__}"
        raise InputTypeError(msg)
    return operator.index(value)


def check_int(name: str, value: Any, minimum: int) -> int:
    """Validate an integer argument that must be at least ``minimum``."""
    number = as_int(name, value)
    if number < minimum:
        msg = f"{name} must be >= {minimum}, got {number}"
        raise InvalidInputError(msg)
    return number


def check_page_size(value: Any) -> int:
    """Validate ``page_size``: an integer in ``[1, 2**32)``, the same rule for both trees."""
    number = check_int("page_size", value, 1)
    if number >= TOKEN_LIMIT:
        msg = f"page_size must be < 2**32, got {number}"
        raise InvalidInputError(msg)
    return number


def check_priority(value: Any) -> int:
    """Validate an eviction priority: any int64."""
    number = as_int("priority", value)
    if not INT64_MIN <= number <= INT64_MAX:
        msg = f"priority = {number} is outside the int64 range"
        raise InvalidInputError(msg)
    return number


def tags(obj: Any, count: int, per: str, name: str = "extras") -> tuple[int, ...] | None:
    """Extra tags: one uint64 per page (``per`` says of what), or None when all are 0.

    Parameters
    ----------
    obj : sequence of int, 1-D integer array, or None
        The tags; None means every tag is 0.
    count : int
        How many there must be.
    per : str
        What each tag belongs to, for the error message ("block", ...).
    name : str, default "extras"
        The argument's name in error messages.
    """
    if obj is None:
        return None
    seq = as_sequence(obj, name)
    if len(seq) != count:
        msg = f"{name} must hold one tag per {per} ({count}), got {len(seq)}"
        raise InvalidInputError(msg)
    values = _integers(seq, name, 0, TAG_LIMIT - 1, "the tag range [0, 2**64)")
    return values if any(values) else None


def per_key_tags(obj: Any, n_keys: int) -> list[Any]:
    """``match_many``'s extras: one entry (tags or None) per key; None means no tags at all."""
    if obj is None:
        return [None] * n_keys
    if isinstance(obj, np.ndarray) and obj.ndim == 2:
        rows: list[Any] = list(obj)
    elif isinstance(obj, _TEXT) or not hasattr(obj, "__len__"):
        msg = f"extras must be a sequence of per-key extras, got {type(obj).__name__}"
        raise InputTypeError(msg)
    else:
        rows = list(obj)
    if len(rows) != n_keys:
        msg = f"extras must hold one entry per key ({n_keys}), got {len(rows)}"
        raise InvalidInputError(msg)
    return rows


def check_namespace(value: Any) -> Any:
    """A namespace: any hashable value (None is the default namespace)."""
    try:
        hash(value)
    except TypeError:
        msg = f"namespace must be hashable, got {type(value).__name__}"
        raise InputTypeError(msg) from None
    return value


def check_flag(name: str, value: Any) -> bool:
    """A keyword that must be exactly ``True`` or ``False``."""
    if value is not True and value is not False:
        msg = f"{name} must be a bool, got {type(value).__name__}"
        raise InputTypeError(msg)
    return value


def check_seconds(name: str, value: Any) -> float:
    """Validate a duration argument: a finite number of seconds, at least 0."""
    if isinstance(value, _BOOLS) or not isinstance(value, (int, float)):
        msg = f"{name} must be a number of seconds, got {type(value).__name__}"
        raise InputTypeError(msg)
    if not 0 <= value < math.inf:  # also refuses NaN
        msg = f"{name} must be a finite number of seconds >= 0, got {value!r}"
        raise InvalidInputError(msg)
    return float(value)
