"""The router's registry: its workers, which of them are up, and the load each carries.

Everything here is indexed by the tree's worker index. The loads live in plain
lists (requests in flight, uncached prefill tokens, decode tokens) so that a view
takes a copy of each in one step; what every view shares (the up workers, their
capacities and reports) is rebuilt only when a worker comes, goes or changes.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from itertools import compress
from operator import itemgetter
from typing import TYPE_CHECKING, Any, TypeVar

from radixmeta._workers import WorkerId
from radixmeta.errors import InputTypeError, PolicyError, StaleWorkerError
from radixmeta.policies.base import Choice, EngineLoad, View
from radixmeta.router.decision import CHOSEN

if TYPE_CHECKING:
    from radixmeta.meta import MetaTree

__all__ = ["Loads", "Registry", "Spill", "WorkerLoad", "WorkerRecord"]

T = TypeVar("T")

#: Per worker index: requests in flight, uncached prefill tokens, decode tokens.
Loads = tuple[list[int], list[int], list[int]]
Detail = tuple[tuple[str, float], ...]


@dataclass(frozen=True, slots=True)
class WorkerLoad:
    """One worker's load as the router counts it (``Router.load``).

    Attributes
    ----------
    requests : int
        Requests dispatched to it and not finished.
    prefill_tokens : int
        Uncached prompt tokens of those not yet past prefill.
    decode_tokens : int
        Prompt plus expected output tokens of those in decode.
    up : bool
        Whether policies may choose it.
    capacity : int or None
        Its KV capacity in tokens, when given.
    reported : EngineLoad or None
        What its engine last reported through ``report_load``.
    """

    requests: int
    prefill_tokens: int
    decode_tokens: int
    up: bool
    capacity: int | None
    reported: EngineLoad | None


@dataclass(slots=True)
class WorkerRecord:
    """The router's record of one registered worker (counters only grow)."""

    worker: WorkerId
    capacity: int | None
    up: bool = True
    reported: EngineLoad | None = None
    dispatches: int = 0
    hit_tokens: int = 0
    prompt_tokens: int = 0
    finished: int = 0
    expired: int = 0
    output_tokens: int = 0


class Registry:
    """The registered workers by index, their loads, and what every view shares.

    Parameters
    ----------
    tree : MetaTree
        The router's tree: its page size and whether it holds host pages go into views.

    Attributes
    ----------
    records : list of WorkerRecord or None
        Per worker index, its record (None: a free index).
    requests, prefill, decode : list of int
        Per worker index, its loads.
    up : tuple of WorkerId
        The workers a policy may choose, by index.
    """

    __slots__ = (
        "tree",
        "page_size",
        "records",
        "requests",
        "prefill",
        "decode",
        "up",
        "up_index",
        "dense",
        "capacities",
        "reported",
        "position",
        "align",
        "bounded",
    )

    def __init__(self, tree: MetaTree) -> None:
        self.tree = tree
        self.page_size = tree.page_size
        self.records: list[WorkerRecord | None] = []
        self.requests: list[int] = []
        self.prefill: list[int] = []
        self.decode: list[int] = []
        self.up: tuple[WorkerId, ...] = ()
        self.up_index: list[int] = []
        self.dense = True
        self.capacities: list[int | None] = []
        self.reported: list[EngineLoad | None] = []
        self.position: dict[int, int] = {}
        self.align: Callable[[list[Any]], list[Any]] = list.copy
        self.bounded = False  # some up worker's capacity is known: the router estimates

    # -- registration ----------------------------------------------------------------------
    def add(self, worker: WorkerId, capacity: int | None) -> None:
        """Register ``worker`` (a new WorkerId of the tree) with zero loads."""
        # As many indices as the tree has (a view's lengths come by tree index).
        grow = self.tree.n_workers - len(self.records)
        if grow > 0:
            self.records += [None] * grow
            self.requests += [0] * grow
            self.prefill += [0] * grow
            self.decode += [0] * grow
        i = worker.index
        self.records[i] = WorkerRecord(worker, capacity)
        self.requests[i] = self.prefill[i] = self.decode[i] = 0
        self.refresh()

    def remove(self, worker: WorkerId) -> None:
        """Forget ``worker`` (its index may be reused by the tree)."""
        self.records[worker.index] = None
        self.refresh()

    def record(self, worker: object) -> WorkerRecord:
        """The record of a registered worker, or a clear error for any other object."""
        if isinstance(worker, WorkerId) and 0 <= worker.index < len(self.records):
            record = self.records[worker.index]
            if record is not None and (record.worker is worker or record.worker == worker):
                return record
        if not isinstance(worker, WorkerId):
            msg = f"worker must be a WorkerId returned by add_worker, got {type(worker).__name__}"
            raise InputTypeError(msg)
        msg = f"{worker!r} is not a worker of this router (removed, or from another router)"
        raise StaleWorkerError(msg)

    def load(self, worker: WorkerId) -> WorkerLoad:
        """One worker's load, as policies see it."""
        record = self.record(worker)
        i = worker.index
        return WorkerLoad(
            self.requests[i],
            self.prefill[i],
            self.decode[i],
            record.up,
            record.capacity,
            record.reported,
        )

    def no_worker(self) -> str:
        """Why no policy can choose: the message of a ``NoWorkerError``."""
        if all(record is None for record in self.records):
            return "no worker is registered"
        return "every worker is down"

    def refresh(self) -> None:
        """Rebuild what every view shares: the up workers and their capacities and reports."""
        up = [r for r in self.records if r is not None and r.up]
        self.up = tuple(r.worker for r in up)
        self.up_index = [r.worker.index for r in up]
        # Every index up (no down worker, no free slot): a view copies whole lists.
        self.dense = self.up_index == list(range(len(self.records)))
        self.capacities = [r.capacity for r in up]
        # Only a known capacity can evict: without one no estimate is made.
        self.bounded = any(c is not None for c in self.capacities)
        self.reported = [r.reported for r in up]
        self.position = {r.worker.index: k for k, r in enumerate(up)}
        self.align = _aligner(self.up_index, self.dense)

    def refresh_reported(self) -> None:
        """Rebuild only the up workers' reports: what a new report changes of :meth:`refresh`.

        A report changes no worker's state, capacity or position, so the rest of
        what views share stands; called once per report (a simulator sends
        thousands a second), it costs one list instead of :meth:`refresh`'s eight.
        """
        self.reported = [r.reported for r in self.records if r is not None and r.up]

    # -- views -----------------------------------------------------------------------------
    def aligned(self, loads: Loads | None = None, spill: Spill | None = None) -> Loads:
        """Copies of ``loads`` (the registry's own by default) aligned to the up workers,
        or to the workers of a batch's ``spill``."""
        requests, prefill, decode = (
            (self.requests, self.prefill, self.decode) if loads is None else loads
        )
        align = self.align
        out = align(requests), align(prefill), align(decode)
        if spill is None:
            return out
        return spill.keep(out[0]), spill.keep(out[1]), spill.keep(out[2])

    def view(
        self,
        match: Any,
        every: list[int],
        loads: Loads | None = None,
        spill: Spill | None = None,
        expected: list[int] | None = None,
    ) -> View:
        """A request's view: its match (``every``: its lengths by worker index) against
        the up workers, or those of a batch's ``spill``.

        ``loads`` are the loads to show, aligned to the same workers (``aligned``: a
        batch's plan, or one copy that several views share); by default a copy of
        the registry's own, taken now. ``expected``, by worker index like ``every``,
        becomes the view's ``expected``, aligned the same way.
        """
        workers, capacities, reported = self.up, self.capacities, self.reported
        if self.dense:
            lengths = every
            if loads is None and spill is None:  # dispatch's case: three copies, no call
                loads = self.requests[:], self.prefill[:], self.decode[:]
        else:
            lengths = self.align(every)
        host = None
        if self.tree.has_host_pages:
            host_all = match.host_lengths.tolist()
            host = host_all if self.dense else self.align(host_all)
        # The expected lengths, aligned as the lengths (the same list when nothing is cut).
        aligned_expected = None
        if expected is not None and expected is not every:
            aligned_expected = expected if self.dense else self.align(expected)
        if spill is not None:
            workers = tuple(spill.keep(workers))
            capacities, reported = spill.keep(capacities), spill.keep(reported)
            lengths = spill.keep(lengths)
            if host is not None:
                host = spill.keep(host)
            if aligned_expected is not None:
                aligned_expected = spill.keep(aligned_expected)
        if expected is every:
            aligned_expected = lengths
        if loads is None:
            loads = self.aligned(None, spill)
        return View(
            workers,
            lengths,
            lengths if host is None else host,
            loads[0],
            loads[1],
            loads[2],
            capacities,
            reported,
            self.page_size,
            match.prefix_key,
            aligned_expected,
        )

    def views(
        self,
        matches: Sequence[Any],
        every: Sequence[list[int]],
        loads: Loads,
        expected: Sequence[list[int] | None],
    ) -> list[View]:
        """``view(match, lengths, loads, None, expected)`` of each request of a batch, in
        order: the views a policy's ``choose_batch`` decides from, all showing ``loads``.
        When every worker is up and none reported host pages, a view's lists are the
        request's own as they are (what ``view`` would make of them), and the views are
        made without a call each. O(requests) beside ``view``'s O(workers) each."""
        if not self.dense or self.tree.has_host_pages:
            view = self.view
            return [
                view(m, lengths, loads, None, e)
                for m, lengths, e in zip(matches, every, expected, strict=True)
            ]
        workers, capacities, reported = self.up, self.capacities, self.reported
        page, (requests, prefill, decode) = self.page_size, loads
        return [
            View(workers, lengths, lengths, requests, prefill, decode, capacities, reported,
                 page, m.prefix_key, e)
            for m, lengths, e in zip(matches, every, expected, strict=True)
        ]

    def checked(
        self, choice: object, among: Container[int] | None = None
    ) -> tuple[WorkerId, str, Detail]:
        """What a policy returned, as ``(worker, label, detail)``, checked: a worker of its
        view (the up workers, or those whose positions are ``among``: a Spill), bare or
        in a :class:`Choice` whose reason is a str. Raises PolicyError for anything else."""
        detail: Detail
        if type(choice) is WorkerId:
            worker, label, detail = choice, CHOSEN, ()
        elif isinstance(choice, Choice):
            worker, label, detail = choice
            if type(label) is not str:  # it is counted and exported by metrics()
                msg = f"the policy's Choice has reason {label!r}: a reason must be a str"
                raise PolicyError(msg)
            if type(detail) is not tuple:
                detail = _checked_detail(detail)
        else:
            worker, label, detail = choice, CHOSEN, ()  # type: ignore[assignment]
        if type(worker) is WorkerId:  # found by index, no hashing
            position = self.position.get(worker.index)
            if position is not None and (among is None or position in among):
                live = self.up[position]
                if live is worker or live == worker:
                    return live, label, detail
        msg = f"the policy chose {choice!r}, which is not one of its view's workers"
        raise PolicyError(msg)


def _checked_detail(detail: object) -> Detail:
    """A Choice's detail that is not a tuple already, as one (a list of pairs, say)."""
    try:
        return tuple(detail)  # type: ignore[arg-type]  # any iterable; checked here
    except TypeError:
        msg = f"the policy's Choice has detail {detail!r}: it must be (name, number) pairs"
        raise PolicyError(msg) from None


class Spill:
    """The up workers a batch's group may spill to: all of them but those ``excluded``.

    A wide fleet's spill usually leaves out a few workers (those whose load is past
    the least loaded's plus the slack), so a spill's lists are copies of the up
    workers' lists with those positions deleted, each in one C-level pass.

    Parameters
    ----------
    excluded : list of int
        Positions, among the up workers, ascending.
    """

    __slots__ = ("_mask", "_out", "excluded")

    def __init__(self, excluded: list[int]) -> None:
        self.excluded = excluded
        self._out = frozenset(excluded)
        self._mask: list[bool] | None = None  # per position: kept (for many excluded)

    def __contains__(self, position: object) -> bool:
        """Whether the up worker at ``position`` is one a spill may go to."""
        return position not in self._out

    def keep(self, values: Sequence[T]) -> list[T]:
        """``values`` (one per up worker, in order) without the excluded positions."""
        if len(self.excluded) <= _FEW:
            kept = list(values)
            for position in reversed(self.excluded):
                del kept[position]
            return kept
        if self._mask is None:
            self._mask = [True] * len(values)
            for position in self.excluded:
                self._mask[position] = False
        return list(compress(values, self._mask))


_FEW = 64  # up to this many excluded workers a spill deletes them; past it, filters


def _aligner(index: list[int], dense: bool) -> Callable[[list[Any]], list[Any]]:
    """A function that copies a list by worker index into the order of the up workers
    at ``index`` (one C-level pass: a fleet may have 1,024 workers)."""
    if dense:
        return list.copy
    if len(index) == 1:
        only = index[0]
        return lambda values: [values[only]]
    if not index:
        return lambda values: []
    get = itemgetter(*index)
    return lambda values: list(get(values))
