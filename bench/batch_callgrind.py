#!/usr/bin/env python3
"""Instructions of one ``Router.dispatch_batch``, counted by callgrind, for checkouts.

CPU seconds of a large batch move by tens of per cent on this shared 2-core machine;
instruction counts do not. For each checkout (``--roots``, built in place) this runs
``bench_batch_trie``'s fresh 8-worker router (exact mode, the default policy) and its
``distinct`` workload (``--requests`` prompts of 256 tokens that share no page) under
``valgrind --tool=callgrind`` twice: once deciding the batch with ``dispatch_batch``
and once without the call. The difference is what the batch costs, with the
collector's first young collection after it (as ``bench_batch_trie`` counts it), and
without the start-up and the prompts' making.

Usage::

    python bench/batch_callgrind.py --roots /path/to/old/checkout . [--requests 20000]

Prints instructions a request per root and each against the first; ``--json FILE``
also writes them. Needs ``valgrind``; each run takes one to a few minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from _callgrind import child_instructions


def child(requests: int, run: bool) -> None:
    """The measured program: run inside valgrind with the checkout first on sys.path."""
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        del sys.path[0]  # bench_batch_trie, and its radixmeta, come from the measured root
    import bench_batch_trie as bt
    import numpy as np

    import radixmeta

    root = os.environ["PYTHONPATH"].split(os.pathsep)[0]
    if not radixmeta.__file__ or not radixmeta.__file__.startswith(root):
        msg = f"radixmeta came from {radixmeta.__file__}, not {root}"
        raise SystemExit(msg)
    prompts = bt.distinct(requests, np.random.default_rng(0))
    router = bt.fresh_router("default")
    if run:
        router.dispatch_batch(prompts)
        _ = [[] for _ in range(1000)]  # the first young collection after the batch
    router.close()


def instructions(root: Path, requests: int, run: bool) -> int:
    """Instructions of the child program under callgrind (the whole process)."""
    return child_instructions(__file__, root, [str(requests), "run" if run else "none"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--roots", nargs="+", type=Path, default=[Path(".")])
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--json", metavar="OUT", help="write the counts here")
    args = parser.parse_args()
    if args.child:
        child(int(args.child[0]), args.child[1] == "run")
        return
    rows = []
    print(f"one dispatch_batch of {args.requests:,} distinct prompts, 8 workers, default policy")
    print(f"{'root':<40}{'instr/request':>15}{'vs first':>10}")
    for root in args.roots:
        root = root.resolve()
        cost = instructions(root, args.requests, True) - instructions(root, args.requests, False)
        per = cost / args.requests
        rows.append({"root": str(root), "requests": args.requests, "instructions": cost,
                     "per_request": per})
        print(f"{root!s:<40}{per:>15,.0f}{per / rows[0]['per_request']:>10.3f}", flush=True)
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"rows": rows}, out, indent=2, allow_nan=False)


if __name__ == "__main__":
    main()
