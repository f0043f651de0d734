"""``radixmeta demo``: a short demonstration of RadixCache and MetaTree with timings.

Part one plays one worker's serving loop over a synthetic workload of requests
that share system prompts and few-shot blocks: match the longest cached prefix,
lock it while the request "runs", store the new tokens (freeing duplicate
slots), and evict when the KV pool is full. It prints the hit rate, the
per-operation latency and the memory the tree uses.

Part two serves the same requests with a data-parallel fleet of workers, each
with its own RadixCache, behind a router whose MetaTree models every worker's
cache (approximate mode: no events, the router evicts on each worker's
behalf). It compares round-robin with cache-aware routing.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from radixmeta import MetaTree, RadixCache, implementation


def _workload(seed: int, requests: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    systems = [rng.integers(0, 32000, 512, dtype=np.uint32) for _ in range(20)]
    shots = [rng.integers(0, 32000, 128, dtype=np.uint32) for _ in range(50)]
    out = []
    for _ in range(requests):
        question = rng.integers(0, 32000, int(rng.integers(32, 256)), dtype=np.uint32)
        system = systems[int(rng.zipf(1.5)) % len(systems)]
        out.append(np.concatenate([system, shots[int(rng.integers(0, len(shots)))], question]))
    return out


class _Worker:
    """One data-parallel worker: a RadixCache over its own KV pool."""

    def __init__(self, pool: int, page_size: int) -> None:
        # Capacity mode: the cache evicts for itself and hands what it frees to
        # on_evict after each insert; an engine returns those slots to its pool.
        self.evicted = 0
        self.cache = RadixCache(page_size=page_size, capacity=pool, on_evict=self._freed)
        self.load = 0  # requests routed here: the balance guard of cache-aware routing

    def _freed(self, slots: np.ndarray) -> None:
        self.evicted += len(slots)

    def serve(self, tokens: np.ndarray) -> int:
        """Match, then cache the prompt (capacity mode evicts); returns the hit tokens."""
        hit = self.cache.match_prefix(tokens).length
        self.cache.insert(tokens)
        self.load += 1
        return hit


def _fleet(
    requests: list[np.ndarray], args: argparse.Namespace, policy: str
) -> tuple[float, float, list[int]]:
    """Serve requests on args.workers workers.

    Returns the hit rate, the router's microseconds per request and the
    requests each worker served.
    """
    pool = args.pool // args.workers  # the same KV memory as part one, split
    workers = [_Worker(pool, args.page_size) for _ in range(args.workers)]
    tree = MetaTree(page_size=args.page_size)
    ids = [tree.add_worker(f"worker-{i}", capacity=pool) for i in range(args.workers)]
    hits = total = 0
    router_ns = 0
    served = [0] * len(workers)
    clock = time.perf_counter_ns
    for i, tokens in enumerate(requests):
        t = clock()
        if policy == "round-robin":
            choice = i % len(workers)
        else:
            # Longest cached prefix wins, unless that worker is already far
            # busier than the least loaded one (the sgl-router's balance rule).
            # Among equally long matches (every worker, for a cold prompt) the
            # least loaded wins, so cold prompts spread over the fleet.
            lengths = tree.match(tokens, touch=True).lengths
            least = min(range(len(workers)), key=lambda w: workers[w].load)
            longest = int(lengths.max())
            tied = [w for w in range(len(workers)) if lengths[w] == longest]
            best = min(tied, key=lambda w: workers[w].load)
            choice = best if workers[best].load <= workers[least].load + 32 else least
        tree.insert(tokens, ids[choice])
        router_ns += clock() - t
        hits += workers[choice].serve(tokens)
        served[choice] += 1
        total += len(tokens)
        if i % 64 == 63:  # requests finish: the balance guard looks at recent load
            for w in workers:
                w.load = max(0, w.load - 16)
    tree.check()
    return hits / total, router_ns / len(requests) / 1000, served


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="radixmeta demo", description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=20_000, help="requests to serve")
    parser.add_argument("--pool", type=int, default=400_000, help="KV pool size in tokens")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=4, help="data-parallel workers in part two")
    args = parser.parse_args(argv)

    print(f"radixmeta RadixCache demo ({implementation} core), page_size={args.page_size}, "
          f"KV pool {args.pool:,} tokens, {args.requests:,} requests")
    requests = _workload(args.seed, args.requests)
    cache = RadixCache(page_size=args.page_size)
    free_slots = list(range(args.pool))  # a toy KV allocator: a stack of free slot ids
    timings = {"match_prefix": 0, "lock+unlock": 0, "insert": 0, "evict": 0}
    counts = dict.fromkeys(timings, 0)
    prompt_tokens = hit_tokens = 0
    clock = time.perf_counter_ns
    started = clock()
    for i, tokens in enumerate(requests):
        t = clock()
        match = cache.match_prefix(tokens)
        timings["match_prefix"] += clock() - t
        counts["match_prefix"] += 1
        t = clock()
        cache.lock(match.node)
        timings["lock+unlock"] += clock() - t
        prompt_tokens += len(tokens)
        hit_tokens += match.length
        need = len(tokens) - match.length
        if need > len(free_slots):
            t = clock()
            freed = cache.evict(need - len(free_slots))
            timings["evict"] += clock() - t
            counts["evict"] += 1
            assert freed.values is not None  # this cache keeps values (None only without)
            free_slots.extend(freed.values.tolist())
        if need > len(free_slots):
            print(f"request {i}: KV pool too small for {need} tokens", file=sys.stderr)
            cache.unlock(match.node)
            continue
        new_slots = np.array(free_slots[len(free_slots) - need :], dtype=np.int64)
        del free_slots[len(free_slots) - need :]
        values = np.concatenate([match.values, new_slots])
        t = clock()
        already = cache.insert(tokens, values)
        timings["insert"] += clock() - t
        counts["insert"] += 1
        # The cache already held tokens[match.length:already] (another path
        # stored them meanwhile): give those duplicate slots back.
        free_slots.extend(values[match.length : already].tolist())
        uncached = len(tokens) - len(tokens) % args.page_size
        free_slots.extend(values[uncached:].tolist())
        t = clock()
        cache.unlock(match.node)
        timings["lock+unlock"] += clock() - t
        counts["lock+unlock"] += 1
    elapsed = (clock() - started) / 1e9
    cache.check()

    print(f"served in {elapsed:.2f} s; prefix hit rate {hit_tokens / prompt_tokens:.1%} "
          f"({hit_tokens:,} of {prompt_tokens:,} prompt tokens)")
    print(f"{'operation':<14}{'calls':>10}{'mean':>12}")
    for name, total in timings.items():
        calls = counts[name]
        mean = f"{total / calls / 1000:.2f} us" if calls else "-"
        print(f"{name:<14}{calls:>10,}{mean:>12}")
    print(f"tree: {cache.node_count:,} nodes, {cache.total_size:,} tokens cached, "
          f"{cache.memory_usage() / 2**20:.1f} MiB")

    print(f"\ndata-parallel fleet: {args.workers} workers sharing the {args.pool:,}-token pool, "
          "one MetaTree router (approximate mode)")
    print(f"{'routing':<14}{'hit rate':>10}{'router':>14}   requests per worker")
    for policy in ("round-robin", "cache-aware"):
        rate, router_us, served = _fleet(requests, args, policy)
        spread = " ".join(f"{n:,}" for n in served)
        print(f"{policy:<14}{rate:>10.1%}{router_us:>11.2f} us   {spread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
