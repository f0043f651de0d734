"""Benchmark Router.dispatch and dispatch_batch from Python (not part of the test suite).

Run: ``python bench/bench_router.py`` (``--quick`` for a short run, ``--policy NAME`` for
one policy, ``--json out.json`` to keep every number, ``--cpu`` to time with the thread's
CPU clock on a loaded machine). Set ``OPENBLAS_NUM_THREADS=1`` on a
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

* ``token forms``: the warm workload's dispatch with the prompt held as a uint32, int32
  or int64 array or a list (what a tokenizer returns), converted untimed just before;
  each request is sent once in every form, in turn (interleaved, so each form's ratio
  to uint32 is measured on the same router state and the same load; ``--only forms``).
* ``N workers`` (``--wide``, default 1,024): the warm workload on a wide fleet, dispatch
  against dispatch_batch per request.

For every row of the first table the same run also times the native calls alone
(``MetaTree.match(..., cursor=True)`` and the mark from it, on a copy of the same tree
state), so the Python overhead of the router is their difference. Policies: the
built-in ones, ``radixmeta.policies.create(NAME)`` (``--policy NAME``, repeatable).
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

from radixmeta import MetaTree, Router, policies
from radixmeta.policies.base import Request, View

PAGE = 16
WORKERS = 8
GROUPS = 64
#: The clock every timing reads: the wall clock, or with ``--cpu`` this thread's CPU
#: time (on a loaded machine a batch's tens of milliseconds are likely to include a
#: preemption that a 20 us dispatch escapes, which skews a wall-clock median).
CLOCK: list[Callable[[], int]] = [time.perf_counter_ns]
PROMPT = 2048
PREFIX = 1536


def make_policy(name: str) -> Any:
    """The built-in policy of that name."""
    return policies.create(name)


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


def warm_router(
    policy: Any, mode: str, prefixes: list[np.ndarray], workers: int = WORKERS
) -> tuple[Router, list[Any]]:
    capacity = GROUPS * PROMPT // min(workers, GROUPS) * 4  # room for the warm tree and more
    router = Router(PAGE, policy=policy, mode=mode)
    for i in range(workers):
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


#: How a caller may hold a prompt (the token-form rows): what a tokenizer returns is a list.
FORMS: dict[str, Callable[[np.ndarray], Any]] = {
    "uint32": lambda key: key,
    "int32": lambda key: key.astype(np.int32),
    "int64": lambda key: key.astype(np.int64),
    "list": lambda key: key.tolist(),
}


def time_dispatch(
    router: Router,
    prefixes: list[np.ndarray],
    warm: list[np.ndarray],
    n: int,
    repeat: bool,
    form: str = "uint32",
) -> list[int]:
    rng = np.random.default_rng(2)
    suffixes = rng.integers(0, 50_000, (512, PROMPT - PREFIX), dtype=np.uint32)
    clock = CLOCK[0]
    dispatch, finish = router.dispatch, router.finish
    convert = FORMS[form]
    out = []
    for k in range(n):
        # The prompt in its form, made (untimed) just before its dispatch.
        key = convert(warm[k % GROUPS] if repeat else fresh(prefixes, suffixes, k))
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
    clock = CLOCK[0]
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
    choose, clock = inner.choose, CLOCK[0]
    out = []
    for _ in range(n):
        t0 = clock()
        choose(request, view)
        out.append(clock() - t0)
    return statistics.median(out)


def time_batches(router: Router, prefixes: list[np.ndarray], n: int, size: int = 64) -> list[float]:
    """Per-request cost of dispatch_batch of ``size`` requests (8 groups of 8 prompts)."""
    rng = np.random.default_rng(3)
    clock = CLOCK[0]
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
    clock = CLOCK[0]
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


def time_forms(
    router: Router, prefixes: list[np.ndarray], n: int, forms: Sequence[str]
) -> dict[str, list[int]]:
    """Dispatch of the warm workload with each request sent once in every form, in turn
    (A/B interleaved: the forms see the same router state and the same moments of the
    machine's load, so their ratios are fair on a shared machine)."""
    rng = np.random.default_rng(2)
    suffixes = rng.integers(0, 50_000, (512, PROMPT - PREFIX), dtype=np.uint32)
    clock = CLOCK[0]
    dispatch, finish = router.dispatch, router.finish
    out: dict[str, list[int]] = {form: [] for form in forms}
    for k in range(n):
        key = fresh(prefixes, suffixes, k)
        for j in range(len(forms)):
            form = forms[(k + j) % len(forms)]  # rotate who goes first (caches, tree state)
            prompt = FORMS[form](key)  # made, untimed, just before its dispatch
            t0 = clock()
            d = dispatch(prompt)
            out[form].append(clock() - t0)
            finish(d.request_id)
            del d, prompt  # freed now, untimed (see time_dispatch)
    return out


def forms_table(
    names: Sequence[str], prefixes: list[np.ndarray], repeats: int, requests: int
) -> list[dict[str, Any]]:
    """Dispatch of the warm workload (exact mode) with the prompt in each of FORMS."""
    forms = list(FORMS)
    print(f"\ntoken forms: dispatch (exact, warm, {WORKERS} workers) of a {PROMPT}-token prompt\n"
          "held as each form, the forms interleaved request by request; medians (us), and\n"
          "each form's ratio to uint32 (the median of the runs' ratios)")
    print(f"{'policy':<13}" + "".join(f"{form:>8}" for form in forms)
          + "".join(f"{'/' + form:>8}" for form in forms[1:]))
    rows = []
    for name in names:
        runs: dict[str, list[float]] = {form: [] for form in forms}
        ratios: dict[str, list[float]] = {form: [] for form in forms}
        for _ in range(repeats):
            router, _warm = warm_router(make_policy(name), "exact", prefixes)
            gc.collect()
            samples = time_forms(router, prefixes, requests, forms)
            router.close()
            medians = {form: median_us(v) for form, v in samples.items()}
            for form in forms:
                runs[form].append(medians[form])
                ratios[form].append(medians[form] / medians["uint32"])
        medians = {form: statistics.median(v) for form, v in runs.items()}
        ratio = {form: statistics.median(v) for form, v in ratios.items()}
        for form in forms:
            rows.append({"policy": name, "mode": "exact", "workload": "warm", "form": form,
                         "dispatch": medians[form], "ratio_to_uint32": ratio[form]})
        print(f"{name:<13}" + "".join(f"{medians[f]:>8.2f}" for f in forms)
              + "".join(f"{ratio[f]:>8.2f}" for f in forms[1:]))
    return rows


def wide_table(
    names: Sequence[str], prefixes: list[np.ndarray], repeats: int, requests: int, workers: int
) -> list[dict[str, Any]]:
    """Dispatch and dispatch_batch per request on a wide fleet (exact, warm)."""
    n = max(64, requests // 5)  # a wide fleet's dispatch costs ~10x: fewer requests
    print(f"\n{workers:,} workers: dispatch, and dispatch_batch of 64 per request (exact, warm:\n"
          f"{GROUPS} groups); medians of {repeats} runs of {n} requests (us)")
    print(f"{'policy':<13}{'dispatch':>10}{'batch/req':>11}{'batch/dispatch':>16}")
    rows = []
    for name in names:
        dispatch: list[float] = []
        batched: list[float] = []
        for _ in range(repeats):
            router, warm = warm_router(make_policy(name), "exact", prefixes, workers)
            gc.collect()
            dispatch.append(median_us(time_dispatch(router, prefixes, warm, n, False)))
            batched.append(statistics.median(time_batches(router, prefixes, n)) / 1000)
            router.close()
        row = {"policy": name, "mode": "exact", "workload": "warm", "workers": workers,
               "dispatch": statistics.median(dispatch), "batch": statistics.median(batched)}
        rows.append(row)
        print(f"{name:<13}{row['dispatch']:>10.2f}{row['batch']:>11.2f}"
              f"{row['batch'] / row['dispatch']:>16.2f}")
    return rows


# -- main --------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", action="append", help="least_loaded, cache_aware, default")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="fewer requests and repeats")
    parser.add_argument("--no-shared", action="store_true", help="skip the peer's workload")
    parser.add_argument("--no-forms", action="store_true", help="skip the token-form rows")
    parser.add_argument("--only", choices=["forms", "wide"],
                        help="only the token-form rows, or only the wide rows")
    parser.add_argument(
        "--wide", type=int, default=1024, metavar="N",
        help="workers of the wide rows (dispatch and batch per request); 0 skips them",
    )
    parser.add_argument("--cpu", action="store_true",
                        help="time with this thread's CPU clock instead of the wall clock")
    parser.add_argument("--json", help="write every number here")
    args = parser.parse_args(argv)
    if args.cpu:
        CLOCK[0] = time.thread_time_ns
    if args.quick:
        args.repeats, args.requests = 2, 1000
    names = args.policy or ["default", "least_loaded", "cache_aware"]
    prefixes = groups()
    rows: list[dict[str, Any]] = []
    print(f"Router.dispatch, {PROMPT}-token prompts, page {PAGE}, {WORKERS} workers, "
          f"{GROUPS} groups warm;\nmedians of {args.repeats} runs of {args.requests} requests (us)")
    if args.only == "forms":
        rows += forms_table(names, prefixes, args.repeats, args.requests)
        return _write(args.json, rows)
    if args.only == "wide":
        rows += wide_table(names, prefixes, args.repeats, args.requests, args.wide or 1024)
        return _write(args.json, rows)
    header = f"{'policy':<13}{'mode':<12}{'workload':<9}{'dispatch':>9}"
    header += f"{'native':>8}{'overhead':>9}{'policy':>8}{'batch/req':>10}"
    print(header)
    for name in names:
        for mode in ("exact", "approximate"):
            for workload in ("warm", "repeat"):
                runs: dict[str, list[float]] = {
                    "dispatch": [], "native": [], "batch": [], "choose": []
                }
                for _ in range(args.repeats):
                    policy = make_policy(name)
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
                row.update(policy=name, mode=mode, workload=workload)
                rows.append(row)
                batch = f"{row['batch']:>10.2f}" if "batch" in row else f"{'':>10}"
                own = f"{row['choose']:>8.2f}" if "choose" in row else f"{'':>8}"
                print(f"{name:<13}{mode:<12}{workload:<9}{row['dispatch']:>9.2f}"
                      f"{row['native']:>8.2f}{row['dispatch'] - row['native']:>9.2f}{own}{batch}")
    if not args.no_forms:
        rows += forms_table(names, prefixes, args.repeats, args.requests)
    if args.wide:
        rows += wide_table(names, prefixes, args.repeats, args.requests, args.wide)
    if not args.no_shared:
        strings = shared_workload(2000 if args.quick else 10_000)
        print(f"\nshared workload (sgl-router peer note 5.3): {len(strings)} strings of 2,500\n"
              "tokens routed into one growing tree; mean and median per request (us);\n"
              "native: the MetaTree's match and insert alone")
        print(f"{'policy':<13}{'mean':>10}{'median':>10}{'native':>10}{'median':>10}")
        for name in names:
            means, medians, native_means, native_medians = [], [], [], []
            for _ in range(args.repeats):
                policy = make_policy(name)
                routed, native = time_shared(policy, strings)
                means.append(statistics.mean(routed) / 1000)
                medians.append(median_us(routed))
                native_means.append(statistics.mean(native) / 1000)
                native_medians.append(median_us(native))
            row = {
                "policy": name,
                "workload": "shared",
                "dispatch_mean": statistics.median(means),
                "dispatch": statistics.median(medians),
                "native_mean": statistics.median(native_means),
                "native": statistics.median(native_medians),
            }
            rows.append(row)
            print(f"{name:<13}{row['dispatch_mean']:>10.2f}{row['dispatch']:>10.2f}"
                  f"{row['native_mean']:>10.2f}{row['native']:>10.2f}")
    return _write(args.json, rows)


def _write(path: str | None, rows: list[dict[str, Any]]) -> int:
    """Every number, as JSON, where ``--json`` asks."""
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
