#!/usr/bin/env python3
"""Throughput of the wire codecs, in blocks per second of 16-token blocks.

Two ways to run it (not part of the test suite)::

    python bench/bench_wire.py            # a table: decode, bytes -> MetaTree, baselines
    python bench/bench_wire.py --quick    # a tenth of the data
    python -m pytest bench/bench_wire.py --benchmark-only -s  # pytest-benchmark

Workload (seed 0): batches of 16 ``BlockStored`` events of 32 blocks of 16
tokens (random ids below a 151,936-token vocabulary, so most are 3- and
5-byte msgpack ints, as with real prompts), each event's parent the previous
one's last block, encoded by the codec under test for a given release; and
vLLM removal batches of 64 one-block ``BlockRemoved`` events, as vLLM evicts.

Rows:

* ``decode``: ``decode_batch`` on every batch.
* ``bytes -> MetaTree``: ``decode_batch`` then ``MetaTree.apply_stored`` per
  event, each batch from one of W workers (its dp rank), as a router replays.
* baselines, same bytes: msgspec's typed decode with ``token_ids: list[int]``
  (the floor for any decoder that makes a Python int per token), the same
  with ``token_ids`` left as ``msgspec.Raw`` (what skipping those ints would
  leave), and msgspec's untyped decode.

Timings: best of ``--repeats`` runs after a warm-up, the garbage collector on
(as in a router). Dynamo 1.6.1's ``RadixTree.apply_event`` applies 1.7 to
2.4 M blocks/s on this machine (``bench/README.md``); it is not run here.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))  # the checkout's radixmeta

from radixmeta import MetaTree
from radixmeta.wire import BlockRemoved, BlockStored, EventBatch, sglang, vllm

BLOCK = 16
BLOCKS_PER_EVENT = 32
EVENTS_PER_BATCH = 16
VOCAB = 151_936
CASES = [(vllm, "0.33"), (vllm, "0.22"), (sglang, "0.5.23"), (sglang, "0.5.10")]


def stored_batches(codec: Any, version: str, n_batches: int, seed: int = 0) -> list[bytes]:
    """``n_batches`` payloads of chained 16-token blocks, as ``codec`` at ``version`` sends."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        events, parent = [], None
        for _ in range(EVENTS_PER_BATCH):
            hashes = rng.integers(0, 2**63, BLOCKS_PER_EVENT, dtype=np.uint64)
            tokens = rng.integers(0, VOCAB, BLOCKS_PER_EVENT * BLOCK, dtype=np.uint32)
            events.append(BlockStored(hashes, parent, tokens, BLOCK, medium="GPU", group_idx=0))
            parent = int(hashes[-1])
        out.append(codec.encode_batch(EventBatch(time.time(), events, 0), version=version))
    return out


def removal_batches(n_batches: int, seed: int = 0) -> list[bytes]:
    """vLLM 0.33 payloads of 64 one-block removals each (vLLM evicts block by block)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        events = [
            BlockRemoved(rng.integers(0, 2**63, 1, dtype=np.uint64), medium="GPU", group_idx=0)
            for _ in range(64)
        ]
        out.append(vllm.encode_batch(EventBatch(time.time(), list(events), 0), version="0.33"))
    return out


def best_seconds(run: Callable[[], object], repeats: int) -> float:
    run()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def decode_all(codec: Any, payloads: list[bytes]) -> Callable[[], None]:
    decode = codec.decode_batch

    def run() -> None:
        for data in payloads:
            decode(data)

    return run


def into_tree(codec: Any, payloads: list[bytes], workers: int) -> Callable[[], None]:
    """Decode and apply every batch, batch i coming from worker i % workers."""
    decode = codec.decode_batch

    def run() -> None:
        tree = MetaTree(BLOCK)
        ids = [tree.add_worker(f"w{i}") for i in range(workers)]
        for i, data in enumerate(payloads):
            worker = ids[i % workers]
            for e in decode(data).events:
                tree.apply_stored(worker, e.parent_block_hash, e.block_hashes, e.token_ids)

    return run


class _Stored(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int


class _StoredRaw(msgspec.Struct, tag="BlockStored", gc=False):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: msgspec.Raw
    block_size: int


def _baseline(event: type) -> msgspec.msgpack.Decoder[Any]:
    batch = msgspec.defstruct(
        "Batch", [("ts", float), ("events", list[event]), ("rank", int | None, None)],
        array_like=True,
    )  # fmt: skip
    return msgspec.msgpack.Decoder(batch)


BASELINES = {
    "msgspec typed, token_ids: list[int]": _baseline(_Stored),
    "msgspec typed, token_ids: Raw (no ints)": _baseline(_StoredRaw),
    "msgspec untyped": msgspec.msgpack.Decoder(),
}


def baseline(decoder: msgspec.msgpack.Decoder[Any], payloads: list[bytes]) -> Callable[[], None]:
    def run() -> None:
        for data in payloads:
            decoder.decode(data)

    return run


def table(n_batches: int, repeats: int) -> list[tuple[str, int, float]]:
    """(row, blocks, seconds) for every row of the module docstring."""
    blocks = n_batches * EVENTS_PER_BATCH * BLOCKS_PER_EVENT
    rows = []

    def time_row(label: str, n_blocks: int, run: Callable[[], object]) -> None:
        rows.append((label, n_blocks, best_seconds(run, repeats)))

    for codec, version in CASES:
        name = f"{codec.__name__.rsplit('.', 1)[1]} {version}"
        payloads = stored_batches(codec, version, n_batches)
        time_row(f"decode, {name}", blocks, decode_all(codec, payloads))
        if (codec, version) != (vllm, "0.33"):
            continue
        for workers in (4, 64):
            label = f"bytes -> MetaTree, {name}, {workers} workers"
            time_row(label, blocks, into_tree(codec, payloads, workers))
        for label, decoder in BASELINES.items():
            time_row(f"  {label}", blocks, baseline(decoder, payloads))
    removals = removal_batches(max(1, n_batches * 8))
    time_row(
        "decode, vllm 0.33 removals (1 block/event)", len(removals) * 64, decode_all(vllm, removals)
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the batches")
    parser.add_argument("--batches", type=int, default=200, help="stored batches per row")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    n = max(1, args.batches // 10) if args.quick else args.batches
    shape = f"{n} batches x {EVENTS_PER_BATCH} events x {BLOCKS_PER_EVENT} blocks x {BLOCK} tokens"
    print(f"{shape}; best of {args.repeats} runs")
    print(f"{'row':<52}{'blocks/s':>12}{'ns/block':>10}")
    for row, n_blocks, seconds in table(n, args.repeats):
        print(f"{row:<52}{n_blocks / seconds / 1e6:>10.2f} M{seconds / n_blocks * 1e9:>10.0f}")


# -- pytest-benchmark ----------------------------------------------------------------------------
def _report(benchmark: Any, blocks: int) -> None:
    """Blocks per second of the fastest round, in the JSON and (with ``-s``) on the terminal."""
    rate = blocks / benchmark.stats.stats.min
    benchmark.extra_info["blocks"] = blocks
    benchmark.extra_info["blocks_per_s"] = rate
    print(f"\n{benchmark.name}: {rate / 1e6:.2f} M blocks/s")


def test_decode(benchmark: Any, case: tuple[Any, str]) -> None:
    codec, version = case
    payloads = stored_batches(codec, version, 20)
    benchmark(decode_all(codec, payloads))
    _report(benchmark, 20 * EVENTS_PER_BATCH * BLOCKS_PER_EVENT)


def test_bytes_to_metatree(benchmark: Any, workers: int) -> None:
    payloads = stored_batches(vllm, "0.33", 20)
    benchmark(into_tree(vllm, payloads, workers))
    _report(benchmark, 20 * EVENTS_PER_BATCH * BLOCKS_PER_EVENT)


def pytest_generate_tests(metafunc: Any) -> None:
    if "case" in metafunc.fixturenames:
        ids = [f"{c.__name__.rsplit('.', 1)[1]}-{v}" for c, v in CASES]
        metafunc.parametrize("case", CASES, ids=ids)
    if "workers" in metafunc.fixturenames:
        metafunc.parametrize("workers", [4, 64])


if __name__ == "__main__":
    main()
