"""Property-testing kit for meta-trees: a tree-less brute-force model and hypothesis strategies.

This module **requires hypothesis** (``pip install 'radixmeta[test]'``); nothing
else in radixmeta imports it.

It offers, for testing :class:`~radixmeta.MetaTree`, a router built on it, or
another implementation of the same API:

* :class:`BruteForceMetaTree`, the meta-tree semantics with no tree at all:
  per worker, a dict from page (its full token path) to last-access stamp, and a
  dict from block hash to page. Every answer is recomputed by scanning them;
* :func:`meta_operations`, a strategy for lists of calls (:class:`AddWorker`,
  :class:`Insert`, :class:`ApplyStored`, ...) over keys drawn from a small pool
  of page-aligned prefixes, so that paths overlap a lot, with deliberately bad
  inputs mixed in (unknown parents, conflicting hashes, stale workers, bad
  tiers and token counts);
* :func:`run_meta_operations`, which applies such a list to any object with the
  meta-tree API and returns one plain, comparable outcome per call (errors
  included, as class name and message), and :func:`block_hash_of`, the
  deterministic block hash the operations use.

Examples
--------
>>> from hypothesis import given, settings
>>> from radixmeta.testing_meta import BruteForceMetaTree, meta_operations, run_meta_operations
>>> from radixmeta import MetaTree
>>> @settings(max_examples=25)
... @given(meta_operations(page_size=2))
... def test_tree_matches_model(ops):
...     assert run_meta_operations(MetaTree(2), ops) == run_meta_operations(
...         BruteForceMetaTree(2), ops
...     )
>>> test_tree_matches_model()
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
from hypothesis import strategies as st

from radixmeta import _blocks, _holds, _keys
from radixmeta._types import DumpRecord
from radixmeta._workers import WorkerId, WorkerTable, best_of, resolve_in
from radixmeta.errors import InputTypeError, InvalidInputError, RadixMetaError

__all__ = [
    "AddWorker",
    "ApplyCleared",
    "ApplyEvents",
    "ApplyRemoved",
    "ApplyStored",
    "BruteForceMetaMatch",
    "BruteForceMetaTree",
    "Insert",
    "Match",
    "MatchMany",
    "MetaOperation",
    "Remove",
    "RemoveWorker",
    "STORED_VARIANTS",
    "block_hash_of",
    "meta_key_pools",
    "meta_operations",
    "run_meta_operations",
    "apply_meta_operation",
]

Tokens: TypeAlias = tuple[int, ...]
#: A page of the model: its namespace, its full token path from the root, and the extra
#: tags of the path's pages (one per page).
Page: TypeAlias = tuple[Hashable, Tokens, tuple[int, ...]]

# ---------------------------------------------------------------------------------------
# Brute-force model
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BruteForceMetaMatch:
    """Result of :meth:`BruteForceMetaTree.match`, with the API of ``radixmeta.MetaMatch``."""

    lengths: npt.NDArray[np.int64]
    host_lengths: npt.NDArray[np.int64]
    tree_length: int
    slots: tuple[WorkerId | None, ...]
    #: (model, key, tags, namespace) of a cursor match, else None.
    cursor: tuple[BruteForceMetaTree, Tokens, tuple[int, ...], Hashable] | None = None
    #: A key of the longest prefix some live worker matched (see ``MetaMatch.prefix_key``).
    prefix_key: int | None = None

    @property
    def length_list(self) -> list[int]:
        """``lengths`` as a list of ints."""
        return [int(v) for v in self.lengths]

    def length_of(self, worker: WorkerId, *, tier: int = 0) -> int:
        """Matched tokens of ``worker`` (which must have been live at the match) on ``tier``."""
        index = resolve_in(self.slots, worker)
        return int((self.lengths if _blocks.check_tier(tier) == 0 else self.host_lengths)[index])

    def best(self) -> tuple[WorkerId, int] | None:
        """The live worker with the greatest length, lowest index on ties; None without workers."""
        return best_of(self.slots, self.lengths)

    def insert(self, worker: WorkerId, *, tier: int = 0) -> int:
        """``insert`` of the matched key (a cursor match only)."""
        if self.cursor is None:
            raise _holds.no_cursor()
        model, toks, tags, namespace = self.cursor
        return model.insert(toks, worker, tier=tier, extras=tags, namespace=namespace)

    def hold(self, worker: WorkerId) -> int:
        """``hold`` of the matched key (a cursor match only)."""
        if self.cursor is None:
            raise _holds.no_cursor()
        model, toks, tags, namespace = self.cursor
        index = model._table.resolve(worker)
        if model._approximate(index):
            raise _holds.approximate_hold(worker)
        return model._hold(toks, tags, index, namespace)


class BruteForceMetaTree:
    """A tree-less, brute-force model of the :class:`~radixmeta.MetaTree` semantics.

    A page is named by its namespace, its full token path from the root and
    the extra tags of that path's pages. The model keeps:

    * per worker index, ``pages``: every page it holds on the device, mapped
      to the logical time of its last access (used by approximate workers
      only), and ``host``: the pages it holds on the host;
    * per worker index, ``blocks``: block hash to page;
    * one logical clock, advanced as the real trees advance theirs;
    * the namespaces holding a page, in order of creation.

    A page is "in the tree" when some worker holds it or a page below it (in
    its namespace): a node that holds nothing and leads to nothing is freed at
    once (rule 1), so the tree is exactly the prefix closure of all held pages.
    With that, every rule is one line:

    * ``match``: a worker's length is the longest run of the key's pages, from
      the first, that it holds; ``tree_length`` the longest run in the tree;
    * ``insert``/``remove``: mark or unmark the key's pages from ``start`` on;
    * an approximate worker's refreshed pages take the clock's value, and
      eviction drops its page with the smallest ``(stamp, -depth)`` until it
      fits (the "tree-less model" of the rules);
    * block events resolve hashes through ``blocks``, where a worker names a
      page by one hash at most (a second one is refused); every route that
      drops a page drops its hash;
    * a hold is its worker and its key's pages; a match counts a worker's
      page when it holds it or some hold of it covers it, and the tree is the
      prefix closure of held pages and held-by-hold pages.

    It has the public API of ``MetaTree`` except what only a tree has
    (``node_count``, ``memory_usage``, and node boundaries: ``items()`` and
    ``dump()`` answer per *page*, one record per held page). Every call scans
    everything, so keep inputs small.

    Parameters
    ----------
    page_size : int, default 1
        Tokens per page.

    Examples
    --------
    >>> model = BruteForceMetaTree(page_size=2)
    >>> a = model.add_worker("a")
    >>> b = model.add_worker("b", capacity=4)
    >>> model.insert([1, 2, 3, 4, 5, 6], a), model.insert([1, 2, 9, 9, 7, 7], b)
    (3, 3)
    >>> model.held_tokens(b)   # b evicted its least recent, deepest page
    4
    >>> m = model.match([1, 2, 9, 9, 7, 7])
    >>> m.lengths.tolist(), m.tree_length, m.best()[0].name
    ([2, 4], 4, 'b')
    """

    def __init__(self, page_size: int = 1) -> None:
        self._page_size = _keys.check_page_size(page_size)
        self._table = WorkerTable()
        self._clock = 0
        self._pages: dict[int, dict[Page, int]] = {}
        self._host: dict[int, set[Page]] = {}
        self._hashes: dict[int, dict[int, Page]] = {}
        self._namespaces: list[Hashable] = [None]
        self._holds: dict[int, tuple[int, list[Page]]] = {}  # id -> (worker index, pages)
        self._next_hold = 0

    # -- workers ------------------------------------------------------------------------
    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return self._page_size

    @property
    def n_workers(self) -> int:
        """Length of every ``lengths`` array."""
        return len(self._table.slots)

    @property
    def workers(self) -> tuple[WorkerId, ...]:
        """The live workers, by index."""
        return self._table.live

    def add_worker(self, name: str, dp_rank: int = 0, *, capacity: int | None = None) -> WorkerId:
        """Register a worker (see ``MetaTree.add_worker``)."""
        worker = self._table.add(name, dp_rank, capacity)
        self._pages[worker.index] = {}
        self._host[worker.index] = set()
        self._hashes[worker.index] = {}
        return worker

    def remove_worker(self, worker: WorkerId) -> int:
        """Forget a worker; returns the tokens it held."""
        index = self._table.resolve(worker)
        for hold in [h for h, (i, _) in self._holds.items() if i == index]:
            del self._holds[hold]
        tokens = self._clear(index)
        self._table.remove(worker)
        self._settle_namespaces()
        return tokens

    def worker(self, name: str, dp_rank: int = 0) -> WorkerId:
        """The ``WorkerId`` registered as ``(name, dp_rank)``."""
        return self._table.lookup(name, dp_rank)

    def capacity_of(self, worker: WorkerId) -> int | None:
        """The worker's capacity, or None in exact mode."""
        return self._table.capacities[self._table.resolve(worker)]

    def set_capacity(self, worker: WorkerId, capacity: int) -> int:
        """Give an approximate worker another capacity (see ``MetaTree.set_capacity``)."""
        index = self._table.resize(worker, capacity)
        before = len(self._pages[index])
        self._evict(index)
        self._settle_namespaces()
        return (before - len(self._pages[index])) * self._page_size

    def held_tokens(self, worker: WorkerId, *, tier: int = 0) -> int:
        """Tokens the worker holds on ``tier``."""
        index = self._table.resolve(worker)
        return len(self._tier(index, _blocks.check_tier(tier))) * self._page_size

    def _tier(self, index: int, tier: int) -> dict[Page, int] | set[Page]:
        """The pages worker ``index`` holds on ``tier``."""
        return self._pages[index] if tier == 0 else self._host[index]

    def _holds_any(self, index: int, page: Page) -> bool:
        return page in self._pages[index] or page in self._host[index]

    # -- helpers ----------------------------------------------------------------------------
    def _prefixes(
        self, namespace: Hashable, toks: Tokens, tags: tuple[int, ...], lo: int, hi: int
    ) -> list[Page]:
        """The pages of ``toks`` (page tags ``tags``) in ``namespace`` ending in ``(lo, hi]``."""
        p = self._page_size
        return [(namespace, toks[:k], tags[: k // p]) for k in range(lo + p, hi + 1, p)]

    def _key_tags(self, extras: Any, toks: Tokens, name: str = "extras") -> tuple[int, ...]:
        """A key's extra tags, one per whole page (0s for None)."""
        count = len(toks) // self._page_size
        return _keys.tags(extras, count, _keys.PER_PAGE, name) or (0,) * count

    def _every(self) -> list[Iterable[Page]]:
        """The pages held on either tier, or by a hold, per worker and hold."""
        held: list[Iterable[Page]] = [*self._pages.values(), *self._host.values()]
        return held + [pages for _, pages in self._holds.values()]

    def _hold_pages(self, index: int) -> set[Page]:
        """The pages some hold of worker ``index`` covers."""
        return {page for i, pages in self._holds.values() if i == index for page in pages}

    def _in_tree(self, page: Page) -> bool:
        namespace, toks, tags = page
        return any(
            ns == namespace and q[: len(toks)] == toks and t[: len(tags)] == tags
            for pages in self._every()
            for ns, q, t in pages
        )

    def _settle_namespaces(self) -> None:
        """Forget the namespaces left without pages; list new ones last (creation order)."""
        held = {page[0] for pages in self._every() for page in pages}
        self._namespaces = [ns for ns in self._namespaces if ns is None or ns in held]
        self._namespaces += [ns for ns in held if ns not in self._namespaces]

    def _approximate(self, index: int) -> bool:
        return self._table.capacities[index] is not None

    def _drop(self, index: int, page: Page, tier: int = 0) -> None:
        """Worker ``index`` no longer holds ``page`` on ``tier``; its name goes with its last."""
        if tier == 0:
            del self._pages[index][page]
        else:
            self._host[index].discard(page)
        if not self._holds_any(index, page):
            hashes = self._hashes[index]
            for h in [h for h, q in hashes.items() if q == page]:
                del hashes[h]

    def _evict(self, index: int) -> None:
        capacity = self._table.capacities[index]
        if capacity is None:
            return
        pages = self._pages[index]
        while len(pages) * self._page_size > capacity:
            victim = min(pages, key=lambda q: (pages[q], -len(q[1])))
            self._drop(index, victim)

    def _clear(self, index: int, tiers: tuple[int, ...] = (0, 1)) -> int:
        tokens = 0
        for tier in tiers:
            for page in list(self._tier(index, tier)):
                self._drop(index, page, tier)
                tokens += self._page_size
        return tokens

    def _key_and_start(self, key: Any, start: Any) -> tuple[Tokens, int, int]:
        toks = _keys.tokens(key)
        p = self._page_size
        n = len(toks) // p * p
        s = _keys.check_int("start", start, 0)
        if s % p:
            msg = f"start must be a multiple of page_size ({p}), got {s}"
            raise InvalidInputError(msg)
        if s > n:
            msg = f"start = {s} is beyond the key's {n} whole-page tokens"
            raise InvalidInputError(msg)
        return toks, n, s

    # -- token paths --------------------------------------------------------------------------
    def insert(
        self,
        key: Any,
        worker: WorkerId,
        *,
        start: int = 0,
        tier: int = 0,
        extras: Any = None,
        namespace: Hashable = None,
    ) -> int:
        """Mark the key's pages from ``start`` on, on ``tier``; returns pages newly marked."""
        index = self._table.resolve(worker)
        toks, n, start = self._key_and_start(key, start)
        tier = _blocks.check_tier(tier)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        self._clock += 1
        pages = self._pages[index]
        newly = 0
        for page in self._prefixes(namespace, toks, tags, start, n):
            if tier == 1:
                newly += page not in self._host[index]
                self._host[index].add(page)
            elif page not in pages:
                pages[page] = self._clock
                newly += 1
        if self._approximate(index) and tier == 0:
            for page in self._prefixes(namespace, toks, tags, 0, n):
                if page in pages:
                    pages[page] = self._clock
            self._evict(index)
        self._settle_namespaces()
        return newly

    def remove(
        self,
        key: Any,
        worker: WorkerId,
        *,
        start: int = 0,
        tier: int = 0,
        extras: Any = None,
        namespace: Hashable = None,
    ) -> int:
        """Unmark the key's pages from ``start`` on, on ``tier``; returns pages unmarked."""
        index = self._table.resolve(worker)
        toks, n, start = self._key_and_start(key, start)
        tier = _blocks.check_tier(tier)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        removed = 0
        for page in self._prefixes(namespace, toks, tags, start, n):
            if page in self._tier(index, tier):
                self._drop(index, page, tier)
                removed += 1
        self._settle_namespaces()
        return removed

    def _match(
        self,
        toks: Tokens,
        tags: tuple[int, ...],
        touch: bool,
        namespace: Hashable,
        optimistic: bool = True,
    ) -> BruteForceMetaMatch:
        p = self._page_size
        n = len(toks) // p * p
        slots = self._table.slots
        lengths = np.zeros(len(slots), dtype=np.int64)
        host_lengths = np.zeros(len(slots), dtype=np.int64)
        pages = self._prefixes(namespace, toks, tags, 0, n)
        tree_length = 0
        for page in pages:
            if not self._in_tree(page):
                break
            tree_length = len(page[1])
        for i, w in enumerate(slots):
            if w is None:
                continue
            held = self._pages[i]
            by_holds = self._hold_pages(i) if optimistic else set()
            count = 0
            while count < len(pages) and (pages[count] in held or pages[count] in by_holds):
                count += 1
            lengths[i] = count * p
            count = 0
            while count < len(pages) and (
                self._holds_any(i, pages[count]) or pages[count] in by_holds
            ):
                count += 1
            host_lengths[i] = count * p
        if touch:
            self._clock += 1
            for i, w in enumerate(slots):
                if w is not None and self._approximate(i):
                    for page in pages[: int(lengths[i]) // p]:
                        self._pages[i][page] = self._clock
        best = best_of(slots, lengths)
        top = 0 if best is None else best[1]
        key = None
        if top:
            key = _holds.prefix_key(top, toks[top - p : top], tags[top // p - 1], namespace)
        return BruteForceMetaMatch(lengths, host_lengths, tree_length, slots, prefix_key=key)

    def match(
        self,
        key: Any,
        *,
        touch: bool = False,
        extras: Any = None,
        namespace: Hashable = None,
        optimistic: bool = True,
        cursor: bool = False,
    ) -> BruteForceMetaMatch:
        """Every worker's matched length of ``key`` (the gap rule; holds count unless
        ``optimistic=False``)."""
        toks = _keys.tokens(key)
        if not isinstance(touch, bool):
            msg = f"touch must be a bool, got {type(touch).__name__}"
            raise InputTypeError(msg)
        optimistic = _keys.check_flag("optimistic", optimistic)
        cursor = _keys.check_flag("cursor", cursor)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        m = self._match(toks, tags, touch, namespace, optimistic)
        if cursor:
            m = dataclasses.replace(m, cursor=(self, toks, tags, namespace))
        return m

    def match_many(
        self,
        keys: Any,
        *,
        touch: bool = False,
        tier: int = 0,
        extras: Any = None,
        namespace: Hashable = None,
        optimistic: bool = True,
    ) -> npt.NDArray[np.int64]:
        """``match`` of each key in order: an int64 array of shape (len(keys), n_workers)."""
        if isinstance(keys, np.ndarray) and keys.ndim == 2 and keys.dtype.kind in "iu":
            rows: list[Any] = list(keys)
        elif isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
            msg = f"keys must be a sequence of keys, got {type(keys).__name__}"
            raise InputTypeError(msg)
        else:
            rows = list(keys)
        converted = [_keys.tokens(row) for row in rows]
        if not isinstance(touch, bool):
            msg = f"touch must be a bool, got {type(touch).__name__}"
            raise InputTypeError(msg)
        tier = _blocks.check_tier(tier)
        optimistic = _keys.check_flag("optimistic", optimistic)
        per_key = _keys.per_key_tags(extras, len(converted))
        tags = [self._key_tags(per_key[r], t, f"extras[{r}]") for r, t in enumerate(converted)]
        _keys.check_namespace(namespace)
        out = np.zeros((len(converted), self.n_workers), dtype=np.int64)
        for r, toks in enumerate(converted):
            m = self._match(toks, tags[r], touch, namespace, optimistic)
            out[r] = m.lengths if tier == 0 else m.host_lengths
        return out

    # -- holds --------------------------------------------------------------------------------
    def hold(
        self, key: Any, worker: WorkerId, *, extras: Any = None, namespace: Hashable = None
    ) -> int:
        """Hold the key's whole pages for exact ``worker``; returns the hold's id."""
        index = self._table.resolve(worker)
        if self._approximate(index):
            raise _holds.approximate_hold(worker)
        toks = _keys.tokens(key)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        return self._hold(toks, tags, index, namespace)

    def _hold(self, toks: Tokens, tags: tuple[int, ...], index: int, namespace: Hashable) -> int:
        n = len(toks) // self._page_size * self._page_size
        hold = self._next_hold
        self._next_hold += 1
        self._holds[hold] = (index, self._prefixes(namespace, toks, tags, 0, n))
        self._settle_namespaces()
        return hold

    def release(self, hold: int) -> int:
        """End a hold; returns the pages its worker no longer holds by any hold."""
        h = _holds.check_hold(hold)
        if h not in self._holds:
            raise _holds.stale_hold(h)
        index, pages = self._holds.pop(h)
        left = self._hold_pages(index)
        self._settle_namespaces()
        return len(set(pages) - left)

    @property
    def has_host_pages(self) -> bool:
        """Whether some worker holds some page on the host."""
        return any(self._host.values())

    @property
    def hold_count(self) -> int:
        """Holds not released yet."""
        return len(self._holds)

    def hold_tokens(self, worker: WorkerId) -> int:
        """Tokens of the pages ``worker`` holds by some hold."""
        return len(self._hold_pages(self._table.resolve(worker))) * self._page_size

    # -- block events -------------------------------------------------------------------------
    def apply_stored(
        self,
        worker: WorkerId,
        parent_hash: int | None,
        block_hashes: Any,
        token_ids: Any,
        *,
        tier: int = 0,
        extras: Any = None,
        namespace: Hashable = None,
    ) -> int:
        """Apply a ``BlockStored`` event atomically; returns pages newly marked."""
        index = self._table.resolve(worker)
        tier = _blocks.check_tier(tier)
        parent = _blocks.parent_hash(parent_hash)
        hashes = _blocks.block_hashes(block_hashes)
        toks = _keys.tokens(token_ids)
        tags = _keys.tags(extras, len(hashes), _keys.PER_BLOCK) or (0,) * len(hashes)
        _keys.check_namespace(namespace)
        p = self._page_size
        if len(toks) != len(hashes) * p:
            raise _blocks.bad_token_count(len(toks), len(hashes), p)
        known = self._hashes[index]
        if parent is not None and (parent not in known or known[parent][0] != namespace):
            raise _blocks.unknown_parent(worker, parent, namespace)
        _, base, base_tags = (None, (), ()) if parent is None else known[parent]
        for i, h in enumerate(hashes):
            if h == parent:
                raise _blocks.cycle(i, h)
            if h in hashes[:i]:
                raise _blocks.repeated_hash(i, h)
            page = (namespace, base + toks[: (i + 1) * p], base_tags + tags[: i + 1])
            if h in known and known[h] != page:
                raise _blocks.names_other_page(worker, i, h)
            old = [g for g, q in known.items() if q == page and g != h]
            if old:
                raise _blocks.renamed_block(worker, i, h, old[0])
        self._clock += 1
        if not hashes:
            return 0
        pages = self._pages[index]
        newly = 0
        path, path_tags = base + toks, base_tags + tags
        for i, h in enumerate(hashes):
            page = (namespace, path[: len(base) + (i + 1) * p], path_tags[: len(base_tags) + i + 1])
            if tier == 1:
                newly += page not in self._host[index]
                self._host[index].add(page)
            elif page not in pages:
                pages[page] = self._clock
                newly += 1
            known[h] = page
        if self._approximate(index) and tier == 0:
            for page in self._prefixes(namespace, path, path_tags, 0, len(path)):
                if page in pages:
                    pages[page] = self._clock
            self._evict(index)
        self._settle_namespaces()
        return newly

    def apply_removed(self, worker: WorkerId, block_hashes: Any, *, tier: int = 0) -> int:
        """Apply a ``BlockRemoved`` event (in any namespace); returns pages unmarked."""
        index = self._table.resolve(worker)
        tier = _blocks.check_tier(tier)
        hashes = _blocks.block_hashes(block_hashes)
        removed = 0
        for h in hashes:
            page = self._hashes[index].get(h)
            if page is not None and page in self._tier(index, tier):
                self._drop(index, page, tier)
                removed += 1
        self._settle_namespaces()
        return removed

    def apply_cleared(self, worker: WorkerId, *, tier: int | None = None) -> int:
        """Apply an ``AllBlocksCleared`` event (one tier, or both); returns tokens unmarked."""
        index = self._table.resolve(worker)
        tokens = self._clear(index, _blocks.check_tiers(tier))
        self._settle_namespaces()
        return tokens

    def apply_events(self, records: Any) -> npt.NDArray[np.int8]:
        """Apply records in order, each atomically; one ``BlockStatus`` per record."""
        if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
            msg = f"records must be a sequence of event records, got {type(records).__name__}"
            raise InputTypeError(msg)
        methods: dict[str, Callable[..., Any]] = {
            "stored": self.apply_stored,
            "removed": self.apply_removed,
            "cleared": self.apply_cleared,
        }
        out: list[int] = []
        for record in records:
            try:
                ok = isinstance(record, (tuple, list)) and record and isinstance(record[0], str)
                base = _blocks.RECORD_FIELDS.get(record[0]) if ok else None
                if base is None or len(record) not in (base, base + 1):
                    raise _blocks.not_a_record(record)
                self._table.resolve(record[1])
                kind = record[0]
                extra = len(record) > base
                options = _blocks.record_options(kind, record[base], record) if extra else {}
                methods[kind](*record[1:base], **options)
            except RadixMetaError as exc:
                out.append(int(_blocks.record_status(exc)))
            else:
                out.append(int(_blocks.BlockStatus.APPLIED))
        return np.array(out, dtype=np.int8)

    # -- introspection ------------------------------------------------------------------------
    def namespaces(self) -> list[Hashable]:
        """Namespaces that hold a page, in order of creation (None always first)."""
        return list(self._namespaces)

    def page_order(self, page: Page) -> tuple[int, Tokens, tuple[int, ...]]:
        """Sort key of "path order": namespace by namespace (:meth:`namespaces`), then path
        and tags."""
        return self._namespaces.index(page[0]), page[1], page[2]

    def pages(self, worker: WorkerId, tier: int = 0) -> list[Page]:
        """The worker's pages on ``tier``: on an approximate worker's device least recent
        (deepest first among equals) to most recent, else (no meaningful recency) in path
        order."""
        index = self._table.resolve(worker)
        pages = self._pages[index]
        if self._approximate(index) and tier == 0:
            return sorted(pages, key=lambda q: (pages[q], -len(q[1])))
        return sorted(self._tier(index, tier), key=self.page_order)

    def dump(self, worker: WorkerId) -> list[DumpRecord]:
        """One record per held page, in :meth:`pages` order.

        Replaying them with ``insert(key, w, start=start, namespace=namespace)``
        rebuilds the pages and (for an approximate worker) their recency order.
        """
        p = self._page_size
        return [
            DumpRecord(np.array(q, dtype=np.uint32), len(q) - p, ns, _extras(tags), tier)
            for tier in (0, 1)
            for ns, q, tags in self.pages(worker, tier)
        ]

    def items(
        self, worker: WorkerId | None = None
    ) -> list[
        tuple[Tokens, tuple[WorkerId, ...], Hashable, tuple[int, ...], tuple[WorkerId, ...]]
    ]:
        """One ``(page path, holders, namespace, page tags, host holders)`` per page in the
        tree, in path order.

        Pages, not nodes: a tree's ``items()`` has one entry per run of pages.
        """
        index = None if worker is None else self._table.resolve(worker)
        slots = self._table.slots
        every: set[Page] = set()
        for ns, q, tags in (q for pages in self._every() for q in pages):
            every.update(self._prefixes(ns, q, tags, 0, len(q)))
        out = []
        for page in sorted(every, key=self.page_order):
            holders = tuple(
                w for i, w in enumerate(slots) if w is not None and page in self._pages[i]
            )
            host = tuple(w for i, w in enumerate(slots) if w is not None and page in self._host[i])
            if index is None or self._holds_any(index, page):
                out.append((page[1], holders, page[0], page[2], host))
        return out

    def _block_entries(
        self, worker: WorkerId
    ) -> list[tuple[int, npt.NDArray[np.uint32], Hashable, npt.NDArray[np.uint64] | None]]:
        """(hash, page path, namespace, extras) for every block hash of the worker, by hash."""
        known = self._hashes[self._table.resolve(worker)]
        return [
            (h, np.array(known[h][1], dtype=np.uint32), known[h][0], _extras(known[h][2]))
            for h in sorted(known)
        ]

    def check(self) -> None:
        """Verify the model's own invariants; raises AssertionError."""
        p = self._page_size
        for index, _ in self._holds.values():
            live = index < len(self._table.slots) and self._table.slots[index] is not None
            assert live and not self._approximate(index), "a hold of a dead or approximate worker"
        for index, pages in self._pages.items():
            host = self._host[index]
            live = index < len(self._table.slots) and self._table.slots[index] is not None
            assert live or not (pages or host), "a removed worker holds pages"
            every = [*pages, *host]
            assert all(q and len(q) % p == 0 for _, q, _ in every), "a page is not whole"
            for h, q in self._hashes[index].items():
                assert self._holds_any(index, q), f"hash {h:#x} names a page the worker lacks"
            assert len(set(self._hashes[index].values())) == len(self._hashes[index])
            capacity = self._table.capacities[index] if live else None
            if capacity is not None:
                assert len(pages) * p <= capacity, "an approximate worker exceeds its capacity"
                keys = {(stamp, len(q)) for (_, q, _), stamp in pages.items()}
                assert len(keys) == len(pages), "two pages of a worker tie in recency"


# ---------------------------------------------------------------------------------------
# Operations
# ---------------------------------------------------------------------------------------


def _extras(tags: tuple[int, ...]) -> npt.NDArray[np.uint64] | None:
    """Page tags as records give them: a uint64 array, or None when all are 0."""
    return np.array(tags, dtype=np.uint64) if any(tags) else None


def block_hash_of(
    path: Sequence[int], salt: int = 0, namespace: Hashable = None, extras: Sequence[int] = ()
) -> int:
    """A deterministic 64-bit block hash of a page path (unsigned), as the operations use.

    Parameters
    ----------
    path : sequence of int
        The page's full token path from the root.
    salt : int, default 0
        Other salts give other hashes for the same page.
    namespace : hashable, default None
        The page's namespace: engines hash the LoRA adapter and cache salt in.
    extras : sequence of int, default ()
        The extra tags of the path's pages (multimodal inputs); all-0 tags hash
        as none.

    Examples
    --------
    >>> block_hash_of([1, 2]) == block_hash_of((1, 2)) != block_hash_of([1, 2], salt=1)
    True
    >>> block_hash_of([1, 2]) != block_hash_of([1, 2], namespace="lora")
    True
    >>> block_hash_of([1, 2], extras=[0]) == block_hash_of([1, 2])
    True
    >>> block_hash_of([1, 2], extras=[5]) != block_hash_of([1, 2])
    True
    """
    tag = () if namespace is None else (repr(namespace),)
    tags = (tuple(int(t) for t in extras),) if any(extras) else ()
    data = repr((salt, tuple(int(t) for t in path), *tag, *tags)).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


@dataclass(frozen=True)
class AddWorker:
    """``tree.add_worker(name, dp_rank, capacity=capacity)``."""

    name: str
    dp_rank: int = 0
    capacity: int | None = None


@dataclass(frozen=True)
class RemoveWorker:
    """``tree.remove_worker(w)``; ``worker`` picks a WorkerId (see :func:`run_meta_operations`)."""

    worker: int


@dataclass(frozen=True)
class Insert:
    """``tree.insert(key, w, start=start, tier=tier, extras=extras, namespace=namespace)``."""

    key: list[int]
    worker: int
    start: int = 0
    namespace: Any = None  # a namespace, or an unhashable value the trees refuse
    extras: Any = None  # one tag per whole page of the key, None, or a bad value
    tier: int = 0


@dataclass(frozen=True)
class Remove:
    """``tree.remove(key, w, start=start, tier=tier, extras=extras, namespace=namespace)``."""

    key: list[int]
    worker: int
    start: int = 0
    namespace: Any = None  # a namespace, or an unhashable value the trees refuse
    extras: Any = None  # one tag per whole page of the key, None, or a bad value
    tier: int = 0


@dataclass(frozen=True)
class Match:
    """``tree.match(key, touch=touch, extras=extras, namespace=namespace)``; the outcome is
    ``(lengths, host_lengths, tree_length, best)``."""

    key: list[int]
    touch: bool = False
    namespace: Any = None  # a namespace, or an unhashable value the trees refuse
    extras: Any = None  # one tag per whole page of the key, None, or a bad value


@dataclass(frozen=True)
class MatchMany:
    """``tree.match_many(keys, touch=touch, extras=extras, namespace=namespace)``;
    ``as_array`` passes a 2-D array (equal lengths)."""

    keys: list[list[int]]
    touch: bool = False
    as_array: bool = False
    namespace: Any = None  # a namespace, or an unhashable value the trees refuse
    extras: Any = None  # one entry (tags or None) per key, None, or a bad value
    tier: int = 0


#: Kinds of :class:`ApplyStored` calls: well-formed ones, and each way of being refused.
STORED_VARIANTS = (
    "ok",  # hashes block_hash_of(page path); parent the hash of the parent page
    "signed",  # the same hashes passed as signed int64 values
    "array",  # the same hashes as a numpy uint64 array, tokens as an int64 array
    "salted",  # other hashes for the same pages (a conflict where the worker named them)
    "unknown_parent",  # a parent hash nobody stored
    "cycle",  # a block whose hash is the parent's
    "repeat",  # a hash repeated within the event
    "other_page",  # a hash that names a different page (the first page of the key)
    "bad_count",  # one token too many
    "tier",  # tier=1: the blocks are held on the host
    "float_hash",  # a float where a hash belongs
    "big_hash",  # 2**64, outside the hash range
    "retagged",  # the same pages under other extra tags (other pages, hashed apart)
)


@dataclass(frozen=True)
class ApplyStored:
    """``tree.apply_stored(w, parent, hashes, tokens, extras=..., namespace=namespace)`` for
    pages of ``key``.

    The blocks are the key's pages ``parent_pages`` to ``parent_pages + blocks``;
    the parent is the page before them (None at the root); ``extras`` are the
    key's page tags, of which the event takes the blocks' (a bad value is passed
    as it is); hashes come from :func:`block_hash_of` (of the namespace, the
    path and its tags), altered as ``variant`` (one of :data:`STORED_VARIANTS`) says.
    """

    worker: int
    key: list[int]
    parent_pages: int
    blocks: int
    variant: str = "ok"
    namespace: Any = None  # a namespace, or an unhashable value the trees refuse
    extras: Any = None  # one tag per whole page of the key, None, or a bad value


@dataclass(frozen=True)
class ApplyRemoved:
    """``tree.apply_removed(w, hashes)`` for the pages of ``key`` from ``first_page`` on.

    ``salt`` 0 names them as :class:`ApplyStored` "ok" does in ``namespace``
    with the key's page tags ``extras`` (a removal itself carries neither), on
    ``tier`` (0 or 1; 2 is refused).
    """

    worker: int
    key: list[int]
    first_page: int = 0
    salt: int = 0
    tier: int = 0
    namespace: Any = None  # a namespace, or an unhashable value the trees refuse
    extras: Any = None  # one tag per whole page of the key, None, or a bad value


@dataclass(frozen=True)
class ApplyCleared:
    """``tree.apply_cleared(w, tier=tier)``."""

    worker: int
    tier: int | None = None


@dataclass(frozen=True)
class ApplyEvents:
    """``tree.apply_events(records)``: each record is built from an op, or is ``"junk"``."""

    records: tuple[ApplyStored | ApplyRemoved | ApplyCleared | str, ...]


MetaOperation: TypeAlias = (
    AddWorker
    | RemoveWorker
    | Insert
    | Remove
    | Match
    | MatchMany
    | ApplyStored
    | ApplyRemoved
    | ApplyCleared
    | ApplyEvents
)

_JUNK_RECORDS: tuple[Any, ...] = (("bogus",), ("stored",), (), 5, ["cleared"], ("removed", 1, 2, 3))


def _stored_args(op: ApplyStored, page_size: int) -> tuple[Any, Any, Any, dict[str, Any]]:
    """(parent_hash, block_hashes, token_ids, kwargs) of an :class:`ApplyStored`."""
    p = page_size
    key = [int(t) for t in op.key]
    first = op.parent_pages * p
    end = first + op.blocks * p
    ns = op.namespace if _hashable(op.namespace) else None
    given = _well_formed_tags(op.extras, len(key) // p)
    tags = given or [0] * (len(key) // p)
    if op.variant == "retagged":
        tags = [t + 1 for t in tags]

    def hash_of(path: list[int], salt: int = 0) -> int:
        return block_hash_of(path, salt, ns, tags[: len(path) // p])

    parent: Any = hash_of(key[:first]) if first else None
    hashes: Any = [hash_of(key[: first + (i + 1) * p]) for i in range(op.blocks)]
    tokens: Any = key[first:end]
    kwargs: dict[str, Any] = {} if op.namespace is None else {"namespace": op.namespace}
    if given is not None or op.variant == "retagged":
        kwargs["extras"] = tags[op.parent_pages : op.parent_pages + op.blocks]
    elif op.extras is not None:
        kwargs["extras"] = op.extras  # a bad value, passed as it is
    v = op.variant
    if v == "signed":
        hashes = [h - 2**64 if h >= 2**63 else h for h in hashes]
        parent = parent - 2**64 if parent is not None and parent >= 2**63 else parent
    elif v == "array":
        hashes = np.array(hashes, dtype=np.uint64)
        tokens = np.array(tokens, dtype=np.int64)
    elif v == "salted":
        hashes = [hash_of(key[: first + (i + 1) * p], salt=1) for i in range(op.blocks)]
    elif v == "unknown_parent":
        parent = hash_of(key[:first], salt=99)
    elif v == "cycle" and hashes:
        hashes[-1] = parent if parent is not None else hashes[0]
    elif v == "repeat" and hashes:
        hashes.append(hashes[0])
        tokens = tokens + tokens[-p:]
    elif v == "other_page" and hashes:
        hashes[-1] = hash_of(key[:p])
    elif v == "bad_count":
        tokens = [*tokens, 0]
    elif v == "tier":
        kwargs["tier"] = 1
    elif v == "float_hash" and hashes:
        hashes[0] = 1.5
    elif v == "big_hash":
        hashes = [*hashes, 2**64]
        tokens = tokens + [0] * p
    return parent, hashes, tokens, kwargs


def _removed_hashes(op: ApplyRemoved, page_size: int) -> list[int]:
    key = [int(t) for t in op.key]
    n = len(key) // page_size * page_size
    ends = range((op.first_page + 1) * page_size, n + 1, page_size)
    ns = op.namespace if _hashable(op.namespace) else None
    tags = _well_formed_tags(op.extras, len(key) // page_size) or []
    return [block_hash_of(key[:k], op.salt, ns, tags[: k // page_size]) for k in ends]


def _well_formed_tags(extras: Any, pages: int) -> list[int] | None:
    """``extras`` if it is a well-formed list of tags for ``pages`` pages, else None."""
    ok = isinstance(extras, list) and len(extras) == pages
    if ok and all(type(t) is int and 0 <= t < _keys.TAG_LIMIT for t in extras):
        return list(extras)
    return None


def _hashable(value: Any) -> bool:
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _plain(value: Any) -> Any:
    """Return values as plain, comparable Python objects."""
    if isinstance(value, np.ndarray):
        return (str(value.dtype), value.tolist())
    if isinstance(value, (np.integer, int)):
        return int(value)
    return value


def apply_meta_operation(tree: Any, op: MetaOperation, pick: Callable[[int], Any]) -> Any:
    """Apply one operation to ``tree``; ``pick(op.worker)`` gives the worker argument.

    Returns the call's outcome as plain Python values (see :func:`run_meta_operations`);
    errors propagate.
    """
    p = tree.page_size
    if isinstance(op, AddWorker):
        return tree.add_worker(op.name, op.dp_rank, capacity=op.capacity)
    if isinstance(op, RemoveWorker):
        return int(tree.remove_worker(pick(op.worker)))
    if isinstance(op, (Insert, Remove)):
        method = tree.insert if isinstance(op, Insert) else tree.remove
        kw = {"start": op.start, "tier": op.tier, "extras": op.extras, "namespace": op.namespace}
        return int(method(op.key, pick(op.worker), **kw))
    if isinstance(op, Match):
        m = tree.match(op.key, touch=op.touch, extras=op.extras, namespace=op.namespace)
        best = m.best()
        return (m.lengths.tolist(), m.host_lengths.tolist(), int(m.tree_length), best)
    if isinstance(op, MatchMany):
        keys: Any = op.keys
        if op.as_array and keys and len({len(k) for k in keys}) == 1:
            keys = np.array(keys, dtype=np.int64).reshape(len(keys), len(keys[0]))
        kw = {"touch": op.touch, "tier": op.tier, "extras": op.extras, "namespace": op.namespace}
        return _plain(tree.match_many(keys, **kw))
    if isinstance(op, ApplyStored):
        parent, hashes, tokens, kwargs = _stored_args(op, p)
        return int(tree.apply_stored(pick(op.worker), parent, hashes, tokens, **kwargs))
    if isinstance(op, ApplyRemoved):
        hashes = _removed_hashes(op, p)
        return int(tree.apply_removed(pick(op.worker), hashes, tier=op.tier))
    if isinstance(op, ApplyCleared):
        return int(tree.apply_cleared(pick(op.worker), tier=op.tier))
    records: list[Any] = []
    for k, rec in enumerate(op.records):
        if isinstance(rec, ApplyStored):
            parent, hashes, tokens, kwargs = _stored_args(rec, p)
            record = ("stored", pick(rec.worker), parent, hashes, tokens)
            records.append((*record, kwargs) if kwargs else record)
        elif isinstance(rec, ApplyRemoved):
            removed = ("removed", pick(rec.worker), _removed_hashes(rec, p))
            records.append((*removed, {"tier": rec.tier}) if rec.tier else removed)
        elif isinstance(rec, ApplyCleared):
            cleared = ["cleared", pick(rec.worker)]
            records.append([*cleared, {"tier": rec.tier}] if rec.tier is not None else cleared)
        else:
            records.append(_JUNK_RECORDS[k % len(_JUNK_RECORDS)])
    return _plain(tree.apply_events(records))


def run_meta_operations(tree: Any, ops: Iterable[MetaOperation]) -> list[Any]:
    """Apply ``ops`` to ``tree`` in order; return one plain outcome per operation.

    Workers are named by integers: ``k >= 0`` picks ``ids[k % len(ids)]`` among
    every ``WorkerId`` returned so far by the :class:`AddWorker` operations,
    removed ones included (so stale ids occur); ``k < 0`` passes an id that was
    never handed out. Before the first :class:`AddWorker`, ``k >= 0`` also
    passes such a foreign id.

    Parameters
    ----------
    tree : object
        Anything with the meta-tree API (a ``MetaTree``, :class:`BruteForceMetaTree`).
    ops : iterable of operations

    Returns
    -------
    list
        Per operation: the return value as plain Python values (a match as
        ``(lengths, host_lengths, tree_length, best)``; an array as ``(dtype, values)``), or
        ``(error class name, message)``. ``WorkerId`` values compare by value,
        so the outcomes of two trees compare equal when they agree.

    Examples
    --------
    >>> model = BruteForceMetaTree()
    >>> run_meta_operations(model, [AddWorker("a"), Insert([1, 2], 0), Match([1, 3])])[1:]
    [2, ([1], [1], 1, (WorkerId(name='a', dp_rank=0, index=0, generation=0), 1))]
    """
    ids: list[WorkerId] = []

    def pick(k: int) -> WorkerId:
        if k < 0 or not ids:
            return WorkerId("never-added", 0, abs(k) % 4, 7)
        return ids[k % len(ids)]

    out: list[Any] = []
    for op in ops:
        try:
            result = apply_meta_operation(tree, op, pick)
        except RadixMetaError as exc:
            out.append((type(exc).__name__, str(exc)))
            continue
        if isinstance(op, AddWorker):
            ids.append(result)
        out.append(result)
    return out


# ---------------------------------------------------------------------------------------
# Strategies
# ---------------------------------------------------------------------------------------


def meta_key_pools(
    page_size: int,
    *,
    vocab_size: int = 3,
    distinct_pages: int = 4,
    min_stems: int = 2,
    max_stems: int = 4,
) -> st.SearchStrategy[list[list[int]]]:
    """Return a strategy for pools of stems: page-aligned token lists built from few pages.

    Keys are then cut from the stems at page boundaries, so they share
    prefixes of every length and diverge at page boundaries (and, because the
    pages come from a tiny vocabulary, often inside a page too).

    Parameters
    ----------
    page_size : int
        Tokens per page.
    vocab_size : int, default 3
        Tokens are drawn from ``range(vocab_size)``.
    distinct_pages : int, default 4
        Pages are drawn from at most this many distinct pages (at least two, when
        the vocabulary allows: with one page, keys could not diverge).
    min_stems, max_stems : int, default 2 and 4
        Bounds on the number of stems, each 1 to 5 pages long.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[list[list[int]]]
    """
    token = st.integers(0, vocab_size - 1)
    page = st.lists(token, min_size=page_size, max_size=page_size)
    fewest = min(2, distinct_pages, vocab_size**page_size)
    pages = st.lists(page, min_size=fewest, max_size=distinct_pages, unique_by=tuple)

    def stems(pool: list[list[int]]) -> st.SearchStrategy[list[list[int]]]:
        stem = st.lists(st.sampled_from(pool), min_size=1, max_size=5)
        joined = stem.map(lambda chosen: [t for pg in chosen for t in pg])
        return st.lists(joined, min_size=min_stems, max_size=max(min_stems, max_stems))

    return pages.flatmap(stems)


def _operation_lists(
    page_size: int, stems: list[list[int]], max_workers: int, min_size: int, max_size: int
) -> st.SearchStrategy[list[MetaOperation]]:
    p = page_size

    @st.composite
    def key(draw: st.DrawFn) -> list[int]:
        stem = draw(st.sampled_from(stems))
        keep = draw(st.integers(0, len(stem) // p)) * p
        ragged = draw(st.lists(st.integers(0, 2), max_size=p - 1)) if draw(st.booleans()) else []
        return stem[:keep] + ragged

    @st.composite
    def keyed_start(draw: st.DrawFn, cls: type[Insert] | type[Remove]) -> Insert | Remove:
        k = draw(key())
        whole = len(k) // p
        start = draw(st.integers(0, whole)) * p if draw(st.booleans()) else 0
        if draw(st.integers(0, 9)) == 0:  # a bad start: ragged or beyond the key
            start = draw(st.sampled_from([start + 1, (whole + 1) * p, -p]))
        tier = draw(st.sampled_from([0, 0, 0, 1]))
        return cls(k, draw(worker), start, draw(namespace), draw(extras(k)), tier)

    @st.composite
    def stored(draw: st.DrawFn) -> ApplyStored:
        k = draw(key())
        whole = len(k) // p
        parent = draw(st.integers(0, whole))
        blocks = draw(st.integers(0, whole - parent))
        variant = draw(st.just("ok") | st.sampled_from(STORED_VARIANTS))
        return ApplyStored(
            draw(worker), k, parent, blocks, variant, draw(namespace), draw(extras(k))
        )

    @st.composite
    def removed(draw: st.DrawFn) -> ApplyRemoved:
        k = draw(key())
        first = draw(st.integers(0, max(0, len(k) // p - 1)))
        salt = draw(st.sampled_from([0, 0, 0, 1]))
        tier = draw(st.sampled_from([0] * 6 + [1, 1, 2]))
        return ApplyRemoved(draw(worker), k, first, salt, tier, draw(namespace), draw(extras(k)))

    @st.composite
    def extras(draw: st.DrawFn, k: list[int]) -> Any:
        """Mostly no tags; else a tag (1 or 2) on some pages; now and then a bad value."""
        pages = len(k) // p
        kind = draw(st.sampled_from(["none"] * 5 + ["tags"] * 3 + ["bad"]))
        if kind == "none":
            return None
        if kind == "tags":
            return draw(st.lists(st.sampled_from([0, 0, 1, 2]), min_size=pages, max_size=pages))
        return draw(st.sampled_from([[0] * (pages + 1), [-1] * pages, [0.5] * pages, 7]))

    @st.composite
    def many_keys(draw: st.DrawFn) -> MatchMany:
        keys = draw(st.lists(key(), max_size=3))
        tags = None if draw(st.booleans()) else [draw(extras(k)) for k in keys]
        tier = draw(st.sampled_from([0, 0, 1, 2]))
        return MatchMany(
            keys, draw(st.booleans()), draw(st.booleans()), draw(namespace), tags, tier
        )

    worker = st.integers(-1, max_workers * 2)
    # Mostly the default namespace, then two others; [] (unhashable) is refused.
    namespace: st.SearchStrategy[Any] = st.sampled_from([None, None, None, None, "lora", 3, []])
    name = st.sampled_from(["w0", "w1", "w2", "w3", "w4", "w5"][:max_workers])
    capacity = st.none() | st.sampled_from([0, p, 2 * p, 4 * p, 6 * p])
    add: st.SearchStrategy[MetaOperation] = st.builds(
        AddWorker, name, st.sampled_from([0, 0, 1]), capacity
    )
    remove_worker: st.SearchStrategy[MetaOperation] = st.builds(RemoveWorker, worker)
    insert: st.SearchStrategy[MetaOperation] = keyed_start(Insert)
    remove: st.SearchStrategy[MetaOperation] = keyed_start(Remove)
    match: st.SearchStrategy[MetaOperation] = key().flatmap(
        lambda k: st.builds(Match, st.just(k), st.booleans(), namespace, extras(k))
    )
    many: st.SearchStrategy[MetaOperation] = many_keys()
    store: st.SearchStrategy[MetaOperation] = stored()
    unstore: st.SearchStrategy[MetaOperation] = removed()
    cleared_tier = st.sampled_from([None, None, 0, 1, 3])
    cleared: st.SearchStrategy[MetaOperation] = st.builds(ApplyCleared, worker, cleared_tier)
    record = stored() | removed() | st.builds(ApplyCleared, worker, cleared_tier) | st.just("junk")
    events: st.SearchStrategy[MetaOperation] = st.builds(
        ApplyEvents, st.lists(record, max_size=4).map(tuple)
    )
    # Weighted by repetition (sampled_from keeps duplicates).
    weighted = (
        [add] * 2
        + [remove_worker]
        + [insert] * 4
        + [remove] * 2
        + [match] * 3
        + [many]
        + [store] * 4
        + [unstore] * 2
        + [cleared, events]
    )
    one = st.sampled_from(weighted).flatmap(lambda strategy: strategy)
    return st.lists(one, min_size=min_size, max_size=max_size)


def meta_operations(
    *,
    page_size: int = 1,
    max_workers: int = 3,
    vocab_size: int = 3,
    min_size: int = 10,
    max_size: int = 40,
) -> st.SearchStrategy[list[MetaOperation]]:
    """Return a strategy for lists of meta-tree operations over overlapping keys.

    Each list starts by adding one to ``max_workers`` workers (some with a small
    capacity, so that approximate eviction happens), then mixes every kind of
    call: token-path inserts and removes with ``start``, matches with and
    without ``touch``, stored/removed/cleared block events built from the
    keys' pages, batches of event records, and worker removals. Keys come
    from one pool of stems (:func:`meta_key_pools`) per example, cut at page
    boundaries, sometimes with a ragged tail that the tree must ignore. Calls
    that name pages take a namespace, mostly the default, and often extra
    tags on some pages. About one call in ten has a bad argument (a bad
    ``start``, a stale or foreign worker, an unknown parent, a conflicting or
    repeated hash, a bad tier, token count, hash value, namespace or tags).

    Parameters
    ----------
    page_size : int, default 1
        Page size the keys are shaped for (use the tree's).
    max_workers : int, default 3
        Workers are named from a pool of this many names (at most 6).
    vocab_size : int, default 3
        Tokens are drawn from ``range(vocab_size)``.
    min_size, max_size : int, default 10 and 40
        Bounds on the number of operations after the initial workers.

    Returns
    -------
    hypothesis.strategies.SearchStrategy[list]
        Lists of :data:`MetaOperation`; apply them with :func:`run_meta_operations`.

    Examples
    --------
    >>> from hypothesis import given, settings
    >>> @settings(max_examples=10)
    ... @given(meta_operations(page_size=4))
    ... def test_starts_with_workers(ops):
    ...     assert isinstance(ops[0], AddWorker)
    >>> test_starts_with_workers()
    """
    if page_size < 1 or not 1 <= max_workers <= 6:
        msg = f"need page_size >= 1 and 1 <= max_workers <= 6, got {page_size}, {max_workers}"
        raise ValueError(msg)
    names = ["w0", "w1", "w2", "w3", "w4", "w5"]
    capacity = st.none() | st.sampled_from([0, page_size, 2 * page_size, 4 * page_size])
    first = st.integers(1, max_workers).flatmap(
        lambda count: st.tuples(*[capacity for _ in range(count)])
    )

    def build(caps: tuple[int | None, ...]) -> st.SearchStrategy[list[MetaOperation]]:
        initial: list[MetaOperation] = [AddWorker(names[i], 0, c) for i, c in enumerate(caps)]
        pools = meta_key_pools(page_size, vocab_size=vocab_size)
        ops = pools.flatmap(
            lambda stems: _operation_lists(page_size, stems, max_workers, min_size, max_size)
        )
        return ops.map(lambda rest: initial + rest)

    return first.flatmap(build)
