"""Benchmark default's batch paths: a batch decided in order against the same batch packed.

Run: ``python bench/bench_batch_order.py`` (``--quick`` for a short run, ``--json out.json``
to keep every number, ``--cpu`` to time with the thread's CPU clock on a loaded machine).
Not part of the test suite.

Workload: bench_router's warm one (page size 16; 64 groups of a 1,536-token prefix, one
2,048-token request of each dispatched, its pages reported and finished), on 4 to 64
workers; a batch of ``B`` requests is ``B / 8`` groups of 8 fresh prompts (a group's
prefix, then 512 tokens of its own). A spy policy records the requests, views and
groups ``Router.dispatch_batch`` hands ``choose_batch``; then ``DefaultPolicy.choose_batch``
is timed on those, in order (``IN_ORDER_BUDGET`` patched to infinity) and packed (patched
to 0), the two interleaved batch by batch on fresh policies of the same state, so the
load of a shared machine falls on both alike. The figure is the policy's time per
request: the router's own share (matching, groups, commit) is the same on both paths.
``whole`` rows time ``Router.dispatch_batch`` end to end per request, both ways.

The in-order path's cost per request against the constants it is budgeted by,
``IN_ORDER_COST = (fixed, per worker)``: the table's ``budget`` column is
``fixed + workers * per_worker``, which every ``in order`` figure should stay under.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from radixmeta import Router
from radixmeta.policies import default as default_module
from radixmeta.policies.base import Request, View
from radixmeta.policies.default import IN_ORDER_BUDGET, IN_ORDER_COST, DefaultPolicy

PAGE = 16
GROUPS = 64
PROMPT = 2048
PREFIX = 1536
CLOCK: list[Callable[[], int]] = [time.perf_counter_ns]


def warm_router(workers: int, mode: str, policy: Any) -> Router:
    """bench_router's warm router: one request of each group dispatched, reported, done."""
    router = Router(PAGE, policy=policy, mode=mode)
    capacity = GROUPS * PROMPT // min(workers, GROUPS) * 4
    for i in range(workers):
        router.add_worker(f"w{i}", capacity=capacity)
    rng = np.random.default_rng(1)
    for g in range(GROUPS):
        key = np.concatenate([PREFIXES[g], rng.integers(0, 50_000, PROMPT - PREFIX, np.uint32)])
        d = router.dispatch(key)
        if mode == "exact":  # as the replayer applies the worker's events
            router.tree.insert(key, d.worker)
        router.finish(d.request_id)
    return router


_rng = np.random.default_rng(0)
PREFIXES = [_rng.integers(0, 50_000, PREFIX, dtype=np.uint32) for _ in range(GROUPS)]


def batch_of(size: int, b: int, rng: np.random.Generator) -> list[np.ndarray]:
    return [
        np.concatenate([PREFIXES[(b * 8 + k // 8) % GROUPS],
                        rng.integers(0, 50_000, PROMPT - PREFIX, np.uint32)])
        for k in range(size)
    ]


def captured(workers: int, mode: str, size: int, count: int) -> list[tuple[Any, Any, Any]]:
    """What dispatch_batch hands choose_batch for ``count`` batches (a spy decides them
    with default's choose, so the router's state moves as it would)."""
    seen: list[tuple[Any, Any, Any]] = []
    inner = DefaultPolicy()

    class Spy:
        flat_groups = True  # the router's PrefixGroups, passed on as they are

        def choose(self, request: Request, view: View) -> Any:
            return inner.choose(request, view)

        def choose_batch(self, requests: Any, views: Any, groups: Any) -> Any:
            seen.append((requests, views, groups))
            return inner.choose_batch(requests, views, groups)

    router = warm_router(workers, mode, Spy())
    rng = np.random.default_rng(3)
    for b in range(count):
        for d in router.dispatch_batch(batch_of(size, b, rng)):
            router.finish(d.request_id)
    router.close()
    return seen


def time_paths(cases: list[tuple[Any, Any, Any]], rounds: int) -> dict[str, list[float]]:
    """Per request (us): choose_batch in order and packed, interleaved case by case."""
    clock = CLOCK[0]
    out: dict[str, list[float]] = {"in order": [], "packed": []}
    for _ in range(rounds):
        for requests, views, groups in cases:
            for path, budget in (("in order", math.inf), ("packed", 0.0)):
                default_module.IN_ORDER_BUDGET = budget
                policy = DefaultPolicy()
                t0 = clock()
                policy.choose_batch(requests, views, groups)
                out[path].append((clock() - t0) / len(requests) / 1000)
    default_module.IN_ORDER_BUDGET = IN_ORDER_BUDGET
    return out


def time_whole(workers: int, mode: str, size: int, count: int) -> dict[str, list[float]]:
    """Per request (us): Router.dispatch_batch end to end, in order and packed, alternating."""
    clock = CLOCK[0]
    routers = {"in order": warm_router(workers, mode, "default"),
               "packed": warm_router(workers, mode, "default")}
    rng = np.random.default_rng(3)
    out: dict[str, list[float]] = {"in order": [], "packed": []}
    for b in range(count):
        batch = batch_of(size, b, rng)
        for path, budget in (("in order", math.inf), ("packed", 0.0)):
            default_module.IN_ORDER_BUDGET = budget
            router = routers[path]
            t0 = clock()
            decisions = router.dispatch_batch(batch)
            out[path].append((clock() - t0) / size / 1000)
            for d in decisions:
                router.finish(d.request_id)
            del decisions
    default_module.IN_ORDER_BUDGET = IN_ORDER_BUDGET
    for router in routers.values():
        router.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer batches and rounds")
    parser.add_argument("--cpu", action="store_true", help="time with the thread's CPU clock")
    parser.add_argument("--workers", default="4,8,16,64")
    parser.add_argument("--sizes", default="8,64,256")
    parser.add_argument("--mode", default="exact", choices=["exact", "approximate"])
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args(argv)
    if args.cpu:
        CLOCK[0] = time.thread_time_ns
    count, rounds = (4, 3) if args.quick else (12, 5)
    fixed, per_worker = IN_ORDER_COST
    print(f"default's choose_batch per request (us, median), {args.mode} mode, warm router; "
          f"budget = {fixed * 1e6:.0f} + {per_worker * 1e6:.0f} x workers us")
    print(f"{'workers':>7}{'batch':>7}{'in order':>10}{'packed':>9}{'ratio':>7}"
          f"{'budget':>8}{'whole in order':>16}{'whole packed':>14}")
    rows = []
    for workers in (int(w) for w in args.workers.split(",")):
        for size in (int(s) for s in args.sizes.split(",")):
            cases = captured(workers, args.mode, size, count)
            paths = time_paths(cases, rounds)
            whole = time_whole(workers, args.mode, size, count)
            row = {
                "workers": workers,
                "batch": size,
                "in_order_us": statistics.median(paths["in order"]),
                "packed_us": statistics.median(paths["packed"]),
                "whole_in_order_us": statistics.median(whole["in order"]),
                "whole_packed_us": statistics.median(whole["packed"]),
                "budget_us": (fixed + workers * per_worker) * 1e6,
                "samples": {"in order": paths["in order"], "packed": paths["packed"]},
            }
            rows.append(row)
            print(f"{workers:>7}{size:>7}{row['in_order_us']:>10.2f}{row['packed_us']:>9.2f}"
                  f"{row['in_order_us'] / row['packed_us']:>7.2f}{row['budget_us']:>8.0f}"
                  f"{row['whole_in_order_us']:>16.2f}{row['whole_packed_us']:>14.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": args.mode, "clock": "cpu" if args.cpu else "wall",
                       "in_order_cost": IN_ORDER_COST, "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
