"""MetaTree holds (the router's optimistic marks) and cursor matches, on every core.

The state machine drives them at random; these are the rules stated one by one, with
the errors and the "a failed call changes nothing" rule.
"""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest

from radixmeta.errors import (
    InputTypeError,
    InvalidInputError,
    RadixMetaError,
    StaleHoldError,
    StaleWorkerError,
    WorkerError,
)


def state(tree: Any) -> tuple[Any, ...]:
    items = [(k.tolist(), h, ns, host) for k, h, ns, _, host in tree.items()]
    holds = [tree.hold_tokens(w) for w in tree.workers]
    return items, holds, tree.hold_count, tree.node_count, tree.namespaces()


def test_holds_count_in_matches_and_nowhere_else(meta_impl: type) -> None:
    tree = meta_impl(2)
    a, b = tree.add_worker("a"), tree.add_worker("b")
    tree.insert([1, 2, 3, 4, 5, 6], a)
    h = tree.hold([1, 2, 3, 4, 9, 9], b)
    assert tree.match([1, 2, 3, 4, 9, 9]).lengths.tolist() == [4, 6]
    assert tree.match([1, 2, 3, 4, 9, 9]).host_lengths.tolist() == [4, 6]
    assert tree.match([1, 2, 3, 4, 9, 9], optimistic=False).lengths.tolist() == [4, 0]
    assert tree.match_many([[1, 2, 3, 4, 9, 9]]).tolist() == [[4, 6]]
    assert tree.match_many([[1, 2, 3, 4, 9, 9]], optimistic=False).tolist() == [[4, 0]]
    assert tree.held_tokens(b) == 0 and tree.dump(b) == [] and tree.items(b) == []
    assert tree.hold_tokens(b) == 6 and tree.hold_count == 1
    # The held-only page is in the tree, with no holders.
    assert [(k.tolist(), holders) for k, holders, *_ in tree.items()] == [
        ([1, 2, 3, 4], (a,)),
        ([1, 2, 3, 4, 5, 6], (a,)),
        ([1, 2, 3, 4, 9, 9], ()),
    ]
    assert tree.release(h) == 3
    assert tree.node_count == 2 and tree.hold_tokens(b) == 0
    tree.check()


def test_holds_are_counted_per_page_and_worker(meta_impl: type) -> None:
    tree = meta_impl(1)
    w = tree.add_worker("w")
    first, second = tree.hold([1, 2, 3], w), tree.hold([1, 2], w)
    assert second == first + 1
    assert tree.release(first) == 1  # [3]; [1, 2] is still held by the second
    assert tree.match([1, 2, 3]).lengths.tolist() == [2]
    with pytest.raises(StaleHoldError, match="not a live hold"):
        tree.release(first)
    assert tree.release(second) == 2 and tree.node_count == 0
    empty = tree.hold([], w)
    assert tree.release(empty) == 0
    tree.check()


def test_remove_worker_ends_its_holds(meta_impl: type) -> None:
    tree = meta_impl(1)
    w = tree.add_worker("w")
    h = tree.hold([1, 2], w, namespace="lora")
    assert tree.namespaces() == [None, "lora"]
    tree.remove_worker(w)
    assert tree.hold_count == 0 and tree.node_count == 0 and tree.namespaces() == [None]
    with pytest.raises(StaleHoldError):
        tree.release(h)
    fresh = tree.add_worker("v")  # the same index, clean
    assert fresh.index == w.index and tree.match([1, 2]).lengths.tolist() == [0]
    tree.check()


def test_cursor_marks_equal_plain_marks(meta_impl: type) -> None:
    plain, cursor = meta_impl(4), meta_impl(4)
    for t in (plain, cursor):
        t.add_worker("a")
        t.add_worker("b", capacity=12)
    keys = [list(range(12)), list(range(8)) + [9] * 6, [7] * 9, list(range(4))]
    for i, key in enumerate(keys):
        a, b = plain.workers
        worker = (a, b)[i % 2]
        assert plain.insert(key, worker, extras=None, namespace="x") == cursor.match(
            key, cursor=True, namespace="x"
        ).insert(cursor.workers[i % 2])
        h1 = plain.hold(key, a)
        h2 = cursor.match(np.array(key, dtype=np.int64), cursor=True).hold(cursor.workers[0])
        assert h1 == h2
        assert state(plain) == state(cursor)
    # A stale walk (another match in between, a changed tree) gives the same result.
    m = cursor.match(keys[1], cursor=True)
    cursor.match(keys[2], cursor=True)
    cursor.insert([5, 5, 5, 5], cursor.workers[0])
    plain.insert([5, 5, 5, 5], plain.workers[0])
    assert m.hold(cursor.workers[0]) == plain.hold(keys[1], plain.workers[0])
    assert state(plain) == state(cursor)
    plain.check()
    cursor.check()


def test_bad_calls_change_nothing(meta_impl: type) -> None:
    tree = meta_impl(2)
    a, approx = tree.add_worker("a"), tree.add_worker("b", capacity=8)
    tree.insert([1, 2, 3, 4], a)
    h = tree.hold([1, 2, 5, 5], a)
    gone = tree.add_worker("gone")
    tree.remove_worker(gone)
    before = state(tree)
    bad: list[tuple[Any, type[RadixMetaError], str]] = [
        (lambda: tree.hold([1, 2], approx), WorkerError, "approximate"),
        (lambda: tree.hold([1, 2], gone), StaleWorkerError, "not a live worker"),
        (lambda: tree.hold([1, -2], a), InvalidInputError, "outside the token range"),
        (lambda: tree.hold([1, 2], a, namespace=[]), InputTypeError, "hashable"),
        (lambda: tree.hold([1, 2], a, extras=[1, 2]), InvalidInputError, "one tag per"),
        (lambda: tree.release(h + 1), StaleHoldError, "not a live hold"),
        (lambda: tree.release(-1), InvalidInputError, "hold must be >= 0"),
        (lambda: tree.release(2**70), StaleHoldError, "not a live hold"),
        (lambda: tree.release(1.0), InputTypeError, "hold must be an integer"),
        (lambda: tree.match([1, 2], optimistic=1), InputTypeError, "optimistic must be a bool"),
        (lambda: tree.match([1, 2], cursor="y"), InputTypeError, "cursor must be a bool"),
        (lambda: tree.match([1, 2]).hold(a), InvalidInputError, "kept no cursor"),
        (lambda: tree.match([1, 2]).insert(a), InvalidInputError, "kept no cursor"),
        (lambda: tree.match([1, 2], cursor=True).hold(approx), WorkerError, "approximate"),
        (lambda: tree.match([1, 2], cursor=True).hold(gone), StaleWorkerError, "live worker"),
        (lambda: tree.match([1, 2], cursor=True).insert(a, tier=2), InvalidInputError, "tier"),
        (lambda: tree.match_many([[1]], optimistic=None), InputTypeError, "optimistic"),
    ]
    for call, error, text in bad:
        with pytest.raises(error, match=text):
            call()
        assert state(tree) == before
    tree.check()


def test_a_pickled_tree_has_no_holds() -> None:
    from radixmeta import MetaTree

    tree = MetaTree(1)
    w = tree.add_worker("w")
    tree.insert([1, 2], w)
    tree.hold([1, 2, 3], w)
    copy = pickle.loads(pickle.dumps(tree))
    assert copy.hold_count == 0 and copy.match([1, 2, 3]).lengths.tolist() == [2]
