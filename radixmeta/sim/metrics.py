"""From one simulated run to the numbers a report shows.

Everything here is computed from the simulated record alone, except the
``router_*`` figures, which come from the real wall time of the router's calls
and therefore change from run to run; :func:`summarise` keeps them under
``timing`` so a determinism check can leave them out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from radixmeta.sim.engine import SimRun

__all__ = ["PERCENTILES", "summarise", "scaling"]

PERCENTILES = (50, 90, 99)


def _percentiles(values: np.ndarray) -> dict[str, float]:
    if values.size == 0:
        return {f"p{p}": float("nan") for p in PERCENTILES}
    return {f"p{p}": float(np.percentile(values, p)) for p in PERCENTILES}


def summarise(run: SimRun, optimal: float | None = None) -> dict[str, Any]:
    """The summary of one run as plain JSON-ready values.

    Parameters
    ----------
    run : SimRun
        What :meth:`~radixmeta.sim.engine.Simulation.run` recorded.
    optimal : float, optional
        The workload's optimal hit rate H*, shown beside the hit rates.

    Returns
    -------
    dict
        ``hit_rate`` (tokens the workers' caches matched over prompt tokens),
        ``estimated_hit_rate`` (what the router expected at dispatch),
        ``optimal_hit_rate``, ``requests``, ``completed``, ``makespan`` (s),
        ``throughput_rps``, ``throughput_tps`` (prompt and output tokens per
        second), ``ttft`` and ``latency`` percentiles (s), ``imbalance`` (max over
        mean of the workers' prefill busy time), ``insert_refused`` (prompts
        that could not be cached beside the locked pages, over all workers),
        ``workers`` (per worker),
        ``event_lag`` (mean and max seconds from a record's step to its replay),
        ``replay`` (the Replayer's counters) and ``timing`` (real wall seconds:
        dispatch, replay and the workers' cache calls; the router's overhead per
        request and as a share of the simulated prefill time).
    """
    cfg = run.config
    arrival = np.asarray(run.arrival, dtype=np.float64)
    first = np.asarray(run.first_token, dtype=np.float64)
    finished = np.asarray(run.finished, dtype=np.float64)
    prompt = np.asarray(run.prompt_len, dtype=np.int64)
    output = np.asarray(run.output_len, dtype=np.int64)
    hits = np.asarray(run.hits, dtype=np.int64)
    estimated = np.asarray(run.estimated, dtype=np.int64)
    chosen = np.asarray(run.worker, dtype=np.int64)
    done = ~np.isnan(finished)
    total_prompt = int(prompt.sum())
    n = len(run.arrival)
    makespan = float(finished[done].max() - arrival.min()) if done.any() else 0.0
    prefill_busy = np.asarray(run.prefill_busy, dtype=np.float64)
    mean_busy = float(prefill_busy.mean()) if prefill_busy.size else 0.0
    workers = []
    for i, name in enumerate(run.worker_names):
        mine = chosen == i
        workers.append(
            {
                "name": name,
                "requests": int(mine.sum()),
                "prompt_tokens": int(prompt[mine].sum()),
                "hit_tokens": int(hits[mine].sum()),
                "prefill_busy": float(prefill_busy[i]),
                "decode_busy": float(run.decode_busy[i]),
                "steps": int(run.steps[i]),
                "insert_refused": int(run.insert_refused[i]),
            }
        )
    wall = dict(run.timing)
    router_wall = wall.get("dispatch", 0.0) + wall.get("replay", 0.0)
    total_prefill = float(prefill_busy.sum())
    wall["router_us_per_request"] = router_wall / n * 1e6 if n else 0.0
    wall["router_share_of_prefill"] = router_wall / total_prefill if total_prefill else 0.0
    return {
        "policy": cfg.policy_name,
        "workers_count": cfg.workers,
        "consistency": cfg.consistency,
        "capacity": cfg.capacity,
        "page_size": cfg.page_size,
        "requests": n,
        "completed": int(done.sum()),
        "hit_rate": float(hits.sum() / total_prompt) if total_prompt else 0.0,
        "estimated_hit_rate": float(estimated.sum() / total_prompt) if total_prompt else 0.0,
        "optimal_hit_rate": optimal,
        "makespan": makespan,
        "throughput_rps": float(done.sum() / makespan) if makespan > 0 else 0.0,
        "throughput_tps": (
            float((prompt[done].sum() + output[done].sum()) / makespan) if makespan > 0 else 0.0
        ),
        "ttft": _percentiles(first[done] - arrival[done]),
        "latency": _percentiles(finished[done] - arrival[done]),
        "imbalance": float(prefill_busy.max() / mean_busy) if mean_busy > 0 else 1.0,
        "insert_refused": sum(w["insert_refused"] for w in workers),
        "workers": workers,
        "records": run.records,
        "removed_records": run.removed,
        "event_lag": {
            "mean": run.lag_sum / run.records if run.records else 0.0,
            "max": run.lag_max,
        },
        "replay": run.replay_stats,
        "timing": wall,
    }


def scaling(summaries: list[dict[str, Any]]) -> None:
    """Add ``scaling`` and ``scaling_efficiency`` to summaries that have a one-worker base.

    ``scaling`` is the run's throughput over one worker's with the same per-worker
    capacity, ``scaling_efficiency`` that over the worker count (1.0 is linear).
    With one worker every policy routes alike, so the base is the one-worker run of
    the same policy when there is one, else any one-worker run of that capacity.
    """
    same: dict[tuple[Any, ...], float] = {}
    any_policy: dict[Any, float] = {}
    for s in summaries:
        if s["workers_count"] == 1:
            same[(s["policy"], s["capacity"])] = s["throughput_rps"]
            any_policy.setdefault(s["capacity"], s["throughput_rps"])
    for s in summaries:
        one = same.get((s["policy"], s["capacity"]), any_policy.get(s["capacity"]))
        if one:
            s["scaling"] = s["throughput_rps"] / one
            s["scaling_efficiency"] = s["scaling"] / s["workers_count"]
