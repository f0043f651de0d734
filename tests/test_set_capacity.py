"""``set_capacity``: a worker's KV capacity changes while it keeps its pages and its load.

On a MetaTree (both cores) a smaller capacity trims an approximate worker at once by the
insert-time rule and a larger one keeps every page; bad calls change nothing. On a Router
the worker's requests in flight, loads and counters stand, and what policies, the eviction
estimate and the metrics read follows the new capacity. (The meta state machine drives
``set_capacity`` on both cores and the brute-force model side by side.)
"""

from __future__ import annotations

import pickle
import re
from typing import Any

import pytest

from radixmeta import MetaTree, Router
from radixmeta.errors import InputTypeError, InvalidInputError, StaleWorkerError
from radixmeta.policies import Choice, Request, View


def snapshot(tree: Any) -> tuple[Any, ...]:
    """Everything observable about a tree's pages and workers."""
    return (
        [tuple(map(repr, item)) for item in tree.items()],
        [(w, tree.capacity_of(w), tree.held_tokens(w), repr(tree.dump(w))) for w in tree.workers],
    )


def test_a_smaller_capacity_trims_like_an_insert_and_a_larger_one_keeps(meta_impl: type) -> None:
    tree = meta_impl(1)
    a = tree.add_worker("a", capacity=8)
    b = tree.add_worker("b")
    tree.insert([1, 2, 3], a)
    tree.insert([1, 2, 7, 8, 9], a)
    tree.insert([1, 2, 7, 8, 9], b)
    assert tree.set_capacity(a, 100) == 0 and tree.held_tokens(a) == 6
    assert tree.capacity_of(a) == 100
    # What an insert over capacity 4 would have dropped: the least recent leaf (3),
    # then the deepest page of the equally recent rest (9).
    assert tree.set_capacity(a, 4) == 2 and tree.capacity_of(a) == 4
    assert tree.match([1, 2, 3]).lengths.tolist() == [2, 2]
    assert tree.match([1, 2, 7, 8, 9]).lengths.tolist() == [4, 5]
    twin = meta_impl(1)
    ta, tb = twin.add_worker("a", capacity=4), twin.add_worker("b")
    for key, w in (([1, 2, 3], ta), ([1, 2, 7, 8, 9], ta), ([1, 2, 7, 8, 9], tb)):
        twin.insert(key, w)
    assert [repr(i) for i in tree.items()] == [repr(i) for i in twin.items()]
    assert repr(tree.dump(a)) == repr(twin.dump(ta))
    tree.insert([1, 2, 7, 8, 5, 6], a)  # and the new capacity bounds the next inserts
    assert tree.held_tokens(a) == 4
    assert tree.set_capacity(a, 0) == 4 and tree.held_tokens(a) == 0
    tree.check()


def test_pages_over_several_nodes_go_least_recent_first(meta_impl: type) -> None:
    tree = meta_impl(2)
    a = tree.add_worker("a", capacity=64)
    for k in range(4):
        tree.insert([k, k, 9, 9, 9, 9], a)  # four branches of 6 tokens, oldest first
    tree.match([0, 0, 9, 9, 9, 9], touch=True)  # the oldest is touched: the most recent now
    assert tree.set_capacity(a, 13) == 12  # 13 rounds to 12 kept: two branches go
    kept = [k for k in range(4) if tree.match([k, k, 9, 9, 9, 9]).length_of(a) == 6]
    assert kept == [0, 3]
    tree.check()


@pytest.mark.parametrize(
    ("who", "capacity", "error", "message"),
    [
        ("a", None, InvalidInputError, "None would make an approximate worker exact"),
        ("a", -1, InvalidInputError, "capacity must be >= 0"),
        ("a", 2**63, InvalidInputError, "below 2**63"),
        ("a", 2.0, InputTypeError, "capacity must be an integer"),
        ("a", "4", InputTypeError, "capacity must be an integer"),
        ("b", 4, InvalidInputError, "is exact"),
        ("gone", 4, StaleWorkerError, "not a live worker"),
        ("name", 4, InputTypeError, "must be a WorkerId"),
    ],
)
def test_a_refused_call_changes_nothing(
    meta_impl: type, who: str, capacity: Any, error: type, message: str
) -> None:
    tree = meta_impl(1)
    a = tree.add_worker("a", capacity=8)
    b = tree.add_worker("b")
    gone = tree.add_worker("gone", capacity=8)
    tree.remove_worker(gone)
    tree.insert([1, 2, 3, 4, 5], a)
    tree.insert([1, 2, 3], b)
    before = snapshot(tree)
    target = {"a": a, "b": b, "gone": gone, "name": "a"}[who]
    with pytest.raises(error, match=re.escape(message)):
        tree.set_capacity(target, capacity)
    assert snapshot(tree) == before
    tree.check()


def test_the_meta_tree_wrapper_has_it_and_a_pickle_keeps_the_new_capacity() -> None:
    tree = MetaTree(1)
    a = tree.add_worker("a", capacity=3)
    tree.insert([1, 2, 3], a)
    assert tree.set_capacity(a, 2) == 1 and tree.held_tokens(a) == 2
    copy = pickle.loads(pickle.dumps(tree))
    assert copy.capacity_of(a) == 2 and snapshot(copy) == snapshot(tree)
    copy.insert([1, 2, 3, 4], a)
    assert copy.held_tokens(a) == 2


# -- the router ---------------------------------------------------------------------------------
class Pinned:
    """Sends every request to the first up worker; keeps the last view."""

    def __init__(self) -> None:
        self.view: View | None = None

    def choose(self, request: Request, view: View) -> Choice:
        self.view = view
        return Choice(view.workers[0], "pinned")


def test_an_approximate_router_keeps_flights_and_loads_and_trims_its_model() -> None:
    policy = Pinned()
    router = Router(4, policy=policy, mode="approximate")
    a = router.add_worker("a", capacity=64)
    router.add_worker("b", capacity=64)
    first = router.dispatch(list(range(1, 25)), request_id="r1")  # 24 tokens on a
    router.dispatch(list(range(100, 116)), request_id="r2")  # 16 more
    load = router.load(a)
    assert router.tree.held_tokens(a) == 40 and load.requests == 2
    assert router.set_capacity(a, 1000) == 0 and router.tree.held_tokens(a) == 40
    assert router.set_capacity(a, 20) == 20  # r1's pages are the least recent: deepest first
    assert router.tree.match(list(range(1, 25))).length_of(a) == 4
    assert router.set_capacity(a, 16) == 4  # and the rest of them
    assert router.tree.held_tokens(a) == 16 and router.tree.capacity_of(a) == 16
    after = router.load(a)
    assert (after.requests, after.prefill_tokens, after.decode_tokens) == (
        load.requests, load.prefill_tokens, load.decode_tokens,
    )
    assert after.capacity == 16 and router.in_flight == 2
    assert router.metrics()["workers"][0]["capacity"] == 16
    assert router.metrics()["workers"][0]["held_tokens"] == 16
    router.finish(first.request_id)  # its flight is still known
    router.dispatch(list(range(1, 25)), request_id="r3")
    assert policy.view is not None and policy.view.capacities[0] == 16
    assert router.tree.held_tokens(a) <= 16
    router.tree.check()


def test_an_exact_router_shows_the_capacity_to_the_estimate_and_keeps_pages() -> None:
    policy = Pinned()
    router = Router(4, policy=policy)  # exact
    a = router.add_worker("a")
    router.tree.insert(list(range(1, 17)), a)  # as its events would
    router.dispatch([*range(1, 17), 50, 51, 52, 53], request_id="r1")
    assert policy.view is not None and policy.view.expected is None  # no capacity known
    assert router.set_capacity(a, 64) == 0
    assert router.load(a).capacity == 64 and router.tree.held_tokens(a) == 16
    router.dispatch(list(range(1, 17)), request_id="r2")
    assert policy.view.capacities == [64] and policy.view.expected is not None
    assert router.set_capacity(a, None) == 0  # exact mode may forget it again
    router.dispatch(list(range(1, 17)), request_id="r3")
    assert policy.view.expected is None and router.in_flight == 3


@pytest.mark.parametrize("mode", ["exact", "approximate"])
def test_a_refused_router_call_changes_nothing(mode: str) -> None:
    router = Router(1, policy=Pinned(), mode=mode)
    a = router.add_worker("a", capacity=8)
    gone = router.add_worker("gone", capacity=8)
    router.remove_worker(gone)
    router.dispatch([1, 2, 3], request_id="r")
    before = (router.load(a), router.tree.held_tokens(a), router.metrics()["workers"])
    bad: list[tuple[Any, Any, type]] = [(a, -1, InvalidInputError), (a, "8", InputTypeError)]
    bad += [("a", 4, InputTypeError)]
    if mode == "approximate":
        bad += [(a, None, InvalidInputError)]
    bad += [(gone, 4, StaleWorkerError)]
    for worker, capacity, error in bad:
        with pytest.raises(error):
            router.set_capacity(worker, capacity)
        assert (router.load(a), router.tree.held_tokens(a), router.metrics()["workers"]) == before
