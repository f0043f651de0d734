#!/usr/bin/env python3
"""Large dispatch batches: the batch trie alone, and ``Router.dispatch_batch`` end to end.

Run: ``python bench/bench_batch_trie.py`` (``--sizes 20000 100000`` by default,
``--quick`` for 2,000 and 20,000, ``--json out.json`` to keep every number). Set
``OPENBLAS_NUM_THREADS=1`` on a small shared machine. Not part of the test suite.

Workloads (page size 16, prompts of 256 tokens, numpy uint32, seed 0):

* ``distinct``: no two prompts share a page, so the trie's root has one child per
  prompt (the case a linear scan of children makes quadratic).
* ``system``: every prompt starts with the same one-page system prompt, then its
  own tokens: one node with a child per prompt, one level down.
* ``groups``: 64 groups of a 128-token prefix, then 128 tokens of the prompt's own.

Rows, per workload and batch size (one run each, the sizes are large):

* ``prefix_links``: the native trie of the batch alone (``_core.prefix_links``).
* ``group_runs``: ``_core.prefix_group_runs``, what the router calls (the trie and
  the lists it hands out).
* ``dispatch_batch``: a fresh 8-worker ``Router`` (exact mode, the default policy, or
  ``--policy``) deciding the whole batch, in wall-clock seconds and in this process's
  CPU seconds (``cpu``: on a shared machine the wall clock also counts the time other
  processes hold the cores; ``--repeats N`` keeps the run of least CPU of N, and
  ``--general`` runs the default policy's ``choose_batch`` without its shortcuts, the
  same decisions by the general code, for an A/B of one build); then the native calls
  it makes, each timed alone (:func:`native_parts`), and what is left, split into the
  policy's Python (``policy``: its ``choose_batch``, or its ``choose`` calls, timed in
  the run) and the router's (``router``: the rest, with the collector's first young
  collection after the batch).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # the checkout's radixmeta

from radixmeta import Router
from radixmeta._impl import backend
from radixmeta.policies import default as default_policy

PAGE = 16
PROMPT = 256
WORKERS = 8
GROUPS = 64


def distinct(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    # Ids from a 2**31 range: two prompts sharing a whole first page is out of the question.
    return list(rng.integers(0, 2**31, (n, PROMPT), dtype=np.uint32))


def system(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    prompts = distinct(n, rng)
    head = rng.integers(0, 2**31, PAGE, dtype=np.uint32)
    for p in prompts:
        p[:PAGE] = head
    return prompts


def groups(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    prefixes = rng.integers(0, 2**31, (GROUPS, PROMPT // 2), dtype=np.uint32)
    prompts = distinct(n, rng)
    for k, p in enumerate(prompts):
        p[: PROMPT // 2] = prefixes[k % GROUPS]
    return prompts


WORKLOADS: dict[str, Callable[[int, np.random.Generator], list[np.ndarray]]] = {
    "distinct": distinct,
    "system": system,
    "groups": groups,
}


def timed(call: Callable[..., Any], *args: Any) -> float:
    """Seconds of one ``call(*args)``, the garbage collector on (as in a router)."""
    return timed_both(call, *args)[0]


def timed_both(call: Callable[..., Any], *args: Any) -> tuple[float, float]:
    """Wall-clock and CPU seconds of one ``call(*args)``, the garbage collector on, and
    counting the first young collection after it (a call that pauses the collector
    leaves that one to its caller)."""
    gc.collect()
    t0, c0 = time.perf_counter(), time.process_time()
    out = call(*args)
    _ = [[] for _ in range(1000)]  # more new containers than a young collection waits for
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    del out
    return wall, cpu


def fresh_router(policy: str = "default") -> Router:
    router = Router(PAGE, policy=policy)
    for i in range(WORKERS):
        router.add_worker(f"w{i}")
    return router


def timed_batch(policy: str, prompts: list[np.ndarray]) -> tuple[float, float, float]:
    """Wall-clock and CPU seconds of one ``dispatch_batch`` on a fresh router (as
    :func:`timed_both`), and the CPU seconds its policy took: ``choose_batch``, or every
    ``choose`` of the group-by-group path (each call then also pays the timer's few
    hundred nanoseconds)."""
    router = fresh_router(policy)
    spent = [0.0]
    name = "_choose_batch" if router._choose_batch is not None else "_choose"
    inner = getattr(router, name)

    def timed(*args: Any) -> Any:
        t0 = time.process_time()
        try:
            return inner(*args)
        finally:
            spent[0] += time.process_time() - t0

    setattr(router, name, timed)
    wall, cpu = timed_both(router.dispatch_batch, prompts)
    return wall, cpu, spent[0]


def native_parts(prompts: list[np.ndarray], policy: str = "default") -> dict[str, float]:
    """CPU seconds of the native calls one ``dispatch_batch`` makes, each timed alone.

    On a fresh 8-worker router's tree, as ``dispatch_batch`` meets it: every prompt's
    ``MetaTree.match`` (cursor form), the batch's ``prefix_group_runs``, and one
    ``hold`` per match (exact mode's optimistic mark), with the collector paused as
    ``dispatch_batch`` pauses it. What ``dispatch_batch`` takes
    beyond their sum is its Python: ``radixmeta/router/``, the policy, ``_batch.py``.
    """
    router = fresh_router(policy)
    tree = router.tree
    workers = router.workers
    gc.collect()
    gc.disable()  # as dispatch_batch runs them (router/_collector.py)
    try:
        t0 = time.process_time()
        matches = [tree.match(p, cursor=True) for p in prompts]
        t1 = time.process_time()
        backend.prefix_group_runs(prompts, PAGE, router.group_ratio)
        t2 = time.process_time()
        for k, m in enumerate(matches):  # spread over the workers, as a batch is
            m.hold(workers[k % WORKERS])
        t3 = time.process_time()
    finally:
        gc.enable()
    return {"match": t1 - t0, "group_runs": t2 - t1, "hold": t3 - t2}


def commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, check=True, cwd=os.path.dirname(__file__))
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return out.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 100_000])
    parser.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    parser.add_argument("--quick", action="store_true", help="sizes 2,000 and 20,000")
    parser.add_argument("--no-router", action="store_true", help="the trie rows only")
    parser.add_argument("--no-split", action="store_true", help="skip the native parts' rows")
    parser.add_argument("--policy", default="default", help="the router's policy (default)")
    parser.add_argument("--repeats", type=int, default=1,
                        help="dispatch_batch runs per row, the least CPU time kept (1)")
    parser.add_argument("--general", action="store_true",
                        help="the default policy's choose_batch without its shortcuts "
                             "(the same decisions by the general code: an A/B in one build)")
    parser.add_argument("--json", metavar="OUT", help="write every number here")
    args = parser.parse_args()
    sizes = [2_000, 20_000] if args.quick else args.sizes
    if args.general:
        default_policy._FAST_PATHS = False
    results: list[dict[str, Any]] = []
    runs = "one run each" if args.repeats == 1 else f"the least CPU of {args.repeats} runs"
    print(f"page {PAGE}, prompts of {PROMPT} tokens, {WORKERS} workers, policy "
          f"{args.policy}{' (general code)' if args.general else ''};\nseconds, {runs}")
    print(f"{'workload':<10}{'requests':>9}{'prefix_links':>13}{'group_runs':>11}"
          f"{'batch':>8}{'batch cpu':>10}{'cpu us/req':>11}")
    for name in args.workloads:
        for n in sizes:
            prompts = WORKLOADS[name](n, np.random.default_rng(0))
            row: dict[str, Any] = {"workload": name, "requests": n}
            row["prefix_links"] = timed(backend.prefix_links, prompts, PAGE, 0.5)
            row["group_runs"] = timed(backend.prefix_group_runs, prompts, PAGE, 0.5)
            line = (f"{name:<10}{n:>9,}{row['prefix_links']:>13.3f}"
                    f"{row['group_runs']:>11.3f}")
            if not args.no_router:
                wall, cpu, policy = min(
                    (timed_batch(args.policy, prompts) for _ in range(args.repeats)),
                    key=lambda times: times[1],
                )
                row["dispatch_batch"], row["dispatch_batch_cpu"] = wall, cpu
                row["policy"] = policy
                line += f"{wall:>8.3f}{cpu:>10.3f}{cpu / n * 1e6:>11.2f}"
            print(line, flush=True)
            if not args.no_router and not args.no_split:
                row["native"] = native_parts(prompts, args.policy)
            results.append(row)
    split = [r for r in results if "native" in r]
    if split:
        print("\nwhere dispatch_batch's CPU time goes (seconds; the native calls timed alone)")
        print(f"{'workload':<10}{'requests':>10}{'match':>9}{'group_runs':>12}{'hold':>8}"
              f"{'policy':>8}{'router':>8}{'python %':>10}")
        for r in split:
            native = r["native"]
            python = r["dispatch_batch_cpu"] - sum(native.values())
            r["python"] = python
            r["router"] = python - r["policy"]  # the router's own Python, and the collector
            print(f"{r['workload']:<10}{r['requests']:>10,}{native['match']:>9.3f}"
                  f"{native['group_runs']:>12.3f}{native['hold']:>8.3f}{r['policy']:>8.3f}"
                  f"{r['router']:>8.3f}{100 * python / r['dispatch_batch_cpu']:>9.0f}%")
    if args.json:
        meta = {"platform": platform.platform(), "python": sys.version.split()[0],
                "commit": commit(), "page": PAGE, "prompt": PROMPT, "workers": WORKERS,
                "policy": args.policy, "general": args.general, "repeats": args.repeats}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
