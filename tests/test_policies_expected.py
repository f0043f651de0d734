"""The router's estimate of what will still be cached when a request runs (``View.expected``).

A match says what a worker holds now; the requests queued ahead of a new one write
their prompts into the same pool first. The rule (radixmeta.policies.expected):
the prefix every worker holds stays; of the rest ``1 - queued / room`` stays, or
``min(1, room / queued)`` where a request in flight on the worker starts with it
(``room``: the pool less the matched prefix).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixmeta import Router
from radixmeta.policies import Choice, Request, View
from radixmeta.policies.expected import expected_length, expected_lengths


@pytest.mark.parametrize(
    ("lengths", "capacities", "queued", "page", "expected"),
    [
        # nothing queued, or no capacity known: everything stays (the same list)
        ([4000, 0], [10_000, 10_000], [0, 0], 1, [4000, 0]),
        ([4000, 0], [None, None], [9000, 0], 1, [4000, 0]),
        # 3,000 queued beside a 4,000-token prefix in a 10,000 pool: half of it
        ([4000, 0], [10_000, 10_000], [3000, 0], 1, [2000, 0]),
        # the 500 every worker holds stays; half of the other 3,500 does
        ([4000, 500], [10_000, 10_000], [3000, 0], 1, [2250, 500]),
        # the queue alone fills the room: only the shared head is left
        ([4000, 500], [10_000, 10_000], [6000, 9000], 1, [500, 500]),
        # to the nearest whole page of 16: 1,008 x (1 - 1,205 / 2,008) = 403.1 -> 400
        ([1008, 0], [3016, 3016], [1205, 0], 16, [400, 0]),
    ],
)
def test_the_rule_by_hand(
    lengths: list[int],
    capacities: list[int | None],
    queued: list[int],
    page: int,
    expected: list[int],
) -> None:
    assert expected_lengths(lengths, capacities, queued, page) == expected


@given(
    rows=st.lists(
        st.tuples(
            st.integers(0, 64),
            st.one_of(st.none(), st.integers(0, 96)),
            st.integers(0, 80),
            st.booleans(),
        ),
        min_size=1,
        max_size=8,
    ),
    page=st.sampled_from([1, 2, 4]),
    by_call=st.booleans(),
)
def test_one_workers_value_is_that_workers_entry_of_the_row(
    rows: list[tuple[int, int | None, int, bool]], page: int, by_call: bool
) -> None:
    # expected_length is what a batch asks for a member that follows its run onto a
    # worker: it must be exactly that worker's entry of the whole row.
    lengths = [r[0] for r in rows]
    capacities = [r[1] for r in rows]
    queued = [r[2] for r in rows]
    flags = [r[3] for r in rows]
    protected: Any = flags.__getitem__ if by_call else flags
    row = expected_lengths(lengths, capacities, queued, page, protected)
    head = min(lengths)
    for i in range(len(rows)):
        assert expected_length(i, lengths, capacities, queued, page, protected) == row[i]
        assert expected_length(i, lengths, capacities, queued, page, protected, head) == row[i]


def test_nothing_cut_is_the_same_list_and_protection_is_asked_only_where_it_would_cut() -> None:
    lengths = [4000, 4000, 0]
    assert expected_lengths(lengths, [10_000] * 3, [0, 0, 0]) is lengths
    asked: list[int] = []

    def protected(i: int) -> bool:
        asked.append(i)
        return i == 1

    got = expected_lengths(lengths, [10_000, 10_000, None], [3000, 3000, 3000], 1, protected)
    assert got == [2000, 4000, 0] and asked == [0, 1]


@pytest.mark.parametrize(
    ("queued", "expected"),
    [
        # no more queued than the 6,000 beside the prefix: the holder's finish leaves it
        # the most recent pages, and what is written after cannot reach it
        (3000, 4000),
        (6000, 4000),
        # 8,000 queued: only if the holder finishes within the first 2,000 of them is it
        # pushed out, so 6,000 / 8,000 of it stays (where an unprotected prefix keeps 0)
        (8000, 3000),
        (24_000, 1000),
    ],
)
def test_a_protected_prefix_faces_only_the_writes_after_its_holder(
    queued: int, expected: int
) -> None:
    got = expected_lengths([4000, 0], [10_000, 10_000], [queued, 0], 1, [True, False])
    assert got == [expected, 0]


def test_a_prefix_past_the_pool_keeps_nothing_but_the_shared_head() -> None:
    got = expected_lengths([12_000, 100], [10_000, 10_000], [500, 0], 1, [True, True])
    assert got == [100, 100]


class Always:
    """Every request to the first worker of the view (and the views it saw)."""

    def __init__(self) -> None:
        self.views: list[View] = []

    def choose(self, request: Request, view: View) -> Choice:
        self.views.append(view)
        return Choice(view.workers[0], "first")


def tokens(prefix: int, tail: int, tag: int) -> np.ndarray:
    """A prompt: ``prefix`` shared tokens (ids 1..), then ``tail`` of its own (``tag``)."""
    shared = np.arange(1, prefix + 1, dtype=np.uint32)
    return np.concatenate([shared, np.full(tail, 100_000 + tag, dtype=np.uint32)])


def router_with_a_prefix() -> tuple[Router, Always, Any]:
    """Exact mode (an approximate router's estimate is its match: test_router_estimate):
    worker a reported the first prompt's pages after it ran."""
    policy = Always()
    router = Router(policy=policy)
    a = router.add_worker("a", capacity=10_000)
    router.add_worker("b", capacity=10_000)
    first = router.dispatch(tokens(4000, 100, 0))
    router.finish(first.request_id)
    router.tree.insert(tokens(4000, 100, 0), a)
    return router, policy, a


def test_decision_matched_leaves_out_what_the_queue_ahead_evicts() -> None:
    router, policy, a = router_with_a_prefix()
    busy = router.dispatch(np.arange(500_000, 503_000, dtype=np.uint32))  # 3,000 queued on a
    d = router.dispatch(tokens(4000, 100, 1))
    view = policy.views[-1]
    assert view.lengths[0] == 4000 and view.expected == [2000, 0]
    assert d.matched == 2000 and d.lengths[a] == 4000  # the match itself is kept
    assert router.load(a).prefill_tokens == 3000 + 4100 - 2000
    router.finish(busy.request_id)
    router.finish(d.request_id)


def test_an_in_flight_request_of_the_prefix_protects_it() -> None:
    router, _, _ = router_with_a_prefix()
    router.dispatch(np.arange(500_000, 503_000, dtype=np.uint32))  # 3,000 queued on a
    sibling = router.dispatch(tokens(4000, 100, 1))  # matched 4,000 there: it is counted
    assert sibling.matched == 2000  # 1 - 3,000 / 6,000 of it
    # The sibling starts with the same 4,000 and is in flight: 5,100 queued ahead now,
    # no more than the 6,000 beside the prefix, so none of it is pushed out.
    d = router.dispatch(tokens(4000, 100, 2))
    assert d.matched == 4000
    router.finish(sibling.request_id)
    router.finish(d.request_id)
    # None is in flight any more: the plain share, 1 - 3,000 / 6,000.
    last = router.dispatch(tokens(4000, 100, 4))
    assert last.matched == 2000


def test_the_batch_path_counts_its_own_sharing_beside_the_estimate() -> None:
    router, _, _ = router_with_a_prefix()
    router.dispatch(np.arange(500_000, 503_000, dtype=np.uint32))
    first, second = router.dispatch_batch([tokens(4000, 100, 1), tokens(4000, 100, 2)])
    assert first.matched == 2000  # the estimate, as dispatch gives it
    # the second shares 4,000 with the first, sent to the same worker in this batch
    assert second.matched == 4000


def test_no_capacity_no_estimate() -> None:
    policy = Always()
    router = Router(policy=policy)
    router.add_worker("a")
    router.dispatch(tokens(100, 10, 0))
    assert policy.views[-1].expected is None


def test_a_prefix_only_the_routers_holds_show_is_in_flight_so_it_stays() -> None:
    # Exact mode, no events yet: what worker a holds, it holds through the holds of the
    # requests in flight there, which run first and keep those pages.
    policy = Always()
    router = Router(policy=policy)
    a = router.add_worker("a", capacity=10_000)
    router.add_worker("b", capacity=10_000)
    turn = router.dispatch(tokens(4000, 100, 0))  # in flight on a, 4,100 uncached queued
    router.dispatch(np.arange(500_000, 503_000, dtype=np.uint32))
    # It shares 4,050 with the first: not where that one's prompt or match ended, so only
    # the holds tell (the match is longer with them than with what a reported).
    head = tokens(4000, 100, 0)[:4050]
    nxt = router.dispatch(np.concatenate([head, np.arange(7, 9, dtype=np.uint32)]))
    # 7,100 queued ahead: more than the 5,950 beside the prefix, which a prefix no request
    # keeps would not survive; this one keeps 5,950 / 7,100 of it.
    assert nxt.lengths[a] == 4050 and nxt.matched == round(4050 * 5950 / 7100)
    router.finish(turn.request_id)


def test_the_estimate_is_aligned_with_the_views_workers_when_some_are_down() -> None:
    # Three workers, the middle one down: views list two, and so does their estimate,
    # on the dispatch path, the batch path of choose_batch, and that of choose by groups.
    for policy_name in ("longest_prefix", "cache_aware"):
        spy = Always()
        router = Router(policy=spy)  # exact: a reports what it holds
        a = router.add_worker("a", capacity=10_000)
        down = router.add_worker("b", capacity=10_000)
        c = router.add_worker("c", capacity=10_000)
        router.mark_down(down)
        router.finish(router.dispatch(tokens(4000, 100, 0)).request_id)
        router.tree.insert(tokens(4000, 100, 0), a)  # a holds it
        router.dispatch(np.arange(500_000, 503_000, dtype=np.uint32))  # 3,000 queued on a
        d = router.dispatch(tokens(4000, 100, 1))
        view = spy.views[-1]
        assert view.workers == (a, c) and view.expected == [2000, 0] and d.matched == 2000
        router.finish(d.request_id)  # in flight, it would keep the prefix whole
        if policy_name == "longest_prefix":
            router.policy = policy_name  # choose_batch: the estimate in every view
            got = router.dispatch_batch([tokens(4000, 100, 2), tokens(4000, 100, 3)])
        else:
            router.policy = spy  # no choose_batch: by groups, through choose
            got = router.dispatch_batch([tokens(4000, 100, 2), tokens(4000, 100, 3)])
            assert spy.views[-1].workers == (a, c) and len(spy.views[-1].expected or []) == 2
        assert {x.worker for x in got} <= {a, c}
        assert got[0].matched < 4000 and got[1].matched == 4000  # the second shares the batch's
