"""Every bad input, on every implementation: exception type, builtin base, exact message,
and a cache left exactly as it was.

Messages are spelled out in full here, so both implementations must produce the same text.
"""

from __future__ import annotations

import array
import copy
import pickle
import re
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest

from radixmeta.errors import (
    CacheFullError,
    ForeignNodeError,
    InputTypeError,
    InvalidInputError,
    LockError,
    NodeError,
    RadixMetaError,
    StaleNodeError,
)

STALE = "node handle is stale: its node was evicted or the cache was reset"
RANGE = "is outside the token range [0, 2**32)"


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def state(cache: Any) -> dict[str, Any]:
    """Everything observable without changing the cache."""
    namespaces = list(cache.namespaces())
    return {
        "sizes": (cache.evictable_size, cache.protected_size, cache.total_size),
        "node_count": cache.node_count,
        "stats": cache.stats,
        "namespaces": namespaces,
        "items": {
            ns: [(t.tolist(), v.tolist()) for t, v in cache.items(namespace=ns)]
            for ns in namespaces
        },
        "structure": {
            ns: [(level, label.tolist(), locks) for level, label, locks in cache._structure(ns)]
            for ns in namespaces
        },
    }


def populate(impl: type) -> tuple[Any, list[Any]]:
    """A full cache with splits, two namespaces, a locked path and a capacity-evicted slot."""
    cache = impl(1, eviction="lru", capacity=12)
    cache.insert([1, 2, 3, 4, 5], [10, 11, 12, 13, 14])
    cache.insert([1, 2, 3, 9], priority=2)
    cache.insert([7, 7, 7], namespace="other")
    handle = cache.match_prefix([1, 2, 3, 4, 5]).node
    cache.lock(handle)
    cache.match_prefix([1, 2])
    cache.insert([6, 6, 6, 6])  # 13 tokens > 12: the least recently used leaf [9] goes
    assert (cache.total_size, cache.stats.evicted_tokens) == (12, 1)
    return cache, [handle]


def check_unchanged(cache: Any, handle: Any, twin: Any, twin_handle: Any) -> None:
    """``cache`` equals a ``twin`` that never saw the failing call: in state and in
    the order it evicts everything."""
    assert state(cache) == state(twin)
    cache.unlock(handle)
    twin.unlock(twin_handle)
    assert cache.evict(10**6).values.tolist() == twin.evict(10**6).values.tolist()


@contextmanager
def raises(exc: type[RadixMetaError], builtin: type[Exception], message: str) -> Iterator[None]:
    """Expect ``exc`` with exactly ``message``, also an instance of ``builtin``."""
    with pytest.raises(exc, match=exactly(message)) as info:
        yield
    assert isinstance(info.value, builtin)
    assert isinstance(info.value, RadixMetaError)


# -- keys ------------------------------------------------------------------------------------
BAD_KEYS = [
    pytest.param([1, -1], InvalidInputError, ValueError, f"key[1] = -1 {RANGE}", id="negative"),
    pytest.param(
        [2**32], InvalidInputError, ValueError, f"key[0] = 4294967296 {RANGE}", id="2**32"
    ),
    pytest.param(
        (0, 1, 2**64), InvalidInputError, ValueError, f"key[2] = {2**64} {RANGE}", id="2**64-tuple"
    ),
    pytest.param(
        np.array([5, 2**32 - 1, 2**32], dtype=np.int64),
        InvalidInputError,
        ValueError,
        f"key[2] = 4294967296 {RANGE}",
        id="int64-array-2**32",
    ),
    pytest.param(
        np.array([3, -7], dtype=np.int64),
        InvalidInputError,
        ValueError,
        f"key[1] = -7 {RANGE}",
        id="int64-array-negative",
    ),
    pytest.param(
        np.array([-1], dtype=np.int8),
        InvalidInputError,
        ValueError,
        f"key[0] = -1 {RANGE}",
        id="int8",
    ),
    pytest.param(
        np.array([1, 2**40], dtype=np.uint64),
        InvalidInputError,
        ValueError,
        f"key[1] = {2**40} {RANGE}",
        id="uint64",
    ),
    pytest.param(
        array.array("q", [1, -3]),
        InvalidInputError,
        ValueError,
        f"key[1] = -3 {RANGE}",
        id="array-q",
    ),
    pytest.param(
        [1, 2.0],
        InputTypeError,
        TypeError,
        "key[1] must be an integer, got float",
        id="float-in-list",
    ),
    pytest.param(
        [np.float64(1)],
        InputTypeError,
        TypeError,
        "key[0] must be an integer, got float64",
        id="np-float-in-list",
    ),
    pytest.param(
        ["1"], InputTypeError, TypeError, "key[0] must be an integer, got str", id="str-in-list"
    ),
    pytest.param(
        [[1, 2]], InputTypeError, TypeError, "key[0] must be an integer, got list", id="nested-list"
    ),
    pytest.param(
        np.array([1.0, 2.0]),
        InputTypeError,
        TypeError,
        "key must hold integers, got dtype float64",
        id="float64-array",
    ),
    pytest.param(
        np.array([1.0], dtype=np.float32),
        InputTypeError,
        TypeError,
        "key must hold integers, got dtype float32",
        id="float32-array",
    ),
    pytest.param(
        np.array([True]),
        InputTypeError,
        TypeError,
        "key must hold integers, got dtype bool",
        id="bool-array",
    ),
    pytest.param(
        array.array("d", [1.0]),
        InputTypeError,
        TypeError,
        "key must hold integers, got dtype float64",
        id="array-d",
    ),
    pytest.param(
        "abc", InputTypeError, TypeError, "key must be a sequence of integers, got str", id="str"
    ),
    pytest.param(
        b"abc",
        InputTypeError,
        TypeError,
        "key must be a sequence of integers, got bytes",
        id="bytes",
    ),
    pytest.param(
        np.zeros((2, 2), dtype=np.int64),
        InvalidInputError,
        ValueError,
        "key must be 1-D, got an array with 2 dimensions",
        id="2d-array",
    ),
    pytest.param(
        np.arange(8, dtype=np.int32).reshape(2, 2, 2)[:, 0],
        InvalidInputError,
        ValueError,
        "key must be 1-D, got an array with 2 dimensions",
        id="2d-view",
    ),
    pytest.param(
        5,
        InputTypeError,
        TypeError,
        "key must be a sequence of integers, got int",
        id="scalar",
    ),
    pytest.param(
        np.int64(5),
        InputTypeError,
        TypeError,
        "key must be a sequence of integers, got int64",
        id="np-scalar",
    ),
    pytest.param(
        None,
        InputTypeError,
        TypeError,
        "key must be a sequence of integers, got NoneType",
        id="none",
    ),
    # The input rules (docs/cache.md, Inputs): bools are never integers, text is refused,
    # and the first bad element in order is the one reported.
    pytest.param(
        [1, True], InputTypeError, TypeError, "key[1] must be an integer, got bool", id="bool"
    ),
    pytest.param(
        [np.int64(3), np.True_],
        InputTypeError,
        TypeError,
        "key[1] must be an integer, got bool",
        id="np-bool",
    ),
    pytest.param(
        bytearray(b"ab"),
        InputTypeError,
        TypeError,
        "key must be a sequence of integers, got bytearray",
        id="bytearray",
    ),
    pytest.param([1, -1, 2.5], InvalidInputError, ValueError, f"key[1] = -1 {RANGE}", id="first"),
    pytest.param(
        [1, 2.5, -1],
        InputTypeError,
        TypeError,
        "key[1] must be an integer, got float",
        id="first-type",
    ),
    pytest.param(
        deque([3, -2]), InvalidInputError, ValueError, f"key[1] = -2 {RANGE}", id="deque"
    ),
    pytest.param(
        object(), InputTypeError, TypeError, "key must be a sequence of integers, got object",
        id="object",
    ),
]


@pytest.mark.parametrize(("key", "exc", "builtin", "message"), BAD_KEYS)
@pytest.mark.parametrize("method", ["match_prefix", "insert"])
def test_bad_key(
    impl: type, method: str, key: Any, exc: type[RadixMetaError], builtin: type, message: str
) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    with raises(exc, builtin, message):
        getattr(cache, method)(key)
    check_unchanged(cache, handle, twin, twin_handle)


class Index:
    """An integer-like object that is not an int (what ``__index__`` is for)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


class LyingList(list):  # type: ignore[type-arg]
    """A list whose ``__len__`` overstates (once read past the end by the native core)."""

    def __len__(self) -> int:
        return super().__len__() + 1000


@pytest.mark.parametrize(
    "key",
    [
        pytest.param([Index(1), Index(2), 3], id="index-objects"),
        pytest.param(LyingList([1, 2, 3]), id="lying-len"),
        pytest.param(range(1, 4), id="range"),
        pytest.param(np.array([3, 2, 1], dtype=np.int32)[::-1], id="negative-stride"),
        pytest.param(memoryview(array.array("i", [1, 2, 3])), id="memoryview"),
        pytest.param(np.array([1, 2, 3], dtype=">i8"), id="big-endian"),
    ],
)
def test_accepted_keys(impl: type, key: Any) -> None:
    cache = impl()
    assert cache.insert(key, LyingList([7, 8, 9]), priority=Index(3)) == 0
    assert cache.match_prefix([1, 2, 3]).values.tolist() == [7, 8, 9]
    assert cache.match_prefix(key).length == 3
    cache.check()


def test_pickling_a_cache_is_refused_with_one_message(impl: type) -> None:
    cache = impl()
    name = type(cache).__name__
    for attempt in (pickle.dumps, copy.copy, copy.deepcopy):
        with pytest.raises(TypeError, match=exactly(f"cannot pickle or copy {name!r} object")):
            attempt(cache)


def test_bad_key_is_reported_before_bad_values(impl: type) -> None:
    cache = impl()
    with raises(InvalidInputError, ValueError, f"key[0] = -1 {RANGE}"):
        cache.insert([-1], [1.5, 2.5])


# -- values and priority --------------------------------------------------------------------
BAD_VALUES = [
    pytest.param(
        [1, 2],
        InvalidInputError,
        ValueError,
        "values must have the same length as the key (3), got 2",
        id="short",
    ),
    pytest.param(
        np.arange(4),
        InvalidInputError,
        ValueError,
        "values must have the same length as the key (3), got 4",
        id="long-array",
    ),
    pytest.param(
        [1, 2.5, 3],
        InputTypeError,
        TypeError,
        "values[1] must be an integer, got float",
        id="float",
    ),
    pytest.param(
        np.array([1.0, 2.0, 3.0]),
        InputTypeError,
        TypeError,
        "values must hold integers, got dtype float64",
        id="float-array",
    ),
    pytest.param(
        [0, 0, 2**63],
        InvalidInputError,
        ValueError,
        f"values[2] = {2**63} is outside the int64 range",
        id="2**63",
    ),
    pytest.param(
        np.array([0, 2**63, 0], dtype=np.uint64),
        InvalidInputError,
        ValueError,
        f"values[1] = {2**63} is outside the int64 range",
        id="uint64-2**63",
    ),
    pytest.param(
        [-(2**63) - 1, 0, 0],
        InvalidInputError,
        ValueError,
        f"values[0] = {-(2**63) - 1} is outside the int64 range",
        id="below-int64",
    ),
    pytest.param(
        np.zeros((3, 1), dtype=np.int64),
        InvalidInputError,
        ValueError,
        "values must be 1-D, got an array with 2 dimensions",
        id="2d",
    ),
    pytest.param(
        "abc", InputTypeError, TypeError, "values must be a sequence of integers, got str", id="str"
    ),
]


@pytest.mark.parametrize(("values", "exc", "builtin", "message"), BAD_VALUES)
def test_bad_values(
    impl: type, values: Any, exc: type[RadixMetaError], builtin: type, message: str
) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    with raises(exc, builtin, message):
        cache.insert([1, 2, 3], values)
    with raises(exc, builtin, message):
        cache.insert([50, 51, 52], values, namespace="new")  # no namespace is created
    check_unchanged(cache, handle, twin, twin_handle)


def test_values_length_is_checked_against_the_unaligned_key(impl: type) -> None:
    cache = impl(4)
    with raises(
        InvalidInputError, ValueError, "values must have the same length as the key (6), got 4"
    ):
        cache.insert([1, 2, 3, 4, 5, 6], [1, 2, 3, 4])
    assert cache.insert([1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6]) == 0
    assert cache.total_size == 4


@pytest.mark.parametrize(
    ("priority", "exc", "builtin", "message"),
    [
        pytest.param(
            1.0, InputTypeError, TypeError, "priority must be an integer, got float", id="float"
        ),
        pytest.param(
            True, InputTypeError, TypeError, "priority must be an integer, got bool", id="bool"
        ),
        pytest.param(
            None, InputTypeError, TypeError, "priority must be an integer, got NoneType", id="none"
        ),
        pytest.param(
            2**63,
            InvalidInputError,
            ValueError,
            f"priority = {2**63} is outside the int64 range",
            id="big",
        ),
    ],
)
def test_bad_priority(
    impl: type, priority: Any, exc: type[RadixMetaError], builtin: type, message: str
) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    with raises(exc, builtin, message):
        cache.insert([1, 2, 3, 4, 5, 6], priority=priority)
    check_unchanged(cache, handle, twin, twin_handle)


# -- constructor ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "exc", "builtin", "message"),
    [
        pytest.param(
            {"page_size": 0},
            InvalidInputError,
            ValueError,
            "page_size must be >= 1, got 0",
            id="page0",
        ),
        pytest.param(
            {"page_size": -4},
            InvalidInputError,
            ValueError,
            "page_size must be >= 1, got -4",
            id="page-4",
        ),
        pytest.param(
            {"page_size": 2.0},
            InputTypeError,
            TypeError,
            "page_size must be an integer, got float",
            id="page-float",
        ),
        pytest.param(
            {"page_size": True},
            InputTypeError,
            TypeError,
            "page_size must be an integer, got bool",
            id="page-bool",
        ),
        pytest.param(
            {"page_size": "4"},
            InputTypeError,
            TypeError,
            "page_size must be an integer, got str",
            id="page-str",
        ),
        pytest.param(
            {"eviction": "mru"},
            InvalidInputError,
            ValueError,
            "eviction must be one of 'lru', 'lfu', 'fifo', 'priority', got 'mru'",
            id="eviction-mru",
        ),
        pytest.param(
            {"eviction": "LRU"},
            InvalidInputError,
            ValueError,
            "eviction must be one of 'lru', 'lfu', 'fifo', 'priority', got 'LRU'",
            id="eviction-case",
        ),
        pytest.param(
            {"capacity": -1},
            InvalidInputError,
            ValueError,
            "capacity must be >= 0, got -1",
            id="capacity-1",
        ),
        pytest.param(
            {"capacity": 1.5},
            InputTypeError,
            TypeError,
            "capacity must be an integer, got float",
            id="capacity-float",
        ),
    ],
)
def test_bad_constructor_arguments(
    impl: type, kwargs: dict[str, Any], exc: type[RadixMetaError], builtin: type, message: str
) -> None:
    with raises(exc, builtin, message):
        impl(**kwargs)


def test_constructor_accepts_numpy_integers(impl: type) -> None:
    cache = impl(np.int64(2), capacity=np.uint16(8))
    assert (cache.page_size, cache.capacity) == (2, 8)
    assert type(cache.page_size) is int and type(cache.capacity) is int


# -- evict ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("num_tokens", "exc", "builtin", "message"),
    [
        pytest.param(
            -1, InvalidInputError, ValueError, "num_tokens must be >= 0, got -1", id="negative"
        ),
        pytest.param(
            np.int64(-5),
            InvalidInputError,
            ValueError,
            "num_tokens must be >= 0, got -5",
            id="np-negative",
        ),
        pytest.param(
            1.0, InputTypeError, TypeError, "num_tokens must be an integer, got float", id="float"
        ),
        pytest.param(
            None,
            InputTypeError,
            TypeError,
            "num_tokens must be an integer, got NoneType",
            id="none",
        ),
        pytest.param(
            False, InputTypeError, TypeError, "num_tokens must be an integer, got bool", id="bool"
        ),
    ],
)
def test_bad_evict_count(
    impl: type, num_tokens: Any, exc: type[RadixMetaError], builtin: type, message: str
) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    with raises(exc, builtin, message):
        cache.evict(num_tokens)
    check_unchanged(cache, handle, twin, twin_handle)


# -- node handles ---------------------------------------------------------------------------
HANDLE_METHODS = ["lock", "unlock", "lock_count"]


@pytest.mark.parametrize("method", HANDLE_METHODS)
@pytest.mark.parametrize("bad", [42, None, "node", object()], ids=["int", "none", "str", "object"])
def test_non_handle(impl: type, method: str, bad: Any) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    message = f"node must be a Node handle, got {type(bad).__name__}"
    with raises(InputTypeError, TypeError, message):
        getattr(cache, method)(bad)
    check_unchanged(cache, handle, twin, twin_handle)


@pytest.mark.parametrize("method", HANDLE_METHODS)
def test_stale_handle_after_evict(impl: type, method: str) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    for c in (cache, twin):
        c.insert([8, 8])
    stale = cache.match_prefix([8, 8]).node
    twin.match_prefix([8, 8])
    assert cache.lock_count(stale) == 0
    for c in (cache, twin):
        assert 8 in c.evict(10**6).values.tolist()  # every unlocked node goes
    with raises(StaleNodeError, ValueError, STALE):
        getattr(cache, method)(stale)
    with pytest.raises(NodeError):
        getattr(cache, method)(stale)
    check_unchanged(cache, handle, twin, twin_handle)


@pytest.mark.parametrize("method", HANDLE_METHODS)
def test_stale_handle_after_evict_and_reinsert(impl: type, method: str) -> None:
    """A node evicted and cached again is a new node: the old handle stays stale."""
    cache = impl()
    cache.insert([1, 2])
    old = cache.match_prefix([1, 2]).node
    cache.evict(2)
    cache.insert([1, 2])
    with raises(StaleNodeError, ValueError, STALE):
        getattr(cache, method)(old)
    fresh = cache.match_prefix([1, 2]).node
    assert cache.lock_count(fresh) == 0


@pytest.mark.parametrize("method", HANDLE_METHODS)
def test_stale_handle_after_reset(impl: type, method: str) -> None:
    cache = impl()
    cache.insert([1, 2, 3])
    handles = [cache.match_prefix([1, 2, 3]).node, cache.match_prefix([5]).node]  # node, root
    cache.lock(handles[0])
    cache.reset()
    cache.insert([1, 2, 3])
    before = state(cache)
    for stale in handles:
        with raises(StaleNodeError, ValueError, STALE):
            getattr(cache, method)(stale)
    assert state(cache) == before


@pytest.mark.parametrize("method", HANDLE_METHODS)
def test_foreign_handle(impl: type, method: str) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    other = impl()
    other.insert([1, 2, 3, 4, 5])
    for foreign in (other.match_prefix([1, 2, 3, 4, 5]).node, other.match_prefix([]).node):
        with raises(ForeignNodeError, ValueError, "node handle belongs to a different cache"):
            getattr(cache, method)(foreign)
    check_unchanged(cache, handle, twin, twin_handle)


def test_foreign_check_precedes_stale_check(impl: type) -> None:
    cache, other = impl(), impl()
    other.insert([1])
    foreign = other.match_prefix([1]).node
    other.reset()
    with raises(ForeignNodeError, ValueError, "node handle belongs to a different cache"):
        cache.lock(foreign)


def test_unlock_unlocked_node(impl: type) -> None:
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    for c in (cache, twin):
        c.insert([20, 21])
    node = cache.match_prefix([20, 21]).node
    twin.match_prefix([20, 21])
    with raises(LockError, RuntimeError, "node is not locked"):
        cache.unlock(node)
    cache.lock(node)
    cache.unlock(node)
    with raises(LockError, RuntimeError, "node is not locked"):
        cache.unlock(node)
    check_unchanged(cache, handle, twin, twin_handle)


def test_unlock_node_locked_only_through_a_descendant(impl: type) -> None:
    """A lock count that comes from a lock below cannot be released at the ancestor.

    Unlocking there would leave the parent less locked than its child, which
    ``check()`` rejects, and a later unlock of the child would drive it negative.
    """
    cache = impl()
    cache.insert([1, 2, 3, 4])
    upper = cache.match_prefix([1, 2]).node  # splits [1, 2, 3, 4]
    lower = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(lower)
    assert cache.lock_count(upper) == 1
    before = state(cache)
    with raises(LockError, RuntimeError, "node is not locked"):
        cache.unlock(upper)
    assert state(cache) == before
    cache.check()


# -- capacity -------------------------------------------------------------------------------
def test_cache_full_when_locked_nodes_prevent_fitting(impl: type) -> None:
    calls: list[Any] = []
    cache = impl(capacity=8, on_evict=calls.append)
    cache.insert([1, 2, 3, 4])
    cache.insert([5, 6, 7, 8])
    locked = cache.match_prefix([1, 2, 3, 4]).node
    cache.lock(locked)
    before = state(cache)
    message = "cannot fit 6 new tokens under capacity 8: 8 cached, 4 evictable"
    with raises(CacheFullError, RuntimeError, message):
        cache.insert([9, 9, 9, 9, 9, 9])
    with raises(CacheFullError, RuntimeError, message):
        cache.insert([9, 9, 9, 9, 9, 9], namespace="elsewhere")
    assert state(cache) == before  # nothing evicted, no namespace created
    assert calls == []
    # After the lock is released the same insert fits, evicting in LRU order.
    cache.unlock(locked)
    assert cache.insert([9, 9, 9, 9, 9, 9]) == 0
    assert [c.tolist() for c in calls] == [[5, 6, 7, 8, 1, 2, 3, 4]]
    assert cache.stats.evicted_tokens == 8


def test_cache_full_with_zero_capacity(impl: type) -> None:
    cache = impl(capacity=0)
    with raises(
        CacheFullError,
        RuntimeError,
        "cannot fit 1 new tokens under capacity 0: 0 cached, 0 evictable",
    ):
        cache.insert([3])
    assert cache.insert([]) == 0  # nothing to store: fits
    assert cache.total_size == 0


def test_cache_full_counts_the_new_part_only(impl: type) -> None:
    cache = impl(capacity=6)
    cache.insert([1, 2, 3, 4])
    cache.lock(cache.match_prefix([1, 2, 3, 4]).node)
    assert cache.insert([1, 2, 3, 4, 5, 6]) == 4  # 2 new tokens fit exactly
    # The [5, 6] leaf is unlocked, but the path this insert extends is guarded during
    # the eviction it causes, so it is not counted as evictable.
    message = "cannot fit 1 new tokens under capacity 6: 6 cached, 0 evictable"
    with raises(CacheFullError, RuntimeError, message):
        cache.insert([1, 2, 3, 4, 5, 6, 7])


# -- namespaces -----------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["match_prefix", "insert"])
def test_unhashable_namespace(impl: type, method: str) -> None:
    """An unhashable namespace is a TypeError and changes nothing (not even the stats)."""
    cache, (handle,) = populate(impl)
    twin, (twin_handle,) = populate(impl)
    with pytest.raises(TypeError):
        getattr(cache, method)([1, 2, 3], namespace=["unhashable"])
    check_unchanged(cache, handle, twin, twin_handle)
