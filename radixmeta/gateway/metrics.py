"""The gateway's own Prometheus metrics (``radixmeta_gateway_*``), beside the Router's.

Each gateway app has a registry of its own (never the process-wide default), so two apps
in one process, as in tests, count apart. ``GET /metrics`` serves this registry followed
by :meth:`radixmeta.Router.metrics_text`.
"""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

__all__ = ["GatewayMetrics"]

# Latency buckets from 1 ms to 2 min: a cached prefill is milliseconds, a long
# generation minutes.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class GatewayMetrics:
    """Requests, latencies and upstream errors, per endpoint and engine."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        prefix = "radixmeta_gateway_"
        self.requests = Counter(
            prefix + "requests",
            "Requests answered, by endpoint, engine (worker) and HTTP status",
            ["endpoint", "worker", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            prefix + "request_seconds",
            "Seconds from the request's arrival to its last byte, by endpoint",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.ttft = Histogram(
            prefix + "first_token_seconds",
            "Seconds from a streamed request's arrival to its first token",
            ["endpoint"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.upstream_errors = Counter(
            prefix + "upstream_errors",
            "Upstream failures by engine and kind (connect, timeout, read, status)",
            ["worker", "kind"],
            registry=self.registry,
        )
        self.retries = Counter(
            prefix + "retries", "Requests sent again to another engine", registry=self.registry
        )
        self.disconnects = Counter(
            prefix + "client_disconnects",
            "Clients that went away before the response ended (upstream cancelled)",
            registry=self.registry,
        )
        self.bad_requests = Counter(
            prefix + "bad_requests", "Malformed requests answered 400", registry=self.registry
        )
        self.engine_up = Gauge(
            prefix + "engine_up",
            "1 while the engine's circuit breaker lets it take traffic",
            ["worker"],
            registry=self.registry,
        )
        self.load_scrape_errors = Counter(
            prefix + "load_scrape_errors",
            "Load scrapes of an engine's /metrics that failed",
            ["worker"],
            registry=self.registry,
        )

    def forget(self, worker: str) -> None:
        """Drop an engine's gauge (it was removed); its counters stay, as counters do."""
        with contextlib.suppress(KeyError):
            self.engine_up.remove(worker)

    def text(self) -> bytes:
        """The exposition of this registry."""
        return generate_latest(self.registry)
