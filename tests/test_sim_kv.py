"""The simulated workers' KV pool: admission, retraction, rejection, reported load.

Crafted cases use constant-time cost models so every instant can be computed by
hand (the comments do it); the property test drives tiny pools with long prompts
and checks the invariants after every step (``SimConfig(check=True)``).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from radixmeta.errors import InvalidInputError
from radixmeta.policies.base import Choice, Request, View, extra_requests
from radixmeta.sim import workloads
from radixmeta.sim.engine import SimConfig, SimRun, Simulation
from radixmeta.sim.metrics import summarise
from radixmeta.sim.worker import BatchLimits


def flat_prefill(extend: int, context: int) -> float:
    """10 ms a prefill step, whatever it computes."""
    return 0.01 if extend else 0.0


def linear_prefill(extend: int, context: int) -> float:
    """0.1 ms a new token: a recompute shows in the time."""
    return 1e-4 * extend


def flat_decode(batch_size: int, context: int) -> float:
    """1 ms a decode step."""
    return 0.001 if batch_size else 0.0


def prompt(start: int, length: int) -> np.ndarray:
    return np.arange(start, start + length, dtype=np.uint32)


def simulate(
    tokens: list[np.ndarray], arrivals: list[float], outputs: list[int], **cfg: Any
) -> SimRun:
    params: dict[str, Any] = {
        "workers": 1,
        "policy": "round_robin",
        "context_len": None,
        "prefill": flat_prefill,
        "decode": flat_decode,
        "check": True,
    }
    params.update(cfg)
    return Simulation(tokens, arrivals, outputs, SimConfig(**params)).run()


def test_admission_waits_for_the_reserve_of_the_running_request() -> None:
    # Pool 1000. A (600-token prompt, 300 out) needs 600 + 300 = 900 < 1000: admitted.
    # B (300 prompt, 10 out) needs 310 but only 1000 - 900 = 100 is left in that step,
    # and after A's prefill 1000 - 600 - 299 x 0.7 = 190.7: it waits, while A's
    # growth and its shrinking reserve keep the budget under 310 at every step, until
    # A finishes at 0.01 + 299 x 0.001 = 0.309 and B's own prefill can start.
    run = simulate([prompt(0, 600), prompt(5000, 300)], [0.0, 0.0], [300, 10], capacity=1000)
    assert run.admitted[1] == pytest.approx(0.309)
    assert run.finished[0] == pytest.approx(0.309)
    # Refused at admission (1), after A's prefill (1) and after each of A's decode
    # steps but the last (298): one count per step boundary where the head waited.
    assert run.admission_refused == [300]
    assert run.retracted == [0] and run.rejected == [False, False]
    s = summarise(run)
    assert s["queue_wait"]["p99"] == pytest.approx(0.309 * 0.98, rel=0.02)  # B's wait
    # A held 600 + 299 tokens at its last step: 899 of the pool's 1000.
    assert s["kv_peak"] == pytest.approx(0.899)


def test_an_unbounded_pool_admits_everything_at_once() -> None:
    run = simulate([prompt(0, 600), prompt(5000, 300)], [0.0, 0.0], [300, 10], capacity=None)
    assert run.admitted == [0.0, 0.0]
    assert run.admission_refused == [0] and run.kv_peak == [None]


def test_retraction_frees_the_most_recent_request_and_keeps_its_prompt() -> None:
    # Pool 400, one worker; prefill 0.1 ms a new token, decode 1 ms a step.
    # A: 20-token prompt, 300 out, alone at 0: done at 0.002 + 0.299 = 0.301; its
    #    prompt stays cached (evictable).
    # B: 10 + 200 at 0.8 (prefill to 0.801). C: 10 + 200 at 0.8005, admitted at 0.801
    #    beside B (needs 210 < 400 - 40 - 199 x 0.7 + 20), prefilled to 0.802.
    # B and C then take 2 tokens a step from 40 in use: A's prompt is evicted at step
    # 181, and at step 191 (0.802 + 0.190 = 0.992) nothing is left: C, admitted
    # last, is retracted. B finishes its 9 steps at 1.001. C's prompt is still
    # cached, so its second prefill recomputes only its 1 + 190 output tokens
    # (0.0191 s, to 1.0201), then 8 steps: done at 1.0281.
    tokens = [prompt(0, 20), prompt(1000, 10), prompt(2000, 10)]
    arrivals = [0.0, 0.8, 0.8005]
    run = simulate(tokens, arrivals, [300, 200, 200], capacity=400, prefill=linear_prefill)
    assert run.retracted == [1] and run.requeued == [1]
    assert run.finished[0] == pytest.approx(0.301)
    assert run.finished[1] == pytest.approx(1.001)
    assert run.admitted[2] == pytest.approx(1.001)  # the admission of its last prefill
    assert run.first_token[2] == pytest.approx(0.802)  # TTFT is the first token's
    assert run.finished[2] == pytest.approx(1.0201 + 0.008)
    assert run.hits[2] == 0  # counted at its first admission
    assert summarise(run)["retracted"] == 1


def test_fused_decode_steps_give_the_same_run_as_one_event_a_step() -> None:
    # trace=True runs one event a decode step; the default fuses them. Same results.
    wl = workloads.gsp(
        num_groups=6, prompts_per_group=6, system_prompt_len=300, question_len=50,
        output_len=120, range_ratio=0.3, rate=40.0, seed=5,
    )  # fmt: skip
    for capacity in (2_500, 6_000, None):
        cfg = SimConfig(workers=2, policy="default", capacity=capacity, context_len=None)
        fused = summarise(Simulation.from_workload(wl, cfg).run())
        stepped = summarise(Simulation.from_workload(wl, replace(cfg, trace=True)).run())
        for s in (fused, stepped):
            s.pop("timing")
        assert fused == stepped


def test_requests_longer_than_the_context_or_the_pool_are_rejected() -> None:
    # Context 100: 60 + 39 < 100 runs; 60 + 40 reaches it (SGLang rejects
    # input + max_new_tokens >= context_len). A pool of 80 rejects 60 + 20 too.
    tokens = [prompt(0, 60), prompt(100, 60), prompt(200, 60)]
    run = simulate(tokens, [0.0] * 3, [39, 40, 10], capacity=None, context_len=100)
    assert run.rejected == [False, True, False]
    s = summarise(run)
    assert s["rejected"] == 1 and s["completed"] == 2
    assert s["workers"][0]["rejected"] == 1
    assert math.isnan(run.first_token[1]) and math.isnan(run.finished[1])
    assert s["hit_rate"] == 0.0  # over the served prompts only
    small = simulate(tokens, [0.0, 0.0, 0.0], [39, 10, 20], capacity=80)
    assert small.rejected == [True, False, True]


def test_the_cost_models_pool_and_context_are_the_defaults() -> None:
    cfg = SimConfig()
    assert cfg.resolved("capacity") == 198_516 and cfg.resolved("context_len") == 32_768
    h100 = SimConfig(prefill="llama3_1_8b_h100", decode="llama3_1_8b_h100")
    assert h100.resolved("capacity") == 447_728 and h100.resolved("context_len") == 131_072
    with pytest.raises(InvalidInputError, match="capacity='model' needs a cost model"):
        SimConfig(prefill=flat_prefill, decode=flat_decode, context_len=None)
    with pytest.raises(InvalidInputError, match="context_len='model' needs a cost model"):
        SimConfig(prefill=flat_prefill, decode=flat_decode, capacity=None)
    with pytest.raises(InvalidInputError, match="context_len must be a positive"):
        SimConfig(context_len=0)
    with pytest.raises(InvalidInputError, match="report_interval must be > 0"):
        SimConfig(report_interval=float("nan"))
    with pytest.raises(InvalidInputError, match="dispatch_time must be a finite"):
        SimConfig(dispatch_time=-1.0)
    with pytest.raises(InvalidInputError, match="max_running and max_prefill_tokens"):
        SimConfig(limits=BatchLimits(max_running=0))


class ReportSpy:
    """Round robin that writes down what the router showed it of the engines' reports."""

    def __init__(self) -> None:
        self._turn = 0
        self.seen: list[list[Any]] = []

    def choose(self, request: Request, view: View) -> Choice:
        self.seen.append(list(view.reported))
        worker = view.workers[self._turn % len(view.workers)]
        self._turn += 1
        return Choice(worker, "spy")


def test_the_router_sees_what_the_workers_reported_at_the_last_report_instant() -> None:
    # Two workers, reports every 0.2 s; prefill 10 ms, decode 1 ms a step. Three
    # requests of 600 + 100 at 0.0003, round robin: w0 gets 0 and 2 but its pool of
    # 1000 holds only one (700 + 700 > 1000), w1 gets 1. Request 0 runs to 0.1093,
    # then request 2 is admitted (evicting 0's prompt), prefilled by 0.1193 and
    # takes a token a step to 0.2183. A probe at 0.3 sees the report of instant 0.2:
    # 80 steps ended, the 81st in flight: 600 + 81 tokens of w0's 1000 held.
    spy = ReportSpy()
    tokens = [prompt(0, 600), prompt(1000, 600), prompt(2000, 600), prompt(3000, 5)]
    cfg = SimConfig(
        workers=2, policy=spy, capacity=1000, context_len=None, prefill=flat_prefill,
        decode=flat_decode, report_interval=0.2, check=True, batch_dispatch=False,
    )  # fmt: skip
    run = Simulation(tokens, [0.0003] * 3 + [0.3], [100, 100, 100, 2], cfg).run()
    assert run.worker == [0, 1, 0, 1]
    assert run.admitted[2] == pytest.approx(0.1093)
    # The three at 0.0003 see the report of instant 0: both workers empty.
    for seen in spy.seen[:3]:
        assert [(r.queue_length, r.running, r.kv_usage) for r in seen] == [(0, 0, 0.0)] * 2
    w0, w1 = spy.seen[3]
    assert (w0.queue_length, w0.running) == (0, 1)
    assert w0.kv_usage == pytest.approx((600 + 81) / 1000)
    assert (w1.queue_length, w1.running, w1.kv_usage) == (0, 0, 0.0)  # done, prompt evictable
    # Stamped with the instant they describe and the router's own count then: w0's at 0.2
    # (request 2 in flight), w1's unchanged since instant 0; neither has load the router
    # did not send.
    assert (w0.at, w0.router_requests) == (pytest.approx(0.2), 1)
    assert (w1.at, w1.router_requests) == (0.0, 0)
    assert extra_requests(w0) == extra_requests(w1) == 0
    # Without reports the view carries none.
    quiet = ReportSpy()
    Simulation(tokens, [0.0003] * 3 + [0.3], [100, 100, 100, 2],
               replace(cfg, policy=quiet, report_interval=math.inf)).run()  # fmt: skip
    assert quiet.seen[3] == [None, None]


def test_router_time_defers_idle_replay_and_is_counted_in_the_lag() -> None:
    wl = workloads.gsp(
        num_groups=8, prompts_per_group=8, system_prompt_len=256, question_len=32,
        output_len=16, rate=200.0, seed=2,
    )  # fmt: skip
    base = SimConfig(workers=4, policy="default", capacity=None, context_len=None)
    free = summarise(Simulation.from_workload(wl, base).run())
    busy = summarise(
        Simulation.from_workload(wl, replace(base, dispatch_time=0.004, replay_time=0.001)).run()
    )
    assert free["event_lag"]["p99"] <= free["event_lag"]["max"]
    assert busy["event_lag"]["p99"] > free["event_lag"]["p99"]
    assert busy["event_lag"]["mean"] > free["event_lag"]["mean"]
    assert busy["completed"] == free["completed"] == len(wl)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # which shared prefix
            st.integers(1, 120),  # prompt length
            st.integers(1, 60),  # output length
            st.floats(0, 0.05),  # gap to the previous arrival
        ),
        min_size=1,
        max_size=25,
    ),
    st.integers(60, 400),
    st.integers(1, 3),
    st.sampled_from([1, 4]),
)
def test_tiny_pools_with_long_prompts_keep_every_invariant(
    requests: list[tuple[int, int, int, float]], capacity: int, workers: int, page: int
) -> None:
    # Long prompts against pools a few prompts big: admission waits, decode runs out
    # of memory and retracts, long ones are rejected; after every step the pool is
    # within its capacity and every running request's pages are locked, and at the
    # end every worker drained (SimConfig(check=True) raises otherwise).
    rng = np.random.default_rng(len(requests))
    prefixes = [rng.integers(0, 50_000, 200, dtype=np.uint32) for _ in range(4)]
    tokens, arrivals, outputs = [], [], []
    t = 0.0
    for group, length, output, gap in requests:
        tail = rng.integers(0, 50_000, length, dtype=np.uint32)
        tokens.append(np.concatenate([prefixes[group][: length // 2], tail])[:length])
        t += gap
        arrivals.append(t)
        outputs.append(output)
    run = simulate(
        tokens, arrivals, outputs, workers=workers, capacity=capacity, page_size=page,
        policy="default", prefill=linear_prefill,
    )  # fmt: skip
    s = summarise(run)
    assert s["completed"] + s["rejected"] == len(requests)
    for r, (length, output) in enumerate(zip(run.prompt_len, run.output_len, strict=True)):
        assert run.rejected[r] == (length + output >= capacity)
    assert s["kv_peak"] is None or s["kv_peak"] <= 1.0
    assert s["insert_refused"] == 0
