"""What an engine says about its load, read from its Prometheus ``/metrics``.

vLLM exposes ``vllm:num_requests_waiting``, ``vllm:num_requests_running`` and
``vllm:kv_cache_usage_perc`` (``vllm:gpu_cache_usage_perc`` before 0.10), a fraction in
[0, 1], labelled by ``engine`` (the data-parallel rank) under data parallelism. SGLang
exposes ``sglang:num_queue_reqs``, ``sglang:num_running_reqs`` and ``sglang:token_usage``,
labelled by ``dp_rank`` where it has ranks. :func:`parse_loads` reads either, per rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

__all__ = ["ReportedLoad", "parse_loads"]

_QUEUE = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
_RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
_RANK_LABELS = ("dp_rank", "engine")


@dataclass
class ReportedLoad:
    """One rank's load as its engine reports it (None: not reported)."""

    queue_length: int | None = None
    running: int | None = None
    kv_usage: float | None = None


def _rank(labels: dict[str, str]) -> int:
    for name in _RANK_LABELS:
        value = labels.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def parse_loads(text: str) -> dict[int, ReportedLoad]:
    """Per data-parallel rank, the load in an engine's ``/metrics`` text.

    Counts of several label sets of one rank (several models) add up; the KV usage is
    their largest. A malformed exposition raises ``ValueError`` (the scraper counts it).

    >>> text = 'vllm:num_requests_waiting{engine="0"} 3.0\\nvllm:kv_cache_usage_perc 0.25\\n'
    >>> parse_loads(text)
    {0: ReportedLoad(queue_length=3, running=None, kv_usage=0.25)}
    """
    out: dict[int, ReportedLoad] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in _QUEUE or name in _RUNNING:
                load = out.setdefault(_rank(sample.labels), ReportedLoad())
                count = max(0, int(sample.value))
                if name in _QUEUE:
                    load.queue_length = (load.queue_length or 0) + count
                else:
                    load.running = (load.running or 0) + count
            elif name in _USAGE:
                load = out.setdefault(_rank(sample.labels), ReportedLoad())
                usage = min(1.0, max(0.0, float(sample.value)))
                load.kv_usage = usage if load.kv_usage is None else max(load.kv_usage, usage)
    return out
