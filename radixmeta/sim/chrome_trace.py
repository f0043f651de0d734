"""One simulated run as a Chrome trace, the JSON that Perfetto and ``chrome://tracing`` open.

The file is the trace-event format's JSON object form: ``traceEvents`` and
``otherData``, the run's description, which Perfetto shows as the trace's
metadata. Its one process is named by the run (workload, policy and cell, for
example ``trace: default, 8 workers, 1m tokens each, idle``) and labelled with
the policy; it has one track per worker with its prefill and decode steps and its
waiting and running counters, and one for the router's replays. Times are
simulated microseconds. Spans exist only for a run made with
``SimConfig(trace=True)``, which ``radixmeta simulate --trace-out`` sets for the
run it writes and for no other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radixmeta.sim.engine import SimRun
from radixmeta.sim.report import cell_label, format_capacity
from radixmeta.sim.results import dumps

__all__ = ["run_name", "write_trace"]


def _cell(run: SimRun, load: float | None) -> dict[str, Any]:
    cfg = run.config
    cell: dict[str, Any] = {
        "workers_count": cfg.workers,
        "capacity": cfg.resolved("capacity"),
        "consistency": cfg.consistency,
    }
    if load is not None:
        cell["load"] = load
    return cell


def run_name(run: SimRun, workload: str = "", load: float | None = None) -> str:
    """``workload: policy, cell``, as the trace's process is named."""
    what = f"{run.config.policy_name}, {cell_label(_cell(run, load))}"
    return f"{workload}: {what}" if workload else what


def write_trace(path: Path, run: SimRun, workload: str = "", load: float | None = None) -> None:
    """Write ``run``'s spans as a Chrome trace at ``path`` (strict JSON).

    Parameters
    ----------
    path : Path
        The file.
    run : SimRun
        A run made with ``SimConfig(trace=True)``; without it the trace has the
        names and no spans.
    workload : str
        The workload's name, for the process name and metadata.
    load : float, optional
        The run's offered load (``--load``), where the sweep set one.
    """
    cfg = run.config
    events: list[dict[str, Any]] = [
        {
            "name": "process_name",
            "ph": "M",
            "pid": 1,
            "args": {"name": run_name(run, workload, load)},
        },
        {"name": "process_labels", "ph": "M", "pid": 1, "args": {"labels": cfg.policy_name}},
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
    metadata = {
        "generator": "radixmeta simulate",
        "run": run_name(run, workload, load),
        "workload": workload,
        "policy": cfg.policy_name,
        "workers": cfg.workers,
        "capacity": format_capacity(cfg.resolved("capacity")),
        "consistency": cfg.consistency,
        "load": load,
        "page_size": cfg.page_size,
        "seed": cfg.seed,
        "time_unit": "simulated microseconds",
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        dumps({"traceEvents": events, "displayTimeUnit": "ms", "otherData": metadata}, indent=None)
    )
