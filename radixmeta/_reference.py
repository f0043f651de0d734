"""Plain-Python implementation of the core API: the test oracle and a readable fallback.

Every rule here is written the simple way (dicts, tuples, full scans) so that it
is obviously right; the native core in ``csrc/`` must produce the same results
for the same calls. ``RADIXMETA_IMPLEMENTATION=python`` makes the whole library
run on this module.

Rules both implementations share (tests depend on them):

* A logical clock advances by one at the start of every ``match_prefix`` and
  ``insert``; every node on the walked path takes that stamp as its last access.
* Hit counts count inserts (SGLang's rule): an ``insert`` adds one to every
  node on its walked path that ends past its first ``counted`` tokens, and its
  new leaf starts at one (zero if the key ends within ``counted``);
  ``match_prefix`` counts nothing.
* Each new node (a new leaf, or the upper half of a split) takes the next serial
  number. A split's upper half copies lock count, hit count, last access,
  creation stamp and priority from the node it was cut from; locks taken on
  the node itself stay with the lower half, which keeps its handle.
* ``unlock(node)`` releases a lock taken on that very node; a count that only
  comes from locked descendants raises ``LockError``.
* The eviction order compares, smallest first: ``lru`` (last access, serial),
  ``lfu`` (hit count, last access, serial), ``fifo`` (creation stamp, serial),
  ``priority`` (priority, last access, serial). Serials are unique, so there are
  no ties.
"""

from __future__ import annotations

import itertools
import sys
import threading
import warnings
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import numpy as np
import numpy.typing as npt

from radixmeta import _keys
from radixmeta._atomic import atomic
from radixmeta._keys import check_flag, check_int, check_page_size
from radixmeta._reference_log import CLEARED, REMOVED, STORED, EventLogCore
from radixmeta._reference_meta import MetaCore, MetaMatch  # noqa: F401  (the backend's meta-tree)
from radixmeta._types import EVICTION_POLICIES, TAKE_EVICTED_DEPRECATION, CacheStats
from radixmeta.errors import (
    CacheFullError,
    ForeignNodeError,
    InputTypeError,
    InvalidInputError,
    LockError,
    StaleNodeError,
)

_owner_ids = itertools.count(1)
_HIT_COUNT_MAX = 2**32 - 1  # the native core's hit counts saturate there


def _require(condition: bool, what: str) -> None:
    """An invariant check that, unlike ``assert``, survives ``python -O``."""
    if not condition:
        msg = f"radixmeta reference invariant violated: {what}"
        raise AssertionError(msg)


class _TreeNode:
    __slots__ = (
        "parent",
        "label",
        "values",
        "children",
        "lock_count",
        "own_locks",
        "hit_count",
        "last_access",
        "created",
        "serial",
        "priority",
        "generation",
        "depth",
        "namespace",
    )

    def __init__(
        self,
        parent: _TreeNode | None,
        label: tuple[int, ...],
        values: tuple[int, ...],
        namespace: Hashable = None,
    ):
        self.parent = parent
        self.namespace = namespace  # a root's namespace (a root is dropped once it is empty)
        self.label = label
        self.values = values
        self.children: dict[tuple[int, ...], _TreeNode] = {}
        self.lock_count = 0
        self.own_locks = 0  # locks taken on this node itself
        self.hit_count = 0
        self.last_access = 0
        self.created = 0
        self.serial = 0
        self.priority = 0
        self.generation = 0
        self.depth: int = (parent.depth if parent is not None else 0) + len(label)


class Node:
    """Handle naming one cached prefix (a node of the tree).

    A handle stays valid until its node is evicted or the cache is reset; using
    it afterwards raises :class:`~radixmeta.errors.StaleNodeError`.
    """

    __slots__ = ("_owner", "_node", "_generation")

    def __init__(self, owner: int, node: _TreeNode):
        self._owner = owner
        self._node = node
        self._generation = node.generation

    @property
    def length(self) -> int:
        """Tokens from the root to the end of this node: the prefix length it names."""
        return self._node.depth

    def __repr__(self) -> str:
        return f"<radixmeta.Node length={self._node.depth}>"


class MatchResult:
    """Result of :meth:`RadixCache.match_prefix`: ``length``, ``values`` and ``node``.

    ``values`` is None when the match was asked with ``values=False``.
    """

    __slots__ = ("length", "values", "node")

    def __init__(self, length: int, values: np.ndarray | None, node: Node):
        self.length = length
        self.values = values
        self.node = node

    def __repr__(self) -> str:
        shown = "None" if self.values is None else f"<{len(self.values)} int64>"
        return f"MatchResult(length={self.length}, values={shown})"


class EvictResult:
    """Result of :meth:`RadixCache.evict`: the freed slot ``values`` and their ``count``.

    ``count`` is the tokens freed; ``values`` is None for a cache made with
    ``store_values=False``.
    """

    __slots__ = ("values", "count")

    def __init__(self, values: np.ndarray | None, count: int):
        self.values = values
        self.count = count

    def __repr__(self) -> str:
        return f"EvictResult(count={self.count})"


class CacheCore:
    """Reference implementation of the worker cache core (see ``radixmeta.RadixCache``)."""

    def __init__(
        self,
        page_size: int = 1,
        *,
        eviction: str = "lru",
        capacity: int | None = None,
        on_evict: Callable[[np.ndarray], object] | None = None,
        event_log: EventLogCore | None = None,
        refresh_split_tail: bool = False,
        store_values: bool = True,
    ) -> None:
        self._page_size = check_page_size(page_size)
        self._store_values = check_flag("store_values", store_values)
        if eviction not in EVICTION_POLICIES:
            allowed = ", ".join(repr(p) for p in EVICTION_POLICIES)
            msg = f"eviction must be one of {allowed}, got {eviction!r}"
            raise InvalidInputError(msg)
        self._eviction = eviction
        self._capacity = None if capacity is None else check_int("capacity", capacity, 0)
        if on_evict is not None and not callable(on_evict):
            msg = f"on_evict must be callable or None, got {type(on_evict).__name__}"
            raise InputTypeError(msg)
        self._on_evict = on_evict
        if event_log is not None and not isinstance(event_log, EventLogCore):
            msg = f"event_log must be an EventLog or None, got {type(event_log).__name__}"
            raise InputTypeError(msg)
        if on_evict is not None and not self._store_values:
            msg = "on_evict needs slot values: a cache made with store_values=False frees none"
            raise InvalidInputError(msg)
        self._refresh_split_tail = check_flag("refresh_split_tail", refresh_split_tail)
        if event_log is not None:
            event_log._attach(self._page_size)
        self._log = event_log
        self._owner = next(_owner_ids)
        self._mutex = threading.RLock()
        self._init_state()

    def _init_state(self) -> None:
        self._roots: dict[Hashable, _TreeNode] = {None: _TreeNode(None, (), ())}
        self._clock = 0
        self._serial = 0
        self._evictable = 0
        self._protected = 0
        self._nodes = 0
        self._stats = [0, 0, 0, 0]
        # Slots the last insert freed for capacity, kept only for the deprecated
        # take_evicted() when there is no on_evict: never more than one call's worth.
        self._last_evicted: list[int] = []

    # -- properties -----------------------------------------------------------------
    @property
    def page_size(self) -> int:
        """Tokens per page."""
        return self._page_size

    @property
    def eviction(self) -> str:
        """The eviction policy name."""
        return self._eviction

    @property
    def capacity(self) -> int | None:
        """The capacity in tokens, or None."""
        return self._capacity

    @property
    def event_log(self) -> EventLogCore | None:
        """The attached :class:`~radixmeta.EventLog`, or None."""
        return self._log

    @property
    def on_evict(self) -> Callable[[np.ndarray], object] | None:
        """The callback that receives slots the cache frees on its own, or None."""
        return self._on_evict

    @property
    @atomic
    def evictable_size(self) -> int:
        """Tokens in unlocked nodes."""
        return self._evictable

    @property
    @atomic
    def protected_size(self) -> int:
        """Tokens in locked nodes."""
        return self._protected

    @property
    @atomic
    def total_size(self) -> int:
        """Tokens cached."""
        return self._evictable + self._protected

    @property
    def refresh_split_tail(self) -> bool:
        """Whether a split also stamps the lower half of the cut node as just used."""
        return self._refresh_split_tail

    @property
    def store_values(self) -> bool:
        """Whether the cache keeps a KV slot value beside each token."""
        return self._store_values

    def _need_values(self, what: str) -> None:
        """Raise if this cache keeps no slot values (``what`` names the call)."""
        if not self._store_values:
            msg = f"{what} needs slot values: this cache was made with store_values=False"
            raise InvalidInputError(msg)

    @property
    @atomic
    def node_count(self) -> int:
        """Nodes in the tree, roots not counted."""
        return self._nodes

    @property
    @atomic
    def stats(self) -> CacheStats:
        """Cumulative counters as a :class:`~radixmeta.CacheStats`."""
        return CacheStats(*self._stats)

    # -- helpers --------------------------------------------------------------------
    def _aligned(self, key: Any) -> tuple[int, ...]:
        toks = _keys.tokens(key)
        return toks[: len(toks) - len(toks) % self._page_size]

    def _common(self, label: tuple[int, ...], key: tuple[int, ...], pos: int) -> int:
        n = 0
        limit = min(len(label), len(key) - pos)
        while n < limit and label[n] == key[pos + n]:
            n += 1
        return n - n % self._page_size

    def _split(self, child: _TreeNode, m: int) -> _TreeNode:
        parent = child.parent
        assert parent is not None
        upper = _TreeNode(parent, child.label[:m], child.values[:m])
        for field in ("lock_count", "hit_count", "last_access", "created", "priority"):
            setattr(upper, field, getattr(child, field))
        self._serial += 1
        upper.serial = self._serial
        p = self._page_size
        parent.children[child.label[:p]] = upper
        child.label, child.values = child.label[m:], child.values[m:]
        child.parent = upper
        upper.children[child.label[:p]] = child
        self._nodes += 1
        return upper

    def _node_of(self, handle: Any) -> _TreeNode:
        if not isinstance(handle, Node):
            msg = f"node must be a Node handle, got {type(handle).__name__}"
            raise InputTypeError(msg)
        if handle._owner != self._owner:
            msg = "node handle belongs to a different cache"
            raise ForeignNodeError(msg)
        if handle._node.generation != handle._generation:
            msg = "node handle is stale: its node was evicted or the cache was reset"
            raise StaleNodeError(msg)
        return handle._node

    def _eviction_key(self, node: _TreeNode) -> tuple[int, ...]:
        if self._eviction == "lru":
            return (node.last_access, node.serial)
        if self._eviction == "lfu":
            return (node.hit_count, node.last_access, node.serial)
        if self._eviction == "fifo":
            return (node.created, node.serial)
        return (node.priority, node.last_access, node.serial)

    def _all_nodes(self) -> Iterator[_TreeNode]:
        stack = list(self._roots.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _is_evictable_leaf(self, node: _TreeNode) -> bool:
        return node.parent is not None and node.lock_count == 0 and not node.children

    # -- core API -------------------------------------------------------------------
    @atomic
    def match_prefix(
        self, key: Any, *, namespace: Hashable = None, values: bool = True
    ) -> MatchResult:
        """Longest cached prefix of ``key`` (whole pages), as a ``MatchResult``.

        Refreshes the recency of the matched path and splits the edge where the
        match ends inside it. With ``values=False`` the slots are not gathered
        and the result's ``values`` is None. A match of length 0 names the
        default namespace's root, whatever the namespace.
        """
        toks = self._aligned(key)
        if check_flag("values", values):
            self._need_values("match_prefix(values=True)")
        root = self._roots.get(namespace)  # may raise (unhashable): before any change
        self._clock += 1
        self._stats[0] += 1
        node, pos = self._roots[None], 0
        if root is not None:
            node, pos = self._walk(root, toks, self._touch_matched)
        self._stats[1] += pos
        if pos == 0:  # namespace roots never escape: an empty one may be dropped
            node = self._roots[None]
        gathered = np.array(self._path_values(node), dtype=np.int64) if values else None
        return MatchResult(pos, gathered, Node(self._owner, node))

    def _walk(
        self, node: _TreeNode, toks: tuple[int, ...], touch: Callable[[_TreeNode, int], None]
    ) -> tuple[_TreeNode, int]:
        """Follow ``toks`` down from ``node``, splitting where the match ends inside an edge.

        ``touch`` is applied to every node of the matched path, with the key
        position where that node ends. Returns the last node of that path and
        the matched length.
        """
        pos = 0
        p = self._page_size
        while pos < len(toks):
            child = node.children.get(toks[pos : pos + p])
            if child is None:
                break
            m = self._common(child.label, toks, pos)
            ends_inside = m < len(child.label)
            if ends_inside:
                lower = child
                child = self._split(child, m)
                if self._refresh_split_tail:  # as SGLang's trees stamp the node they cut
                    lower.last_access = self._clock
            touch(child, pos + m)
            node = child
            pos += m
            if ends_inside:
                break
        return node, pos

    def _touch_matched(self, node: _TreeNode, end: int) -> None:
        node.last_access = self._clock

    def _path_values(self, node: _TreeNode) -> list[int]:
        parts = []
        walk: _TreeNode | None = node
        while walk is not None:
            parts.append(walk.values)
            walk = walk.parent
        return [v for part in reversed(parts) for v in part]

    def _dry_walk(self, toks: tuple[int, ...], namespace: Hashable) -> tuple[int, _TreeNode | None]:
        """Return (matched length, deepest node the walk reaches) without changing anything."""
        node = self._roots.get(namespace)
        if node is None:
            return 0, None
        pos = 0
        p = self._page_size
        while pos < len(toks):
            child = node.children.get(toks[pos : pos + p])
            if child is None:
                break
            m = self._common(child.label, toks, pos)
            node = child
            pos += m
            if m < len(child.label):
                break
        return pos, node

    @atomic
    def insert(
        self,
        key: Any,
        values: Any = None,
        *,
        namespace: Hashable = None,
        priority: int = 0,
        counted: int = 0,
    ) -> int:
        """Store ``key`` (whole pages) with its KV slot ``values``.

        Returns the length that was already cached, whose duplicate slots the
        caller frees. Under LFU, every node of the path that ends past the
        first ``counted`` tokens gains a hit.
        """
        raw = _keys.tokens(key)
        if values is not None:
            self._need_values("insert(values=...)")
        # Without values every node keeps an empty tuple (what a split cuts stays empty).
        empty: tuple[int, ...] = ()
        vals = (
            empty
            if not self._store_values
            else raw
            if values is None
            else _keys.values(values, len(raw))
        )
        priority = _keys.check_priority(priority)
        counted = check_int("counted", counted, 0)
        n = len(raw) - len(raw) % self._page_size
        toks, vals = raw[:n], vals[:n]
        freed = self._make_room(toks, namespace) if self._capacity is not None else []
        self._clock += 1
        node = self._roots.get(namespace)
        if node is None and n:  # an empty namespace costs nothing: no root until a page
            node = self._roots[namespace] = _TreeNode(None, (), (), namespace)
        pos = 0 if node is None else self._extend(node, toks, vals, priority, counted)
        self._hand_over(freed)
        return pos

    def _extend(
        self,
        node: _TreeNode,
        toks: tuple[int, ...],
        vals: tuple[int, ...],
        priority: int,
        counted: int,
    ) -> int:
        """The walk and new leaf of ``insert``; returns the length already cached."""
        n = len(toks)

        def touch(child: _TreeNode, end: int) -> None:
            child.last_access = self._clock
            child.priority = max(child.priority, priority)
            if end > counted:  # a hit per insert through it, unless this caller counted it
                child.hit_count = min(child.hit_count + 1, _HIT_COUNT_MAX)

        node, pos = self._walk(node, toks, touch)
        p = self._page_size
        if pos < n:
            leaf = _TreeNode(node, toks[pos:], vals[pos:])
            self._serial += 1
            leaf.serial = self._serial
            leaf.last_access = leaf.created = self._clock
            leaf.priority = priority
            leaf.hit_count = 1 if n > counted else 0
            node.children[toks[pos : pos + p]] = leaf
            self._nodes += 1
            self._evictable += n - pos
            self._stats[2] += n - pos
            if self._log is not None:
                self._log._record(STORED, self._namespace_of(leaf), toks, pos)
        return pos

    def _hand_over(self, freed: list[int]) -> None:
        """Give slots the cache freed on its own to ``on_evict`` (after the operation)."""
        if self._on_evict is None:
            self._last_evicted = freed
        elif freed:
            self._on_evict(np.array(freed, dtype=np.int64))

    def _make_room(self, toks: tuple[int, ...], namespace: Hashable) -> list[int]:
        """Evict what an insert of ``toks`` needs under the capacity; returns the freed slots."""
        assert self._capacity is not None
        matched, deepest = self._dry_walk(toks, namespace)
        need = self.total_size + len(toks) - matched - self._capacity
        if need <= 0:
            return []
        # Room may come from anything but the matched prefix itself, which the
        # insert extends: count the unlocked tokens of that prefix out.
        on_path = 0
        walk = deepest
        while walk is not None and walk.parent is not None:
            inside = min(walk.depth, matched) - (walk.depth - len(walk.label))
            if walk.lock_count == 0:
                on_path += inside
            walk = walk.parent
        available = self._evictable - on_path
        if available < need:
            msg = (
                f"cannot fit {len(toks) - matched} new tokens under capacity "
                f"{self._capacity}: {self.total_size} cached, {available} evictable"
            )
            raise CacheFullError(msg)
        guard = None
        if deepest is not None and deepest.parent is not None:
            if deepest.depth > matched:  # cut it so the guard covers exactly the match
                deepest = self._split(deepest, matched - (deepest.depth - len(deepest.label)))
            guard = Node(self._owner, deepest)
            self.lock(guard)
        try:
            return self._evict_tokens(need)
        finally:
            if guard is not None:
                self.unlock(guard)

    @atomic
    def lock(self, node: Node) -> None:
        """Lock ``node`` and its path to the root against eviction."""
        walk: _TreeNode | None = self._node_of(node)
        if walk is not None and walk.parent is not None:
            walk.own_locks += 1
        while walk is not None and walk.parent is not None:
            if walk.lock_count == 0:
                self._evictable -= len(walk.label)
                self._protected += len(walk.label)
            walk.lock_count += 1
            walk = walk.parent

    @atomic
    def unlock(self, node: Node) -> None:
        """Release one lock taken on ``node`` by :meth:`lock`."""
        target = self._node_of(node)
        # Only a lock taken on this very node may be released through it.
        if target.parent is not None and target.own_locks == 0:
            msg = "node is not locked"
            raise LockError(msg)
        if target.parent is not None:
            target.own_locks -= 1
        walk: _TreeNode | None = target
        while walk is not None and walk.parent is not None:
            walk.lock_count -= 1
            if walk.lock_count == 0:
                self._evictable += len(walk.label)
                self._protected -= len(walk.label)
            walk = walk.parent

    @atomic
    def path_values(self, node: Node) -> np.ndarray:
        """The KV slots of the path from the root to ``node`` (int64, ``node.length`` of them)."""
        target = self._node_of(node)
        self._need_values("path_values()")
        return np.array(self._path_values(target), dtype=np.int64)

    @atomic
    def lock_count(self, node: Node) -> int:
        """Number of locks held on ``node`` (directly or through descendants)."""
        return self._node_of(node).lock_count

    @atomic
    def evict(self, num_tokens: int) -> EvictResult:
        """Free at least ``num_tokens`` tokens from unlocked leaves, in policy order."""
        num_tokens = check_int("num_tokens", num_tokens, 0)
        done = self._evicted_tokens
        freed = self._evict_tokens(num_tokens)
        count = self._evicted_tokens - done
        if not self._store_values:
            return EvictResult(None, count)
        return EvictResult(np.array(freed, dtype=np.int64), count)

    @property
    def _evicted_tokens(self) -> int:
        return self._stats[3]

    def _evict_tokens(self, num_tokens: int) -> list[int]:
        """Evict at least ``num_tokens`` tokens if it can; returns their slots (none
        without values). The stats' evicted count grows by the tokens freed."""
        freed: list[int] = []
        done = 0
        while done < num_tokens:
            leaves = [n for n in self._all_nodes() if self._is_evictable_leaf(n)]
            if not leaves:
                break
            victim = min(leaves, key=self._eviction_key)
            if self._log is not None:  # recorded while its path can still be read
                start = victim.depth - len(victim.label)
                self._log._record(REMOVED, self._namespace_of(victim), self._path(victim), start)
            freed.extend(victim.values)
            done += len(victim.label)
            parent = victim.parent
            assert parent is not None
            del parent.children[victim.label[: self._page_size]]
            victim.generation += 1
            self._evictable -= len(victim.label)
            self._nodes -= 1
            if parent.parent is None and not parent.children and parent.namespace is not None:
                del self._roots[parent.namespace]  # an emptied namespace is forgotten
                parent.generation += 1
        self._stats[3] += done
        return freed

    @atomic
    def take_evicted(self) -> np.ndarray:
        """Deprecated: the slots the most recent insert freed for capacity, not yet taken."""
        self._need_values("take_evicted()")
        warnings.warn(TAKE_EVICTED_DEPRECATION, DeprecationWarning, stacklevel=2)
        out = np.array(self._last_evicted, dtype=np.int64)
        self._last_evicted = []
        return out

    @atomic
    def reset(self) -> None:
        """Empty the cache and its counters; every existing handle becomes stale.

        With ``on_evict``, every slot the cache held is handed to it afterwards.
        """
        held = [v for root in self._roots.values() for v in self._values_in_order(root)]
        if self._log is not None:
            self._log._record(CLEARED, None, (), 0)
        for node in self._all_nodes():
            node.generation += 1
        self._init_state()
        if self._on_evict is not None and held:
            self._on_evict(np.array(held, dtype=np.int64))

    def _namespace_of(self, node: _TreeNode) -> Hashable:
        while node.parent is not None:
            node = node.parent
        return node.namespace

    def _path(self, node: _TreeNode) -> tuple[int, ...]:
        parts = []
        walk: _TreeNode | None = node
        while walk is not None:
            parts.append(walk.label)
            walk = walk.parent
        return tuple(t for part in reversed(parts) for t in part)

    def _nodes_in_order(self, root: _TreeNode) -> Iterator[_TreeNode]:
        """The nodes below ``root`` in key order, a node before its children."""
        stack = [child for _, child in sorted(root.children.items(), reverse=True)]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(child for _, child in sorted(node.children.items(), reverse=True))

    @atomic
    def snapshot(self) -> list[Any]:
        """The records that rebuild this cache, stamped with the log's latest seq."""
        if self._log is None:
            msg = "snapshot() needs an event log: pass event_log= to RadixCache"
            raise InvalidInputError(msg)
        seq = self._log.next_seq - 1
        return [
            self._log._build(seq, STORED, ns, self._path(node), node.depth - len(node.label))
            for ns, root in self._roots.items()
            for node in self._nodes_in_order(root)
        ]

    def _values_in_order(self, root: _TreeNode) -> list[int]:
        """The values of every node below ``root`` in key order, a node before its children."""
        return [v for node in self._nodes_in_order(root) for v in node.values]

    @atomic
    def items(self, *, namespace: Hashable = None) -> list[tuple[np.ndarray, np.ndarray]]:
        """Every leaf's full prefix and values, in lexicographic order of the prefix."""
        self._need_values("items()")
        out: list[tuple[np.ndarray, np.ndarray]] = []
        root = self._roots.get(namespace)
        if root is None:
            return out
        empty: tuple[int, ...] = ()
        stack = [(root, empty, empty)]
        while stack:
            node, toks, vals = stack.pop()
            toks, vals = toks + node.label, vals + node.values
            if not node.children and node.parent is not None:
                out.append((np.array(toks, np.uint32), np.array(vals, np.int64)))
            for _, child in sorted(node.children.items(), reverse=True):
                stack.append((child, toks, vals))
        return out

    @atomic
    def _structure(self, namespace: Hashable = None) -> list[tuple[int, np.ndarray, int]]:
        """(level, label, lock count) of every node, depth first (for ``pretty``)."""
        out: list[tuple[int, np.ndarray, int]] = []
        root = self._roots.get(namespace)
        if root is None:
            return out
        stack = [(child, 0) for _, child in sorted(root.children.items(), reverse=True)]
        while stack:
            node, level = stack.pop()
            out.append((level, np.array(node.label, np.uint32), node.lock_count))
            for _, child in sorted(node.children.items(), reverse=True):
                stack.append((child, level + 1))
        return out

    @atomic
    def namespaces(self) -> list[Hashable]:
        """Namespaces that hold a page, in order of creation (None, the default, always listed)."""
        return list(self._roots)

    @atomic
    def __reduce__(self) -> Any:
        # Copying would share the tree and the lock between two objects.
        msg = f"cannot pickle or copy {type(self).__name__!r} object"
        raise TypeError(msg)

    def memory_usage(self) -> int:
        """Estimated bytes held by the Python objects of the tree."""
        total = sys.getsizeof(self._roots)
        for node in self._all_nodes():
            total += sys.getsizeof(node) + sys.getsizeof(node.children)
            total += sys.getsizeof(node.label) + sys.getsizeof(node.values)
        return total

    @atomic
    def check(self) -> None:
        """Verify every structural invariant in O(n); raises AssertionError on a violation."""
        evictable = protected = nodes = 0
        p = self._page_size
        for root in self._roots.values():
            _require(root.parent is None and not root.label, "a root is malformed")
            _require(root.lock_count == 0, "a root is locked")
            stack = list(root.children.items())
            while stack:
                first, node = stack.pop()
                nodes += 1
                parent = node.parent
                _require(parent is not None, "a child has no parent")
                assert parent is not None  # for the type checker
                whole_pages = len(node.label) > 0 and len(node.label) % p == 0
                _require(whole_pages, "a label is not whole pages")
                _require(
                    len(node.values) == (len(node.label) if self._store_values else 0),
                    "values and label lengths differ",
                )
                _require(node.label[:p] == first, "a child is filed under the wrong key")
                _require(node.depth == parent.depth + len(node.label), "a depth is wrong")
                child_locks = sum(c.lock_count for c in node.children.values())
                _require(
                    node.lock_count == node.own_locks + child_locks,
                    "a lock count differs from its own locks plus its children's",
                )
                if node.lock_count:
                    protected += len(node.label)
                else:
                    evictable += len(node.label)
                stack.extend(node.children.items())
        _require(evictable == self._evictable, "evictable_size is wrong")
        _require(protected == self._protected, "protected_size is wrong")
        _require(nodes == self._nodes, "node_count is wrong")


def token_array(tokens: Any, name: str = "tokens") -> npt.NDArray[np.uint32]:
    """``tokens`` as a 1-D, C-contiguous uint32 array, converted once by the trees' rules.

    A uint32 array that is already 1-D, C-contiguous, aligned and in native byte
    order is returned as it is; every other form becomes a new array. Errors are
    the trees' (``radixmeta._keys``), naming ``name``.
    """
    if (
        type(tokens) is np.ndarray
        and tokens.dtype == np.uint32
        and tokens.ndim == 1
        and tokens.dtype.isnative
        and tokens.flags.c_contiguous
        and tokens.flags.aligned
    ):
        _keys.check_key_length(len(tokens))
        return tokens
    seq = _keys.as_sequence(tokens, name)
    if isinstance(seq, np.ndarray):
        _keys.check_key_length(len(seq))
        bad = np.flatnonzero((seq < 0) | (seq > _keys.TOKEN_LIMIT - 1))
        if len(bad):
            i = int(bad[0])
            msg = f"{name}[{i}] = {seq[i]} is outside the token range [0, 2**32)"
            raise InvalidInputError(msg)
        return np.array(seq, dtype=np.uint32)
    return np.array(_keys.tokens(seq, name), dtype=np.uint32)


def prefix_partners(
    keys: Any, page_size: Any
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Per key of a batch: the first earlier key sharing the most whole pages with it.

    The definition the native trie implements: for key ``i``, ``shared[i]`` is
    the longest whole-page common prefix of key ``i`` with any earlier key, and
    ``partner[i]`` the first earlier key with that much (``-1`` when it is 0).

    Parameters
    ----------
    keys : sequence of keys
    page_size : int

    Returns
    -------
    tuple of two numpy.ndarray
        ``(partner, shared)``, ``int64``, one entry per key.
    """
    page = check_page_size(page_size)
    if isinstance(keys, (str, bytes)) or not hasattr(keys, "__len__"):
        msg = f"keys must be a sequence of keys, got {type(keys).__name__}"
        raise InputTypeError(msg)
    arrays = [np.array(_keys.tokens(k), dtype=np.int64) for k in keys]
    partner = np.full(len(arrays), -1, dtype=np.int64)
    shared = np.zeros(len(arrays), dtype=np.int64)
    for i, key in enumerate(arrays):
        for j in range(i):
            n = min(len(key), len(arrays[j]))
            differ = np.flatnonzero(key[:n] != arrays[j][:n])
            m = int(differ[0]) if len(differ) else n
            m -= m % page
            if m > shared[i]:
                shared[i], partner[i] = m, j
    return partner, shared


def prefix_groups(
    keys: Any, page_size: Any, ratio: float
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """The batch's shared-prefix groups, from the links of :func:`prefix_partners`.

    Key ``i`` joins its partner's group when they share at least one page and
    at least ``ratio`` of the shorter key's whole pages; a partner comes
    before its key, so one pass settles every group.

    Returns
    -------
    tuple of two numpy.ndarray
        ``(first, shared)``, ``int64``: per key the first key of its group; per
        first key the tokens every key of its group shares (the smallest link),
        0 for a key alone.
    """
    page = check_page_size(page_size)
    partner, common = prefix_partners(keys, page)
    lengths = [len(_keys.tokens(k)) // page * page for k in keys]
    first = np.arange(len(lengths), dtype=np.int64)
    shared = np.zeros(len(lengths), dtype=np.int64)
    for i, (j, length) in enumerate(zip(partner.tolist(), common.tolist(), strict=True)):
        if j < 0 or length < page or length < ratio * min(lengths[i], lengths[j]):
            continue
        f = int(first[j])
        first[i] = f
        shared[f] = length if shared[f] == 0 else min(int(shared[f]), length)
    return first, shared


def prefix_links(
    keys: Any, page_size: Any, ratio: float
) -> tuple[
    npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]
]:
    """:func:`prefix_groups` and :func:`prefix_partners` of one batch, as four arrays:
    ``(first, shared, partner, common)`` (the native core builds one trie for both)."""
    first, shared = prefix_groups(keys, page_size, ratio)
    partner, common = prefix_partners(keys, page_size)
    return first, shared, partner, common


def prefix_group_runs(
    keys: Any, page_size: Any, ratio: float
) -> tuple[list[tuple[list[int], int]], list[int], list[int], list[int]]:
    """The groups of :func:`prefix_groups`, ready to hand out, and the batch's links.

    Returns
    -------
    tuple
        ``(runs, partner, common, own)``. ``runs`` has per group, in order of
        its first key, ``(members, shared)``: its keys in batch order and the
        tokens they all share (0 for a key alone). The other three are lists
        by batch index: each key's partner and share (as
        :func:`prefix_partners` gives them), and ``own``, the tokens it does not
        share with an earlier member of its group (for a group's first key:
        past its ``shared``).
    """
    first, shared, partner, common = prefix_links(keys, page_size, ratio)
    sizes = [len(_keys.tokens(k)) for k in keys]
    runs: dict[int, list[int]] = {}
    for i, f in enumerate(first.tolist()):
        runs.setdefault(f, []).append(i)
    common_of = common.tolist()
    own = [
        size - (int(shared[i]) if f == i else c)
        for i, (size, f, c) in enumerate(zip(sizes, first.tolist(), common_of, strict=True))
    ]
    out = [(members, int(shared[f])) for f, members in runs.items()]
    return out, partner.tolist(), common_of, own


def extremes(values: Any) -> tuple[Any, int, Any, int, int]:
    """``(low, low_at, high, high_at, high_count)`` of a non-empty sequence of numbers.

    The smallest and the largest value, the first position of each, and how many
    positions hold the largest: what the load and affinity policies read off a
    view's lists (the native core makes it one pass in C).

    Raises
    ------
    InvalidInputError
        ``values`` is empty.
    """
    row = list(values)
    if not row:
        msg = "extremes of an empty sequence"
        raise InvalidInputError(msg)
    low, high = min(row), max(row)
    return low, row.index(low), high, row.index(high), row.count(high)
