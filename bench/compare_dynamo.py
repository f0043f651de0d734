#!/usr/bin/env python3
"""Side-by-side benchmark: radixmeta's router ``MetaTree`` vs Dynamo 1.6.1's ``RadixTree``.

Both trees index the same fleet: ``W`` workers (``--workers``, default 4 64 256
1024) that each cached a few chat conversations, announced as KV "stored"
events, and both answer the same 2,048-token prompts with each worker's
matched length. Everything runs in one process, on one seeded workload:

* **Fleet** (seed 0): 8 system prompts of 512-1,024 tokens; 1,024
  conversations, each a system prompt plus turns of 64-384 tokens up to at
  least 2,048 tokens. Block (engine) hash of a page = a rolling 64-bit hash of
  the whole prefix up to it, so a page has one hash fleet-wide, as with real
  engines.
* **Stored events**: each worker visits 32 conversations (Zipf(1)
  popularity: the most popular are cached by most workers) and caches each
  up to the end of a random turn. Only the blocks it does not hold yet are
  announced, in events of 16-64 blocks whose parent is the previous block, as
  engines emit them. Visits of all workers are interleaved. Dynamo gets each
  event as JSON bytes (``tokens_hash`` = its own ``compute_block_hash_for_seq``),
  encoded *before* timing (the encoding is timed separately); ``MetaTree``
  gets the same events through ``apply_stored`` (one call per event) and
  through one ``apply_events`` batch.
* **Match**: 2,048-token prompts (3/4 drawn like the visits, 1/4 uniformly, so
  some are held nowhere beyond their system prompt). Per-call latency from
  Python, median and p90: Dynamo ``find_matches(local hashes)`` (hashes
  computed before timing) with and without reading ``.scores``; ``MetaTree``
  ``match(tokens).lengths``; and ``match_many`` over batches, per prompt.
  Every prompt's per-worker lengths are compared (Dynamo blocks ==
  ``MetaTree`` tokens / page size); a mismatch is reported.
* **Removal** (``--remove-at``, default 64 workers): every stored block is
  removed again, leaf first (events in reverse, each event's blocks in
  reverse), on trees built untimed.
* **Memory**: each tree built in a fresh child process;
  ``MetaTree.memory_usage()`` and RSS growth per (worker, page) held.

Timings: GC off inside timed regions; the median over ``--repeats`` runs (apply
and removal: more runs until ``--min-time`` seconds, each on fresh trees).
Ratios are ``MetaTree / Dynamo`` speedups.

The process is pinned to one CPU (``--cpu``, default 0) because Dynamo's
``RadixTree`` answers every call on its own thread: on an idle 2-vCPU VM,
waking that thread on the other vCPU costs ~40 us per call (``find_matches``
of one hash: 47 us unpinned, 6 us pinned), and applying events is 3-4x
slower. Pinning is Dynamo's best case; ``MetaTree`` is single-threaded and
does not care.

Usage (see bench/README.md, "Router meta-tree vs Dynamo")::

    /work/venv-dyn/bin/python bench/compare_dynamo.py --json out.json
    python bench/compare_dynamo.py --quick --no-dynamo
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

import _dynamo_peer as dyn  # noqa: E402
import compare  # noqa: E402  (shared helpers: radixmeta loader, RSS, table printing)
from _sglang_peer import _timed  # noqa: E402
from fleet import (  # noqa: E402
    QUERY_TOKENS,
    Conversation,
    StoredEvent,
    describe,
    make_fleet,
    make_queries,
    metatree_calls,
    stored_events,
)

# The project's goals for the router meta-tree; the last table reports against them.
MATCH_GOAL_US = {4: 1.0, 64: 1.5, 256: 2.0, 1024: 4.0}
MATCH_SPEEDUP_GOAL = {4: 10.0, 256: 10.0}
APPLY_SPEEDUP_GOAL = 3.0
BATCH_GOAL_BLOCKS_PER_S = 5e6
MEMORY_GOAL_BYTES = 16.0
BYTES_SPEEDUP_GOAL = 1.5  # decode + apply of map-era vLLM batches, against Dynamo's apply_event
BYTES_SPEEDUP_AT = (4, 64)
VLLM_EVENTS_PER_BATCH = 8
MAX_RUNS = 100  # cap on the runs that --min-time adds


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# workload
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# prepared inputs (built before any timing)
# --------------------------------------------------------------------------------------


def metatree_removals(
    calls: list[tuple[Any, int | None, np.ndarray, np.ndarray]],
) -> list[tuple[Any, np.ndarray]]:
    """Leaf-first removal of everything: events in reverse, each event's pages in reverse."""
    return [(w, hashes[::-1].copy()) for w, _, hashes, _ in reversed(calls)]


def dynamo_stored(
    fleet: list[Conversation], events: list[StoredEvent], local: list[list[int]]
) -> list[tuple[int, bytes]]:
    next_id: dict[int, int] = {}
    out = []
    for e in events:
        conv = fleet[e.conv]
        parent = None if e.parent_index is None else conv.hashes[e.parent_index]
        eid = next_id.get(e.worker, 0)
        next_id[e.worker] = eid + 1
        payload = dyn.encode_stored(
            eid, parent, conv.hashes[e.start : e.stop], local[e.conv][e.start : e.stop]
        )
        out.append((e.worker, payload))
    return out


def dynamo_removals(
    fleet: list[Conversation], events: list[StoredEvent]
) -> list[tuple[int, bytes]]:
    return [
        (e.worker, dyn.encode_removed(i, fleet[e.conv].hashes[e.start : e.stop][::-1]))
        for i, e in enumerate(reversed(events))
    ]


# --------------------------------------------------------------------------------------
# radixmeta side
# --------------------------------------------------------------------------------------


def load_metatree() -> tuple[Any, str]:
    """Return (``radixmeta.MetaTree`` or None, a note saying which implementation or why not)."""
    compare.load_radixmeta()  # picks the source tree / the Python reference when needed
    import radixmeta

    cls = getattr(radixmeta, "MetaTree", None)
    if cls is None:
        return None, f"radixmeta {radixmeta.__version__} has no MetaTree"
    return cls, f"radixmeta {radixmeta.__version__}, implementation={radixmeta.implementation}"


def new_metatree(cls: Any, page_size: int, n_workers: int) -> tuple[Any, list[Any]]:
    tree = cls(page_size=page_size)
    return tree, [tree.add_worker(f"worker-{i}") for i in range(n_workers)]


def mt_apply_each(tree: Any, calls: list[tuple[Any, int | None, np.ndarray, np.ndarray]]) -> int:
    apply = tree.apply_stored
    marked = 0
    for worker, parent, hashes, tokens in calls:
        marked += apply(worker, parent, hashes, tokens)
    return marked


def mt_remove_each(tree: Any, removals: list[tuple[Any, np.ndarray]]) -> int:
    remove = tree.apply_removed
    unmarked = 0
    for worker, hashes in removals:
        unmarked += remove(worker, hashes)
    return unmarked


def mt_match_latencies(tree: Any, keys: Sequence[np.ndarray]) -> list[int]:
    match = tree.match
    clock = time.perf_counter_ns
    out: list[int] = []
    append = out.append
    for key in keys:
        t0 = clock()
        match(key).lengths  # noqa: B018  (reading the answer is part of the call)
        append(clock() - t0)
    return out


def mt_match_batches(tree: Any, batches: Sequence[np.ndarray]) -> None:
    match_many = tree.match_many
    for batch in batches:
        match_many(batch)


def expect_applied(statuses: np.ndarray, what: str) -> None:
    bad = int(np.count_nonzero(statuses))
    if bad:
        kinds = np.unique(statuses).tolist()
        msg = f"{what}: {bad} of {len(statuses)} records not applied (statuses {kinds})"
        raise AssertionError(msg)


# --------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------


def rate(seconds: list[float], blocks: int) -> dict[str, Any]:
    med = statistics.median(seconds)
    return {
        "runs": len(seconds),
        "seconds": [round(s, 6) for s in seconds],
        "median_s": med,
        "blocks_per_s": blocks / med,
        "best_blocks_per_s": blocks / min(seconds),
    }


def latency(repeats: list[list[int]]) -> dict[str, Any]:
    """Median over repeats of each repeat's median and p90, in microseconds."""
    meds = [float(np.median(r)) / 1e3 for r in repeats]
    p90s = [float(np.percentile(r, 90)) / 1e3 for r in repeats]
    return {
        "calls": len(repeats[0]),
        "median_us": statistics.median(meds),
        "p90_us": statistics.median(p90s),
        "per_repeat_median_us": [round(m, 3) for m in meds],
    }


def timer_overhead_ns(n: int = 20_000) -> float:
    """Median cost of one ``perf_counter_ns`` pair: included in every per-call latency."""
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        t0 = clock()
        samples.append(clock() - t0)
    return float(np.median(samples))


@dataclass
class Inputs:
    """Everything one worker count needs, prepared before timing."""

    workers: int
    events: list[StoredEvent]
    info: dict[str, Any]
    mt_calls: list[Any] | None = None
    mt_ids: list[Any] | None = None
    dyn_events: list[tuple[int, bytes]] | None = None
    encode_s: float = 0.0  # JSON encoding of dyn_events
    vllm_batches: list[tuple[int, bytes]] | None = None  # (worker index, vLLM 0.33 bytes)


def prepare(
    args: argparse.Namespace,
    fleet: list[Conversation],
    local: list[list[int]] | None,
    n_workers: int,
    metatree: Any,
) -> Inputs:
    events = stored_events(fleet, n_workers, args.visits, args.seed, args.page_size)
    inp = Inputs(n_workers, events, describe(fleet, events, n_workers))
    if metatree is not None:
        _, inp.mt_ids = new_metatree(metatree, args.page_size, n_workers)
        inp.mt_calls = metatree_calls(fleet, events, inp.mt_ids, args.page_size)
        inp.vllm_batches = vllm_batches(events, inp.mt_calls, args.page_size)
    if local is not None:
        inp.encode_s, inp.dyn_events = _timed(dynamo_stored, fleet, events, local)
    return inp


def vllm_batches(
    events: list[StoredEvent], calls: list[Any], page_size: int
) -> list[tuple[int, bytes]]:
    """The same stored events as a vLLM 0.33 (map era) fleet publishes them.

    Each worker's events go out in order, in batches of up to
    ``VLLM_EVENTS_PER_BATCH`` (a scheduler step's worth); a batch names one worker,
    as a publisher per worker does.
    """
    from radixmeta.wire import BlockStored, EventBatch, vllm

    pending: dict[int, list[Any]] = {}
    out: list[tuple[int, bytes]] = []

    def flush(worker: int) -> None:
        batch = EventBatch(0.0, pending.pop(worker), 0)
        out.append((worker, vllm.encode_batch(batch, version="0.33")))

    for event, (_, parent, hashes, tokens) in zip(events, calls, strict=True):
        stored = BlockStored(hashes, parent, tokens, page_size, medium="GPU", group_idx=0)
        pending.setdefault(event.worker, []).append(stored)
        if len(pending[event.worker]) == VLLM_EVENTS_PER_BATCH:
            flush(event.worker)
    for worker in sorted(pending):
        flush(worker)
    return out


def mt_apply_vllm(tree: Any, ids: list[Any], batches: list[tuple[int, bytes]]) -> int:
    """Decode each vLLM batch and apply its events: the router's path from the socket."""
    from radixmeta.wire import vllm

    decode, apply, marked = vllm.decode_batch, tree.apply_stored, 0
    for worker_index, data in batches:
        worker = ids[worker_index]
        for e in decode(data).events:
            marked += apply(worker, e.parent_block_hash, e.block_hashes, e.token_ids)
    return marked


def sample(run: Callable[[], float], args: argparse.Namespace) -> list[float]:
    """Seconds from ``run()``: at least ``--repeats`` runs, and ``--min-time`` seconds in all.

    The small fleets apply in a few milliseconds, where one scheduler hiccup
    on this shared VM would decide the median; more runs smooth that out.
    """
    secs: list[float] = []
    while len(secs) < args.repeats or (sum(secs) < args.min_time and len(secs) < MAX_RUNS):
        secs.append(run())
    return secs


def time_apply(
    args: argparse.Namespace, inp: Inputs, metatree: Any, peer: dyn.DynamoPeer | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Stored-event throughput; returns (results, the last tree of each kind for matching)."""
    blocks = inp.info["blocks"]
    res: dict[str, Any] = {}
    trees: dict[str, Any] = {}
    if peer is not None and inp.dyn_events is not None:

        def dynamo_run() -> float:
            trees["dynamo"] = tree = peer.new_tree()
            return _timed(peer.apply_all, tree, inp.dyn_events)[0]

        res["dynamo"] = rate(sample(dynamo_run, args), blocks)
        res["dynamo_json_encode"] = {"seconds": inp.encode_s, "blocks_per_s": blocks / inp.encode_s}
    if metatree is not None and inp.mt_calls is not None:
        records = [("stored", *c) for c in inp.mt_calls]

        def fresh() -> Any:
            tree, ids = new_metatree(metatree, args.page_size, inp.workers)
            if ids != inp.mt_ids:  # the prepared calls name workers by these ids
                msg = "a fresh MetaTree gave different WorkerIds"
                raise AssertionError(msg)
            return tree

        def each_run() -> float:
            trees["metatree"] = tree = fresh()
            seconds, marked = _timed(mt_apply_each, tree, inp.mt_calls)
            if marked != blocks:
                msg = f"apply_stored marked {marked} pages, expected {blocks}"
                raise AssertionError(msg)
            return seconds

        def batch_run() -> float:
            seconds, statuses = _timed(fresh().apply_events, records)
            expect_applied(statuses, "apply_events")
            return seconds

        def vllm_run() -> float:
            seconds, marked = _timed(mt_apply_vllm, fresh(), inp.mt_ids, inp.vllm_batches)
            if marked != blocks:
                msg = f"vLLM bytes marked {marked} pages, expected {blocks}"
                raise AssertionError(msg)
            return seconds

        res["metatree_apply_stored"] = rate(sample(each_run, args), blocks)
        res["metatree_apply_events"] = rate(sample(batch_run, args), blocks)
        if inp.vllm_batches is not None:
            res["metatree_vllm_bytes"] = rate(sample(vllm_run, args), blocks)
        res["metatree_node_count"] = int(trees["metatree"].node_count)
    return res, trees


def time_match(
    args: argparse.Namespace,
    fleet: list[Conversation],
    local: list[list[int]] | None,
    queries: list[int],
    trees: dict[str, Any],
    peer: dyn.DynamoPeer | None,
    n_workers: int,
) -> dict[str, Any]:
    """Per-prompt match latency on the trees built by :func:`time_apply`, plus the cross-check."""
    p = args.page_size
    keys = [fleet[c].tokens[:QUERY_TOKENS] for c in queries]
    res: dict[str, Any] = {}
    dyn_blocks = mt_blocks = None
    if "dynamo" in trees and peer is not None and local is not None:
        tree = trees["dynamo"]
        hashes = [local[c][: QUERY_TOKENS // p] for c in queries]
        for label, with_scores in (("dynamo", True), ("dynamo_find_only", False)):
            runs = [
                _timed(peer.match_latencies, tree, hashes, with_scores)[1]
                for _ in range(args.repeats)
            ]
            res[label] = latency(runs)
        dyn_blocks = np.zeros((len(queries), n_workers), dtype=np.int64)
        for row, h in zip(dyn_blocks, hashes, strict=True):
            dyn.scores_by_worker(peer.scores(tree, h), row)
    if "metatree" in trees:
        tree = trees["metatree"]
        runs = [_timed(mt_match_latencies, tree, keys)[1] for _ in range(args.repeats)]
        res["metatree"] = latency(runs)
        stacked = np.stack(keys)
        b = args.match_batch
        batches = [stacked[i : i + b] for i in range(0, len(stacked), b)]
        secs = [_timed(mt_match_batches, tree, batches)[0] for _ in range(args.repeats)]
        res["metatree_match_many"] = {
            "batch": b,
            "us_per_prompt": statistics.median(secs) / len(keys) * 1e6,
        }
        lengths = tree.match_many(stacked)[:, :n_workers]
        one_by_one = np.stack([tree.match(k).lengths[:n_workers] for k in keys])
        if not np.array_equal(lengths, one_by_one):
            msg = "match_many and match disagree"
            raise AssertionError(msg)
        mt_blocks = lengths // p
        res["mean_best_match_blocks"] = float(mt_blocks.max(axis=1).mean())
        res["mean_workers_matching"] = float((mt_blocks > 0).sum(axis=1).mean())
    if dyn_blocks is not None and mt_blocks is not None:
        differ = dyn_blocks != mt_blocks
        res["mismatched_prompts"] = int(differ.any(axis=1).sum())
        res["mismatched_worker_cells"] = int(differ.sum())
    return res


def time_removal(
    args: argparse.Namespace,
    fleet: list[Conversation],
    inp: Inputs,
    metatree: Any,
    peer: dyn.DynamoPeer | None,
) -> dict[str, Any]:
    """Leaf-first removal of every stored block, on trees built (untimed) for each run."""
    blocks = inp.info["blocks"]
    res: dict[str, Any] = {"blocks": blocks}
    if peer is not None and inp.dyn_events is not None:
        removals = dynamo_removals(fleet, inp.events)

        def dynamo_run() -> float:
            tree = peer.new_tree()
            peer.apply_all(tree, inp.dyn_events)
            seconds = _timed(peer.apply_all, tree, removals)[0]
            if tree.dump_tree_as_events():
                msg = "dynamo tree not empty after removing every block"
                raise AssertionError(msg)
            return seconds

        res["dynamo"] = rate(sample(dynamo_run, args), blocks)
    if metatree is not None and inp.mt_calls is not None:
        mt_removals = metatree_removals(inp.mt_calls)
        records = [("removed", *r) for r in mt_removals]
        stored = [("stored", *c) for c in inp.mt_calls]

        def built() -> Any:
            tree, _ = new_metatree(metatree, args.page_size, inp.workers)
            expect_applied(tree.apply_events(stored), "build for removal")
            return tree

        def each_run() -> float:
            tree = built()
            seconds, unmarked = _timed(mt_remove_each, tree, mt_removals)
            if unmarked != blocks or tree.node_count:
                msg = f"apply_removed unmarked {unmarked} of {blocks}, {tree.node_count} nodes left"
                raise AssertionError(msg)
            return seconds

        def batch_run() -> float:
            tree = built()
            seconds, statuses = _timed(tree.apply_events, records)
            expect_applied(statuses, "apply_events (removed)")
            if tree.node_count:
                msg = f"{tree.node_count} nodes left after removing every block"
                raise AssertionError(msg)
            return seconds

        res["metatree_apply_removed"] = rate(sample(each_run, args), blocks)
        res["metatree_apply_events"] = rate(sample(batch_run, args), blocks)
    return res


# --------------------------------------------------------------------------------------
# memory (child process per tree)
# --------------------------------------------------------------------------------------


def memory_probe(args: argparse.Namespace) -> dict[str, Any]:
    """Child side of ``--memory-probe IMPL``: build one tree, report its memory.

    Inputs are prepared (and a Dynamo tree constructed, which starts its
    thread, and warmed) before the first RSS reading, so the growth is the
    tree's own.
    """
    impl, n_workers = args.memory_probe, args.workers[0]
    fleet = make_fleet(args.seed, args.conversations, args.systems, args.page_size)
    events = stored_events(fleet, n_workers, args.visits, args.seed, args.page_size)
    info = describe(fleet, events, n_workers)
    if impl == "dynamo":
        dyn.load_dynamo()
        local = [dyn.local_hashes(c.tokens, args.page_size) for c in fleet]
        payloads = dynamo_stored(fleet, events, local)
        peer = dyn.DynamoPeer()
        tree = peer.new_tree()
        # One throwaway event first, so the tree thread's allocator arena and parse
        # buffers exist before the baseline reading (they would dominate small fleets).
        spare = n_workers + 1
        peer.apply_all(tree, [(spare, dyn.encode_stored(0, None, [1], [1]))])
        tree.clear_all_blocks(spare)
        build: Any = lambda: peer.apply_all(tree, payloads)  # noqa: E731
    else:
        metatree, note = load_metatree()
        if metatree is None:
            raise SystemExit(note)
        tree, ids = new_metatree(metatree, args.page_size, n_workers)
        records = [("stored", *c) for c in metatree_calls(fleet, events, ids, args.page_size)]
        build = lambda: expect_applied(tree.apply_events(records), "memory build")  # noqa: E731
    gc.collect()
    compare._malloc_trim()
    before = compare.rss_bytes()
    build()
    gc.collect()
    growth = compare.rss_bytes() - before
    pairs = info["blocks"]
    out = {"impl": impl, **info, "rss_growth_bytes": growth, "rss_per_pair": growth / pairs}
    if impl == "metatree":
        usage = int(tree.memory_usage())
        labels = info["distinct_pages"] * args.page_size * 4  # uint32 token labels
        out |= {
            "memory_usage_bytes": usage,
            "memory_usage_per_pair": usage / pairs,
            "label_bytes": labels,
            "beyond_labels_per_pair": (usage - labels) / pairs,
            "node_count": int(tree.node_count),
        }
    return out


def run_memory_probes(args: argparse.Namespace, impls: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for w in args.workers:
        out[str(w)] = {}
        for impl in impls:
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                "--memory-probe",
                impl,
                "--workers",
                str(w),
                *workload_flags(args),
            ]
            log(f"memory: {impl}, {w} workers (fresh process)")
            proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode != 0 or not lines:
                tail = proc.stderr.strip().splitlines()[-1:] or ["no output"]
                out[str(w)][impl] = {"error": tail[0]}
                continue
            out[str(w)][impl] = json.loads(lines[-1])
    return out


def workload_flags(args: argparse.Namespace) -> list[str]:
    """The flags that fix the workload, for child processes."""
    return [
        "--seed",
        str(args.seed),
        "--page-size",
        str(args.page_size),
        "--conversations",
        str(args.conversations),
        "--systems",
        str(args.systems),
        "--visits",
        str(args.visits),
    ]


# --------------------------------------------------------------------------------------
# report
# --------------------------------------------------------------------------------------


def _get(d: dict[str, Any] | None, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _speedup(ours: float | None, theirs: float | None, *, lower_is_better: bool = False) -> str:
    if not ours or not theirs:
        return "-"
    return f"{(theirs / ours if lower_is_better else ours / theirs):.1f}x"


def _us(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


def apply_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "workers",
        "blocks",
        "blk/event",
        "dynamo",
        "(json encode)",
        "MT apply_stored",
        "MT apply_events",
        "MT vLLM bytes",
        "stored/dyn",
        "events/dyn",
        "bytes/dyn",
    ]
    rows = []
    for w, r in results.items():
        a = r["apply"]
        dy = _get(a, "dynamo", "blocks_per_s")
        each = _get(a, "metatree_apply_stored", "blocks_per_s")
        batch = _get(a, "metatree_apply_events", "blocks_per_s")
        wire = _get(a, "metatree_vllm_bytes", "blocks_per_s")
        rows.append(
            [
                w,
                f"{r['workload']['blocks']:,}",
                f"{r['workload']['blocks_per_event']:.1f}",
                compare._fmt(dy),
                compare._fmt(_get(a, "dynamo_json_encode", "blocks_per_s")),
                compare._fmt(each),
                compare._fmt(batch),
                compare._fmt(wire),
                _speedup(each, dy),
                _speedup(batch, dy),
                _speedup(wire, dy),
            ]
        )
    return header, rows


def match_table(results: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "workers",
        "dyn med",
        "dyn p90",
        "dyn find-only",
        "MT med",
        "MT p90",
        "MT match_many",
        "speedup",
        "vs find-only",
        "mismatches",
    ]
    rows = []
    for w, r in results.items():
        m = r["match"]
        dy = _get(m, "dynamo", "median_us")
        mt = _get(m, "metatree", "median_us")
        rows.append(
            [
                w,
                _us(dy),
                _us(_get(m, "dynamo", "p90_us")),
                _us(_get(m, "dynamo_find_only", "median_us")),
                _us(mt),
                _us(_get(m, "metatree", "p90_us")),
                _us(_get(m, "metatree_match_many", "us_per_prompt")),
                _speedup(mt, dy, lower_is_better=True),
                _speedup(mt, _get(m, "dynamo_find_only", "median_us"), lower_is_better=True),
                str(m.get("mismatched_prompts", "-")),
            ]
        )
    return header, rows


def removal_table(removal: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = ["workers", "blocks", "dynamo", "MT apply_removed", "MT apply_events", "removed/dyn"]
    rows = []
    for w, r in removal.items():
        dy = _get(r, "dynamo", "blocks_per_s")
        each = _get(r, "metatree_apply_removed", "blocks_per_s")
        rows.append(
            [
                w,
                f"{r['blocks']:,}",
                compare._fmt(dy),
                compare._fmt(each),
                compare._fmt(_get(r, "metatree_apply_events", "blocks_per_s")),
                _speedup(each, dy),
            ]
        )
    return header, rows


def memory_table(memory: dict[str, Any]) -> tuple[list[str], list[list[str]]]:
    header = [
        "workers",
        "pairs held",
        "pages",
        "MT usage B/pair",
        "MT beyond labels",
        "MT RSS B/pair",
        "dyn RSS B/pair",
    ]
    rows = []
    for w, m in memory.items():
        mt, dy = m.get("metatree", {}), m.get("dynamo", {})
        base = mt if "blocks" in mt else dy
        rows.append(
            [
                w,
                f"{base['blocks']:,}" if "blocks" in base else "-",
                f"{base['distinct_pages']:,}" if "distinct_pages" in base else "-",
                _us(mt.get("memory_usage_per_pair")),
                _us(mt.get("beyond_labels_per_pair")),
                _us(mt.get("rss_per_pair")) if "rss_per_pair" in mt else mt.get("error", "-"),
                _us(dy.get("rss_per_pair")) if "rss_per_pair" in dy else dy.get("error", "-"),
            ]
        )
    return header, rows


def check_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each goal, per worker count where it applies, with the measured value (None = not run)."""
    out = []

    def add(goal: str, workers: str, value: float | None, limit: float, at_least: bool) -> None:
        ok = None if value is None else (value >= limit if at_least else value <= limit)
        out.append(
            {
                "goal": goal,
                "workers": workers,
                "value": value,
                "limit": limit,
                "at_least": at_least,
                "ok": ok,
            }
        )

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    for w, r in report["results"].items():
        a, m = r["apply"], r["match"]
        mt_match = _get(m, "metatree", "median_us")
        if int(w) in MATCH_SPEEDUP_GOAL:
            speedup = ratio(_get(m, "dynamo", "median_us"), mt_match)
            add("match speedup vs dynamo (x)", w, speedup, MATCH_SPEEDUP_GOAL[int(w)], True)
        each = _get(a, "metatree_apply_stored", "blocks_per_s")
        speedup = ratio(each, _get(a, "dynamo", "blocks_per_s"))
        add("apply_stored speedup vs dynamo (x)", w, speedup, APPLY_SPEEDUP_GOAL, True)
        if int(w) in BYTES_SPEEDUP_AT:
            wire = ratio(
                _get(a, "metatree_vllm_bytes", "blocks_per_s"), _get(a, "dynamo", "blocks_per_s")
            )
            add("vLLM 0.33 bytes -> MetaTree vs dynamo JSON (x)", w, wire, BYTES_SPEEDUP_GOAL, True)
        batch = ratio(_get(a, "metatree_apply_events", "blocks_per_s"), 1e6)
        add("apply_events (M blocks/s)", w, batch, BATCH_GOAL_BLOCKS_PER_S / 1e6, True)
        if int(w) in MATCH_GOAL_US:
            add("match median (us)", w, mt_match, MATCH_GOAL_US[int(w)], False)
    for w, mem in report["memory"].items():
        value = _get(mem, "metatree", "beyond_labels_per_pair")
        add("memory beyond labels (B per worker-page)", w, value, MEMORY_GOAL_BYTES, False)
    return out


def print_targets(targets: list[dict[str, Any]]) -> None:
    header = ["goal", "workers", "measured", "goal value", "met"]
    rows = [
        [
            t["goal"],
            t["workers"],
            "-" if t["value"] is None else f"{t['value']:.2f}",
            f"{'>=' if t['at_least'] else '<='} {t['limit']:g}",
            {True: "yes", False: "NO", None: "-"}[t["ok"]],
        ]
        for t in targets
    ]
    compare.print_table(header, rows)


def environment(note: str, dynamo_version: str | None, timer_ns: float) -> dict[str, Any]:
    env = compare.environment(None, "", None)
    for key in ("sglang", "torch", "native_core", "native_note"):
        env.pop(key, None)
    env |= {
        "radixmeta": note,
        "dynamo": dynamo_version,
        "timer_overhead_ns": timer_ns,
        "cpu_affinity": sorted(os.sched_getaffinity(0)),
    }
    return env


def print_report(report: dict[str, Any], args: argparse.Namespace) -> None:
    wl = report["workload"]
    print(
        f"\n== fleet: {wl['conversations']:,} conversations over {wl['systems']} system "
        f"prompts, {wl['visits_per_worker']} visits per worker, page_size {args.page_size}, "
        f"{wl['queries']:,} prompts of {QUERY_TOKENS} tokens; median of {args.repeats} =="
    )
    print(f"   radixmeta: {report['environment']['radixmeta']}")
    print(f"   dynamo: {report['environment']['dynamo'] or 'not run'}")
    print(
        "\n== stored events applied (blocks/s, higher is better; dynamo excludes JSON encoding) =="
    )
    compare.print_table(*apply_table(report["results"]))
    print(
        "\n== match of a 2,048-token prompt (us per prompt from Python, lower is better; "
        f"timer overhead {report['environment']['timer_overhead_ns']:.0f} ns included) =="
    )
    print(
        "   dyn = find_matches(local hashes).scores; MT = match(tokens).lengths; "
        f"match_many in batches of {args.match_batch}"
    )
    compare.print_table(*match_table(report["results"]))
    for w, r in report["results"].items():
        m = r["match"]
        if "mean_best_match_blocks" in m:
            print(
                f"   {w} workers: best match {m['mean_best_match_blocks']:.1f} blocks on average, "
                f"{m['mean_workers_matching']:.1f} workers match each prompt"
            )
    if report["removal"]:
        print("\n== removed events, leaf first (blocks/s, higher is better) ==")
        compare.print_table(*removal_table(report["removal"]))
    if report["memory"]:
        print("\n== memory per (worker, page) held, each tree built in a fresh process ==")
        compare.print_table(*memory_table(report["memory"]))
    print("\n== goals ==")
    print_targets(report["targets"])


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[4, 64, 256, 1024], metavar="W")
    ap.add_argument("--page-size", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=3, help="repeats per phase (median)")
    ap.add_argument(
        "--min-time",
        type=float,
        default=0.5,
        metavar="S",
        help="apply and removal phases repeat until they have run this many seconds",
    )
    ap.add_argument("--json", metavar="OUT", help="write all numbers to this JSON file")
    ap.add_argument("--quick", action="store_true", help="small scale for a smoke run")
    ap.add_argument("--no-dynamo", action="store_true", help="time radixmeta alone")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory probes")
    ap.add_argument(
        "--remove-at",
        type=int,
        nargs="*",
        default=[64],
        metavar="W",
        help="worker counts at which removal is timed (none: skip)",
    )
    ap.add_argument("--conversations", type=int, default=1024)
    ap.add_argument("--systems", type=int, default=8, help="shared system prompts")
    ap.add_argument("--visits", type=int, default=32, help="conversations cached per worker")
    ap.add_argument("--queries", type=int, default=2000, help="prompts matched per repeat")
    ap.add_argument("--match-batch", type=int, default=64, help="prompts per match_many call")
    ap.add_argument(
        "--cpu",
        type=int,
        default=0,
        help="pin the process, and so Dynamo's tree thread, to this CPU (-1: no pinning)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-probe", choices=["metatree", "dynamo"], help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.quick:
        args.conversations = min(args.conversations, 256)
        args.visits = min(args.visits, 4)
        args.queries = min(args.queries, 300)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu >= 0:
        # Before any RadixTree exists: its thread inherits the mask (so do the memory probes).
        os.sched_setaffinity(0, {args.cpu})
    if args.memory_probe:
        print(json.dumps(memory_probe(args)))
        return 0
    t_start = time.time()
    metatree, note = load_metatree()
    if metatree is None:
        print(f"radixmeta skipped: {note}")
    peer = None
    dynamo_version = None
    if not args.no_dynamo:
        try:
            dynamo_version = dyn.load_dynamo()["version"]
            peer = dyn.DynamoPeer()
        except ModuleNotFoundError as exc:
            print(f"Dynamo skipped: {exc}")
    if metatree is None and peer is None:
        print("nothing to run: neither radixmeta's MetaTree nor Dynamo is available")
        return 1

    fleet = make_fleet(args.seed, args.conversations, args.systems, args.page_size)
    local = [dyn.local_hashes(c.tokens, args.page_size) for c in fleet] if peer else None
    queries = make_queries(fleet, args.queries, args.seed)
    report: dict[str, Any] = {
        "workload": {
            "conversations": args.conversations,
            "systems": args.systems,
            "visits_per_worker": args.visits,
            "queries": args.queries,
            "query_tokens": QUERY_TOKENS,
            "page_size": args.page_size,
            "seed": args.seed,
        },
        "results": {},
        "removal": {},
        "memory": {},
    }
    for w in args.workers:
        inp = prepare(args, fleet, local, w, metatree)
        log(f"[{w} workers] {inp.info}")
        apply_res, trees = time_apply(args, inp, metatree, peer)
        match_res = time_match(args, fleet, local, queries, trees, peer, w)
        del trees
        report["results"][str(w)] = {"workload": inp.info, "apply": apply_res, "match": match_res}
        if w in args.remove_at:
            log(f"[{w} workers] removal")
            report["removal"][str(w)] = time_removal(args, fleet, inp, metatree, peer)
        del inp
        gc.collect()
    if not args.no_memory:
        impls = (["metatree"] if metatree is not None else []) + (["dynamo"] if peer else [])
        report["memory"] = run_memory_probes(args, impls)
    report["targets"] = check_targets(report)
    report["environment"] = environment(note, dynamo_version, timer_overhead_ns())
    report["elapsed_s"] = round(time.time() - t_start, 1)
    print_report(report, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=float)
        print(f"\nwrote {args.json}")
    print(f"elapsed {report['elapsed_s']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
