"""The small pieces the built-in policies' ``rank`` methods share.

A policy's ``rank(request, view)`` lists every worker of the view, best first, the
first being what ``choose`` would pick for the same view in the policy's current
state. ``rank`` never changes that state: a policy that draws at random draws from
a copy of its generator (:func:`generator_copy`), so the ``choose`` that follows
draws the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from random import Random
from typing import Any

from radixmeta._workers import WorkerId

__all__ = ["first_then", "generator_copy", "in_order"]


def generator_copy(rng: Random) -> Random:
    """A generator in the same state as ``rng`` (drawing from it leaves ``rng`` as it was)."""
    copy = Random()
    copy.setstate(rng.getstate())
    return copy


def in_order(
    workers: Sequence[WorkerId], positions: Iterable[int], key: Callable[[int], Any]
) -> list[WorkerId]:
    """The workers at ``positions``, sorted by ``key`` of their position.

    The sort is stable, so workers of equal key stay in the order ``positions`` gives
    them: the order in which a policy's ``choose`` scans (and keeps the first of equals).
    """
    return [workers[i] for i in sorted(positions, key=key)]


def first_then(
    workers: Sequence[WorkerId], first: int, key: Callable[[int], Any]
) -> list[WorkerId]:
    """``workers[first]``, then every other worker sorted by ``key`` (stable)."""
    rest = in_order(workers, (i for i in range(len(workers)) if i != first), key)
    return [workers[first], *rest]
