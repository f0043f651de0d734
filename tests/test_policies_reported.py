"""What the engines report (``View.reported``), as the router stamps it and the policies read it.

A report is the engine's truth as of its arrival; the router's counts are exact
for its own requests and current. The policies add to the router's counts what
only the engine saw (requests beyond the router's own when it reported).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from policy_cases import index_of, request, view, with_

from radixmeta import Router
from radixmeta.policies import EngineLoad, create
from radixmeta.policies.base import extra_requests

LOADED = EngineLoad(queue_length=10_000, kv_usage=1.0, running=32)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_router_stamps_a_report_with_its_clock_and_its_own_count() -> None:
    clock = Clock()
    router = Router(policy="round_robin", clock=clock)
    a = router.add_worker("a")
    router.add_worker("b")
    router.dispatch([1, 2, 3], request_id="x")  # to a
    clock.now = 7.5
    router.report_load(a, queue_length=3, kv_usage=0.5, running=2)
    report = router.load(a).reported
    assert report == EngineLoad(3, 0.5, 2, at=7.5, router_requests=1)
    assert extra_requests(report) == 4  # the engine sees 5, the router knew of 1
    router.finish("x")
    assert router.load(a).reported == report  # a report stands until the next one


@pytest.mark.parametrize(
    ("report", "extra"),
    [
        (None, 0),
        (EngineLoad(), 0),
        (EngineLoad(queue_length=5), 5),  # not through a router: all of it is extra
        (EngineLoad(queue_length=2, running=3, router_requests=4), 1),
        # the engine had not seen all of the router's requests yet: the router's count stands
        (EngineLoad(queue_length=0, running=1, router_requests=6), 0),
    ],
)
def test_extra_requests(report: EngineLoad | None, extra: int) -> None:
    assert extra_requests(report) == extra


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("least_loaded", {}),
        ("least_loaded", {"load": "tokens"}),
        ("power_of_two", {}),
        ("power_of_two", {"load": "requests"}),
        ("cache_aware", {}),
        ("default", {}),
    ],
)
def test_a_worker_reporting_a_long_queue_and_a_full_pool_is_not_chosen(
    name: str, params: dict[str, str]
) -> None:
    # Worker 0 holds the prompt and the router has nothing in flight anywhere, but its
    # engine reports 10,000 queued (another router's traffic) and a full KV pool.
    policy = create(name, **params)
    size = 2000
    requests, prefill = [0, 0, 0, 0], [0, 0, 0, 0]
    picks = []
    for k in range(4):
        v = view(
            [1536, 0, 0, 0],
            requests=requests,
            prefill=prefill,
            reported=[LOADED, None, None, None],
        )
        i = index_of(v, policy.choose(request(size, f"r{k}"), v))
        picks.append(i)
        requests[i] += 1
        prefill[i] += size - v.lengths[i]
    assert 0 not in picks, picks


@pytest.mark.parametrize("name", ["least_loaded", "power_of_two", "cache_aware", "default"])
def test_a_report_within_the_routers_own_count_changes_nothing(name: str) -> None:
    # The engine reports what the router already counts: the choices are those without it.
    same = [EngineLoad(queue_length=1, running=2, at=0.0, router_requests=3)] * 3
    for k in range(6):
        v = view([0, 600, 0], requests=[3, 3, 3], prefill=[100, 700, 0])
        bare = create(name).choose(request(1000, f"r{k}"), v)
        reported = view(
            [0, 600, 0], requests=[3, 3, 3], prefill=[100, 700, 0], reported=same
        )
        if name == "default":
            # default also reads the queue: one waiting request behind makes it stickier,
            # never less sticky, so the holder it took without the report it keeps.
            assert index_of(reported, create(name).choose(request(1000), reported)) == 1
            assert index_of(v, bare) == 1
        else:
            assert index_of(reported, create(name).choose(request(1000), reported)) == index_of(
                v, bare
            )


def test_cache_aware_balances_on_the_reported_load_as_sgl_router_on_its_counts() -> None:
    policy = create("cache_aware")  # balance when the spread > 64 and > 1.5x
    v = view([900, 0], requests=[10, 10])
    assert policy.choose(request(1000), v).reason == "affinity"
    busy = view([900, 0], requests=[10, 10], reported=[EngineLoad(queue_length=100), None])
    choice = policy.choose(request(1000), busy)
    assert choice.reason == "balance" and index_of(busy, choice) == 1


def test_least_loaded_by_tokens_weighs_an_unseen_request_at_the_fleets_mean() -> None:
    # 2 requests in flight with 3,000 tokens: an unseen request weighs 1,500.
    v = view(
        [0, 0, 0],
        requests=[1, 1, 0],
        prefill=[1000, 0, 0],
        decode=[0, 2000, 1800],
        reported=[None, None, EngineLoad(queue_length=1)],
    )
    choice = create("least_loaded", load="tokens").choose(request(10), v)
    assert index_of(v, choice) == 0
    assert dict(choice.detail)["load"] == 1000.0


def test_default_counts_the_requests_waiting_behind_as_delayed_by_its_prefill() -> None:
    # Worker 0 holds 1,536 of a 2,048-token prompt and has 6,000 tokens queued, worker 1
    # 1,000: without reports the prefix is worth recomputing on worker 1. With 20 requests
    # reported waiting on each, each delayed by the prefill the choice adds, it is not.
    # (The count is the fleet's: a balanced fleet's workers are equally busy.)
    v = view([1536, 0], requests=[20, 20], prefill=[6000, 1000])
    assert index_of(v, create("default").choose(request(2048), v)) == 1
    waiting = [EngineLoad(queue_length=20, running=0, router_requests=20)] * 2
    busy = view([1536, 0], requests=[20, 20], prefill=[6000, 1000], reported=waiting)
    choice = create("default").choose(request(2048), busy)
    assert index_of(busy, choice) == 0 and choice.reason == "affinity"
    # A fleet with nothing waiting and pools a tenth full delays little: there the
    # recompute on the idle worker is the faster first token.
    quiet = [
        EngineLoad(queue_length=0, kv_usage=0.1, running=20, router_requests=20),
        EngineLoad(queue_length=0, kv_usage=0.1, running=0, router_requests=0),
    ]
    light = view([1536, 0], requests=[20, 0], prefill=[6000, 0], reported=quiet)
    assert index_of(light, create("default").choose(request(2048), light)) == 1
    # The same with the pools 95 % full: a second of recompute delays about 19 requests.
    full = [replace(r, kv_usage=0.95) for r in quiet]
    busy = view([1536, 0], requests=[20, 0], prefill=[6000, 0], reported=full)
    assert index_of(busy, create("default").choose(request(2048), busy)) == 0


def test_default_waits_for_room_in_a_full_pool() -> None:
    # Worker 0 holds 1,536 of the prompt but its 100,000-token pool is 99.9 % used by
    # 10 running requests: the 512 new tokens and the output reserve wait until about
    # 2,400 tokens are freed, which 2,000-token outputs take over a second to do.
    reports = [
        EngineLoad(queue_length=0, kv_usage=0.999, running=10, router_requests=10),
        EngineLoad(queue_length=0, kv_usage=0.1, running=1, router_requests=1),
    ]
    v = view([1536, 0], requests=[10, 1], capacities=[100_000, 100_000], reported=reports)
    ask = request(2048, expected_output=2000)
    choice = create("default").choose(ask, v)
    assert index_of(v, choice) == 1
    assert dict(choice.detail)["ttft"] < 0.3
    # A decode step that took no time would free the room at once: the holder wins.
    instant = create("default", decode=lambda batch, context: 0.0)
    assert index_of(v, instant.choose(ask, v)) == 0
    assert repr(instant).endswith("decode='<lambda>')")


def test_default_reads_the_pool_the_engine_reports_not_the_sum_of_its_prompts() -> None:
    # 20 running requests on worker 0 share its 8,000-token prefix: the router counts
    # 20 x 9,000 = 180,000 decode tokens against a 100,000-token pool, but the engine
    # holds 40 % of it. The holder has room; recomputing the prefix elsewhere is slower.
    reports = [
        EngineLoad(queue_length=0, kv_usage=0.4, running=20, router_requests=20),
        EngineLoad(queue_length=0, kv_usage=0.05, running=2, router_requests=2),
    ]
    v = view(
        [8000, 0],
        requests=[20, 2],
        decode=[180_000, 10_000],
        capacities=[100_000, 100_000],
        reported=reports,
    )
    choice = create("default").choose(request(8500, expected_output=200), v)
    assert index_of(v, choice) == 0 and choice.reason == "affinity"
    # Without reports the router's own counts are all there is: the holder looks full.
    blind = with_(v, reported=[None, None])
    assert index_of(blind, create("default").choose(request(8500), blind)) == 1


@pytest.mark.parametrize("prefill", ["mistral_7b_a6000", "llama3_70b_a100_tp2"])
def test_default_does_not_fit_a_request_into_a_pool_its_engine_reports_full(prefill: str) -> None:
    # Worker 0's engine holds 99 % of its pool for running requests; worker 1 has a queue
    # but room. With no output seen yet, no memory wait is priced, so the fit rule alone
    # must read the reported use (with a prefill-only model there is no wait at all).
    reports = [
        EngineLoad(queue_length=0, kv_usage=0.99, running=20, router_requests=20),
        EngineLoad(queue_length=0, kv_usage=0.10, running=2, router_requests=2),
    ]
    v = view(
        [0, 0],
        requests=[20, 2],
        prefill=[0, 20_000],
        decode=[99_000, 0],
        capacities=[100_000, 100_000],
        reported=reports,
    )
    assert index_of(v, create("default", prefill=prefill).choose(request(5000), v)) == 1
