"""The router's counters and gauges as plain Python values (``Router.metrics``).

Requests in flight are counted here, from their decisions; the ended ones were added
to each worker's record as they ended (finish, expire, removal). The Prometheus text
of the same numbers is :func:`radixmeta.router.exposition.exposition`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from radixmeta.events.replay import Replayer
from radixmeta.meta import MetaTree
from radixmeta.policies.base import EngineLoad
from radixmeta.router.decision import Decision
from radixmeta.router.registry import Registry

if TYPE_CHECKING:
    from radixmeta._workers import WorkerId
    from radixmeta.router.feed import EventThread

__all__ = ["health_of", "replay_metrics", "worker_metrics"]


def worker_metrics(
    registry: Registry,
    flights: Mapping[str, Decision],
    ended: Mapping[str, int],
    tree: MetaTree,
    exact: bool,
) -> tuple[dict[str, int], list[dict[str, Any]]]:
    """``(decisions, workers)``: label -> count over every request dispatched, and one
    dict per registered worker (see ``Router.metrics``). Call it under the router's lock."""
    decisions = dict(ended)
    flying: dict[int, list[int]] = {}
    for d in flights.values():
        counts = flying.setdefault(d.worker.index, [0, 0, 0])
        counts[0] += 1
        counts[1] += d.matched
        counts[2] += len(d._request.tokens)
        decisions[d.label] = decisions.get(d.label, 0) + 1
    workers = []
    for record in registry.records:
        if record is None:
            continue
        w, i = record.worker, record.worker.index
        reported = record.reported or EngineLoad()
        dispatched, hits, prompts = flying.get(i, (0, 0, 0))
        workers.append(
            {
                "worker": w.name,
                "dp_rank": w.dp_rank,
                "up": record.up,
                "dispatches": record.dispatches + dispatched,
                "hit_tokens": record.hit_tokens + hits,
                "prompt_tokens": record.prompt_tokens + prompts,
                "finished": record.finished,
                "expired": record.expired,
                "output_tokens": record.output_tokens,
                "requests": registry.requests[i],
                "prefill_tokens": registry.prefill[i],
                "decode_tokens": registry.decode[i],
                "held_tokens": tree.held_tokens(w),
                "hold_tokens": tree.hold_tokens(w) if exact else 0,
                "capacity": record.capacity,
                "queue_length": reported.queue_length,
                "kv_usage": reported.kv_usage,
                "running": reported.running,
            }
        )
    return decisions, workers


def replay_metrics(replayer: Replayer) -> dict[str, Any]:
    """The replayer's cumulative ``stats``, ``pending`` records and per worker ``lag``."""
    return {
        "stats": asdict(replayer.stats),
        "pending": replayer.pending,
        "lag": [asdict(entry) for entry in replayer.lag()],
    }


def health_of(
    mode: str,
    thread: EventThread | None,
    replayer: Replayer,
    workers: Iterable[WorkerId],
    subscribed: set[tuple[str, int]],
) -> dict[str, Any]:
    """``Router.health()``: the event thread's state and each worker's view (no lock held)."""
    lag = {(w.worker, w.dp_rank): w for w in replayer.lag()}
    rows = []
    for w in workers:
        key = (w.name, w.dp_rank)
        entry = lag.get(key)
        rows.append(
            {
                "worker": w.name,
                "dp_rank": w.dp_rank,
                "subscribed": key in subscribed,
                "last_applied": None if entry is None else entry.last_applied,
                "lag_records": 0 if entry is None else entry.records,
                "lag_seconds": 0.0 if entry is None else entry.seconds,
                "stale": bool(entry and entry.stale),
                "repairing": bool(entry and entry.repairing),
                "last_error": None if entry is None else entry.last_error,
            }
        )
    return {
        "mode": mode,
        "thread": _NOT_STARTED if thread is None else thread.health(),
        "pending": replayer.pending,
        "asking": replayer.asking,
        "workers": rows,
    }


_NOT_STARTED = {
    "state": "not started",
    "alive": False,
    "turns": 0,
    "errors": 0,
    "last_error": None,
    "seconds_since_turn": None,
}
