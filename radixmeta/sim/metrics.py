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


def _with_mean(values: np.ndarray) -> dict[str, float]:
    """The percentiles and the mean (``nan`` for no values)."""
    out = _percentiles(values)
    out["mean"] = float(values.mean()) if values.size else float("nan")
    return out


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
        ``hit_rate`` (tokens the workers' caches matched over the prompt tokens
        of the requests not rejected), ``estimated_hit_rate`` (what the router
        expected at dispatch, over the same tokens), ``estimate_error`` (the
        estimate less the hit rate), ``optimal_hit_rate``,
        ``requests``, ``completed`` (requests that finished: never the rejected),
        ``rejected`` (longer than the context or the pool), ``retracted``
        (retractions), ``requeued`` (requests put back on a queue by them),
        ``admission_refused`` (steps where a queue's head did not fit),
        ``insert_refused`` (prompts the cache could not take: 0 with the KV pool),
        ``queue_wait`` percentiles (s, arrival to the admission of a request's
        last prefill), ``kv_peak`` (the highest share of a worker's pool that
        requests held; ``None`` unbounded), ``capacity`` and ``context_len`` (as
        resolved), ``makespan`` (s),
        ``throughput_rps``, ``throughput_tps`` (prompt and output tokens per
        second), ``ttft`` (its percentiles and ``mean``) and ``latency``
        percentiles (s), ``imbalance`` (max over
        mean of the workers' prefill busy time), ``workers`` (per worker),
        ``event_lag`` (mean, max and p99 over records of the seconds from a
        record's step to its replay),
        ``replay`` (the Replayer's counters) and ``timing`` (real wall seconds:
        dispatch, replay and the workers' cache calls; the router's overhead per
        request and as a share of the simulated prefill time).
    """
    cfg = run.config
    arrival = np.asarray(run.arrival, dtype=np.float64)
    first = np.asarray(run.first_token, dtype=np.float64)
    admitted = np.asarray(run.admitted, dtype=np.float64)
    finished = np.asarray(run.finished, dtype=np.float64)
    prompt = np.asarray(run.prompt_len, dtype=np.int64)
    output = np.asarray(run.output_len, dtype=np.int64)
    hits = np.asarray(run.hits, dtype=np.int64)
    estimated = np.asarray(run.estimated, dtype=np.int64)
    chosen = np.asarray(run.worker, dtype=np.int64)
    rejected = np.zeros(len(run.arrival), dtype=bool)
    if run.rejected:
        rejected = np.asarray(run.rejected, dtype=bool)
    done = ~np.isnan(finished)  # a rejected request never finishes
    served = ~rejected
    total_prompt = int(prompt[served].sum())  # what was computed or hit: not the rejected
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
                **_worker_counters(run, i),
            }
        )
    wall = dict(run.timing)
    router_wall = wall.get("dispatch", 0.0) + wall.get("replay", 0.0)
    total_prefill = float(prefill_busy.sum())
    wall["router_us_per_request"] = router_wall / n * 1e6 if n else 0.0
    wall["router_share_of_prefill"] = router_wall / total_prefill if total_prefill else 0.0
    hit_rate = float(hits.sum() / total_prompt) if total_prompt else 0.0
    estimate = float(estimated[served].sum() / total_prompt) if total_prompt else 0.0
    return {
        "policy": cfg.policy_name,
        "workers_count": cfg.workers,
        "consistency": cfg.consistency,
        "capacity": run.capacity if cfg.capacity == "model" else cfg.capacity,
        "context_len": run.context_len,
        "page_size": cfg.page_size,
        "requests": n,
        "completed": int(done.sum()),
        "rejected": int(rejected.sum()),
        "retracted": int(sum(run.retracted)),
        "requeued": int(sum(run.requeued)),
        "admission_refused": int(sum(run.admission_refused)),
        "insert_refused": int(sum(run.insert_refused)),
        "queue_wait": _percentiles(admitted[done] - arrival[done]),
        "kv_peak": max((p for p in run.kv_peak if p is not None), default=None),
        "hit_rate": hit_rate,
        "estimated_hit_rate": estimate,
        "estimate_error": estimate - hit_rate,
        "optimal_hit_rate": optimal,
        "makespan": makespan,
        "throughput_rps": float(done.sum() / makespan) if makespan > 0 else 0.0,
        "throughput_tps": (
            float((prompt[done].sum() + output[done].sum()) / makespan) if makespan > 0 else 0.0
        ),
        "ttft": _with_mean(first[done] - arrival[done]),  # the rejected never start
        "latency": _percentiles(finished[done] - arrival[done]),
        "imbalance": float(prefill_busy.max() / mean_busy) if mean_busy > 0 else 1.0,
        "workers": workers,
        "records": run.records,
        "removed_records": run.removed,
        "event_lag": {
            "mean": run.lag_sum / run.records if run.records else 0.0,
            "max": run.lag_max,
            "p99": _weighted_p99(run.lags),
        },
        "replay": run.replay_stats,
        "timing": wall,
    }


def _worker_counters(run: SimRun, i: int) -> dict[str, Any]:
    """Worker ``i``'s memory counters (absent from a run recorded without them)."""

    def at(values: list[Any], default: Any = 0) -> Any:
        return values[i] if i < len(values) else default

    return {
        "rejected": int(at(run.worker_rejected)),
        "retracted": int(at(run.retracted)),
        "requeued": int(at(run.requeued)),
        "admission_refused": int(at(run.admission_refused)),
        "kv_peak": at(run.kv_peak, None),
    }


def _weighted_p99(lags: list[tuple[float, int]]) -> float:
    """The 99th percentile of the lag over records (each apply weighs its record count)."""
    if not lags:
        return 0.0
    values = np.fromiter((lag for lag, _ in lags), np.float64, len(lags))
    weights = np.fromiter((count for _, count in lags), np.float64, len(lags))
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(weights[order])
    k = int(np.searchsorted(cumulative, 0.99 * cumulative[-1]))
    return float(values[order][min(k, len(values) - 1)])


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
