"""Hostile arguments, and hostile code run during a call, on every argument-conversion path of
both cores.

A hostile argument lies about itself: a list whose ``__len__`` lies, an element whose
``__index__`` mutates the container being converted or raises midway, an ndarray subclass
whose ``tolist`` lies, views with negative strides, byte-swapped or unaligned arrays. Hostile
code runs in the middle of a call (a ``gc.callbacks`` callback or a ``__del__`` finalizer run
by a collection, an ``__index__``, another thread) and resets or mutates the tree.

The rules both cores follow (the native ``_core`` and the reference give the same results and
the same exception types and messages):

1. An exact list or tuple is converted element by element, in order. A numpy array (any
   subclass), a buffer, or an ``__array__``/``__array_interface__`` object goes through numpy.
   ``str``, ``bytes`` and ``bytearray`` are refused. Anything else is copied with ``list(x)``
   first, and a ``TypeError`` from that copy is refused as not a sequence.
2. The first bad element raises, naming its position; elements after it are not converted.
   An ``__index__`` that raises propagates unchanged; one that mutates the container does not
   change what is converted (the container as the call found it).
3. Bool arrays are refused.
4. Integer scalars take any ``__index__`` object except bool.
5. A RadixCache cannot be pickled or copied.
6. ``page_size`` is below ``2**32`` on both trees.
7. Nothing hostile crashes, corrupts or half-applies: the tree passes ``check()``, a call that
   raised changed nothing, and a call that hostile code interrupted leaves the tree (and both
   results) as if the two had run one after the other, in one order or the other.

Some of these cases crash an unfixed native core: run those one at a time, e.g.
``python -X faulthandler -m pytest -x tests/test_hostile_inputs.py -k 'len-too-long'``.
"""

from __future__ import annotations

import array
import collections
import copy
import gc
import itertools
import operator
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from conftest import REFERENCE, require_native
from test_errors import check_unchanged, exactly
from test_errors import state as cache_state
from test_meta_errors import populated
from test_meta_errors import state as meta_state

from radixmeta._blocks import record_status
from radixmeta.errors import InputTypeError, InvalidInputError, StaleNodeError

JOIN_TIMEOUT = 60.0  # seconds; a bound on every wait, never an assertion about speed
BASE = list(range(11, 19))  # valid as tokens, as values and as block hashes
OTHER = list(range(31, 39))
RANGES = {
    "key": "is outside the token range [0, 2**32)",
    "values": "is outside the int64 range",
    "block_hashes": "is outside the 64-bit hash range [-2**63, 2**64)",
}
# What apply_events turns into a record's status instead of raising: whatever a record's
# objects raise, not only the library's errors (docs/metatree.md, engine block operations).
RECORD_ERRORS = (Exception,)


# -- hostile objects ----------------------------------------------------------------------------
class Boom(Exception):
    """Raised by hostile code; must reach the caller unchanged."""


class Index:
    """Not an int but has ``__index__``; the first conversion runs ``action`` once."""

    def __init__(self, value: int, action: Callable[[], object] | None = None) -> None:
        self.value = value
        self.action = action

    def __index__(self) -> int:
        action, self.action = self.action, None
        if action is not None:
            action()
        return self.value

    def __repr__(self) -> str:
        return f"Index({self.value})"


class IntSub(int):
    """An int subclass: converted by its value."""


class Raising:
    """An element (or scalar) whose ``__index__`` raises ``exc``."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __index__(self) -> int:
        raise self.exc


class ReturnsStr:
    def __index__(self) -> Any:
        return "5"


class Tripwire:
    """An element after the first bad one: converting it is a bug."""

    def __index__(self) -> int:
        msg = "an element after the first bad one was converted"
        raise AssertionError(msg)


def lying_len(base: type, delta: int) -> type:
    """A subclass of ``list`` or ``tuple`` whose ``__len__`` is off by ``delta``."""

    def __len__(self: Any) -> int:
        return max(0, base.__len__(self) + delta)

    return type(f"{base.__name__.title()}LenOff{delta:+d}", (base,), {"__len__": __len__})


def iter_lies(base: type) -> type:
    """A subclass of ``list`` or ``tuple`` whose ``__iter__`` yields OTHER: ``list(x)`` is OTHER."""

    def __iter__(self: Any) -> Iterator[int]:
        return iter(OTHER)

    return type(f"{base.__name__.title()}IterLies", (base,), {"__iter__": __iter__})


LONG_LIST, SHORT_LIST, EMPTY_LIST = (lying_len(list, d) for d in (1, -1, -100))
LONG_TUPLE, SHORT_TUPLE = (lying_len(tuple, d) for d in (1, -1))
LIST_ITER_LIES, TUPLE_ITER_LIES = iter_lies(list), iter_lies(tuple)


class ListSub(list):  # type: ignore[type-arg]
    pass


class TupleSub(tuple):  # type: ignore[type-arg]
    __slots__ = ()


class UserSequence(Sequence[int]):
    """A user sequence whose ``__len__`` says three more than ``__getitem__`` has."""

    def __init__(self, items: list[int]) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items) + 3

    def __getitem__(self, i: Any) -> Any:
        return self.items[i]


class ArrayLies(np.ndarray):  # type: ignore[type-arg]
    """An ndarray subclass whose Python-level views of its items all lie."""

    def __len__(self) -> int:
        return 0

    def __iter__(self) -> Iterator[int]:
        return iter(OTHER)

    def tolist(self) -> Any:  # type: ignore[override]
        return list(OTHER)


class ArrayProtocol:
    """Read through ``__array__``; its own length and iteration lie."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        return self.arr

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[int]:
        return iter(OTHER)


class ArrayInterface:
    """Read through ``__array_interface__`` (it keeps the array alive)."""

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr
        self.__array_interface__ = arr.__array_interface__


def generator(items: list[Any], exc: BaseException | None = None) -> Iterator[Any]:
    """Yields ``items``; then raises ``exc``, if given, after the first two."""
    for i, item in enumerate(items):
        if exc is not None and i == 2:
            raise exc
        yield item


def with_at(i: int, value: Any, base: list[Any] = BASE) -> list[Any]:
    out = list(base)
    out[i] = value
    return out


def in_thread(fn: Callable[[], object]) -> None:
    """Run ``fn`` in another thread and wait for it (bounded)."""
    worker = threading.Thread(target=fn)
    worker.start()
    worker.join(JOIN_TIMEOUT)
    if worker.is_alive():
        msg = "the other thread did not finish"
        raise AssertionError(msg)


def mutated_during_conversion(mutate: Callable[[list[Any]], object], thread: bool = False,
                              container: type = list) -> Any:
    """BASE in ``container``, whose element 3 mutates the container while it is converted."""
    items: list[Any] = list(BASE)
    target = container(items) if container is not list else items
    action = (lambda: in_thread(lambda: mutate(target))) if thread else (lambda: mutate(target))
    target[3] = Index(BASE[3], action)
    return target


def unaligned(values: list[int]) -> np.ndarray:
    raw = b"\0" + np.array(values, dtype=np.int64).tobytes()
    arr = np.frombuffer(raw, dtype=np.int64, offset=1)
    assert not arr.flags.aligned
    return arr


def read_only(values: list[int]) -> np.ndarray:
    arr = np.array(values)
    arr.setflags(write=False)
    return arr


def strided(values: list[int], step: int, dtype: Any = np.int64) -> np.ndarray:
    """A view with stride ``step`` (negative: reversed) that holds ``values``."""
    full = np.zeros(len(values) * abs(step), dtype=dtype)
    view = full[::step]
    view[:] = values
    return view


# -- cases for a sequence argument -------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A hostile sequence: converting it gives exactly ``plain``, or raises ``error``.

    ``error`` is (type, message) with ``{name}`` (key, values, block_hashes) and ``{range}``
    (that argument's range text) to fill in.
    """

    make: Callable[[], Any]
    plain: list[int] | None = None
    error: tuple[type[BaseException], str] | None = None


def clear(items: list[Any]) -> None:
    items.clear()


def grow(items: list[Any]) -> None:
    items.extend(range(1000))  # reallocates the item array


def delete_head(items: list[Any]) -> None:
    del items[:2]


NOT_SEQUENCE = "{name} must be a sequence of integers, got "
NOT_INTEGER = "{name}[{i}] must be an integer, got "
OUT_OF_RANGE = "{name}[{i}] = {v} {range}"


def bad_type(i: int, type_name: str) -> tuple[type[BaseException], str]:
    return (InputTypeError, NOT_INTEGER.replace("{i}", str(i)) + type_name)


def bad_dtype(dtype: str) -> tuple[type[BaseException], str]:
    return (InputTypeError, "{name} must hold integers, got dtype " + dtype)


def bad_range(i: int, value: int) -> tuple[type[BaseException], str]:
    return (InvalidInputError, OUT_OF_RANGE.replace("{i}", str(i)).replace("{v}", str(value)))


BIG = 2**64  # outside every range
SMALL = -(2**63) - 1  # below every range

SEQUENCES: dict[str, Case] = {
    # Rule 1: list and tuple subclasses, and anything else, are converted as list(x) sees them.
    "list-len-too-long": Case(lambda: LONG_LIST(BASE), BASE),
    "list-len-too-short": Case(lambda: SHORT_LIST(BASE), BASE),
    "list-len-zero": Case(lambda: EMPTY_LIST(BASE), BASE),
    "tuple-len-too-long": Case(lambda: LONG_TUPLE(BASE), BASE),
    "tuple-len-too-short": Case(lambda: SHORT_TUPLE(BASE), BASE),
    "list-iter-lies": Case(lambda: LIST_ITER_LIES(BASE), OTHER),
    "tuple-iter-lies": Case(lambda: TUPLE_ITER_LIES(BASE), OTHER),
    "list-subclass": Case(lambda: ListSub(BASE), BASE),
    "tuple-subclass": Case(lambda: TupleSub(BASE), BASE),
    "range": Case(lambda: range(11, 19), BASE),
    "deque": Case(lambda: collections.deque(BASE), BASE),
    "generator": Case(lambda: generator(BASE), BASE),
    "dict-keys": Case(lambda: dict.fromkeys(BASE).keys(), BASE),
    "user-sequence-len-lies": Case(lambda: UserSequence(BASE), BASE),
    # Rule 2: elements with __index__, converted by value; mutation does not change the result.
    "int-subclass-elements": Case(lambda: [IntSub(v) for v in BASE], BASE),
    "index-elements": Case(lambda: [Index(v) for v in BASE], BASE),
    "index-elements-in-tuple": Case(lambda: tuple(Index(v) for v in BASE), BASE),
    "numpy-scalar-elements": Case(lambda: [np.uint8(v) if v % 2 else np.int64(v) for v in BASE],
                                  BASE),
    "index-grows-list": Case(lambda: mutated_during_conversion(grow), BASE),
    "index-clears-list": Case(lambda: mutated_during_conversion(clear), BASE),
    "index-deletes-from-list": Case(lambda: mutated_during_conversion(delete_head), BASE),
    "thread-grows-list": Case(lambda: mutated_during_conversion(grow, thread=True), BASE),
    "thread-clears-list": Case(lambda: mutated_during_conversion(clear, thread=True), BASE),
    "index-clears-list-subclass": Case(
        lambda: mutated_during_conversion(clear, container=LONG_LIST), BASE
    ),
    # Arrays and buffers go through numpy, whatever their layout.
    "reversed-view": Case(lambda: np.arange(16)[::-1], list(range(15, -1, -1))),
    "reversed-step-2": Case(lambda: np.arange(16)[::-2], list(range(15, 0, -2))),
    "reversed-int32": Case(lambda: np.arange(16, dtype=np.int32)[::-1], list(range(15, -1, -1))),
    "reversed-uint32-step-2": Case(lambda: strided(BASE, -2, np.uint32), BASE),
    "reversed-int64-step-3": Case(lambda: strided(BASE, -3), BASE),
    "step-2": Case(lambda: strided(BASE, 2), BASE),
    "column": Case(lambda: np.arange(32).reshape(8, 4)[:, 1], list(range(1, 32, 4))),
    "byte-swapped-int64": Case(lambda: np.array(BASE, dtype=">i8"), BASE),
    "byte-swapped-uint64": Case(lambda: np.array(BASE, dtype=">u8"), BASE),
    "byte-swapped-int32": Case(lambda: np.array(BASE, dtype=">i4"), BASE),
    "byte-swapped-uint32": Case(lambda: np.array(BASE, dtype=">u4"), BASE),
    "byte-swapped-int16": Case(lambda: np.array(BASE, dtype=">i2"), BASE),
    "byte-swapped-reversed": Case(lambda: np.array(BASE[::-1], dtype=">i8")[::-1], BASE),
    "unaligned": Case(lambda: unaligned(BASE), BASE),
    "read-only": Case(lambda: read_only(BASE), BASE),
    "broadcast": Case(lambda: np.broadcast_to(np.int64(7), (8,)), [7] * 8),
    "ndarray-subclass-lies": Case(lambda: np.array(BASE).view(ArrayLies), BASE),
    "ndarray-subclass-reversed": Case(lambda: np.array(BASE[::-1]).view(ArrayLies)[::-1], BASE),
    "array-q": Case(lambda: array.array("q", BASE), BASE),
    "array-I": Case(lambda: array.array("I", BASE), BASE),
    "memoryview": Case(lambda: memoryview(array.array("q", BASE)), BASE),
    "memoryview-reversed": Case(lambda: memoryview(np.array(BASE[::-1]))[::-1], BASE),
    "memoryview-of-bytes": Case(lambda: memoryview(bytes(BASE)), BASE),
    "__array__": Case(lambda: ArrayProtocol(np.array(BASE)), BASE),
    "__array_interface__": Case(lambda: ArrayInterface(np.array(BASE[::-1])[::-1]), BASE),
    # Refused whole.
    "str": Case(lambda: "abcdefgh", error=(InputTypeError, NOT_SEQUENCE + "str")),
    "bytes": Case(lambda: bytes(BASE), error=(InputTypeError, NOT_SEQUENCE + "bytes")),
    "bytearray": Case(lambda: bytearray(BASE), error=(InputTypeError, NOT_SEQUENCE + "bytearray")),
    "not-iterable": Case(object, error=(InputTypeError, NOT_SEQUENCE + "object")),
    "generator-raises-typeerror": Case(
        lambda: generator(BASE, TypeError("not today")),
        error=(InputTypeError, NOT_SEQUENCE + "generator"),
    ),
    "generator-raises": Case(lambda: generator(BASE, Boom("boom")), error=(Boom, "boom")),
    # Rule 3, and other dtypes: refused whatever the array's layout or class.
    "bool-array": Case(lambda: np.ones(8, dtype=bool), error=bad_dtype("bool")),
    "bool-array-reversed": Case(lambda: np.ones(16, dtype=bool)[::-2], error=bad_dtype("bool")),
    "bool-array-subclass": Case(lambda: np.ones(8, dtype=bool).view(ArrayLies),
                                error=bad_dtype("bool")),
    "float-array-subclass": Case(lambda: np.zeros(8).view(ArrayLies), error=bad_dtype("float64")),
    "float-__array__": Case(lambda: ArrayProtocol(np.zeros(8)), error=bad_dtype("float64")),
    "object-array": Case(lambda: np.array([Index(v) for v in BASE], dtype=object),
                         error=bad_dtype("object")),
    # Rule 2: the first bad element raises, naming its position.
    "bool-element": Case(lambda: with_at(3, True), error=bad_type(3, "bool")),
    "bool-element-in-tuple": Case(lambda: tuple(with_at(3, False)), error=bad_type(3, "bool")),
    "bool-element-in-deque": Case(lambda: collections.deque(with_at(3, True)),
                                  error=bad_type(3, "bool")),
    "float-element": Case(lambda: with_at(3, 14.0), error=bad_type(3, "float")),
    "numpy-float-element": Case(lambda: with_at(3, np.float32(14)), error=bad_type(3, "float32")),
    "none-element": Case(lambda: with_at(3, None), error=bad_type(3, "NoneType")),
    "float-in-deque": Case(lambda: collections.deque(with_at(1, 1.5)), error=bad_type(1, "float")),
    "float-in-generator": Case(lambda: generator(with_at(1, 1.5)), error=bad_type(1, "float")),
    "float-in-lying-list": Case(lambda: LONG_LIST(with_at(1, 1.5)),
                                error=bad_type(1, "float")),
    "out-of-range-then-float": Case(lambda: with_at(3, 1.5, with_at(1, BIG)),
                                    error=bad_range(1, BIG)),
    "below-range-then-bool": Case(lambda: with_at(5, True, with_at(2, SMALL)),
                                  error=bad_range(2, SMALL)),
    "out-of-range-then-tripwire": Case(lambda: with_at(2, Tripwire(), with_at(1, BIG)),
                                       error=bad_range(1, BIG)),
    "float-then-tripwire": Case(lambda: with_at(2, Tripwire(), with_at(1, 1.5)),
                                error=bad_type(1, "float")),
    "bool-then-tripwire": Case(lambda: with_at(2, Tripwire(), with_at(1, True)),
                               error=bad_type(1, "bool")),
    "out-of-range-in-generator-then-tripwire": Case(
        lambda: generator(with_at(2, Tripwire(), with_at(1, BIG))), error=bad_range(1, BIG)
    ),
    "index-out-of-range": Case(lambda: with_at(2, Index(BIG)), error=bad_range(2, BIG)),
    "int-subclass-out-of-range": Case(lambda: with_at(2, IntSub(SMALL)),
                                      error=bad_range(2, SMALL)),
    # Rule 2: an __index__ that raises propagates unchanged.
    "index-raises": Case(lambda: with_at(3, Raising(Boom("boom"))), error=(Boom, "boom")),
    "index-raises-in-tuple": Case(lambda: tuple(with_at(3, Raising(Boom("boom")))),
                                  error=(Boom, "boom")),
    "index-raises-in-list-subclass": Case(
        lambda: LONG_LIST(with_at(3, Raising(Boom("boom")))), error=(Boom, "boom")
    ),
    "index-raises-typeerror": Case(lambda: with_at(3, Raising(TypeError("hostile __index__"))),
                                   error=(TypeError, "hostile __index__")),
    "index-returns-str": Case(lambda: with_at(3, ReturnsStr()),
                              error=(TypeError, "__index__ returned non-int (type str)")),
}


# -- the trees and the conversion paths --------------------------------------------------------
def cache_tree(cls: type) -> tuple[Any, Any]:
    """Splits, two namespaces, a capacity, a locked path, and BASE's first half cached."""
    cache = cls(1, eviction="lru", capacity=28)
    cache.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    cache.insert([1, 2, 3, 9], priority=2)
    cache.insert([*BASE[:4], 99], [20, 21, 22, 23, 24])
    cache.insert([7, 7, 7], namespace="other")
    handle = cache.match_prefix([1, 2, 3, 4, 5]).node
    cache.lock(handle)
    cache.match_prefix([1, 2])
    return cache, handle


def meta_tree(cls: type) -> tuple[Any, Any]:
    """test_meta_errors' tree, with BASE held by ``a`` as tokens and by ``b`` as block hashes."""
    tree, workers = populated(cls)
    tree.insert(BASE, workers["a"])
    tree.apply_stored(workers["b"], 0xB1, BASE, list(range(200, 216)))
    return tree, workers


@dataclass(frozen=True)
class Subject:
    build: Callable[[type], tuple[Any, Any]]
    state: Callable[[Any], Any]
    compare: Callable[[Any, Any, Any, Any], None]  # tree, ctx, twin, twin ctx (destructive)


def compare_meta(tree: Any, ctx: Any, twin: Any, twin_ctx: Any) -> None:
    assert meta_state(tree) == meta_state(twin)


CACHE = Subject(cache_tree, cache_state, check_unchanged)
META = Subject(meta_tree, meta_state, compare_meta)


@dataclass(frozen=True)
class Path:
    """Where a sequence goes: its name in messages, and a call ``(tree, ctx, x, n)`` that puts
    ``x`` (``n`` items when converted) there; a ``batch`` call reports errors as statuses."""

    name: str
    call: Callable[[Any, Any, Any, int], Any]
    batch: bool = False


def hashes(n: int) -> list[int]:
    return [0xC000 + i for i in range(n // 2)]  # one per page of n tokens (page size 2)


def page_tokens(n: int) -> list[int]:
    return list(range(300, 300 + 2 * n))  # two tokens per hash of n hashes


CACHE_PATHS = {
    "match_prefix": Path("key", lambda t, h, x, n: t.match_prefix(x)),
    "insert": Path("key", lambda t, h, x, n: t.insert(x)),
    "insert-values": Path("values", lambda t, h, x, n: t.insert(list(range(40, 40 + n)), x)),
}
META_PATHS = {
    "insert": Path("key", lambda t, w, x, n: t.insert(x, w["a"])),
    "remove": Path("key", lambda t, w, x, n: t.remove(x, w["a"])),
    "match": Path("key", lambda t, w, x, n: t.match(x)),
    "match_many": Path("key", lambda t, w, x, n: t.match_many([BASE, x], touch=True)),
    "apply_stored-token_ids": Path(
        "key", lambda t, w, x, n: t.apply_stored(w["reused"], None, hashes(n), x)
    ),
    "apply_stored-block_hashes": Path(
        "block_hashes", lambda t, w, x, n: t.apply_stored(w["reused"], None, x, page_tokens(n))
    ),
    "apply_removed": Path("block_hashes", lambda t, w, x, n: t.apply_removed(w["b"], x)),
    "apply_events-token_ids": Path(
        "key",
        lambda t, w, x, n: t.apply_events([("stored", w["reused"], None, hashes(n), x)]),
        batch=True,
    ),
    "apply_events-block_hashes": Path(
        "block_hashes",
        lambda t, w, x, n: t.apply_events([("stored", w["reused"], None, x, page_tokens(n))]),
        batch=True,
    ),
    "apply_events-removed": Path(
        "block_hashes", lambda t, w, x, n: t.apply_events([("removed", w["b"], x)]), batch=True
    ),
}


# -- outcomes ----------------------------------------------------------------------------------
FIELDS = {
    "MatchResult": ("length", "values", "node"),
    "Node": ("length",),
    "EvictResult": ("values", "count"),
    "MetaMatch": ("lengths", "tree_length"),
}


def plain(value: Any) -> Any:
    """A hashable, comparable form of a result: arrays with their dtype, ints with their type."""
    if isinstance(value, np.ndarray):
        return (str(value.dtype), plain(value.tolist()))
    if isinstance(value, (list, tuple)):
        return tuple(plain(v) for v in value)
    if isinstance(value, (bool, int)):
        return (type(value).__name__, int(value))
    names = FIELDS.get(type(value).__name__)
    if names is not None:
        return (type(value).__name__, *(plain(getattr(value, n)) for n in names))
    return value


def attempt(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("ok", fn())
    except Exception as exc:  # the outcome under test
        return ("raised", exc)


def outcome(result: tuple[str, Any]) -> tuple[Any, ...]:
    kind, value = result
    if kind == "raised":
        return ("raised", type(value), str(value))
    return ("ok", plain(value))


def refused(error: tuple[type[BaseException], str], batch: bool) -> tuple[Any, ...]:
    """The outcome of a call that must refuse its argument with ``error``."""
    exc_type, message = error
    if batch and issubclass(exc_type, RECORD_ERRORS):
        status = np.array([record_status(exc_type(message))], dtype=np.int8)
        return ("ok", plain(status))
    return ("raised", exc_type, message)


def check_conversion(
    subject: Subject,
    cls: type,
    run: Callable[[Any, Any, bool], Any],
    error: tuple[type[BaseException], str] | None = None,
    batch: bool = False,
) -> None:
    """``run(tree, ctx, True)`` passes the hostile argument, ``run(twin, ctx, False)`` its plain
    equivalent. Both must have the same outcome and leave equal trees; with ``error``, the
    hostile call must refuse it and change nothing."""
    tree, ctx = subject.build(cls)
    twin, twin_ctx = subject.build(cls)
    got = outcome(attempt(lambda: run(tree, ctx, True)))
    if error is None:
        want = outcome(attempt(lambda: run(twin, twin_ctx, False)))
    else:
        want = refused(error, batch)
    assert got == want
    tree.check()
    subject.compare(tree, ctx, twin, twin_ctx)


def check_sequence(subject: Subject, cls: type, path: Path, case: Case) -> None:
    n = len(case.plain) if case.plain is not None else len(BASE)
    error = None
    if case.error is not None:
        exc_type, template = case.error
        error = (exc_type, template.replace("{name}", path.name).replace(
            "{range}", RANGES[path.name]))

    def run(tree: Any, ctx: Any, hostile: bool) -> Any:
        return path.call(tree, ctx, case.make() if hostile else case.plain, n)

    check_conversion(subject, cls, run, error, path.batch)


@pytest.mark.parametrize("case", list(SEQUENCES.values()), ids=list(SEQUENCES))
@pytest.mark.parametrize("core", ["reference", "native"])
def test_token_array_sequence_argument(core: str, case: Case) -> None:
    """token_array (how the Router converts a prompt, once, for all its tree calls): every
    hostile sequence, both cores, the trees' rules and messages under the name given."""
    module = REFERENCE if core == "reference" else require_native()
    got = outcome(attempt(lambda: module.token_array(case.make(), "tokens")))
    if case.error is None:
        assert case.plain is not None
        want = outcome(("ok", np.array(case.plain, dtype=np.uint32)))
    else:
        exc_type, template = case.error
        message = template.replace("{name}", "tokens").replace("{range}", RANGES["key"])
        want = ("raised", exc_type, message)
    assert got == want
    if got[0] == "ok":
        result = module.token_array(case.make(), "tokens")
        assert type(result) is np.ndarray and result.flags.c_contiguous and result.ndim == 1


@pytest.mark.parametrize("case", list(SEQUENCES.values()), ids=list(SEQUENCES))
@pytest.mark.parametrize("path", list(CACHE_PATHS.values()), ids=list(CACHE_PATHS))
def test_cache_sequence_argument(impl: type, path: Path, case: Case) -> None:
    """RadixCache.match_prefix/insert (key, values): every hostile sequence, both cores."""
    check_sequence(CACHE, impl, path, case)


@pytest.mark.parametrize("case", list(SEQUENCES.values()), ids=list(SEQUENCES))
@pytest.mark.parametrize("path", list(META_PATHS.values()), ids=list(META_PATHS))
def test_meta_sequence_argument(meta_impl: type, path: Path, case: Case) -> None:
    """MetaTree token keys and block hashes: every hostile sequence, both cores."""
    check_sequence(META, meta_impl, path, case)


# -- containers of keys and of records ---------------------------------------------------------
def records(w: Any) -> list[tuple[Any, ...]]:
    return [
        ("stored", w["reused"], None, [0xE1], [6, 6]),
        ("removed", w["b"], [11, 12]),
        ("stored", w["a"], 0xDEAD, [0xE2], [6, 6]),  # unknown parent
        ("cleared", w["c"]),
    ]


CONTAINERS = {
    "list-len-too-long": LONG_LIST,
    "list-len-too-short": SHORT_LIST,
    "tuple-len-too-long": LONG_TUPLE,
    "tuple-len-too-short": SHORT_TUPLE,
    "deque": collections.deque,
}
BATCHES = {
    "match_many": lambda t, w, wrap: t.match_many(wrap([BASE, [1, 2, 3, 4], [5, 5]]), touch=True),
    "apply_events": lambda t, w, wrap: t.apply_events(wrap(records(w))),
}


@pytest.mark.parametrize("call", list(BATCHES.values()), ids=list(BATCHES))
@pytest.mark.parametrize("container", list(CONTAINERS.values()), ids=list(CONTAINERS))
def test_meta_container_of_keys_or_records(meta_impl: type, container: type, call: Any) -> None:
    """match_many's keys and apply_events' records are read as list(x) sees them."""

    def run(tree: Any, workers: Any, hostile: bool) -> Any:
        return call(tree, workers, container if hostile else list)

    check_conversion(META, meta_impl, run)


# -- integer scalars (rule 4) --------------------------------------------------------------------
@dataclass(frozen=True)
class Scalar:
    name: str
    call: Callable[[Any, Any, Any], Any]
    good: int
    batch: bool = False


CACHE_SCALARS = {
    "insert-priority": Scalar("priority", lambda t, h, v: t.insert([60, 61, 62], priority=v), 5),
    "evict-num_tokens": Scalar("num_tokens", lambda t, h, v: t.evict(v), 3),
}
META_SCALARS = {
    "insert-start": Scalar("start", lambda t, w, v: t.insert([1, 2, 3, 4, 9, 9], w["a"], start=v),
                           2),
    "remove-start": Scalar("start", lambda t, w, v: t.remove(BASE, w["a"], start=v), 4),
    "apply_stored-parent_hash": Scalar(
        "parent_hash", lambda t, w, v: t.apply_stored(w["a"], v, [0xE1], [5, 5]), 0xA2
    ),
    "apply_stored-tier": Scalar(
        "tier", lambda t, w, v: t.apply_stored(w["reused"], None, [0xE2], [6, 6], tier=v), 0
    ),
    "apply_removed-tier": Scalar("tier", lambda t, w, v: t.apply_removed(w["a"], [0xA1], tier=v),
                                 0),
    "_bind_hash-block_hash": Scalar("block_hash", lambda t, w, v: t._bind_hash(w["a"], [1, 2], v),
                                    0xF1),
    "apply_events-parent_hash": Scalar(
        "parent_hash",
        lambda t, w, v: t.apply_events([("stored", w["b"], v, [0xE3], [5, 5])]),
        0x11,
        batch=True,
    ),
}
# Each variant: how to make the hostile scalar from the good value, and the error, if any.
VARIANTS: dict[str, tuple[Callable[[int], Any], tuple[type[BaseException], str] | None]] = {
    "index": (Index, None),
    "int-subclass": (IntSub, None),
    "numpy": (np.int64, None),
    "bool": (lambda v: bool(v), (InputTypeError, "{name} must be an integer, got bool")),
    "index-raises": (lambda v: Raising(Boom("boom")), (Boom, "boom")),
}


def check_scalar(subject: Subject, cls: type, scalar: Scalar, variant: str) -> None:
    make, error = VARIANTS[variant]
    if error is not None:
        error = (error[0], error[1].replace("{name}", scalar.name))

    def run(tree: Any, ctx: Any, hostile: bool) -> Any:
        return scalar.call(tree, ctx, make(scalar.good) if hostile else scalar.good)

    check_conversion(subject, cls, run, error, scalar.batch)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("scalar", list(CACHE_SCALARS.values()), ids=list(CACHE_SCALARS))
def test_cache_scalar_argument(impl: type, scalar: Scalar, variant: str) -> None:
    check_scalar(CACHE, impl, scalar, variant)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("scalar", list(META_SCALARS.values()), ids=list(META_SCALARS))
def test_meta_scalar_argument(meta_impl: type, scalar: Scalar, variant: str) -> None:
    check_scalar(META, meta_impl, scalar, variant)


CONSTRUCTORS = {
    "cache-page_size": ("cache", lambda cls, v: cls(page_size=v).page_size, 2),
    "cache-capacity": ("cache", lambda cls, v: cls(capacity=v).capacity, 8),
    "meta-page_size": ("meta", lambda cls, v: cls(v).page_size, 2),
    "meta-add_worker-capacity": (
        "meta",
        lambda cls, v: (tree := cls()).capacity_of(tree.add_worker("w", capacity=v)),
        8,
    ),
}


def check_constructor(cls: type, kind: str, variant: str) -> None:
    """page_size and capacity take any __index__ object and read back as a plain int."""
    for position, (of, read, good) in CONSTRUCTORS.items():
        if of == kind:
            got = outcome(attempt(lambda: read(cls, VARIANTS[variant][0](good))))  # noqa: B023
            assert got == ("ok", ("int", good)), position


@pytest.mark.parametrize("variant", ["index", "int-subclass", "numpy"])
def test_cache_constructor_scalars(impl: type, variant: str) -> None:
    check_constructor(impl, "cache", variant)


@pytest.mark.parametrize("variant", ["index", "int-subclass", "numpy"])
def test_meta_constructor_scalars(meta_impl: type, variant: str) -> None:
    check_constructor(meta_impl, "meta", variant)


# -- rules 5 and 6 -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "operation",
    [pickle.dumps, lambda c: pickle.dumps(c, 0), copy.copy, copy.deepcopy],
    ids=["pickle", "pickle-protocol-0", "copy", "deepcopy"],
)
def test_cache_cannot_be_pickled_or_copied(impl: type, operation: Callable[[Any], Any]) -> None:
    radix_cache = type("RadixCache", (impl,), {"__slots__": ()})  # as radixmeta.RadixCache
    cache = radix_cache()
    cache.insert([1, 2, 3])
    message = "cannot pickle or copy 'RadixCache' object"
    with pytest.raises(TypeError, match=exactly(message)) as info:
        operation(cache)
    assert type(info.value) is TypeError
    cache.check()


TOO_BIG_PAGES = pytest.mark.parametrize(
    "page_size",
    [2**32, 2**40, 2**64, np.uint64(2**32), Index(2**32)],
    ids=["2**32", "2**40", "2**64", "numpy", "index"],
)


def check_page_size_limit(cls: type, page_size: Any) -> None:
    message = f"page_size must be < 2**32, got {operator.index(page_size)}"
    assert outcome(attempt(lambda: cls(page_size))) == ("raised", InvalidInputError, message)
    assert cls(2**32 - 1).page_size == 2**32 - 1


@TOO_BIG_PAGES
def test_cache_page_size_below_2_to_the_32(impl: type, page_size: Any) -> None:
    check_page_size_limit(impl, page_size)


@TOO_BIG_PAGES
def test_meta_page_size_below_2_to_the_32(meta_impl: type, page_size: Any) -> None:
    check_page_size_limit(meta_impl, page_size)


# -- hostile code during a call -----------------------------------------------------------------
class Finalizer:
    """Garbage in a reference cycle whose ``__del__`` runs ``action`` when collected."""

    def __init__(self, action: Callable[[], None]) -> None:
        self.action = action
        self.cycle = self

    def __del__(self) -> None:
        self.action()


@dataclass
class Probe:
    collections: int = 0
    fired: bool = False
    result: tuple[str, Any] | None = None  # the action's attempt()
    threads: list[threading.Thread] = field(default_factory=list)


@contextmanager
def collection_runs(
    probe: Probe, at: int, action: Callable[[], None], finalizer: bool
) -> Iterator[None]:
    """Run ``action`` at the ``at``-th collection (0 based) while inside: directly from a
    ``gc.callbacks`` callback, or from the ``__del__`` of garbage that collection frees. The
    threshold of 1 makes a collection start at (nearly) every allocation of a tracked object."""

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase != "start":
            return
        probe.collections += 1
        if probe.collections - 1 == at:
            if finalizer:
                Finalizer(action)  # unreachable at once: this very collection frees it
            else:
                action()

    thresholds = gc.get_threshold()
    was_enabled = gc.isenabled()
    gc.enable()
    gc.set_threshold(1)
    gc.collect(0)  # the count of allocations starts from 0: the same points on every run
    gc.callbacks.append(callback)
    try:
        yield
    finally:
        gc.set_threshold(*thresholds)
        if not was_enabled:
            gc.disable()
        gc.callbacks.remove(callback)


def drain_freelists(cls: type) -> list[Any]:
    """Result objects held alive, so that the binding's freelists are empty and the results of
    the call under test are really allocated: that is where a collection can start."""
    scratch = cls()
    if hasattr(scratch, "match_prefix"):
        scratch.insert([1])
        matches = [scratch.match_prefix([1]) for _ in range(64)]
        return matches + [scratch.evict(0) for _ in range(64)]
    return [scratch.match([1]) for _ in range(64)]


def identity(value: int) -> int:
    return value


@dataclass(frozen=True)
class During:
    """A call ``(tree, ctx, wrap)``; ``wrap(v)`` marks an integer argument that hostile code can
    ride on. ``converts`` is False for calls that take no such argument."""

    call: Callable[[Any, Any, Callable[[int], Any]], Any]
    converts: bool = True


CACHE_CALLS = {
    "match_prefix": During(lambda t, h, x: t.match_prefix([11, 12, x(13), 14, 15, 16])),
    "insert": During(lambda t, h, x: t.insert([11, 12, x(13), 14, 15, 16, 17], priority=1)),
    "insert-values": During(lambda t, h, x: t.insert([70, 71, 72], [5, x(6), 7])),
    "insert-priority": During(lambda t, h, x: t.insert([70, 71], priority=x(3))),
    "evict": During(lambda t, h, x: t.evict(x(3))),
    "items": During(lambda t, h, x: t.items(), converts=False),
}
META_CALLS = {
    "match": During(lambda t, w, x: t.match([11, 12, x(13), 14])),
    "match-touch": During(lambda t, w, x: t.match([1, 2, x(7), 7], touch=True)),
    "match_many": During(lambda t, w, x: t.match_many([[1, 2, 3, 4], [11, x(12)]], touch=True)),
    "insert": During(lambda t, w, x: t.insert([1, 2, 3, 4, 9, 9], w["a"], start=x(2))),
    "remove": During(lambda t, w, x: t.remove([11, 12, x(13), 14], w["a"])),
    "apply_stored": During(lambda t, w, x: t.apply_stored(w["a"], x(0xA2), [0xE1], [5, x(6)])),
    "apply_removed": During(lambda t, w, x: t.apply_removed(w["b"], [11, x(12)])),
    "apply_events": During(
        lambda t, w, x: t.apply_events(
            [("stored", w["a"], 0xA2, [x(0xE1)], [5, 6]), ("removed", w["b"], [x(11)])]
        )
    ),
    "items": During(lambda t, w, x: t.items(), converts=False),
    "items-of-worker": During(lambda t, w, x: t.items(w["b"]), converts=False),
    "dump": During(lambda t, w, x: t.dump(w["a"]), converts=False),
    "_block_entries": During(lambda t, w, x: t._block_entries(w["b"]), converts=False),
}


def reset_and_refill(cache: Any, handle: Any) -> None:
    """Reset, then create enough nodes that a handle from before names a live node again."""
    cache.reset()
    for i in range(12):
        cache.insert([50 + i, 50 + i])


CACHE_ACTIONS: dict[str, Callable[[Any, Any], Any]] = {
    "reset-and-refill": reset_and_refill,
    "reset": lambda t, h: t.reset(),
    "insert": lambda t, h: t.insert([60, 61, 62, 63]),
    "evict": lambda t, h: t.evict(10**6),
}
META_ACTIONS: dict[str, Callable[[Any, Any], Any]] = {
    "remove_worker": lambda t, w: t.remove_worker(w["a"]),
    "insert": lambda t, w: t.insert([11, 12, 13, 14, 77, 77], w["b"]),
    "add_worker": lambda t, w: t.add_worker("late"),
}
DELIVERIES = ["gc-callback", "finalizer", "index", "other-thread"]
# Another thread may run between any two calls of an action of several calls: that is no bug,
# but neither of the two orders either, so those actions are delivered by this thread only.
SEVERAL_CALLS = {"reset-and-refill"}
SWEEP_LIMIT = 500  # collections one call may start, at most


def sequential(subject: Subject, cls: type, during: During, action: Any, first: str) -> Any:
    """The call and the action one after the other on a fresh tree: outcomes and state."""
    tree, ctx = subject.build(cls)
    results = {}
    for step in (first, "call" if first == "action" else "action"):
        if step == "call":
            results[step] = outcome(attempt(lambda: during.call(tree, ctx, identity)))
        else:
            results[step] = outcome(attempt(lambda: action(tree, ctx)))
    return results["call"], results["action"], subject.state(tree)


def interrupted(subject: Subject, cls: type, during: During, action: Any, delivery: str,
                at: int, phase: int) -> tuple[Any, Any, Any, Probe]:
    """The call, with the action delivered in the middle of it (``probe.fired`` says whether it
    ran at all). ``phase`` allocates one more object before the call: with a threshold of 1, a
    collection starts at every second allocation, so the two phases together start one at
    every allocation."""
    tree, ctx = subject.build(cls)
    probe = Probe()

    def act() -> None:
        probe.fired = True
        probe.result = attempt(lambda: action(tree, ctx))

    def in_other_thread() -> None:
        started = threading.Event()

        def body() -> None:
            started.set()
            act()

        worker = threading.Thread(target=body)
        probe.threads.append(worker)
        worker.start()
        assert started.wait(JOIN_TIMEOUT)
        for _ in range(50):
            time.sleep(0)  # let it in, if the call under way allows that

    if delivery in ("gc-callback", "finalizer"):
        held = drain_freelists(cls)
        with collection_runs(probe, at, act, delivery == "finalizer"):
            padding = [] if phase else None
            result = attempt(lambda: during.call(tree, ctx, identity))
        del held, padding
    else:
        once = [act if delivery == "index" else in_other_thread]

        def wrap(value: int) -> Index:
            return Index(value, once.pop() if once else None)

        result = attempt(lambda: during.call(tree, ctx, wrap))
    for worker in probe.threads:
        worker.join(JOIN_TIMEOUT)
        assert not worker.is_alive(), "the action's thread did not finish"
    return tree, ctx, result, probe


def check_handle(cache: Any, result: Any) -> None:
    """A handle from a match interrupted by a reset is stale, or names the node it matched."""
    protected = cache.protected_size
    try:
        cache.lock(result.node)
    except StaleNodeError:
        return
    assert result.node.length == result.length
    assert cache.protected_size - protected == result.length  # the matched path, nothing else
    cache.check()


def check_interrupted(subject: Subject, cls: type, during: During, action: Any,
                      delivery: str) -> int:
    """Both results and the tree are those of the call and the action run one after the other
    (either order), at every point of the call where the action can be delivered. Returns how
    many points there were."""
    orders = [sequential(subject, cls, during, action, first) for first in ("action", "call")]
    sweep = delivery in ("gc-callback", "finalizer")
    points = 0
    for phase in (0, 1) if sweep else (0,):
        for at in range(SWEEP_LIMIT):
            tree, _, result, probe = interrupted(subject, cls, during, action, delivery, at, phase)
            if not probe.fired:  # past the last collection of the call
                assert sweep, f"the hostile argument was never converted: {outcome(result)}"
                break
            points += 1
            tree.check()
            got = (outcome(result), outcome(probe.result or ("ok", None)), subject.state(tree))
            assert got in orders, f"the action ran at collection {at} (phase {phase})"
            if result[0] == "ok" and type(result[1]).__name__ == "MatchResult":
                check_handle(tree, result[1])
            if not sweep:
                return points
        else:
            pytest.fail(f"more than {SWEEP_LIMIT} collections started during one call")
    return points


def interruptions(calls: dict[str, During], actions: dict[str, Any]) -> list[Any]:
    return [
        pytest.param(calls[c], actions[a], d, id=f"{c}-{a}-{d}")
        for c, a, d in itertools.product(calls, actions, DELIVERIES)
        if (calls[c].converts or d in ("gc-callback", "finalizer"))
        and not (a in SEVERAL_CALLS and d == "other-thread")
    ]


@pytest.mark.parametrize(
    ("during", "action", "delivery"), interruptions(CACHE_CALLS, CACHE_ACTIONS)
)
def test_cache_call_interrupted(impl: type, during: During, action: Any, delivery: str) -> None:
    """A collection's callback or finalizer, an __index__ or another thread resets or mutates the
    cache during match_prefix, insert, evict or items."""
    check_interrupted(CACHE, impl, during, action, delivery)


@pytest.mark.parametrize(("during", "action", "delivery"), interruptions(META_CALLS, META_ACTIONS))
def test_meta_call_interrupted(meta_impl: type, during: During, action: Any, delivery: str) -> None:
    """The same for the MetaTree calls; the actions remove a worker, insert, or add a worker."""
    check_interrupted(META, meta_impl, during, action, delivery)


def one_prompt(cls: type) -> tuple[Any, Any]:
    cache = cls()
    cache.insert(list(range(1, 9)))
    return cache, None


def test_stale_handle_from_a_match_interrupted_by_reset(impl: type) -> None:
    """The review's case: gc.callbacks resets the cache and inserts during match_prefix; the
    handle it returns must then be stale, or name the node it matched (check_handle)."""
    subject = Subject(one_prompt, cache_state, check_unchanged)
    during = During(lambda t, h, x: t.match_prefix([1, 2, 3, x(4), 5, 6, 7, 8]))
    assert check_interrupted(subject, impl, during, reset_and_refill, "gc-callback") >= 1


# -- threads reading while another mutates ------------------------------------------------------
Step = Callable[[Any, Any], Any]  # one mutating call on (tree, ctx)


def cache_steps(r: int) -> list[Step]:
    steps: list[Step] = [
        lambda t, h: t.insert([1, 2, 3, 20 + r % 4, 5], [r, r + 1, r + 2, r + 3, r + 4]),
        lambda t, h: t.match_prefix([1, 2, 3, 20 + r % 4]),  # splits
        lambda t, h: t.insert([7, 7, 7, r], namespace="other"),
        lambda t, h: t.evict(3),
    ]
    if r % 7 == 6:
        steps.append(lambda t, h: t.reset())
    return steps


def add_x(tree: Any, w: Any, capacity: int | None) -> None:
    w["x"] = tree.add_worker("x", capacity=capacity)


def meta_steps(r: int) -> list[Step]:
    steps: list[Step] = [
        lambda t, w: add_x(t, w, None if r % 2 else 6),
        lambda t, w: t.insert([1, 2, 3, 4, 40 + r % 3, 0], w["x"]),
        lambda t, w: t.apply_stored(w["x"], None, [0xD1, 0xD2], [1, 2, 3, 4]),
        lambda t, w: t.insert([11, 12, 13, 14, 90 + r % 5, 0], w["b"]),
        lambda t, w: t.apply_stored(w["b"], None, [0xD3 + r], [60 + r, 0]),
        lambda t, w: t.remove([11, 12, 13, 14, 90 + (r + 2) % 5, 0], w["b"], start=4),
        lambda t, w: t.apply_removed(w["b"], [0xD3 + r - 2]),
        lambda t, w: t.remove([1, 2, 3, 4], w["x"], start=2),
    ]
    if r % 3:
        steps.append(lambda t, w: t.apply_cleared(w["x"]))
    steps.append(lambda t, w: t.remove_worker(w["x"]))
    return steps


CACHE_READERS = {
    "items": lambda t, h: t.items(),
    "items-other": lambda t, h: t.items(namespace="other"),
    "structure": lambda t, h: t._structure(None),
}
META_READERS = {
    "items": lambda t, w: t.items(),
    "items-of-worker": lambda t, w: t.items(w["b"]),
    "dump": lambda t, w: t.dump(w["b"]),
    "_block_entries": lambda t, w: t._block_entries(w["b"]),
    "match": lambda t, w: t.match([1, 2, 3, 4, 40, 0]),
}
ROUNDS = 60
MAX_READS = 20000


def check_race(subject: Subject, cls: type, steps: Callable[[int], list[Step]],
               readers: dict[str, Callable[[Any, Any], Any]]) -> None:
    """Readers in threads of their own, while one thread mutates: every read is one that a
    sequential run finds between two mutating calls."""
    script = [step for r in range(ROUNDS) for step in steps(r)]
    twin, twin_ctx = subject.build(cls)
    allowed = {name: {plain(read(twin, twin_ctx))} for name, read in readers.items()}
    for step in script:
        step(twin, twin_ctx)
        for name, read in readers.items():
            allowed[name].add(plain(read(twin, twin_ctx)))
    tree, ctx = subject.build(cls)
    done = threading.Event()
    barrier = threading.Barrier(len(readers) + 1)
    errors: list[BaseException] = []
    seen: dict[str, list[Any]] = {name: [] for name in readers}

    def mutate() -> None:
        try:
            barrier.wait(JOIN_TIMEOUT)
            for step in script:
                step(tree, ctx)
                time.sleep(0)  # hand the GIL over: the readers read between (and during) steps
        except BaseException as exc:  # reported below: a thread's error must fail the test
            errors.append(exc)
        finally:
            done.set()

    def read(name: str, fn: Callable[[Any, Any], Any]) -> None:
        try:
            barrier.wait(JOIN_TIMEOUT)
            for _ in range(MAX_READS):
                seen[name].append(plain(fn(tree, ctx)))
                if done.is_set():
                    return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=mutate)]
    threads += [threading.Thread(target=read, args=item) for item in readers.items()]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT)
    assert not any(thread.is_alive() for thread in threads), "a thread did not finish"
    assert not errors, errors
    for name, snapshots in seen.items():
        assert snapshots
        for i, snapshot in enumerate(snapshots):
            assert snapshot in allowed[name], f"{name} read #{i} is no state of a sequential run"
    tree.check()
    assert subject.state(tree) == subject.state(twin)


def test_cache_reads_race_mutations(impl: type, fast_switching: None) -> None:
    check_race(CACHE, impl, cache_steps, CACHE_READERS)


def test_meta_reads_race_mutations(meta_impl: type, fast_switching: None) -> None:
    """items, dump and _block_entries from threads while another inserts, removes, stores and
    removes workers: always a whole state, never a crash."""
    check_race(META, meta_impl, meta_steps, META_READERS)
