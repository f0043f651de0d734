"""Benchmark Router.dispatch and dispatch_batch from Python (not part of the test suite).

Run: ``python bench/bench_router.py`` (``--quick`` for a short run, ``--policy NAME`` for
one policy, ``--json out.json`` to keep every number). Set ``OPENBLAS_NUM_THREADS=1`` on a
small shared machine so numpy's idle BLAS threads do not compete.

Workloads (page size 16, 8 workers):

* ``warm``: a 2,048-token uint32 prompt of one of 64 groups (a 1,536-token group prefix,
  then 512 tokens of its own), after 64 requests (one per group) were dispatched, their
  pages reported (exact mode: as the replayer would apply the workers' events) and
  finished. Each timed request's prompt is made just before its dispatch, so it is in the
  CPU's caches as a just-tokenized prompt is. ``finish`` runs after each dispatch, untimed,
  and the finished decision is dropped then too (before this bench did so, the next
  dispatch's timing also paid for freeing the previous request's objects, 0.2-0.3 us).
  ``repeat`` sends an already dispatched prompt (every page a hit).
* ``shared``: the sgl-router peer note's workload (section 5.3): 100 prefixes of 2,000
  characters, then 10,000 strings of a prefix and 500 fresh characters, drawn from a 65-
  character alphabet by xorshift64* (seed 0x9E3779B97F4A7C15); one token per byte (byte +
  1000). A fresh approximate-mode router routes all 10,000 in order (its tree grows, as
  the peer's "route" row does); the native row is the MetaTree's match and insert alone,
  for worker ``i % 8`` as the peer's tenant.

For every row the same run also times the native calls alone (``MetaTree.match(...,
cursor=True)`` and the mark from it, on a copy of the same tree state), so the Python
overhead of the router is their difference. Policies: ``--policy NAME`` uses
``radixmeta.policies.create(NAME)`` when the built-in policies are installed; until then
the bench's own stand-ins below (``least_loaded``, ``cache_aware``, ``default``).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from radixmeta import MetaTree, Router, WorkerId
from radixmeta.policies.base import Choice, Request, View

PAGE = 16
WORKERS = 8
GROUPS = 64
PROMPT = 2048
PREFIX = 1536


# -- stand-in policies (until radixmeta.policies lands) ---------------------------------------
class LeastLoaded:
    """Fewest requests in flight (lowest position on ties)."""

    def choose(self, request: Request, view: View) -> WorkerId:
        r = view.requests
        return view.workers[r.index(min(r))]


class CacheAware:
    """The sgl-router cache_aware rule: balance when loads are skewed, else the longest
    match if it covers enough of the prompt, else the least loaded."""

    def __init__(self, threshold: float = 0.5, balance_abs: int = 32, balance_rel: float = 1.1):
        self.threshold, self.balance_abs, self.balance_rel = threshold, balance_abs, balance_rel

    def choose(self, request: Request, view: View) -> WorkerId | Choice:
        loads = view.requests
        low, high = min(loads), max(loads)
        if high - low > self.balance_abs and high > low * self.balance_rel:
            return Choice(view.workers[loads.index(low)], "balance", (("max", high), ("min", low)))
        lengths = view.lengths
        top = max(lengths)
        if top and top >= self.threshold * len(request.tokens):
            return view.workers[lengths.index(top)]
        return view.workers[loads.index(low)]


class Default:
    """A stand-in "default": the least estimated prefill work, uncached tokens plus the
    worker's queued prefill tokens."""

    def choose(self, request: Request, view: View) -> Choice:
        n = len(request.tokens)
        prefill = view.prefill_tokens
        costs = [n - length + queued for length, queued in zip(view.lengths, prefill, strict=True)]
        k = costs.index(min(costs))
        return Choice(view.workers[k], "least_prefill", (("cost", costs[k]),))


STAND_INS: dict[str, Callable[[], Any]] = {
    "least_loaded": LeastLoaded,
    "cache_aware": CacheAware,
    "default": Default,
}


def make_policy(name: str) -> tuple[Any, str]:
    """The built-in policy of that name if installed, else the stand-in; and which it is."""
    from radixmeta import policies

    create = getattr(policies, "create", None)
    if create is not None:
        return create(name), "built-in"
    return STAND_INS[name](), "stand-in"


# -- workloads ---------------------------------------------------------------------------------
def groups(seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50_000, PREFIX, dtype=np.uint32) for _ in range(GROUPS)]


def xorshift_text(seed: int) -> Callable[[int], bytes]:
    """The peer note's generator: xorshift64* over a 65-character alphabet."""
    alphabet = (
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,"
    )
    state = [seed]
    mask = (1 << 64) - 1

    def draw(n: int) -> bytes:
        x = state[0]
        out = bytearray(n)
        for i in range(n):
            x ^= x >> 12
            x ^= (x << 25) & mask
            x ^= x >> 27
            out[i] = alphabet[((x * 0x2545F4914F6CDD1D) & mask) % 65]
        state[0] = x
        return bytes(out)

    return draw


def shared_workload(n: int = 10_000) -> list[np.ndarray]:
    draw = xorshift_text(0x9E3779B97F4A7C15)
    prefixes = [draw(2000) for _ in range(100)]
    texts = [prefixes[i % 100] + draw(500) for i in range(n)]
    return [np.frombuffer(t, dtype=np.uint8).astype(np.uint32) + 1000 for t in texts]


# -- timing ------------------------------------------------------------------------------------
def median_us(samples: list[int]) -> float:
    return statistics.median(samples) / 1000


def warm_router(policy: Any, mode: str, prefixes: list[np.ndarray]) -> tuple[Router, list[Any]]:
    capacity = GROUPS * PROMPT // WORKERS * 4  # room for the warm tree and then some
    router = Router(PAGE, policy=policy, mode=mode)
    for i in range(WORKERS):
        router.add_worker(f"w{i}", capacity=capacity)
    rng = np.random.default_rng(1)
    warm = []
    for g in range(GROUPS):
        key = np.concatenate([prefixes[g], rng.integers(0, 50_000, PROMPT - PREFIX, np.uint32)])
        d = router.dispatch(key)
        if mode == "exact":  # what the replayer applies once the worker reports the pages
            router.tree.insert(key, d.worker)
        router.finish(d.request_id)
        warm.append(key)
    return router, warm


def fresh(prefixes: list[np.ndarray], suffixes: np.ndarray, k: int) -> np.ndarray:
    """Request k's prompt, made now (so it is in the CPU's caches, as a new prompt is)."""
    return np.concatenate([prefixes[k % GROUPS], suffixes[k % len(suffixes)]])


def time_dispatch(
    router: Router, prefixes: list[np.ndarray], warm: list[np.ndarray], n: int, repeat: bool
) -> list[int]:
    rng = np.random.default_rng(2)
    suffixes = rng.integers(0, 50_000, (512, PROMPT - PREFIX), dtype=np.uint32)
    clock = time.perf_counter_ns
    dispatch, finish = router.dispatch, router.finish
    out = []
    for k in range(n):
        key = warm[k % GROUPS] if repeat else fresh(prefixes, suffixes, k)
        t0 = clock()
        d = dispatch(key)
        out.append(clock() - t0)
        finish(d.request_id)
        # Free the finished request's record now, untimed: kept until the next
        # dispatch rebinds ``d``, its objects would be freed inside that timing.
        del d
    return out


def time_native(
    router: Router, prefixes: list[np.ndarray], warm: list[np.ndarray], n: int, repeat: bool
) -> list[int]:
    """The tree calls of a dispatch alone: match with a cursor, then the mark from it."""
    tree = router.tree
    workers = list(router.workers)
    rng = np.random.default_rng(2)
    suffixes = rng.integers(0, 50_000, (512, PROMPT - PREFIX), dtype=np.uint32)
    clock = time.perf_counter_ns
    exact = router.mode == "exact"
    out = []
    for k in range(n):
        key = warm[k % GROUPS] if repeat else fresh(prefixes, suffixes, k)
        w = workers[k % WORKERS]
        t0 = clock()
        m = tree.match(key, cursor=True)
        hold = m.hold(w) if exact else m.insert(w)
        out.append(clock() - t0)
        if exact:
            tree.release(hold)
        del m, hold  # as time_dispatch: not freed inside the next timing
    return out


def time_policy(router: Router, prefixes: list[np.ndarray], n: int = 20_000) -> float:
    """The policy's own choose on a warm request's view (median ns), for the row's context."""
    seen: list[tuple[Request, View]] = []
    inner = router.policy

    class Spy:
        def choose(self, request: Request, view: View) -> Any:
            seen.append((request, view))
            return inner.choose(request, view)

    router.policy = Spy()
    key = np.concatenate([prefixes[0], np.arange(PROMPT - PREFIX, dtype=np.uint32)])
    router.finish(router.dispatch(key).request_id)
    router.policy = inner
    request, view = seen[0]
    choose, clock = inner.choose, time.perf_counter_ns
    out = []
    for _ in range(n):
        t0 = clock()
        choose(request, view)
        out.append(clock() - t0)
    return statistics.median(out)


def time_batches(router: Router, prefixes: list[np.ndarray], n: int, size: int = 64) -> list[float]:
    """Per-request cost of dispatch_batch of ``size`` requests (8 groups of 8 prompts)."""
    rng = np.random.default_rng(3)
    clock = time.perf_counter_ns
    out = []
    for b in range(max(1, n // size)):
        batch = [
            np.concatenate([prefixes[(b * 8 + k // 8) % GROUPS],
                            rng.integers(0, 50_000, PROMPT - PREFIX, np.uint32)])
            for k in range(size)
        ]
        t0 = clock()
        decisions = router.dispatch_batch(batch)
        out.append((clock() - t0) / size)
        for d in decisions:
            router.finish(d.request_id)
        del decisions, d  # as time_dispatch: not freed inside the next timing
    return out


def time_shared(policy: Any, strings: Sequence[np.ndarray]) -> tuple[list[int], list[int]]:
    """The peer's route row: every string routed into one growing tree, in order."""
    router = Router(PAGE, policy=policy, mode="approximate")
    for i in range(WORKERS):
        router.add_worker(f"w{i}", capacity=2**40)
    clock = time.perf_counter_ns
    routed = []
    for key in strings:
        t0 = clock()
        d = router.dispatch(key)
        routed.append(clock() - t0)
        router.finish(d.request_id)
        del d  # as time_dispatch: not freed inside the next timing
    tree = MetaTree(PAGE)
    workers = [tree.add_worker(f"w{i}", capacity=2**40) for i in range(WORKERS)]
    native = []
    for i, key in enumerate(strings):
        t0 = clock()
        m = tree.match(key, cursor=True)
        m.insert(workers[i % WORKERS])
        native.append(clock() - t0)
        del m  # as time_dispatch: the match is freed outside the timing
    return routed, native


# -- main --------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", help="least_loaded, cache_aware, default")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="fewer requests and repeats")
    parser.add_argument("--no-shared", action="store_true", help="skip the peer's workload")
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args(argv)
    if args.quick:
        args.repeats, args.requests = 2, 1000
    names = args.policy or ["default", "least_loaded", "cache_aware"]
    prefixes = groups()
    rows: list[dict[str, Any]] = []
    print(f"Router.dispatch, {PROMPT}-token prompts, page {PAGE}, {WORKERS} workers, "
          f"{GROUPS} groups warm; medians of {args.repeats} runs of {args.requests} requests (us)")
    header = f"{'policy':<13}{'kind':<9}{'mode':<12}{'workload':<9}{'dispatch':>9}"
    header += f"{'native':>8}{'overhead':>9}{'policy':>8}{'batch/req':>10}"
    print(header)
    for name in names:
        for mode in ("exact", "approximate"):
            for workload in ("warm", "repeat"):
                runs: dict[str, list[float]] = {
                    "dispatch": [], "native": [], "batch": [], "choose": []
                }
                kind = ""
                for _ in range(args.repeats):
                    policy, kind = make_policy(name)
                    router, warm = warm_router(policy, mode, prefixes)
                    repeat = workload == "repeat"
                    gc.collect()
                    runs["dispatch"].append(
                        median_us(time_dispatch(router, prefixes, warm, args.requests, repeat))
                    )
                    runs["native"].append(
                        median_us(time_native(router, prefixes, warm, args.requests, repeat))
                    )
                    if workload == "warm":
                        per = time_batches(router, prefixes, args.requests // 4)
                        runs["batch"].append(statistics.median(per) / 1000)
                        runs["choose"].append(time_policy(router, prefixes) / 1000)
                    router.close()
                row = {k: statistics.median(v) for k, v in runs.items() if v}
                row.update(policy=name, kind=kind, mode=mode, workload=workload)
                rows.append(row)
                batch = f"{row['batch']:>10.2f}" if "batch" in row else f"{'':>10}"
                own = f"{row['choose']:>8.2f}" if "choose" in row else f"{'':>8}"
                print(f"{name:<13}{kind:<9}{mode:<12}{workload:<9}{row['dispatch']:>9.2f}"
                      f"{row['native']:>8.2f}{row['dispatch'] - row['native']:>9.2f}{own}{batch}")
    if not args.no_shared:
        strings = shared_workload(2000 if args.quick else 10_000)
        print(f"\nshared workload (sgl-router peer note 5.3): {len(strings)} strings of 2,500 "
              "tokens routed into one growing tree; mean and median per request (us)")
        for name in names:
            means, medians, native_means, native_medians = [], [], [], []
            for _ in range(args.repeats):
                policy, kind = make_policy(name)
                routed, native = time_shared(policy, strings)
                means.append(statistics.mean(routed) / 1000)
                medians.append(median_us(routed))
                native_means.append(statistics.mean(native) / 1000)
                native_medians.append(median_us(native))
            row = {
                "policy": name,
                "kind": kind,
                "workload": "shared",
                "dispatch_mean": statistics.median(means),
                "dispatch": statistics.median(medians),
                "native_mean": statistics.median(native_means),
                "native": statistics.median(native_medians),
            }
            rows.append(row)
            print(f"{name:<13}{kind:<9}dispatch mean {row['dispatch_mean']:.2f} median "
                  f"{row['dispatch']:.2f}; native match+insert mean {row['native_mean']:.2f} "
                  f"median {row['native']:.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
