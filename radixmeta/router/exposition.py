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


class _Snapshot:
    """A collector over one metrics() dict."""

    def __init__(self, metrics: dict[str, Any]) -> None:
        self.metrics = metrics

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


def _gauge(name: str, text: str, rows: list[dict[str, Any]], key: Any) -> GaugeMetricFamily:
    family = GaugeMetricFamily(_PREFIX + name, text, labels=_LABELS)
    for row in rows:
        value = key(row) if callable(key) else row[key]
        family.add_metric([row["worker"], str(row["dp_rank"])], float(value))
    return family


def exposition(metrics: dict[str, Any]) -> str:
    """The text exposition of one ``Router.metrics()`` snapshot."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Snapshot(metrics))
    return generate_latest(registry).decode()
