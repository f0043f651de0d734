"""Reports of simulated runs: a terminal table, a JSON file, PNG plots and a Chrome trace.

The table uses rich; the plots need matplotlib (``pip install 'radixmeta[plots]'``),
and without it :func:`write_plots` says so and writes none. The Chrome trace is
the JSON array format that Perfetto (https://ui.perfetto.dev) and
``chrome://tracing`` open: one track per worker with its prefill and decode
steps and one for the router's replays, in simulated microseconds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radixmeta.sim.engine import SimRun

__all__ = ["comparison_table", "print_table", "write_json", "write_plots", "write_trace"]


def _pct(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.1%}"


def _num(x: float, unit: str = "") -> str:
    if math.isnan(x):
        return "-"
    if x >= 100:
        return f"{x:,.0f}{unit}"
    return f"{x:.3g}{unit}"


def _capacity(c: int | None) -> str:
    if c is None:
        return "inf"
    return f"{c // 1000}k" if c % 1000 == 0 else f"{c:,}"


def comparison_table(summaries: Sequence[dict[str, Any]], title: str = "") -> Any:
    """A rich ``Table`` with one row per run."""
    from rich.table import Table

    table = Table(title=title or None, header_style="bold")
    for name, justify in (
        ("policy", "left"),
        ("workers", "right"),
        ("capacity", "right"),
        ("consistency", "left"),
        ("hit rate", "right"),
        ("H*", "right"),
        ("router est.", "right"),
        ("req/s", "right"),
        ("TTFT p50", "right"),
        ("TTFT p99", "right"),
        ("imbalance", "right"),
        ("scaling", "right"),
        ("router us/req", "right"),
    ):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in summaries:
        scale = s.get("scaling")
        table.add_row(
            str(s["policy"]),
            str(s["workers_count"]),
            _capacity(s["capacity"]),
            s["consistency"],
            _pct(s["hit_rate"]),
            _pct(s["optimal_hit_rate"]),
            _pct(s["estimated_hit_rate"]),
            _num(s["throughput_rps"]),
            _num(s["ttft"]["p50"], " s"),
            _num(s["ttft"]["p99"], " s"),
            f"{s['imbalance']:.2f}",
            "-" if scale is None else f"{scale:.2f}x",
            f"{s['timing']['router_us_per_request']:.1f}",
        )
    return table


def print_table(summaries: Sequence[dict[str, Any]], title: str = "", console: Any = None) -> None:
    """Print :func:`comparison_table` to ``console`` (a rich Console; stdout by default)."""
    from rich.console import Console

    (console or Console()).print(comparison_table(summaries, title))


def write_json(path: Path, workload: dict[str, Any], summaries: Sequence[dict[str, Any]]) -> None:
    """Write the workload's description and every run's summary to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"workload": workload, "runs": list(summaries)}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(x: Any) -> Any:
    if hasattr(x, "item"):  # numpy scalars
        return x.item()
    return str(x)


def write_trace(path: Path, run: SimRun) -> None:
    """Write ``run``'s spans as a Chrome trace (needs ``SimConfig(trace=True)``)."""
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": 1, "args": {"name": "simulated fleet"}},
    ]
    for i, name in enumerate(run.worker_names):
        events.append(
            {"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": name}}
        )
    router_tid = len(run.worker_names)
    events.append(
        {"name": "thread_name", "ph": "M", "pid": 1, "tid": router_tid, "args": {"name": "router"}}
    )
    for kind, w, start, dur in run.spans:
        tid = router_tid if kind == "replay" else w
        events.append(
            {"name": kind, "ph": "X", "pid": 1, "tid": tid, "ts": start * 1e6, "dur": dur * 1e6}
        )
    for t, w, waiting, running in run.load:
        events.append(
            {
                "name": f"{run.worker_names[w]} load",
                "ph": "C",
                "pid": 1,
                "ts": t * 1e6,
                "args": {"waiting": waiting, "running": running},
            }
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"traceEvents": events, "displayTimeUnit": "ms"}))


def write_plots(
    out: Path, summaries: Sequence[dict[str, Any]], runs: Sequence[SimRun] = ()
) -> list[Path]:
    """PNG plots under ``out``; returns the files written (none without matplotlib).

    Hit rate against per-worker capacity per policy, TTFT CDF per policy (largest
    fleet, largest capacity), throughput against worker count per policy, and per
    worker load over time for runs that recorded it.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    policies = sorted({s["policy"] for s in summaries})

    def save(fig: Any, name: str) -> None:
        path = out / name
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    caps = sorted({s["capacity"] for s in summaries if s["capacity"] is not None})
    if caps:
        fig, ax = plt.subplots(figsize=(6, 4))
        top = max(s["workers_count"] for s in summaries)
        for p in policies:
            pts = sorted(
                (s["capacity"], s["hit_rate"])
                for s in summaries
                if s["policy"] == p and s["capacity"] is not None and s["workers_count"] == top
            )
            if pts:
                ax.plot([c for c, _ in pts], [h for _, h in pts], marker="o", label=p)
        optimal = next((s["optimal_hit_rate"] for s in summaries if s["optimal_hit_rate"]), None)
        if optimal:
            ax.axhline(optimal, color="grey", linestyle="--", label="H*")
        ax.set_xscale("log")
        ax.set_xlabel("cache capacity per worker (tokens)")
        ax.set_ylabel("hit rate")
        ax.set_title(f"hit rate by capacity, {top} workers")
        ax.legend(fontsize=8)
        save(fig, "hit_rate_vs_capacity.png")

    worker_counts = sorted({s["workers_count"] for s in summaries})
    if len(worker_counts) > 1:
        fig, ax = plt.subplots(figsize=(6, 4))
        for p in policies:
            pts = sorted(
                (s["workers_count"], s["throughput_rps"])
                for s in summaries
                if s["policy"] == p and s["capacity"] == summaries[0]["capacity"]
            )
            ax.plot([w for w, _ in pts], [t for _, t in pts], marker="o", label=p)
        ax.set_xlabel("workers")
        ax.set_ylabel("requests / s")
        ax.set_title("throughput by fleet size")
        ax.legend(fontsize=8)
        save(fig, "throughput_vs_workers.png")

    if runs:
        import numpy as np

        fig, ax = plt.subplots(figsize=(6, 4))
        for run in runs:
            arrival = np.asarray(run.arrival)
            first = np.asarray(run.first_token)
            ttft = np.sort((first - arrival)[~np.isnan(first)])
            if ttft.size:
                ax.plot(ttft, np.arange(1, ttft.size + 1) / ttft.size, label=run.config.policy_name)
        ax.set_xlabel("time to first token (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("TTFT CDF")
        ax.legend(fontsize=8)
        save(fig, "ttft_cdf.png")
        for run in runs:
            if not run.load:
                continue
            fig, ax = plt.subplots(figsize=(7, 4))
            for i, name in enumerate(run.worker_names):
                pts = [(t, wq + rn) for t, w, wq, rn in run.load if w == i]
                ax.step([t for t, _ in pts], [v for _, v in pts], where="post", label=name)
            ax.set_xlabel("simulated time (s)")
            ax.set_ylabel("requests waiting or running")
            ax.set_title(f"load per worker, {run.config.policy_name}")
            ax.legend(fontsize=8)
            save(fig, f"load_{run.config.policy_name}.png")
    return written
