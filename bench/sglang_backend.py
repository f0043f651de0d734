"""The SGLang backend against SGLang's UnifiedRadixCache (Rust core), per scheduler operation.

Both caches run the same scheduler-shaped loop, in one process, on SGLang's
real CPU ``ReqToTokenPool`` and a KV allocator whose frees only count (the
stock CPU allocator concatenates its whole free list on every free, which
would swamp the caches' own cost). For each request:

1. ``match``: ``match_prefix`` of the prompt, capped one token short (as
   ``init_next_round_input`` asks);
2. ``lock``: ``lock`` of the matched node;
3. ``prefix``: ``prefix_device_indices`` (the matched slots, read at allocation);
4. ``evict``: the allocator makes room (``evict_to_free_tokens``, which evicts
   from the tree when the pool is short); the allocation and the row writes
   that follow are the scheduler's own torch calls, the same for both caches,
   and are not timed;
5. ``checkpoint``: ``checkpoint`` at the end of the prompt, while the request
   runs (a chunked prefill's end);
6. ``release``: ``release_kv_cache(req, tree, checkpoint=True)`` after the
   outputs: the final checkpoint, the row's frees, the unlock;
7. ``events``: ``take_events()``, as the scheduler's publisher drains it every
   step (nothing to do unless ``--kv-events``).

Each operation is timed on its own with ``perf_counter_ns`` (GC off); the table
gives the median per call in microseconds and the sum of the medians per
request, for both caches and their ratio. Workload: ``--docs`` shared documents
of ``--shared`` tokens; each request is a document plus unique tokens up to a
``--prompt``-token prompt, and ``--outputs`` output tokens; the pool holds
``--pool`` tokens, so the allocator evicts as it fills.

Run it where SGLang 0.5.23 is installed (bench/README.md, "SGLang peer")::

    PYTHONPATH=. /work/venv-sgl/bin/python bench/sglang_backend.py --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import statistics
import subprocess
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

OPS = ("match", "lock", "prefix", "evict", "checkpoint", "release", "events")


def load() -> dict[str, Any]:
    import _torchvision_shim

    _torchvision_shim.install()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import sglang
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import release_kv_cache
        from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixKey
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    class CountingAllocator(TokenToKVPoolAllocator):  # type: ignore[misc]
        """Hands out fresh slot ranges and counts frees: the pool is simulated, not kept."""

        def __init__(self, size: int, page_size: int) -> None:  # no super(): no pool to build
            self.size = size
            self.page_size = page_size
            self.dtype = torch.float16
            self.device = "cpu"
            self._kvcache = None
            self.need_sort = False
            self.free_group = None
            self.free_pages = None
            self.release_pages = None
            self.live = 0
            self.next_slot = page_size  # slot 0 is SGLang's padding slot

        def available_size(self) -> int:
            return self.size - self.live

        def alloc(self, need_size: int) -> Any:
            if need_size > self.available_size():
                return None
            start = self.next_slot
            self.next_slot += need_size
            self.live += need_size
            return torch.arange(start, start + need_size, dtype=torch.int64)

        def free(self, free_index: Any) -> None:
            self.live -= int(free_index.numel())

        def free_segment(self, free_index: Any, *, start_pos: int) -> None:
            n = int(free_index.numel())
            ps = self.page_size
            self.live -= -(-n // ps) * ps  # the whole last page goes back

    return {
        "version": sglang.__version__,
        "torch": torch,
        "FINISH_LENGTH": FINISH_LENGTH,
        "Req": Req,
        "MatchPrefixParams": MatchPrefixParams,
        "CacheInitParams": CacheInitParams,
        "release_kv_cache": release_kv_cache,
        "ReqToTokenPool": ReqToTokenPool,
        "RadixKey": RadixKey,
        "ComponentType": ComponentType,
        "UnifiedRadixCache": UnifiedRadixCache,
        "SamplingParams": SamplingParams,
        "ServerArgs": ServerArgs,
        "set_server_args": set_global_server_args_for_scheduler,
        "CountingAllocator": CountingAllocator,
    }


def build(
    s: dict[str, Any], kind: str, page_size: int, pool: int, context: int, events: bool
) -> Any:
    rtp = s["ReqToTokenPool"](
        size=4, max_context_len=context, device="cpu", enable_memory_saver=False
    )
    alloc = s["CountingAllocator"](pool, page_size)
    params = s["CacheInitParams"](
        disable=False,
        req_to_token_pool=rtp,
        token_to_kv_pool_allocator=alloc,
        page_size=page_size,
        eviction_policy="lru",
        enable_kv_cache_events=events,
    )
    if kind == "unified":
        params.tree_components = (s["ComponentType"].FULL,)
        params.tree_core_backend = "rust"
        cache = s["UnifiedRadixCache"](params)
        assert type(cache.tree_core).__name__.startswith("Rust"), "not the Rust TreeCore"
        return cache
    from radixmeta.integrations.sglang import create_cache
    from radixmeta.integrations.sglang.backend import RadixMetaPrefixCache

    cache = RadixMetaPrefixCache(params)
    assert create_cache is not None
    return cache


def workload(args: argparse.Namespace) -> list[tuple[list[int], list[int]]]:
    rng = random.Random(args.seed)
    docs = [[rng.randrange(32000) for _ in range(args.shared)] for _ in range(args.docs)]
    out = []
    for _ in range(args.requests):
        doc = docs[rng.randrange(len(docs))]
        prompt = doc + [rng.randrange(32000) for _ in range(args.prompt - len(doc))]
        outputs = [rng.randrange(32000) for _ in range(args.outputs)]
        out.append((prompt, outputs))
    return out


def run(s: dict[str, Any], kind: str, page_size: int, args: argparse.Namespace) -> dict[str, Any]:
    context = args.prompt + args.outputs + 8
    cache = build(s, kind, page_size, args.pool, context, args.kv_events)
    rtp = cache.req_to_token_pool
    alloc = cache.token_to_kv_pool_allocator
    Req, SP, MP, RK = s["Req"], s["SamplingParams"], s["MatchPrefixParams"], s["RadixKey"]
    finish, release = s["FINISH_LENGTH"], s["release_kv_cache"]
    clock = time.perf_counter_ns
    samples: dict[str, list[int]] = {op: [] for op in OPS}
    hits = 0
    reqs = workload(args)
    gc.collect()
    gc.disable()
    try:
        for i, (prompt, outputs) in enumerate(reqs):
            timed = i >= args.warmup
            req = Req(
                rid=str(i),
                origin_input_text="",
                origin_input_ids=array("q", prompt),
                sampling_params=SP(max_new_tokens=len(outputs)),
            )
            rtp.alloc([req])
            req.refresh_fill_ids()
            fill = req.full_untruncated_fill_ids
            key = RK(fill, None, limit=len(fill) - 1, cache_salt=None)

            t0 = clock()
            m = cache.match_prefix(MP(key=key, req=req))
            t1 = clock()
            req.prefix_len = m.device_prefix_len
            req.last_node = m.last_device_node
            req.kv.cache_protected_len = req.prefix_len
            req.lock = cache.lock(req.last_node)
            t2 = clock()
            prefix = cache.prefix_device_indices(req)
            t3 = clock()
            total = len(prompt) + len(outputs)
            need = -(-(total - req.prefix_len) // page_size) * page_size
            alloc.evict_to_free_tokens(cache, need)
            t4 = clock()
            # The allocation itself and the row writes are the scheduler's, not
            # the cache's (the same torch calls for both): not timed.
            slots = alloc.alloc(need)
            assert slots is not None, "pool too small for one request"
            row = req.kv.req_pool_idx
            rtp.write((row, slice(0, req.prefix_len)), prefix)
            rtp.write((row, slice(req.prefix_len, total)), slots[: total - req.prefix_len])
            req.kv.kv_committed_len = req.kv.kv_allocated_len = len(prompt)
            req.extend_end = len(prompt)
            t4c = clock()
            cache.checkpoint(req, up_to=len(prompt))
            t5 = clock()
            req.prefix_len = req.extend_end
            for t in outputs:
                req.output_ids.append(t)
            req.kv.kv_committed_len = req.kv.kv_allocated_len = total
            req.finished_reason = finish(length=len(outputs))
            t6 = clock()
            release(req, cache, checkpoint=True)
            t7 = clock()
            cache.take_events()  # a scheduler step drains the queue (empty without events)
            t8 = clock()
            hits += m.device_prefix_len
            if timed:
                for op, (a, b) in zip(
                    OPS, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t4c, t5), (t6, t7), (t7, t8)),
                    strict=True,
                ):
                    samples[op].append(b - a)
    finally:
        gc.enable()
    med = {op: statistics.median(v) / 1e3 for op, v in samples.items()}
    return {
        "kind": kind,
        "page_size": page_size,
        "median_us": med,
        "request_us": sum(med.values()),
        "mean_request_us": sum(sum(v) for v in samples.values()) / len(samples["match"]) / 1e3,
        "hit_tokens": hits,
        "evictable": int(cache.evictable_size()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[16, 1])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--shared", type=int, default=1536)
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--outputs", type=int, default=64)
    ap.add_argument("--pool", type=int, default=65536)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--kv-events", action="store_true", help="KV events on, drained after every request"
    )
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    s = load()
    results: list[dict[str, Any]] = []
    for page_size in args.page_sizes:
        s["set_server_args"](s["ServerArgs"](model_path="dummy", page_size=page_size))
        for kind in ("radixmeta", "unified"):
            runs = [run(s, kind, page_size, args) for _ in range(args.repeats)]
            best = min(runs, key=lambda r: r["request_us"])  # least disturbed by other jobs
            best["repeats_request_us"] = [r["request_us"] for r in runs]
            results.append(best)
            print(f"  {kind} p={page_size}: {best['request_us']:.1f} us/request", file=sys.stderr)
    header = f"{'page':>4} {'cache':<10}" + "".join(f"{op:>11}" for op in OPS) + f"{'request':>11}"
    print(f"SGLang {s['version']} backend loop, {args.prompt}-token prompts, us per call (median)")
    print(header)
    by = {(r["page_size"], r["kind"]): r for r in results}
    for page_size in args.page_sizes:
        rm, un = by[(page_size, "radixmeta")], by[(page_size, "unified")]
        assert rm["hit_tokens"] == un["hit_tokens"], "the two caches matched differently"
        for r in (rm, un):
            cells = "".join(f"{r['median_us'][op]:>11.1f}" for op in OPS)
            print(f"{page_size:>4} {r['kind']:<10}{cells}{r['request_us']:>11.1f}")
        ratio = "".join(f"{un['median_us'][op] / rm['median_us'][op]:>10.1f}x" for op in OPS)
        print(f"{page_size:>4} {'speedup':<10}{ratio}{un['request_us'] / rm['request_us']:>10.1f}x")
    if args.json:
        meta = {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "sglang": s["version"],
            "torch": s["torch"].__version__,
            "loadavg": os.getloadavg(),
            "commit": _commit(),
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))
    return 0


def _commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=HERE, check=True
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.stdout.strip()


if __name__ == "__main__":
    raise SystemExit(main())
