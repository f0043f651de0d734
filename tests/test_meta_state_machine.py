"""Stateful model checking of the meta-tree: every MetaCore and the tree-less model side by side.

Every rule applies one call to the reference MetaCore, the native MetaCore (when the
extension has one) and ``BruteForceMetaTree``, and requires the same return value, or
the same exception type and message. An invariant then runs ``check()`` on the trees and
compares everything observable: node structure (``items()``) between the trees; the
pages, holders, recency order, held tokens and block maps of every worker between the
trees and the model; matches of a few keys. Keys come from a few stems cut at page
boundaries, so paths overlap a lot; workers come and go (index reuse), some with a small
capacity so that approximate eviction happens all the time, and bad inputs (stale or
foreign workers, unknown parents, conflicting hashes, bad starts and tiers) are mixed in.

Every page-marking call also takes a tier (mostly the device, now and then the host, and
a bad one), every match reports host lengths too, and every page-naming call also takes a
namespace (mostly the default, sometimes one of a few
others of different types, now and then an unhashable one), so namespaces are created,
emptied (their roots freed) and created again, and a hash stored in one namespace is used
as a parent in another.

Holds (the router's optimistic marks) come and go between the other calls: made plainly
or from a cursor match (sometimes after other calls that change the tree, so the native
core's kept walk must be extended, or is cut, or can no longer be trusted; sometimes twice
from one match), released, and ended with their worker; a cursor match also inserts.
Matches count holds or not.

Two machines: a handful of workers, and one that starts with 66 to 70 workers and sends
most traffic to indices 64 and up, so that worker bitsets cross a 64-bit word.
"""

from __future__ import annotations

import doctest
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np
import pytest
from conftest import META_CORES, require_native
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import radixmeta.testing_meta
from radixmeta import WorkerId
from radixmeta.errors import BlockConflictError, RadixMetaError, UnknownParentError
from radixmeta.testing_meta import (
    STORED_VARIANTS,
    ApplyCleared,
    ApplyEvents,
    ApplyRemoved,
    ApplyStored,
    BruteForceMetaTree,
    apply_meta_operation,
    block_hash_of,
    meta_key_pools,
    meta_operations,
    run_meta_operations,
)

Tokens = tuple[int, ...]

# A key is (stem index, pages dropped from the stem's end, ragged tail); stems are drawn
# once per run, so keys share prefixes of every length.
KEYS = st.tuples(
    st.integers(0, 7),
    st.sampled_from([0, 0, 0, 1, 1, 2, 3, 9]),
    st.just(()) | st.lists(st.integers(0, 2), min_size=1, max_size=3).map(tuple),
)
# Whom a call names: mostly a live worker (a "hot" one in the many-worker machine), now
# and then a removed one or an id that was never handed out.
WHO = st.tuples(
    st.sampled_from(["hot"] * 6 + ["any"] * 3 + ["stale", "foreign"]), st.integers(0, 1000)
)
# start, in pages, or a bad one.
STARTS = st.sampled_from([0, 0, 0, 0, 1, 1, 2, 3, "end", "end", "ragged", "beyond"])
TOUCH = st.sampled_from([False, False, True, True, True, 1])
# Tiers: mostly the device, then the host; 2 is refused.
TIER = st.sampled_from([0] * 6 + [1, 1, 2])
# Namespaces: mostly the default; "lora" and 7 and b"salt" are three others; [] is unhashable.
NAMESPACE = st.sampled_from([None] * 6 + ["lora", "lora", 7, b"salt", []])
# Extra tags: mostly none; else a pattern of tags (mostly 0) repeated over the key's pages,
# as a list or a uint64 array; now and then a bad value.
TAGS = st.one_of(
    st.none(),
    st.none(),
    st.tuples(st.lists(st.sampled_from([0, 0, 0, 1, 2]), min_size=1, max_size=4), st.booleans()),
    st.sampled_from(["negative", "long", "float"]),
)


def plain(value: Any) -> Any:
    """A return value as comparable plain Python."""
    if isinstance(value, np.ndarray):
        return ("array", str(value.dtype), value.shape, value.tolist())
    if hasattr(value, "lengths") and hasattr(value, "best"):  # MetaMatch
        listed = value.length_list  # first: before the array is made from the same row
        lengths, host = value.lengths, value.host_lengths
        assert listed == lengths.tolist() and all(type(v) is int for v in listed)
        assert value.lengths is lengths  # made once
        found = int(value.tree_length)
        key = value.prefix_key
        best = value.best()
        return ("match", str(lengths.dtype), lengths.tolist(), host.tolist(), found, best, key)
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    return value


Page = tuple[Tokens, tuple[WorkerId, ...], Hashable, Tokens, tuple[WorkerId, ...]]


def tags_of(extras: Any, key: Tokens, p: int) -> Tokens:
    """A record's extras as a tuple of one tag per page of ``key``."""
    return (0,) * (len(key) // p) if extras is None else tuple(int(t) for t in extras)


def node_pages(tree: Any) -> list[Page]:
    """A tree's ``items()`` expanded to one (page path, holders, namespace, page tags, host
    holders) per page, in path order (namespace by namespace, as ``namespaces()`` lists them)."""
    p = tree.page_size
    order = tree.namespaces()
    items = []
    for key, holders, ns, extras, host in tree.items():
        toks = tuple(int(t) for t in key)
        items.append((toks, holders, ns, tags_of(extras, toks, p), host))
    ends = {(ns, key, tags) for key, _, ns, tags, _ in items}
    out = []
    for key, holders, ns, tags, host in items:
        start = max(
            (
                len(e)
                for n, e, t in ends
                if n == ns and len(e) < len(key) and key[: len(e)] == e and tags[: len(t)] == t
            ),
            default=0,
        )
        for end in range(start + p, len(key) + 1, p):
            out.append((key[:end], holders, ns, tags[: end // p], host))
    return sorted(out, key=lambda page: (order.index(page[2]), page[0], page[3]))


def plain_records(records: Any) -> list[tuple[Any, ...]]:
    """Records (items, dumps, block entries) with their arrays as lists."""
    return [tuple(x.tolist() if isinstance(x, np.ndarray) else x for x in r) for r in records]


def dump_pages(tree: Any, worker: WorkerId, tier: int) -> list[tuple[Hashable, Tokens, Tokens]]:
    """A tree's ``dump(worker)`` records of ``tier`` expanded to (namespace, page path, page
    tags), deepest first within each record."""
    p = tree.page_size
    out: list[tuple[Hashable, Tokens, Tokens]] = []
    for key, start, ns, extras, of in tree.dump(worker):
        if of != tier:
            continue
        toks = tuple(int(t) for t in key)
        tags = tags_of(extras, toks, p)
        assert start % p == 0 and start < len(toks)
        out.extend((ns, toks[:end], tags[: end // p]) for end in range(len(toks), start, -p))
    return out


class MetaMachine(RuleBasedStateMachine):
    """Drives every MetaCore in ``META_CORES`` and a BruteForceMetaTree with the same calls."""

    CORES: tuple[type, ...] = tuple(META_CORES.values())
    PRE_ADDED = (1, 4)  # bounds on the workers added by `create`
    HOT_FROM = 0  # "hot" picks prefer live workers with at least this index
    MAX_LIVE = 8
    # Compare every worker's held tokens, block map and dump after every step; else only
    # the hot workers' and those the step named, and every worker's at teardown. (The pages
    # of every worker are compared after every step anyway, through items().)
    ALL_WORKERS_EVERY_STEP = True

    @initialize(page_size=st.sampled_from([1, 4]), data=st.data())
    def create(self, page_size: int, data: st.DataObject) -> None:
        self.p = page_size
        self.trees = [cls(page_size) for cls in self.CORES]
        self.model = BruteForceMetaTree(page_size)
        self.sides: list[Any] = [*self.trees, self.model]
        pools = meta_key_pools(page_size, min_stems=3, max_stems=6)
        self.stems: list[list[int]] = data.draw(pools, label="stems")
        self.ids: list[WorkerId] = []  # every WorkerId handed out, removed ones included
        self.holds: list[int] = []  # every hold id handed out, released ones included
        self.named: set[WorkerId] = set()  # workers named since the last invariant
        low, high = self.PRE_ADDED
        count = data.draw(st.integers(low, high), label="pre-added workers")
        capacity = st.sampled_from([None, None, 2, 4, 6, 8])
        for i in range(count):
            self.add_worker(i, 0, data.draw(capacity, label=f"capacity of w{i}"), False)
        # Swarm testing switches whole rules off in some runs; starting from a populated,
        # branching tree (every stem, each for some worker) keeps those runs meaningful.
        owners = st.lists(st.integers(0, 1000), min_size=len(self.stems), max_size=len(self.stems))
        for stem, owner in zip(self.stems, data.draw(owners, label="stem owners"), strict=True):
            w = self.who(("hot", owner))
            self.call(lambda t, w=w, k=stem: t.insert(k, w))

    # -- helpers ------------------------------------------------------------------------
    def key(self, spec: tuple[int, int, Tokens]) -> list[int]:
        index, drop, tail = spec
        stem = self.stems[index % len(self.stems)]
        return stem[: max(0, len(stem) - drop * self.p)] + list(tail)

    def start(self, spec: Any, key: list[int]) -> int:
        whole = len(key) // self.p * self.p
        if spec == "end":
            return whole
        if spec == "ragged":
            return 1 if self.p > 1 else -1
        if spec == "beyond":
            return whole + self.p
        return min(int(spec) * self.p, whole)

    def tags(self, spec: Any, toks: list[int]) -> Any:
        """The extras argument ``spec`` (see TAGS) makes for key ``toks``."""
        pages = len(toks) // self.p
        if spec is None:
            return None
        if spec == "negative":
            return [-1] * pages
        if spec == "long":
            return [0] * (pages + 1)
        if spec == "float":
            return [0.5] * pages
        pattern, as_array = spec
        tags = [pattern[i % len(pattern)] for i in range(pages)]
        return np.array(tags, dtype=np.uint64) if as_array else tags

    def live(self) -> tuple[WorkerId, ...]:
        return self.model.workers

    def who(self, spec: tuple[str, int]) -> WorkerId:
        w = self._who(spec)
        self.named.add(w)
        return w

    def _who(self, spec: tuple[str, int]) -> WorkerId:
        kind, number = spec
        live = self.live()
        if kind == "stale":
            removed = [w for w in self.ids if w not in live]
            if removed:
                return removed[number % len(removed)]
        if kind == "hot":
            live = tuple(w for w in live if w.index >= self.HOT_FROM) or live
        if kind in ("hot", "any") and live:
            return live[number % len(live)]
        return WorkerId(f"foreign{number % 3}", 0, number % (self.model.n_workers + 1), 9)

    def call(self, fn: Callable[[Any], Any]) -> tuple[Any, ...]:
        """Apply ``fn`` to every side; require the same outcome; return it."""
        outcomes: list[tuple[Any, ...]] = []
        for side in self.sides:
            try:
                outcomes.append(("ok", plain(fn(side))))
            except RadixMetaError as exc:
                outcomes.append(("error", type(exc).__name__, str(exc)))
        assert all(o == outcomes[0] for o in outcomes), outcomes
        return outcomes[0]

    # -- rules: workers ---------------------------------------------------------------------
    def add_worker(self, name: int, dp_rank: int, capacity: int | None, ragged: bool) -> None:
        # Capacities are mostly whole pages; a ragged one makes eviction round up.
        cap = None if capacity is None else capacity * self.p + (ragged and self.p > 1)
        outcome = self.call(lambda t: t.add_worker(f"w{name}", dp_rank, capacity=cap))
        if outcome[0] == "ok":
            self.ids.append(outcome[1])

    @precondition(lambda self: len(self.live()) < self.MAX_LIVE)
    @rule(
        name=st.integers(0, 80),
        dp_rank=st.sampled_from([0, 0, 1]),
        capacity=st.sampled_from([None, None, 0, 1, 2, 4, 6]),
        ragged=st.booleans(),
    )
    def add(self, name: int, dp_rank: int, capacity: int | None, ragged: bool) -> None:
        self.add_worker(name, dp_rank, capacity, ragged)

    @rule(who=WHO, really=st.sampled_from([False, False, True]))
    def remove_worker(self, who: tuple[str, int], really: bool) -> None:
        # `really` makes removals rarer, so that trees get time to grow between them.
        w = self.who(who)
        if really or w not in self.live():
            self.call(lambda t: t.remove_worker(w))
        self.call(lambda t: t.capacity_of(w))
        self.call(lambda t: t.worker(w.name, w.dp_rank))

    @rule(
        who=WHO,
        capacity=st.sampled_from([0, 1, 2, 3, 4, 6, 12, None, -1, "4", 2**63]),
        ragged=st.booleans(),
    )
    def set_capacity(self, who: tuple[str, int], capacity: Any, ragged: bool) -> None:
        # Mostly whole pages, smaller and larger than what the worker holds; also None,
        # bad values and exact, stale or foreign workers, which every side must refuse alike.
        w = self.who(who)
        cap = capacity
        if type(capacity) is int and 0 <= capacity < 100:
            cap = capacity * self.p + (ragged and self.p > 1)
        self.call(lambda t: t.set_capacity(w, cap))
        self.call(lambda t: t.capacity_of(w))

    # -- rules: token paths -------------------------------------------------------------------
    @rule(
        calls=st.lists(
            st.tuples(WHO, KEYS, STARTS, st.booleans(), NAMESPACE, TAGS, TIER),
            min_size=1,
            max_size=3,
        )
    )
    def insert(self, calls: list[tuple[Any, Any, Any, bool, Any, Any, int]]) -> None:
        # Up to three inserts per step, so that trees grow between removals and evictions.
        for who, key, start, as_array, ns, tags, tier in calls:
            w, toks = self.who(who), self.key(key)
            kw = {"start": self.start(start, toks), "extras": self.tags(tags, toks)}
            kw["namespace"], kw["tier"] = ns, tier
            arg = np.array(toks, dtype=np.int64) if as_array else toks
            self.call(lambda t, w=w, arg=arg, kw=kw: t.insert(arg, w, **kw))

    @rule(who=WHO, key=KEYS, start=STARTS, ns=NAMESPACE, tags=TAGS, tier=TIER)
    def remove(
        self, who: tuple[str, int], key: Any, start: Any, ns: Any, tags: Any, tier: int
    ) -> None:
        w, toks = self.who(who), self.key(key)
        kw = {"start": self.start(start, toks), "namespace": ns, "extras": self.tags(tags, toks)}
        kw["tier"] = tier
        self.call(lambda t: t.remove(toks, w, **kw))

    @rule(
        key=KEYS,
        touch=TOUCH,
        who=WHO,
        ns=NAMESPACE,
        tags=TAGS,
        optimistic=st.sampled_from([True, True, False, "yes"]),
    )
    def match(
        self, key: Any, touch: Any, who: tuple[str, int], ns: Any, tags: Any, optimistic: Any
    ) -> None:
        toks = self.key(key)
        kw = {"namespace": ns, "extras": self.tags(tags, toks)}
        outcome = self.call(lambda t: t.match(toks, touch=touch, optimistic=optimistic, **kw))
        if outcome[0] == "ok":
            # length_of on a fresh match: a live worker, or the same error everywhere.
            w = self.who(who)
            self.call(lambda t: t.match(toks, **kw).length_of(w))
            self.call(lambda t: t.match(toks, **kw).length_of(w, tier=1))

    @rule(
        keys=st.lists(st.tuples(KEYS, TAGS), max_size=4),
        touch=TOUCH,
        as_array=st.booleans(),
        ns=NAMESPACE,
        tagged=st.booleans(),
        tier=TIER,
    )
    def match_many(
        self, keys: list[Any], touch: Any, as_array: bool, ns: Any, tagged: bool, tier: int
    ) -> None:
        rows: Any = [self.key(k) for k, _ in keys]
        extras = [self.tags(t, row) for (_, t), row in zip(keys, rows, strict=True)]
        if as_array and rows and len({len(r) for r in rows}) == 1:
            rows = np.array(rows, dtype=np.int64).reshape(len(rows), -1)
        kw = {"touch": touch, "namespace": ns, "extras": extras if tagged else None, "tier": tier}
        self.call(lambda t: t.match_many(rows, **kw))

    # -- rules: holds and cursors ----------------------------------------------------------------
    def record_hold(self, outcome: tuple[Any, ...]) -> None:
        if outcome[0] == "ok":
            self.holds.append(outcome[1])

    @rule(who=WHO, key=KEYS, ns=NAMESPACE, tags=TAGS, as_array=st.booleans())
    def hold(self, who: tuple[str, int], key: Any, ns: Any, tags: Any, as_array: bool) -> None:
        w, toks = self.who(who), self.key(key)
        arg = np.array(toks, dtype=np.uint32) if as_array else toks
        kw = {"namespace": ns, "extras": self.tags(tags, toks)}
        self.record_hold(self.call(lambda t: t.hold(arg, w, **kw)))

    @precondition(lambda self: bool(self.holds))
    @rule(pick=st.integers(0, 1000), bad=st.sampled_from([None] * 8 + ["huge", "negative", "str"]))
    def release(self, pick: int, bad: Any) -> None:
        hold: Any = self.holds[pick % len(self.holds)]  # maybe released already: stale
        if bad == "huge":
            hold = 2**70
        elif bad == "negative":
            hold = -1
        elif bad == "str":
            hold = "0"
        self.call(lambda t: t.release(hold))

    @rule(
        key=KEYS,
        who=WHO,
        ns=NAMESPACE,
        tags=TAGS,
        kind=st.sampled_from(["hold", "hold", "insert", "insert", "none"]),
        tier=TIER,
        between=st.sampled_from([None, None, "insert", "hold", "match", "remove"]),
        other=KEYS,
        twice=st.booleans(),
    )
    def cursor_mark(
        self,
        key: Any,
        who: tuple[str, int],
        ns: Any,
        tags: Any,
        kind: str,
        tier: int,
        between: Any,
        other: Any,
        twice: bool,
    ) -> None:
        """A cursor match, maybe another call, then a mark from the match (``none``: from a
        match that kept no cursor, which is refused)."""
        w, toks = self.who(who), self.key(key)
        kw = {"namespace": ns, "extras": self.tags(tags, toks)}
        matches: list[Any] = []

        def keep(t: Any) -> Any:
            m = t.match(toks, cursor=kind != "none", **kw)
            matches.append(m)
            return m

        if self.call(keep)[0] != "ok":
            return
        v, rest = self.who(("hot", len(toks))), self.key(other)
        if between == "insert":
            self.call(lambda t: t.insert(rest, v))
        elif between == "hold":
            self.record_hold(self.call(lambda t: t.hold(rest, v)))
        elif between == "match":
            self.call(lambda t: t.match(rest, cursor=True))  # the tree's kept walk is another's
        elif between == "remove":
            self.call(lambda t: t.remove(rest, v))
        for _ in range(2 if twice else 1):
            mark = iter(matches)
            if kind == "insert" or (kind == "none" and tier == 1):
                self.call(lambda t, mark=mark: next(mark).insert(w, tier=tier))
            else:
                self.record_hold(self.call(lambda t, mark=mark: next(mark).hold(w)))

    # -- rules: block events -------------------------------------------------------------------
    @rule(
        who=WHO,
        key=KEYS,
        parent=st.integers(0, 4),
        blocks=st.integers(0, 4),
        variant=st.just("ok") | st.sampled_from(STORED_VARIANTS),
        ns=NAMESPACE,
        tags=TAGS,
    )
    def apply_stored(
        self,
        who: tuple[str, int],
        key: Any,
        parent: int,
        blocks: int,
        variant: str,
        ns: Any,
        tags: Any,
    ) -> None:
        w, toks = self.who(who), self.key(key)
        whole = len(toks) // self.p
        parent = min(parent, whole)
        extras = self.tags(tags, toks)
        extras = extras.tolist() if isinstance(extras, np.ndarray) else extras
        op = ApplyStored(0, toks, parent, min(blocks, whole - parent), variant, ns, extras)
        self.call(lambda t: apply_meta_operation(t, op, lambda _: w))

    @rule(
        who=WHO,
        pick=st.integers(0, 1000),
        stem=st.integers(0, 7),
        blocks=st.integers(1, 3),
        signed=st.booleans(),
        bad=st.sampled_from([None] * 6 + ["cycle", "repeat", "other", "count", "namespace"]),
        ns=NAMESPACE,
        tagged=st.sampled_from([False, False, True]),
        tier=TIER,
    )
    def stored_chain(
        self,
        who: tuple[str, int],
        pick: int,
        stem: int,
        blocks: int,
        signed: bool,
        bad: Any,
        ns: Any,
        tagged: bool,
        tier: int,
    ) -> None:
        """An event chained onto a block the worker holds (in the parent's namespace, after
        its tags), or onto the root of ``ns``; ``tagged`` tags its first block; ``bad``
        spoils it ("namespace": the parent is in another one)."""
        w = self.who(who)
        entries = self.model._block_entries(w) if w in self.live() else []
        base_tags: Tokens = ()
        if entries and pick % 4:
            parent, base_arr, ns, base_extras = entries[pick % len(entries)]
            base: list[int] = [int(t) for t in base_arr]
            base_tags = tags_of(base_extras, tuple(base), self.p)
            if bad == "namespace":
                ns = "elsewhere"
        else:
            parent, base = None, []
        # Continue along a stem that extends the parent's page if there is one.
        stems = [s for s in self.stems if s[: len(base)] == base and len(s) > len(base)]
        if stems:
            cont = stems[stem % len(stems)][len(base) : len(base) + blocks * self.p]
        else:
            cont = [stem % 3] * (blocks * self.p)
        n = len(cont) // self.p
        tags = [1 + pick % 2 if tagged and i == 0 else 0 for i in range(n)]
        space = None if isinstance(ns, list) else ns  # as ApplyStored hashes an unhashable one
        path, path_tags = base + cont, base_tags + tuple(tags)
        depth = len(base_tags)
        hashes = [
            block_hash_of(path[: (depth + i + 1) * self.p], 0, space, path_tags[: depth + i + 1])
            for i in range(n)
        ]
        tokens = cont[: n * self.p]
        if bad == "cycle" and parent is not None:
            hashes[-1] = parent
        elif bad == "repeat":
            hashes.append(hashes[0])
            tokens = tokens + tokens[: self.p]
        elif bad == "other" and entries:
            hashes[-1] = entries[(pick + 1) % len(entries)][0]  # names another page (or this one)
        elif bad == "count":
            tokens = tokens[:-1]
        if signed:
            hashes = [h - 2**64 if h >= 2**63 else h for h in hashes]
        extras = tags if any(tags) else None
        kw = {"namespace": ns, "extras": extras, "tier": tier}
        self.call(lambda t: t.apply_stored(w, parent, hashes, tokens, **kw))

    @rule(
        who=WHO, pick=st.lists(st.integers(0, 1000), max_size=3), unknown=st.booleans(), tier=TIER
    )
    def removed_known(
        self, who: tuple[str, int], pick: list[int], unknown: bool, tier: int
    ) -> None:
        """BlockRemoved of hashes the worker holds (plus, maybe, one it does not)."""
        w = self.who(who)
        entries = self.model._block_entries(w) if w in self.live() else []
        hashes = [int(entries[k % len(entries)][0]) for k in pick] if entries else []
        if unknown:
            hashes.append(12345)
        self.call(lambda t: t.apply_removed(w, hashes, tier=tier))

    @rule(
        who=WHO,
        key=KEYS,
        first=st.integers(0, 3),
        salt=st.sampled_from([0, 0, 1]),
        tier=st.sampled_from([0] * 9 + [1]),
        ns=NAMESPACE,
        tags=TAGS,
    )
    def apply_removed(
        self, who: tuple[str, int], key: Any, first: int, salt: int, tier: int, ns: Any, tags: Any
    ) -> None:
        """BlockRemoved of the hashes the key's pages have in ``ns`` with ``tags``."""
        w, toks = self.who(who), self.key(key)
        extras = self.tags(tags, toks)
        extras = extras.tolist() if isinstance(extras, np.ndarray) else extras
        op = ApplyRemoved(0, toks, first, salt, tier, ns, extras)
        self.call(lambda t: apply_meta_operation(t, op, lambda _: w))

    @rule(
        who=WHO,
        really=st.sampled_from([False, False, True]),
        tier=st.sampled_from([None, None, 0, 1, 2]),
    )
    def apply_cleared(self, who: tuple[str, int], really: bool, tier: int | None) -> None:
        w = self.who(who)
        if really or w not in self.live():
            self.call(lambda t: t.apply_cleared(w, tier=tier))

    @rule(
        records=st.lists(
            st.tuples(
                st.sampled_from(["stored", "stored", "removed", "cleared", "junk"]),
                WHO,
                KEYS,
                st.integers(0, 3),
                st.sampled_from(["ok", "ok", "ok", "unknown_parent", "cycle", "other_page"]),
                NAMESPACE,
                TAGS,
            ),
            max_size=5,
        )
    )
    def apply_events(self, records: list[Any]) -> None:
        workers: list[WorkerId] = []
        built: list[Any] = []
        for kind, who, key, pages, variant, ns, tags in records:
            workers.append(self.who(who))
            k, toks = len(workers) - 1, self.key(key)
            whole = len(toks) // self.p
            extras = self.tags(tags, toks)
            extras = extras.tolist() if isinstance(extras, np.ndarray) else extras
            if kind == "stored":
                parent = min(pages, whole)
                built.append(ApplyStored(k, toks, parent, whole - parent, variant, ns, extras))
            elif kind == "removed":
                built.append(ApplyRemoved(k, toks, pages, 0, 0, ns, extras))
            elif kind == "cleared":
                built.append(ApplyCleared(k))
            else:
                built.append("junk")
        op = ApplyEvents(tuple(built))
        self.call(lambda t: apply_meta_operation(t, op, lambda k: workers[k]))

    # -- invariant ------------------------------------------------------------------------------
    @invariant()
    def all_agree(self) -> None:
        if not hasattr(self, "sides"):
            return
        for tree in self.trees:
            tree.check()
        self.model.check()
        first = self.trees[0]
        items = plain_records(first.items())
        for tree in self.trees[1:]:
            assert plain_records(tree.items()) == items
            assert tree.node_count == first.node_count == len(items)
        for side in self.sides:
            assert side.workers == self.model.workers
            assert side.n_workers == self.model.n_workers
            assert side.namespaces() == self.model.namespaces()
        assert node_pages(first) == self.model.items()
        for w in self.model.workers:
            if self.ALL_WORKERS_EVERY_STEP or w in self.named or w.index >= self.HOT_FROM:
                self.compare_worker(w)
        self.named.clear()
        for stem in self.stems:
            self.call(lambda t, s=stem: t.match(s))

    def compare_worker(self, w: WorkerId) -> None:
        """Held tokens, block map and dump of ``w`` equal everywhere (dumps as pages for the
        model, in recency order for an approximate worker)."""
        exact = self.model.capacity_of(w) is None
        for tree in self.trees:
            assert tree.held_tokens(w) == self.model.held_tokens(w)
            assert tree.held_tokens(w, tier=1) == self.model.held_tokens(w, tier=1)
            entries = plain_records(tree._block_entries(w))
            assert entries == plain_records(self.model._block_entries(w))
            assert tree.capacity_of(w) == self.model.capacity_of(w)
            assert tree.worker(w.name, w.dp_rank) == w
            assert tree.hold_tokens(w) == self.model.hold_tokens(w)
            assert tree.hold_count == self.model.hold_count
            for tier in (0, 1):
                pages = dump_pages(tree, w, tier)
                if exact or tier == 1:
                    pages.sort(key=self.model.page_order)
                assert pages == self.model.pages(w, tier), (w, tier, pages)
        dumps = [plain_records(tree.dump(w)) for tree in self.trees]
        assert all(d == dumps[0] for d in dumps)

    def teardown(self) -> None:
        # Removing every worker must free every node.
        if hasattr(self, "sides"):
            for w in self.live():
                self.compare_worker(w)
            for w in self.live():
                self.call(lambda t, w=w: t.remove_worker(w))
            for tree in self.trees:
                assert tree.node_count == 0 and not tree.items()
                tree.check()


class ManyWorkersMachine(MetaMachine):
    """66 to 70 workers from the start; most traffic goes to indices 64 and up."""

    PRE_ADDED = (66, 70)
    HOT_FROM = 64
    MAX_LIVE = 72
    ALL_WORKERS_EVERY_STEP = False


# Runs are cheap while the trees stay small, so the machines get more than the profile's
# example budget (ci: 200 examples of up to 50 steps). The many-worker machine compares
# ~70 workers' state after every step, so it gets less.
def _budget(examples: float, steps: float) -> settings:
    current = settings()
    return settings(
        max_examples=max(10, int(current.max_examples * examples)),
        stateful_step_count=max(10, int(current.stateful_step_count * steps)),
    )


def test_meta_machine() -> None:
    """A few workers, page sizes 1 and 4: every MetaCore and the model agree at every step."""
    run_state_machine_as_test(MetaMachine, settings=_budget(1, 1))


def test_meta_machine_many_workers() -> None:
    """66 to 70 workers, so worker sets span more than one 64-bit word."""
    run_state_machine_as_test(ManyWorkersMachine, settings=_budget(0.5, 1))


def test_machine_covers_every_core() -> None:
    """The machine drives every MetaCore that exists (the native one once it is built)."""
    assert tuple(META_CORES.values()) == MetaMachine.CORES
    assert META_CORES["reference"].__module__ == "radixmeta._reference_meta"


# -- the testing kit itself ----------------------------------------------------------------------
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), page_size=st.sampled_from([1, 2, 4]))
def test_operation_lists_agree(meta_impl: type, data: st.DataObject, page_size: int) -> None:
    """``run_meta_operations`` gives the same outcomes on every core and on the model."""
    ops = data.draw(meta_operations(page_size=page_size, max_workers=4), label="ops")
    tree, model = meta_impl(page_size), BruteForceMetaTree(page_size)
    assert run_meta_operations(tree, ops) == run_meta_operations(model, ops)
    tree.check()
    model.check()
    assert node_pages(tree) == model.items()


def test_testing_meta_doctests() -> None:
    result = doctest.testmod(radixmeta.testing_meta, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 5
    assert result.failed == 0


def test_model_has_the_meta_api() -> None:
    def public(cls: type) -> set[str]:
        return {name for name in dir(cls) if not name.startswith("_")}

    structural = {"node_count", "memory_usage"}
    assert public(META_CORES["reference"]) - structural <= public(BruteForceMetaTree)


def test_model_refuses_what_the_trees_refuse() -> None:
    model = BruteForceMetaTree(2)
    w = model.add_worker("w")
    with pytest.raises(UnknownParentError):
        model.apply_stored(w, 1, [2], [3, 4])
    model.apply_stored(w, None, [1], [3, 4])
    with pytest.raises(BlockConflictError):
        model.apply_stored(w, None, [1], [5, 5])
    assert model.apply_events([("stored", w, 1, [1], [6, 6]), ("cleared", w)]).tolist() == [2, 0]
    model.check()


def test_native_meta_core_is_under_test() -> None:
    """The machine and every meta_impl test cover the native core, not the reference alone."""
    require_native()
    assert "native" in META_CORES
