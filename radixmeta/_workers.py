"""The worker registry of a MetaTree, shared by the native and reference cores.

Workers are ``(name, dp_rank)`` pairs mapped to small dense indices, the
positions of the worker in every ``lengths`` array. A freed index is reused by
the next registration (lowest first); the generation in each ``WorkerId``
tells the new holder of an index from the old one, so a stale id is refused
instead of silently naming someone else.

Both cores keep one ``WorkerTable`` and resolve ids through it, which is what
makes their error types and messages identical.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any

from radixmeta._keys import check_int
from radixmeta.errors import (
    DuplicateWorkerError,
    InputTypeError,
    InvalidInputError,
    StaleWorkerError,
)

__all__ = ["WorkerId", "WorkerTable", "resolve_in"]


@dataclass(frozen=True, slots=True)
class WorkerId:
    """A registered worker of a :class:`~radixmeta.MetaTree`.

    Attributes
    ----------
    name : str
        The worker's name, as given to ``add_worker`` (an address, a pod name).
    dp_rank : int
        Its data-parallel rank; ``(name, dp_rank)`` is unique in a tree.
    index : int
        Its position in every ``lengths`` array of the tree.
    generation : int
        How many workers held this index before; tells a reused index apart.
    """

    name: str
    dp_rank: int
    index: int
    generation: int


class WorkerTable:
    """Registry of live workers: ``(name, dp_rank)`` to dense index and back."""

    __slots__ = ("slots", "_by_name", "_free", "_generations", "capacities")

    def __init__(self) -> None:
        # slots[i] is the live WorkerId at index i, or None. Replaced (never
        # mutated) on every change, so a MetaMatch can keep the one it saw.
        self.slots: tuple[WorkerId | None, ...] = ()
        self._by_name: dict[tuple[str, int], WorkerId] = {}
        self._free: list[int] = []  # heap of free indices below len(slots)
        self._generations: list[int] = []
        self.capacities: list[int | None] = []

    def add(self, name: Any, dp_rank: Any, capacity: Any) -> WorkerId:
        """Register a worker; validates everything before changing anything."""
        if not isinstance(name, str):
            msg = f"worker name must be a str, got {type(name).__name__}"
            raise InputTypeError(msg)
        rank = check_int("dp_rank", dp_rank, 0)
        cap = None if capacity is None else self._checked_capacity(capacity)
        if (name, rank) in self._by_name:
            msg = f"worker ({name!r}, dp_rank={rank}) is already registered"
            raise DuplicateWorkerError(msg)
        if self._free:
            index = heapq.heappop(self._free)
        else:
            index = len(self._generations)
            self._generations.append(0)
            self.capacities.append(None)
        worker = WorkerId(name, rank, index, self._generations[index])
        slots = list(self.slots) + [None] * (index + 1 - len(self.slots))
        slots[index] = worker
        self.slots = tuple(slots)
        self._by_name[(name, rank)] = worker
        self.capacities[index] = cap
        return worker

    def resize(self, worker: Any, capacity: Any) -> int:
        """Give approximate ``worker`` another capacity; returns its index.

        Validates everything before changing anything: the worker must be live
        and approximate (a worker's mode is fixed when it is added), the capacity
        an int in ``[0, 2**63)``. The core trims the worker's pages afterwards.
        """
        index = self.resolve(worker)
        if capacity is None:
            msg = (
                "capacity must be an int: None would make an approximate worker exact "
                "(remove it and add it again to change its mode)"
            )
            raise InvalidInputError(msg)
        cap = self._checked_capacity(capacity)
        if self.capacities[index] is None:
            msg = (
                f"{self.slots[index]!r} is exact (added without a capacity): only an "
                "approximate worker's capacity bounds its pages"
            )
            raise InvalidInputError(msg)
        self.capacities[index] = cap
        return index

    @staticmethod
    def _checked_capacity(capacity: Any) -> int:
        cap = check_int("capacity", capacity, 0)
        if cap >= 2**63:
            msg = f"capacity must be below 2**63 tokens, got {cap}"
            raise InvalidInputError(msg)
        return cap

    def remove(self, worker: Any) -> int:
        """Unregister a worker; returns its index."""
        index = self.resolve(worker)
        live = self.slots[index]
        assert live is not None
        del self._by_name[(live.name, live.dp_rank)]
        slots = list(self.slots)
        slots[index] = None
        self.slots = tuple(slots)
        self._generations[index] += 1
        self.capacities[index] = None
        heapq.heappush(self._free, index)
        return index

    def resolve(self, worker: Any) -> int:
        """Return the index of a live ``WorkerId`` of this table, or raise."""
        return resolve_in(self.slots, worker)

    def lookup(self, name: Any, dp_rank: Any) -> WorkerId:
        """The live WorkerId registered as ``(name, dp_rank)``."""
        rank = check_int("dp_rank", dp_rank, 0)
        worker = self._by_name.get((name, rank)) if isinstance(name, str) else None
        if worker is None:
            msg = f"no worker ({name!r}, dp_rank={rank}) is registered"
            raise StaleWorkerError(msg)
        return worker

    @property
    def live(self) -> tuple[WorkerId, ...]:
        return tuple(w for w in self.slots if w is not None)

    def state(self) -> tuple[Any, ...]:
        """Everything needed to rebuild the table (for pickling)."""
        return (self.slots, list(self._generations), list(self.capacities))

    @classmethod
    def from_state(cls, state: tuple[Any, ...]) -> WorkerTable:
        slots, generations, capacities = state
        table = cls()
        table.slots = tuple(slots)
        table._generations = list(generations)
        table.capacities = list(capacities)
        table._by_name = {(w.name, w.dp_rank): w for w in table.slots if w is not None}
        table._free = [i for i, w in enumerate(table.slots) if w is None]
        heapq.heapify(table._free)
        return table


def resolve_in(slots: tuple[WorkerId | None, ...], worker: Any) -> int:
    """The index of ``worker`` if it is live in ``slots`` (a table's, or one a match saw)."""
    if not isinstance(worker, WorkerId):
        msg = f"worker must be a WorkerId returned by add_worker, got {type(worker).__name__}"
        raise InputTypeError(msg)
    index = worker.index
    if isinstance(index, int) and 0 <= index < len(slots):
        live = slots[index]
        if live is worker or live == worker:
            return index
    msg = f"{worker!r} is not a live worker of this tree (removed, or from another tree)"
    raise StaleWorkerError(msg)


def best_of(slots: tuple[WorkerId | None, ...], lengths: Any) -> tuple[WorkerId, int] | None:
    """The live worker with the greatest length, the lowest index among equals."""
    best: tuple[WorkerId, int] | None = None
    for index, worker in enumerate(slots):
        if worker is not None and (best is None or int(lengths[index]) > best[1]):
            best = (worker, int(lengths[index]))
    return best
