"""SGLang's scheduling pass over the waiting queue, per tree cache and per answer of
``supports_fast_match_prefix()``.

Every scheduler step SGLang 0.5.23 calls ``SchedulePolicy.calc_priority`` on its
waiting queue. What that pass costs depends on the tree's
``supports_fast_match_prefix()``:

* **True**: under a cache-agnostic policy (``fcfs``, the default, and ``lpm`` or
  ``hrrn`` once the queue holds more than 128 requests, when SGLang falls back
  to ``fcfs``) it matches *every* waiting request against the tree each pass
  (``match_kv_cache``), so load reports see their matched tokens; it never
  touches the waiting prefixes;
* **False**: it matches nothing under those policies; under LRU it touches the
  first 128 waiting prefixes every 32nd pass (``touch_waiting_prefix``), so
  eviction spares what is about to run.

Under ``lpm`` with at most 128 waiting requests both answers match every request
(the policy needs the lengths), so the answer changes nothing there.

This script times ``calc_priority`` itself (SGLang's own ``SchedulePolicy``, real
``Req`` objects) in one process for: radixmeta's backend answering True, the same
answering False, SGLang's classic ``RadixCache`` and its default
``UnifiedRadixCache`` on the Rust core (both answer False). The tree first holds
``--docs`` shared documents of ``--shared`` tokens and ``--cached`` earlier
requests; each waiting prompt is a document plus unique tokens, ``--min`` to
``--max`` tokens long, so every match is a partial hit. Over ``--passes``
passes (after ``--warmup``; GC off) the table gives, in milliseconds, the
median pass, the median of the passes that touched the waiting prefixes (every
32nd, "-" where none did) and the mean pass (what a step pays on average);
``x default`` is that mean relative to ``UnifiedRadixCache``'s.

Run it where SGLang 0.5.23 is installed (bench/README.md, "SGLang peer")::

    PYTHONPATH=. $venv/bin/python bench/sglang_scheduling.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import sys
import time
import warnings
from array import array
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

import sglang_backend  # noqa: E402  (bench/, after the path is set)

TREES = ("radixmeta True", "radixmeta False", "classic", "unified")


def load() -> dict[str, Any]:
    s = sglang_backend.load()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.mem_cache.base_prefix_cache import InsertParams
        from sglang.srt.mem_cache.radix_cache import RadixCache

        from radixmeta.integrations.sglang.backend import RadixMetaPrefixCache

    class AnswersFalse(RadixMetaPrefixCache):  # type: ignore[misc]
        """The backend with the other answer, for the comparison only."""

        def supports_fast_match_prefix(self) -> bool:
            return False

    class AnswersTrue(RadixMetaPrefixCache):  # type: ignore[misc]
        def supports_fast_match_prefix(self) -> bool:
            return True

    s.update(
        SchedulePolicy=SchedulePolicy,
        InsertParams=InsertParams,
        RadixCache=RadixCache,
        AnswersFalse=AnswersFalse,
        AnswersTrue=AnswersTrue,
    )
    return s


def build(s: dict[str, Any], tree: str, page_size: int, pool: int, context: int) -> Any:
    rtp = s["ReqToTokenPool"](
        size=4, max_context_len=context, device="cpu", enable_memory_saver=False
    )
    params = s["CacheInitParams"](
        disable=False,
        req_to_token_pool=rtp,
        token_to_kv_pool_allocator=s["CountingAllocator"](pool, page_size),
        page_size=page_size,
        eviction_policy="lru",
        enable_kv_cache_events=False,
    )
    if tree == "unified":
        params.tree_components = (s["ComponentType"].FULL,)
        params.tree_core_backend = "rust"
        cache = s["UnifiedRadixCache"](params)
        assert type(cache.tree_core).__name__.startswith("Rust"), "not the Rust TreeCore"
    elif tree == "classic":
        cache = s["RadixCache"](params)
    else:
        cache = s["AnswersTrue" if tree.endswith("True") else "AnswersFalse"](params)
    return cache


def workload(args: argparse.Namespace, n: int) -> tuple[list[list[int]], list[list[int]]]:
    """(tree contents, waiting prompts): documents, earlier requests, then the queue."""
    rng = random.Random(args.seed)
    docs = [[rng.randrange(32000) for _ in range(args.shared)] for _ in range(args.docs)]
    cached = list(docs)
    for _ in range(args.cached):
        doc = docs[rng.randrange(len(docs))]
        cached.append(doc + [rng.randrange(32000) for _ in range(rng.randrange(64, 512))])
    waiting = []
    for _ in range(n):
        doc = docs[rng.randrange(len(docs))]
        size = rng.randrange(args.min, args.max + 1)
        waiting.append(doc + [rng.randrange(32000) for _ in range(size - len(doc))])
    return cached, waiting


def run(
    s: dict[str, Any], tree: str, policy: str, n: int, args: argparse.Namespace
) -> dict[str, Any]:
    cached, waiting = workload(args, n)
    cache = build(s, tree, args.page_size, args.pool, args.max + 8)
    torch = s["torch"]
    next_slot = args.page_size
    for tokens in cached:  # distinct slots: no duplicate for the unified tree to free
        m = cache.match_prefix(s["MatchPrefixParams"](key=s["RadixKey"](array("q", tokens))))
        have = m.device_prefix_len
        values = torch.arange(next_slot - have, next_slot - have + len(tokens), dtype=torch.int64)
        next_slot += len(tokens)
        cache.insert(s["InsertParams"](key=s["RadixKey"](array("q", tokens)), value=values))
    sched = s["SchedulePolicy"](
        policy,
        cache,
        enable_hierarchical_cache=False,
        enable_priority_scheduling=False,
        schedule_low_priority_values_first=False,
    )
    queue = [
        s["Req"](
            rid=str(i),
            origin_input_text="",
            origin_input_ids=array("q", tokens),
            sampling_params=s["SamplingParams"](max_new_tokens=16),
        )
        for i, tokens in enumerate(waiting)
    ]
    clock = time.perf_counter_ns
    times: list[int] = []
    touched: list[int] = []  # the passes that touched the waiting prefixes
    gc.collect()
    gc.disable()
    try:
        for i in range(args.warmup + args.passes):
            calls = sched._waiting_prefix_refresh_calls
            t0 = clock()
            sched.calc_priority(queue)
            t1 = clock()
            if i >= args.warmup:
                times.append(t1 - t0)
                # SGLang touches when its counter, advanced by this pass, was at 0 mod 32.
                if sched._waiting_prefix_refresh_calls != calls and calls % 32 == 0:
                    touched.append(t1 - t0)
    finally:
        gc.enable()
    matched = sum(int(getattr(r, "num_matched_prefix_tokens", 0) or 0) for r in queue)
    return {
        "tree": tree,
        "policy": policy,
        "waiting": n,
        "median_ms": statistics.median(times) / 1e6,
        "touch_median_ms": statistics.median(touched) / 1e6 if touched else None,
        "touch_passes": len(touched),
        "mean_ms": statistics.fmean(times) / 1e6,
        "matched_tokens_seen": matched,
        "answer": bool(cache.supports_fast_match_prefix()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--waiting", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--policies", nargs="+", default=["fcfs", "lpm"])
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--shared", type=int, default=768)
    ap.add_argument("--cached", type=int, default=64)
    ap.add_argument("--min", type=int, default=1024)
    ap.add_argument("--max", type=int, default=4096)
    ap.add_argument("--pool", type=int, default=1 << 22)
    ap.add_argument("--passes", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    s = load()
    s["set_server_args"](s["ServerArgs"](model_path="dummy", page_size=args.page_size))
    results = []
    for policy in args.policies:
        for n in args.waiting:
            for tree in TREES:
                r = run(s, tree, policy, n, args)
                results.append(r)
                print(f"  {policy} {n} {tree}: {r['median_ms']:.3f} ms", file=sys.stderr)
    print(
        f"SGLang {s['version']} calc_priority, page {args.page_size}, "
        f"{args.min}-{args.max}-token prompts: ms per pass (median)"
    )
    print(
        f"{'policy':<7}{'waiting':>8}  {'tree (answer)':<17}{'median':>9}{'touch':>9}"
        f"{'mean':>9}{'x default':>11}"
    )
    by = {(r["policy"], r["waiting"], r["tree"]): r for r in results}
    for policy in args.policies:
        for n in args.waiting:
            base = by[(policy, n, "unified")]["mean_ms"]
            for tree in TREES:
                r = by[(policy, n, tree)]
                name = tree if tree.startswith("radixmeta") else f"{tree} ({r['answer']})"
                ratio = r["mean_ms"] / base if base else float("nan")
                touch = "-" if r["touch_median_ms"] is None else f"{r['touch_median_ms']:.3f}"
                print(
                    f"{policy:<7}{n:>8}  {name:<17}{r['median_ms']:>9.3f}{touch:>9}"
                    f"{r['mean_ms']:>9.3f}{ratio:>10.1f}x"
                )
    if args.json:
        meta = {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "sglang": s["version"],
            "torch": s["torch"].__version__,
            "loadavg": os.getloadavg(),
            "commit": sglang_backend._commit(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
