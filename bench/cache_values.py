#!/usr/bin/env python3
"""What ``RadixCache(store_values=False)`` saves: bytes a cached token, and insert + match time.

The workload: ``--prompts`` prompts, each one of ``--stems`` shared stems (the system
prompts) followed by a question of its own, random tokens. Both caches get the same
prompts; the memory figure is ``memory_usage()`` over the cached tokens, the time is the
CPU time of one insert followed by one match of the same prompt, per pair, for the whole
workload, repeated ``--repeats`` times with the two kinds of cache alternated (so a busy
machine slows both alike), median reported. The figures docs/cache.md quotes come from::

    python bench/cache_values.py --json cache_values.json

Prints a table; ``--json FILE`` also writes every figure with the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

import numpy as np

from radixmeta import RadixCache


def prompts(count: int, stems: int, seed: int) -> list[np.ndarray]:
    """``count`` prompts over ``stems`` shared stems: a 256-1,024-token stem, then 64-1,024 of
    their own tokens."""
    rng = np.random.default_rng(seed)
    heads = [rng.integers(0, 50_000, int(rng.integers(256, 1025))) for _ in range(stems)]
    return [
        np.concatenate(
            [heads[int(rng.integers(stems))], rng.integers(0, 50_000, int(rng.integers(64, 1025)))]
        ).astype(np.uint32)
        for _ in range(count)
    ]


def fill(store_values: bool, workload: list[np.ndarray]) -> tuple[RadixCache, float]:
    """A cache holding the workload, and the CPU seconds its inserts and matches took."""
    cache = RadixCache(store_values=store_values)
    values = [np.arange(len(p), dtype=np.int64) for p in workload] if store_values else None
    started = time.process_time()
    for i, prompt in enumerate(workload):
        if values is None:
            cache.insert(prompt)
            cache.match_prefix(prompt, values=False)
        else:
            cache.insert(prompt, values[i])
            cache.match_prefix(prompt)
    return cache, time.process_time() - started


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=2000)
    parser.add_argument("--stems", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the figures here")
    args = parser.parse_args(argv)
    if args.prompts < 1 or args.stems < 1 or args.repeats < 1:
        parser.error("--prompts, --stems and --repeats must be at least 1")
    workload = prompts(args.prompts, args.stems, args.seed)
    times: dict[bool, list[float]] = {True: [], False: []}
    sizes: dict[bool, dict[str, int]] = {}
    for repeat in range(args.repeats):
        for store in (True, False) if repeat % 2 == 0 else (False, True):
            cache, seconds = fill(store, workload)
            times[store].append(seconds)
            sizes[store] = {"tokens": cache.total_size, "nodes": cache.node_count,
                            "bytes": cache.memory_usage()}
    rows: list[dict[str, Any]] = []
    print(f"{'store_values':<14}{'tokens':>11}{'nodes':>8}{'bytes/token':>13}{'us/pair':>10}")
    for store in (True, False):
        size = sizes[store]
        row = {
            "store_values": store,
            **size,
            "bytes_per_token": size["bytes"] / max(size["tokens"], 1),
            "cpu_us_per_pair": statistics.median(times[store]) / len(workload) * 1e6,
            "cpu_seconds": times[store],
        }
        rows.append(row)
        print(f"{store!s:<14}{size['tokens']:>11,}{size['nodes']:>8,}"
              f"{row['bytes_per_token']:>13.2f}{row['cpu_us_per_pair']:>10.2f}")
    if args.json:
        out = {"command": [sys.executable, *sys.argv], "machine": platform.machine(),
               "load_average": os.getloadavg(), "rows": rows}
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2, allow_nan=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
