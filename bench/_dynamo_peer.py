"""ai-dynamo-runtime 1.6.1's Python ``RadixTree`` (Dynamo's KV-router index) as a benchmark peer.

``bench/compare_dynamo.py`` drives it next to radixmeta's ``MetaTree``. This
module only imports the installed ``dynamo`` package; nothing is copied from it.

API facts, each checked by hand on this machine (``/work/venv-dyn``, CPython
3.11.7, ``ai-dynamo-runtime==1.6.1`` from PyPI, no NATS/etcd running):

* ``from dynamo.llm import RadixTree, compute_block_hash_for_seq`` (both live
  in ``dynamo._core``). ``RadixTree()`` takes no arguments. Every method is a
  round trip to a background thread that owns the tree (the stub says
  "operations route to a dedicated background thread").
* ``tree.apply_event(worker_id: int, event: bytes) -> None``; the JSON forms::

      {"event_id": 0, "data": {"stored": {"parent_hash": null,
          "blocks": [{"block_hash": 100, "tokens_hash": 1}]}}, "dp_rank": 0}
      {"event_id": 1, "data": {"removed": {"block_hashes": [100]}}, "dp_rank": 0}
      {"event_id": 2, "data": "cleared", "dp_rank": 0}

  ``dp_rank`` may be omitted (it defaults to 0). Hashes are JSON u64: the whole
  range ``[0, 2**64)`` round-trips, a negative number raises ``ValueError``
  ("Failed to deserialize KvCacheEvent"). An unknown parent raises
  ``RuntimeError("Failed to apply event: Failed to find parent block")`` (and
  logs a WARN line); an unknown removed hash raises ``RuntimeError("... Failed
  to find block")``. Storing the same blocks twice is accepted.
* ``tree.find_matches(local_hashes: list[int], early_exit=False)`` returns an
  ``OverlapScores``. Its ``.scores`` builds a new ``dict`` on every access,
  ``{(worker_id, dp_rank): matched blocks}``, with workers that match nothing
  absent; ``.frequencies`` is ``[]`` (1.6.1 has no expiration window).
* ``compute_block_hash_for_seq(tokens, kv_block_size) -> list[int]``: one hash
  per *full* block, equal to ``xxhash.xxh3_64_intdigest(<block as little-endian
  u32>, seed=1337)`` (checked with xxhash 3.x on random 64-token sequences). It
  accepts a list or a numpy ``uint32`` array.

Semantics that differ from ``MetaTree`` (found while writing this peer):

* One engine hash per page for the whole fleet. A worker that names an
  existing page (same tokens under the same parent) with a *different*
  ``block_hash`` than the worker that created it is accepted, but a later
  event using that hash as ``parent_hash`` fails ("Failed to find parent
  block"). Engines hash content deterministically, so the workload gives each
  page one hash for all workers; ``MetaTree`` keeps a map per worker and does
  not need that.
* Removing a block in the middle of a worker's chain also drops the worker's
  deeper blocks on that path: their hashes become unknown ("Failed to find
  block"), and after the gap is stored again the worker scores only up to the
  gap's end. ``MetaTree`` keeps the deeper marks (its gap rule), so they count
  again once the gap is refilled. The benchmark removes leaf first, as engines
  evict, so both trees agree on every query.
* A store whose parent is such a dropped block raises ``IndexError("list index
  out of range")`` rather than the parent error.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Sequence
from typing import Any

__all__ = [
    "DYNAMO_RECIPE_HINT",
    "EXPECTED_DYNAMO_VERSION",
    "encode_removed",
    "encode_stored",
    "load_dynamo",
    "local_hashes",
    "scores_by_worker",
    "DynamoPeer",
]

EXPECTED_DYNAMO_VERSION = "1.6.1"
DYNAMO_RECIPE_HINT = (
    "dynamo is not importable in this interpreter. The Dynamo peer runs in a separate "
    "venv: see bench/README.md, section 'Dynamo peer' (python3.11 -m venv /work/venv-dyn; "
    "pip install ai-dynamo-runtime==1.6.1 numpy). Run compare_dynamo.py with --no-dynamo "
    "to time radixmeta alone."
)


def load_dynamo() -> dict[str, Any]:
    """Import ``dynamo.llm`` and return its version; ``ModuleNotFoundError`` with the recipe."""
    try:
        from dynamo import llm
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(DYNAMO_RECIPE_HINT) from exc
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("ai-dynamo-runtime")
    except PackageNotFoundError:
        found = None
    if found != EXPECTED_DYNAMO_VERSION:
        msg = f"ai-dynamo-runtime {found} found; the peer was verified on {EXPECTED_DYNAMO_VERSION}"
        warnings.warn(msg, stacklevel=2)
    return {"version": found, "module": llm}


def local_hashes(tokens: Any, page_size: int) -> list[int]:
    """Dynamo's per-block content hashes (``tokens_hash``) of every full page of ``tokens``."""
    from dynamo.llm import compute_block_hash_for_seq

    return list(compute_block_hash_for_seq(tokens, page_size))


def encode_stored(
    event_id: int, parent: int | None, block_hashes: Sequence[int], tokens_hashes: Sequence[int]
) -> bytes:
    blocks = [
        {"block_hash": b, "tokens_hash": t}
        for b, t in zip(block_hashes, tokens_hashes, strict=True)
    ]
    data = {"stored": {"parent_hash": parent, "blocks": blocks}}
    return json.dumps({"event_id": event_id, "data": data, "dp_rank": 0}).encode()


def encode_removed(event_id: int, block_hashes: Sequence[int]) -> bytes:
    data = {"removed": {"block_hashes": list(block_hashes)}}
    return json.dumps({"event_id": event_id, "data": data, "dp_rank": 0}).encode()


def scores_by_worker(scores: dict[tuple[int, int], int], out: Any) -> None:
    """Write a ``.scores`` dict into ``out[worker_id]`` (blocks); absent workers are left alone."""
    for (worker, _dp_rank), blocks in scores.items():
        out[worker] = blocks


class DynamoPeer:
    """Runs whole loops over a Dynamo ``RadixTree``, with bound methods in locals.

    Workers are named by their dense index (``worker_id = index``, ``dp_rank = 0``),
    which is also their index in radixmeta's ``lengths`` arrays.
    """

    def __init__(self) -> None:
        from dynamo.llm import RadixTree

        self._new = RadixTree

    def new_tree(self) -> Any:
        return self._new()

    def apply_all(self, tree: Any, events: Sequence[tuple[int, bytes]]) -> None:
        apply = tree.apply_event
        for worker, payload in events:
            apply(worker, payload)

    def match_latencies(self, tree: Any, queries: Sequence[list[int]], scores: bool) -> list[int]:
        """Nanoseconds per ``find_matches`` call (plus reading ``.scores`` if ``scores``)."""
        find = tree.find_matches
        clock = time.perf_counter_ns
        out: list[int] = []
        append = out.append
        if scores:
            for q in queries:
                t0 = clock()
                find(q).scores  # noqa: B018  (the dict is built on access: that is the cost)
                append(clock() - t0)
        else:
            for q in queries:
                t0 = clock()
                find(q)
                append(clock() - t0)
        return out

    def scores(self, tree: Any, query: list[int]) -> dict[tuple[int, int], int]:
        return dict(tree.find_matches(query).scores)
