"""``Router.metrics_text``: a router's metrics in the Prometheus text exposition format.

Rendered by ``prometheus_client`` (a dependency already, for ``radixmeta listen``)
from one ``Router.metrics()`` snapshot, through a registry of its own, so a router
never touches the process-wide default registry.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

__all__ = ["exposition"]

_PREFIX = "radixmeta_router_"
_LABELS = ["worker", "dp_rank"]

# Per worker: metrics() key, Prometheus name, help, counter or gauge.
_PER_WORKER = [
    ("dispatches", "dispatches", "Requests dispatched to the worker", True),
    ("hit_tokens", "hit_tokens", "Estimated cache hits: prompt tokens matched at dispatch", True),
    ("prompt_tokens", "prompt_tokens", "Prompt tokens dispatched to the worker", True),
    ("finished", "finished", "Requests finished", True),
    ("expired", "expired", "Requests expired (no finish came)", True),
    ("output_tokens", "output_tokens", "Output tokens that finish reported", True),
    ("requests", "requests_in_flight", "Requests dispatched and not finished", False),
    ("prefill_tokens", "prefill_tokens", "Uncached prompt tokens waiting for prefill", False),
    ("decode_tokens", "decode_tokens", "Prompt and expected output tokens in decode", False),
    ("held_tokens", "held_tokens", "Tokens the tree holds for the worker (events or model)", False),
    ("hold_tokens", "hold_tokens", "Tokens the router's optimistic marks hold", False),
    ("queue_length", "engine_queue_length", "Queue length the engine reported", False),
    ("kv_usage", "engine_kv_usage", "KV usage the engine reported", False),
    ("running", "engine_running", "Running requests the engine reported", False),
]


_THREAD_STATES = ("not started", "running", "backing off", "stopped", "dead")


class _Snapshot:
    """A collector over one metrics() dict and one health() dict."""

    def __init__(self, metrics: dict[str, Any], health: dict[str, Any] | None) -> None:
        self.metrics = metrics
        self.health = health

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        workers = m["workers"]
        yield _gauge("up", "Whether policies may choose the worker", workers, lambda w: w["up"])
        for key, name, text, counter in _PER_WORKER:
            family: CounterMetricFamily | GaugeMetricFamily = (
                CounterMetricFamily(_PREFIX + name, text, labels=_LABELS)
                if counter
                else GaugeMetricFamily(_PREFIX + name, text, labels=_LABELS)
            )
            for w in workers:
                if w[key] is not None:
                    family.add_metric([w["worker"], str(w["dp_rank"])], float(w[key]))
            yield family
        decisions = CounterMetricFamily(
            _PREFIX + "decisions", "Decisions by the policy's reason", labels=["reason"]
        )
        for reason, count in sorted(m["decisions"].items()):
            decisions.add_metric([reason], count)
        yield decisions
        yield GaugeMetricFamily(_PREFIX + "in_flight", "Requests in flight", value=m["in_flight"])
        replay = m["replay"]
        records = CounterMetricFamily(
            _PREFIX + "replay_records",
            "Event records the replayer handled, by outcome",
            labels=["outcome"],
        )
        for outcome, count in replay["stats"].items():
            if outcome != "pending":
                records.add_metric([outcome], count)
        yield records
        yield GaugeMetricFamily(
            _PREFIX + "replay_pending", "Records waiting to be applied", value=replay["pending"]
        )
        lag = replay["lag"]
        yield _gauge("replay_lag_records", "Records seen, not applied yet", lag, "records")
        yield _gauge("replay_lag_seconds", "Age of the oldest of them", lag, "seconds")
        yield _gauge("replay_stale", "Whether the worker is stale (lost records)", lag, "stale")
        yield GaugeMetricFamily(_PREFIX + "tree_nodes", "MetaTree nodes", value=m["tree"]["nodes"])
        yield GaugeMetricFamily(
            _PREFIX + "tree_holds", "Optimistic holds in the tree", value=m["tree"]["holds"]
        )
        if self.health is not None:
            yield from _health(self.health)


def _health(health: dict[str, Any]) -> Iterator[Metric]:
    """The event path's health: the thread, and each worker's view."""
    thread = health["thread"]
    yield GaugeMetricFamily(
        _PREFIX + "event_thread_up",
        "Whether the router's event thread (Router.start) is alive",
        value=float(thread["alive"]),
    )
    state = GaugeMetricFamily(
        _PREFIX + "event_thread_state", "The event thread's state (1 for the current one)",
        labels=["state"],
    )
    for name in _THREAD_STATES:
        state.add_metric([name], float(thread["state"] == name))
    yield state
    yield CounterMetricFamily(
        _PREFIX + "event_thread_errors",
        "Turns of the event thread that raised (each logged; the thread went on)",
        value=thread["errors"],
    )
    yield GaugeMetricFamily(
        _PREFIX + "replay_asking", "Repairs and probes waiting for a source's answer",
        value=health["asking"],
    )
    workers = health["workers"]
    yield _gauge(
        "replay_repairing", "Whether a replay or snapshot request for the worker is in flight",
        workers, "repairing",
    )
    applied = GaugeMetricFamily(
        _PREFIX + "replay_last_applied_seconds",
        "Seconds since a record of the worker was applied (absent: none yet)",
        labels=_LABELS,
    )
    for w in workers:
        if w["last_applied"] is not None:
            applied.add_metric([w["worker"], str(w["dp_rank"])], float(w["last_applied"]))
    yield applied


def _gauge(name: str, text: str, rows: list[dict[str, Any]], key: Any) -> GaugeMetricFamily:
    family = GaugeMetricFamily(_PREFIX + name, text, labels=_LABELS)
    for row in rows:
        value = key(row) if callable(key) else row[key]
        family.add_metric([row["worker"], str(row["dp_rank"])], float(value))
    return family


def exposition(metrics: dict[str, Any], health: dict[str, Any] | None = None) -> str:
    """The text exposition of one ``Router.metrics()`` (and ``Router.health()``) snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics, health))
    return generate_latest(registry).decode()
