"""Plain-Python MetaCore: the oracle of the router's meta-tree, and its readable fallback.

One radix tree over every worker's cache. Each node is a run of whole pages and
records the set of worker indices that hold all of its pages. Everything is
written the simple way (dicts, sets, full scans of the tree where that is
simplest) so that it is obviously right; the native core
(``csrc/include/radixmeta/meta_tree.hpp``) must produce the same results, node
boundaries included, for the same calls. ``RADIXMETA_IMPLEMENTATION=python``
makes :class:`radixmeta.MetaTree` run on this module.

Rules both implementations share (``docs/metatree.md`` rules 1-6, made exact):

* **Cuts.** A node is cut at a page boundary only where two parts of it must
  differ: an ``insert`` key diverging inside it when the insert adds a branch
  there (``start < n``), one worker's mark changing on part of it (``start`` or
  the key's end inside it, for a worker that gains or loses the mark), or an
  approximate worker's recency changing on part of it (an ``insert`` whose key
  ends or diverges inside a node that worker holds, a ``match(touch=True)``
  ending inside a node that some approximate worker counts into, an eviction
  that takes only the last pages of a node). The upper part is the new node and
  copies the holders and their stamps; the lower part keeps the original node.
* **Recency** is per page in effect: the cuts above keep every page a refresh
  covers in nodes it covers whole, so a node's stamp is the stamp of each of
  its pages, and the "tree-less" model (one stamp per page, evict the page with
  the smallest ``(stamp, -depth)``) gives exactly the same results.
* **Block pages** named by a hash are nodes of exactly one page, never cut.
* A node with no holders and no children is freed at once (before the call
  returns); nodes never merge.
* **Namespaces** each have a root of their own (None's always exists); any
  other namespace has one only while it holds a page, created by its first
  page and dropped with its last node.
* **Tiers.** ``holders`` hold a node on the device (tier 0), ``host`` on the
  host (tier 1); a node lives while either has a worker. Recency, capacity and
  eviction are the device's; a worker names a page while it holds it on any tier.
* **Extra tags.** A page is its tokens and its tag (0 for none). A tagged page
  is always a node of one page carrying the tag; a node of several pages is
  untagged. Children are keyed by (first page, tag); children sort by that key.
* **Holds** (the router's optimistic marks) are apart from the marks: each node
  a hold covers counts it per worker (``holds``). A hold covers whole nodes
  from the root to its key's end: it cuts the node its key ends or leaves the
  tree inside, and adds the pages missing (held by nobody). A node lives while
  it has holders, holds or children. A match counts holds unless told not to;
  nothing else (held tokens, dumps, items' holders, block maps) sees them.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from radixmeta import _blocks, _holds, _keys
from radixmeta._atomic import atomic
from radixmeta._keys import PER_PAGE as _PER_PAGE
from radixmeta._types import DumpRecord, MetaItem
from radixmeta._workers import WorkerId, WorkerTable, best_of, resolve_in
from radixmeta.errors import InputTypeError, InvalidInputError

__all__ = ["MetaCore", "MetaMatch"]

Tokens = tuple[int, ...]
Tags = tuple[int, ...] | None  # one extra tag per page of a key; None: all 0


def _require(condition: bool, what: str) -> None:
    """An invariant check that, unlike ``assert``, survives ``python -O``."""
    if not condition:
        msg = f"radixmeta reference meta-tree invariant violated: {what}"
        raise AssertionError(msg)


def _check_touch(touch: Any) -> bool:
    if not isinstance(touch, bool):
        msg = f"touch must be a bool, got {type(touch).__name__}"
        raise InputTypeError(msg)
    return touch


class _MetaNode:
    """One node: a run of whole pages and the workers holding all of them."""

    __slots__ = (
        "parent",
        "label",
        "tag",
        "children",
        "holders",
        "host",
        "stamps",
        "hashes",
        "depth",
        "namespace",
        "holds",
    )

    def __init__(
        self,
        parent: _MetaNode | None,
        label: Tokens,
        depth: int,
        namespace: Hashable,
        tag: int = 0,
    ) -> None:
        self.parent = parent
        self.namespace = namespace
        self.label = label
        self.tag = tag  # the extra tag of the node's one page; 0 for an untagged node
        # keyed by (the child's first page, its tag)
        self.children: dict[tuple[Tokens, int], _MetaNode] = {}
        self.holders: set[int] = set()  # worker indices holding the node on the device
        self.host: set[int] = set()  # ... and on the host
        self.stamps: dict[int, int] = {}  # approximate holders -> last access
        self.hashes: dict[int, int] = {}  # worker index -> block hash naming this page
        self.depth = depth  # tokens from the root to the END of this node
        self.holds: dict[int, int] = {}  # worker index -> holds covering this node


class MetaMatch:
    """Result of :meth:`MetaCore.match`: every worker's matched length of one key.

    Attributes
    ----------
    lengths : numpy.ndarray
        ``int64`` array indexed by worker index: each worker's matched tokens
        (0 for free indices), counting pages held on the device.
    length_list : list of int
        ``lengths`` as a list.
    host_lengths : numpy.ndarray
        The same, counting pages held on the device or the host.
    tree_length : int
        How much of the key is in the tree at all.
    """

    __slots__ = ("_lengths", "_host_lengths", "_tree_length", "_slots", "_cursor", "_prefix_key")

    def __init__(
        self,
        lengths: npt.NDArray[np.int64],
        host_lengths: npt.NDArray[np.int64],
        tree_length: int,
        slots: tuple[WorkerId | None, ...],
        cursor: tuple[MetaCore, Tokens, Tags, Hashable] | None = None,
        prefix_key: int | None = None,
    ) -> None:
        self._lengths = lengths
        self._host_lengths = host_lengths
        self._tree_length = tree_length
        self._slots = slots
        self._cursor = cursor  # (tree, key, tags, namespace) of a cursor match
        self._prefix_key = prefix_key

    @property
    def lengths(self) -> npt.NDArray[np.int64]:
        """Matched tokens per worker index on the device (``int64``; 0 for free indices)."""
        return self._lengths

    @property
    def length_list(self) -> list[int]:
        """``lengths`` as a list of ints (a new list on every read)."""
        return [int(v) for v in self._lengths]

    @property
    def host_lengths(self) -> npt.NDArray[np.int64]:
        """Matched tokens per worker index held on the device or the host (``int64``)."""
        return self._host_lengths

    @property
    def tree_length(self) -> int:
        """How much of the key is in the tree at all (held, or leading to held pages)."""
        return self._tree_length

    @property
    def prefix_key(self) -> int | None:
        """A 64-bit key of the longest prefix some live worker matched (None if none did).

        The same prefix (tokens, tags, namespace) always gives the same key:
        a hash of its length, its last page and that page's tag, and the
        namespace (see ``radixmeta._holds.prefix_key``), so two prefixes of
        one length that end in the same page share one.
        """
        return self._prefix_key

    def length_of(self, worker: WorkerId, *, tier: int = 0) -> int:
        """Matched tokens of ``worker``, which must have been live when the match was made.

        Parameters
        ----------
        worker : WorkerId
            A worker of the tree that was live at the time of the match.
        tier : int, default 0
            0: pages held on the device (``lengths``); 1: on the device or the
            host (``host_lengths``).

        Returns
        -------
        int

        Raises
        ------
        InputTypeError
            ``worker`` is not a ``WorkerId``, or ``tier`` not an integer.
        StaleWorkerError
            ``worker`` was not live at the time of the match.
        InvalidInputError
            ``tier`` is not 0 or 1.
        """
        index = resolve_in(self._slots, worker)
        lengths = self.lengths if _blocks.check_tier(tier) == 0 else self.host_lengths
        return int(lengths[index])

    def best(self) -> tuple[WorkerId, int] | None:
        """The live worker with the greatest length (lowest index on ties) and that length.

        Returns
        -------
        tuple of (WorkerId, int), or None
            None when the tree had no live workers at the time of the match.
        """
        return best_of(self._slots, self.lengths)

    def insert(self, worker: WorkerId, *, tier: int = 0) -> int:
        """``tree.insert`` of the matched key for ``worker`` on ``tier`` (a cursor match only).

        The native core continues from the match's walk while it still holds
        (see the MetaTree page); the result is that of a fresh ``insert`` either way.

        Raises
        ------
        InvalidInputError
            The match was made without ``cursor=True``.
        InputTypeError, StaleWorkerError, InvalidInputError
            A bad worker or tier; nothing changes.
        """
        if self._cursor is None:
            raise _holds.no_cursor()
        tree, toks, tags, namespace = self._cursor
        return tree._insert_checked(toks, tags, worker, tier, namespace)

    def hold(self, worker: WorkerId) -> int:
        """``tree.hold`` of the matched key for ``worker`` (a cursor match only).

        Raises
        ------
        InvalidInputError
            The match was made without ``cursor=True``.
        InputTypeError, StaleWorkerError, WorkerError
            A bad or an approximate worker; nothing changes.
        """
        if self._cursor is None:
            raise _holds.no_cursor()
        tree, toks, tags, namespace = self._cursor
        return tree._hold_checked(toks, tags, worker, namespace)

    def __repr__(self) -> str:
        return f"MetaMatch(tree_length={self.tree_length}, best={self.best()})"


class MetaCore:
    """Reference implementation of the router's meta-tree (see ``radixmeta.MetaTree``).

    Parameters
    ----------
    page_size : int, default 1
        Tokens per KV page; keys are cut down to whole pages.
    """

    def __init__(self, page_size: int = 1) -> None:
        self._page_size = _keys.check_page_size(page_size)
        self._mutex = threading.RLock()
        self._table = WorkerTable()
        # Namespace -> root, in order of creation; None's root always exists.
        self._roots: dict[Hashable, _MetaNode] = {None: _MetaNode(None, (), 0, None)}
        self._clock = 0
        self._nodes = 0
        self._held: list[int] = []  # tokens held on the device, per worker index
        self._host_held: list[int] = []  # ... and on the host
        self._blocks: list[dict[int, _MetaNode]] = []  # block hash -> node, per worker index
        # hold id -> (worker index, the node at the end of its key, or None for no page)
        self._holds: dict[int, tuple[int, _MetaNode | None]] = {}
        self._next_hold = 0
        self._hold_tokens: list[int] = []  # tokens of the nodes some hold covers, per index

    # -- properties ---------------------------------------------------------------------
    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return self._page_size

    @property
    @atomic
    def node_count(self) -> int:
        """Nodes in the tree, the root not counted."""
        return self._nodes

    @property
    @atomic
    def n_workers(self) -> int:
        """Length of every ``lengths`` array: the highest worker index ever used, plus one."""
        return len(self._table.slots)

    @property
    @atomic
    def workers(self) -> tuple[WorkerId, ...]:
        """The live workers, by index."""
        return self._table.live

    # -- workers --------------------------------------------------------------------------
    @atomic
    def add_worker(self, name: str, dp_rank: int = 0, *, capacity: int | None = None) -> WorkerId:
        """Register a worker and return its ``WorkerId``.

        Parameters
        ----------
        name : str
            The worker's name (an address, a pod name).
        dp_rank : int, default 0
            Its data-parallel rank; ``(name, dp_rank)`` must be new.
        capacity : int, optional
            Tokens the worker can hold. Given, the worker is *approximate*: the
            tree evicts its least recently used pages, deepest first, whenever it
            holds more. None (exact mode): the fleet reports every change.

        Returns
        -------
        WorkerId
            Its index is the lowest free one.

        Raises
        ------
        InputTypeError, InvalidInputError
            A bad name, rank or capacity.
        DuplicateWorkerError
            ``(name, dp_rank)`` is already registered.
        """
        worker = self._table.add(name, dp_rank, capacity)
        while len(self._held) <= worker.index:
            self._held.append(0)
            self._host_held.append(0)
            self._blocks.append({})
            self._hold_tokens.append(0)
        self._held[worker.index] = self._host_held[worker.index] = 0
        self._hold_tokens[worker.index] = 0
        self._blocks[worker.index] = {}
        return worker

    @atomic
    def remove_worker(self, worker: WorkerId) -> int:
        """Forget a worker: drop all its marks and free its index.

        Parameters
        ----------
        worker : WorkerId

        Returns
        -------
        int
            Tokens it held.

        Raises
        ------
        InputTypeError, StaleWorkerError
            ``worker`` is not a live worker of this tree.
        """
        index = self._table.resolve(worker)
        for hold in sorted(h for h, (i, _) in self._holds.items() if i == index):
            self._release(hold)  # its holds end first: nothing of it may outlive the index
        tokens = self._drop_all(index, (0, 1))
        self._table.remove(worker)
        return tokens

    @atomic
    def worker(self, name: str, dp_rank: int = 0) -> WorkerId:
        """The ``WorkerId`` registered as ``(name, dp_rank)``.

        Raises
        ------
        StaleWorkerError
            No such worker is registered.
        """
        return self._table.lookup(name, dp_rank)

    @atomic
    def capacity_of(self, worker: WorkerId) -> int | None:
        """The worker's capacity in tokens, or None for an exact worker."""
        return self._table.capacities[self._table.resolve(worker)]

    @atomic
    def set_capacity(self, worker: WorkerId, capacity: int) -> int:
        """Give an approximate worker another capacity; returns the tokens it drops.

        A smaller capacity trims the worker's pages at once by the insert-time
        rule (least recent first, deepest first among equals); a larger one
        keeps every page. Its host pages are not counted, as for ``insert``.

        Parameters
        ----------
        worker : WorkerId
            An approximate worker (one added with a capacity).
        capacity : int
            Tokens it can hold, in ``[0, 2**63)``.

        Returns
        -------
        int
            Device tokens the trim unmarked (0 when it still fits).

        Raises
        ------
        InputTypeError, StaleWorkerError
            ``worker`` is not a live worker of this tree, or ``capacity`` is not an int.
        InvalidInputError
            A negative or too large capacity, None, or an exact worker.
        """
        index = self._table.resize(worker, capacity)
        before = self._held[index]
        self._evict(index)
        return before - self._held[index]

    @atomic
    def held_tokens(self, worker: WorkerId, *, tier: int = 0) -> int:
        """Tokens the worker holds on ``tier``: 0 the device (the default), 1 the host."""
        index = self._table.resolve(worker)
        return (self._held if _blocks.check_tier(tier) == 0 else self._host_held)[index]

    # -- token paths ------------------------------------------------------------------------
    def _key_and_start(self, key: Any, start: Any) -> tuple[Tokens, int, int]:
        toks = _keys.tokens(key)
        p = self._page_size
        n = len(toks) - len(toks) % p
        s = _keys.check_int("start", start, 0)
        if s % p:
            msg = f"start must be a multiple of page_size ({p}), got {s}"
            raise InvalidInputError(msg)
        if s > n:
            msg = f"start = {s} is beyond the key's {n} whole-page tokens"
            raise InvalidInputError(msg)
        return toks, n, s

    def _common(self, label: Tokens, toks: Tokens, pos: int, n: int, tags: Tags) -> int:
        """Whole-page common prefix of an untagged ``label`` (beyond its first page, which
        the caller matched with its tag) and ``toks[pos:n]`` with its ``tags``."""
        p = self._page_size
        m = 0
        limit = min(len(label), n - pos)
        while m < limit and label[m] == toks[pos + m]:
            m += 1
        m -= m % p
        for k in range(p, m, p):  # a tagged page of the key leaves an untagged node there
            if self._tag(tags, pos + k):
                return k
        return m

    def _tag(self, tags: Tags, pos: int) -> int:
        """The tag of the key's page at token ``pos``."""
        return 0 if tags is None else tags[pos // self._page_size]

    def _child(self, node: _MetaNode, toks: Tokens, pos: int, tags: Tags) -> _MetaNode | None:
        """The child of ``node`` whose first page is the key's page at ``pos``, tag included."""
        return node.children.get((toks[pos : pos + self._page_size], self._tag(tags, pos)))

    def _approximate(self, index: int) -> bool:
        return self._table.capacities[index] is not None

    @atomic
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
        """Mark the pages of ``key`` from token ``start`` on as held by ``worker`` on ``tier``.

        The pages before ``start`` enter the tree as structure if they are
        missing, held by nobody new. An approximate worker's pages of the key
        are refreshed, then it is trimmed to its capacity.

        Parameters
        ----------
        key : sequence of int or 1-D integer array
            Token ids; the tail shorter than a page is ignored.
        worker : WorkerId
        start : int, default 0
            A multiple of ``page_size``, at most the key's whole-page length.
        tier : int, default 0
            0: the device; 1: the host (pages a worker keeps off the device:
            counted by ``host_lengths``, never by an approximate capacity).
        extras : sequence of int, 1-D integer array, or None
            One extra tag per whole page of the key, in ``[0, 2**64)``: what
            the engine hashed besides the tokens (multimodal inputs); pages
            with equal tokens and different tags are different pages. None
            means every tag is 0.
        namespace : hashable, default None
            The namespace of the key (a LoRA adapter, a cache salt): pages of
            different namespaces never share a node.

        Returns
        -------
        int
            Pages newly marked (counted before any eviction).

        Raises
        ------
        InputTypeError, InvalidInputError, StaleWorkerError
            A bad worker, key, start, tier, extras or namespace; nothing changes.
        """
        index = self._table.resolve(worker)
        toks, n, start = self._key_and_start(key, start)
        tier = _blocks.check_tier(tier)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        index = self._table.resolve(worker)  # conversion may have run code that removed it
        self._clock += 1
        root = self._roots.get(namespace)
        if root is None:
            if start >= n:
                return 0  # nothing to mark: an empty namespace costs nothing
            root = self._roots[namespace] = _MetaNode(None, (), 0, namespace)
        # Recency and capacity are the device's: host marks neither cut nor evict.
        approximate = self._approximate(index) and tier == 0
        p = self._page_size
        newly = 0
        node, pos = root, 0
        missing = False  # the key leaves the tree at a node boundary, at pos < n
        while pos < n:
            child = self._child(node, toks, pos, tags)
            if child is None:
                missing = True
                break
            m = self._common(child.label, toks, pos, n, tags)
            holds = index in self._tier(child, tier)
            if m < len(child.label) and pos + m < n and (start < n or (approximate and holds)):
                # A new branch hangs here, or the worker's recency differs on the two parts.
                child = self._cut(child, m)
            end = pos + len(child.label)
            if not holds:
                lo, hi = max(start, pos), min(n, end)
                if lo < hi:
                    if lo > pos:
                        self._cut(child, lo - pos)  # child keeps [lo, end)
                    if hi < end:
                        child = self._cut(child, hi - lo)  # the new upper node is [lo, hi)
                    self._mark(child, index, tier)
                    newly += (hi - lo) // p
            elif approximate and n < end:
                child = self._cut(child, len(child.label) - (end - n))  # recency differs
            if child.depth != pos + m:
                break  # the key ends, or leaves the tree, inside this node
            node, pos = child, child.depth
        if missing and start < n:
            if pos < start:
                node = self._new_path(node, toks, pos, start, tags, None, tier)  # nobody new
                pos = start
            self._new_path(node, toks, pos, n, tags, index, tier)
            newly += (n - pos) // p
        if approximate:
            self._refresh_path(index, root, toks, n, tags)
            self._evict(index)
        return newly

    @atomic
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
        """Unmark the pages of ``key`` from token ``start`` on for ``worker`` on ``tier``.

        Pages the worker does not hold are skipped, so repeating a remove is
        harmless. Nodes left with no holders and no children are freed.

        Parameters
        ----------
        key : sequence of int or 1-D integer array
        worker : WorkerId
        start : int, default 0
            A multiple of ``page_size``, at most the key's whole-page length.
        tier : int, default 0
            0: the device; 1: the host (pages a worker keeps off the device:
            counted by ``host_lengths``, never by an approximate capacity).
        extras : sequence of int, 1-D integer array, or None
            One extra tag per whole page of the key, in ``[0, 2**64)``: what
            the engine hashed besides the tokens (multimodal inputs); pages
            with equal tokens and different tags are different pages. None
            means every tag is 0.
        namespace : hashable, default None
            The namespace of the key (a LoRA adapter, a cache salt): pages of
            different namespaces never share a node.

        Returns
        -------
        int
            Pages unmarked.

        Raises
        ------
        InputTypeError, InvalidInputError, StaleWorkerError
            A bad worker, key, start, tier, extras or namespace; nothing changes.
        """
        index = self._table.resolve(worker)
        toks, n, start = self._key_and_start(key, start)
        tier = _blocks.check_tier(tier)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        index = self._table.resolve(worker)  # conversion may have run code that removed it
        p = self._page_size
        removed = 0
        node, pos = self._roots.get(namespace), 0
        while node is not None and pos < n:
            child = self._child(node, toks, pos, tags)
            if child is None:
                break
            m = self._common(child.label, toks, pos, n, tags)
            end = pos + len(child.label)
            through = m == len(child.label)
            if index in self._tier(child, tier):
                lo, hi = max(start, pos), pos + m  # the key's pages inside this node
                if lo < hi:
                    if lo > pos:
                        self._cut(child, lo - pos)
                    if hi < end:
                        child = self._cut(child, hi - lo)
                    self._unmark(child, index, tier)
                    removed += (hi - lo) // p
            if not through:
                break
            node, pos = child, end
        self._free_unused()
        return removed

    @atomic
    def match(
        self,
        key: Any,
        *,
        touch: bool = False,
        extras: Any = None,
        namespace: Hashable = None,
        optimistic: bool = True,
        cursor: bool = False,
    ) -> MetaMatch:
        """Every worker's matched length of ``key``, in one walk.

        A worker's length is the longest prefix of the key whose every page,
        from the first, it holds (the gap rule).

        Parameters
        ----------
        key : sequence of int or 1-D integer array
        touch : bool, default False
            Refresh the counted pages of every approximate worker.
        extras : sequence of int, 1-D integer array, or None
            One extra tag per whole page of the key, in ``[0, 2**64)``: what
            the engine hashed besides the tokens (multimodal inputs); pages
            with equal tokens and different tags are different pages. None
            means every tag is 0.
        namespace : hashable, default None
            The namespace to match in; in one that holds nothing every length is 0.
        optimistic : bool, default True
            Count the pages a worker has a hold on (see :meth:`hold`) as held.
        cursor : bool, default False
            Keep the key and the walk, so that ``MetaMatch.insert`` and
            ``MetaMatch.hold`` mark it for the worker chosen after the match.

        Returns
        -------
        MetaMatch

        Raises
        ------
        InputTypeError, InvalidInputError
            A bad key, touch, optimistic, cursor, extras or namespace; nothing changes.
        """
        toks = _keys.tokens(key)
        touch = _check_touch(touch)
        optimistic = _keys.check_flag("optimistic", optimistic)
        cursor = _keys.check_flag("cursor", cursor)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        m = self._match(toks, tags, touch, namespace, optimistic)
        if cursor:
            m._cursor = (self, toks, tags, namespace)
        return m

    @atomic
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
        """Matched lengths of many keys, as ``match`` would give them one after the other.

        Parameters
        ----------
        keys : sequence of keys, or 2-D integer array (one key per row)
        touch : bool, default False
        tier : int, default 0
            Which lengths: 0, of pages held on the device (``MetaMatch.lengths``);
            1, on the device or the host (``MetaMatch.host_lengths``).
        extras : sequence, 2-D integer array, or None
            One entry per key: its extra tags (as ``match`` takes them) or None.
        namespace : hashable, default None
            The namespace of every key.
        optimistic : bool, default True
            Count holds, as ``match`` does.

        Returns
        -------
        numpy.ndarray
            ``int64``, shape ``(len(keys), n_workers)``.

        Raises
        ------
        InputTypeError, InvalidInputError
            A bad ``keys``, a bad key, touch, extras or namespace; every key is
            checked before any is matched, so nothing changes.
        """
        if isinstance(keys, np.ndarray) and keys.ndim == 2 and keys.dtype.kind in "iu":
            rows: list[Any] = list(keys)
        elif (
            isinstance(keys, (str, bytes))
            or not hasattr(keys, "__len__")
            or (isinstance(keys, np.ndarray) and keys.ndim == 0)
        ):
            msg = f"keys must be a sequence of keys, got {type(keys).__name__}"
            raise InputTypeError(msg)
        else:
            rows = list(keys)
        converted = [_keys.tokens(row) for row in rows]
        touch = _check_touch(touch)
        tier = _blocks.check_tier(tier)
        optimistic = _keys.check_flag("optimistic", optimistic)
        per_key = _keys.per_key_tags(extras, len(converted))
        tags = [self._key_tags(per_key[r], t, f"extras[{r}]") for r, t in enumerate(converted)]
        _keys.check_namespace(namespace)
        out = np.zeros((len(converted), len(self._table.slots)), dtype=np.int64)
        for r, toks in enumerate(converted):
            m = self._match(toks, tags[r], touch, namespace, optimistic)
            out[r] = m.lengths if tier == 0 else m.host_lengths
        return out

    def _key_tags(self, extras: Any, toks: Tokens, name: str = "extras") -> Tags:
        """A key's extra tags, one per whole page (None: all 0)."""
        return _keys.tags(extras, len(toks) // self._page_size, _PER_PAGE, name)

    def _match(
        self, toks: Tokens, tags: Tags, touch: bool, namespace: Hashable, optimistic: bool = True
    ) -> MetaMatch:
        p = self._page_size
        n = len(toks) - len(toks) % p
        slots = self._table.slots
        lengths = np.zeros(len(slots), dtype=np.int64)
        host_lengths = np.zeros(len(slots), dtype=np.int64)
        counting = {i for i, w in enumerate(slots) if w is not None}
        either = set(counting)  # still counting pages held on the device or the host
        path: list[_MetaNode] = []
        node, pos = self._roots.get(namespace), 0
        partial = False
        while node is not None and pos < n:
            child = self._child(node, toks, pos, tags)
            if child is None:
                break
            m = self._common(child.label, toks, pos, n, tags)
            held = child.holders | child.holds.keys() if optimistic else child.holders
            counting &= held
            for i in counting:
                lengths[i] += m
            either &= held | child.host
            for i in either:
                host_lengths[i] += m
            path.append(child)
            pos += m
            if m < len(child.label):
                partial = True
                break
            node = child
        if touch:
            self._clock += 1
            approximate = [i for i, w in enumerate(slots) if w is not None and self._approximate(i)]
            if partial and any(lengths[i] == pos for i in approximate):
                # Some approximate worker counts into the last node up to the match's end:
                # only that part of it takes the new stamp.
                last = path[-1]
                path[-1] = self._cut(last, len(last.label) - (last.depth - pos))
            for i in approximate:
                for x in path:
                    if x.depth > lengths[i]:
                        break
                    x.stamps[i] = self._clock
        best = best_of(slots, lengths)
        top = 0 if best is None else best[1]
        key = None
        if top:
            tag = 0 if tags is None else tags[top // p - 1]
            key = _holds.prefix_key(top, toks[top - p : top], tag, namespace)
        return MetaMatch(lengths, host_lengths, pos, slots, prefix_key=key)

    # -- holds: the router's optimistic marks --------------------------------------------------
    @atomic
    def hold(
        self, key: Any, worker: WorkerId, *, extras: Any = None, namespace: Hashable = None
    ) -> int:
        """Hold every whole page of ``key`` for exact ``worker`` until :meth:`release`.

        A hold is the router's optimistic mark for a request in flight: a
        match counts the pages as the worker's (unless ``optimistic=False``),
        while the worker's marks, held tokens, dump and block map stay what the
        fleet reported. Holds are counted per (page, worker), so two requests
        of one prefix hold it twice. The key's pages missing from the tree
        enter it, held by nobody, and stay while some hold covers them.

        Parameters
        ----------
        key : sequence of int or 1-D integer array
        worker : WorkerId
            An exact worker (an approximate one's inserts already are the router's model).
        extras : sequence of int, 1-D integer array, or None
            One extra tag per whole page of the key, as for :meth:`insert`.
        namespace : hashable, default None

        Returns
        -------
        int
            The hold's id, for :meth:`release`. Ids are never reused.

        Raises
        ------
        InputTypeError, InvalidInputError, StaleWorkerError
            A bad worker, key, extras or namespace; nothing changes.
        WorkerError
            ``worker`` is approximate.
        """
        index = self._table.resolve(worker)
        if self._approximate(index):
            raise _holds.approximate_hold(worker)
        toks = _keys.tokens(key)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        index = self._table.resolve(worker)  # conversion may have run code that removed it
        return self._hold(toks, tags, index, namespace)

    @atomic
    def _hold_checked(
        self, toks: Tokens, tags: Tags, worker: WorkerId, namespace: Hashable
    ) -> int:
        """``hold`` of a key and tags converted already (a cursor's)."""
        index = self._table.resolve(worker)
        if self._approximate(index):
            raise _holds.approximate_hold(worker)
        return self._hold(toks, tags, index, namespace)

    @atomic
    def _insert_checked(
        self, toks: Tokens, tags: Tags, worker: WorkerId, tier: int, namespace: Hashable
    ) -> int:
        """``insert`` of a key and tags converted already (a cursor's)."""
        return self.insert(toks, worker, tier=tier, extras=tags, namespace=namespace)

    def _hold(self, toks: Tokens, tags: Tags, index: int, namespace: Hashable) -> int:
        p = self._page_size
        n = len(toks) - len(toks) % p
        last: _MetaNode | None = None
        if n:
            root = self._roots.get(namespace)
            if root is None:
                root = self._roots[namespace] = _MetaNode(None, (), 0, namespace)
            node, pos = root, 0
            while pos < n:
                child = self._child(node, toks, pos, tags)
                if child is None:
                    break
                m = self._common(child.label, toks, pos, n, tags)
                if m < len(child.label):
                    child = self._cut(child, m)  # the key ends or leaves the tree inside it
                node, pos = child, child.depth
            if pos < n:
                node = self._new_path(node, toks, pos, n, tags, None, 0)
            last = node
            walk: _MetaNode | None = node
            while walk is not None and walk.parent is not None:
                count = walk.holds.get(index, 0)
                if not count:
                    self._hold_tokens[index] += len(walk.label)
                walk.holds[index] = count + 1
                walk = walk.parent
        hold = self._next_hold
        self._next_hold += 1
        self._holds[hold] = (index, last)
        return hold

    @atomic
    def release(self, hold: int) -> int:
        """End a hold.

        Parameters
        ----------
        hold : int
            An id that :meth:`hold` returned.

        Returns
        -------
        int
            The pages its worker no longer holds by any hold. Nodes left with
            no holders, no holds and no children are freed.

        Raises
        ------
        InputTypeError, InvalidInputError
            ``hold`` is not an integer >= 0.
        StaleHoldError
            ``hold`` is not live: released already, its worker removed (which
            ends its holds), or never handed out.
        """
        h = _holds.check_hold(hold)
        if h not in self._holds:
            raise _holds.stale_hold(h)
        return self._release(h)

    def _release(self, hold: int) -> int:
        index, node = self._holds.pop(hold)
        pages = 0
        walk = node
        while walk is not None and walk.parent is not None:
            walk.holds[index] -= 1
            if not walk.holds[index]:
                del walk.holds[index]
                self._hold_tokens[index] -= len(walk.label)
                pages += len(walk.label) // self._page_size
            walk = walk.parent
        self._free_unused()
        return pages

    @property
    @atomic
    def has_host_pages(self) -> bool:
        """Whether some worker holds a page on the host (else host lengths are the lengths)."""
        return any(self._host_held)

    @property
    @atomic
    def hold_count(self) -> int:
        """Holds not released yet."""
        return len(self._holds)

    @atomic
    def hold_tokens(self, worker: WorkerId) -> int:
        """Tokens of the pages ``worker`` holds by some hold (each page once)."""
        return self._hold_tokens[self._table.resolve(worker)]

    # -- engine block events ----------------------------------------------------------------
    @atomic
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
        """Apply a KV ``BlockStored`` event: the worker now holds these blocks.

        Parameters
        ----------
        worker : WorkerId
        parent_hash : int or None
            Hash of the block the first new block follows; None for the root.
        block_hashes : sequence of int or 1-D integer array
            One hash per block, in ``[-2**63, 2**64)`` (signed read as two's complement).
        token_ids : sequence of int or 1-D integer array
            Exactly ``len(block_hashes) * page_size`` tokens.
        tier : int, default 0
            0: the worker holds the blocks on the device; 1: on the host (vLLM's
            ``medium="CPU"``, SGLang's HiCache). A worker may hold a block on both.
        extras : sequence of int, 1-D integer array, or None
            One extra tag per block, in ``[0, 2**64)``: what the engine hashed
            besides the tokens (multimodal inputs); None means every tag is 0.
        namespace : hashable, default None
            The blocks' namespace (a LoRA adapter, a cache salt); the parent
            must be a block of the same namespace.

        Returns
        -------
        int
            Pages newly marked (0 for a repeated event).

        Raises
        ------
        UnknownParentError, BlockConflictError, InvalidInputError, InputTypeError, StaleWorkerError
            The event is refused whole; nothing changes.
        """
        self._table.resolve(worker)  # first: a stale worker is the error to report
        options = {"tier": _blocks.check_tier(tier), "extras": extras, "namespace": namespace}
        return self._store(
            *self._converted_stored(worker, parent_hash, block_hashes, token_ids, options)
        )

    def _converted_stored(
        self,
        worker: WorkerId,
        parent_hash: Any,
        block_hashes: Any,
        token_ids: Any,
        options: dict[str, Any],
    ) -> tuple[WorkerId, int | None, list[int], tuple[int, ...], Tags, Hashable, int]:
        """A stored event's arguments (``options``: its keyword arguments), converted and
        checked for shape (no tree read)."""
        self._table.resolve(worker)
        parent = _blocks.parent_hash(parent_hash)
        hashes = _blocks.block_hashes(block_hashes)
        toks = _keys.tokens(token_ids)
        tier = _blocks.check_tier(options.get("tier", 0))
        tags = _keys.tags(options.get("extras"), len(hashes), _keys.PER_BLOCK)
        namespace = _keys.check_namespace(options.get("namespace"))
        p = self._page_size
        if len(toks) != len(hashes) * p:
            raise _blocks.bad_token_count(len(toks), len(hashes), p)
        return worker, parent, hashes, toks, tags, namespace, tier

    def _store(
        self,
        worker: WorkerId,
        parent: int | None,
        hashes: list[int],
        toks: tuple[int, ...],
        tags: Tags,
        namespace: Hashable,
        tier: int,
    ) -> int:
        """Check a converted stored event against the tree, then apply it whole."""
        index = self._table.resolve(worker)  # conversion may have run code that removed it
        p = self._page_size
        bmap = self._blocks[index]
        if parent is not None and (parent not in bmap or bmap[parent].namespace != namespace):
            raise _blocks.unknown_parent(worker, parent, namespace)
        root = self._roots.get(namespace)
        base_node = root if parent is None else bmap[parent]
        base = () if base_node is None else self._path(base_node)
        block_tags = (0,) * len(hashes) if tags is None else tags
        path_tags = (() if base_node is None else self._path_tags(base_node)) + block_tags
        seen: set[int] = set()
        for i, h in enumerate(hashes):
            if h == parent:
                raise _blocks.cycle(i, h)
            if h in seen:
                raise _blocks.repeated_hash(i, h)
            seen.add(h)
            named = bmap.get(h)
            page = base + toks[: (i + 1) * p]
            page_tags = path_tags[: len(page) // p]
            if named is not None and (
                named.namespace != namespace
                or self._path(named) != page
                or self._path_tags(named) != page_tags
            ):
                raise _blocks.names_other_page(worker, i, h)
            # Within a worker a page has one name: a second one is refused, not a rename.
            here = self._find_page(root, page, page_tags) if named is None and root else None
            old = here.hashes.get(index) if here is not None and here.depth == len(page) else None
            if old is not None:
                raise _blocks.renamed_block(worker, i, h, old)
        self._clock += 1
        if not hashes:
            return 0
        if base_node is None:
            base_node = self._roots[namespace] = _MetaNode(None, (), 0, namespace)
        newly = 0
        node = base_node
        for i, h in enumerate(hashes):
            page = toks[i * p : (i + 1) * p]
            child = node.children.get((page, block_tags[i]))
            if child is None:
                child = self._new_leaf(node, page, block_tags[i])
            elif len(child.label) > p:
                child = self._cut(child, p)
            if index not in self._tier(child, tier):
                self._mark(child, index, tier)
                newly += 1
            self._bind(child, index, h)
            node = child
        if self._approximate(index) and tier == 0:  # a host event is no use of the device
            walk: _MetaNode | None = node
            while walk is not None and walk.parent is not None:
                if index in walk.holders:
                    walk.stamps[index] = self._clock
                walk = walk.parent
            self._evict(index)
        return newly

    @atomic
    def apply_removed(self, worker: WorkerId, block_hashes: Any, *, tier: int = 0) -> int:
        """Apply a KV ``BlockRemoved`` event; hashes the worker does not hold are skipped.

        A hash is found in whichever namespace holds it (removals carry no LoRA or salt).

        Parameters
        ----------
        worker : WorkerId
        block_hashes : sequence of int or 1-D integer array
        tier : int, default 0
            The tier the blocks leave; a block the worker still holds on the
            other tier keeps its hash.

        Returns
        -------
        int
            Pages unmarked.

        Raises
        ------
        InvalidInputError, InputTypeError, StaleWorkerError
            A bad worker, tier or hash; nothing changes.
        """
        self._table.resolve(worker)
        tier = _blocks.check_tier(tier)
        return self._unstore(worker, _blocks.block_hashes(block_hashes), tier)

    def _unstore(self, worker: WorkerId, hashes: list[int], tier: int) -> int:
        """Apply a converted removed event."""
        index = self._table.resolve(worker)  # conversion may have run code that removed it
        bmap = self._blocks[index]
        removed = 0
        for h in hashes:
            node = bmap.get(h)
            if node is not None and index in self._tier(node, tier):
                self._unmark(node, index, tier)
                removed += 1
        self._free_unused()
        return removed

    @atomic
    def apply_cleared(self, worker: WorkerId, *, tier: int | None = None) -> int:
        """Apply a KV ``AllBlocksCleared`` event: the worker holds nothing any more.

        Parameters
        ----------
        worker : WorkerId
        tier : int or None, default None
            The tier that is cleared; None (what an ``AllBlocksCleared`` event
            means) clears both.

        Returns
        -------
        int
            Tokens unmarked (token-path marks included).
        """
        index = self._table.resolve(worker)
        return self._drop_all(index, _blocks.check_tiers(tier))

    @atomic
    def apply_events(self, records: Any) -> npt.NDArray[np.int8]:
        """Apply event records in order, each atomically; a failing record stops nothing.

        Every record is converted first, then all are applied: the code of the
        caller's objects (``__index__``, sequences) runs before the tree
        changes, so an exception that is not an ``Exception`` (an interrupt)
        leaves the tree as it was, and any other one becomes a status.

        Parameters
        ----------
        records : iterable of tuples
            ``("stored", worker, parent_hash, block_hashes, token_ids)``,
            ``("removed", worker, block_hashes)`` or ``("cleared", worker)``,
            each optionally followed by a dict of the keyword arguments of the
            method it stands for (a stored record's ``{"tier": 1, "extras": ...,
            "namespace": ...}``, a removed or cleared record's ``{"tier": 1}``).

        Returns
        -------
        numpy.ndarray
            ``int8`` :class:`~radixmeta.BlockStatus` per record.

        Raises
        ------
        InputTypeError
            ``records`` is not iterable.
        """
        if isinstance(records, (str, bytes)) or not isinstance(records, Iterable):
            msg = f"records must be a sequence of event records, got {type(records).__name__}"
            raise InputTypeError(msg)
        statuses: list[int] = []
        prepared: list[tuple[Any, ...] | None] = []
        for record in records:
            try:
                prepared.append(self._prepared_record(record))
            except Exception as exc:  # any failure is that record's status
                prepared.append(None)
                statuses.append(int(_blocks.record_status(exc)))
            else:
                statuses.append(int(_blocks.BlockStatus.APPLIED))
        for i, step in enumerate(prepared):
            if step is None:
                continue
            try:
                step[0](*step[1:])
            except Exception as exc:  # raised by the tree's checks, before any change
                statuses[i] = int(_blocks.record_status(exc))
        return np.array(statuses, dtype=np.int8)

    def _prepared_record(self, record: Any) -> tuple[Any, ...]:
        """(apply function, converted arguments) of one event record."""
        if isinstance(record, (tuple, list)) and record:
            kind, size = record[0], len(record)
            # The base fields, then optionally a dict of the method's keyword arguments.
            base = _blocks.RECORD_FIELDS.get(kind) if type(kind) is str else None
            if base is not None and size in (base, base + 1):
                self._table.resolve(record[1])  # first: a stale worker is the error to report
                options = _blocks.record_options(kind, record[base], record) if size > base else {}
                if kind == "stored":
                    _, worker, parent, hashes, tokens = record[:5]
                    converted = self._converted_stored(worker, parent, hashes, tokens, options)
                    return (self._store, *converted)
                if kind == "removed":
                    hashes = _blocks.block_hashes(record[2])
                    tier = _blocks.check_tier(options.get("tier", 0))
                    return (self._unstore, record[1], hashes, tier)
                tiers = _blocks.check_tiers(options.get("tier"))
                return (self._clear, record[1], tiers)
        raise _blocks.not_a_record(record)

    # -- whole tree -----------------------------------------------------------------------------
    @atomic
    def items(self, worker: WorkerId | None = None) -> list[MetaItem]:
        """One :class:`~radixmeta.MetaItem` per node.

        Namespace by namespace in :meth:`namespaces` order, each depth first
        with children in lexicographic order.

        Parameters
        ----------
        worker : WorkerId, optional
            Only the nodes this worker holds.

        Returns
        -------
        list of MetaItem
            The ``uint32`` path from the namespace's root to the node's end,
            the workers holding the node by ascending index, and its namespace.
        """
        index = None if worker is None else self._table.resolve(worker)
        slots = self._table.slots
        out: list[MetaItem] = []
        for node, path in self._in_order():
            if index is None or index in node.holders or index in node.host:
                holders = tuple(w for i in sorted(node.holders) if (w := slots[i]) is not None)
                host = tuple(w for i in sorted(node.host) if (w := slots[i]) is not None)
                key = np.array(path, dtype=np.uint32)
                out.append(MetaItem(key, holders, node.namespace, self._extras(node), host))
        return out

    @atomic
    def dump(self, worker: WorkerId) -> list[DumpRecord]:
        """Records that rebuild the worker's pages through :meth:`insert`.

        One :class:`~radixmeta.DumpRecord` per node the worker holds: in
        ``items()`` order for an exact worker, least recent first (its eviction
        order) for an approximate one, so that replaying them in order restores
        its recency order too.
        """
        index = self._table.resolve(worker)
        held = [(node, path) for node, path in self._in_order() if index in node.holders]
        if self._approximate(index):
            held.sort(key=lambda entry: (entry[0].stamps[index], -entry[0].depth))
        host = [(node, path) for node, path in self._in_order() if index in node.host]
        return [
            DumpRecord(
                np.array(path, dtype=np.uint32),
                node.depth - len(node.label),
                node.namespace,
                self._extras(node),
                tier,
            )
            for tier, records in enumerate((held, host))  # the device's first: its recency
            for node, path in records
        ]

    @atomic
    def namespaces(self) -> list[Hashable]:
        """Namespaces that hold a page, in order of creation (None, the default, always first)."""
        return list(self._roots)

    @atomic
    def memory_usage(self) -> int:
        """Estimated bytes held by the Python objects of the tree (rough)."""
        total = sys.getsizeof(self) + sys.getsizeof(self._held) + sys.getsizeof(self._blocks)
        total += sum(sys.getsizeof(bmap) for bmap in self._blocks)
        for node in self._all_nodes():
            total += sys.getsizeof(node) + sys.getsizeof(node.label) + sys.getsizeof(node.children)
            total += sys.getsizeof(node.holders) + sys.getsizeof(node.host)
            total += sys.getsizeof(node.stamps)
            total += sys.getsizeof(node.hashes) + sys.getsizeof(node.holds)
        return total + sys.getsizeof(self._holds)

    @atomic
    def check(self) -> None:
        """Verify every invariant in O(n + marks); raises AssertionError on a violation."""
        p = self._page_size
        slots = self._table.slots
        _require(next(iter(self._roots)) is None, "the default namespace is not first")
        for namespace, root in self._roots.items():
            _require(
                root.parent is None and not root.label and not root.depth
                and root.namespace == namespace,
                "a root is malformed",
            )
            held_root = root.holders or root.host or root.stamps or root.hashes
            _require(not held_root, "a root is held")
            _require(namespace is None or bool(root.children), "an emptied namespace kept its root")
        held = [0] * len(self._held)
        host_held = [0] * len(self._held)
        hold_tokens = [0] * len(self._held)
        counted: dict[tuple[int, int], int] = {}  # (id of a node, worker index) -> holds
        stamp_keys: list[set[tuple[int, int]]] = [set() for _ in self._held]
        reachable: set[int] = set()
        nodes = 0
        for node in self._all_nodes():
            if node.parent is None:
                continue
            nodes += 1
            reachable.add(id(node))
            parent = node.parent
            _require(parent is not None, "a node has no parent")
            assert parent is not None
            label = node.label
            _require(len(label) > 0 and len(label) % p == 0, "a label is not whole pages")
            _require(all(0 <= t < _keys.TOKEN_LIMIT for t in label), "a token is out of range")
            filed = parent.children.get((label[:p], node.tag))
            _require(filed is node, "a child is filed under the wrong key")
            _require(not node.tag or len(label) == p, "a tagged page is not a one-page node")
            _require(node.depth == parent.depth + len(label), "a depth is wrong")
            _require(node.namespace == parent.namespace, "a node is in another namespace")
            _require(
                bool(node.holders or node.host or node.holds or node.children),
                "a node has no holders, no holds and no children",
            )
            for i, count in node.holds.items():
                _require(count > 0, "a hold count is not positive")
                live = i < len(slots) and slots[i] is not None
                exact = live and not self._approximate(i)
                _require(exact, "a hold of a dead or approximate worker")
                hold_tokens[i] += len(label)
                counted[id(node), i] = count
            for i in node.host:
                _require(i < len(slots) and slots[i] is not None, "a node is held by a dead worker")
                host_held[i] += len(label)
            for i in node.holders:
                _require(i < len(slots) and slots[i] is not None, "a node is held by a dead worker")
                held[i] += len(label)
                if self._approximate(i):
                    _require(i in node.stamps, "an approximate holder has no stamp")
                    stamp_keys[i].add((node.stamps[i], node.depth))
            _require(set(node.stamps) <= node.holders, "a stamp of a worker that does not hold it")
            _require(all(self._approximate(i) for i in node.stamps), "an exact worker has a stamp")
            for i, h in node.hashes.items():
                holds = i in node.holders or i in node.host
                _require(holds, "a hash of a worker that does not hold the page")
                _require(len(label) == p, "a hashed page is not a one-page node")
                _require(self._blocks[i].get(h) is node, "a node's hash does not map back to it")
        _require(nodes == self._nodes, "node_count is wrong")
        expected: dict[tuple[int, int], int] = {}
        for hold, (i, last) in self._holds.items():
            _require(0 <= hold < self._next_hold, "a hold id was never handed out")
            _require(i < len(slots) and slots[i] is not None, "a hold of a dead worker")
            walk = last
            while walk is not None and walk.parent is not None:
                _require(id(walk) in reachable, "a hold covers a freed node")
                expected[id(walk), i] = expected.get((id(walk), i), 0) + 1
                walk = walk.parent
        _require(counted == expected, "hold counts differ from the holds that cover each node")
        _require(hold_tokens == self._hold_tokens, "a worker's hold tokens are wrong")
        for i, tokens in enumerate(held):
            _require(self._held[i] == tokens, "a worker's held tokens are wrong")
            _require(self._host_held[i] == host_held[i], "a worker's host tokens are wrong")
            live = i < len(slots) and slots[i] is not None
            gone = tokens == 0 and host_held[i] == 0 and not self._blocks[i]
            _require(live or gone, "a dead worker holds pages")
            for h, node in self._blocks[i].items():
                _require(id(node) in reachable, "a block hash names a freed node")
                _require(node.hashes.get(i) == h, "a block hash names a node not bound to it")
            if live and self._approximate(i):
                capacity = self._table.capacities[i]
                assert capacity is not None
                _require(tokens <= capacity, "an approximate worker exceeds its capacity")
                count = sum(1 for node in self._all_nodes() if i in node.holders)
                _require(len(stamp_keys[i]) == count, "two nodes of a worker tie in recency")

    # -- pickle support ---------------------------------------------------------------------------
    @atomic
    def _block_entries(
        self, worker: WorkerId
    ) -> list[tuple[int, npt.NDArray[np.uint32], Hashable, npt.NDArray[np.uint64] | None]]:
        """(hash, path to the page end, namespace, extras) for every block hash of the worker,
        by hash."""
        bmap = self._blocks[self._table.resolve(worker)]
        return [
            (
                h,
                np.array(self._path(bmap[h]), dtype=np.uint32),
                bmap[h].namespace,
                self._extras(bmap[h]),
            )
            for h in sorted(bmap)
        ]

    @atomic
    def _bind_hash(
        self,
        worker: WorkerId,
        key: Any,
        block_hash: Any,
        namespace: Hashable = None,
        extras: Any = None,
    ) -> None:
        """Name the worker's page ending at the end of ``key`` by ``block_hash``."""
        index = self._table.resolve(worker)
        h = _blocks.block_hash(block_hash, "block_hash")
        toks = _keys.tokens(key)
        tags = self._key_tags(extras, toks)
        _keys.check_namespace(namespace)
        index = self._table.resolve(worker)  # conversion may have run code that removed it
        p = self._page_size
        root = self._roots.get(namespace)
        whole = bool(toks) and len(toks) % p == 0
        node = self._find_page(root, toks, tags) if root is not None and whole else None
        if node is None or (index not in node.holders and index not in node.host):
            msg = "the worker holds no page ending at the end of key"
            raise InvalidInputError(msg)
        length = len(toks)
        if node.depth > length:
            node = self._cut(node, len(node.label) - (node.depth - length))
        if len(node.label) > p:
            self._cut(node, len(node.label) - p)  # node keeps its last page
        old = self._blocks[index].get(h)
        if old is not None and old is not node:
            del old.hashes[index]
            del self._blocks[index][h]
        self._bind(node, index, h)

    @atomic
    def _worker_state(self) -> tuple[Any, ...]:
        """The worker registry's state, for pickling."""
        return self._table.state()

    @atomic
    def _pickle_state(self) -> tuple[Any, list[Any]]:
        """Registry, and per live worker its dump and block hashes, read in one locked step."""
        workers = [(w.index, self.dump(w), self._block_entries(w)) for w in self._table.live]
        return self._table.state(), workers
    @atomic
    def _adopt_table(self, state: tuple[Any, ...]) -> None:
        """Take over a pickled worker registry (the tree must have no workers yet)."""
        if self._table.slots:
            msg = "_adopt_table needs a tree without workers"
            raise RuntimeError(msg)
        table = WorkerTable.from_state(state)
        self._table = table
        self._held = [0] * len(table.capacities)
        self._host_held = [0] * len(table.capacities)
        self._blocks = [{} for _ in table.capacities]
        self._hold_tokens = [0] * len(table.capacities)

    # -- helpers ------------------------------------------------------------------------------
    def _all_nodes(self) -> Iterator[_MetaNode]:
        """Every node, the roots included."""
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _in_order(self) -> list[tuple[_MetaNode, Tokens]]:
        """(node, path to its end) for every node but the roots: namespace by namespace,
        each depth first with children sorted."""
        out: list[tuple[_MetaNode, Tokens]] = []
        for root in self._roots.values():
            stack: list[tuple[_MetaNode, Tokens]] = [
                (child, child.label) for _, child in sorted(root.children.items(), reverse=True)
            ]
            while stack:
                node, path = stack.pop()
                out.append((node, path))
                for _, child in sorted(node.children.items(), reverse=True):
                    stack.append((child, path + child.label))
        return out

    def _path_tags(self, node: _MetaNode) -> tuple[int, ...]:
        """The extra tags of the pages from the root to the end of ``node``, one per page."""
        tags: list[int] = []
        walk: _MetaNode | None = node
        while walk is not None and walk.parent is not None:
            tags.extend([0] * (len(walk.label) // self._page_size - 1) + [walk.tag])
            walk = walk.parent
        return tuple(reversed(tags))

    def _extras(self, node: _MetaNode) -> npt.NDArray[np.uint64] | None:
        """``_path_tags`` as records give it: a uint64 array, or None when all are 0."""
        tags = self._path_tags(node)
        return np.array(tags, dtype=np.uint64) if any(tags) else None

    def _path(self, node: _MetaNode) -> Tokens:
        parts: list[Tokens] = []
        walk: _MetaNode | None = node
        while walk is not None:
            parts.append(walk.label)
            walk = walk.parent
        return tuple(t for part in reversed(parts) for t in part)

    def _find_page(self, root: _MetaNode, toks: Tokens, tags: Tags) -> _MetaNode | None:
        """The node below ``root`` containing the page that ends at ``len(toks)``, if any."""
        node, pos = root, 0
        n = len(toks)
        while pos < n:
            child = self._child(node, toks, pos, tags)
            if child is None:
                return None
            m = self._common(child.label, toks, pos, n, tags)
            if pos + m < min(n, child.depth):
                return None  # the key leaves the tree inside this node
            if child.depth >= n:
                return child
            node, pos = child, child.depth
        return None

    def _cut(self, node: _MetaNode, m: int) -> _MetaNode:
        """Cut ``node`` after ``m`` tokens; return the new upper node (the lower keeps ``node``)."""
        parent = node.parent
        p = self._page_size
        assert parent is not None and 0 < m < len(node.label) and m % p == 0
        assert not node.hashes and not node.tag, "a one-page node is never cut"
        upper = _MetaNode(parent, node.label[:m], node.depth - len(node.label) + m, node.namespace)
        upper.holders = set(node.holders)
        upper.host = set(node.host)
        upper.stamps = dict(node.stamps)
        upper.holds = dict(node.holds)  # the same holds cover both parts
        parent.children[node.label[:p], 0] = upper
        node.label = node.label[m:]
        node.parent = upper
        upper.children[node.label[:p], 0] = node
        self._nodes += 1
        return upper

    def _new_leaf(self, parent: _MetaNode, label: Tokens, tag: int) -> _MetaNode:
        leaf = _MetaNode(parent, label, parent.depth + len(label), parent.namespace, tag)
        parent.children[label[: self._page_size], tag] = leaf
        self._nodes += 1
        return leaf

    def _new_path(
        self,
        parent: _MetaNode,
        toks: Tokens,
        lo: int,
        hi: int,
        tags: Tags,
        index: int | None,
        tier: int,
    ) -> _MetaNode:
        """New nodes below ``parent`` for ``toks[lo:hi]``: a run of untagged pages is one
        node, a tagged page a node of its own; marked for worker ``index`` on ``tier``
        unless ``index`` is None. Returns the last."""
        p = self._page_size
        while lo < hi:
            tag = self._tag(tags, lo)
            end = lo + p
            while not tag and end < hi and not self._tag(tags, end):
                end += p
            parent = self._new_leaf(parent, toks[lo:end], tag)
            if index is not None:
                self._mark(parent, index, tier)
            lo = end
        return parent

    @staticmethod
    def _tier(node: _MetaNode, tier: int) -> set[int]:
        """The workers holding ``node`` on ``tier``."""
        return node.holders if tier == 0 else node.host

    def _mark(self, node: _MetaNode, index: int, tier: int) -> None:
        self._tier(node, tier).add(index)
        if tier == 0:
            if self._approximate(index):
                node.stamps[index] = self._clock
            self._held[index] += len(node.label)
        else:
            self._host_held[index] += len(node.label)

    def _unmark(self, node: _MetaNode, index: int, tier: int) -> None:
        self._tier(node, tier).discard(index)
        if tier == 0:
            node.stamps.pop(index, None)
            self._held[index] -= len(node.label)
        else:
            self._host_held[index] -= len(node.label)
        if index not in node.holders and index not in node.host:  # its name goes with it
            h = node.hashes.pop(index, None)
            if h is not None:
                del self._blocks[index][h]

    def _bind(self, node: _MetaNode, index: int, h: int) -> None:
        """Name one-page ``node`` of worker ``index`` by ``h`` (dropping its previous hash)."""
        old = node.hashes.get(index)
        if old == h:
            return
        if old is not None:
            del self._blocks[index][old]
        node.hashes[index] = h
        self._blocks[index][h] = node

    def _refresh_path(self, index: int, root: _MetaNode, toks: Tokens, n: int, tags: Tags) -> None:
        """Every node on ``toks[:n]``'s path from ``root`` that worker ``index`` holds takes
        the clock."""
        node, pos = root, 0
        while pos < n:
            child = self._child(node, toks, pos, tags)
            if child is None:
                return
            m = self._common(child.label, toks, pos, n, tags)
            if index in child.holders:
                _require(pos + m == child.depth, "a refresh covers part of a node")
                child.stamps[index] = self._clock
            if m < len(child.label):
                return
            node, pos = child, child.depth

    def _evict(self, index: int) -> None:
        """Trim approximate worker ``index`` to its capacity, least recent and deepest first."""
        capacity = self._table.capacities[index]
        if capacity is None:
            return
        p = self._page_size
        while self._held[index] > capacity:
            victim = min(
                (node for node in self._all_nodes() if index in node.holders),
                key=lambda node: (node.stamps[index], -node.depth),
            )
            excess = -(-(self._held[index] - capacity) // p)
            pages = len(victim.label) // p
            if pages > excess:
                self._cut(victim, (pages - excess) * p)  # victim keeps its last `excess` pages
            self._unmark(victim, index, 0)
        self._free_unused()

    def _drop_all(self, index: int, tiers: tuple[int, ...]) -> int:
        """Unmark worker ``index`` on ``tiers``; returns the tokens unmarked."""
        tokens = 0
        for node in list(self._all_nodes()):
            for tier in tiers:
                if index in self._tier(node, tier):
                    self._unmark(node, index, tier)
                    tokens += len(node.label)
        self._free_unused()
        return tokens

    def _clear(self, worker: WorkerId, tiers: tuple[int, ...]) -> int:
        """Apply a converted cleared event."""
        return self._drop_all(self._table.resolve(worker), tiers)

    def _free_unused(self) -> None:
        """Free every node with no holders and no children, children before parents, then
        the roots of the namespaces this empties."""
        p = self._page_size
        for node in reversed(list(self._all_nodes())):
            parent = node.parent
            used = node.holders or node.host or node.holds or node.children
            if parent is not None and not used:
                del parent.children[node.label[:p], node.tag]
                node.parent = None
                self._nodes -= 1
        for namespace in [ns for ns, root in self._roots.items() if not root.children]:
            if namespace is not None:
                del self._roots[namespace]
