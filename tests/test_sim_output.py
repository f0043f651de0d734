"""What ``radixmeta simulate --out`` and ``--trace-out`` write: strict JSON, one plot per cell.

Strict means RFC 8259: every file is read back with a parser that refuses
``NaN``, ``Infinity`` and ``-Infinity``. The runs are small generated workloads;
matplotlib is a test extra, so the plots are drawn for real.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixmeta.cli import _parser, main
from radixmeta.sim import commands, workloads
from radixmeta.sim.chrome_trace import run_name, write_trace
from radixmeta.sim.engine import SimConfig, Simulation
from radixmeta.sim.metrics import summarise
from radixmeta.sim.plots import cell_slug, figures, write_plots
from radixmeta.sim.results import ResultsFile, RunRecord, dumps, strict
from radixmeta.sim.sweep import grid, run_cells

pytestmark = pytest.mark.timeout(120)


def _refuse(constant: str) -> Any:
    msg = f"not strict JSON: {constant}"
    raise ValueError(msg)


def strict_load(path: Path) -> Any:
    """Parse ``path`` refusing the non-standard constants Python's json writes by default."""
    return json.loads(path.read_text(), parse_constant=_refuse)


def small(**kw: Any) -> workloads.Workload:
    params: dict[str, Any] = dict(
        num_groups=4, prompts_per_group=6, system_prompt_len=256, question_len=32, output_len=4
    )
    params.update(kw)
    return workloads.gsp(seed=5, **params)


def run_of(wl: workloads.Workload, **cfg: Any) -> Any:
    return Simulation.from_workload(wl, SimConfig(**cfg)).run()


def test_strict_turns_every_non_finite_number_into_null() -> None:
    doc = {
        "a": math.nan,
        "b": [math.inf, -math.inf, 1.5],
        "c": {"d": (np.float64("nan"), np.int64(3))},
        "e": np.array([1.0, np.nan]),
    }
    assert strict(doc) == {
        "a": None,
        "b": [None, None, 1.5],
        "c": {"d": [None, 3]},
        "e": [1.0, None],
    }
    assert json.loads(dumps(doc), parse_constant=_refuse)["c"] == {"d": [None, 3]}
    with pytest.raises(TypeError):
        dumps({"x": object()})  # nothing is silently turned into a string


def test_a_run_where_nothing_completed_is_written_as_nulls(tmp_path: Path) -> None:
    wl = small()
    run = run_of(wl, workers=2, capacity=None)
    # As if every request had been rejected: no first token, no finish.
    run.first_token = [math.nan] * len(wl)
    run.finished = [math.nan] * len(wl)
    s = summarise(run, wl.optimal_hit_rate())
    assert math.isnan(s["ttft"]["p50"]) and s["capacity"] is None
    results = ResultsFile(tmp_path / "results.json", {"name": "gsp"}, 1)
    results.add(0, s)
    doc = strict_load(tmp_path / "results.json")
    (written,) = doc["runs"]
    assert written["ttft"] == {"p50": None, "p90": None, "p99": None, "mean": None}
    assert written["latency"]["p99"] is None and written["capacity"] is None
    assert written["completed"] == 0 and doc["complete"] is False


def test_results_are_rewritten_whole_as_each_run_ends(tmp_path: Path) -> None:
    wl = small()
    cells = grid(
        SimConfig(),
        workers=[1, 2],
        policies=["default", "round_robin"],
        capacities=[2_000, None],
        consistencies=["idle"],
    )
    path = tmp_path / "out" / "results.json"
    results = ResultsFile(path, {"name": "gsp"}, len(cells))
    seen: list[int] = []

    def on_run(i: int, run: Any, s: dict[str, Any]) -> None:
        results.add(i, s)
        doc = strict_load(path)  # always a whole document, never a torn one
        seen.append(len(doc["runs"]))
        assert doc["runs_total"] == len(cells) and doc["complete"] is False

    toks = [r.tokens for r in wl]
    summaries, runs = run_cells(
        toks, list(wl.arrivals), list(wl.output_lens), cells, on_run=on_run, keep_runs=False
    )
    assert runs == [] and seen == list(range(1, len(cells) + 1))
    results.write(complete=True)
    doc = strict_load(path)
    assert doc["complete"] is True
    assert [(r["workers_count"], r["policy"], r["capacity"]) for r in doc["runs"]] == [
        (c.workers, c.policy, c.capacity) for c in cells
    ]
    assert all("scaling" in r for r in doc["runs"])
    assert not list(path.parent.glob(".*partial"))
    # Dropping the runs changes no summary.
    again, kept = run_cells(toks, list(wl.arrivals), list(wl.output_lens), cells)
    assert len(kept) == len(cells)
    strip = [{k: v for k, v in s.items() if k != "timing"} for s in summaries]
    assert strip == [{k: v for k, v in s.items() if k != "timing"} for s in again]


def test_the_results_file_exists_before_the_first_run(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    ResultsFile(path, {"name": "gsp", "metadata": {"rate": math.inf}}, 3)
    assert strict_load(path) == {
        "workload": {"name": "gsp", "metadata": {"rate": None}},
        "runs": [],
        "runs_total": 3,
        "complete": False,
    }
    # What JSON cannot hold fails here, before a sweep has spent any time.
    with pytest.raises(TypeError):
        ResultsFile(tmp_path / "bad.json", {"name": "gsp", "metadata": {"path": Path("x")}}, 3)


def test_out_alone_records_no_spans() -> None:
    args = _parser().parse_args(["simulate", "--out", "somewhere"])
    assert commands._base_config(args).trace is False


def test_the_cli_writes_strict_json_and_a_plot_per_cell(tmp_path: Path) -> None:
    rc = main(
        [
            "simulate", "--limit", "40", "--policies", "default,round_robin",
            "--workers", "1,2,3", "--capacity", "3k,inf", "--consistency", "idle,none",
            "--out", str(tmp_path),
        ]
    )  # fmt: skip
    assert rc == 0
    doc = strict_load(tmp_path / "results.json")
    assert doc["complete"] is True and doc["runs_total"] == len(doc["runs"]) == 2 + 2 * 2 * 2 * 2
    assert {r["capacity"] for r in doc["runs"]} == {3_000, None}
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    cells = {f"{w}w_{c}_{k}" for w in (2, 3) for c in ("3k", "inf") for k in ("idle", "none")} | {
        "1w_3k_idle",
        "1w_inf_idle",
    }
    expected = (
        {f"ttft_cdf_{c}.png" for c in cells}
        | {f"hit_rate_by_capacity_{w}w_{k}.png" for w in (2, 3) for k in ("idle", "none")}
        | {"hit_rate_by_capacity_1w_idle.png"}
        | {f"throughput_by_workers_{c}_{k}.png" for c in ("3k", "inf") for k in ("idle", "none")}
    )
    assert set(names) == expected
    assert not any(n.startswith("load_per_worker") for n in names)  # no trace, no load


def records_of(wl: workloads.Workload, cells: list[SimConfig]) -> list[RunRecord]:
    out: list[RunRecord] = []
    toks = [r.tokens for r in wl]
    run_cells(
        toks,
        list(wl.arrivals),
        list(wl.output_lens),
        cells,
        optimal=wl.optimal_hit_rate(),
        on_run=lambda i, run, s: out.append(RunRecord.of(run, s, keep_run=run.config.trace)),
        keep_runs=False,
    )
    return out


def test_each_plot_names_its_cell_and_the_hit_rate_plot_draws_inf() -> None:
    wl = small()
    cells = grid(
        SimConfig(),
        workers=[1, 2],
        policies=["default", "round_robin", "longest_prefix"],
        capacities=[1_500_000, 2_000, None],
        consistencies=["idle"],
    )
    cells[-1] = replace(cells[-1], trace=True)
    drawn = dict(figures(records_of(wl, cells)))
    ttft = drawn["ttft_cdf_2w_1.5m_idle"].axes[0]
    assert ttft.get_title() == "TTFT CDF, 2 workers, 1.5m tokens each, idle"
    assert [t.get_text() for t in ttft.get_legend().get_texts()] == [
        "default",
        "round_robin",
        "longest_prefix",
    ]
    hit = drawn["hit_rate_by_capacity_2w_idle"].axes[0]
    assert [t.get_text() for t in hit.get_xticklabels()] == ["2k", "1.5m", "inf"]
    inf_x = hit.get_xticks()[-1]
    hollow = [
        line
        for line in hit.get_lines()
        if line.get_fillstyle() == "none" and line.get_xdata()[0] == inf_x
    ]
    assert len(hollow) == 3  # every policy's unbounded point
    legend = [t.get_text() for t in hit.get_legend().get_texts()]
    assert legend == ["default", "round_robin", "longest_prefix", "H*"]
    tput = drawn["throughput_by_workers_2k_idle"].axes[0]
    assert tput.get_title() == "throughput by fleet size, 2k tokens a worker, idle"
    assert (
        drawn["throughput_by_workers_inf_idle"]
        .axes[0]
        .get_title()
        .endswith("unbounded caches, idle")
    )
    traced = cells[-1]
    key = f"load_per_worker_{traced.policy}_{traced.workers}w_inf_idle"
    assert set(drawn) >= {key}
    assert sum(name.startswith("load_per_worker") for name in drawn) == 1


def test_a_tag_keeps_two_calls_apart(tmp_path: Path) -> None:
    wl = small()
    cells = grid(
        SimConfig(), workers=[2], policies=["default"], capacities=[None], consistencies=["idle"]
    )
    records = records_of(wl, cells)
    a = write_plots(tmp_path, records, tag="batch")
    b = write_plots(tmp_path, records, tag="poisson12")
    assert [p.name for p in a] == ["batch_ttft_cdf_2w_inf_idle.png"]
    assert [p.name for p in b] == ["poisson12_ttft_cdf_2w_inf_idle.png"]
    assert all(p.stat().st_size > 0 for p in a + b)


def test_cell_slugs_carry_the_load_where_a_sweep_sets_one() -> None:
    s = {"workers_count": 4, "capacity": 200_000, "consistency": "none", "load": 0.8}
    assert cell_slug(s) == "4w_200k_none_load0.8"
    assert cell_slug({**s, "load": None}) == "4w_200k_none"


def test_the_chrome_trace_names_its_run_and_policy(tmp_path: Path) -> None:
    wl = small()
    run = run_of(wl, workers=2, capacity=1_000_000, policy="round_robin", trace=True)
    path = tmp_path / "trace.json"
    write_trace(path, run, "gsp")
    doc = strict_load(path)
    meta = {e["name"]: e["args"] for e in doc["traceEvents"] if e["ph"] == "M" and "tid" not in e}
    assert meta["process_name"]["name"] == "gsp: round_robin, 2 workers, 1m tokens each, idle"
    assert meta["process_labels"]["labels"] == "round_robin"
    assert run_name(run, "gsp") == meta["process_name"]["name"]
    other = doc["otherData"]
    assert (other["policy"], other["workers"], other["capacity"], other["workload"]) == (
        "round_robin",
        2,
        "1m",
        "gsp",
    )
    threads = [e["args"]["name"] for e in doc["traceEvents"] if e["name"] == "thread_name"]
    assert threads == ["w0", "w1", "router"]
    assert {e["name"] for e in doc["traceEvents"] if e["ph"] == "X"} >= {"prefill", "decode"}


def test_trace_out_traces_only_the_run_it_writes(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    rc = main(
        [
            "simulate", "--limit", "30", "--policies", "default,round_robin", "--workers", "1,2",
            "--out", str(tmp_path / "out"), "--trace-out", str(trace),
        ]
    )  # fmt: skip
    assert rc == 0
    doc = strict_load(trace)
    assert doc["otherData"]["workers"] == 2 and doc["otherData"]["policy"] == "default"
    names = [p.name for p in (tmp_path / "out").glob("load_per_worker_*.png")]
    assert names == ["load_per_worker_default_2w_198516_idle.png"]
