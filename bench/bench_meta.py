"""pytest-benchmark suite for MetaTree's hot paths (not part of the test suite).

Run: ``python -m pytest bench/bench_meta.py --benchmark-only`` (add
``--benchmark-json=out.json`` to keep the numbers). The fleet comes from
``fleet.py``: the same workload ``compare_dynamo.py`` runs against Dynamo.

Two shapes of tree, both at page size 16, for 4 to 1,024 workers:

* ``events``: built from KV stored events, so every page is its own node
  (block-hash pages are one-page nodes) and a 2,048-token prompt walks ~128;
* ``paths``: built from the same visits as token-path inserts, where nodes
  stay compressed and the walk is a few nodes long.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from fleet import (
    QUERY_TOKENS,
    Conversation,
    make_fleet,
    make_queries,
    metatree_calls,
    stored_events,
)

from radixmeta import MetaTree

PAGE = 16
WORKERS = [4, 64, 256, 1024]
VISITS = 32


@pytest.fixture(scope="module")
def fleet() -> list[Conversation]:
    return make_fleet(seed=0, n_conversations=1024, n_systems=8, page_size=PAGE)


def _records(fleet: list[Conversation], ids: list[Any], n_workers: int) -> list[tuple[Any, ...]]:
    events = stored_events(fleet, n_workers, VISITS, seed=0, page_size=PAGE)
    return [("stored", *call) for call in metatree_calls(fleet, events, ids, PAGE)]


def _tree(fleet: list[Conversation], n_workers: int, shape: str) -> tuple[MetaTree, list[Any]]:
    tree = MetaTree(PAGE)
    ids = [tree.add_worker(f"worker-{i}") for i in range(n_workers)]
    records = _records(fleet, ids, n_workers)
    if shape == "events":
        assert not tree.apply_events(records).any()
    else:
        for e in stored_events(fleet, n_workers, VISITS, seed=0, page_size=PAGE):
            tree.insert(fleet[e.conv].tokens[: e.stop * PAGE], ids[e.worker])
    return tree, records


@pytest.mark.parametrize("shape", ["events", "paths"])
@pytest.mark.parametrize("n_workers", WORKERS)
def test_match_2048(benchmark: Any, fleet: list[Conversation], n_workers: int, shape: str) -> None:
    tree, _ = _tree(fleet, n_workers, shape)
    prompts = [fleet[c].tokens[:QUERY_TOKENS] for c in make_queries(fleet, 256, seed=0)]
    state = {"i": 0}

    def one() -> Any:
        state["i"] = (state["i"] + 1) % len(prompts)
        return tree.match(prompts[state["i"]])

    benchmark.extra_info["nodes"] = tree.node_count
    benchmark(one)


@pytest.mark.parametrize("n_workers", WORKERS)
def test_apply_events(benchmark: Any, fleet: list[Conversation], n_workers: int) -> None:
    tree = MetaTree(PAGE)
    ids = [tree.add_worker(f"worker-{i}") for i in range(n_workers)]
    records = _records(fleet, ids, n_workers)
    blocks = sum(len(r[3]) for r in records)

    def setup() -> tuple[tuple[Any, ...], dict[str, Any]]:
        fresh = MetaTree(PAGE)
        for i in range(n_workers):
            fresh.add_worker(f"worker-{i}")
        return (fresh,), {}

    def apply(fresh: MetaTree) -> None:
        fresh.apply_events(records)  # same WorkerIds: equal by value in a fresh tree

    benchmark.extra_info["blocks"] = blocks
    benchmark.pedantic(apply, setup=setup, rounds=5)
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["blocks_per_s"] = blocks / benchmark.stats.stats.median
