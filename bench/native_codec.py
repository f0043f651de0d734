#!/usr/bin/env python3
"""What radixmeta's own wire codec adds on top of applying the same records.

A worker's block-form EventLog (16-token pages) produces stored records; they are
applied to a fresh MetaTree three ways, each timed on the same records in one run:

* ``apply_events`` on prebuilt tuples (the floor: the tree's own batch call);
* the records themselves through ``apply_stored`` one by one;
* native bytes -> ``native.decode_batch`` -> ``apply_stored`` (what a router does).

The issue's target: the codec adds at most 30 % on top of ``apply_events``.
Usage: ``python bench/native_codec.py [--records N] [--json FILE]``.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

import numpy as np

from radixmeta import EventLog, MetaTree, RadixCache
from radixmeta.events import Stored
from radixmeta.wire import native

PAGE = 16


def _records(n: int) -> list[Any]:
    log = EventLog(capacity=n * 2, max_tokens=2**30, form="blocks", worker="w")
    cache = RadixCache(PAGE, event_log=log)
    rng = np.random.default_rng(0)
    stems = [rng.integers(0, 32000, 1024, dtype=np.uint32) for _ in range(8)]
    while log.next_seq < n:
        stem = stems[int(rng.integers(len(stems)))]
        tail = rng.integers(0, 32000, int(rng.integers(64, 512)), dtype=np.uint32)
        cache.insert(np.concatenate([stem[: int(rng.integers(128, 1024))], tail]))
    return [r for r in log.read() if isinstance(r, Stored)][:n]


def _best(fn: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        tree = MetaTree(PAGE)
        worker = tree.add_worker("w")
        gc.collect()
        gc.disable()
        try:
            t0 = time.perf_counter()
            fn(tree, worker)
            times.append(time.perf_counter() - t0)
        finally:
            gc.enable()
    return min(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=20_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args(argv)
    records = _records(args.records)
    blocks = sum(len(r.block_hashes) for r in records)
    batches = [records[i : i + 16] for i in range(0, len(records), 16)]  # 16 stores a batch
    payloads = [native.encode_batch(b, worker="w") for b in batches]

    def floor(tree: Any, w: Any) -> None:
        tree.apply_events(
            [("stored", w, r.parent_hash, r.block_hashes, r.token_ids) for r in records]
        )

    def by_record(tree: Any, w: Any) -> None:
        for r in records:
            tree.apply_stored(w, r.parent_hash, r.block_hashes, r.token_ids)

    def from_bytes(tree: Any, w: Any) -> None:
        for data in payloads:
            for r in native.decode_batch(data).records:
                tree.apply_stored(w, r.parent_hash, r.block_hashes, r.token_ids)

    # apply_events' floor is timed with its tuples built in the timed region too, as a
    # caller holding records must; the tuples alone cost a few percent of it.
    rows = {name: _best(fn, args.repeats) for name, fn in
            (("apply_events", floor), ("apply_stored", by_record), ("native bytes", from_bytes))}
    base = rows["apply_events"]
    print(f"{len(records):,} stored records, {blocks:,} blocks of {PAGE} tokens, "
          f"{len(payloads):,} batches; best of {args.repeats}")
    print(f"{'path':<14}{'seconds':>10}{'blocks/s':>12}{'vs apply_events':>17}")
    for name, s in rows.items():
        print(f"{name:<14}{s:>10.3f}{blocks / s / 1e6:>11.2f}M{s / base - 1:>+16.0%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"blocks": blocks, "seconds": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
