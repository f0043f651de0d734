"""The batch rules of ``default`` (pack groups, split only what load forbids: its path
for a batch over ``IN_ORDER_BUDGET``, forced here for every batch) and
``longest_prefix`` (pure affinity: never split), through ``Router.dispatch_batch``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from _policies import load_fleet
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmeta import Router
from radixmeta.policies import default as default_module
from radixmeta.policies.default import DefaultPolicy


@pytest.fixture(autouse=True, scope="module")
def packing() -> Iterator[None]:
    """These tests are of the packing path: a batch of any size is packed (a batch under
    ``IN_ORDER_BUDGET`` is otherwise decided in order, test_policies_batch_order.py)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(default_module, "IN_ORDER_BUDGET", 0.0)
        yield


def prompt(group: int, k: int, prefix: int = 64, own: int = 8) -> np.ndarray:
    """A prompt of ``group``: its ``prefix`` tokens, then ``own`` tokens of its own."""
    return np.array([1000 + group] * prefix + [k % 997] * own, dtype=np.uint32)


def routed(policy: str, batch: list[np.ndarray], workers: int = 4) -> list[int]:
    router = Router(4, policy=policy)
    for i in range(workers):
        router.add_worker(f"w{i}")
    return [d.worker.index for d in router.dispatch_batch(batch)]


def computed(batch: list[np.ndarray], where: list[int], workers: int = 4) -> list[int]:
    """Tokens each worker computes for its part of the batch: its part's trie."""
    out = [0] * workers
    seen: list[set[bytes]] = [set() for _ in range(workers)]
    for key, w in zip(batch, where, strict=True):
        for end in range(1, len(key) + 1):
            page = key[:end].tobytes()
            if page not in seen[w]:
                seen[w].add(page)
                out[w] += 1
    return out


def test_default_keeps_groups_whole_when_they_pack_evenly() -> None:
    batch = [prompt(g, k) for k in range(6) for g in range(4)]  # interleaved
    where = routed("default", batch)
    by_group = {g: {where[i] for i in range(len(batch)) if i % 4 == g} for g in range(4)}
    assert all(len(w) == 1 for w in by_group.values())  # each group on one worker
    assert len({next(iter(w)) for w in by_group.values()}) == 4  # one group a worker


def test_default_splits_only_the_group_too_big_for_one_worker() -> None:
    big = [prompt(0, k, prefix=64, own=32) for k in range(40)]
    small = [prompt(g, k, prefix=64, own=32) for g in (1, 2, 3) for k in range(4)]
    batch = big + small
    where = routed("default", batch)
    assert len(set(where[:40])) > 1  # the big group is spread
    for g in range(3):
        assert len(set(where[40 + 4 * g : 44 + 4 * g])) == 1  # the small ones are not
    work = computed(batch, where)
    assert max(work) <= 1.1 * sum(work) / 4  # and the workers compute evenly


def test_longest_prefix_never_splits_a_group() -> None:
    big = [prompt(0, k, prefix=64, own=32) for k in range(40)]
    small = [prompt(g, k, prefix=64, own=32) for g in (1, 2, 3) for k in range(4)]
    batch = big + small
    where = routed("longest_prefix", batch)
    counts = Counter(where)
    assert len(set(where[:40])) == 1  # pure affinity: the big group stays whole
    assert counts.most_common(1)[0][1] == 40
    work = computed(batch, where)
    assert max(work) > 2 * sum(work) / 4  # the imbalance it shows
    assert len(set(where[40:])) == 3  # ties spread the other groups by load


def test_default_batch_goes_around_a_queued_worker() -> None:
    router = Router(4, policy="default")
    workers = [router.add_worker(f"w{i}") for i in range(2)]
    # w0 has a long prefill queued (a request in flight, not finished).
    router.dispatch(np.arange(5000, 9000, dtype=np.uint32))
    busy = router.load(workers[0]).prefill_tokens or router.load(workers[1]).prefill_tokens
    assert busy == 4000
    queued = 0 if router.load(workers[0]).prefill_tokens else 1
    where = routed_on(router, [prompt(0, k) for k in range(4)])
    assert set(where) == {1 - queued}


def routed_on(router: Router, batch: list[np.ndarray]) -> list[int]:
    return [d.worker.index for d in router.dispatch_batch(batch)]


def test_default_counts_what_a_worker_holds_beyond_the_group_prefix() -> None:
    # A batch of one whose prompt w2 holds already: it goes there, as dispatch would.
    router = Router(4, policy="default")
    workers = [router.add_worker(f"w{i}") for i in range(4)]
    key = np.arange(10_000, 12_048, dtype=np.uint32)
    router.tree.insert(key, workers[2])
    (d,) = router.dispatch_batch([key])
    assert d.worker == workers[2] and d.matched == 2048


def test_a_conversation_is_not_cut_where_each_turn_builds_on_the_last() -> None:
    # Twelve turns of one session: each prompt is the last one plus a new message. Cut
    # anywhere, the first turn moved would recompute its whole history; the estimate
    # sees that, so the session stays whole unless splitting really lowers the load.
    history: list[int] = []
    batch = []
    for turn in range(12):
        history = history + [5000 + turn] * 64
        batch.append(np.array(history, dtype=np.uint32))
    where = routed("default", batch)
    work = computed(batch, where)
    whole = computed(batch, [0] * len(batch))
    assert sum(work) <= 1.05 * sum(whole)  # the shared history is not recomputed


def test_prefix_groups_copy_and_pickle() -> None:
    import copy
    import pickle

    from radixmeta._batch import prefix_groups

    keys = [prompt(0, k) for k in range(3)] + [prompt(1, 0)]
    groups = prefix_groups(keys, [None] * 4, [False] * 4, 4, 0.5)
    for other in (copy.copy(groups), copy.deepcopy(groups), pickle.loads(pickle.dumps(groups))):
        assert other == groups
        assert (other.partner, other.common, other.own) == (
            groups.partner, groups.common, groups.own
        )


def test_longest_prefix_batch_loads_by_tokens_never_go_negative() -> None:
    router = Router(4, policy="longest_prefix")
    workers = [router.add_worker(f"w{i}") for i in range(2)]
    long = np.arange(1, 4097, dtype=np.uint32)
    router.tree.insert(long, workers[0])
    # A short member of a group whose first member w0 holds far past the short one.
    from radixmeta.policies import create

    router.policy = create("longest_prefix", load="tokens")
    longer = np.concatenate([long, np.arange(20_000, 21_000, dtype=np.uint32)])
    fresh = np.arange(9000, 9100, dtype=np.uint32)
    decisions = router.dispatch_batch([long, long[:512], longer, fresh])
    assert {d.worker for d in decisions[:3]} == {workers[0]}
    # w0 now has 1,000 uncached tokens, not 1,000 - 3,584 for the short member: the
    # fresh prompt goes to the other worker.
    assert decisions[3].worker == workers[1]


def test_default_places_a_batch_member_with_a_holder_before_those_without() -> None:
    # Worker 0 (of 2) holds a 4,000-token prefix; the batch has a new 9,000-token prompt
    # and a continuation of that prefix. Largest first, the new prompt would take worker 0
    # and push the continuation off its prefix; the member some worker holds goes first.
    router = Router(policy="default", mode="approximate")
    a = router.add_worker("a", capacity=1 << 20)
    router.add_worker("b", capacity=1 << 20)
    prefix = np.arange(1, 4001, dtype=np.uint32)
    seed = router.dispatch(prefix)
    assert seed.worker == a
    router.finish(seed.request_id)
    new = np.arange(100_000, 109_000, dtype=np.uint32)
    follow = np.concatenate([prefix, np.arange(200_000, 200_500, dtype=np.uint32)])
    big, cont = router.dispatch_batch([new, follow])
    assert cont.worker == a and cont.matched == 4000
    assert big.worker != a


def test_default_batch_ties_rotate_over_idle_workers() -> None:
    # Batches of two unrelated prompts on four idle workers: each batch starts where the
    # last left off instead of at the first worker every time.
    router = Router(policy="default")
    for i in range(4):
        router.add_worker(f"w{i}")
    used: Counter[int] = Counter()
    for b in range(4):
        pair = [np.full(300, 10 * b + k + 1, dtype=np.uint32) for k in range(2)]
        decisions = router.dispatch_batch(pair)
        used.update(d.worker.index for d in decisions)
        for d in decisions:
            router.finish(d.request_id)
    assert sorted(used.values()) == [2, 2, 2, 2]


def test_bounded_pools_count_the_prefixes_recomputed_by_ches_approximation() -> None:
    import math

    from radixmeta.policies.default import _Member, _Piece, _Pools

    def group(g: int, members: int, prefix: int, tail: int) -> _Piece:
        ms = [_Member(g * 1000 + k, prefix + tail, -1, 0, [0, 0]) for k in range(members)]
        return _Piece(g, ms, prefix)

    pools = _Pools([10_000, 2_000], [0.0, 0.0])
    hot, cold = group(0, 30, 1500, 100), group(1, 10, 1500, 100)
    # Both prefixes fit in 10,000 tokens: each computed once, plus every tail.
    assert pools.load(0, [hot, cold]) == hot.cold + cold.cold
    # In 2,000 they do not: T solves 1500 (1 - e^{-0.75 T}) + 1500 (1 - e^{-0.25 T})
    # + 100 T = 2000, and each later member recomputes with the chance e^{-q T}.
    got = pools.load(1, [hot, cold])

    def kept(t: float) -> float:
        return 1500 * (1 - math.exp(-0.75 * t)) + 1500 * (1 - math.exp(-0.25 * t)) + 100 * t

    low, high = 0.0, 20.0
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if kept(mid) < 2000 else (low, mid)
    extra = 1500 * 29 * math.exp(-0.75 * low) + 1500 * 9 * math.exp(-0.25 * low)
    assert got == pytest.approx(hot.cold + cold.cold + extra, rel=1e-6)
    assert got > hot.cold + cold.cold


@st.composite
def fleets_and_batches(draw: st.DrawFn) -> dict[str, Any]:
    """A router's state and a batch for it: prompts of a few prefix groups and distinct
    ones, of varied lengths; requests in flight (queues; past prefill: decode tokens,
    which only the ties look at), prompts reported held, capacities
    (bounded pools) or none, engine reports (the delay weight and the unseen requests)."""
    page = draw(st.sampled_from([1, 4]))
    heads = [[100 + g] * draw(st.integers(0, 6)) * page for g in range(3)]

    def prompt() -> list[int]:
        head = draw(st.sampled_from([[], *heads]))
        return head + draw(st.lists(st.integers(0, 5), max_size=5 * page))

    return {
        "page": page,
        "workers": draw(st.integers(1, 4)),
        "capacity": draw(st.sampled_from([None, 2 * page, 5 * page, 40 * page, 400 * page])),
        "in_flight": draw(st.lists(st.tuples(st.builds(prompt), st.booleans()), max_size=4)),
        "held": draw(st.lists(st.builds(prompt), max_size=3)),
        "reports": draw(st.lists(st.tuples(st.integers(0, 3), st.floats(0, 1)), max_size=2)),
        "batches": draw(st.lists(st.lists(st.builds(prompt), max_size=12), min_size=1,
                                 max_size=3)),
    }


@settings(deadline=None)
@given(case=fleets_and_batches())
def test_default_batch_shortcuts_decide_exactly_as_the_general_code(case: dict[str, Any]) -> None:
    # choose_batch's shortcuts (groups of one, pieces that cost the same everywhere placed
    # from a heap) against the general code on the same views and groups, batch after
    # batch (the rotation carries over): the same worker, reason and detail for each.
    router = Router(case["page"], policy="default")
    workers = [
        router.add_worker(f"w{i}", capacity=case["capacity"]) for i in range(case["workers"])
    ]
    load_fleet(router, workers, case)
    seen: list[tuple[Any, Any, Any]] = []

    class Spy:
        flat_groups = True  # the router's PrefixGroups, passed on as they are

        def choose(self, request: Any, view: Any) -> Any:
            return view.workers[0]

        def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
            seen.append((requests, views, groups))
            return [view.workers[0] for view in views]

    router.policy = Spy()
    for batch in case["batches"]:
        router.dispatch_batch([np.array(key, dtype=np.uint32) for key in batch])
    fast, general = DefaultPolicy(), DefaultPolicy()
    for requests, views, groups in seen:
        assert default_module._FAST_PATHS
        quick = fast.choose_batch(requests, views, groups)
        default_module._FAST_PATHS = False
        try:
            slow = general.choose_batch(requests, views, groups)
        finally:
            default_module._FAST_PATHS = True
        assert quick == slow


def test_the_heap_and_the_scan_pick_alike_on_ties_and_loaded_workers() -> None:
    # Twelve distinct prompts of one length on four workers with unequal queues and
    # requests in flight (so unequal speeds): every tie and near tie the heap meets.
    from radixmeta.policies.default import _pack, _Piece

    pieces = [_Piece.single(g, g, 96, [0, 0, 0, 0], 0, {}) for g in range(12)]
    args = ([10.0, 0.0, 96.0, 0.0], (2, 3, 0, 1), [1.0, 1.5, 1.0, 1.0], [1.0] * 4,
            [10.0, 0.0, 96.0, 5.0])
    assert _pack(list(pieces), *args, None, True)[1:] == _pack(list(pieces), *args, None, False)[1:]


@given(
    members=st.integers(1, 4),
    shared=st.integers(0, 64),
    tail=st.integers(0, 64),
    held=st.integers(0, 128),
    capacity=st.integers(1, 160),
    queued=st.floats(0, 1000),
)
def test_a_pool_alone_prices_a_piece_as_the_whole_count_does(
    members: int, shared: int, tail: int, held: int, capacity: int, queued: float
) -> None:
    # _Pools.alone is the packing's shortcut for a worker with nothing of the batch yet:
    # where it answers (the prefix fits), it is exactly load(worker, [piece]).
    from radixmeta.policies.default import _Member, _Piece, _Pools

    ms = [_Member(k, shared + tail, k - 1, shared, [held, 0]) for k in range(members)]
    piece = _Piece(0, ms, shared)
    pools = _Pools([capacity, capacity], [queued, 0.0])
    got = pools.alone(0, piece)
    if shared > capacity:
        assert got is None
    else:
        assert got == pools.load(0, [piece])


def test_the_packed_path_prices_a_queue_at_its_workers_own_rate() -> None:
    # As test_policies_default's test for choose: both workers queue 2,000 uncached
    # tokens, worker 0's the tail of a 30,000-token context, worker 1's a fresh prompt.
    # At a chunk's rate the two queues tie and the rotation's first, worker 0, takes the
    # batch's request; at each worker's own rate worker 0 is the busier one.
    from policy_cases import request, view

    policy = DefaultPolicy()
    v = view([0, 0], requests=[1, 1], prefill=[2_000, 2_000])
    policy.on_dispatch(request(30_000, "long"), v.workers[0], 28_000)
    policy.on_dispatch(request(2_000, "short"), v.workers[1], 0)
    groups = [([0], 0)]  # a caller's own groups (no partners): the packed path
    (choice,) = policy.choose_batch([request(500, "next")], [v], groups)
    assert choice.worker == v.workers[1] and choice.reason == "batch"
    # Without rates of their own (both finished), the tie goes to the rotation's first.
    policy.on_finish(request(30_000, "long"), v.workers[0])
    policy.on_finish(request(2_000, "short"), v.workers[1])
    policy.choose_batch([request(500, "turn")], [view([0, 0])], groups)  # one turn more
    (again,) = policy.choose_batch([request(500, "later")], [v], groups)
    assert again.worker == v.workers[0]


def test_a_vanishing_reported_kv_share_prices_a_packed_batch_finitely(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A kv_usage of 2.2e-308 (found by hypothesis) is under one token in use: the
    # memory wait divided by it, overflowed to inf and left NaN loads in the packing.
    monkeypatch.setattr(default_module, "IN_ORDER_BUDGET", 0.0)
    router = Router(1, policy=DefaultPolicy())
    workers = [router.add_worker("w0", capacity=2)]
    case: dict[str, Any] = {
        "in_flight": [([], False), ([0], False)],
        "held": [],
        "reports": [(0, 2.2250738585072014e-308)],
    }
    load_fleet(router, workers, case)
    decisions = router.dispatch_batch([np.array([0], dtype=np.uint32)] * 2)
    for decision in decisions:
        loads = dict(decision.detail)
        assert np.isfinite(loads["worker_tokens"]), decision.detail
    router.close()
