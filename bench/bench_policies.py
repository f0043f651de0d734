"""Time ``choose`` (and ``on_dispatch`` where a policy has it) of every built-in policy.

The router calls the policy per request under its lock, so this is part of the dispatch
budget. Views are hand-built: 8 workers by default, a 2,048-token prompt, one shared prefix
held by some workers, loads that change with every request. Reports the median of 5
repeats after a warm-up, in CPU microseconds per call (``time.process_time``).

``--expected`` sets what the views carry as ``View.expected``: ``none`` (no capacity
estimate), ``same`` (the lengths list itself, the router's form when nothing is cut),
``copy`` (an equal copy, a batch's row) or ``cut`` (one worker's match cut by half).

    python bench/bench_policies.py [--workers 8] [--calls 20000] [--policies a,b]
        [--expected none|same|copy|cut] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from radixmeta import WorkerId
from radixmeta.policies import Request, View, create, names, worker_of


def make_cases(
    workers: int, count: int, seed: int, expected: str = "none"
) -> list[tuple[Request, View]]:
    rng = random.Random(seed)
    ids = tuple(WorkerId(f"w{i}", 0, i, 0) for i in range(workers))
    size = 2048
    tokens = np.arange(size, dtype=np.uint32)
    cases = []
    for k in range(count):
        lengths = [rng.choice((0, 0, 1536, 1024)) for _ in range(workers)]
        view = View(
            workers=ids,
            lengths=lengths,
            host_lengths=lengths,
            requests=[rng.randrange(64) for _ in range(workers)],
            prefill_tokens=[rng.randrange(20_000) for _ in range(workers)],
            decode_tokens=[rng.randrange(100_000) for _ in range(workers)],
            capacities=[200_000] * workers,
            reported=[None] * workers,
            page_size=16,
            prefix_key=rng.randrange(64) if max(lengths) else None,
        )
        if expected == "same":
            view.expected = lengths
        elif expected == "copy":
            view.expected = lengths[:]
        elif expected == "cut":
            view.expected = lengths[:]
            view.expected[0] //= 2
        cases.append((Request(f"r{k}", tokens, expected_output=32), view))
    return cases


def time_policy(name: str, cases: list[tuple[Request, View]], repeats: int) -> float:
    """Median microseconds per request of ``choose`` plus ``on_dispatch``."""
    runs = []
    for _ in range(repeats + 1):  # the first run warms up
        policy = create(name)
        dispatch = getattr(policy, "on_dispatch", None)
        start = time.process_time()
        for request, view in cases:
            worker = worker_of(policy.choose(request, view))
            if dispatch is not None:
                dispatch(request, worker, view.lengths[view.workers.index(worker)])
        runs.append((time.process_time() - start) / len(cases) * 1e6)
    return statistics.median(runs[1:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--policies", default="all", help="comma-separated names, or all")
    parser.add_argument("--expected", choices=("none", "same", "copy", "cut"), default="none")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    chosen = names() if args.policies == "all" else args.policies.split(",")
    cases = make_cases(args.workers, args.calls, seed=0, expected=args.expected)
    results = {name: time_policy(name, cases, args.repeats) for name in chosen}
    print(
        f"{args.workers} workers, {args.calls} requests, expected={args.expected}, "
        f"median of {args.repeats}, CPU time"
    )
    for name, us in results.items():
        print(f"  {name:15} {us:6.2f} us per request")
    if args.json:
        out = {
            "platform": platform.platform(),
            "python": sys.version,
            "workers": args.workers,
            "calls": args.calls,
            "expected": args.expected,
            "us_per_request": results,
        }
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
