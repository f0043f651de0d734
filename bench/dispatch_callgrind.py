#!/usr/bin/env python3
"""Instructions per ``Router.dispatch`` + ``finish``, counted by callgrind, for two checkouts.

Wall and CPU times on this shared 2-core machine move by more than the 10 % that
issue 18 allows a change to cost dispatch; instruction counts do not. For each
checkout (``--roots``, built in place) and each mode, this runs
``bench_router``'s warm router (8 workers, the default policy, 2,048-token prompts
on shared 1,024-token prefixes) under ``valgrind --tool=callgrind`` twice: with
``--requests`` dispatches and with none. The difference, over ``--requests``, is
what one dispatch and its finish cost, without the start-up and the warm-up.

Usage::

    python bench/dispatch_callgrind.py --roots /path/to/old/checkout . [--requests 1000]

Prints a table (instructions a request, and each root against the first); with
``--json FILE`` it also writes the counts. Needs ``valgrind``; each run takes about
a minute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

from _callgrind import child_instructions

MODES = ("exact", "approximate")


def child(requests: int, mode: str) -> None:
    """The measured program: run inside valgrind with the checkout first on sys.path."""
    # The folder Python put first (this script's) goes: bench_router, and the radixmeta
    # it puts on the path, must come from the checkout measured (PYTHONPATH).
    if sys.path and Path(sys.path[0] or ".").resolve() == Path(__file__).resolve().parent:
        del sys.path[0]
    import bench_router as br
    import numpy as np

    import radixmeta

    root = os.environ["PYTHONPATH"].split(os.pathsep)[0]
    if not radixmeta.__file__ or not radixmeta.__file__.startswith(root):
        msg = f"radixmeta came from {radixmeta.__file__}, not {root}"
        raise SystemExit(msg)

    prefixes = br.groups()
    router, _ = br.warm_router(br.make_policy("default"), mode, prefixes)
    rng = np.random.default_rng(2)
    suffixes = rng.integers(0, 50_000, (512, br.PROMPT - br.PREFIX), dtype=np.uint32)
    keys = [br.fresh(prefixes, suffixes, k) for k in range(max(requests, 1))]
    for k in range(requests):
        decision = router.dispatch(keys[k])
        router.finish(decision.request_id)


def instructions(root: Path, requests: int, mode: str) -> int:
    """The instructions callgrind collected for one child run in ``root``."""
    return child_instructions(__file__, root, [str(requests), mode])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--roots", nargs="+", type=Path, default=[Path(".")])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", metavar="FILE")
    parser.add_argument("--child", nargs=2, metavar=("REQUESTS", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(int(args.child[0]), args.child[1])
        return 0
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (apt-get install valgrind)")
    if args.requests < 1:
        parser.error("--requests must be at least 1")
    roots = [root.resolve() for root in args.roots]
    rows = []
    print(f"{'mode':<12}{'root':<40}{'instr/request':>14}{'vs first':>10}")
    for mode in args.modes:
        first = None
        for root in roots:
            empty = instructions(root, 0, mode)
            full = instructions(root, args.requests, mode)
            per = (full - empty) / args.requests
            first = per if first is None else first
            rows.append({"mode": mode, "root": str(root), "instructions_per_request": per,
                         "empty": empty, "full": full, "requests": args.requests})
            print(f"{mode:<12}{str(root)[-39:]:<40}{per:>14,.0f}{per / first:>10.3f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": [sys.executable, *sys.argv], "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
