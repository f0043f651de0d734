"""A fleet of chat workers for the router benchmarks: conversations and their KV events.

Shared by ``compare_dynamo.py`` (MetaTree against Dynamo) and ``bench_meta.py``
(pytest-benchmark). Seeded and deterministic:

* 8 system prompts of 512-1,024 tokens; conversations of a system prompt plus
  turns of 64-384 tokens, up to at least 2,048 tokens.
* The block (engine) hash of a page is a rolling 64-bit hash of the prefix up
  to it, so a page has one hash fleet-wide, as with real engines.
* Each worker visits conversations with Zipf(1) popularity and caches each up
  to the end of a random turn, announcing only blocks it does not hold yet, in
  events of 16-64 blocks chained by their parent hash.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

VOCAB = 128_000
QUERY_TOKENS = 2048
MASK64 = (1 << 64) - 1


@dataclass(frozen=True)
class Conversation:
    tokens: np.ndarray  # uint32
    hashes: list[int]  # engine block hash of every whole page (rolling over the prefix)
    turn_ends: tuple[int, ...]  # token offsets where a turn ends


@dataclass(frozen=True)
class StoredEvent:
    worker: int
    conv: int
    start: int  # first page of the event in the conversation
    stop: int

    @property
    def parent_index(self) -> int | None:
        return self.start - 1 if self.start else None


def _mix64(x: int) -> int:
    """splitmix64's finalizer: a cheap, well-spread 64-bit mix."""
    x = (x + 0x9E3779B97F4A7C15) & MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK64
    return x ^ (x >> 31)


def chain_hashes(tokens: np.ndarray, page_size: int) -> list[int]:
    """Rolling hash per whole page: a page's hash depends on every token up to its end.

    This stands in for the engine's sequence hash (vLLM and SGLang chain a
    digest of the parent hash and the page's tokens), so equal prefixes get
    equal hashes on every worker, which Dynamo requires.
    """
    n = len(tokens) // page_size
    # Odd weights are invertible mod 2**64: changing any one token changes the digest.
    weights = np.random.default_rng(0x5EED).integers(1, 2**63, size=page_size, dtype=np.uint64)
    weights |= np.uint64(1)
    pages = tokens[: n * page_size].reshape(n, page_size).astype(np.uint64)
    digests = (pages * weights).sum(axis=1, dtype=np.uint64)
    out = []
    h = 0
    for d in digests.tolist():
        h = _mix64(h ^ d)
        out.append(h)
    return out


def make_fleet(
    seed: int, n_conversations: int, n_systems: int, page_size: int
) -> list[Conversation]:
    rng = np.random.default_rng(seed)
    systems = [
        rng.integers(0, VOCAB, size=int(rng.integers(512, 1025)), dtype=np.uint32)
        for _ in range(n_systems)
    ]
    fleet = []
    for _ in range(n_conversations):
        parts = [systems[int(rng.integers(n_systems))]]
        ends = []
        length = len(parts[0])
        while length < QUERY_TOKENS:
            turn = int(rng.integers(64, 385))
            parts.append(rng.integers(0, VOCAB, size=turn, dtype=np.uint32))
            length += turn
            ends.append(length)
        tokens = np.concatenate(parts)
        fleet.append(Conversation(tokens, chain_hashes(tokens, page_size), tuple(ends)))
    return fleet


def popularity(n: int) -> np.ndarray:
    """Zipf(1) weights: a few conversations are cached by many workers, most by few."""
    w = 1.0 / np.arange(1, n + 1)
    return w / w.sum()


def stored_events(
    fleet: list[Conversation], n_workers: int, visits: int, seed: int, page_size: int
) -> list[StoredEvent]:
    """The fleet's stored events, visits of all workers interleaved.

    A visit caches a conversation up to the end of a random turn; the worker
    announces only the pages it does not hold yet (its longest held prefix of
    the conversation is the parent), cut into events of 16-64 pages.
    """
    rng = np.random.default_rng([seed, n_workers])
    convs = rng.choice(len(fleet), size=(n_workers, visits), p=popularity(len(fleet)))
    plan = [(w, int(c)) for w in range(n_workers) for c in convs[w]]
    order = rng.permutation(len(plan))
    held: list[set[int]] = [set() for _ in range(n_workers)]
    events = []
    for i in order.tolist():
        w, c = plan[i]
        conv = fleet[c]
        depth = conv.turn_ends[int(rng.integers(len(conv.turn_ends)))] // page_size
        hashes, mine = conv.hashes, held[w]
        k = 0
        while k < depth and hashes[k] in mine:
            k += 1
        while k < depth:
            stop = min(depth, k + int(rng.integers(16, 65)))
            events.append(StoredEvent(w, c, k, stop))
            mine.update(hashes[k:stop])
            k = stop
    return events


def make_queries(fleet: list[Conversation], n: int, seed: int) -> list[int]:
    """Conversation indices of the prompts: 3/4 as popular as the visits, 1/4 uniform."""
    rng = np.random.default_rng([seed, 7])
    popular = rng.choice(len(fleet), size=n, p=popularity(len(fleet)))
    uniform = rng.integers(len(fleet), size=n)
    return np.where(rng.random(n) < 0.75, popular, uniform).tolist()


def describe(fleet: list[Conversation], events: list[StoredEvent], n_workers: int) -> dict:
    blocks = sum(e.stop - e.start for e in events)
    pages = {h for e in events for h in fleet[e.conv].hashes[e.start : e.stop]}
    return {
        "workers": n_workers,
        "events": len(events),
        "blocks": blocks,  # = (worker, page) pairs held: a worker never re-announces a page
        "distinct_pages": len(pages),
        "blocks_per_event": blocks / len(events) if events else 0.0,
    }


def metatree_calls(
    fleet: list[Conversation], events: list[StoredEvent], ids: list[Any], page_size: int
) -> list[tuple[Any, int | None, np.ndarray, np.ndarray]]:
    """``apply_stored`` arguments: (worker, parent hash, uint64 hashes, uint32 tokens)."""
    calls = []
    for e in events:
        conv = fleet[e.conv]
        parent = None if e.parent_index is None else conv.hashes[e.parent_index]
        hashes = np.array(conv.hashes[e.start : e.stop], dtype=np.uint64)
        tokens = conv.tokens[e.start * page_size : e.stop * page_size]
        calls.append((ids[e.worker], parent, hashes, tokens))
    return calls
