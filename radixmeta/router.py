"""The Router: a MetaTree, the workers and their loads, a policy, and the replayer.

The SGLang paper's appendix A.4, as a library object. ``dispatch`` matches a
request against the meta-tree (every worker's cached prefix in one walk), hands
a policy a read-only :class:`~radixmeta.policies.base.View` of the up workers,
and applies what it chose: the request's pages are marked for that worker at
once, continuing from the match's walk, and its load is counted until
``finish``. ``dispatch_batch`` decides a batch together, keeping requests that
share a long prefix with each other on one worker unless load forbids it.

Two modes:

* **exact**: the tree is what the workers report, fed by their events through
  the router's :class:`~radixmeta.events.Replayer` (``replay``, ``idle``,
  ``subscribe``). A dispatch's marks are *holds* (``MetaTree.hold``): counted
  by every match, never part of the reported view, released at ``finish``.
* **approximate**: no events; each worker's ``capacity`` bounds the router's
  own model of its cache (the MetaTree's approximate workers), and a dispatch's
  marks are inserts, evicted least recently used first.

Every public method takes one lock, so ``dispatch`` and ``finish`` may be called
from several threads; the replayer applies events without it (each MetaTree call
is atomic, and a mark checks its match's walk node by node before it trusts it).
"""

from __future__ import annotations

import itertools
import math
import secrets
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from radixmeta import _keys
from radixmeta._batch import PrefixGroup, prefix_groups
from radixmeta._inflight import InFlightPrefixes
from radixmeta._workers import WorkerId
from radixmeta.errors import (
    DuplicateRequestError,
    InputTypeError,
    InvalidInputError,
    NoWorkerError,
    PolicyError,
    RouterClosedError,
    StaleWorkerError,
    UnknownRequestError,
)
from radixmeta.meta import MetaTree
from radixmeta.policies._params import extremes
from radixmeta.policies.base import BatchPolicy, Choice, EngineLoad, Request, View
from radixmeta.policies.expected import expected_lengths
from radixmeta.replay import Replayer, ReplaySource, ReplayStats

if TYPE_CHECKING:
    from radixmeta._records import Record
    from radixmeta.subscription import FleetSubscription, WorkerEndpoint

__all__ = ["Decision", "Router", "WorkerLoad"]

Tokens = npt.NDArray[np.uint32]
_UINT32 = np.dtype(np.uint32)
_MODES = ("exact", "approximate")
_CHOSEN = "chosen"  # the label of a decision whose policy returned a bare worker


class Decision:
    """What ``dispatch`` decided for one request, and why.

    Attributes
    ----------
    request_id : str
        The request's id (generated when the caller gave none).
    worker : WorkerId
        The worker chosen.
    matched : int
        Tokens of the prompt that worker held (by the events and the router's
        own marks) when it was chosen, less what the requests queued ahead of it
        there are expected to evict before it runs (``View.expected``): the
        estimated cache hit.
    label : str
        The policy's short reason (``"affinity"``, ``"balance"``...), or
        ``"chosen"`` when it gave none; counted by ``Router.metrics()``.
    detail : tuple of (str, float)
        The numbers the policy's rule used.

    Notes
    -----
    ``lengths`` and ``reason`` are built when read, so a decision costs its
    slots and nothing else until someone logs or explains it. It is also the
    router's record of the request while it is in flight (the private slots:
    what ``finish`` releases), so a dispatch makes one object, not two.
    """

    __slots__ = (
        "request_id",
        "worker",
        "matched",
        "label",
        "detail",
        "_view",
        "_request",
        "_hold",
        "_started",
        "_decode",  # set by prefill_done: the tokens counted in decode_tokens
        "_keys",  # its prefixes in the router's InFlightPrefixes (empty: not counted)
    )
    _decode: int

    def __init__(
        self,
        request_id: str,
        worker: WorkerId,
        matched: int,
        label: str,
        detail: tuple[tuple[str, float], ...],
        view: View,
        request: Request,
        hold: int | None,
        started: float,
    ) -> None:
        self.request_id = request_id
        self.worker = worker
        self.matched = matched
        self.label = label
        self.detail = detail
        self._view = view
        self._request = request
        self._hold = hold  # the hold of its pages (exact mode)
        self._started = started
        self._keys: tuple[Any, ...] = ()

    @property
    def lengths(self) -> dict[WorkerId, int]:
        """Every worker the policy could choose, with the tokens of the prompt it held."""
        return dict(zip(self._view.workers, self._view.lengths, strict=True))

    @property
    def _uncached(self) -> int:
        """Its tokens in prefill_tokens until prefill_done."""
        return len(self._request.tokens) - self.matched

    @property
    def reason(self) -> str:
        """The label and the numbers behind it, as one line: ``"balance (max_load=9, ...)"``."""
        if not self.detail:
            return self.label
        numbers = ", ".join(f"{name}={_number(value)}" for name, value in self.detail)
        return f"{self.label} ({numbers})"

    def __repr__(self) -> str:
        return (
            f"Decision(request_id={self.request_id!r}, worker={self.worker.name!r}/"
            f"{self.worker.dp_rank}, matched={self.matched}, reason={self.reason!r})"
        )


def _number(value: float) -> str:
    """A detail number as a reason shows it: an integer without a point, else 3 digits."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    if isinstance(value, (int, float)) and math.isfinite(value):
        return str(int(value))
    return str(value)


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
class _Worker:
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


@dataclass
class _Sources:
    """The router's ReplaySource: each subscribed worker's subscription, else a fallback."""

    fallback: ReplaySource | None = None
    by_worker: dict[tuple[str, int], ReplaySource] = field(default_factory=dict)

    def _of(self, worker: str, dp_rank: int) -> ReplaySource | None:
        return self.by_worker.get((worker, dp_rank), self.fallback)

    def replay(self, worker: str, dp_rank: int, from_seq: int) -> list[Record] | None:
        source = self._of(worker, dp_rank)
        return None if source is None else source.replay(worker, dp_rank, from_seq)

    def snapshot(self, worker: str, dp_rank: int) -> list[Record] | None:
        source = self._of(worker, dp_rank)
        return None if source is None else source.snapshot(worker, dp_rank)


def as_tokens(tokens: object) -> Tokens:
    """A prompt as a 1-D uint32 array, by the trees' input rules (see ``radixmeta._keys``).

    A C-contiguous uint32 array is taken as it is; other integer arrays are
    range-checked and converted without a per-element Python loop; anything
    else goes through the trees' own converter, whose errors name the position.
    """
    if type(tokens) is np.ndarray and tokens.dtype is _UINT32 and tokens.ndim == 1:
        return tokens
    if isinstance(tokens, np.ndarray) and tokens.ndim == 1 and tokens.dtype.kind in "iu":
        if tokens.dtype.kind == "i" or tokens.dtype.itemsize > 4:
            bad = np.flatnonzero((tokens < 0) | (tokens > _keys.TOKEN_LIMIT - 1))
            if len(bad):
                i = int(bad[0])
                msg = f"tokens[{i}] = {int(tokens[i])} is outside the token range [0, 2**32)"
                raise InvalidInputError(msg)
        _keys.check_key_length(len(tokens))
        return np.ascontiguousarray(tokens, dtype=np.uint32)
    return np.array(_keys.tokens(tokens, "tokens"), dtype=np.uint32)


def _resolve_policy(policy: object) -> Any:
    """A policy object: ``policy`` itself, or the built-in one it names."""
    if isinstance(policy, str):
        from radixmeta import policies  # lazily: the router's layer sits above the policies

        create = getattr(policies, "create", None)
        if create is None:
            msg = (
                f"policy {policy!r} names a built-in policy, but radixmeta.policies.create is "
                "not available in this build; pass a policy object (with choose(request, view))"
            )
            raise ImportError(msg)
        return create(policy)
    if not callable(getattr(policy, "choose", None)):
        msg = f"policy must be a name or an object with choose(request, view), got {policy!r}"
        raise InputTypeError(msg)
    return policy


def _check_count(name: str, value: object) -> int:
    return _keys.check_int(name, value, 0)


class Router:
    """Send each request to the worker that holds most of its prompt, within load.

    Parameters
    ----------
    page_size : int, default 1
        The engines' KV page (block) size: the MetaTree's page size.
    policy : str or policy object, default "default"
        An object with ``choose(request, view)`` (see
        :mod:`radixmeta.policies.base`), or the name of a built-in policy,
        made by ``radixmeta.policies.create(name)``.
    mode : {"exact", "approximate"}, default "exact"
        Exact: the tree is fed by the workers' events; approximate: the router
        models each worker's cache itself, bounded by its capacity.
    source : ReplaySource, optional
        Exact mode: where the replayer asks for the records of a gap of the
        workers no subscription serves (an in-process ``LogSource``...).
    restart_window : int, default 16
        See :class:`~radixmeta.events.Replayer`.
    group_ratio : float, default 0.5
        ``dispatch_batch``: two requests of a batch are grouped when they share
        at least one page and at least this share of the shorter prompt.
    group_slack : int, default 32
        ``dispatch_batch``: a group stays on its worker while that worker's
        requests in flight exceed the least loaded up worker's by at most this
        many; the rest of the group is decided again, among the workers that
        load still allows.
    clock : callable, default time.monotonic
        Seconds, for ``expire``; must not go backwards.

    Notes
    -----
    See the Routing page of the documentation for the dispatch, batch, overlay
    and load rules and the cost of each operation.
    """

    def __init__(
        self,
        page_size: int = 1,
        *,
        policy: object = "default",
        mode: str = "exact",
        source: ReplaySource | None = None,
        restart_window: int = 16,
        group_ratio: float = 0.5,
        group_slack: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in _MODES:
            msg = f"mode must be 'exact' or 'approximate', got {mode!r}"
            raise InvalidInputError(msg)
        if not isinstance(group_ratio, (int, float)) or not 0 <= group_ratio <= 1:
            msg = f"group_ratio must be a number in [0, 1], got {group_ratio!r}"
            raise InvalidInputError(msg)
        self.group_slack = _check_count("group_slack", group_slack)
        self.group_ratio = float(group_ratio)
        self.mode = mode
        self.tree = MetaTree(page_size)
        self.page_size = self.tree.page_size
        self._policy = _resolve_policy(policy)
        self._exact = mode == "exact"
        self._sources = _Sources(source)
        self.replayer = Replayer(self.tree, source=self._sources, restart_window=restart_window)
        self._subscriptions: list[FleetSubscription] = []
        self._clock = clock
        self._lock = threading.RLock()  # re-entrant: a policy hook may call the router
        self._closed = False
        self._background: threading.Thread | None = None
        self._stop = threading.Event()
        # Per worker index (the tree's): the record and the three loads. The
        # loads live in lists so that a view takes a copy of each in one step.
        self._workers: list[_Worker | None] = []
        self._requests: list[int] = []
        self._prefill: list[int] = []
        self._decode: list[int] = []
        self._flights: dict[str, Decision] = {}
        self._decisions: dict[str, int] = {}
        # Generated ids: a prefix of this router's own, then a counter (a C iterator).
        self._ids = map(f"req-{secrets.token_hex(4)}-".__add__, map(str, itertools.count()))
        self._outputs = [0, 0]  # finishes that reported output tokens, and their sum
        # The prefixes in-flight requests start with, per worker: a prefix one of them
        # starts with is not evicted before a later request of it runs (the estimate).
        self._inflight = InFlightPrefixes(self.page_size)
        self.policy = self._policy  # its hooks, and the first _refresh

    @property
    def policy(self) -> Any:
        """The policy object (a new one may be set; dispatches after use it)."""
        return self._policy

    @policy.setter
    def policy(self, policy: object) -> None:
        policy = _resolve_policy(policy)
        with self._lock:
            self._policy = policy
            self._choose_batch = policy.choose_batch if isinstance(policy, BatchPolicy) else None
            self._on_dispatch = getattr(policy, "on_dispatch", None)
            self._on_finish = getattr(policy, "on_finish", None)
            self._refresh()

    @property
    def clock(self) -> Callable[[], float]:
        """The clock ``expire`` reads (seconds; given to the constructor)."""
        return self._clock

    # -- workers -------------------------------------------------------------------------
    def add_worker(
        self, name: str, dp_rank: int = 0, *, capacity: int | None = None
    ) -> WorkerId:
        """Register a worker; it is up.

        Parameters
        ----------
        name : str
        dp_rank : int, default 0
        capacity : int, optional
            Its KV capacity in tokens: required in approximate mode (it bounds
            the router's model of the worker's cache); in exact mode it is only
            shown to policies.

        Returns
        -------
        WorkerId

        Raises
        ------
        InvalidInputError
            Approximate mode without a capacity, or a bad name, rank or capacity.
        DuplicateWorkerError
            ``(name, dp_rank)`` is registered already.
        """
        with self._lock:
            self._check_open()
            if capacity is None and not self._exact:
                msg = "approximate mode needs each worker's capacity (tokens it can cache)"
                raise InvalidInputError(msg)
            if capacity is not None:
                capacity = _check_count("capacity", capacity)
            worker = self.tree.add_worker(
                name, dp_rank, capacity=None if self._exact else capacity
            )
            grow = self.tree.n_workers - len(self._workers)
            if grow > 0:
                self._workers += [None] * grow
                self._requests += [0] * grow
                self._prefill += [0] * grow
                self._decode += [0] * grow
            i = worker.index
            self._workers[i] = _Worker(worker, capacity)
            self._requests[i] = self._prefill[i] = self._decode[i] = 0
            self._refresh()
            return worker

    def remove_worker(self, worker: WorkerId) -> int:
        """Forget a worker: its pages, its requests in flight (each policy's
        ``on_finish`` is told) and its replay state. Returns the requests dropped."""
        with self._lock:
            state = self._state(worker)
            dropped = [f for f in self._flights.values() if f.worker is state.worker]
            for flight in dropped:
                del self._flights[flight.request_id]
                self._release(flight, hold=False)  # the tree ends its holds itself
            self.tree.remove_worker(state.worker)
            self.replayer.forget(worker.name, worker.dp_rank)
            self._workers[worker.index] = None
            self._refresh()
            return len(dropped)

    def mark_down(self, worker: WorkerId) -> None:
        """Take a worker out of every view (its requests in flight stay counted)."""
        with self._lock:
            self._state(worker).up = False
            self._refresh()

    def mark_up(self, worker: WorkerId) -> None:
        """Let policies choose a worker again."""
        with self._lock:
            self._state(worker).up = True
            self._refresh()

    def worker(self, name: str, dp_rank: int = 0) -> WorkerId:
        """The ``WorkerId`` registered as ``(name, dp_rank)``."""
        return self.tree.worker(name, dp_rank)

    @property
    def workers(self) -> tuple[WorkerId, ...]:
        """Every registered worker, up or down, by index."""
        return self.tree.workers

    @property
    def up(self) -> tuple[WorkerId, ...]:
        """The workers a policy may choose, by index."""
        return self._up

    def report_load(
        self,
        worker: WorkerId,
        *,
        queue_length: int | None = None,
        kv_usage: float | None = None,
        running: int | None = None,
    ) -> None:
        """Record what a worker's engine reports about itself (``view.reported``).

        The router stamps the report with its clock and its own count of the
        worker's requests in flight (``EngineLoad.at``, ``EngineLoad.router_requests``),
        so that a policy can add what only the engine saw to the router's current
        counts (:func:`radixmeta.policies.base.extra_requests`).

        Raises
        ------
        InvalidInputError
            A negative count, or ``kv_usage`` outside ``[0, 1]``.
        """
        queue = None if queue_length is None else _check_count("queue_length", queue_length)
        run = None if running is None else _check_count("running", running)
        if kv_usage is not None:
            if not isinstance(kv_usage, (int, float)) or isinstance(kv_usage, bool):
                msg = f"kv_usage must be a number, got {type(kv_usage).__name__}"
                raise InputTypeError(msg)
            if not 0.0 <= kv_usage <= 1.0:
                msg = f"kv_usage must be in [0, 1], got {kv_usage}"
                raise InvalidInputError(msg)
            kv_usage = float(kv_usage)
        with self._lock:
            state = self._state(worker)
            # Stamped with the router's clock and its own count at arrival, so a
            # policy can weigh the report against the counts it has since.
            own = self._requests[worker.index]
            state.reported = EngineLoad(queue, kv_usage, run, self._clock(), own)
            self._refresh()

    def load(self, worker: WorkerId) -> WorkerLoad:
        """One worker's load, as policies see it."""
        with self._lock:
            state = self._state(worker)
            i = worker.index
            return WorkerLoad(
                self._requests[i],
                self._prefill[i],
                self._decode[i],
                state.up,
                state.capacity,
                state.reported,
            )

    @property
    def in_flight(self) -> int:
        """Requests dispatched and not finished."""
        return len(self._flights)

    def _state(self, worker: object) -> _Worker:
        """The record of a registered worker, or the tree's own error for another object."""
        if isinstance(worker, WorkerId) and 0 <= worker.index < len(self._workers):
            state = self._workers[worker.index]
            if state is not None and (state.worker is worker or state.worker == worker):
                return state
        if not isinstance(worker, WorkerId):
            msg = f"worker must be a WorkerId returned by add_worker, got {type(worker).__name__}"
            raise InputTypeError(msg)
        msg = f"{worker!r} is not a worker of this router (removed, or from another router)"
        raise StaleWorkerError(msg)

    def _refresh(self) -> None:
        """Rebuild what every view shares: the up workers and their capacities and reports."""
        up = [s for s in self._workers if s is not None and s.up]
        self._up = tuple(s.worker for s in up)
        self._up_index = [s.worker.index for s in up]
        # Every index up (no down worker, no free slot): a view copies whole lists.
        self._dense = self._up_index == list(range(len(self._workers)))
        self._capacities: list[int | None] = [s.capacity for s in up]
        # Only a known capacity can evict: without one no estimate is made.
        self._bounded = any(c is not None for c in self._capacities)
        self._reported: list[EngineLoad | None] = [s.reported for s in up]
        self._position = {s.worker.index: k for k, s in enumerate(up)}
        # What dispatch reads, in one attribute: each attribute read costs on every request.
        self._hot = (
            self._up,
            self._dense,
            self._up_index,
            self._position,
            self._capacities,
            self._reported,
            self.tree,
            self.page_size,
            self._policy.choose,
            self._exact,
            self._on_dispatch,
            self._clock,
            self._requests,
            self._prefill,
            self._decode,
            self._flights,
            self._bounded,
        )

    def _pick(self, values: list[int]) -> list[int]:
        """``values`` (one per worker index) aligned to the up workers (a copy)."""
        if self._dense:
            return values[:]
        return [values[i] for i in self._up_index]

    # -- dispatch ------------------------------------------------------------------------
    def dispatch(
        self,
        tokens: object,
        *,
        request_id: str | None = None,
        namespace: Hashable = None,
        extras: object = None,
        group: Hashable = None,
        expected_output: int | None = None,
    ) -> Decision:
        """Choose a worker for one request, mark its pages for it and count its load.

        Parameters
        ----------
        tokens : sequence of int or 1-D integer array
            The prompt; a uint32 array is taken without a copy (do not change
            it while the request is in flight).
        request_id : str, optional
            Unique among the requests in flight; generated when not given.
        namespace : hashable, optional
            The page namespace (LoRA adapter, cache salt), as ``MetaTree`` takes it.
        extras : sequence of int, optional
            One extra tag per whole page (multimodal identity), as ``MetaTree`` takes them.
        group : hashable, optional
            A grouping hint for the policy (a session, a tenant).
        expected_output : int, optional
            Output tokens expected; counted in the decode load after
            ``prefill_done`` (else the mean of the outputs ``finish`` reported).

        Returns
        -------
        Decision

        Raises
        ------
        InputTypeError, InvalidInputError
            Bad tokens, id, namespace, extras or expected output.
        DuplicateRequestError
            ``request_id`` is in flight.
        NoWorkerError
            No worker is up.
        PolicyError
            The policy chose something that is not a worker of its view.

        A call that raises changes nothing.
        """
        # The hot path reads like this on purpose: every line costs on each request.
        if type(tokens) is np.ndarray and tokens.dtype is _UINT32 and tokens.ndim == 1:
            key = tokens
        else:
            key = as_tokens(tokens)
        if request_id is not None and type(request_id) is not str:
            msg = f"request_id must be a str, got {type(request_id).__name__}"
            raise InputTypeError(msg)
        if expected_output is not None:
            expected_output = _check_count("expected_output", expected_output)
        with self._lock:
            if self._closed:
                msg = "dispatch on a closed Router"
                raise RouterClosedError(msg)
            (
                up,
                dense,
                up_index,
                position,
                capacities,
                reported,
                tree,
                page_size,
                choose,
                exact,
                on_dispatch,
                clock,
                requests,
                prefill,
                decode,
                flights,
                bounded,
            ) = self._hot
            if request_id is None:
                rid = next(self._ids)
                if rid in flights:  # a caller's id that looks like ours
                    rid = self._new_id()
            elif request_id in flights:
                msg = f"request {request_id!r} is in flight already"
                raise DuplicateRequestError(msg)
            else:
                rid = request_id
            if not up:
                raise NoWorkerError(self._no_worker())
            if extras is None and namespace is None:
                m = tree.match(key, cursor=True)
            else:
                m = tree.match(key, extras=extras, namespace=namespace, cursor=True)
            every = m.length_list
            if dense:
                lengths = every
                view = View(
                    up,
                    every,
                    self._pick(m.host_lengths.tolist()) if tree.has_host_pages else every,
                    requests[:],
                    prefill[:],
                    decode[:],
                    capacities,
                    reported,
                    page_size,
                    m.prefix_key,
                )
            else:
                lengths = [every[i] for i in up_index]
                view = View(
                    up,
                    lengths,
                    self._pick(m.host_lengths.tolist()) if tree.has_host_pages else lengths,
                    self._pick(requests),
                    self._pick(prefill),
                    self._pick(decode),
                    capacities,
                    reported,
                    page_size,
                    m.prefix_key,
                )
            if bounded:
                view.expected = self._expected(view, key, namespace, extras)
            request = Request(rid, key, namespace, extras, group, expected_output)
            choice = choose(request, view)
            # A WorkerId of the view, bare or in a Choice, found by its index: no
            # hashing, no call. Anything else goes through the full check.
            kind = type(choice)
            detail: tuple[tuple[str, float], ...]
            if kind is WorkerId:
                found = position.get(choice.index)
                if found is not None and up[found] is choice:
                    worker, label, detail = choice, _CHOSEN, ()
                else:
                    worker, label, detail = self._unpack(choice, up, True)
            elif kind is Choice and type(choice[0]) is WorkerId and type(choice[2]) is tuple:
                worker = choice[0]
                found = position.get(worker.index)
                if found is not None and up[found] is worker:
                    label, detail = choice[1], choice[2]
                else:
                    worker, label, detail = self._unpack(choice, up, True)
            else:
                worker, label, detail = self._unpack(choice, up, True)
            i = worker.index
            raw = matched = every[i]
            if bounded:
                expected = view.expected
                assert expected is not None
                matched = expected[position[i]] if expected is not lengths else raw
            if exact:
                hold: int | None = m.hold(worker)
            else:
                hold = None
                m.insert(worker)
            decision = Decision(rid, worker, matched, label, detail, view, request, hold, clock())
            if bounded:
                self._enter(decision, raw, namespace)
            # _count, inline. The counters of metrics() take the request when it ends
            # (finish, expire, removal); until then metrics() reads it from flights.
            requests[i] += 1
            prefill[i] += len(key) - matched
            flights[rid] = decision
            if on_dispatch is not None:
                on_dispatch(request, worker, matched)
            return decision

    def _expected(
        self, view: View, key: Tokens, namespace: Hashable, extras: object
    ) -> list[int]:
        """``view.expected``: its lengths less what the queues ahead are expected to evict."""
        lengths = view.lengths
        protected = self._protection(key, namespace, extras, lengths, view.workers)
        return expected_lengths(
            lengths, view.capacities, view.prefill_tokens, self.page_size, protected
        )

    def _protection(
        self,
        key: Tokens,
        namespace: Hashable,
        extras: object,
        lengths: list[int],
        up: tuple[WorkerId, ...],
    ) -> Callable[[int], bool]:
        """``protected(p)``: whether a request in flight on the ``p``-th worker of ``up``
        starts with the ``lengths[p]`` tokens of ``key`` matched there.

        Two signs, either enough: the match is longer with the router's holds than
        with what the worker reported (a hold covers its request's key from the
        root, so an in-flight request holds all of it), or an in-flight request
        there has that prefix as its prompt or its own match (InFlightPrefixes: a
        prefix both reported and held, such as a group's). The reported-only match
        is made at most once, and only when some worker's prefix would be cut.
        """
        inflight, tree = self._inflight, self.tree
        reported: list[list[int]] = []

        def protected(p: int) -> bool:
            index = up[p].index
            if self._exact:
                if not reported:
                    if extras is None and namespace is None:
                        m = tree.match(key, optimistic=False)
                    else:
                        m = tree.match(key, extras=extras, namespace=namespace, optimistic=False)
                    reported.append(m.length_list)
                if reported[0][index] < lengths[p]:
                    return True
            return inflight.key(index, key, lengths[p], namespace) in inflight

        return protected

    def _enter(self, decision: Decision, raw: int, namespace: Hashable) -> None:
        """Count a dispatched request's prefixes in flight on its worker (its whole
        prompt, and what it matched there) for later requests' estimates."""
        inflight, tokens, i = self._inflight, decision._request.tokens, decision.worker.index
        keys = (
            inflight.key(i, tokens, len(tokens), namespace),
            inflight.key(i, tokens, raw, namespace),
        )
        inflight.enter(keys)
        decision._keys = keys

    def _expected_every(self, request: Request, every: list[int]) -> list[int]:
        """A batch request's expected lengths by tree index (``every``'s layout), from the
        loads before the batch."""
        pick = self._up_index
        lengths = every if self._dense else [every[i] for i in pick]
        queued = self._prefill if self._dense else [self._prefill[i] for i in pick]
        protected = self._protection(
            request.tokens, request.namespace, request.extras, lengths, self._up
        )
        got = expected_lengths(lengths, self._capacities, queued, self.page_size, protected)
        if got is lengths:
            return every
        if self._dense:
            return got
        out = every[:]
        for p, i in enumerate(pick):
            out[i] = got[p]
        return out

    def _aligned(self, values: list[int], positions: list[int] | None = None) -> list[int]:
        """Per-index ``values`` as a view's list: the up workers (or those ``positions``)."""
        pick = self._up_index if positions is None else [self._up_index[p] for p in positions]
        if positions is None and self._dense:
            return values
        return [values[i] for i in pick]

    def _new_id(self, taken: set[str] | None = None) -> str:
        rid = next(self._ids)
        # A caller's id may look like ours (in flight, or given in the same batch).
        while rid in self._flights or (taken is not None and rid in taken):
            rid = next(self._ids)
        return rid

    def _no_worker(self) -> str:
        if not self._workers or all(s is None for s in self._workers):
            return "no worker is registered"
        return "every worker is down"

    def _unpack(
        self, choice: object, workers: tuple[WorkerId, ...], every_up: bool
    ) -> tuple[WorkerId, str, tuple[tuple[str, float], ...]]:
        """The worker, label and detail of what a policy returned, checked against its
        view's ``workers`` (``every_up``: all the up workers, in order)."""
        detail: tuple[tuple[str, float], ...] = ()
        label: str
        if isinstance(choice, Choice):
            worker, label, detail = choice.worker, choice.reason, tuple(choice.detail)
        else:
            worker, label = choice, _CHOSEN  # type: ignore[assignment]
        if isinstance(worker, WorkerId):
            if every_up:  # the common case: found by index, no hashing
                position = self._position.get(worker.index)
                if position is not None:
                    live = workers[position]
                    if live is worker or live == worker:
                        return live, label, detail
            elif worker in workers:  # the view of a batch spill: some of the up workers
                return worker, label, detail
        msg = f"the policy chose {choice!r}, which is not one of its view's workers"
        raise PolicyError(msg)

    def _count(self, decision: Decision) -> None:
        """Count a dispatched request in flight (what dispatch does inline)."""
        i = decision.worker.index
        self._requests[i] += 1
        self._prefill[i] += decision._uncached
        self._flights[decision.request_id] = decision

    def _tally(self, decision: Decision, state: _Worker) -> None:
        """Add a request that ended to the counters (``metrics`` adds those in flight)."""
        state.dispatches += 1
        state.hit_tokens += decision.matched
        state.prompt_tokens += len(decision._request.tokens)
        self._decisions[decision.label] = self._decisions.get(decision.label, 0) + 1

    # -- batches -------------------------------------------------------------------------
    def dispatch_batch(self, requests: Sequence[object]) -> list[Decision]:
        """Choose workers for a batch at once, keeping shared-prefix groups together.

        Parameters
        ----------
        requests : sequence
            Each a prompt (as ``dispatch`` takes ``tokens``) or a mapping of
            ``dispatch``'s keyword arguments with ``"tokens"``.

        Returns
        -------
        list of Decision
            In input order.

        Notes
        -----
        Every request is matched before any is decided, and the batch's own
        prefix groups are found once (one trie over the batch). A policy with
        ``choose_batch`` decides the whole batch from those views and groups.
        Any other policy decides group by group: the group's first request is
        chosen for, and its members follow while the worker's requests in
        flight stay within ``group_slack`` of the least loaded worker's; the
        rest of the group is decided again among the workers that load still
        allows. Loads include the batch's earlier decisions. A decision's
        ``matched`` also counts what the request shares with the batch's earlier
        requests sent to its worker (see the Routing page). The batch's decisions
        share one dispatch time, which ``expire`` reads. A batch that raises
        changes nothing.
        """
        uint32 = _UINT32
        items: list[tuple[Tokens, str | None, Hashable, object, Hashable, int | None]] = [
            # A bare uint32 prompt, the common case, without a call.
            (item, None, None, None, None, None)
            if type(item) is np.ndarray and item.dtype is uint32 and item.ndim == 1
            else self._batch_item(k, item)
            for k, item in enumerate(requests)
        ]
        with self._lock:
            if self._closed:
                msg = "dispatch_batch on a closed Router"
                raise RouterClosedError(msg)
            ids: set[str] = set()
            for k, given in [(k, item[1]) for k, item in enumerate(items) if item[1] is not None]:
                if given in self._flights or given in ids:
                    msg = f"request {given!r} (batch item {k}) is in flight already or repeated"
                    raise DuplicateRequestError(msg)
                ids.add(given)
            if not items:
                return []
            up = self._up
            if not up:
                raise NoWorkerError(self._no_worker())
            tree = self.tree
            # Cursor matches: the first mark after them is along their walk, the later ones
            # (the tree has changed) walk again, still without the binding's lock.
            matches = [
                tree.match(key, cursor=True)
                if extras is None and ns is None
                else tree.match(key, extras=extras, namespace=ns, cursor=True)
                for key, _, ns, extras, _, _ in items
            ]
            requests_ = []
            flights, generated = self._flights, self._ids
            plain = True  # no namespace, no extra tags
            for key, rid, ns, extras, group, expected in items:
                if rid is None:
                    rid = next(generated)
                    if rid in flights or rid in ids:  # a caller's id that looks like ours
                        rid = self._new_id(ids)
                if ns is not None or extras is not None:
                    plain = False
                requests_.append(Request(rid, key, ns, extras, group, expected))
            every = [m.length_list for m in matches]
            host_pages = self.tree.has_host_pages
            keys = [item[0] for item in items]
            if plain:
                groups = prefix_groups(keys, None, None, self.page_size, self.group_ratio)
            else:
                groups = prefix_groups(
                    keys,
                    [item[2] for item in items],
                    [item[3] is not None for item in items],
                    self.page_size,
                    self.group_ratio,
                )
            # What each request is expected to find on each worker when it runs there
            # (by the loads before the batch), per tree index like ``every``.
            held = every
            if self._bounded:
                held = [
                    self._expected_every(r, lengths)
                    for r, lengths in zip(requests_, every, strict=True)
                ]
            # What each request finds on its worker also counts the batch's earlier
            # requests sent there (their pages are marked with this batch): the hit the
            # decision estimates, and the prefill load it leaves out.
            if self._choose_batch is not None:
                choices = self._batch_by_policy(
                    requests_, matches, every, host_pages, groups, held
                )
                matched_of = _batch_matched(requests_, held, choices, groups, self.page_size)
                for request, matched, (worker, *_) in zip(
                    requests_, matched_of, choices, strict=True
                ):
                    self._requests[worker.index] += 1
                    self._prefill[worker.index] += len(request.tokens) - matched
            else:  # these count the loads as they decide (later decisions see them)
                choices, matched_of = self._batch_by_groups(
                    requests_, matches, every, host_pages, groups, held
                )
            # Nothing below raises: the decisions are applied whole.
            decisions = []
            exact, hook = self._exact, self._on_dispatch
            now = self._clock()  # the batch is decided at one time
            for k, (request, m, (worker, label, detail, view)) in enumerate(
                zip(requests_, matches, choices, strict=True)
            ):
                matched = matched_of[k]
                hold: int | None = None
                if exact:
                    hold = m.hold(worker)
                else:
                    m.insert(worker)
                rid = request.request_id
                decision = Decision(rid, worker, matched, label, detail, view, request, hold, now)
                flights[rid] = decision
                if held is not every:
                    self._enter(decision, every[k][worker.index], request.namespace)
                if hook is not None:
                    hook(request, worker, matched)
                decisions.append(decision)
            return decisions

    def _batch_item(
        self, k: int, item: object
    ) -> tuple[Tokens, str | None, Hashable, object, Hashable, int | None]:
        """One batch item, checked: (tokens, id, namespace, extras, group, expected output)."""
        if type(item) is np.ndarray:  # the common case, before the slower Mapping check
            return as_tokens(item), None, None, None, None, None
        if isinstance(item, Mapping):
            unknown = set(item) - {
                "tokens",
                "request_id",
                "namespace",
                "extras",
                "group",
                "expected_output",
            }
            if "tokens" not in item or unknown:
                msg = (
                    f"batch item {k}: a mapping needs 'tokens' and only dispatch's keyword "
                    f"arguments, got {sorted(map(str, item))}"
                )
                raise InvalidInputError(msg)
            rid = item.get("request_id")
            if rid is not None and type(rid) is not str:
                msg = f"batch item {k}: request_id must be a str, got {type(rid).__name__}"
                raise InputTypeError(msg)
            expected = item.get("expected_output")
            if expected is not None:
                expected = _check_count("expected_output", expected)
            namespace = item.get("namespace")
            _keys.check_namespace(namespace)
            return (
                as_tokens(item["tokens"]),
                rid,
                namespace,
                item.get("extras"),
                item.get("group"),
                expected,
            )
        return as_tokens(item), None, None, None, None, None

    def _view_of(
        self,
        request: Request,
        m: Any,
        every: list[int],
        host_pages: bool,
        positions: list[int] | None = None,
    ) -> View:
        """Request's view with the current loads; ``positions``: only those up workers."""
        if positions is None and self._dense and not host_pages:
            # Every index up: whole lists, as dispatch builds them (``every`` is the
            # request's own list already).
            return View(
                self._up,
                every,
                every,
                self._requests[:],
                self._prefill[:],
                self._decode[:],
                self._capacities,
                self._reported,
                self.page_size,
                m.prefix_key,
            )
        pick = self._up_index if positions is None else [self._up_index[p] for p in positions]
        workers = self._up if positions is None else tuple(self._up[p] for p in positions)
        lengths = [every[i] for i in pick]
        host = [int(v) for v in m.host_lengths[pick]] if host_pages else lengths
        caps = self._capacities if positions is None else [self._capacities[p] for p in positions]
        reps = self._reported if positions is None else [self._reported[p] for p in positions]
        return View(
            workers,
            lengths,
            host,
            [self._requests[i] for i in pick],
            [self._prefill[i] for i in pick],
            [self._decode[i] for i in pick],
            caps,
            reps,
            self.page_size,
            m.prefix_key,
        )

    def _batch_by_policy(
        self,
        requests: list[Request],
        matches: list[Any],
        every: list[list[int]],
        host_pages: bool,
        groups: Sequence[tuple[list[int], int]],
        held: list[list[int]],
    ) -> list[tuple[WorkerId, str, tuple[tuple[str, float], ...], View]]:
        if self._dense and not host_pages:
            # Every view of the batch shows the same loads (taken before any of its
            # decisions): one copy of each list for all of them (views are read-only).
            up, caps, reps, page = self._up, self._capacities, self._reported, self.page_size
            loads = (self._requests[:], self._prefill[:], self._decode[:])
            views = [
                View(up, lengths, lengths, *loads, caps, reps, page, m.prefix_key)
                for m, lengths in zip(matches, every, strict=True)
            ]
        else:
            views = [
                self._view_of(r, m, lengths, host_pages)
                for r, m, lengths in zip(requests, matches, every, strict=True)
            ]
        if held is not every:
            for v, expected in zip(views, held, strict=True):
                v.expected = self._aligned(expected)
        assert self._choose_batch is not None
        choices = self._choose_batch(requests, views, groups)
        if not isinstance(choices, (list, tuple)) or len(choices) != len(requests):
            msg = (
                f"choose_batch must return one choice per request ({len(requests)}), "
                f"got {choices!r}"
            )
            raise PolicyError(msg)
        up, position, out = self._up, self._position, []
        for c, v in zip(choices, views, strict=True):
            # A Choice of an up worker, found by its index (dispatch's fast path).
            if type(c) is Choice and type(c[0]) is WorkerId and type(c[2]) is tuple:
                found = position.get(c[0].index)
                if found is not None and up[found] is c[0]:
                    out.append((c[0], c[1], c[2], v))
                    continue
            out.append((*self._unpack(c, up, True), v))
        return out

    def _batch_by_groups(
        self,
        requests: list[Request],
        matches: list[Any],
        every: list[list[int]],
        host_pages: bool,
        groups: Sequence[PrefixGroup],
        held_of: list[list[int]],
    ) -> tuple[list[Any], list[int]]:
        """Decide a batch group by group with the policy's ``choose``, counting the loads
        as it goes; also ``_batch_matched``'s answer, found on the way."""
        count = len(requests)
        out: list[Any] = [None] * count
        matched = [0] * count
        where = [-1] * count  # each decided request's worker index
        again: set[int] = set()
        loads, prefill, up_index = self._requests, self._prefill, self._up_index
        slack, dense = self.group_slack, self._dense  # dense: every index is up, in order
        # The batch's decisions count in the loads of the decisions after them
        # (and stay counted); if a policy raises they are taken back out.
        counted: list[tuple[int, int, int]] = []
        done = False
        try:
            for group in groups:
                members, partners, common = group[0], group.partners, group.common
                at = 0
                positions: list[int] | None = None
                while at < len(members):
                    first = members[at]
                    view = self._view_of(
                        requests[first], matches[first], every[first], host_pages, positions
                    )
                    if held_of is not every:
                        view.expected = self._aligned(held_of[first], positions)
                    worker, label, detail = self._unpack(
                        self._policy.choose(requests[first], view), view.workers, positions is None
                    )
                    i = worker.index
                    # The first member always goes; the next ones while the worker's load,
                    # before each, is at most the least loaded worker's plus the slack. Only
                    # this worker's load moves, so that is a count: up to the other workers'
                    # floor plus the slack.
                    start = loads[i]
                    if len(up_index) < 2:
                        room = len(members)
                    else:
                        low, low_at, _, _, _ = extremes(
                            loads if dense else [loads[j] for j in up_index]
                        )
                        if up_index[low_at] == i:  # then the others' floor is another load
                            low = min([loads[j] for j in up_index if j != i])
                        room = max(1, int(low) + slack - start + 1)
                    end = min(len(members), at + room)
                    choice = (worker, label, detail, view)
                    uncached = 0
                    for j in range(at, end):
                        k = members[j]
                        out[k] = choice
                        where[k] = i
                        # What the batch's earlier requests leave on this worker (see
                        # _batch_matched; a partner is decided before its request).
                        held = held_of[k][i]
                        p = partners[j]
                        if p >= 0:
                            if where[p] != i:
                                again.add(k)  # see _batch_matched
                            elif common[j] > held:
                                held = common[j]
                        matched[k] = held
                        uncached += len(requests[k].tokens) - held
                    loads[i] = start + end - at
                    prefill[i] += uncached
                    counted.append((i, end - at, uncached))
                    at = end
                    if at < len(members):  # spill: only the workers load still allows
                        floor = extremes(loads if dense else [loads[j] for j in up_index])[0]
                        floor += slack  # loads are ints, so is this
                        positions = [p for p, j in enumerate(up_index) if loads[j] <= floor]
            done = True
        finally:
            if not done:
                for i, taken, uncached in counted:
                    loads[i] -= taken
                    prefill[i] -= uncached
        if again:
            partner, shares = _links(groups, count)
            for k, raised in _settle_again(
                again, where, partner, shares, requests, self.page_size, matched
            ):
                prefill[where[k]] -= raised  # counted above as uncached
        return out, matched

    # -- request life --------------------------------------------------------------------
    def prefill_done(self, request_id: str) -> None:
        """The request's prefill is done: its load moves from prefill to decode.

        Its decode load is its prompt plus its expected output (else the mean
        output ``finish`` reported so far). A second call changes nothing.

        Raises
        ------
        UnknownRequestError
            The id names no request in flight.
        """
        with self._lock:
            flight = self._flight(request_id)
            if getattr(flight, "_decode", -1) >= 0:
                return
            expected = flight._request.expected_output
            if expected is None:
                done, total = self._outputs
                expected = total // done if done else 0
            i = flight.worker.index
            flight._decode = len(flight._request.tokens) + expected
            self._prefill[i] -= flight._uncached
            self._decode[i] += flight._decode

    def finish(self, request_id: str, output_tokens: int = 0) -> None:
        """The request is done: release its load and its optimistic marks.

        Parameters
        ----------
        request_id : str
        output_tokens : int, default 0
            Tokens it generated: counted per worker, and their mean is the
            decode load of requests dispatched without ``expected_output``.

        Raises
        ------
        UnknownRequestError
            The id names no request in flight (finished or expired already).
        InvalidInputError
            A negative ``output_tokens``.
        """
        output = _check_count("output_tokens", output_tokens)
        with self._lock:
            flight = self._flight(request_id)
            del self._flights[request_id]
            self._release(flight)
            state = self._workers[flight.worker.index]
            assert state is not None
            state.finished += 1
            if output:
                state.output_tokens += output
                self._outputs[0] += 1
                self._outputs[1] += output

    def expire(self, older_than: float) -> list[str]:
        """Release the requests dispatched more than ``older_than`` seconds ago.

        For requests whose ``finish`` never came (a client that went away, a
        lost response). Returns their ids, oldest first.
        """
        if not isinstance(older_than, (int, float)) or isinstance(older_than, bool):
            msg = f"older_than must be a number of seconds, got {type(older_than).__name__}"
            raise InputTypeError(msg)
        if older_than < 0 or math.isnan(older_than):
            msg = f"older_than must be >= 0, got {older_than}"
            raise InvalidInputError(msg)
        with self._lock:
            cutoff = self._clock() - older_than
            gone = []
            for rid, flight in self._flights.items():
                if flight._started > cutoff:
                    break  # dispatched in order, by a clock that never goes back
                gone.append(rid)
            for rid in gone:
                flight = self._flights.pop(rid)
                self._release(flight)
                state = self._workers[flight.worker.index]
                assert state is not None
                state.expired += 1
            return gone

    def _flight(self, request_id: object) -> Decision:
        flight = self._flights.get(request_id) if type(request_id) is str else None
        if flight is None:
            if type(request_id) is not str:
                msg = f"request_id must be a str, got {type(request_id).__name__}"
                raise InputTypeError(msg)
            msg = f"request {request_id!r} is not in flight (never dispatched, or done already)"
            raise UnknownRequestError(msg)
        return flight

    def _release(self, flight: Decision, *, hold: bool = True) -> None:
        """Take a request's load (and, unless told not to, its hold) back out."""
        i = flight.worker.index
        state = self._workers[i]
        assert state is not None
        self._tally(flight, state)
        self._requests[i] -= 1
        decode = getattr(flight, "_decode", -1)
        if decode >= 0:
            self._decode[i] -= decode
        else:
            self._prefill[i] -= flight._uncached
        if hold and flight._hold is not None:
            self.tree.release(flight._hold)
        if flight._keys:
            self._inflight.leave(flight._keys)
        if self._on_finish is not None:
            self._on_finish(flight._request, flight.worker)

    # -- events (exact mode) -------------------------------------------------------------
    def submit(self, records: Sequence[Record]) -> None:
        """Queue workers' event records for the next ``replay`` (exact mode)."""
        self._check_exact("submit")
        self.replayer.submit(records)

    def replay(
        self, max_records: int | None = None, max_seconds: float | None = None
    ) -> ReplayStats:
        """Apply the pending event records within the budget (see ``Replayer.replay``).

        In approximate mode there are none: an empty ``ReplayStats``.
        """
        if not self._exact:
            return ReplayStats()
        return self.replayer.replay(max_records=max_records, max_seconds=max_seconds)

    def idle(
        self, *, max_records: int | None = None, max_seconds: float | None = None
    ) -> ReplayStats:
        """One turn of an idle loop: receive what the subscriptions have, then replay."""
        for subscription in list(self._subscriptions):
            subscription.poll(0.0)
        return self.replay(max_records, max_seconds)

    def subscribe(
        self,
        workers: Sequence[WorkerEndpoint],
        *,
        codec: str,
        topic: bytes = b"",
        tiers: Mapping[str | None, int] | None = None,
        replay_timeout: float = 1.0,
        **subscriber_options: Any,
    ) -> FleetSubscription:
        """Subscribe to workers' KV-event streams; what arrives feeds the router's replayer.

        Workers not registered yet are added (up, without a capacity). The
        router keeps the subscription only to poll it in ``idle`` and close it
        in ``close``; arguments are those of
        :class:`~radixmeta.subscription.FleetSubscription`, whose block size is
        the router's page size.
        """
        from radixmeta.subscription import FleetSubscription

        self._check_exact("subscribe")
        with self._lock:
            self._check_open()
            for endpoint in workers:
                for rank in range(endpoint.dp_size):
                    try:
                        self.tree.worker(endpoint.name, rank)
                    except StaleWorkerError:
                        self.add_worker(endpoint.name, rank)
            subscription = FleetSubscription(
                workers,
                codec=codec,
                block_size=self.page_size,
                topic=topic,
                tiers=tiers,
                replay_timeout=replay_timeout,
                replayer=self.replayer,
                **subscriber_options,
            )
            self._subscriptions.append(subscription)
            for key in subscription.sources:
                self._sources.by_worker[key] = subscription
            return subscription

    def start(self, interval: float = 0.01, **budget: Any) -> None:
        """Run ``idle`` in a background thread every ``interval`` seconds until ``close``."""
        with self._lock:
            self._check_open()
            if self._background is not None:
                msg = "the router's background thread is already running"
                raise RuntimeError(msg)
            self._stop.clear()

            def loop() -> None:
                while not self._stop.wait(interval):
                    self.idle(**budget)

            self._background = threading.Thread(target=loop, name="radixmeta-router", daemon=True)
            self._background.start()

    def _check_exact(self, what: str) -> None:
        if not self._exact:
            msg = f"{what}: an approximate router takes no events (its tree is its own model)"
            raise InvalidInputError(msg)

    def _check_open(self) -> None:
        if self._closed:
            msg = "the Router is closed"
            raise RouterClosedError(msg)

    # -- metrics -------------------------------------------------------------------------
    def metrics(self) -> dict[str, Any]:
        """Counters and gauges of the router, as plain Python values.

        Returns
        -------
        dict
            ``dispatches`` and ``in_flight`` (totals); ``decisions`` (label ->
            count); ``workers`` (one dict per registered worker: ``worker``,
            ``dp_rank``, ``up``, ``dispatches``, ``hit_tokens`` (estimated: the
            matched tokens at dispatch), ``prompt_tokens``, ``finished``,
            ``expired``, ``output_tokens``, the loads ``requests``,
            ``prefill_tokens`` and ``decode_tokens``, ``held_tokens`` (reported
            by events, or modelled) and ``hold_tokens`` (the router's
            optimistic marks), ``capacity`` and the engine's last report);
            ``replay`` (the replayer's cumulative ``stats``, ``pending``
            records, and per worker ``lag``); ``tree`` (``nodes``, ``holds``).
        """
        with self._lock:
            # Requests in flight are counted here, the ended ones as they ended.
            decisions = dict(self._decisions)
            flying: dict[int, list[int]] = {}
            for d in self._flights.values():
                counts = flying.setdefault(d.worker.index, [0, 0, 0])
                counts[0] += 1
                counts[1] += d.matched
                counts[2] += len(d._request.tokens)
                decisions[d.label] = decisions.get(d.label, 0) + 1
            workers = []
            for state in self._workers:
                if state is None:
                    continue
                w, i = state.worker, state.worker.index
                reported = state.reported or EngineLoad()
                dispatched, hits, prompts = flying.get(i, (0, 0, 0))
                workers.append(
                    {
                        "worker": w.name,
                        "dp_rank": w.dp_rank,
                        "up": state.up,
                        "dispatches": state.dispatches + dispatched,
                        "hit_tokens": state.hit_tokens + hits,
                        "prompt_tokens": state.prompt_tokens + prompts,
                        "finished": state.finished,
                        "expired": state.expired,
                        "output_tokens": state.output_tokens,
                        "requests": self._requests[i],
                        "prefill_tokens": self._prefill[i],
                        "decode_tokens": self._decode[i],
                        "held_tokens": self.tree.held_tokens(w),
                        "hold_tokens": self.tree.hold_tokens(w) if self._exact else 0,
                        "capacity": state.capacity,
                        "queue_length": reported.queue_length,
                        "kv_usage": reported.kv_usage,
                        "running": reported.running,
                    }
                )
            in_flight = len(self._flights)
        lag = [asdict(entry) for entry in self.replayer.lag()]
        return {
            "mode": self.mode,
            "policy": type(self._policy).__name__,
            "dispatches": sum(w["dispatches"] for w in workers),
            "in_flight": in_flight,
            "decisions": decisions,
            "workers": workers,
            "replay": {
                "stats": asdict(self.replayer.stats),
                "pending": self.replayer.pending,
                "lag": lag,
            },
            "tree": {"nodes": self.tree.node_count, "holds": self.tree.hold_count},
        }

    def metrics_text(self) -> str:
        """``metrics()`` in the Prometheus text exposition format (``radixmeta_router_*``)."""
        from radixmeta._router_metrics import exposition

        return exposition(self.metrics())

    # -- life ----------------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Stop the background thread and close the subscriptions (idempotent).

        Requests in flight can still be finished or expired; nothing can be dispatched.
        """
        with self._lock:
            self._closed = True
            thread, self._background = self._background, None
            subscriptions, self._subscriptions = self._subscriptions, []
        if thread is not None:
            self._stop.set()
            thread.join(timeout)
        self.replayer.stop(timeout)
        for subscription in subscriptions:
            subscription.close()

    @property
    def closed(self) -> bool:
        """Whether ``close`` was called."""
        return self._closed

    def __enter__(self) -> Router:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Router(mode={self.mode!r}, page_size={self.page_size}, workers={len(self.workers)}, "
            f"up={len(self._up)}, in_flight={len(self._flights)})"
        )


def _batch_matched(
    requests: list[Request],
    every: list[list[int]],
    choices: Sequence[Any],
    groups: Sequence[PrefixGroup],
    page: int,
) -> list[int]:
    """Per request of a batch: the tokens its worker holds of it, counting the pages
    of the batch's earlier requests sent to the same worker (in one namespace, with
    no extra tags: those pages are not their tokens alone).

    The batch's groups name each request's best earlier partner and what they
    share: when that partner went to the same worker (or there is none) that is
    the answer. A request whose partner went to another worker may still share
    less with an earlier request on its own: ``_settle_again`` finds that.
    """
    worker_of = [choice[0].index for choice in choices]
    matched = [lengths[w] for lengths, w in zip(every, worker_of, strict=True)]
    again: set[int] = set()
    for group in groups:
        # A request with extra tags is a group of its own, with no partner.
        for k, p, c in zip(group[0], group.partners, group.common, strict=True):
            if p < 0:
                continue
            if worker_of[p] != worker_of[k]:
                again.add(k)
            elif c > matched[k]:
                matched[k] = c
    if again:
        partner, shares = _links(groups, len(worker_of))
        _settle_again(again, worker_of, partner, shares, requests, page, matched)
    return matched


def _links(groups: Sequence[PrefixGroup], count: int) -> tuple[list[int], list[int]]:
    """Per request of a batch: its partner and its share with it, from the groups."""
    partner, shares = [-1] * count, [0] * count
    for group in groups:
        for k, p, c in zip(group[0], group.partners, group.common, strict=True):
            partner[k], shares[k] = p, c
    return partner, shares


def _settle_again(
    again: set[int],
    worker_of: list[int],
    partner: list[int],
    common: list[int],
    requests: list[Request],
    page: int,
    matched: list[int],
) -> list[tuple[int, int]]:
    """Raise the ``matched`` of the requests of ``again`` (whose partner went to another
    worker) by what they share with the batch's earlier requests on their worker.
    Returns ``(request, tokens added)`` for those raised.

    ``partner`` and ``common`` are per request its partner and share. Requests share a
    page only within a chain of partners (a partner shares one at least), so one that
    went where nothing of its chain went before it shares nothing there. Whole-page
    common prefixes are an ultrametric (``lcp(a, c) >= min(lcp(a, b), lcp(b, c))``):
    two requests with the same partner ``p`` share exactly the smaller of their shares
    with ``p``, since neither shares more with the other than with ``p``. So when every
    earlier request of its chain on its worker has its partner, it shares ``min(its
    share, the largest of theirs)``; otherwise its tokens are compared with theirs, up
    to its share with its partner (no earlier request shares more).
    """
    count = len(worker_of)
    chain = list(range(count))  # each request's chain: the index of its first request
    for k in range(count):
        if partner[k] >= 0:
            chain[k] = chain[partner[k]]  # a partner comes first: resolved already
    hot = {chain[k] for k in again}  # the chains that have such a request
    # Per (worker, chain) so far: the partner all its requests share (-2: not one) with
    # the largest of their shares with it, and the requests themselves.
    star: dict[tuple[int, int], tuple[int, int]] = {}
    earlier: dict[tuple[int, int], list[int]] = {}
    raised: list[tuple[int, int]] = []
    for k, w in enumerate(worker_of):
        if chain[k] not in hot:
            continue
        key = (w, chain[k])
        mine, share = partner[k], common[k]
        before = star.get(key)
        if k in again and before is not None:  # else nothing of its chain came here
            if before[0] == mine:
                found = min(share, before[1])
            else:
                found = 0
                tokens = requests[k].tokens
                for j in earlier[key]:
                    found = max(found, _shared_pages(tokens, requests[j].tokens, share, page))
                    if found == share:
                        break
            if found > matched[k]:
                raised.append((k, found - matched[k]))
                matched[k] = found
        if before is None:
            star[key] = (mine, share)
            earlier[key] = [k]
        else:
            earlier[key].append(k)
            if before[0] == mine:
                if share > before[1]:
                    star[key] = (mine, share)
            elif before[0] != -2:
                star[key] = (-2, 0)
    again.clear()
    return raised


def _shared_pages(a: Tokens, b: Tokens, limit: int, page: int) -> int:
    """Tokens in the whole pages that ``a`` and ``b`` begin with alike, up to ``limit``."""
    n = min(len(a), len(b), limit)
    differ = np.flatnonzero(a[:n] != b[:n])
    same = int(differ[0]) if len(differ) else n
    return same - same % page
