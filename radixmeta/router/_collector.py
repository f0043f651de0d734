"""Pausing Python's cyclic garbage collector over one bulk step of the router.

A large ``dispatch_batch`` allocates a handful of container objects per request
(its request, view, decision, group lists and hold) and keeps every one of them
until it returns: none is garbage. The collector cannot know that, and with its
default thresholds it runs a young collection every 700 new containers and full
ones as the survivors pile up, walking the batch's objects again and again. On a
100,000-request batch that was 40 to 58 % of the CPU time (bench/bench_batch_trie.py,
docs/performance.md). Pausing it for the step and letting it run afterwards frees
exactly the same garbage, only later.

Measured again once a batch made only four container objects a request (the groups
plain tuples, no class per batch): a 100,000-request batch still took 1.5 to 2.1 times
the CPU time without the pause (docs/performance.md, "The collector, measured again"),
so the pause stays, global as the collector's switch is.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Disable the cyclic garbage collector for the ``with`` body, if it is enabled.

    It is enabled again on the way out, whatever ends the body. Left alone when it
    was off already (the caller's choice, or another pause around this one), so
    nested or concurrent pauses never turn it on under someone else's pause, and a
    collector the application disabled stays disabled. Reference counting, which
    frees almost all garbage, is unaffected: only reference cycles wait.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
