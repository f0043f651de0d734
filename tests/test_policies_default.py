"""The default policy: affinity while a group fits on one worker, replication once it does not."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import detail, index_of, reason, request, view, with_

from radixmeta.policies import DefaultPolicy, Policy, create
from radixmeta.policies import default as default_module
from radixmeta.policies.base import EngineLoad, worker_of
from radixmeta.policies.costs import mistral_7b_a6000_prefill as prefill

PREFIX, TAIL = 2000, 100


def run_group(
    policy: Policy, count: int, drain: int | None, workers: int = 4
) -> tuple[list[int], str, list[int]]:
    """Route ``count`` requests of one shared-prefix group, as the router's view would show them.

    The chosen worker holds the prefix from then on (the optimistic insert) and queues the
    request's uncached tokens; between arrivals every worker prefills ``drain`` queued
    tokens (``None``: nothing ever drains). Returns the picks, the first letters of the
    reasons, and the queues at the end.
    """
    holds = [False] * workers
    queued = [0] * workers
    picks: list[int] = []
    reasons = ""
    for i in range(count):
        v = view(
            [PREFIX if h else 0 for h in holds],
            requests=[q // TAIL for q in queued],
            prefill=queued,
            prefix_key=1 if any(holds) else None,
        )
        choice = policy.choose(request(PREFIX + TAIL, f"r{i}"), v)
        k = index_of(v, choice)
        queued[k] += PREFIX + TAIL - v.lengths[k]
        holds[k] = True
        picks.append(k)
        reasons += reason(choice)[0]
        if drain is not None:
            queued = [max(0, q - drain) for q in queued]
    return picks, reasons, queued


def test_a_group_that_fits_stays_on_one_worker() -> None:
    # A worker prefills 150 tokens between arrivals and each request adds 100: it keeps up.
    picks, reasons, queued = run_group(create("default"), 300, drain=150)
    assert picks == [0] * 300
    assert reasons == "b" + "a" * 299  # the first lands by balance, the rest by affinity
    assert queued == [0, 0, 0, 0]


@pytest.mark.parametrize(("drain", "replicas"), [(60, 2), (40, 3), (20, 4)])
def test_a_group_that_would_overload_one_worker_is_replicated(drain: int, replicas: int) -> None:
    # 100 tokens arrive per interval; one replica prefills `drain` of them: ceil(100 / drain)
    # replicas keep up (all four are not enough at 20, so all four are used).
    picks, reasons, queued = run_group(create("default"), 400, drain=drain)
    used = sorted(set(picks))
    assert len(used) == replicas
    assert reasons.count("s") == replicas - 1  # one spill per new replica, then affinity
    assert reasons.index("s") > 10  # no replica before the holder's queue builds up
    counts = [picks.count(k) for k in used]
    assert max(counts) < 1.5 * min(counts)  # the group is shared out among its replicas
    if replicas < 4:
        assert max(queued) < 4 * (PREFIX + TAIL)  # and the queues stay bounded


def test_work_weight_keeps_a_burst_from_replicating_at_once() -> None:
    # Nothing drains: with work_weight 0 (pure least TTFT) the second request of the burst
    # already recomputes the prefix elsewhere; the default waits until replicating pays.
    _, eager, _ = run_group(create("default", work_weight=0.0), 8, drain=None)
    assert eager[:4] == "bsss"
    _, patient, _ = run_group(create("default"), 40, drain=None)
    first = patient.index("s")
    assert first > 10 and patient[:first] == "b" + "a" * (first - 1)


def test_new_groups_rotate_over_idle_workers() -> None:
    policy = create("default")
    v = view([0, 0, 0, 0])
    picks = [index_of(v, policy.choose(request(500, f"r{i}"), v)) for i in range(6)]
    assert picks == [0, 1, 2, 3, 0, 1]
    assert reason(policy.choose(request(500), v)) == "balance"


def test_ties_go_to_the_fewest_tokens_in_flight() -> None:
    policy = create("default")
    v = view([0, 0, 0], decode=[300, 100, 200])
    assert {index_of(v, policy.choose(request(500, f"r{i}"), v)) for i in range(3)} == {1}


def test_the_holder_wins_and_the_detail_shows_why() -> None:
    policy = create("default")
    v = view([0, 2048, 0])
    choice = policy.choose(request(2148), v)
    assert index_of(v, choice) == 1 and reason(choice) == "affinity"
    numbers = detail(choice)
    assert numbers["prefill"] == pytest.approx(prefill(100, 2148))
    assert numbers["ttft"] == pytest.approx(prefill(100, 2148))
    assert (numbers["matched"], numbers["best_matched"]) == (2048.0, 2048.0)


def test_the_score_formula() -> None:
    policy = create("default", work_weight=0.5)
    token_time = prefill(512, 512) / 512
    v = view([0, 1024], requests=[10, 300], prefill=[800, 6000])
    size = 1500
    scores = [
        (1 + 10 / 512) * (token_time * 800 + 1.5 * prefill(1500, 1500)),
        (1 + 300 / 512) * (token_time * 6000 + 1.5 * prefill(476, 1500)),
    ]
    choice = policy.choose(request(size), v)
    assert index_of(v, choice) == scores.index(min(scores))
    k = index_of(v, choice)
    own = prefill(size - v.lengths[k], size)
    slow = 1 + v.requests[k] / 512
    assert detail(choice)["ttft"] == pytest.approx(slow * (token_time * v.prefill_tokens[k] + own))


def test_a_worker_that_cannot_hold_the_request_is_avoided() -> None:
    policy = create("default")
    # worker 0 holds the prefix but has 9,000 of its 10,000 tokens in flight
    v = view([2000, 0], decode=[9000, 0], capacities=[10_000, 10_000])
    choice = policy.choose(request(3100), v)
    assert index_of(v, choice) == 1 and reason(choice) == "spill"
    # when no worker can, the score decides among all
    v = view([2000, 0], decode=[9000, 9500], capacities=[10_000, 10_000])
    assert index_of(v, policy.choose(request(3100), v)) == 0
    # an unknown capacity always fits
    v = view([2000, 0], decode=[9000, 0], capacities=[None, 10_000])
    assert index_of(v, policy.choose(request(3100), v)) == 0


def test_host_hits_count_at_host_weight() -> None:
    v = view([0, 0], host=[2048, 0])
    choice = create("default").choose(request(2148), v)
    assert index_of(v, choice) == 0 and reason(choice) == "affinity"
    expected = prefill(100, 2148) + 0.25 * (prefill(2148, 2148) - prefill(100, 2148))
    assert detail(choice)["prefill"] == pytest.approx(expected)
    assert detail(choice)["host_matched"] == 2048.0
    # host_weight 0: a host hit is worth nothing, so the two workers tie
    none = create("default", host_weight=0.0).choose(request(2148), v)
    assert detail(none)["prefill"] == pytest.approx(prefill(2148, 2148))


def test_a_custom_prefill_model() -> None:
    def linear(extend: int, context: int) -> float:
        return 1e-4 * extend

    policy = create("default", prefill=linear)
    assert isinstance(policy, DefaultPolicy)
    assert repr(policy) == "DefaultPolicy(prefill='linear', work_weight=1.0, host_weight=0.75)"
    v = view([0, 1000])
    assert detail(policy.choose(request(1100), v))["prefill"] == pytest.approx(0.01)


@settings(max_examples=400, deadline=None)
@given(st.data())
def test_the_lean_scan_decides_as_the_general_one(data: st.DataObject) -> None:
    # choose() has a lean scan for the views with no page on a host tier (host lengths
    # equal to the device's) and room on every worker; with it off (_LEAN_SCAN) the
    # general scan decides. Both must give the same choice, reason and numbers.
    n = data.draw(st.integers(1, 8), label="workers")
    size = data.draw(st.integers(1, 4096), label="prompt")
    counts = st.lists(st.integers(0, 3000), min_size=n, max_size=n)
    lengths = data.draw(st.lists(st.integers(0, size), min_size=n, max_size=n), label="lengths")
    capacity = st.one_of(st.none(), st.integers(0, 12_000))
    shared = view(
        lengths,
        requests=data.draw(st.lists(st.integers(0, 600), min_size=n, max_size=n)),
        prefill=data.draw(counts, label="prefill"),
        decode=data.draw(counts, label="decode"),
        capacities=data.draw(
            st.one_of(
                st.lists(capacity, min_size=n, max_size=n),
                capacity.map(lambda c: [c] * n),
            ),
            label="capacities",
        ),
    )
    shared.host_lengths = shared.lengths  # the router's form: one list for both
    apart = with_(shared, host_lengths=list(shared.lengths))
    turn = data.draw(st.integers(0, 3 * n), label="turn")
    # A user's model may give NaN: the first of the rotation then stays, in both scans.
    model = data.draw(st.sampled_from(["mistral_7b_a6000", "nan"]), label="model")

    def with_nan(extend: int, context: int) -> float:
        return math.nan if extend % 3 == 0 else extend * 1e-5

    make = (lambda: create("default")) if model != "nan" else (
        lambda: create("default", prefill=with_nan)
    )
    lean, general = make(), make()
    for policy in (lean, general):
        for _ in range(turn):  # the same place in the rotation
            policy.choose(request(size), view([0] * n))
    a = lean.choose(request(size), shared)
    assert default_module._LEAN_SCAN
    default_module._LEAN_SCAN = False
    try:
        b = general.choose(request(size), apart)
    finally:
        default_module._LEAN_SCAN = True
    assert a.worker == b.worker and a.reason == b.reason
    assert str(a.detail) == str(b.detail)  # NaN-safe equality of the numbers


@pytest.mark.parametrize("reports", [False, True])
def test_a_queue_is_priced_at_its_workers_own_rate(reports: bool) -> None:
    # Both workers queue 2,000 uncached tokens; worker 0's are the tail of a 30,000-token
    # context, worker 1's a fresh 2,000-token prompt. Prefill cost grows with the context,
    # so worker 0 is the busier one, though a chunk's rate prices both queues alike.
    policy = create("default")
    long, short = request(30_000, "long"), request(2_000, "short")
    reported = [EngineLoad(queue_length=0), EngineLoad(queue_length=0)] if reports else None
    v = view([0, 0], requests=[1, 1], prefill=[2_000, 2_000], reported=reported)
    policy.on_dispatch(long, v.workers[0], 28_000)
    policy.on_dispatch(short, v.workers[1], 0)
    rates = [prefill(2_000, 30_000) / 2_000, prefill(2_000, 2_000) / 2_000]
    assert rates[0] > rates[1]
    choice = policy.choose(request(500, "next"), v)  # worker 0 is first in the rotation
    assert index_of(v, choice) == 1
    slow = 1 + 1 / 512
    assert detail(choice)["ttft"] == pytest.approx(
        slow * (rates[1] * 2_000 + prefill(500, 500))
    )
    # Once both finish, neither worker has a rate of its own: a chunk's rate prices both
    # queues alike again and the first of the rotation (0, after one turn more) keeps the tie.
    policy.on_finish(long, v.workers[0])
    policy.on_finish(short, v.workers[1])
    policy.on_finish(short, v.workers[1])  # a request told twice is ignored the second time
    policy.choose(request(500, "turn"), view([0, 0]))
    token_time = prefill(512, 512) / 512
    again = policy.choose(request(500, "later"), v)
    assert index_of(v, again) == 0
    assert detail(again)["ttft"] == pytest.approx(
        slow * (token_time * 2_000 + prefill(500, 500))
    )


def test_rank_and_choose_read_the_same_rates() -> None:
    policy = create("default")
    v = view([0, 0, 0], requests=[1, 1, 0], prefill=[3_000, 3_000, 3_000])
    policy.on_dispatch(request(40_000, "a"), v.workers[0], 37_000)
    policy.on_dispatch(request(3_000, "b"), v.workers[1], 0)
    ranked = policy.rank(request(800, "c"), v)
    assert ranked[-1] == v.workers[0]  # the long-context queue is the dearest
    assert ranked[0] == worker_of(policy.choose(request(800, "c"), v))


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_which_list_a_view_carries_means_nothing(data: st.DataObject) -> None:
    # The router shows ``expected`` as the lengths list itself when nothing is cut, and
    # one list for lengths and host lengths when nothing is on a host tier; a batch's
    # views carry copies. choose (and rank) must read the values, not the objects: a
    # view whose lists are all copies decides as the one that shares them.
    n = data.draw(st.integers(1, 6), label="workers")
    size = data.draw(st.integers(1, 20_000), label="prompt")
    counts = st.lists(st.integers(0, 60_000), min_size=n, max_size=n)
    lengths = data.draw(st.lists(st.integers(0, size), min_size=n, max_size=n), label="lengths")
    shared = view(
        lengths,
        requests=data.draw(st.lists(st.integers(0, 300), min_size=n, max_size=n)),
        prefill=data.draw(counts, label="prefill"),
        decode=data.draw(counts, label="decode"),
        capacities=data.draw(
            st.lists(st.one_of(st.none(), st.integers(0, 100_000)), min_size=n, max_size=n),
            label="capacities",
        ),
    )
    shared.host_lengths = shared.lengths
    cut = data.draw(st.booleans(), label="cut")
    if cut:  # the router expects an eviction somewhere: the loaded scan, in both forms
        k = data.draw(st.integers(0, n - 1), label="cut worker")
        expected = list(lengths)
        expected[k] = data.draw(st.integers(0, lengths[k]), label="kept") if lengths[k] else 0
        shared.expected = expected
    else:
        shared.expected = shared.lengths
    apart = with_(
        shared,
        lengths=list(shared.lengths),
        host_lengths=list(shared.lengths),
        expected=list(shared.expected),
    )
    output = data.draw(st.one_of(st.none(), st.integers(1, 2_000)), label="output")
    one, two = create("default"), create("default")
    for policy in (one, two):  # a mean output, so the loaded scan prices memory waits
        policy.choose(request(100, "warm", expected_output=300), view([0] * n))
    ranked = one.rank(request(size, "r", output), shared)
    assert ranked == two.rank(request(size, "r", output), apart)
    a = one.choose(request(size, "r", output), shared)
    b = two.choose(request(size, "r", output), apart)
    assert a.worker == b.worker and a.reason == b.reason
    assert str(a.detail) == str(b.detail)
    assert ranked[0] == a.worker


def test_a_request_that_would_start_at_once_anywhere_goes_where_least_was_written() -> None:
    # Nothing is queued on either worker and neither holds any of the prompt, so both
    # would start it at once; worker 0 has fewer requests in flight (its score is lower by
    # slow), but 20,000 uncached tokens were sent there before, against 2,000 to worker
    # 1: the new prefix (and the requests that will share it) goes to worker 1.
    policy = create("default")
    v = view([0, 0], requests=[1, 3])
    policy.on_dispatch(request(20_000, "a"), v.workers[0], 0)
    policy.on_dispatch(request(2_000, "b"), v.workers[1], 0)
    choice = policy.choose(request(500, "next"), v)
    assert index_of(v, choice) == 1 and reason(choice) == "balance"
    assert detail(choice)["ttft"] == pytest.approx((1 + 3 / 512) * prefill(500, 500))
    assert policy.rank(request(500, "next"), v)[0] == v.workers[1]
    # A worker with anything queued would not start it at once: the score decides.
    queued = view([0, 0], requests=[1, 3], prefill=[0, 1])
    assert index_of(queued, policy.choose(request(500, "q"), queued)) == 0
    # Nor does it move a request off the worker holding more of its prompt.
    held = view([0, 256], requests=[3, 1])
    policy.on_dispatch(request(40_000, "c"), v.workers[1], 0)
    assert index_of(held, policy.choose(request(500, "h"), held)) == 1
