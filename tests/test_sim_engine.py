"""The simulator's engine: real caches and a real Router on a simulated clock.

Small workloads so the module runs in seconds; the full A.4 figures are the
documented ``radixmeta reproduce a4`` run.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

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


def test_round_robin_hits_what_its_assignment_implies() -> None:
    # All at once, unbounded caches: a worker pays a group's system prompt for the
    # first of its prompts it gets and hits it for every later one, so round robin's
    # hit rate follows from where it sent each prompt. Affinity reaches H*.
    wl = small_gsp(num_groups=4, prompts_per_group=8)
    config = SimConfig(policy="round_robin", workers=4)
    r = Simulation.from_workload(wl, config).run()
    seen: dict[tuple[int, str | None], int] = {}
    for req, w in zip(wl, r.worker, strict=True):
        seen[(w, req.group)] = seen.get((w, req.group), 0) + 1
    expected = sum(c - 1 for c in seen.values()) * 512 / sum(r.prompt_len)
    rr = summarise(r, wl.optimal_hit_rate())
    assert rr["hit_rate"] == pytest.approx(expected, abs=0.005)
    affinity = run(wl, policy="longest_prefix", workers=4)
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
    # Round robin shows every group to every worker: 8 system prompts of 512 tokens do
    # not fit in 2,000, so they are evicted, replayed as removals, and missed again.
    wl = small_gsp()
    limits = BatchLimits(max_running=2)
    big = run(wl, policy="round_robin", workers=2, limits=limits)
    small = run(wl, policy="round_robin", workers=2, capacity=2_000, limits=limits)
    assert small["hit_rate"] < big["hit_rate"]
    assert big["removed_records"] == 0 < small["removed_records"]
    assert small["replay"]["applied"] == small["records"]
    assert all(w["insert_refused"] == 0 for w in small["workers"])


@pytest.mark.timeout(120)  # it starts worker processes: never hang the suite
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


def test_default_packs_a_batch_by_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from radixmeta import Router
    from radixmeta.policies import default

    # Packing is the path of a batch over the in-order budget (80 requests are under it).
    monkeypatch.setattr(default, "IN_ORDER_BUDGET", 0.0)

    router = Router(1, policy="default")
    for name in ("a", "b", "c", "d"):
        router.add_worker(name)
    rng = np.random.default_rng(0)
    prefixes = [rng.integers(0, 30_000, 400, dtype=np.uint32) for _ in range(8)]
    sizes = [40, 10, 10, 10, 10, 10, 10, 10]  # the first group is half the batch
    batch = []
    for g, (prefix, count) in enumerate(zip(prefixes, sizes, strict=True)):
        for k in range(count):
            tail = rng.integers(0, 30_000, 100, dtype=np.uint32)
            batch.append({"tokens": np.concatenate([prefix, tail]), "request_id": f"{g}-{k}"})
    decisions = router.dispatch_batch(batch)
    by_group: dict[str, set[str]] = {}
    for item, d in zip(batch, decisions, strict=True):
        by_group.setdefault(item["request_id"].split("-")[0], set()).add(d.worker.name)
        assert d.label == "batch"
    assert all(len(w) == 1 for g, w in by_group.items() if g != "0")  # small groups stay whole
    assert len(by_group["0"]) >= 2  # the group that would overload one worker is replicated
    per_worker = [sum(d.worker.name == n for d in decisions) for n in "abcd"]
    assert max(per_worker) <= 1.5 * len(batch) / 4
    router.close()


def test_the_cli_simulates_and_writes_its_files(tmp_path: Path) -> None:
    from radixmeta.cli import main

    out = tmp_path / "out"
    trace = tmp_path / "trace.json"
    rc = main(
        [
            "simulate", "--limit", "96", "--policies", "round_robin,default", "--workers", "1,2",
            "--capacity", "4k,inf", "--out", str(out), "--trace-out", str(trace),
        ]
    )  # fmt: skip
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    assert doc["workload"]["requests"] == 96
    assert {(r["policy"], r["workers_count"]) for r in doc["runs"]} >= {
        ("round_robin", 2),
        ("default", 2),
    }
    assert sorted(p.name for p in out.glob("*.png"))  # matplotlib is in the test extra
    events = json.loads(trace.read_text())["traceEvents"]
    assert {e["name"] for e in events if e["ph"] == "X"} >= {"prefill", "decode"}
    assert main(["simulate", "--policies", "nope"]) == 2
    assert main(["simulate", "--capacity", "lots"]) == 2


def test_the_routers_estimate_counts_a_batchs_own_sharing() -> None:
    # All at once through dispatch_batch: a group's later members hit the pages its first
    # member's marks hold on the same worker, and the router's estimate says so. With
    # unbounded caches it is what the workers hit; a small cache then falls short of it.
    s = run(small_gsp(), workers=2, policy="default")
    assert s["estimated_hit_rate"] == pytest.approx(s["hit_rate"], abs=0.01)
    assert s["estimated_hit_rate"] > 0.5
    tight = run(small_gsp(), workers=2, policy="default", capacity=600)
    assert tight["hit_rate"] < tight["estimated_hit_rate"] - 0.1


def test_a_policy_that_predicts_times_gets_the_runs_cost_models() -> None:
    from radixmeta.sim.engine import _policy

    config = SimConfig(prefill="llama3_1_8b_h100", decode="llama3_1_8b_h100")
    made = _policy(config, lambda: 0.0)
    assert "prefill='llama3_1_8b_h100'" in repr(made) and "decode='llama3_1_8b_h100'" in repr(made)
    assert "mistral" not in repr(_policy(replace(config, policy="preble_e2"), lambda: 0.0))


def test_the_summary_has_the_mean_ttft() -> None:
    wl = workloads.gsp(num_groups=4, prompts_per_group=4, system_prompt_len=64,
                       question_len=8, output_len=4, rate=50.0, seed=3)
    run = Simulation.from_workload(wl, SimConfig(workers=2, capacity=None)).run()
    s = summarise(run, wl.optimal_hit_rate())
    waits = np.asarray(run.first_token) - np.asarray(run.arrival)
    assert s["ttft"]["mean"] == pytest.approx(float(waits.mean()))
    assert s["ttft"]["p50"] <= s["ttft"]["p99"]
