#!/usr/bin/env python3
"""The event log's cost on RadixCache.insert and evict, and the replay of 1M records.

Part one times, in one run and interleaved, workload (a) of ``bench/compare.py``
(two-level prompts: shared system prompts, then per-request suffixes) on three
caches: no log, a token-path log, a block-form log. It inserts every sequence,
then evicts everything in chunks of 4,096 tokens, and reports each phase's
throughput with a log as a share of the throughput without (the target: at
least 70 %). Reading the records (which makes the Python objects) is timed
apart: it happens on the router's schedule, not in the cache's operation.

Part two replays 1M records: a worker's cache produces them in batches, a
Replayer applies them to a MetaTree batch by batch, and the process RSS is read
every 10 % to show that memory stays bounded (the log is a ring; the replayer
holds only what is pending).

Usage::

    python bench/eventlog.py                  # page sizes 1 and 16, 1M replayed records
    python bench/eventlog.py --quick --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import workloads

from radixmeta import EventLog, MetaTree, RadixCache, implementation
from radixmeta.events import Replayer

EVICT_CHUNK = 4096
MAX_TOKENS = int(os.environ.get("RING_TOKENS", 2**22))  # the EventLog default


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _one_pass(cache: RadixCache, sequences: list[np.ndarray]) -> dict[str, float]:
    """Insert every sequence, then evict everything (the cache ends empty, ready again)."""
    log = cache.event_log
    seen = log.next_seq - 1 if log is not None else None
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter()
        insert = cache.insert
        for seq in sequences:
            insert(seq)
        t1 = time.perf_counter()
        while cache.evict(EVICT_CHUNK).count:
            pass
        t2 = time.perf_counter()
    finally:
        gc.enable()
    out = {"insert_s": t1 - t0, "evict_s": t2 - t1}
    if log is not None:
        t3 = time.perf_counter()
        records = log.read(after=max(seen, log.oldest_seq - 1))
        out["read_s"] = time.perf_counter() - t3
        out["records"] = len(records)
    return out


def cost(sequences: list[np.ndarray], page: int, repeats: int) -> dict[str, Any]:
    # One long-lived cache per variant, as in a server: the warm-up pass brings
    # every variant's memory (tree, arena, ring) to its steady state first.
    caches = {
        "none": RadixCache(page),
        "path": RadixCache(page, event_log=EventLog(worker="w", max_tokens=MAX_TOKENS)),
        "blocks": RadixCache(
            page, event_log=EventLog(form="blocks", worker="w", max_tokens=MAX_TOKENS)
        ),
    }
    for cache in caches.values():
        _one_pass(cache, sequences)
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in caches}
    for _ in range(repeats):  # interleaved, so machine noise hits every variant alike
        for name, cache in caches.items():
            runs[name].append(_one_pass(cache, sequences))
    med = {
        name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in runs.items()
    }
    base = med["none"]
    return {
        "page_size": page,
        "median": med,
        "insert_share": {n: base["insert_s"] / med[n]["insert_s"] for n in caches},
        "evict_share": {n: base["evict_s"] / med[n]["evict_s"] for n in caches},
    }


def replay_million(total: int, page: int) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    log = EventLog(capacity=4096, worker="w")  # a ring: memory must stay flat
    cache = RadixCache(page, capacity=1 << 18, event_log=log)
    tree = MetaTree(page)
    w = tree.add_worker("w")
    replayer = Replayer(tree)
    stems = [rng.integers(0, 32000, 512, dtype=np.uint32) for _ in range(16)]
    seen, samples, start = -1, [], time.perf_counter()
    next_report = total // 10
    while log.next_seq < total:
        for _ in range(64):
            stem = stems[int(rng.integers(len(stems)))]
            tail = rng.integers(0, 32000, int(rng.integers(16, 256)), dtype=np.uint32)
            cache.insert(np.concatenate([stem[: int(rng.integers(64, 512))], tail]))
        batch = log.read(after=seen)
        seen = batch[-1].seq
        replayer.submit(batch)
        replayer.replay()
        if log.next_seq >= next_report:
            samples.append((log.next_seq, round(_rss_mib(), 1)))
            next_report += total // 10
    elapsed = time.perf_counter() - start
    assert tree.held_tokens(w) == cache.total_size, "the replayed tree differs from the cache"
    return {
        "records": log.next_seq,
        "seconds": elapsed,
        "records_per_s": log.next_seq / elapsed,
        "rss_mib_by_records": samples,
        "applied": replayer.stats.applied,
        "malformed": replayer.stats.malformed,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--page-sizes", type=int, nargs="+", default=[1, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="a tenth of the work")
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    sequences = workloads.two_level(seed=0)
    if args.quick:
        sequences, args.repeats, args.records = sequences[:1000], 3, 100_000
    print(
        f"radixmeta {implementation} core; workload (a): {len(sequences):,} sequences; "
        f"median of {args.repeats} interleaved runs"
    )
    results: dict[str, Any] = {"cost": [], "replay": None}
    print(
        f"{'page':>4}  {'log':<7}{'insert':>10}{'evict':>10}{'insert %':>10}{'evict %':>9}"
        f"{'read':>10}"
    )
    for page in args.page_sizes:
        r = cost(sequences, page, args.repeats)
        results["cost"].append(r)
        for name, m in r["median"].items():
            read = f"{m['read_s']:.3f}s" if "read_s" in m else "-"
            print(
                f"{page:>4}  {name:<7}{m['insert_s']:>9.3f}s{m['evict_s']:>9.3f}s"
                f"{r['insert_share'][name]:>9.0%}{r['evict_share'][name]:>9.0%}{read:>10}"
            )
    rep = replay_million(args.records, 16)
    results["replay"] = rep
    print(
        f"replay: {rep['records']:,} records in {rep['seconds']:.1f} s "
        f"({rep['records_per_s']:,.0f}/s, produced, read and applied); "
        f"RSS MiB by records: {rep['rss_mib_by_records']}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
