#!/usr/bin/env python3
"""Simulated requests per second of wall time, on all of MMLU (the simulator's speed target).

The issue's target: at least 20,000 simulated requests per second with ``round_robin``
and with ``default``, ``idle`` consistency, 4 workers, tokenization excluded (the
workload is built before timing). Prints a table; ``--json FILE`` writes it.

Usage: ``python bench/sim_speed.py --mmlu-dir DIR [--policies round_robin default] [--repeats 3]``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from radixmeta.sim import workloads
from radixmeta.sim.engine import SimConfig, Simulation
from radixmeta.sim.metrics import summarise

TARGET = 20_000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mmlu-dir", required=True)
    parser.add_argument("--policies", nargs="+", default=["round_robin", "default"])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--consistency", default="idle")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    wl = workloads.mmlu(args.mmlu_dir)
    optimal = wl.optimal_hit_rate()
    rows = []
    tokenizer = wl.metadata.get("tokenizer")
    print(f"{len(wl):,} MMLU requests, tokenizer {tokenizer}; median of {args.repeats}")
    header = f"{'policy':<16}{'req/s wall':>12}{'dispatch s':>12}{'replay s':>10}{'workers s':>11}"
    print(f"{header}{'hit':>8}")
    for policy in args.policies:
        config = SimConfig(workers=args.workers, policy=policy, consistency=args.consistency)
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
            f"{summary['hit_rate']:>8.1%}   {'meets' if rate >= TARGET else 'below'} {TARGET:,}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"requests": len(wl), "target": TARGET, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
