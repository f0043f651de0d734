"""Every bad input of every MetaCore method, on every implementation: exception class, exact
message, and a tree left exactly as it was.

Messages are spelled out in full, so that the native core and the reference must produce the
same text; where two arguments are bad, the first in the documented checking order wins.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from radixmeta import BlockStatus, WorkerId
from radixmeta.errors import (
    BlockConflictError,
    DuplicateWorkerError,
    InputTypeError,
    InvalidInputError,
    RadixMetaError,
    StaleWorkerError,
    UnknownParentError,
)

RANGE = "is outside the 64-bit hash range [-2**63, 2**64)"
TIER2 = "tier must be 0 (device) or 1 (host), got 2"
NOT_WORKER = "worker must be a WorkerId returned by add_worker, got {}"
GONE = WorkerId("gone", 0, 3, 0)  # removed; its index 3 now belongs to ("reused", 0) gen 1
OLD_A = WorkerId("a", 0, 0, 5)  # a's index and name, another generation
FAR = WorkerId("far", 0, 99, 0)  # an index this tree never used
OTHER_NAME = WorkerId("other-tree", 0, 0, 0)  # index 0, generation 0, another name


def exactly(message: str) -> str:
    return f"^{re.escape(message)}$"


def stale(worker: WorkerId) -> str:
    return f"{worker!r} is not a live worker of this tree (removed, or from another tree)"


def populated(cls: type) -> tuple[Any, dict[str, WorkerId]]:
    """A tree (page size 2) with exact and approximate workers, token paths, block hashes
    (one signed), pages in two other namespaces, a removed worker and its index reused."""
    tree = cls(2)
    a = tree.add_worker("a")
    b = tree.add_worker("b", 1)
    c = tree.add_worker("c", capacity=8)
    gone = tree.add_worker("gone")
    tree.insert([1, 2, 3, 4, 5, 6], a)
    tree.insert([1, 2, 3, 4, 9, 9], b, start=2)
    tree.insert([1, 2, 7, 7], c)
    tree.apply_stored(a, None, [0xA1, 0xA2], [1, 2, 3, 4])
    tree.apply_stored(b, None, [0xB1], [5, 5])
    tree.apply_stored(c, None, [-5], [8, 8])
    tree.insert([1, 2, 3, 4], b, namespace="lora")
    tree.apply_stored(a, None, [0xC1], [1, 2], namespace=("salt", 1))
    tree.apply_stored(b, None, [0x7E1], [1, 2], extras=[0xE])
    tree.insert([1, 2, 9, 9], c, extras=[0, 2**63])
    tree.insert([1, 2, 3, 4, 5, 6], b, tier=1)  # b on the host, beside its device pages
    tree.apply_stored(a, None, [0xA1, 0xA2], [1, 2, 3, 4], tier=1)  # a on both tiers
    tree.insert([3, 3, 3, 3], gone)
    tree.remove_worker(gone)
    reused = tree.add_worker("reused")
    assert gone == GONE and reused == WorkerId("reused", 0, 3, 1)
    tree.match([1, 2, 7, 7], touch=True)
    return tree, {"a": a, "b": b, "c": c, "reused": reused}


def plain(records: Any) -> list[tuple[Any, ...]]:
    """Records (items, dumps, block entries) with their arrays as lists."""
    return [tuple(x.tolist() if isinstance(x, np.ndarray) else x for x in r) for r in records]


def state(tree: Any) -> dict[str, Any]:
    """Everything observable without changing the tree."""
    out: dict[str, Any] = {
        "items": plain(tree.items()),
        "host_lengths": tree.match([1, 2, 3, 4, 5, 6]).host_lengths.tolist(),
        "namespaces": tree.namespaces(),
        "node_count": tree.node_count,
        "n_workers": tree.n_workers,
        "workers": tree.workers,
    }
    for w in tree.workers:
        out[w.name] = (
            plain(tree.dump(w)),
            tree.held_tokens(w),
            tree.held_tokens(w, tier=1),
            plain(tree._block_entries(w)),
            tree.capacity_of(w),
        )
    return out


Call = Callable[[Any, dict[str, WorkerId]], Any]
CASES: list[tuple[str, Call, type[RadixMetaError], str]] = []


def case(name: str, exc: type[RadixMetaError], message: str) -> Callable[[Call], Call]:
    def register(fn: Call) -> Call:
        CASES.append((name, fn, exc, message))
        return fn

    return register


# -- workers ------------------------------------------------------------------------------
for name, args, kwargs, exc, message in [
    ("name int", (5,), {}, InputTypeError, "worker name must be a str, got int"),
    ("name None", (None,), {}, InputTypeError, "worker name must be a str, got NoneType"),
    ("rank negative", ("x", -1), {}, InvalidInputError, "dp_rank must be >= 0, got -1"),
    ("rank float", ("x", 0.5), {}, InputTypeError, "dp_rank must be an integer, got float"),
    ("rank bool", ("x", True), {}, InputTypeError, "dp_rank must be an integer, got bool"),
    ("capacity negative", ("x",), {"capacity": -3}, InvalidInputError,
     "capacity must be >= 0, got -3"),
    ("capacity float", ("x",), {"capacity": 2.0}, InputTypeError,
     "capacity must be an integer, got float"),
    ("duplicate", ("a",), {}, DuplicateWorkerError,
     "worker ('a', dp_rank=0) is already registered"),
    ("duplicate rank", ("b", 1), {"capacity": 4}, DuplicateWorkerError,
     "worker ('b', dp_rank=1) is already registered"),
    ("name before rank", (5, -1), {}, InputTypeError, "worker name must be a str, got int"),
]:  # fmt: skip
    case(f"add_worker: {name}", exc, message)(
        lambda t, w, args=args, kwargs=kwargs: t.add_worker(*args, **kwargs)
    )

for name, args, exc, message in [
    ("unknown", ("nobody",), StaleWorkerError, "no worker ('nobody', dp_rank=0) is registered"),
    ("removed", ("gone",), StaleWorkerError, "no worker ('gone', dp_rank=0) is registered"),
    ("other rank", ("a", 1), StaleWorkerError, "no worker ('a', dp_rank=1) is registered"),
    ("int name", (5,), StaleWorkerError, "no worker (5, dp_rank=0) is registered"),
    ("rank negative", ("a", -1), InvalidInputError, "dp_rank must be >= 0, got -1"),
    ("rank str", ("a", "0"), InputTypeError, "dp_rank must be an integer, got str"),
]:
    case(f"worker: {name}", exc, message)(lambda t, w, args=args: t.worker(*args))

# Every method that takes a worker refuses the same bad ones, before looking at anything else.
WORKER_METHODS: dict[str, Callable[[Any, Any], Any]] = {
    "remove_worker": lambda t, x: t.remove_worker(x),
    "capacity_of": lambda t, x: t.capacity_of(x),
    "held_tokens": lambda t, x: t.held_tokens(x),
    "dump": lambda t, x: t.dump(x),
    "items": lambda t, x: t.items(x),
    "apply_cleared": lambda t, x: t.apply_cleared(x),
    "_block_entries": lambda t, x: t._block_entries(x),
    "insert": lambda t, x: t.insert("not a key", x, start=-1),
    "remove": lambda t, x: t.remove([1.5], x),
    "apply_stored": lambda t, x: t.apply_stored(x, 1.5, "bad", None, tier=9),
    "apply_removed": lambda t, x: t.apply_removed(x, "bad", tier=9),
    "_bind_hash": lambda t, x: t._bind_hash(x, [1, 2], 0xA1),
}
for method, fn in WORKER_METHODS.items():
    for bad, exc, message in [
        (GONE, StaleWorkerError, stale(GONE)),
        (OLD_A, StaleWorkerError, stale(OLD_A)),
        (FAR, StaleWorkerError, stale(FAR)),
        (OTHER_NAME, StaleWorkerError, stale(OTHER_NAME)),
        ("a", InputTypeError, NOT_WORKER.format("str")),
        (("a", 0, 0, 0), InputTypeError, NOT_WORKER.format("tuple")),
        (0, InputTypeError, NOT_WORKER.format("int")),
    ]:
        case(f"{method}: {bad!r}", exc, message)(lambda t, w, fn=fn, bad=bad: fn(t, bad))

# -- keys and start -----------------------------------------------------------------------
BAD_KEYS: list[tuple[str, Any, type[RadixMetaError], str]] = [
    ("str", "abc", InputTypeError, "key must be a sequence of integers, got str"),
    ("bytes", b"ab", InputTypeError, "key must be a sequence of integers, got bytes"),
    ("None", None, InputTypeError, "key must be a sequence of integers, got NoneType"),
    ("int", 7, InputTypeError, "key must be a sequence of integers, got int"),
    ("float token", [1, 2.5], InputTypeError, "key[1] must be an integer, got float"),
    ("str token", [1, "2"], InputTypeError, "key[1] must be an integer, got str"),
    ("negative", [1, -1], InvalidInputError, "key[1] = -1 is outside the token range [0, 2**32)"),
    ("too big", [2**32], InvalidInputError,
     "key[0] = 4294967296 is outside the token range [0, 2**32)"),
    ("2-D", np.zeros((2, 2), dtype=np.int64), InvalidInputError,
     "key must be 1-D, got an array with 2 dimensions"),
    ("float array", np.array([1.0, 2.0]), InputTypeError,
     "key must hold integers, got dtype float64"),
]  # fmt: skip
for label, key, exc, message in BAD_KEYS:
    case(f"insert: key {label}", exc, message)(lambda t, w, key=key: t.insert(key, w["a"]))
    case(f"remove: key {label}", exc, message)(lambda t, w, key=key: t.remove(key, w["c"]))
    case(f"match: key {label}", exc, message)(lambda t, w, key=key: t.match(key, touch=True))
    case(f"match_many: key {label}", exc, message)(
        lambda t, w, key=key: t.match_many([[1, 2], key], touch=True)
    )
    case(f"apply_stored: tokens {label}", exc, message)(
        lambda t, w, key=key: t.apply_stored(w["a"], None, [0xF1], key)
    )

for label, start, exc, message in [
    ("str", "2", InputTypeError, "start must be an integer, got str"),
    ("float", 2.0, InputTypeError, "start must be an integer, got float"),
    ("bool", True, InputTypeError, "start must be an integer, got bool"),
    ("None", None, InputTypeError, "start must be an integer, got NoneType"),
    ("negative", -2, InvalidInputError, "start must be >= 0, got -2"),
    ("ragged", 1, InvalidInputError, "start must be a multiple of page_size (2), got 1"),
    ("beyond", 6, InvalidInputError, "start = 6 is beyond the key's 4 whole-page tokens"),
    ("numpy beyond", np.int64(6), InvalidInputError,
     "start = 6 is beyond the key's 4 whole-page tokens"),
]:  # fmt: skip
    for method in ("insert", "remove"):
        case(f"{method}: start {label}", exc, message)(
            lambda t, w, m=method, s=start: getattr(t, m)([1, 2, 3, 4, 5], w["c"], start=s)
        )
case("insert: key before start", InputTypeError, "key[0] must be an integer, got float")(
    lambda t, w: t.insert([1.5], w["a"], start=-1)
)
case("remove: worker before key", StaleWorkerError, stale(GONE))(
    lambda t, w: t.remove("bad", GONE, start=-1)
)

# -- namespaces -------------------------------------------------------------------------------
UNHASHABLE = "namespace must be hashable, got {}"
NAMESPACE_METHODS: dict[str, Callable[[Any, dict[str, WorkerId], Any], Any]] = {
    "insert": lambda t, w, ns: t.insert([1, 2], w["a"], namespace=ns),
    "remove": lambda t, w, ns: t.remove([1, 2], w["a"], namespace=ns),
    "match": lambda t, w, ns: t.match([1, 2], touch=True, namespace=ns),
    "match_many": lambda t, w, ns: t.match_many([[1, 2]], touch=True, namespace=ns),
    "apply_stored": lambda t, w, ns: t.apply_stored(w["a"], None, [0xF1], [6, 6], namespace=ns),
    "_bind_hash": lambda t, w, ns: t._bind_hash(w["a"], [1, 2], 0xF1, ns),
}
for label, ns in [("list", ["lora"]), ("dict", {}), ("set", {1})]:
    for method, fn in NAMESPACE_METHODS.items():
        case(f"{method}: namespace {label}", InputTypeError, UNHASHABLE.format(label))(
            lambda t, w, fn=fn, ns=ns: fn(t, w, ns)
        )
for method, fn, exc, message in [
    ("insert", lambda t, w: t.insert([1, 2], w["a"], start=1, namespace=[]), InvalidInputError,
     "start must be a multiple of page_size (2), got 1"),
    ("match", lambda t, w: t.match([1, 2], touch=1, namespace=[]), InputTypeError,
     "touch must be a bool, got int"),
    ("apply_stored", lambda t, w: t.apply_stored(w["a"], None, [0xF1], [6.5], namespace=[]),
     InputTypeError, "key[0] must be an integer, got float"),
    ("apply_stored", lambda t, w: t.apply_stored(w["a"], None, [0xF1], [6], namespace=[]),
     InputTypeError, UNHASHABLE.format("list")),
]:  # fmt: skip
    case(f"{method}: checking order with a namespace ({message})", exc, message)(fn)
for label, args, namespace, exc, message in [
    ("parent in another namespace", (0xA1, [0xF1], [6, 6]), "lora", UnknownParentError,
     "parent_hash 0x00000000000000a1 names no block that worker ('a', dp_rank=0) holds "
     "in namespace 'lora'"),
    ("parent of the default namespace", (0xC1, [0xF1], [6, 6]), None, UnknownParentError,
     "parent_hash 0x00000000000000c1 names no block that worker ('a', dp_rank=0) holds"),
    ("hash of another namespace", (None, [0xC1], [1, 2]), None, BlockConflictError,
     "block_hashes[0] = 0x00000000000000c1 already names a different block "
     "of worker ('a', dp_rank=0)"),
    ("hash of the default namespace", (None, [0xA1], [1, 2]), "lora", BlockConflictError,
     "block_hashes[0] = 0x00000000000000a1 already names a different block "
     "of worker ('a', dp_rank=0)"),
]:  # fmt: skip
    case(f"apply_stored: {label}", exc, message)(
        lambda t, w, args=args, ns=namespace: t.apply_stored(w["a"], *args, namespace=ns)
    )

# -- extra tags -------------------------------------------------------------------------------
TAG_RANGE = "is outside the tag range [0, 2**64)"
PER_PAGE = "extras must hold one tag per whole page of the key (1), got {}"
BAD_TAGS: list[tuple[str, Any, type[RadixMetaError], str]] = [
    ("too many", [0, 0], InvalidInputError, PER_PAGE.format(2)),
    ("too few", [], InvalidInputError, PER_PAGE.format(0)),
    ("str", "ab", InputTypeError, "extras must be a sequence of integers, got str"),
    ("int", 5, InputTypeError, "extras must be a sequence of integers, got int"),
    ("float", [1.5], InputTypeError, "extras[0] must be an integer, got float"),
    ("bool", [True], InputTypeError, "extras[0] must be an integer, got bool"),
    ("negative", [-1], InvalidInputError, f"extras[0] = -1 {TAG_RANGE}"),
    ("2**64", [2**64], InvalidInputError, f"extras[0] = 18446744073709551616 {TAG_RANGE}"),
    ("negative array", np.array([-3]), InvalidInputError, f"extras[0] = -3 {TAG_RANGE}"),
    ("float array", np.array([1.0]), InputTypeError,
     "extras must hold integers, got dtype float64"),
    ("2-D array", np.zeros((1, 1), dtype=np.uint64), InvalidInputError,
     "extras must be 1-D, got an array with 2 dimensions"),
    ("long array", np.zeros(3, dtype=np.uint64), InvalidInputError, PER_PAGE.format(3)),
]  # fmt: skip
for label, tags, exc, message in BAD_TAGS:
    for method, fn in {
        "insert": lambda t, w, x: t.insert([1, 2, 3], w["a"], extras=x, namespace=[]),
        "remove": lambda t, w, x: t.remove([1, 2], w["a"], extras=x),
        "match": lambda t, w, x: t.match([1, 2], touch=True, extras=x),
        "match_many": lambda t, w, x: t.match_many([[1, 2]], extras=[x]),
        "_bind_hash": lambda t, w, x: t._bind_hash(w["a"], [1, 2], 0xF1, None, x),
        "apply_stored": lambda t, w, x: t.apply_stored(w["a"], None, [0xF1], [6, 6], extras=x),
    }.items():
        if method == "match_many":
            message_of = message.replace("extras", "extras[0]", 1)
        elif method == "apply_stored":
            message_of = message.replace("whole page of the key", "block")
        else:
            message_of = message
        case(f"{method}: extras {label}", exc, message_of)(
            lambda t, w, fn=fn, tags=tags: fn(t, w, tags)
        )
for label, extras, exc, message in [
    ("int", 5, InputTypeError, "extras must be a sequence of per-key extras, got int"),
    ("str", "ab", InputTypeError, "extras must be a sequence of per-key extras, got str"),
    ("one too many", [None, None], InvalidInputError,
     "extras must hold one entry per key (1), got 2"),
    ("2-D rows", np.zeros((2, 1), dtype=np.uint64), InvalidInputError,
     "extras must hold one entry per key (1), got 2"),
]:  # fmt: skip
    case(f"match_many: extras {label}", exc, message)(
        lambda t, w, x=extras: t.match_many([[1, 2]], touch=True, extras=x)
    )
for method, fn, exc, message in [
    ("apply_stored", lambda t, w: t.apply_stored(w["a"], None, [0xF1], [6.5], extras=[-1]),
     InputTypeError, "key[0] must be an integer, got float"),
    ("apply_stored", lambda t, w: t.apply_stored(w["a"], None, [0xF1], [6], extras=[0, 0]),
     InvalidInputError, "extras must hold one tag per block (1), got 2"),
    ("apply_stored",
     lambda t, w: t.apply_stored(w["a"], None, [0xF1], [6], extras=[0], namespace=[]),
     InputTypeError, UNHASHABLE.format("list")),
    ("insert", lambda t, w: t.insert([1, 2], w["a"], start=1, extras=[-1]), InvalidInputError,
     "start must be a multiple of page_size (2), got 1"),
    ("match", lambda t, w: t.match([1.5], extras=[-1]), InputTypeError,
     "key[0] must be an integer, got float"),
    ("match_many", lambda t, w: t.match_many([[1, 2]], touch=1, extras=5), InputTypeError,
     "touch must be a bool, got int"),
]:  # fmt: skip
    case(f"{method}: checking order with extras ({message})", exc, message)(fn)
case("apply_stored: a tagged block's hash names the untagged page", BlockConflictError,
     "block_hashes[0] = 0x00000000000000a1 already names a different block of "
     "worker ('a', dp_rank=0)")(
    lambda t, w: t.apply_stored(w["a"], None, [0xA1], [1, 2], extras=[1])
)  # fmt: skip

# -- tiers ------------------------------------------------------------------------------------
for label, tier, exc, message in [
    ("2", 2, InvalidInputError, TIER2),
    ("str", "1", InputTypeError, "tier must be an integer, got str"),
    ("bool", True, InputTypeError, "tier must be an integer, got bool"),
    ("None", None, InputTypeError, "tier must be an integer, got NoneType"),
]:
    for method, fn in {
        "insert": lambda t, w, x: t.insert([1, 2], w["a"], tier=x, extras=[-1], namespace=[]),
        "remove": lambda t, w, x: t.remove([1, 2], w["a"], tier=x),
        "match_many": lambda t, w, x: t.match_many([[1, 2]], tier=x, namespace=[]),
        "held_tokens": lambda t, w, x: t.held_tokens(w["a"], tier=x),
    }.items():
        case(f"{method}: tier {label}", exc, message)(lambda t, w, fn=fn, x=tier: fn(t, w, x))
    if tier is not None:  # apply_cleared's None is both tiers
        case(f"apply_cleared: tier {label}", exc, message)(
            lambda t, w, x=tier: t.apply_cleared(w["a"], tier=x)
        )
case("insert: start before tier", InvalidInputError,
     "start must be a multiple of page_size (2), got 1")(
    lambda t, w: t.insert([1, 2], w["a"], start=1, tier=2)
)  # fmt: skip
case("match_many: touch before tier", InputTypeError, "touch must be a bool, got int")(
    lambda t, w: t.match_many([[1, 2]], touch=1, tier=2)
)
case("held_tokens: worker before tier", StaleWorkerError, stale(GONE))(
    lambda t, w: t.held_tokens(GONE, tier=2)
)

# -- match ------------------------------------------------------------------------------------
for label, touch in [("int", 1), ("None", None), ("str", "yes")]:
    message = f"touch must be a bool, got {type(touch).__name__}"
    case(f"match: touch {label}", InputTypeError, message)(
        lambda t, w, touch=touch: t.match([1, 2], touch=touch)
    )
    case(f"match_many: touch {label}", InputTypeError, message)(
        lambda t, w, touch=touch: t.match_many([[1, 2]], touch=touch)
    )
case("match: key before touch", InputTypeError, "key must be a sequence of integers, got str")(
    lambda t, w: t.match("abc", touch=1)
)
case("match_many: keys before touch", InputTypeError, "key[0] must be an integer, got float")(
    lambda t, w: t.match_many([[1.5]], touch=1)
)

for label, keys, exc, message in [
    ("int", 5, InputTypeError, "keys must be a sequence of keys, got int"),
    ("None", None, InputTypeError, "keys must be a sequence of keys, got NoneType"),
    ("str", "ab", InputTypeError, "keys must be a sequence of keys, got str"),
    ("bytes", b"ab", InputTypeError, "keys must be a sequence of keys, got bytes"),
    ("generator", (k for k in [[1, 2]]), InputTypeError,
     "keys must be a sequence of keys, got generator"),
    ("float 2-D array", np.zeros((2, 2)), InputTypeError,
     "key must hold integers, got dtype float64"),
    ("3-D array", np.zeros((2, 2, 2), dtype=np.int64), InvalidInputError,
     "key must be 1-D, got an array with 2 dimensions"),
    ("1-D array", np.array([1, 2]), InputTypeError,
     "key must be a sequence of integers, got int64"),
]:  # fmt: skip
    case(f"match_many: keys {label}", exc, message)(
        lambda t, w, keys=keys: t.match_many(keys, touch=True)
    )

# -- apply_stored -----------------------------------------------------------------------------
A = "worker ('a', dp_rank=0)"
for label, args, kwargs, exc, message in [
    ("tier 2", (None, [0xF1], [6, 6]), {"tier": 2}, InvalidInputError, TIER2),
    ("tier -1", (None, [0xF1], [6, 6]), {"tier": -1}, InvalidInputError,
     "tier must be 0 (device) or 1 (host), got -1"),
    ("tier str", (None, [0xF1], [6, 6]), {"tier": "0"}, InputTypeError,
     "tier must be an integer, got str"),
    ("tier None", (None, [0xF1], [6, 6]), {"tier": None}, InputTypeError,
     "tier must be an integer, got NoneType"),
    ("tier bool", (None, [0xF1], [6, 6]), {"tier": False}, InputTypeError,
     "tier must be an integer, got bool"),
    ("parent float", (1.5, [0xF1], [6, 6]), {}, InputTypeError,
     "parent_hash must be an integer, got float"),
    ("parent str", ("0xA1", [0xF1], [6, 6]), {}, InputTypeError,
     "parent_hash must be an integer, got str"),
    ("parent 2**64", (2**64, [0xF1], [6, 6]), {}, InvalidInputError,
     f"parent_hash = 18446744073709551616 {RANGE}"),
    ("parent below -2**63", (-(2**63) - 1, [0xF1], [6, 6]), {}, InvalidInputError,
     f"parent_hash = -9223372036854775809 {RANGE}"),
    ("hashes str", (None, "ab", [6, 6]), {}, InputTypeError,
     "block_hashes must be a sequence of integers, got str"),
    ("hashes int", (None, 5, [6, 6]), {}, InputTypeError,
     "block_hashes must be a sequence of integers, got int"),
    ("hashes None", (None, None, []), {}, InputTypeError,
     "block_hashes must be a sequence of integers, got NoneType"),
    ("hash float", (None, [1.5], [6, 6]), {}, InputTypeError,
     "block_hashes[0] must be an integer, got float"),
    ("hash bool", (None, [0xF1, True], [6, 6, 7, 7]), {}, InputTypeError,
     "block_hashes[1] must be an integer, got bool"),
    ("hash 2**64", (None, [0xF1, 2**64], [6, 6, 7, 7]), {}, InvalidInputError,
     f"block_hashes[1] = 18446744073709551616 {RANGE}"),
    ("hash below -2**63", (None, [-(2**63) - 1], [6, 6]), {}, InvalidInputError,
     f"block_hashes[0] = -9223372036854775809 {RANGE}"),
    ("hashes 2-D", (None, np.zeros((1, 1), dtype=np.uint64), [6, 6]), {}, InvalidInputError,
     "block_hashes must be 1-D, got an array with 2 dimensions"),
    ("hashes float array", (None, np.array([1.0]), [6, 6]), {}, InputTypeError,
     "block_hashes must hold integers, got dtype float64"),
    ("too many tokens", (None, [0xF1], [6, 6, 6]), {}, InvalidInputError,
     "token_ids holds 3 tokens; 1 blocks of page_size 2 need exactly 2"),
    ("too few tokens", (None, [0xF1, 0xF2], [6, 6]), {}, InvalidInputError,
     "token_ids holds 2 tokens; 2 blocks of page_size 2 need exactly 4"),
    ("tokens without blocks", (None, [], [6, 6]), {}, InvalidInputError,
     "token_ids holds 2 tokens; 0 blocks of page_size 2 need exactly 0"),
    ("unknown parent", (0xDEAD, [0xF1], [6, 6]), {}, UnknownParentError,
     f"parent_hash 0x000000000000dead names no block that {A} holds"),
    ("another worker's parent", (0xB1, [0xF1], [6, 6]), {}, UnknownParentError,
     f"parent_hash 0x00000000000000b1 names no block that {A} holds"),
    ("signed unknown parent", (-1, [0xF1], [6, 6]), {}, UnknownParentError,
     f"parent_hash 0xffffffffffffffff names no block that {A} holds"),
    ("unknown parent, no blocks", (0xDEAD, [], []), {}, UnknownParentError,
     f"parent_hash 0x000000000000dead names no block that {A} holds"),
    ("cycle", (0xA2, [0xF1, 0xA2], [5, 5, 6, 6]), {}, BlockConflictError,
     "block_hashes[1] = 0x00000000000000a2 is the event's parent hash (a cycle)"),
    ("repeated hash", (None, [0xF1, 0xF1], [6, 6, 7, 7]), {}, BlockConflictError,
     "block_hashes[1] = 0x00000000000000f1 appears earlier in the same event"),
    ("hash names another page", (None, [0xA2], [1, 2]), {}, BlockConflictError,
     f"block_hashes[0] = 0x00000000000000a2 already names a different block of {A}"),
    ("hash names a page elsewhere", (0xA1, [0xF1, 0xA1], [5, 5, 5, 5]), {}, BlockConflictError,
     "block_hashes[1] = 0x00000000000000a1 is the event's parent hash (a cycle)"),
    ("a second hash before a later cycle", (0xA1, [0xF1, 0xA1], [3, 4, 5, 5]), {},
     BlockConflictError,
     f"block_hashes[0] = 0x00000000000000f1 names a block that {A} already names "
     "0x00000000000000a2"),
    ("deeper page, same hash", (0xA2, [0xA1], [5, 6]), {}, BlockConflictError,
     f"block_hashes[0] = 0x00000000000000a1 already names a different block of {A}"),
    # checking order: tier, parent, hashes, tokens, count, parent known, then each block
    ("tier before parent", (1.5, [0xF1], [6, 6]), {"tier": 2}, InvalidInputError, TIER2),
    ("parent before hashes", (1.5, "ab", [6, 6]), {}, InputTypeError,
     "parent_hash must be an integer, got float"),
    ("hashes before tokens", (None, [1.5], "ab"), {}, InputTypeError,
     "block_hashes[0] must be an integer, got float"),
    ("tokens before count", (None, [0xF1], [1.5]), {}, InputTypeError,
     "key[0] must be an integer, got float"),
    ("count before parent", (0xDEAD, [0xF1], [6]), {}, InvalidInputError,
     "token_ids holds 1 tokens; 1 blocks of page_size 2 need exactly 2"),
    ("parent before conflicts", (0xDEAD, [0xDEAD, 0xDEAD], [6, 6, 7, 7]), {}, UnknownParentError,
     f"parent_hash 0x000000000000dead names no block that {A} holds"),
    ("cycle before repeat", (0xA2, [0xA2, 0xA2], [6, 6, 7, 7]), {}, BlockConflictError,
     "block_hashes[0] = 0x00000000000000a2 is the event's parent hash (a cycle)"),
    ("first bad block wins", (None, [0xF1, 0xA2, 0xF1], [6] * 6), {}, BlockConflictError,
     f"block_hashes[1] = 0x00000000000000a2 already names a different block of {A}"),
]:  # fmt: skip
    case(f"apply_stored: {label}", exc, message)(
        lambda t, w, args=args, kwargs=kwargs: t.apply_stored(w["a"], *args, **kwargs)
    )
case("apply_stored: signed cycle", BlockConflictError,
     "block_hashes[0] = 0xfffffffffffffffb is the event's parent hash (a cycle)")(
    lambda t, w: t.apply_stored(w["c"], -5, [2**64 - 5], [1, 1])
)  # fmt: skip
case("apply_stored: a second hash for a page", BlockConflictError,
     f"block_hashes[0] = 0x00000000000000f1 names a block that {A} already names "
     "0x00000000000000a1")(
    # never a silent rename: page [1, 2] keeps 0xA1, and 0xA1 stays bound to it
    lambda t, w: t.apply_stored(w["a"], None, [0xF1, 0xA1], [1, 2, 3, 4])
)  # fmt: skip
case("apply_stored: a second hash, deeper in the event", BlockConflictError,
     f"block_hashes[1] = 0x00000000000000f2 names a block that {A} already names "
     "0x00000000000000a2")(
    lambda t, w: t.apply_stored(w["a"], None, [0xA1, 0xF2], [1, 2, 3, 4])
)  # fmt: skip
case("apply_stored: other page before a second hash", BlockConflictError,
     "block_hashes[0] = 0x00000000000000b1 already names a different block of "
     "worker ('b', dp_rank=1)")(
    lambda t, w: t.apply_stored(w["b"], None, [0xB1], [1, 2])
)  # fmt: skip

# -- apply_removed ----------------------------------------------------------------------------
for label, args, kwargs, exc, message in [
    ("tier 2", ([0xA1],), {"tier": 2}, InvalidInputError, TIER2),
    ("tier float", ([0xA1],), {"tier": 0.0}, InputTypeError, "tier must be an integer, got float"),
    ("hashes str", ("ab",), {}, InputTypeError,
     "block_hashes must be a sequence of integers, got str"),
    ("hash float", ([0xA1, 2.5],), {}, InputTypeError,
     "block_hashes[1] must be an integer, got float"),
    ("hash out of range", ([2**64],), {}, InvalidInputError,
     f"block_hashes[0] = 18446744073709551616 {RANGE}"),
    ("tier before hashes", ("ab",), {"tier": 2}, InvalidInputError, TIER2),
]:  # fmt: skip
    case(f"apply_removed: {label}", exc, message)(
        lambda t, w, args=args, kwargs=kwargs: t.apply_removed(w["a"], *args, **kwargs)
    )

# -- apply_events ------------------------------------------------------------------------------
for label, records in [("int", 5), ("None", None), ("str", "stored"), ("bytes", b"")]:
    message = f"records must be a sequence of event records, got {type(records).__name__}"
    case(f"apply_events: records {label}", InputTypeError, message)(
        lambda t, w, records=records: t.apply_events(records)
    )

# -- pickle support ------------------------------------------------------------------------------
for label, key in [("unheld page", [1, 2, 7, 7]), ("ragged key", [1, 2, 3]), ("empty", [])]:
    case(f"_bind_hash: {label}", InvalidInputError,
         "the worker holds no page ending at the end of key")(
        lambda t, w, key=key: t._bind_hash(w["a"], key, 0xF1)
    )  # fmt: skip


# -- the tests --------------------------------------------------------------------------------
@pytest.mark.parametrize(("name", "call", "exc", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_input(
    meta_impl: type, name: str, call: Call, exc: type[RadixMetaError], message: str
) -> None:
    tree, workers = populated(meta_impl)
    before = state(tree)
    with pytest.raises(exc, match=exactly(message)) as info:
        call(tree, workers)
    assert type(info.value) is exc
    assert state(tree) == before
    tree.check()


def test_cases_cover_every_method() -> None:
    covered = {name.split(":")[0] for name, *_ in CASES}
    assert covered >= {
        "add_worker", "worker", "remove_worker", "capacity_of", "held_tokens", "dump", "items",
        "insert", "remove", "match", "match_many", "apply_stored", "apply_removed",
        "apply_cleared", "apply_events", "_block_entries", "_bind_hash",
    }  # fmt: skip


@pytest.mark.parametrize(
    ("page_size", "exc", "message"),
    [
        (0, InvalidInputError, "page_size must be >= 1, got 0"),
        (-4, InvalidInputError, "page_size must be >= 1, got -4"),
        (1.0, InputTypeError, "page_size must be an integer, got float"),
        ("2", InputTypeError, "page_size must be an integer, got str"),
        (None, InputTypeError, "page_size must be an integer, got NoneType"),
        (True, InputTypeError, "page_size must be an integer, got bool"),
        (2**32, InvalidInputError, "page_size must be < 2**32, got 4294967296"),
    ],
)
def test_bad_page_size(meta_impl: type, page_size: Any, exc: type, message: str) -> None:
    with pytest.raises(exc, match=exactly(message)):
        meta_impl(page_size)


def test_event_batch_statuses(meta_impl: type) -> None:
    """Each bad record gets its status and changes nothing; the good ones are applied."""
    tree, w = populated(meta_impl)
    a, b = w["a"], w["b"]
    records = [
        ("stored", a, None, [0xD1], [6, 6]),  # applied
        ("stored", a, 0xDEAD, [0xD2], [6, 6]),  # unknown parent
        ("stored", a, None, [0xA2], [1, 2]),  # the hash names another page
        ("stored", a, 0xD1, [0xD1], [7, 7]),  # a cycle
        ("stored", a, None, [0xD3], [6]),  # a bad token count
        ("stored", a, None, [0xD3], [6, 6], 0),  # six elements
        ("removed", GONE, [0xA1]),  # a stale worker
        ("removed", "a", [0xA1]),  # not a WorkerId
        ("removed", a, [2**64]),  # a hash out of range
        ("cleared",),
        ("bogus", a),
        5,
        [],
        ["removed", b, [0xB1, 0x99]],  # applied (a list record; an unknown hash is skipped)
        ("stored", a, 0xD1, [0xD4], np.array([7, 7])),  # applied: chains onto the first
        ("stored", a, -1, [0xD5], [8, 8]),  # unknown (signed) parent
        ("cleared", w["reused"]),  # applied
        ("stored", a, None, [0xD6], [6, 6], {"namespace": "lora"}),  # applied
        ("stored", a, 0xD6, [0xD7], [6, 6], {"namespace": None}),  # the parent is in "lora"
        ("stored", a, None, [0xD8], [6, 6], {"namespace": []}),  # unhashable
        ("stored", a, None, [0xD8], [6, 6], {"salt": 1}),  # not an option
        ("stored", a, None, [0xD8], [6, 6], ["namespace", "x"]),  # options are a dict
        ("removed", a, [0xD6], {"namespace": "lora"}),  # removals take no namespace
        ("cleared", w["c"], {}),  # applied: no options
        ("stored", a, None, [0xD9], [6, 6], {"extras": [3]}),  # applied: another page
        ("stored", a, None, [0xDA], [6, 6], {"extras": [-1]}),  # a bad tag
        ("stored", a, None, [0xDA], [6, 6], {"extras": [1, 2]}),  # one tag per block
        ("stored", a, None, [0xD1], [6, 6], {"tier": 1}),  # applied: a host copy, same name
        ("stored", a, None, [0xDC], [6, 6], {"tier": 2}),  # no such tier
        ("removed", a, [0xD9], {"tier": 1}),  # applied (0xD9 is on the device only: a no-op)
        ("removed", a, [0xD9], {"tier": "1"}),  # a str tier
        ("cleared", b, {"tier": 1}),  # applied: b's host pages
        ("cleared", b, {"tier": 5}),
    ]
    expected = [0, 1, 2, 2, 3, 3, 4, 3, 3, 3, 3, 3, 3, 0, 0, 1, 0, 0, 1, 3, 3, 3, 3, 0, 0, 3, 3,
                0, 3, 0, 3, 0, 3]  # fmt: skip
    status = tree.apply_events(iter(records))  # any iterable
    assert status.dtype == np.int8
    assert status.tolist() == expected
    assert [BlockStatus(s).name for s in status[:5]] == [
        "APPLIED", "UNKNOWN_PARENT", "CONFLICT", "CONFLICT", "INVALID"
    ]  # fmt: skip
    tree.check()
    # The same as applying only the good records, one call each.
    twin, v = populated(meta_impl)
    twin.apply_stored(v["a"], None, [0xD1], [6, 6])
    twin.apply_removed(v["b"], [0xB1, 0x99])
    twin.apply_stored(v["a"], 0xD1, [0xD4], [7, 7])
    twin.apply_cleared(v["reused"])
    twin.apply_stored(v["a"], None, [0xD6], [6, 6], namespace="lora")
    twin.apply_cleared(v["c"])
    twin.apply_stored(v["a"], None, [0xD9], [6, 6], extras=[3])
    twin.apply_stored(v["a"], None, [0xD1], [6, 6], tier=1)
    twin.apply_cleared(v["b"], tier=1)
    assert state(tree) == state(twin)
    assert tree.apply_events([]).tolist() == []


class Exploding:
    """An integer-like object whose ``__index__`` raises what it is given."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __index__(self) -> int:
        raise self.exc


def test_event_batch_reports_any_exception_as_a_status(meta_impl: type) -> None:
    """Whatever a record's objects raise becomes that record's status; the rest apply."""
    tree, w = populated(meta_impl)
    a = w["a"]
    records = [
        ("stored", a, None, [0xE1], [6, 6]),
        ("stored", a, None, [Exploding(RuntimeError("bad hash"))], [6, 6]),
        ("removed", a, [Exploding(LookupError("gone"))]),
        ("stored", a, 0xE1, [0xE2], [Exploding(ZeroDivisionError())] * 2),
        ("stored", a, 0xE1, [0xE3], [7, 7]),
    ]
    assert tree.apply_events(records).tolist() == [0, 3, 3, 3, 0]
    tree.check()
    twin, v = populated(meta_impl)
    twin.apply_stored(v["a"], None, [0xE1], [6, 6])
    twin.apply_stored(v["a"], 0xE1, [0xE3], [7, 7])
    assert state(tree) == state(twin)


def test_event_batch_interrupted_while_converting_changes_nothing(meta_impl: type) -> None:
    """Records are converted before any is applied: an interrupt in the last leaves no trace."""
    tree, w = populated(meta_impl)
    before = state(tree)
    records = [
        ("stored", w["a"], None, [0xF1], [6, 6]),
        ("cleared", w["b"]),
        ("removed", w["a"], [Exploding(KeyboardInterrupt())]),
    ]
    with pytest.raises(KeyboardInterrupt):
        tree.apply_events(records)
    assert state(tree) == before
    tree.check()


@pytest.mark.skipif(
    os.environ.get("RADIXMETA_EXPECT_SANITIZED") == "1",
    reason="ASan's calloc writes the 16 GiB array that is otherwise never touched",
)
def test_keys_longer_than_the_cores_index_are_refused(meta_impl: type, impl: type) -> None:
    """Depths are 32-bit: a longer key is refused before it is read (np.zeros is lazy)."""
    key = np.zeros(2**32 + 2, dtype=np.uint32)
    message = exactly(f"key has {2**32 + 2} tokens; keys are limited to 2**32 - 1 tokens")
    tree, w = populated(meta_impl)
    before = state(tree)
    for call in (
        lambda: tree.insert(key, w["a"]),
        lambda: tree.remove(key, w["a"]),
        lambda: tree.match(key),
    ):
        with pytest.raises(InvalidInputError, match=message):
            call()
    assert state(tree) == before
    cache = impl()
    for call in (lambda: cache.insert(key), lambda: cache.match_prefix(key)):
        with pytest.raises(InvalidInputError, match=message):
            call()
    assert cache.node_count == 0


def test_match_many_touch_is_all_or_nothing(meta_impl: type) -> None:
    """A bad key anywhere in match_many(touch=True) refreshes nobody (recency unchanged)."""
    tree, _ = populated(meta_impl)
    before = state(tree)
    with pytest.raises(InputTypeError):
        tree.match_many([[1, 2, 3, 4], [1, 2, 7, 7], [1.5]], touch=True)
    assert state(tree) == before


def test_meta_match_length_of(meta_impl: type) -> None:
    """length_of takes the workers that were live when the match was made."""
    tree, w = populated(meta_impl)
    m = tree.match([5, 5, 5])
    assert m.lengths.tolist() == [0, 2, 0, 0]
    tree.remove_worker(w["b"])
    assert m.length_of(w["b"]) == 2  # removed since, but live at the match
    assert m.best() == (w["b"], 2)
    late = tree.add_worker("late")
    assert late.index == 1 and late.generation == 1
    with pytest.raises(StaleWorkerError, match=exactly(stale(late))):
        m.length_of(late)
    for bad in (GONE, FAR, OLD_A):
        with pytest.raises(StaleWorkerError, match=exactly(stale(bad))):
            m.length_of(bad)
    with pytest.raises(InputTypeError, match=exactly(NOT_WORKER.format("str"))):
        m.length_of("a")
    # b inserted [1, 2, 3, 4, 9, 9] from token 2 on: the gap at page 1 stops its count.
    assert tree.match([1, 2, 3, 4, 5, 6]).lengths.tolist() == [6, 0, 2, 0]
    assert tree.match([5, 5, 5]).best() == (w["a"], 0)
