"""The simulator's engine: real caches and a real Router on a simulated clock.

Small workloads so the module runs in seconds; the full A.4 figures are the
documented ``radixmeta reproduce a4`` run.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

from radixmeta.errors import InvalidInputError
from radixmeta.policies import costs
from radixmeta.sim import workloads
from radixmeta.sim.engine import SimConfig, Simulation
from radixmeta.sim.metrics import summarise
from radixmeta.sim.sweep import grid, run_cells
from radixmeta.sim.worker import BatchLimits, batch_prefill_time


def small_gsp(rate: float = math.inf, **kw: object) -> workloads.Workload:
    params = dict(
        num_groups=8, prompts_per_group=8, system_prompt_len=512, question_len=64, output_len=8
    )
    params.update(kw)
    return workloads.gsp(rate=rate, seed=3, **params)  # type: ignore[arg-type]


def run(workload: workloads.Workload, **cfg: object) -> dict:
    config = SimConfig(**cfg)  # type: ignore[arg-type]
    sim = Simulation.from_workload(workload, config)
    return summarise(sim.run(), workload.optimal_hit_rate(config.page_size))


def without_timing(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "timing"}


def test_same_seed_same_bytes() -> None:
    wl = small_gsp(rate=40.0)
    for policy in ("default", "random", "power_of_two", "preble_e2"):
        a = run(wl, policy=policy, workers=3)
        b = run(wl, policy=policy, workers=3)
        assert json.dumps(without_timing(a), sort_keys=True) == json.dumps(
            without_timing(b), sort_keys=True
        )
        assert a["completed"] == len(wl)


def test_round_robin_hits_what_its_closed_form_says() -> None:
    # All at once, unbounded caches: round robin spreads each group of n prompts over W
    # workers, so each worker pays the system prompt once per group it sees.
    wl = small_gsp(num_groups=4, prompts_per_group=8)
    rr = run(wl, policy="round_robin", workers=4)
    affinity = run(wl, policy="longest_prefix", workers=4)
    n, w, p, q = 8, 4, 512, 64
    expected = (n - w) * p / (n * (p + q))
    assert rr["hit_rate"] == pytest.approx(expected, abs=0.01)
    assert affinity["hit_rate"] == pytest.approx(affinity["optimal_hit_rate"], abs=0.01)
    assert rr["hit_rate"] < affinity["hit_rate"]
    assert rr["optimal_hit_rate"] == pytest.approx(wl.optimal_hit_rate(), abs=1e-12)


def test_every_request_finishes_and_times_are_ordered() -> None:
    wl = small_gsp(rate=20.0)
    config = SimConfig(workers=2, policy="least_loaded", consistency="immediate")
    r = Simulation.from_workload(wl, config).run()
    a, f0, f1 = map(np.asarray, (r.arrival, r.first_token, r.finished))
    assert not np.isnan(f1).any()
    assert (np.asarray(r.admitted) >= a).all() and (f0 >= np.asarray(r.admitted)).all()
    assert (f1 >= f0).all()
    assert sorted(set(r.worker)) == [0, 1]
    assert r.records > 0 and r.replay_stats["applied"] > 0


@pytest.mark.parametrize("consistency", ["immediate", "delayed", "idle", "none"])
def test_every_consistency_runs_and_reports_its_lag(consistency: str) -> None:
    wl = small_gsp(rate=30.0)
    s = run(wl, policy="default", workers=2, consistency=consistency, latency=0.25)
    assert s["completed"] == len(wl)
    if consistency == "none":
        assert s["records"] == 0 and s["replay"] == {}
    elif consistency == "delayed":
        assert s["event_lag"]["mean"] == pytest.approx(0.25)
    elif consistency == "immediate":
        assert s["event_lag"]["max"] == 0.0
    assert 0.0 <= s["estimated_hit_rate"] <= 1.0


def test_a_small_cache_hits_less_and_evicts() -> None:
    wl = small_gsp()
    big = run(wl, policy="longest_prefix", workers=2)
    small = run(wl, policy="longest_prefix", workers=2, capacity=2_000)
    assert small["hit_rate"] < big["hit_rate"]
    assert small["replay"]["applied"] > big["replay"]["applied"]  # removals were replayed too


def test_scaling_and_imbalance_in_a_sweep() -> None:
    wl = small_gsp(num_groups=16, prompts_per_group=8)
    cells = grid(
        SimConfig(),
        workers=[1, 4],
        policies=["default", "round_robin"],
        capacities=[None],
        consistencies=["idle"],
    )
    assert [(c.workers, c.policy) for c in cells] == [
        (1, "default"),
        (4, "default"),
        (4, "round_robin"),
    ]
    toks = [r.tokens for r in wl]
    summaries, runs = run_cells(
        toks, list(wl.arrivals), list(wl.output_lens), cells, optimal=wl.optimal_hit_rate()
    )
    assert len(runs) == 3
    four = [s for s in summaries if s["workers_count"] == 4]
    assert all(s["scaling"] > 1.5 for s in four)
    assert all(s["imbalance"] >= 1.0 for s in four)
    # jobs > 1 gives exactly the same results, in the same order.
    again, _ = run_cells(
        toks, list(wl.arrivals), list(wl.output_lens), cells, optimal=wl.optimal_hit_rate(), jobs=2
    )
    assert [without_timing(s) for s in again] == [without_timing(s) for s in summaries]


def test_batch_prefill_time_charges_new_tokens_once() -> None:
    t = costs.mistral_7b_a6000_prefill
    assert batch_prefill_time(t, [512], [4096]) == pytest.approx(t(512, 4096))
    two = batch_prefill_time(t, [256, 256], [256, 1024])
    assert two == pytest.approx(t(512, 512) + t(256, 1024) - t(256, 256))
    assert batch_prefill_time(t, [], []) == 0.0


def test_batch_limits_bound_the_running_batch() -> None:
    wl = small_gsp(num_groups=2, prompts_per_group=16, output_len=20)
    config = SimConfig(workers=1, policy="round_robin", limits=BatchLimits(4, 100_000), trace=True)
    r = Simulation.from_workload(wl, config).run()
    assert max(running for _, _, _, running in r.load) <= 4
    assert {kind for kind, *_ in r.spans} >= {"prefill", "decode"}


def test_bad_configs_are_refused() -> None:
    with pytest.raises(InvalidInputError, match="consistency"):
        SimConfig(consistency="eventually")
    with pytest.raises(InvalidInputError, match="workers"):
        SimConfig(workers=0)
    with pytest.raises(InvalidInputError, match="capacity"):
        SimConfig(capacity=0)
    with pytest.raises(InvalidInputError, match="non-decreasing"):
        Simulation([np.zeros(3, np.uint32)] * 2, [1.0, 0.0], [1, 1], SimConfig())
    with pytest.raises(InvalidInputError, match="differ in length"):
        Simulation([np.zeros(3, np.uint32)], [0.0, 1.0], [1], SimConfig())


def test_the_defaults_make_a_sensible_config() -> None:
    cfg = SimConfig()
    assert cfg.policy_name == "default" and replace(cfg, workers=2).workers == 2
