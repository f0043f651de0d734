#!/usr/bin/env python3
"""Simulated requests per second of wall time (the simulator's speed targets).

Two workloads, each timed after it is built (reading and tokenizing excluded):

- ``--mmlu-dir DIR``: all of MMLU, 4 workers, ``idle`` consistency, unbounded
  caches (the A.4 set-up); target 20,000 simulated requests a second.
- ``--trace-file FILE``: the Mooncake conversation trace, 8 workers, with the KV
  pool model at the cost model's pool (Mistral-7B on an A6000, 198,516 tokens a
  worker); target 3,000 simulated requests a second.

Prints a table; ``--json FILE`` writes it.

Usage: ``python bench/sim_speed.py (--mmlu-dir DIR | --trace-file FILE) [--policies ...]
[--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from radixmeta.sim import workloads
from radixmeta.sim.engine import SimConfig, Simulation
from radixmeta.sim.metrics import summarise

TARGET = 20_000  # MMLU, unbounded caches
TRACE_TARGET = 3_000  # the conversation trace, KV pool model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--mmlu-dir")
    source.add_argument("--trace-file", help="the Mooncake conversation trace (JSON lines)")
    parser.add_argument("--policies", nargs="+", default=["round_robin", "default"])
    parser.add_argument("--workers", type=int, default=None, help="default: 4 (MMLU), 8 (trace)")
    parser.add_argument("--consistency", default="idle")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    if args.trace_file:
        wl = workloads.trace(args.trace_file)
        workers = args.workers or 8
        capacity: int | str | None = "model"  # the KV pool model at the cost model's pool
        target = TRACE_TARGET
        label = "trace"
    else:
        wl = workloads.mmlu(args.mmlu_dir)
        workers = args.workers or 4
        capacity = None
        target = TARGET
        label = "MMLU"
    optimal = wl.optimal_hit_rate()
    rows = []
    tokenizer = wl.metadata.get("tokenizer")
    print(
        f"{len(wl):,} {label} requests, tokenizer {tokenizer}, {workers} workers, "
        f"capacity {capacity}; median of {args.repeats}"
    )
    header = f"{'policy':<16}{'req/s wall':>12}{'dispatch s':>12}{'replay s':>10}{'workers s':>11}"
    print(f"{header}{'hit':>8}")
    for policy in args.policies:
        config = SimConfig(
            workers=workers, policy=policy, consistency=args.consistency, capacity=capacity
        )
        times, summary = [], None
        for _ in range(args.repeats):
            sim = Simulation.from_workload(wl, config)
            start = time.perf_counter()
            run = sim.run()
            times.append(time.perf_counter() - start)
            summary = summarise(run, optimal)
        assert summary is not None
        rate = len(wl) / statistics.median(times)
        t = summary["timing"]
        rows.append(
            {"policy": policy, "requests_per_s": rate, "timing": t, "hit_rate": summary["hit_rate"]}
        )
        print(
            f"{policy:<16}{rate:>12,.0f}{t['dispatch']:>12.3f}{t['replay']:>10.3f}{t['workers']:>11.3f}"
            f"{summary['hit_rate']:>8.1%}   {'meets' if rate >= target else 'below'} {target:,}"
        )
    if args.json:
        with open(args.json, "w") as f:
            doc = {"workload": label, "requests": len(wl), "workers": workers, "target": target}
            json.dump({**doc, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
