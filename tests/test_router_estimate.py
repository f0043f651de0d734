"""The router's estimate protects every prefix that a request in flight on a worker starts with.

In exact mode: there the tree is what the workers reported, and the prompts queued
ahead are not written yet. An approximate router's tree is its own model, which has
written them at their dispatch, so its estimate is its match (the last tests).

``View.expected`` cuts a worker's match by what its queued prefills are expected to
evict first, unless a request in flight there starts with the matched prefix (it
locks it while it runs: :mod:`radixmeta.router.estimate`). The router tells that by a
tree that holds every in-flight prompt on its worker; before it, approximate mode
knew only two prefixes per request (its whole prompt and its match at dispatch), so
a prefix an in-flight request was writing, matched only in part by a later request,
was cut. Hand-built cases first, then the rule against a brute force over the
requests in flight, in both modes and on both implementations.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmeta import Router
from radixmeta.policies import Choice, Request, View
from radixmeta.policies.expected import expected_lengths

PAGE = 16


class Pinned:
    """A policy that sends each request to the worker named by ``target`` (a position)."""

    def __init__(self) -> None:
        self.target = 0

    def choose(self, request: Request, view: View) -> Choice:
        return Choice(view.workers[self.target], "pinned")


def prompt(head: int, tail: int, tail_seed: int) -> list[int]:
    """``head`` tokens of a shared prefix, then ``tail`` tokens of their own."""
    return list(range(1, head + 1)) + [10_000 + tail_seed * 1000 + i for i in range(tail)]


def bounded(n: int = 3, capacity: int = 4096, mode: str = "exact") -> Any:
    policy = Pinned()
    router = Router(PAGE, policy=policy, mode=mode)
    for i in range(n):
        router.add_worker(f"w{i}", capacity=capacity)
    return router, policy


def test_a_prefix_an_in_flight_request_is_writing_is_not_cut() -> None:
    router, policy = bounded()
    # A (a 1,024-token prefix and its own 256) and then D (unrelated) queue on w0.
    router.dispatch(prompt(1024, 256, 1), request_id="A")
    router.dispatch(prompt(0, 512, 9), request_id="D")
    # B shares A's prefix but not its question: it matches 1,024 of A's 1,280 on w0,
    # neither A's whole prompt nor A's match at dispatch (0). w0 queues 1,792 uncached
    # tokens ahead, against 3,072 beside the prefix: cut to 42 % unless protected.
    policy.target = 2
    b = router.dispatch(prompt(1024, 256, 2), request_id="B")
    assert b._view.lengths[0] == 1024
    assert b._view.expected is not None and b._view.expected[0] == 1024
    unprotected = expected_lengths([1024, 0, 0], [4096] * 3, [1792, 0, 0], PAGE)
    assert unprotected[0] < 1024  # what the estimate said before
    router.finish("B")
    # Once A ends, nothing in flight on w0 starts with the prefix: D's 512 queued
    # writes cut it by the unprotected share. (The workers report what A and B stored.)
    router.finish("A")
    router.tree.insert(prompt(1024, 256, 1), router.workers[0])
    router.tree.insert(prompt(1024, 256, 2), router.workers[2])
    c = router.dispatch(prompt(1024, 256, 3), request_id="C")
    assert c._view.lengths == [1024, 0, 1024]  # B's insert on w2: head is w1's 0
    want = expected_lengths([1024, 0, 1024], [4096] * 3, [512, 0, 0], PAGE)
    assert c._view.expected == want and want[0] < 1024


def test_a_request_in_flight_elsewhere_protects_nothing_here() -> None:
    router, policy = bounded()
    router.dispatch(prompt(1024, 0, 0), request_id="A")  # w0 holds the prefix
    router.dispatch(prompt(0, 1500, 9), request_id="D")  # and queues writes
    policy.target = 1
    router.dispatch(prompt(1024, 64, 1), request_id="B")  # in flight on w1, not w0
    router.finish("A")
    policy.target = 2
    c = router.dispatch(prompt(1024, 64, 2), request_id="C")
    # B, in flight on w1 (still in prefill there), protects the prefix on w1, not on w0.
    assert c._view.expected is not None
    assert c._view.expected[0] < 1024 and c._view.expected[1] == 1024


def test_the_in_flight_tree_empties_and_a_reused_index_inherits_nothing() -> None:
    router, policy = bounded(n=2)
    router.dispatch(prompt(1024, 64, 1), request_id="A")
    router.dispatch(prompt(0, 900, 9), request_id="D")
    inflight = router._estimate.inflight
    assert len(inflight) == 2
    w0 = router.workers[0]
    router.remove_worker(w0)  # drops A and D with it
    assert len(inflight) == 0
    again = router.add_worker("w0b", capacity=4096)
    assert again.index == w0.index and again.generation != w0.generation
    key = np.asarray(prompt(1024, 64, 1), dtype=np.uint32)
    assert inflight.lengths(key, None, None)(again) == 0
    policy.target = [w.name for w in router.workers].index("w0b")
    router.dispatch(prompt(1024, 64, 1), request_id="A2")  # in flight on the new worker
    length = inflight.lengths(key, None, None)
    assert length(again) == 1024 + 64
    assert length(w0) == 0  # the index's old generation holds nothing, though it is reused
    router.finish("A2")
    assert len(inflight) == 0 and inflight.tree.node_count == 0


def test_namespaces_are_apart_in_the_protection() -> None:
    router, policy = bounded()
    router.dispatch(prompt(1024, 256, 1), request_id="A", namespace="lora:x")
    router.dispatch(prompt(1024, 0, 0), request_id="P")  # the prefix, no namespace
    router.dispatch(prompt(0, 1000, 9), request_id="D")
    router.finish("P")
    router.tree.insert(prompt(1024, 0, 0), router.workers[0])  # w0 reports P's pages
    policy.target = 2
    b = router.dispatch(prompt(1024, 64, 2), request_id="B")
    # Only lora:x's request is in flight on w0: the plain prefix is not protected.
    assert b._view.lengths[0] == 1024
    assert b._view.expected is not None and b._view.expected[0] < 1024


@settings(max_examples=40, deadline=None)
@given(
    mode=st.sampled_from(["exact"]),
    ops=st.lists(
        st.tuples(
            st.sampled_from(["dispatch", "dispatch", "finish"]),
            st.integers(0, 2),  # worker
            st.integers(0, 3),  # prefix family
            st.integers(0, 6),  # prefix pages
            st.integers(0, 4),  # own pages
        ),
        min_size=1,
        max_size=25,
    ),
)
def test_protection_is_exactly_an_in_flight_prompt_starting_with_the_prefix(
    mode: str, ops: list[tuple[str, int, int, int, int]]
) -> None:
    router, policy = bounded(capacity=2048, mode=mode)
    open_: list[str] = []
    for n, (op, target, family, pages, own) in enumerate(ops):
        if op == "finish":
            if open_:
                router.finish(open_.pop(target % len(open_)))
            continue
        tokens = [family * 100 + i for i in range(pages * PAGE)] + [
            50_000 + n * 100 + i for i in range(own * PAGE + 3)
        ]
        key = np.asarray(tokens, dtype=np.uint32)
        lengths = router.tree.match(key).length_list
        up = router.up
        protected = router._estimate.protection(key, None, None, lengths, up)
        for p, worker in enumerate(up):
            if lengths[p] == 0:
                continue  # never asked: the rule cuts only a prefix past the shortest
            starts = any(
                f.worker == worker
                and len(f._request.tokens) >= lengths[p]
                and list(f._request.tokens[: lengths[p]]) == tokens[: lengths[p]]
                for f in router._flights.values()
            )
            assert protected(p) == starts
        policy.target = target
        router.dispatch(tokens, request_id=f"r{n}")
        open_.append(f"r{n}")
    for rid in open_:
        router.finish(rid)
    assert len(router._estimate.inflight) == 0


def test_an_approximate_routers_estimate_is_its_match() -> None:
    # w0 holds a 1,024-token prefix in the model; D queues 1,500 uncached tokens there.
    # The model wrote D's prompt at its dispatch and trimmed w0 to its capacity, so
    # what is left of the prefix is what the writes queued ahead leave: B's match.
    router, policy = bounded(capacity=4096, mode="approximate")
    router.dispatch(prompt(1024, 0, 0), request_id="A")
    router.finish("A")
    router.dispatch(prompt(0, 1500, 9), request_id="D")
    policy.target = 1
    b = router.dispatch(prompt(1024, 64, 1), request_id="B")
    assert b._view.lengths[0] == 1024
    assert b._view.expected == b._view.lengths
    # The rule would have cut it again (the old estimate: each write counted twice).
    assert expected_lengths(b._view.lengths, [4096] * 3, [1500, 0, 0], PAGE)[0] < 1024
    assert len(router._estimate.inflight) == 0  # nothing held in flight
    # Past the capacity, the model itself lets the prefix go.
    policy.target = 0
    router.dispatch(prompt(0, 3000, 8), request_id="E")
    assert router.tree.match(prompt(1024, 64, 2)).length_list[0] < 1024


def test_an_approximate_batch_expects_its_matches() -> None:
    router, _ = bounded(capacity=4096, mode="approximate")
    router.dispatch(prompt(1024, 0, 0), request_id="A")
    router.finish("A")
    router.dispatch(prompt(0, 1500, 9), request_id="D")
    decided = router.dispatch_batch([prompt(1024, 64, 1), prompt(1024, 64, 2)])
    for d in decided:
        assert d._view.expected is None or d._view.expected == d._view.lengths
        assert d.matched == d._view.lengths[d._view.workers.index(d.worker)]
