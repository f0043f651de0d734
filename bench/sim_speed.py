#!/usr/bin/env python3
"""Simulated requests per second of wall time (the simulator's speed targets).

Two workloads, each timed after it is built (reading and tokenizing excluded):

- ``--mmlu-dir DIR``: all of MMLU, 4 workers, ``idle`` consistency, unbounded
  caches (the A.4 set-up); target 20,000 simulated requests a second.
- ``--trace-file FILE``: the Mooncake conversation trace, 8 workers, with the KV
  pool model at the cost model's pool (Mistral-7B on an A6000, 198,516 tokens a
  worker); target 3,000 simulated requests a second.

Prints a table; ``--json FILE`` writes it. Beside the wall rate (what the targets
name) it prints the CPU time per request of the run (``time.process_time``), and
the load average when it started: the machine is shared, and CPU time moves far
less with other people's load than wall time does.

``--compare ROOT [ROOT ...]`` measures other radixmeta checkouts against this one
in the same run: every repeat of every policy runs once per checkout, each in a
child process importing radixmeta from its checkout, in ABBA order (A B, then B
A, ...) so that a change of the machine's load hits both alike. It prints the
medians per checkout and each one's CPU time over this checkout's.

Usage: ``python bench/sim_speed.py (--mmlu-dir DIR | --trace-file FILE) [--policies ...]
[--repeats 3] [--compare ROOT ...]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from radixmeta.sim import workloads
from radixmeta.sim.engine import SimConfig, Simulation
from radixmeta.sim.metrics import summarise

TARGET = 20_000  # MMLU, unbounded caches
TRACE_TARGET = 3_000  # the conversation trace, KV pool model
HERE = Path(__file__).resolve().parent


def _child(root: Path, args: argparse.Namespace, policy: str) -> dict[str, Any]:
    """One run of ``policy`` in a child process that imports radixmeta from ``root``."""
    with tempfile.TemporaryDirectory(prefix="sim_speed-") as scratch:
        out = Path(scratch) / "one.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--repeats", "1"]
        argv += ["--policies", policy, "--consistency", args.consistency, "--json", str(out)]
        if args.trace_file:
            argv += ["--trace-file", str(Path(args.trace_file).resolve())]
        else:
            argv += ["--mmlu-dir", str(Path(args.mmlu_dir).resolve())]
        if args.workers is not None:
            argv += ["--workers", str(args.workers)]
        env = {**os.environ, "PYTHONPATH": str(root)}
        subprocess.run(argv, cwd=root, env=env, check=True, capture_output=True, timeout=3600)
        row: dict[str, Any] = json.loads(out.read_text())["rows"][0]
        return row


def compare(args: argparse.Namespace) -> None:
    """The ``--compare`` mode (module docstring)."""
    roots = [HERE.parent, *(Path(r).resolve() for r in args.compare)]
    print(f"A/B in ABBA order, {args.repeats} repeat(s); base (A) = {roots[0]}")
    rows = []
    for policy in args.policies:
        runs: dict[Path, list[dict[str, Any]]] = {r: [] for r in roots}
        for k in range(args.repeats):
            for root in roots if k % 2 == 0 else roots[::-1]:
                runs[root].append(_child(root, args, policy))
        base = statistics.median(r["cpu_us_per_request"] for r in runs[roots[0]])
        for root in roots:
            cpu = [r["cpu_us_per_request"] for r in runs[root]]
            rate = [r["requests_per_s"] for r in runs[root]]
            loads = [x for r in runs[root] for x in r["load_average"]]
            row = {
                "policy": policy,
                "root": str(root),
                "cpu_us_per_request": cpu,
                "requests_per_s": rate,
                "load_average": loads,
                "cpu_over_base": statistics.median(cpu) / base,
                "hit_rate": runs[root][-1]["hit_rate"],
            }
            rows.append(row)
            print(
                f"{policy:<14}{root!s:<28} cpu us/req {statistics.median(cpu):>6,.0f} "
                f"(runs {', '.join(f'{c:,.0f}' for c in cpu)})  req/s wall "
                f"{statistics.median(rate):>6,.0f}  hit {row['hit_rate']:.1%}  "
                f"x{row['cpu_over_base']:.2f} of A  load {', '.join(f'{x:.1f}' for x in loads)}"
            )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"mode": "compare", "rows": rows}, f, indent=2, allow_nan=False)


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
    parser.add_argument(
        "--compare", nargs="+", metavar="ROOT", help="other checkouts to measure against this one"
    )
    args = parser.parse_args()
    if args.compare:
        compare(args)
        return
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
        f"capacity {capacity}; median of {args.repeats}; target {target:,} requests/s wall"
    )
    header = f"{'policy':<14}{'req/s wall':>11}{'cpu us/req':>11}{'dispatch':>9}{'replay':>8}"
    print(f"{header}{'workers':>9}{'hit':>7}  target")
    for policy in args.policies:
        config = SimConfig(
            workers=workers, policy=policy, consistency=args.consistency, capacity=capacity
        )
        times, cpus, loads, summary = [], [], [], None
        for _ in range(args.repeats):
            sim = Simulation.from_workload(wl, config)
            loads.append(os.getloadavg()[0])
            start, cpu = time.perf_counter(), time.process_time()
            run = sim.run()
            cpus.append(time.process_time() - cpu)
            times.append(time.perf_counter() - start)
            summary = summarise(run, optimal)
        assert summary is not None
        rate = len(wl) / statistics.median(times)
        cpu_us = 1e6 * statistics.median(cpus) / len(wl)
        t = summary["timing"]
        rows.append(
            {
                "policy": policy,
                "requests_per_s": rate,
                "cpu_us_per_request": cpu_us,
                "load_average": loads,
                "timing": t,
                "hit_rate": summary["hit_rate"],
            }
        )
        verdict = "meets" if rate >= target else "below"
        print(
            f"{policy:<14}{rate:>11,.0f}{cpu_us:>11,.0f}{t['dispatch']:>9.2f}{t['replay']:>8.2f}"
            f"{t['workers']:>9.2f}{summary['hit_rate']:>7.1%}  {verdict}"
        )
    starts = ", ".join(f"{x:.1f}" for r in rows for x in r["load_average"])
    print(f"load average (1 min) at each run's start: {starts}")
    if args.json:
        with open(args.json, "w") as f:
            doc = {"workload": label, "requests": len(wl), "workers": workers, "target": target}
            json.dump({**doc, "rows": rows}, f, indent=2, allow_nan=False)


if __name__ == "__main__":
    main()
