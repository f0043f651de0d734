"""Property-testing kit for radix caches: hypothesis strategies and a brute-force model.

This module **requires hypothesis** (``pip install hypothesis``, or
``pip install radixmeta[test]``). Nothing else in radixmeta imports it, so the
library itself does not depend on hypothesis.

It offers three things to test a cache adapter, an eviction policy or a wrapper
around :class:`~radixmeta.RadixCache`:

* strategies that produce inputs where prefixes really overlap:
  :func:`token_sequences`, :func:`page_aligned_keys` and :func:`operations`;
* :class:`BruteForceCache`, a deliberately naive model of the cache semantics,
  with the same methods as :class:`~radixmeta.RadixCache`;
* :func:`run_operations` and :func:`snapshot`, which apply a list of operations
  to any object with the cache API and return plain, comparable results.

Examples
--------
>>> from hypothesis import given
>>> from radixmeta import RadixCache
>>> from radixmeta.testing import BruteForceCache, operations, run_operations
>>> @given(operations(page_size=2))
... def test_matches_model(ops):
...     ours = run_operations(RadixCache(2), ops)
...     model = run_operations(BruteForceCache(2), ops)
...     assert ours == model
>>> test_matches_model()
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

from radixmeta import _keys
from radixmeta._types import EVICTION_POLICIES, TAKE_EVICTED_DEPRECATION, CacheStats
from radixmeta.errors import (
    CacheFullError,
    ForeignNodeError,
    InputTypeError,
    InvalidInputError,
    LockError,
    RadixMetaError,
    StaleNodeError,
)

__all__ = [
    "BruteForceCache",
    "BruteForceEvictResult",
    "BruteForceMatchResult",
    "BruteForceNode",
    "Evict",
    "Insert",
    "Lock",
    "Match",
    "Operation",
    "Reset",
    "TakeEvicted",
    "EvictionLog",
    "Unlock",
    "operations",
    "page_aligned_keys",
    "run_operations",
    "snapshot",
    "token_sequences",
]

Tokens: TypeAlias = tuple[int, ...]

# ---------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------


def _check_positive(name: str, value: int, minimum: int = 1) -> None:
    if value < minimum:
        msg = f"{name} must be >= {minimum}, got {value}"
        raise ValueError(msg)


def _check_sizes(min_size: int, max_size: int) -> None:
    _check_positive("min_size", min_size, 0)
    if max_size < min_size:
        msg = f"max_size ({max_size}) must be >= min_size ({min_size})"
        raise ValueError(msg)


@st.composite
def _stem_and_tail(
    draw: st.DrawFn, stems: Sequence[list[int]], unit: int, tails: st.SearchStrategy[list[int]]
) -> list[int]:
    """Cut one stem at a multiple of ``unit`` and append a drawn tail.

    The number of units *dropped* is drawn (not the number kept), so the simplest
    draw, which hypothesis favours and shrinks towards, is the whole stem.
    """
    stem = draw(st.sampled_from(stems))
    drop = draw(st.integers(0, len(stem) // unit)) * unit
    return stem[: len(stem) - drop] + draw(tails)


def token_sequences(
    *,
    vocab_size: int = 4,
    min_size: int = 1,
    max_size: int = 8,
    max_stems: int = 3,
    max_stem_length: int = 12,
    max_tail_length: int = 6,
) -> st.SearchStrategy[list[list[int]]]:
    """Return a strategy for lists of token sequences that share prefixes.

    A few *stems* are drawn first; each sequence is then a stem cut at a random
    point followed by a random *tail*. Sequences therefore share prefixes of
    many lengths, diverge at arbitrary positions, and are sometimes prefixes of
    each other. The small default vocabulary makes tails collide as well.

    Parameters
    ----------
    vocab_size : int, default 4
        Tokens are drawn from ``range(vocab_size)``.
    min_size, max_size : int, default 1 and 8
        Bounds on the number of sequences in each drawn list.
    max_stems : int, default 3
        At most this many stems are drawn (at least one).
    max_stem_length, max_tail_length : int, default 12 and 6
        Bounds on the lengths of stems and tails. Sequences may be empty.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[list[list[int]]]

    Examples
    --------
    >>> from hypothesis import given
    >>> @given(token_sequences(vocab_size=2))
    ... def test_tokens_in_vocab(seqs):
    ...     assert all(0 <= t < 2 for seq in seqs for t in seq)
    >>> test_tokens_in_vocab()
    """
    _check_positive("vocab_size", vocab_size)
    _check_positive("max_stems", max_stems)
    _check_sizes(min_size, max_size)
    token = st.integers(0, vocab_size - 1)
    tails = st.lists(token, max_size=max_tail_length)

    def sequences(stems: list[list[int]]) -> st.SearchStrategy[list[list[int]]]:
        return st.lists(_stem_and_tail(stems, 1, tails), min_size=min_size, max_size=max_size)

    stem = st.lists(token, min_size=min(1, max_stem_length), max_size=max_stem_length)
    return st.lists(stem, min_size=1, max_size=max_stems).flatmap(sequences)


def page_aligned_keys(
    page_size: int,
    *,
    vocab_size: int = 2,
    distinct_pages: int = 4,
    min_size: int = 1,
    max_size: int = 8,
    max_stem_pages: int = 4,
    max_tail_pages: int = 2,
) -> st.SearchStrategy[list[list[int]]]:
    """Return a strategy for lists of keys whose lengths are multiples of ``page_size``.

    A small pool of distinct pages is drawn, then a few stems made of pages from
    the pool; each key is a stem cut at a page boundary followed by a few more
    pool pages. Keys thus share whole pages, and, because the pool's pages come
    from a tiny vocabulary, neighbouring pages often share their first tokens
    too (which exercises rounding a partial page match down).

    Parameters
    ----------
    page_size : int
        Tokens per page (``>= 1``).
    vocab_size : int, default 2
        Tokens are drawn from ``range(vocab_size)``.
    distinct_pages : int, default 4
        At most this many distinct pages are used in one drawn list.
    min_size, max_size : int, default 1 and 8
        Bounds on the number of keys in each drawn list.
    max_stem_pages, max_tail_pages : int, default 4 and 2
        Bounds, in pages, on the lengths of stems and tails. Keys may be empty.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[list[list[int]]]

    Examples
    --------
    >>> from hypothesis import given
    >>> @given(page_aligned_keys(4))
    ... def test_aligned(keys):
    ...     assert all(len(key) % 4 == 0 for key in keys)
    >>> test_aligned()
    """
    _check_positive("page_size", page_size)
    _check_positive("vocab_size", vocab_size)
    _check_positive("distinct_pages", distinct_pages)
    _check_sizes(min_size, max_size)
    token = st.integers(0, vocab_size - 1)
    pages = st.lists(
        st.lists(token, min_size=page_size, max_size=page_size),
        min_size=1,
        max_size=distinct_pages,
        unique_by=tuple,
    )

    def keys(pool: list[list[int]]) -> st.SearchStrategy[list[list[int]]]:
        def join(chosen: list[list[int]]) -> list[int]:
            return [t for page in chosen for t in page]

        page = st.sampled_from(pool)
        stem = st.lists(page, min_size=min(1, max_stem_pages), max_size=max_stem_pages)
        stems = st.lists(stem.map(join), min_size=1, max_size=3)
        tails = st.lists(page, max_size=max_tail_pages).map(join)
        return stems.flatmap(
            lambda s: st.lists(
                _stem_and_tail(s, page_size, tails), min_size=min_size, max_size=max_size
            )
        )

    return pages.flatmap(keys)


# ---------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Insert:
    """``cache.insert(key, values, namespace=namespace, priority=priority)``."""

    key: list[int]
    values: list[int] | None = None
    namespace: Hashable = None
    priority: int = 0


@dataclass(frozen=True)
class Match:
    """``cache.match_prefix(key, namespace=namespace)``; the handle is kept for later ops."""

    key: list[int]
    namespace: Hashable = None


@dataclass(frozen=True)
class Lock:
    """``cache.lock(h)`` where ``h`` is the ``handle``-th kept match handle (modulo count)."""

    handle: int


@dataclass(frozen=True)
class Unlock:
    """``cache.unlock(h)`` where ``h`` is the ``handle``-th kept match handle (modulo count)."""

    handle: int


@dataclass(frozen=True)
class Evict:
    """``cache.evict(num_tokens)``."""

    num_tokens: int


@dataclass(frozen=True)
class TakeEvicted:
    """The slots the cache handed to ``on_evict`` since the previous ``TakeEvicted``.

    They are read from the cache's :class:`EvictionLog`; a cache built without
    one gives ``()``.
    """


class EvictionLog:
    """An ``on_evict`` callback that keeps what it receives, for tests to compare.

    Examples
    --------
    >>> log = EvictionLog()
    >>> model = BruteForceCache(capacity=2, on_evict=log)
    >>> model.insert([1, 2]), model.insert([3, 4])
    (0, 0)
    >>> log.take()
    (1, 2)
    """

    def __init__(self) -> None:
        self.calls: list[npt.NDArray[np.int64]] = []

    def __call__(self, slots: npt.NDArray[np.int64]) -> None:
        self.calls.append(slots)

    def take(self) -> tuple[int, ...]:
        """Every slot received since the last ``take``, in order; forgets them."""
        out = tuple(int(v) for call in self.calls for v in call)
        self.calls = []
        return out


@dataclass(frozen=True)
class Reset:
    """``cache.reset()``; kept handles become stale."""


Operation: TypeAlias = Insert | Match | Lock | Unlock | Evict | TakeEvicted | Reset


def _with_slots(ops: list[Operation]) -> list[Operation]:
    """Give each insert that asked for values fresh slot ids, unique across the list."""
    next_slot = 1000  # distinct from the small token ids
    out: list[Operation] = []
    for op in ops:
        if isinstance(op, Insert) and op.values is not None:
            values = list(range(next_slot, next_slot + len(op.key)))
            next_slot += len(op.key)
            op = Insert(op.key, values, op.namespace, op.priority)
        out.append(op)
    return out


def _operation_lists(
    page_size: int,
    namespaces: Sequence[Hashable],
    pool: list[list[int]],
    max_priority: int,
    min_size: int,
    max_size: int,
    max_evict: int,
    reset: bool,
) -> st.SearchStrategy[list[Operation]]:
    # Mostly whole pages; sometimes a ragged tail that the cache must ignore.
    ragged: st.SearchStrategy[list[int]] = st.just([]) | st.lists(
        st.integers(0, 1), min_size=1, max_size=page_size - 1
    )
    key = _stem_and_tail(pool, page_size, ragged if page_size > 1 else st.just([]))
    namespace = st.sampled_from(list(namespaces))
    handle = st.integers(0, 7)
    insert: st.SearchStrategy[Operation] = st.builds(
        Insert,
        key,
        st.booleans().map(lambda slots: [] if slots else None),  # slots filled in later
        namespace,
        st.integers(-max_priority, max_priority),
    )
    match: st.SearchStrategy[Operation] = st.builds(Match, key, namespace)
    lock: st.SearchStrategy[Operation] = st.builds(Lock, handle)
    unlock: st.SearchStrategy[Operation] = st.builds(Unlock, handle)
    evict: st.SearchStrategy[Operation] = st.builds(Evict, st.integers(0, max_evict))
    take: st.SearchStrategy[Operation] = st.builds(TakeEvicted)
    # Weighted by repetition (sampled_from keeps duplicates, one_of would not).
    weighted = [insert, match] * 4 + [lock, unlock] * 2 + [evict, take]
    if reset:
        weighted.append(st.builds(Reset))
    one = st.sampled_from(weighted).flatmap(lambda strategy: strategy)
    ops = st.lists(one, min_size=min_size, max_size=max_size)
    return ops.map(_with_slots)


def operations(
    *,
    page_size: int = 1,
    namespaces: Sequence[Hashable] = (None, "a"),
    vocab_size: int = 3,
    max_priority: int = 2,
    min_size: int = 10,
    max_size: int = 40,
    max_evict: int = 8,
    reset: bool = True,
) -> st.SearchStrategy[list[Operation]]:
    """Return a strategy for lists of cache operations over overlapping keys.

    Keys come from one pool drawn per example (:func:`token_sequences` for
    ``page_size == 1``, :func:`page_aligned_keys` otherwise), cut at arbitrary
    token positions, so keys overlap and often end inside a page. Inserts carry
    either no values (the token ids are stored) or fresh slot ids starting at
    1000, unique across the whole list. :class:`Lock` and :class:`Unlock` name
    the handles of earlier :class:`Match` operations by index.

    Parameters
    ----------
    page_size : int, default 1
        Page size the keys are shaped for (use the cache's).
    namespaces : sequence of hashable, default ``(None, "a")``
        Namespaces to draw from.
    vocab_size : int, default 3
        Tokens are drawn from ``range(vocab_size)``.
    max_priority : int, default 2
        Insert priorities are drawn from ``[-max_priority, max_priority]``.
    min_size, max_size : int, default 10 and 40
        Bounds on the number of operations. Hypothesis keeps lists short unless
        told otherwise, and short lists rarely build a tree worth testing.
    max_evict : int, default 8
        Largest ``num_tokens`` of an :class:`Evict`.
    reset : bool, default True
        Whether :class:`Reset` operations may appear.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[list[Operation]]
        Lists of :class:`Insert`, :class:`Match`, :class:`Lock`,
        :class:`Unlock`, :class:`Evict`, :class:`TakeEvicted` and :class:`Reset`.

    Examples
    --------
    >>> from hypothesis import given
    >>> @given(operations(reset=False))
    ... def test_no_reset(ops):
    ...     assert not any(isinstance(op, Reset) for op in ops)
    >>> test_no_reset()
    """
    _check_positive("page_size", page_size)
    _check_positive("vocab_size", vocab_size)
    _check_positive("max_priority", max_priority, 0)
    _check_positive("max_evict", max_evict, 0)
    _check_sizes(min_size, max_size)
    if not namespaces:
        msg = "namespaces must not be empty"
        raise ValueError(msg)
    if page_size == 1:
        keys = token_sequences(vocab_size=vocab_size, max_size=6)
    else:
        keys = page_aligned_keys(page_size, vocab_size=min(vocab_size, 2), max_size=6)
    return keys.flatmap(
        lambda pool: _operation_lists(
            page_size, namespaces, pool, max_priority, min_size, max_size, max_evict, reset
        )
    )


def run_operations(cache: Any, ops: Iterable[Operation]) -> list[object]:
    """Apply ``ops`` to ``cache`` and return one plain, comparable outcome per operation.

    ``cache`` is anything with the :class:`~radixmeta.RadixCache` methods
    (a ``RadixCache``, a backend ``CacheCore``, a :class:`BruteForceCache`, or
    your adapter). Outcomes are: the returned int for :class:`Insert`;
    ``(length, values)`` for :class:`Match`; the tuple of freed values for
    :class:`Evict` and :class:`TakeEvicted`; ``None`` for :class:`Lock`,
    :class:`Unlock` and :class:`Reset` (and for a lock or unlock before any
    match); and ``(exception class name, message)`` when the call raises a
    :class:`~radixmeta.errors.RadixMetaError`. Other exceptions propagate.

    Parameters
    ----------
    cache : object
        The cache to drive.
    ops : iterable of Operation
        For example a list drawn from :func:`operations`.

    Returns
    -------
    list of object
        One outcome per operation, equal between two caches that agree.

    Examples
    --------
    >>> run_operations(BruteForceCache(), [Insert([1, 2]), Match([1, 2, 3]), Evict(1)])
    [0, (2, (1, 2)), (1, 2)]
    """
    handles: list[Any] = []
    out: list[object] = []
    for op in ops:
        try:
            out.append(_apply(cache, op, handles))
        except RadixMetaError as exc:
            out.append((type(exc).__name__, str(exc)))
    return out


def _apply(cache: Any, op: Operation, handles: list[Any]) -> object:
    if isinstance(op, Insert):
        return int(cache.insert(op.key, op.values, namespace=op.namespace, priority=op.priority))
    if isinstance(op, Match):
        result = cache.match_prefix(op.key, namespace=op.namespace)
        handles.append(result.node)
        return (int(result.length), tuple(int(v) for v in result.values))
    if isinstance(op, (Lock, Unlock)):
        if not handles:
            return None
        node = handles[op.handle % len(handles)]
        (cache.lock if isinstance(op, Lock) else cache.unlock)(node)
        return None
    if isinstance(op, Evict):
        return tuple(int(v) for v in cache.evict(op.num_tokens).values)
    if isinstance(op, TakeEvicted):
        log = getattr(cache, "on_evict", None)
        return log.take() if isinstance(log, EvictionLog) else ()
    cache.reset()
    return None


def snapshot(cache: Any, namespaces: Iterable[Hashable] | None = None) -> dict[str, object]:
    """Return the observable state of ``cache`` as plain Python values.

    Parameters
    ----------
    cache : object
        Anything with the :class:`~radixmeta.RadixCache` properties and ``items``.
    namespaces : iterable of hashable, optional
        Namespaces whose ``items()`` to include; by default ``cache.namespaces()``.

    Returns
    -------
    dict
        ``sizes`` (evictable, protected, total), ``node_count``, ``stats``,
        ``namespaces`` (only when not given) and ``items`` (per namespace, a list of
        ``(tokens, values)`` tuples).

    Examples
    --------
    >>> cache = BruteForceCache()
    >>> _ = cache.insert([5, 6])
    >>> snapshot(cache)["items"]
    {None: [((5, 6), (5, 6))]}
    """
    state: dict[str, object] = {
        "sizes": (cache.evictable_size, cache.protected_size, cache.total_size),
        "node_count": cache.node_count,
        "stats": cache.stats,
    }
    if namespaces is None:
        namespaces = list(cache.namespaces())
        state["namespaces"] = namespaces
    state["items"] = {
        ns: [
            (tuple(int(t) for t in toks), tuple(int(v) for v in vals))
            for toks, vals in cache.items(namespace=ns)
        ]
        for ns in namespaces
    }
    return state


# ---------------------------------------------------------------------------------------
# Brute-force model
# ---------------------------------------------------------------------------------------


@dataclass
class _Meta:
    """Metadata of one node, stored under the prefix at which the node ends."""

    serial: int
    created: int
    last_access: int
    priority: int
    hit_count: int = 0
    lock_count: int = 0


class BruteForceNode:
    """Handle returned by :meth:`BruteForceCache.match_prefix`.

    It names a node by the prefix it ends at plus that node's serial number, so
    it survives splits above it and goes stale when the node is evicted or the
    cache is reset, exactly like :class:`radixmeta.Node`.
    """

    __slots__ = ("_owner", "_epoch", "_namespace", "_end", "_serial")

    def __init__(
        self, owner: object, epoch: int, namespace: Hashable, end: Tokens, serial: int
    ) -> None:
        self._owner = owner
        self._epoch = epoch
        self._namespace = namespace
        self._end = end
        self._serial = serial

    @property
    def length(self) -> int:
        """Tokens from the root to the end of this node: the prefix length it names."""
        return len(self._end)

    def __repr__(self) -> str:
        return f"<BruteForceNode length={len(self._end)}>"


@dataclass(frozen=True)
class BruteForceMatchResult:
    """Result of :meth:`BruteForceCache.match_prefix`: ``length``, ``values``, ``node``."""

    length: int
    values: npt.NDArray[np.int64] | None
    node: BruteForceNode


@dataclass(frozen=True)
class BruteForceEvictResult:
    """Result of :meth:`BruteForceCache.evict`: the freed ``values`` and their ``count``."""

    values: npt.NDArray[np.int64]
    count: int = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", len(self.values))


class BruteForceCache:
    """A flat, brute-force model of the :class:`~radixmeta.RadixCache` semantics.

    Where the real caches keep a tree, this keeps, per namespace, two dicts:

    * ``cached``: every cached page-aligned prefix (a tuple of tokens) mapped to
      the values of the whole prefix;
    * ``ends``: the prefixes at which a node of the equivalent radix tree ends,
      mapped to that node's metadata (lock count, hit count, last access,
      creation stamp, priority, serial number).

    The node containing a prefix is the shortest end that extends it; a node's
    parent is its longest proper-prefix end (the root if none). Every answer is
    recomputed by scanning these dicts: longest-prefix match is the longest cached
    prefix of the key, the sizes are sums over ends of the tokens since the
    parent end, the eviction victim is the smallest unlocked end with no longer
    cached prefix, over all namespaces. Operations cost O(n²) or worse in the
    number of cached prefixes, so use small inputs.

    Node identity is modelled only where it is observable:

    * a match or insert that ends strictly inside a node adds an end there (the
      *split*); the new end copies the metadata of the node it was cut from and
      takes the next serial number, as in the real cache;
    * ends are never merged, so the node structure (``node_count``) is the real
      cache's;
    * a handle is (namespace, end, serial): it stays valid across splits and
      goes stale when its end is evicted (a later end at the same prefix has
      another serial) or the cache is reset;
    * a lock on a node counts on every end of its path; the locks taken on a
      node itself are its count minus its child ends' counts, and only those
      can be released through it;
    * the shared rules of ``radixmeta._reference`` (logical clock, hit counts,
      serials, creation stamps, priorities, eviction orders) are applied to the
      ends on the walked path; with a capacity, insert first evicts while the
      whole node containing the end of the already-cached part is protected.

    Parameters
    ----------
    page_size : int, default 1
        Tokens per page.
    eviction : {"lru", "lfu", "fifo", "priority"}, default "lru"
        Eviction order.
    capacity : int, optional
        Maximum number of cached tokens, enforced by insert.
    on_evict : callable, optional
        Receives the slots the model frees on its own, as the real cache's.
    refresh_split_tail : bool, default False
        A split by a match or an insert also stamps the cut node's lower half.

    Examples
    --------
    >>> model = BruteForceCache(eviction="fifo")
    >>> model.insert([1, 2, 3], [7, 8, 9])
    0
    >>> m = model.match_prefix([1, 2, 5])
    >>> m.length, m.values.tolist(), model.node_count
    (2, [7, 8], 2)
    >>> model.evict(1).values.tolist()
    [9]
    """

    def __init__(
        self,
        page_size: int = 1,
        *,
        eviction: str = "lru",
        capacity: int | None = None,
        on_evict: Callable[[npt.NDArray[np.int64]], object] | None = None,
        refresh_split_tail: bool = False,
    ) -> None:
        self._page_size = _keys.check_page_size(page_size)
        self._refresh_split_tail = _keys.check_flag("refresh_split_tail", refresh_split_tail)
        if eviction not in EVICTION_POLICIES:
            allowed = ", ".join(repr(p) for p in EVICTION_POLICIES)
            msg = f"eviction must be one of {allowed}, got {eviction!r}"
            raise InvalidInputError(msg)
        self._eviction = eviction
        self._capacity = None if capacity is None else _keys.check_int("capacity", capacity, 0)
        if on_evict is not None and not callable(on_evict):
            msg = f"on_evict must be callable or None, got {type(on_evict).__name__}"
            raise InputTypeError(msg)
        self._on_evict = on_evict
        self._identity = object()
        self._epoch = 0
        self._clear()

    def _clear(self) -> None:
        self._epoch += 1
        self._cached: dict[Hashable, dict[Tokens, Tokens]] = {None: {}}
        self._ends: dict[Hashable, dict[Tokens, _Meta]] = {None: {}}
        self._clock = 0
        self._serials = itertools.count(1)
        self._counters = [0, 0, 0, 0]  # lookups, hit tokens, inserted, evicted
        self._last_evicted: list[int] = []  # for the deprecated take_evicted()

    # -- properties -------------------------------------------------------------------
    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return self._page_size

    @property
    def refresh_split_tail(self) -> bool:
        """Whether a split also stamps the lower half of the cut node as just used."""
        return self._refresh_split_tail

    @property
    def on_evict(self) -> Callable[[npt.NDArray[np.int64]], object] | None:
        """The callback that receives slots the model frees on its own, or None."""
        return self._on_evict

    @property
    def eviction(self) -> str:
        """The eviction policy name."""
        return self._eviction

    @property
    def capacity(self) -> int | None:
        """Maximum number of cached tokens, or None."""
        return self._capacity

    @property
    def evictable_size(self) -> int:
        """Tokens in nodes with no lock."""
        return self._sizes()[0]

    @property
    def protected_size(self) -> int:
        """Tokens in locked nodes."""
        return self._sizes()[1]

    @property
    def total_size(self) -> int:
        """All cached tokens."""
        return sum(self._sizes())

    @property
    def node_count(self) -> int:
        """Number of nodes (ends), the roots not counted."""
        return sum(len(ends) for ends in self._ends.values())

    @property
    def stats(self) -> CacheStats:
        """Cumulative counters since creation or :meth:`reset`."""
        return CacheStats(*self._counters)

    # -- brute-force helpers ----------------------------------------------------------
    def _matched(self, namespace: Hashable, toks: Tokens) -> int:
        """Length of the longest cached page-aligned prefix of ``toks``."""
        cached = self._cached.get(namespace, {})
        lengths = range(0, len(toks) + 1, self._page_size)
        return max(k for k in lengths if k == 0 or toks[:k] in cached)

    def _owner_end(self, namespace: Hashable, prefix: Tokens) -> Tokens:
        """The end of the node containing the last token of ``prefix``."""
        ends = self._ends[namespace]
        return min((e for e in ends if e[: len(prefix)] == prefix), key=len)

    def _parent_end(self, namespace: Hashable, end: Tokens) -> Tokens:
        ends = self._ends[namespace]
        above = [e for e in ends if len(e) < len(end) and end[: len(e)] == e]
        return max(above, key=len, default=())

    def _path(self, namespace: Hashable, prefix: Tokens) -> list[_Meta]:
        """Metadata of the nodes from the root down to the one ending at ``prefix``."""
        return [meta for _, meta in self._path_ends(namespace, prefix)]

    def _path_ends(self, namespace: Hashable, prefix: Tokens) -> list[tuple[Tokens, _Meta]]:
        """(end, metadata) of the nodes from the root down to the one ending at ``prefix``."""
        ends = self._ends[namespace]
        return [(e, meta) for e, meta in ends.items() if prefix[: len(e)] == e]

    def _has_children(self, namespace: Hashable, end: Tokens) -> bool:
        return any(len(q) > len(end) and q[: len(end)] == end for q in self._cached[namespace])

    def _cut(self, namespace: Hashable, prefix: Tokens, *, walked: bool = False) -> None:
        """Make ``prefix`` a node end, copying the metadata of the node it splits.

        ``walked``: the cut is a match's or an insert's, whose walk stamps the
        lower half too under ``refresh_split_tail``.
        """
        ends = self._ends[namespace]
        if prefix and prefix not in ends:
            old = ends[self._owner_end(namespace, prefix)]
            new = _Meta(**vars(old))
            new.serial = next(self._serials)
            ends[prefix] = new
            if walked and self._refresh_split_tail:
                old.last_access = self._clock

    def _sizes(self) -> tuple[int, int]:
        evictable = protected = 0
        for namespace, ends in self._ends.items():
            for end, meta in ends.items():
                tokens = len(end) - len(self._parent_end(namespace, end))
                if meta.lock_count:
                    protected += tokens
                else:
                    evictable += tokens
        return evictable, protected

    def _order(self, meta: _Meta) -> tuple[int, ...]:
        if self._eviction == "lru":
            return (meta.last_access, meta.serial)
        if self._eviction == "lfu":
            return (meta.hit_count, meta.last_access, meta.serial)
        if self._eviction == "fifo":
            return (meta.created, meta.serial)
        return (meta.priority, meta.last_access, meta.serial)

    def _evict_tokens(self, num_tokens: int) -> list[int]:
        freed: list[int] = []
        while len(freed) < num_tokens:
            leaves = [
                (self._order(meta), namespace, end)
                for namespace, ends in self._ends.items()
                for end, meta in ends.items()
                if meta.lock_count == 0 and not self._has_children(namespace, end)
            ]
            if not leaves:
                break
            _, namespace, end = min(leaves, key=lambda leaf: leaf[0])
            start = len(self._parent_end(namespace, end))
            cached = self._cached[namespace]
            freed.extend(cached[end][start:])
            for k in range(start + self._page_size, len(end) + 1, self._page_size):
                del cached[end[:k]]
            del self._ends[namespace][end]
            if namespace is not None and not cached:  # an emptied namespace is forgotten
                del self._cached[namespace], self._ends[namespace]
        self._counters[3] += len(freed)
        return freed

    def _resolve(self, handle: object) -> tuple[Hashable, Tokens]:
        """Check a handle like the real cache does; return (namespace, end)."""
        if not isinstance(handle, BruteForceNode):
            msg = f"node must be a Node handle, got {type(handle).__name__}"
            raise InputTypeError(msg)
        if handle._owner is not self._identity:
            msg = "node handle belongs to a different cache"
            raise ForeignNodeError(msg)
        stale = handle._epoch != self._epoch
        if handle._end and not stale:
            meta = self._ends.get(handle._namespace, {}).get(handle._end)
            stale = meta is None or meta.serial != handle._serial
        if stale:
            msg = "node handle is stale: its node was evicted or the cache was reset"
            raise StaleNodeError(msg)
        return handle._namespace, handle._end

    def _handle(self, namespace: Hashable, end: Tokens) -> BruteForceNode:
        serial = self._ends[namespace][end].serial if end else 0
        return BruteForceNode(self._identity, self._epoch, namespace, end, serial)

    def _add_locks(self, namespace: Hashable, end: Tokens, delta: int) -> None:
        if end:
            for meta in self._path(namespace, end):
                meta.lock_count += delta

    # -- API ------------------------------------------------------------------------
    def match_prefix(
        self, key: Any, *, namespace: Hashable = None, values: bool = True
    ) -> BruteForceMatchResult:
        """Return the longest cached prefix of ``key`` (see ``RadixCache.match_prefix``)."""
        toks = _keys.tokens(key)
        toks = toks[: len(toks) - len(toks) % self._page_size]
        _keys.check_flag("values", values)
        known = namespace in self._cached  # an unhashable namespace raises before any change
        self._clock += 1
        self._counters[0] += 1
        if not known:
            empty = np.empty(0, np.int64) if values else None
            return BruteForceMatchResult(0, empty, self._handle(None, ()))
        pos = self._matched(namespace, toks)
        self._cut(namespace, toks[:pos], walked=True)
        for meta in self._path(namespace, toks[:pos]):
            meta.last_access = self._clock  # a match counts no hit (inserts do)
        self._counters[1] += pos
        slots = self._cached[namespace][toks[:pos]] if pos else ()
        node = self._handle(namespace if pos else None, toks[:pos])  # length 0: the default root
        gathered = np.array(slots, dtype=np.int64) if values else None
        return BruteForceMatchResult(pos, gathered, node)

    def insert(
        self,
        key: Any,
        values: Any = None,
        *,
        namespace: Hashable = None,
        priority: int = 0,
        counted: int = 0,
    ) -> int:
        """Cache ``key``; return how many of its tokens were already cached.

        Under LFU every node end on the path past ``counted`` tokens gains a
        hit, and a new leaf starts at one (zero if it ends within ``counted``).
        """
        raw = _keys.tokens(key)
        vals = raw if values is None else _keys.values(values, len(raw))
        priority = _keys.check_priority(priority)
        counted = _keys.check_int("counted", counted, 0)
        hash(namespace)  # an unhashable namespace raises before any change
        n = len(raw) - len(raw) % self._page_size
        toks, vals = raw[:n], vals[:n]
        freed = self._make_room(toks, namespace) if self._capacity is not None else []
        self._clock += 1
        if n == 0:  # an empty namespace is never created
            self._hand_over(freed)
            return 0
        cached = self._cached.setdefault(namespace, {})
        ends = self._ends.setdefault(namespace, {})
        pos = self._matched(namespace, toks)
        self._cut(namespace, toks[:pos], walked=True)
        for end, meta in self._path_ends(namespace, toks[:pos]):
            meta.last_access = self._clock
            meta.priority = max(meta.priority, priority)
            if len(end) > counted:
                meta.hit_count = min(meta.hit_count + 1, 2**32 - 1)  # native saturates
        if pos < n:
            kept = cached[toks[:pos]] if pos else ()  # cached values are never replaced
            for k in range(pos + self._page_size, n + 1, self._page_size):
                cached[toks[:k]] = kept + vals[pos:k]
            ends[toks] = _Meta(
                next(self._serials), self._clock, self._clock, priority, int(n > counted)
            )
            self._counters[2] += n - pos
        self._hand_over(freed)
        return pos

    def _hand_over(self, freed: list[int]) -> None:
        if self._on_evict is None:
            self._last_evicted = freed
        elif freed:
            self._on_evict(np.array(freed, dtype=np.int64))

    def _make_room(self, toks: Tokens, namespace: Hashable) -> list[int]:
        assert self._capacity is not None
        matched = self._matched(namespace, toks)
        need = self.total_size + len(toks) - matched - self._capacity
        if need <= 0:
            return []
        # Room may come from anything but the matched prefix itself, which the
        # insert extends: count the unlocked tokens of that prefix out.
        prefix = toks[:matched]
        on_path = 0
        for end, meta in self._ends.get(namespace, {}).items():
            start = len(self._parent_end(namespace, end))
            inside = min(len(end), matched)
            if start < inside and end[:inside] == prefix[:inside] and not meta.lock_count:
                on_path += inside - start
        available = self.evictable_size - on_path
        if available < need:
            msg = (
                f"cannot fit {len(toks) - matched} new tokens under capacity "
                f"{self._capacity}: {self.total_size} cached, {available} evictable"
            )
            raise CacheFullError(msg)
        # The node holding the end of the match is cut there, so the guard lock
        # covers exactly the matched prefix and the rest of that node can go.
        if matched:
            self._cut(namespace, prefix)
        self._add_locks(namespace, prefix, +1)
        try:
            return self._evict_tokens(need)
        finally:
            self._add_locks(namespace, prefix, -1)

    def lock(self, node: Any) -> None:
        """Add one lock to the node and every node above it."""
        namespace, end = self._resolve(node)
        self._add_locks(namespace, end, +1)

    def unlock(self, node: Any) -> None:
        """Remove one lock from the node and every node above it.

        Raises LockError unless the node holds a lock of its own: a lock count
        that comes only from locks on nodes below it cannot be released here.
        """
        namespace, end = self._resolve(node)
        if end and self._own_locks(namespace, end) == 0:
            msg = "node is not locked"
            raise LockError(msg)
        self._add_locks(namespace, end, -1)

    def _own_locks(self, namespace: Hashable, end: Tokens) -> int:
        """Locks taken on this very node: its count minus its children's counts."""
        ends = self._ends[namespace]
        below = sum(
            meta.lock_count
            for e, meta in ends.items()
            if len(e) > len(end) and e[: len(end)] == end and self._parent_end(namespace, e) == end
        )
        return ends[end].lock_count - below

    def path_values(self, node: Any) -> npt.NDArray[np.int64]:
        """The slots of the path from the root to the node (see ``RadixCache.path_values``)."""
        namespace, end = self._resolve(node)
        return np.array(self._cached[namespace][end] if end else (), dtype=np.int64)

    def lock_count(self, node: Any) -> int:
        """Return the node's lock count (0 for a root)."""
        namespace, end = self._resolve(node)
        return self._ends[namespace][end].lock_count if end else 0

    def evict(self, num_tokens: int) -> BruteForceEvictResult:
        """Free unlocked leaves in eviction order until ``num_tokens`` are freed."""
        num_tokens = _keys.check_int("num_tokens", num_tokens, 0)
        return BruteForceEvictResult(np.array(self._evict_tokens(num_tokens), dtype=np.int64))

    def take_evicted(self) -> npt.NDArray[np.int64]:
        """Deprecated, as ``RadixCache.take_evicted``: what the most recent insert freed."""
        warnings.warn(TAKE_EVICTED_DEPRECATION, DeprecationWarning, stacklevel=2)
        out = np.array(self._last_evicted, dtype=np.int64)
        self._last_evicted = []
        return out

    def reset(self) -> None:
        """Empty the cache; every handle becomes stale. ``on_evict`` gets every slot held."""
        held = [  # namespace by namespace, each in key order (a node before its children)
            v
            for namespace, ends in self._ends.items()
            for end in sorted(ends)
            for v in self._cached[namespace][end][len(self._parent_end(namespace, end)) :]
        ]
        self._clear()
        if self._on_evict is not None and held:
            self._on_evict(np.array(held, dtype=np.int64))

    def namespaces(self) -> list[Hashable]:
        """Namespaces that hold a page, in creation order (``None`` always first)."""
        return list(self._cached)

    def items(
        self, *, namespace: Hashable = None
    ) -> list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]]:
        """Return ``(tokens, values)`` for every leaf, in lexicographic token order."""
        cached = self._cached.get(namespace, {})
        inner = {q[: -self._page_size] for q in cached}
        leaves = sorted(q for q in cached if q not in inner)
        return [(np.array(q, dtype=np.uint32), np.array(cached[q], dtype=np.int64)) for q in leaves]

    def nodes(self, *, namespace: Hashable = None) -> list[tuple[Tokens, int]]:
        """Return ``(prefix at which the node ends, lock count)`` for every node, sorted."""
        return sorted((end, meta.lock_count) for end, meta in self._ends.get(namespace, {}).items())

    def check(self) -> None:
        """Assert the model's own invariants (raises AssertionError)."""
        p = self._page_size
        assert list(self._cached) == list(self._ends)
        serials = [m.serial for ends in self._ends.values() for m in ends.values()]
        assert len(serials) == len(set(serials))
        for namespace, cached in self._cached.items():
            ends = self._ends[namespace]
            for q, vals in cached.items():
                assert q and len(q) % p == 0 and len(vals) == len(q)
                if len(q) > p:
                    assert cached[q[:-p]] == vals[:-p]
            assert set(ends) <= set(cached)
            children: dict[Tokens, int] = {}
            for q in cached:
                children[q[:-p]] = children.get(q[:-p], 0) + 1
            for q in cached:
                if children.get(q, 0) != 1:  # leaves and branch points end a node
                    assert q in ends
            for end, meta in ends.items():
                parent = self._parent_end(namespace, end)
                assert meta.lock_count >= 0
                if parent:
                    assert ends[parent].lock_count >= meta.lock_count
