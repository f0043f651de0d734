"""Native and reference side by side on long keys and big trees.

The state machine keeps keys short so it can explore many interleavings; this
seeded run covers what only long keys reach: whole-label memcmp (64+ tokens),
the vectorised value copy (256+), labels in chunks of their own (16k+ tokens),
arena evacuation after heavy eviction, in-place int32/uint32 keys, pages of 16
with many children sharing a first token, and extreme priorities.
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from radixmeta import _reference
from radixmeta.testing import EvictionLog, snapshot

DTYPES = (np.int64, np.uint32, np.int32)
PRIORITIES = (-(2**63), -1, 0, 5, 2**63 - 1)


def outcome(method: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return ("ok", method(*args, **kwargs))
    except Exception as exc:  # compared across implementations, type and message
        return ("error", type(exc).__name__, str(exc))


@pytest.mark.parametrize("capacity", [None, 30_000])
@pytest.mark.parametrize("eviction", ["lru", "priority"])
@pytest.mark.parametrize("page_size", [1, 16])
def test_long_keys_match_the_reference(
    native: Any, page_size: int, eviction: str, capacity: int | None
) -> None:
    rng = random.Random(f"{page_size}-{eviction}-{capacity}")
    logs = [EvictionLog(), EvictionLog()]
    caches = [
        native.CacheCore(page_size, eviction=eviction, capacity=capacity, on_evict=logs[0]),
        _reference.CacheCore(page_size, eviction=eviction, capacity=capacity, on_evict=logs[1]),
    ]
    # Tiny alphabets make long shared prefixes and many siblings with one first token.
    stems = [[rng.randrange(3) for _ in range(n)] for n in (70, 300, 2_000, 20_000)]
    handles: list[list[Any]] = []
    slot = 10**12
    for step in range(120):
        stem = rng.choice(stems)
        tail = [rng.randrange(3) for _ in range(rng.randrange(300))]
        key = stem[: rng.randrange(len(stem) + 1)] + tail
        namespace = rng.choice([None, "lora-1"])
        roll = rng.random()
        if roll < 0.45:
            values = np.arange(slot, slot + len(key), dtype=np.int64)
            slot += len(key)
            array = np.array(key, dtype=rng.choice(DTYPES))
            priority = rng.choice(PRIORITIES)
            results = [
                outcome(c.insert, array, values, namespace=namespace, priority=priority)
                for c in caches
            ]
        elif roll < 0.75:
            array = np.array(key, dtype=rng.choice(DTYPES))
            matches = [c.match_prefix(array, namespace=namespace) for c in caches]
            results = [(m.length, m.values.tolist()) for m in matches]
            handles.append([m.node for m in matches])
        elif roll < 0.85 and handles:
            pair = rng.choice(handles)
            method = rng.choice(["lock", "unlock"])
            results = [outcome(getattr(c, method), h) for c, h in zip(caches, pair, strict=True)]
        else:
            amount = rng.randrange(20_000)
            results = [c.evict(amount).values.tolist() for c in caches]
        assert results[0] == results[1], f"step {step}: {str(results)[:300]}"
        taken = [log.take() for log in logs]
        assert taken[0] == taken[1], f"step {step}"
        for c in caches:
            c.check()
        assert snapshot(caches[0]) == snapshot(caches[1]), f"step {step}"
