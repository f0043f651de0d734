"""Scheduler-shaped parity with SGLang 0.5.23's own trees, for every eviction policy (issue 21).

Random request streams (arrivals sharing prefixes, SGLang's waiting-queue
passes, chunked prefills, decode steps, finishes, aborts, retractions,
evictions, flushes) run through SGLang's own ``Req`` and scheduling functions
(``tests/_sglang_scheduler.py``) on radixmeta's backend and on SGLang's
default ``UnifiedRadixCache`` (Rust core), and on its classic ``RadixCache``
where the two SGLang trees agree (not FIFO: the classic tree stamps a split's
upper half as new, the default one keeps the stamp; radixmeta follows the
default). After every step all must agree on who computed the KV behind every
matched slot and every freed slot, on the waiting queue's order and matched
lengths, and on the sizes; at the end every slot is back in the allocator.
A fault injected on radixmeta's side must break that agreement.

Skipped without SGLang (it runs in the SGLang stage of .ci/run).
"""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import _sglang as H
import pytest

if not H.HAVE_SGLANG:
    pytest.skip(H.SKIP_REASON, allow_module_level=True)

import _sglang_scheduler as T

KINDS = {
    "lru": ("radixmeta", "unified", "classic"),
    "lfu": ("radixmeta", "unified", "classic"),
    "priority": ("radixmeta", "unified", "classic"),
    "fifo": ("radixmeta", "unified"),  # the classic tree restamps a split's upper half
}


def schedulers(eviction: str, page_size: int) -> list[T.Scheduler]:
    H.set_server_args(page_size)
    size = 224 if page_size == 1 else 640  # small: the allocator evicts as it fills
    return [
        T.Scheduler(kind, page_size=page_size, eviction=eviction, size=size, chunk=32)
        for kind in KINDS[eviction]
    ]


def step(scheds: list[T.Scheduler], method: str, *args: Any) -> Any:
    """``method(*args)`` on every scheduler; every observation must be radixmeta's."""
    seen = [getattr(s, method)(*args) for s in scheds]
    for s, obs in zip(scheds[1:], seen[1:], strict=True):
        assert obs == seen[0], f"{method}{args}: radixmeta {seen[0]!r} != {s.kind} {obs!r}"
    return seen[0]


def stream(scheds: list[T.Scheduler], rng: random.Random, steps: int) -> None:
    """A random scheduler-shaped request stream, then a drain; the allocator ends full."""
    lead = scheds[0]
    docs = [[rng.randrange(1, 500) for _ in range(rng.randrange(16, 112))] for _ in range(4)]
    count = 0
    for _ in range(steps):
        r = rng.random()
        running = sorted(lead.running)
        if r < 0.22:
            if len(lead.waiting) < 10:
                doc = docs[rng.randrange(len(docs))]
                prompt = doc[: rng.randrange(len(doc) + 1)]
                prompt += [rng.randrange(1, 500) for _ in range(rng.randrange(1, 40))]
                outputs = [rng.randrange(1, 500) for _ in range(rng.randrange(1, 12))]
                step(scheds, "arrive", f"r{count}", prompt, outputs, rng.randrange(3))
                count += 1
        elif r < 0.34:
            step(scheds, "calc_priority", rng.choice(["fcfs", "lpm"]))
        elif r < 0.54:
            step(scheds, "admit")
        elif r < 0.74:
            step(scheds, "decode")
        elif r < 0.84 and running:
            step(scheds, "finish", rng.choice(running))
        elif r < 0.88 and running:
            step(scheds, "abort", rng.choice(running))
        elif r < 0.92 and running:
            step(scheds, "retract", rng.choice(running))
        elif r < 0.98:
            step(scheds, "evict", rng.randrange(1, 96))
        elif not running and lead.chunked is None:
            step(scheds, "flush")
    drain(scheds)


def drain(scheds: list[T.Scheduler]) -> None:
    """Finish what runs, then the chunked prefill (it may wait for their memory)."""
    lead = scheds[0]
    for rid in sorted(lead.running):
        step(scheds, "finish", rid)
    if lead.chunked is not None:
        rid = lead.chunked.rid
        while lead.chunked is not None:
            admitted = step(scheds, "admit")[0]
            assert admitted is not None, "an idle scheduler has room for one chunk"
        step(scheds, "finish", rid)
    step(scheds, "evict", 10**9)
    for s in scheds:
        assert s.leaked() == Counter({"slots": 0}), f"{s.kind} did not get every slot back"
        assert (s.cache.evictable_size(), s.cache.protected_size()) == (0, 0), s.kind


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("eviction", ["lru", "lfu", "fifo", "priority"])
def test_a_random_stream_frees_and_reuses_the_same_kv_as_sglang(
    eviction: str, page_size: int
) -> None:
    for seed in range(SEEDS):
        scheds = schedulers(eviction, page_size)
        stream(scheds, random.Random(f"{eviction}-{page_size}-{seed}"), STEPS)


STEPS = 600  # a stream's scheduler steps (about 0.1 s per seed and policy here)
SEEDS = 4


class _Faulty:
    """radixmeta's tree with one fault, to show the comparison catches it."""

    def __init__(self, tree: Any, fault: str) -> None:
        self._tree = tree
        self._fault = fault
        self._locks = 0
        self._dropped: Counter[Any] = Counter()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tree, name)

    def insert(self, key: Any, values: Any = None, *, counted: int = 0, **kw: Any) -> int:
        if self._fault == "lfu-off-by-one" and counted:
            counted -= 1  # `>=` for `>`: counts again the node that ends where a store ended
        return int(self._tree.insert(key, values, counted=counted, **kw))

    def lock(self, node: Any) -> None:
        self._locks += 1
        if self._fault == "dropped-lock" and self._locks % 7 == 0 and node.length:
            self._dropped[node] += 1  # one request's lock is lost
            return
        self._tree.lock(node)

    def unlock(self, node: Any) -> None:
        if self._dropped[node]:
            self._dropped[node] -= 1
            return
        self._tree.unlock(node)


@pytest.mark.parametrize(
    ("fault", "eviction", "page_size"),
    [
        ("lfu-off-by-one", "lfu", 1),
        ("dropped-lock", "lru", 16),
        ("fast-match-true", "lru", 1),  # the answer the backend gave before issue 21
    ],
)
def test_a_fault_in_radixmeta_breaks_the_comparison(
    fault: str, eviction: str, page_size: int
) -> None:
    scheds = schedulers(eviction, page_size)
    backend = scheds[0].cache
    if fault == "fast-match-true":
        backend.supports_fast_match_prefix = lambda: True
    else:
        backend._cache = _Faulty(backend._cache, fault)
    with pytest.raises(AssertionError, match="radixmeta"):
        stream(scheds, random.Random(f"{eviction}-{page_size}-0"), STEPS)
