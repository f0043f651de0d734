"""``radixmeta reproduce traces``: does ``default`` win on real traces?

The grid of issue 17: each workload (trace files, synthetic traces, and on
request ``gsp``, ``mmlu`` and ``sharegpt``) at its own times, with same-instant
arrivals spread 1 ms apart (``spread``: arrivals that are not batched), and
re-timed to offered loads (``--load``'s calibration); 4, 8 and 16 workers; the
cost model's pool, half of it and four times it; exact (``idle``) and
approximate (``none``) consistency; the nine built-in policies in every cell.

In each cell ``default`` is checked against the best of all nine:

============  ===================================================================
target        met when
============  ===================================================================
mean TTFT     ``default``'s is at most 3 % above the lowest
p99 TTFT      the same, for the 99th percentile
throughput    ``default``'s requests/s is at least 98 % of the highest
imbalance     ``default``'s prefill imbalance (max / mean busy time) is <= 1.3
estimate      at offered load <= 0.8: the router's estimated hit rate is within
              5 points of ``default``'s real one (n/a above)
============  ===================================================================

The targets apply at offered load <= 0.95: a cell whose own times offer more
(by the same calibration, :func:`radixmeta.sim.load.offered_work`) is listed
as skipped, not run. Workloads that arrive all at once (``gsp``, ``mmlu``)
have no own times: they run at the loads only.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from radixmeta.errors import DataNotFoundError, InvalidInputError
from radixmeta.policies import names as policy_names
from radixmeta.sim.engine import SimConfig
from radixmeta.sim.load import offered_work, scale_to_load
from radixmeta.sim.report import table_lines
from radixmeta.sim.results import dumps
from radixmeta.sim.sweep import run_cells

__all__ = [
    "CELL_COLUMNS",
    "LOAD_LIMIT",
    "TARGETS",
    "Cell",
    "Result",
    "cell_rows",
    "load_rivals",
    "met_rows",
    "run_grid",
    "spread_arrivals",
    "verdict",
    "write_results",
]

#: Cells above this offered load are outside the targets (and are not run).
LOAD_LIMIT = 0.95
#: The router's estimate is held to 5 points at loads up to this.
ESTIMATE_LOAD = 0.8
#: (name, what it measures) of every target, in the met table's order.
TARGETS = (
    ("mean", "mean TTFT <= 1.03 x the lowest"),
    ("p99", "p99 TTFT <= 1.03 x the lowest"),
    ("tput", "throughput >= 0.98 x the highest"),
    ("imb", "prefill imbalance <= 1.3"),
    ("est", "router estimate within 5 pt of the hit rate (load <= 0.8)"),
)
SPREAD_SECONDS = 0.001


@dataclass(frozen=True)
class Cell:
    """One cell of the grid: a workload at one timing, fleet, pool and consistency."""

    workload: str
    timing: str  # "own", "spread", or a load like "0.8"
    workers: int
    capacity: str  # "0.5x", "1x", "4x"
    consistency: str

    @property
    def label(self) -> str:
        """A short name for tables: ``trace own 8w 1x idle``."""
        timing = self.timing if self.timing in ("own", "spread") else f"@{self.timing}"
        return f"{self.workload} {timing} {self.workers}w {self.capacity} {self.consistency}"


@dataclass
class Result:
    """A cell's outcome: its offered load, every policy's summary, and the verdict."""

    cell: Cell
    load: float
    summaries: dict[str, dict[str, Any]] = field(default_factory=dict)
    verdict: dict[str, bool | None] = field(default_factory=dict)
    skipped: str | None = None


def spread_arrivals(arrivals: Sequence[float], gap: float = SPREAD_SECONDS) -> list[float]:
    """Requests that arrive at one instant, ``gap`` seconds apart in their order.

    The ``k``-th request of an instant arrives ``k * gap`` later; one that would then
    arrive with or before the request before it comes ``gap`` after that one, so no
    two requests share an instant and the order is kept.

    >>> spread_arrivals([0.0, 0.0, 0.0, 2.0, 2.0])
    [0.0, 0.001, 0.002, 2.0, 2.001]
    """
    out: list[float] = []
    last = math.nan
    k = 0
    for at in arrivals:
        k = k + 1 if at == last else 0
        last = at
        moved = at + k * gap
        if out and moved <= out[-1]:
            moved = out[-1] + gap
        out.append(moved)
    return out


def _mean_ttft(summary: dict[str, Any]) -> float:
    return float(summary["ttft"]["mean"])


def verdict(summaries: dict[str, dict[str, Any]], load: float) -> dict[str, bool | None]:
    """Whether ``default`` meets each target in one cell (``None``: does not apply).

    Parameters
    ----------
    summaries : dict
        Policy name to its run's summary (:func:`~radixmeta.sim.metrics.summarise`);
        must include ``"default"``.
    load : float
        The cell's offered load.
    """
    d = summaries["default"]
    best_mean = min(_mean_ttft(s) for s in summaries.values())
    best_p99 = min(s["ttft"]["p99"] for s in summaries.values())
    best_tput = max(s["throughput_rps"] for s in summaries.values())
    error = abs(d["estimated_hit_rate"] - d["hit_rate"])
    return {
        "mean": _mean_ttft(d) <= 1.03 * best_mean,
        "p99": d["ttft"]["p99"] <= 1.03 * best_p99,
        "tput": d["throughput_rps"] >= 0.98 * best_tput,
        "imb": d["imbalance"] <= 1.3,
        "est": error <= 0.05 if load <= ESTIMATE_LOAD else None,
    }


def _capacity_tokens(text: str, model_tokens: int) -> int:
    if not text.endswith("x"):
        msg = f"capacity {text!r}: the grid's capacities are multiples of the pool, like 0.5x"
        raise InvalidInputError(msg)
    try:
        times = float(text[:-1])
    except ValueError:
        times = math.nan
    if not (math.isfinite(times) and times > 0):
        msg = f"capacity {text!r}: a multiple of the model's pool is a number > 0, like 0.5x"
        raise InvalidInputError(msg)
    return max(1, round(model_tokens * times))


def run_grid(
    workloads: Sequence[tuple[str, Any]],
    *,
    timings: Sequence[str],
    workers: Sequence[int],
    capacities: Sequence[str],
    consistencies: Sequence[str],
    policies: Sequence[str] | None = None,
    base: SimConfig | None = None,
    jobs: int = 1,
    on_result: Callable[[Result], None] | None = None,
    rivals: dict[tuple[str, str, int, str, str], dict[str, dict[str, Any]]] | None = None,
) -> list[Result]:
    """Run the grid; ``on_result`` hears of each cell as it is done.

    Parameters
    ----------
    workloads : sequence of (label, Workload)
        What to run; a workload whose arrivals all share one instant has no own
        times (``own`` and ``spread`` are skipped for it).
    timings : sequence of str
        ``"own"``, ``"spread"`` and loads (``"0.5"``...).
    workers, capacities, consistencies : sequence
        The fleet sizes, the pools as multiples of the cost model's (``"0.5x"``), and
        the consistencies.
    policies : sequence of str, optional
        The policies of every cell (default: all nine); must include ``default``.
    base : SimConfig, optional
        Everything else about a run (cost model, batch bounds, seed...).
    jobs : int
        Processes for the runs of a cell group.
    rivals : dict, optional
        Summaries of earlier runs by cell key ``(workload, timing, workers, capacity,
        consistency)`` and policy (:func:`load_rivals`): every policy but ``default``
        found there for a cell is taken as it is instead of run again.
    """
    chosen = list(policy_names() if policies is None else policies)
    if "default" not in chosen:
        msg = "the grid compares default with its rivals: --policies must include default"
        raise InvalidInputError(msg)
    base = base or SimConfig()
    model = base.cost_model
    if model is None:
        msg = "reproduce traces needs a cost model (its pool sets the capacities)"
        raise InvalidInputError(msg)
    results: list[Result] = []
    for label, workload in workloads:
        tokens = [r.tokens for r in workload]
        outputs = [int(x) for x in workload.output_lens]
        arrivals = [float(a) for a in workload.arrivals]
        span = arrivals[-1] - arrivals[0] if arrivals else 0.0
        optimal = workload.optimal_hit_rate(base.page_size)
        for timing in timings:
            for count in workers:
                for text in capacities:
                    capacity = _capacity_tokens(text, model.kv_tokens)
                    fleet = replace(base, workers=count, capacity=capacity)
                    cells = [Cell(label, timing, count, text, c) for c in consistencies]
                    if timing in ("own", "spread"):
                        if span <= 0:
                            for cell in cells:
                                result = Result(cell, math.inf, skipped="arrives all at once")
                                results.append(result)
                                if on_result is not None:
                                    on_result(result)
                            continue
                        work = float(offered_work(tokens, outputs, fleet).sum())
                        load = work / (count * span)
                        times = spread_arrivals(arrivals) if timing == "spread" else arrivals
                    else:
                        load = float(timing)
                        times, _ = scale_to_load(tokens, arrivals, outputs, fleet, load)
                    if load > LOAD_LIMIT:
                        for cell in cells:
                            result = Result(cell, load, skipped=f"offered load {load:.2f}")
                            results.append(result)
                            if on_result is not None:
                                on_result(result)
                        continue
                    known = [
                        {} if rivals is None else rivals.get(_key(cell), {}) for cell in cells
                    ]
                    configs = [
                        replace(fleet, policy=p, consistency=cell.consistency)
                        for cell, have in zip(cells, known, strict=True)
                        for p in chosen
                        if p == "default" or p not in have
                    ]
                    summaries, _ = run_cells(
                        tokens, times, outputs, configs, optimal=optimal, jobs=jobs
                    )
                    ran = iter(summaries)
                    for cell, have in zip(cells, known, strict=True):
                        by_policy = {}
                        for p in chosen:
                            if p != "default" and p in have:
                                by_policy[p] = have[p]
                            else:
                                fresh = next(ran)
                                fresh["load"] = {"load": load, "timing": timing}
                                by_policy[p] = fresh
                        result = Result(cell, load, by_policy, verdict(by_policy, load))
                        results.append(result)
                        if on_result is not None:
                            on_result(result)
    return results


def _key(cell: Cell) -> tuple[str, str, int, str, str]:
    return (cell.workload, cell.timing, cell.workers, cell.capacity, cell.consistency)


def load_rivals(
    path: str | os.PathLike[str],
    workloads: Sequence[dict[str, Any]] = (),
    run: dict[str, Any] | None = None,
) -> dict[tuple[str, str, int, str, str], dict[str, dict[str, Any]]]:
    """The summaries of a ``traces.json`` by cell, for ``run_grid(rivals=...)``.

    ``workloads`` and ``run`` (as :func:`write_results` takes them) must agree with
    the file's where the file has them: a workload of the same label with another
    digest, or other run settings, would be another experiment.

    Raises
    ------
    DataNotFoundError
        The file does not exist or is not a traces file.
    InvalidInputError
        The file's workloads or settings differ.
    """
    file = Path(path)
    try:
        doc = json.loads(file.read_text())
        cells = doc["cells"] if doc.get("experiment") == "traces" else None
    except (OSError, ValueError, AttributeError) as exc:
        msg = f"--rivals-from {file}: not a readable traces.json ({exc})"
        raise DataNotFoundError(msg) from None
    if cells is None:
        msg = f"--rivals-from {file}: not a traces.json of reproduce traces"
        raise DataNotFoundError(msg)
    theirs = {w.get("label"): w.get("digest") for w in doc.get("workloads", [])}
    for w in workloads:
        other = theirs.get(w["label"])
        if other is not None and other != w.get("digest"):
            msg = f"--rivals-from {file}: its {w['label']} is another workload (digest differs)"
            raise InvalidInputError(msg)
    for name, value in (run or {}).items():
        if name in doc.get("run", {}) and doc["run"][name] != value:
            msg = f"--rivals-from {file}: it ran with {name}={doc['run'][name]!r}, not {value!r}"
            raise InvalidInputError(msg)
    return {
        (c["workload"], c["timing"], c["workers"], c["capacity"], c["consistency"]): c[
            "summaries"
        ]
        for c in cells
        if not c.get("skipped")
    }


#: The columns of a cell's table (:mod:`radixmeta.sim.report`'s keys): <= 80 wide.
CELL_COLUMNS = "policy,ttft_mean,ttft_p99,hit_rate,est_error,imbalance,rps"


def cell_rows(result: Result, fmt: str = "plain") -> list[str]:
    """A cell's table: ``default`` first, then its rivals by mean TTFT.

    Plain text (the report's aligned columns, within 80) or Markdown (``fmt``).
    """
    cell = result.cell
    head = f"{cell.label}  (offered load {result.load:.2f})"
    if result.skipped:
        return [f"{head}: skipped, {result.skipped}"]
    rivals = sorted(
        (p for p in result.summaries if p != "default"),
        key=lambda p: _mean_ttft(result.summaries[p]),
    )
    rows = [result.summaries[p] for p in ("default", *rivals)]
    return [head, *table_lines(rows, CELL_COLUMNS, fmt)]


def met_rows(results: Sequence[Result], fmt: str = "plain") -> list[str]:
    """The met/not-met table: a row per cell, a column per target, and a tally.

    Plain text (within 80 columns) or Markdown (``fmt``).
    """
    marks = {True: "yes", False: "NO", None: "n/a"}
    header = ["cell", "load", *(name for name, _ in TARGETS)]
    rows: list[list[str]] = []
    met = ran = 0
    for r in results:
        if r.skipped:
            rows.append([r.cell.label, f"{r.load:.2f}", f"skipped: {r.skipped}"])
            continue
        ran += 1
        met += all(v is not False for v in r.verdict.values())
        rows.append([r.cell.label, f"{r.load:.2f}", *(marks[r.verdict[n]] for n, _ in TARGETS)])
    tally = f"default met every target in {met} of {ran} cells run"
    if fmt == "markdown":
        lines = ["| " + " | ".join(header) + " |", "|:---|" + "---:|" * (len(header) - 1)]
        for row in rows:
            lines.append("| " + " | ".join(row + [""] * (len(header) - len(row))) + " |")
        return [*lines, "", tally]
    width = max([len(header[0]), *(len(row[0]) for row in rows)])
    lines = [f"{header[0]:{width}}  " + "  ".join(f"{h:>4}" for h in header[1:])]
    for label, load, *cols in rows:
        lines.append(f"{label:{width}}  {load:>4}  " + "  ".join(f"{c:>4}" for c in cols))
    return [*lines, tally]


def write_results(
    path: str | os.PathLike[str],
    workloads: list[dict[str, Any]],
    results: Sequence[Result],
    run: dict[str, Any] | None = None,
) -> Path:
    """Write every cell (its summaries and verdict) as strict JSON.

    ``workloads`` describes what ran (label, digest, counts), ``run`` the settings
    every cell shares; :func:`load_rivals` checks both before reusing a summary.
    """
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "experiment": "traces",
        "targets": dict(TARGETS),
        "load_limit": LOAD_LIMIT,
        "run": run or {},
        "workloads": workloads,
        "cells": [
            {
                "workload": r.cell.workload,
                "timing": r.cell.timing,
                "workers": r.cell.workers,
                "capacity": r.cell.capacity,
                "consistency": r.cell.consistency,
                "load": r.load,
                "skipped": r.skipped,
                "verdict": r.verdict,
                "met": None if r.skipped else all(v is not False for v in r.verdict.values()),
                "summaries": r.summaries,
            }
            for r in results
        ],
    }
    partial = file.with_name(f".{file.name}.partial")
    partial.write_text(dumps(doc) + "\n")
    os.replace(partial, file)
    return file
