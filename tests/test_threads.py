"""Hammer one cache from several threads, then check it is consistent.

Each slot value is inserted at most once, so whatever the interleaving, the values the
tree holds must be exactly those stored minus those freed, and the counters must add up.
"""

from __future__ import annotations

import functools
import random
import threading
from collections.abc import Callable
from typing import Any

import pytest

from radixmeta import RadixCache, _reference
from radixmeta.errors import CacheFullError, StaleNodeError

THREADS = 4
OPS_PER_THREAD = 3000


class Worker(threading.Thread):
    def __init__(self, cache: Any, index: int, seed: int, barrier: threading.Barrier) -> None:
        super().__init__(name=f"hammer-{index}")
        self.cache = cache
        self.index = index
        self.seed = seed
        self.barrier = barrier
        self.stored: list[int] = []  # slot values the tree kept from our inserts
        self.freed: list[int] = []  # slot values handed back by evict
        self.lookups = self.hit_tokens = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.hammer()
        except BaseException as exc:  # reported by the main thread
            self.error = exc

    def hammer(self) -> None:
        rng = random.Random(self.seed)
        cache = self.cache
        next_slot = (self.index + 1) * 10**9
        held: list[Any] = []
        namespaces = [None, "shared", f"own-{self.index}"]
        stems = [[rng.randrange(6) for _ in range(12)] for _ in range(3)]
        self.barrier.wait()
        for _ in range(OPS_PER_THREAD):
            stem = rng.choice(stems)
            key = stem[: rng.randrange(len(stem) + 1)] + [
                rng.randrange(6) for _ in range(rng.randrange(4))
            ]
            namespace = rng.choice(namespaces)
            op = rng.random()
            if op < 0.35:
                values = list(range(next_slot, next_slot + len(key)))
                next_slot += len(key)
                try:
                    kept_from = cache.insert(key, values, namespace=namespace)
                except CacheFullError:
                    continue
                aligned = len(key) - len(key) % cache.page_size
                self.stored.extend(values[kept_from:aligned])
            elif op < 0.65:
                result = cache.match_prefix(key, namespace=namespace)
                self.lookups += 1
                self.hit_tokens += result.length
                if rng.random() < 0.5 and len(held) < 8:
                    try:
                        cache.lock(result.node)  # may have been evicted meanwhile
                    except StaleNodeError:
                        continue
                    held.append(result.node)
            elif op < 0.8 and held:
                cache.unlock(held.pop(rng.randrange(len(held))))  # never stale: it is locked
            else:
                self.freed.extend(cache.evict(rng.randrange(8)).values.tolist())
        for node in held:
            cache.unlock(node)


def hammer(make: Callable[..., Any], seed: int) -> None:
    """Hammer ``make(on_evict=...)``; the slots capacity eviction frees are counted as freed."""
    evicted: list[int] = []
    cache = make(on_evict=evicted.extend)  # list.extend is atomic under the GIL
    barrier = threading.Barrier(THREADS)
    workers = [Worker(cache, i, seed + i, barrier) for i in range(THREADS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert not any(w.is_alive() for w in workers), "a hammer thread hung"
    errors = [w.error for w in workers if w.error is not None]
    if errors:
        raise errors[0]
    cache.check()
    freed = [v for w in workers for v in w.freed] + evicted
    stored = [v for w in workers for v in w.stored]
    held = {
        int(v)
        for ns in cache.namespaces()
        for _, values in cache.items(namespace=ns)
        for v in values
    }
    assert len(stored) == len(set(stored))
    assert len(freed) == len(set(freed)), "a slot was freed twice"
    assert set(freed) <= set(stored), "a slot never stored was freed"
    assert held == set(stored) - set(freed)
    assert cache.protected_size == 0
    assert cache.evictable_size == cache.total_size == len(held)
    if cache.capacity is not None:
        assert cache.total_size <= cache.capacity
    stats = cache.stats
    assert stats.lookups == sum(w.lookups for w in workers)
    assert stats.hit_tokens == sum(w.hit_tokens for w in workers)
    assert stats.inserted_tokens == len(stored)
    assert stats.evicted_tokens == len(freed)
    # everything left can still be evicted, which returns exactly what was held
    assert sorted(cache.evict(10**9).values.tolist()) == sorted(held)
    assert cache.node_count == 0


@pytest.mark.parametrize("capacity", [None, 64])
@pytest.mark.parametrize("page_size", [1, 2])
def test_threads_on_radix_cache(
    fast_switching: None, rng: Any, page_size: int, capacity: int | None
) -> None:
    """The public RadixCache on the active backend (GIL-atomic native, or the locked reference)."""
    make = functools.partial(RadixCache, page_size, eviction="lru", capacity=capacity)
    hammer(make, rng.randrange(2**32))


def test_threads_on_reference_core(fast_switching: None, rng: Any) -> None:
    """The reference takes a lock per call, so it must survive the same hammering."""
    make = functools.partial(_reference.CacheCore, 1, eviction="lru", capacity=48)
    hammer(make, rng.randrange(2**32))


@pytest.mark.parametrize("eviction", ["lfu", "priority"])
def test_threads_on_native_core(fast_switching: None, rng: Any, native: Any, eviction: str) -> None:
    make = functools.partial(native.CacheCore, 1, eviction=eviction, capacity=48)
    hammer(make, rng.randrange(2**32))
