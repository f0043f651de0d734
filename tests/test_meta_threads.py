"""Hammer one MetaTree from several threads, then check it against sequential runs.

Each thread owns its workers and drives them with its own seeded operations;
another thread's calls may interleave at any point. What a worker holds
depends only on the calls made for it, so after the run every worker must hold
exactly the pages that a sequential replay of its thread's calls produces on a
fresh tree, and the shared tree must pass its invariant check.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import pytest

THREADS = 4
OPS_PER_THREAD = 1500
PAGE = 2


def _script(seed: int) -> list[tuple[Any, ...]]:
    """A thread's calls: (method, worker slot, args) over a small shared key pool."""
    rnd = random.Random(seed)
    pool = [[rnd.randrange(3) for _ in range(rnd.randrange(2, 12))] for _ in range(12)]
    calls: list[tuple[Any, ...]] = []
    for _ in range(OPS_PER_THREAD):
        slot = rnd.randrange(2)
        key = rnd.choice(pool)
        pages = len(key) // PAGE
        roll = rnd.random()
        if roll < 0.4:
            calls.append(("insert", slot, key, PAGE * rnd.randrange(pages + 1)))
        elif roll < 0.55:
            calls.append(("remove", slot, key, PAGE * rnd.randrange(pages + 1)))
        elif roll < 0.75:
            # A hash per page path, as engines derive them (a worker never names one page
            # by two hashes: that is a conflict, refused).
            hashes = [hash(tuple(key[: (i + 1) * PAGE])) % (1 << 62) for i in range(pages)]
            calls.append(("stored", slot, hashes, key[: pages * PAGE]))
        elif roll < 0.85:
            calls.append(("match", slot, key))
        elif roll < 0.9:
            calls.append(("cleared", slot))
        else:
            calls.append(("respawn", slot))  # remove the worker and add it again
    return calls


def _run(tree: Any, names: list[str], calls: list[tuple[Any, ...]], capacity: int | None) -> None:
    workers = [tree.add_worker(name, capacity=capacity) for name in names]
    for call in calls:
        kind, slot = call[0], call[1]
        worker = workers[slot]
        if kind == "insert":
            tree.insert(call[2], worker, start=call[3])
        elif kind == "remove":
            tree.remove(call[2], worker, start=call[3])
        elif kind == "stored":
            tree.apply_stored(worker, None, call[2], call[3])
        elif kind == "match":
            tree.match(call[2])  # touch=True would refresh the other threads' workers too
        elif kind == "cleared":
            tree.apply_cleared(worker)
        else:
            tree.remove_worker(worker)
            workers[slot] = tree.add_worker(names[slot], capacity=capacity)


def _pages(tree: Any, worker: Any) -> set[tuple[int, ...]]:
    out = set()
    for key, start, *_ in tree.dump(worker):
        toks = tuple(key.tolist())
        out.update(toks[:end] for end in range(start + PAGE, len(toks) + 1, PAGE))
    return out


@pytest.mark.parametrize("capacity", [None, 8])
def test_threads_leave_each_worker_as_a_sequential_run(
    meta_impl: type, fast_switching: None, capacity: int | None
) -> None:
    tree = meta_impl(PAGE)
    scripts = [_script(seed) for seed in range(THREADS)]
    names = [[f"t{t}-w{s}" for s in range(2)] for t in range(THREADS)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(THREADS)

    def body(t: int) -> None:
        try:
            barrier.wait()
            _run(tree, names[t], scripts[t], capacity)
        except BaseException as exc:  # reported below: a thread's error must fail the test
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(t,)) for t in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    tree.check()
    for t in range(THREADS):
        alone = meta_impl(PAGE)
        _run(alone, names[t], scripts[t], capacity)
        for name in names[t]:
            assert _pages(tree, tree.worker(name)) == _pages(alone, alone.worker(name)), name
