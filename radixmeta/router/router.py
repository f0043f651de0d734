"""The Router class: the public calls, the lock, and the order of each call's steps.

The parts it puts together live beside it: the workers and their loads
(:mod:`~radixmeta.router.registry`), the decisions (:mod:`~radixmeta.router.decision`),
the batch path (:mod:`~radixmeta.router.batch`), the event inputs
(:mod:`~radixmeta.router.feed`) and the metrics (:mod:`~radixmeta.router.metrics`).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import secrets
import threading
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from radixmeta._impl import backend
from radixmeta._keys import check_int, check_seconds
from radixmeta._workers import WorkerId
from radixmeta.errors import (
    DuplicateRequestError,
    HookError,
    InputTypeError,
    InvalidInputError,
    NoWorkerError,
    RouterClosedError,
    StaleWorkerError,
    UnknownRequestError,
)
from radixmeta.events.replay import DEFAULT_MAX_PENDING, ReplaySource, ReplayStats
from radixmeta.meta import MetaTree
from radixmeta.policies import as_policy
from radixmeta.policies.base import BatchPolicy, EngineLoad, Policy, Request
from radixmeta.router import batch
from radixmeta.router._collector import collector_paused
from radixmeta.router.decision import Decision
from radixmeta.router.estimate import Estimate
from radixmeta.router.feed import EventFeed
from radixmeta.router.metrics import health_of, replay_metrics, worker_metrics
from radixmeta.router.ranking import chosen_first, ranking_of
from radixmeta.router.registry import Registry, WorkerLoad

if TYPE_CHECKING:
    from radixmeta._records import Record
    from radixmeta.events.replay import Replayer
    from radixmeta.events.subscription import FleetSubscription, WorkerEndpoint

__all__ = ["Router"]

_MODES = ("exact", "approximate")

#: A prompt as every tree call takes it, converted once in compiled code (the
#: pure-Python reference has the same function): a uint32 array is taken as it is.
token_array: Callable[[object], npt.NDArray[np.uint32]] = backend.token_array


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
        workers no subscription serves (an in-process ``LogSource``...): an
        object with ``replay`` and ``snapshot`` methods.
    restart_window : int, default 16
        See :class:`~radixmeta.events.Replayer`; an integer >= 0.
    max_pending : int, default 65536
        Records one worker may have waiting before more are dropped (the worker is
        then repaired or resynced instead): see :class:`~radixmeta.events.Replayer`.
    probe_interval : float, default 1.0
        Seconds between two probes for lost tails by ``idle`` (and so by the
        thread of ``start``): each worker quiet that long is asked, in the
        background, for what followed its last batch. 0 never probes.
    group_ratio : float, default 0.5
        ``dispatch_batch``: two requests of a batch are grouped when they share
        at least one page and at least this share of the shorter prompt.
    group_slack : int, default 32
        ``dispatch_batch``: a group stays on its worker while that worker's
        requests in flight exceed the least loaded up worker's by at most this
        many; the rest of the group is decided again, among the workers that
        load still allows.
    clock : callable, default time.monotonic
        Seconds, for ``expire``; must not go backwards. It is read once per
        dispatch (once per batch) and per ``expire``; what it returns must be a
        finite number, else that call raises before it changes anything.

    Raises
    ------
    InputTypeError, InvalidInputError
        An argument of the wrong type or value (all are checked here, before
        anything is built).

    Notes
    -----
    Every call is a transaction: one that raises (a bad argument, a policy, a
    hook or the clock) changes nothing. See the Routing page of the
    documentation for the dispatch, batch, overlay and load rules and the cost
    of each operation.
    """

    def __init__(
        self,
        page_size: int = 1,
        *,
        policy: str | Policy = "default",
        mode: str = "exact",
        source: ReplaySource | None = None,
        restart_window: int = 16,
        max_pending: int = DEFAULT_MAX_PENDING,
        probe_interval: float = 1.0,
        group_ratio: float = 0.5,
        group_slack: int = 32,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if mode not in _MODES:
            msg = f"mode must be 'exact' or 'approximate', got {mode!r}"
            raise InvalidInputError(msg)
        if (
            isinstance(group_ratio, bool)
            or not isinstance(group_ratio, (int, float))
            or not 0 <= group_ratio <= 1
        ):
            msg = f"group_ratio must be a number in [0, 1], got {group_ratio!r}"
            raise InvalidInputError(msg)
        if not callable(clock):
            msg = f"clock must be a callable returning seconds, got {type(clock).__name__}"
            raise InputTypeError(msg)
        if source is not None and not (
            callable(getattr(source, "replay", None))
            and callable(getattr(source, "snapshot", None))
        ):
            msg = (
                "source must be a ReplaySource (replay and snapshot methods) or None, "
                f"got {type(source).__name__}"
            )
            raise InputTypeError(msg)
        self.group_slack = check_int("group_slack", group_slack, 0)
        self.group_ratio = float(group_ratio)
        resolved = as_policy(policy)
        self.mode = mode
        self.tree = MetaTree(page_size)
        self.page_size = self.tree.page_size
        self._exact = mode == "exact"
        self._feed = EventFeed(
            self.tree,
            source,
            check_int("restart_window", restart_window, 0),
            check_int("max_pending", max_pending, 1),
            check_seconds("probe_interval", probe_interval),
        )
        self._registry = Registry(self.tree)
        # What a worker will still hold when a request runs there (View.expected).
        # Approximate: the tree is the router's model, which has written the queues.
        self._estimate = Estimate(self.tree.page_size, modelled=not self._exact)
        self._clock = clock
        self._lock = threading.RLock()  # re-entrant: a policy hook may call the router
        self._closed = False
        # The requests in flight by id, in dispatch order (what expire relies on).
        self._flights: dict[str, Decision] = {}
        self._decisions: dict[str, int] = {}  # label -> requests that ended with it
        # Generated ids: a prefix of this router's own, then a counter (a C iterator).
        self._ids = map(f"req-{secrets.token_hex(4)}-".__add__, map(str, itertools.count()))
        self._outputs = [0, 0]  # finishes that reported output tokens, and their sum
        self.policy = resolved  # with its hooks

    @property
    def replayer(self) -> Replayer:
        """The replayer that applies the workers' events to the tree (exact mode)."""
        return self._feed.replayer

    @property
    def policy(self) -> Any:
        """The policy object (a new one may be set; dispatches after use it)."""
        return self._policy

    @policy.setter
    def policy(self, policy: str | Policy) -> None:
        resolved = as_policy(policy)
        with self._lock:
            self._policy = resolved
            self._choose = resolved.choose
            self._choose_batch = (
                resolved.choose_batch if isinstance(resolved, BatchPolicy) else None
            )
            # A batch policy that reads the batch's PrefixGroups (BatchPolicy's docstring).
            self._flat_groups = getattr(resolved, "flat_groups", False) is True
            self._on_dispatch = getattr(resolved, "on_dispatch", None)
            self._on_finish = getattr(resolved, "on_finish", None)
            rank = getattr(resolved, "rank", None)
            self._rank = rank if callable(rank) else None

    @property
    def clock(self) -> Callable[[], float]:
        """The clock ``expire`` reads (seconds; given to the constructor)."""
        return self._clock

    def _now(self) -> float:
        """The clock, read and checked (a bad reading raises before the call changes anything)."""
        now = self._clock()
        if type(now) is float and now - now == 0.0:  # finite (inf - inf and nan - nan are nan)
            return now
        return _checked_seconds(now)

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
                capacity = check_int("capacity", capacity, 0)
            worker = self.tree.add_worker(
                name, dp_rank, capacity=None if self._exact else capacity
            )
            self._registry.add(worker, capacity)
            return worker

    def set_capacity(self, worker: WorkerId, capacity: int | None) -> int:
        """Give a registered worker another KV capacity, keeping its state.

        Its requests in flight, their loads, its counters and its replay state
        stand. In approximate mode a smaller capacity trims the tree's model of
        the worker's cache at once, least recent and deepest pages first (the
        rule every insert applies), and a larger one keeps every page; in exact
        mode its pages come from its events and stay, and the capacity is what
        the eviction estimate and policies read (None: no estimate for it).

        Parameters
        ----------
        worker : WorkerId
            As returned by ``add_worker`` (or ``worker(name, dp_rank)``).
        capacity : int or None
            Tokens it can cache; None only in exact mode.

        Returns
        -------
        int
            Tokens the approximate model dropped (0 in exact mode).

        Raises
        ------
        InputTypeError, StaleWorkerError
            ``worker`` is not a registered worker, or ``capacity`` is not an int.
        InvalidInputError
            A negative capacity, or None in approximate mode.
        """
        with self._lock:
            self._check_open()
            record = self._registry.record(worker)
            if self._exact:
                if capacity is not None:
                    capacity = check_int("capacity", capacity, 0)
                trimmed = 0
            elif capacity is None:
                msg = "approximate mode needs each worker's capacity (tokens it can cache)"
                raise InvalidInputError(msg)
            else:
                trimmed = self.tree.set_capacity(record.worker, capacity)  # validates first
                capacity = self.tree.capacity_of(record.worker)
            record.capacity = capacity
            self._registry.refresh()
            return trimmed

    def remove_worker(self, worker: WorkerId) -> int:
        """Forget a worker: its pages, its requests in flight and its replay state.

        Returns the requests dropped. Each dropped request's ``on_finish`` hook is
        called; if hooks raise, the worker is removed all the same and then
        :class:`~radixmeta.errors.HookError` is raised (its ``released`` are the
        dropped requests' ids).
        """
        with self._lock:
            record = self._registry.record(worker)
            dropped = [f for f in self._flights.values() if f.worker is record.worker]
            errors = []
            for flight in dropped:
                error = self._tell_finished(flight)
                if error is not None:
                    errors.append(error)
                del self._flights[flight.request_id]
                self._release(flight, hold=False)  # the tree ends its holds itself
            self.tree.remove_worker(record.worker)
            self.replayer.forget(worker.name, worker.dp_rank)
            self._registry.remove(worker)
            if errors:
                failure = _hook_error("remove_worker", [f.request_id for f in dropped], errors)
                raise failure
            return len(dropped)

    def mark_down(self, worker: WorkerId) -> None:
        """Take a worker out of every view (its requests in flight stay counted)."""
        with self._lock:
            self._registry.record(worker).up = False
            self._registry.refresh()

    def mark_up(self, worker: WorkerId) -> None:
        """Let policies choose a worker again."""
        with self._lock:
            self._registry.record(worker).up = True
            self._registry.refresh()

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
        return self._registry.up

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
            A negative count, ``kv_usage`` outside ``[0, 1]``, or a clock reading
            that is not a finite number.
        """
        queue = None if queue_length is None else check_int("queue_length", queue_length, 0)
        run = None if running is None else check_int("running", running, 0)
        if kv_usage is not None:
            if not isinstance(kv_usage, (int, float)) or isinstance(kv_usage, bool):
                msg = f"kv_usage must be a number, got {type(kv_usage).__name__}"
                raise InputTypeError(msg)
            if not 0.0 <= kv_usage <= 1.0:
                msg = f"kv_usage must be in [0, 1], got {kv_usage}"
                raise InvalidInputError(msg)
            kv_usage = float(kv_usage)
        with self._lock:
            record = self._registry.record(worker)
            # Stamped with the router's clock and its own count at arrival, so a
            # policy can weigh the report against the counts it has since.
            at = self._now()
            own = self._registry.requests[worker.index]
            record.reported = EngineLoad(queue, kv_usage, run, at, own)
            self._registry.refresh_reported()

    def load(self, worker: WorkerId) -> WorkerLoad:
        """One worker's load, as policies see it."""
        with self._lock:
            return self._registry.load(worker)

    @property
    def in_flight(self) -> int:
        """Requests dispatched and not finished."""
        return len(self._flights)

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
        ranked: bool = False,
    ) -> Decision:
        """Choose a worker for one request, mark its pages for it and count its load.

        Parameters
        ----------
        tokens : sequence of int or 1-D integer array
            The prompt. A uint32 array (1-D, C-contiguous) is taken without a
            copy (do not change it while the request is in flight); any other
            form the trees take is converted once, in compiled code, and the
            array is what the policy and every tree call see.
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
        ranked : bool, default False
            Also rank every up worker for the request: ``Decision.ranking``, the
            chosen worker first, then the others in the policy's order (its
            ``rank`` hook, asked just before ``choose``; without one, by the tokens
            of the prompt held, then requests in flight). A caller that must fall
            back when the chosen worker turns the request away asks for it; a
            plain dispatch pays nothing for it.

        Returns
        -------
        Decision

        Raises
        ------
        InputTypeError, InvalidInputError
            Bad tokens, id, namespace, extras or expected output; or a clock
            reading that is not a finite number.
        DuplicateRequestError
            ``request_id`` is in flight.
        NoWorkerError
            No worker is up.
        PolicyError
            The policy chose something that is not a worker of its view, or a
            ``Choice`` whose reason is not a str; or (``ranked``) its ``rank``
            did not list each of the view's workers once.

        Notes
        -----
        One transaction: the request is matched, the policy chooses, the clock
        is read and the policy's ``on_dispatch`` hook is told, and only then is
        the decision committed (its pages marked, its load counted, the request
        in flight). Whatever raises before the commit (including the policy's
        ``choose``, its hook or the clock, whose exceptions propagate as they
        are) leaves the router as it was.
        """
        key = token_array(tokens)
        if request_id is not None and type(request_id) is not str:
            msg = f"request_id must be a str, got {type(request_id).__name__}"
            raise InputTypeError(msg)
        if expected_output is not None:
            expected_output = check_int("expected_output", expected_output, 0)
        if ranked is not False and ranked is not True:
            msg = f"ranked must be a bool, got {type(ranked).__name__}"
            raise InputTypeError(msg)
        with self._lock:
            if self._closed:
                msg = "dispatch on a closed Router"
                raise RouterClosedError(msg)
            rid = self._request_id(request_id)
            registry = self._registry
            if not registry.up:
                raise NoWorkerError(registry.no_worker())
            # Decide: match, view, the policy's choice (checked), the clock, the hook.
            if extras is None and namespace is None:
                m = self.tree.match(key, cursor=True)
            else:
                m = self.tree.match(key, extras=extras, namespace=namespace, cursor=True)
            every = m.length_list
            view = registry.view(m, every)
            if registry.bounded:
                view.expected = self._estimate.expected(view, key, namespace, extras)
            request = Request(rid, key, namespace, extras, group, expected_output)
            # The ranking first: a policy's rank leaves its state as choose finds it.
            order = ranking_of(self._rank, request, view) if ranked else None
            worker, label, detail = registry.checked(self._choose(request, view))
            matched = every[worker.index]
            expected = view.expected
            if expected is not None and expected is not view.lengths:
                matched = expected[registry.position[worker.index]]
            started = self._now()
            if self._on_dispatch is not None:
                self._on_dispatch(request, worker, matched)
            # Commit: nothing below raises.
            decision = Decision(rid, worker, matched, label, detail, view, request, None, started)
            if order is not None:
                decision._ranking = chosen_first(order, worker)
            self._commit(decision, m)
            return decision

    def _request_id(self, given: str | None, taken: set[str] | None = None) -> str:
        """``given`` if no request in flight has it, else a new id of this router's own."""
        if given is not None:
            if given in self._flights:
                msg = f"request {given!r} is in flight already"
                raise DuplicateRequestError(msg)
            return given
        rid = next(self._ids)
        # A caller's id may look like ours (in flight, or given in the same batch).
        while rid in self._flights or (taken is not None and rid in taken):
            rid = next(self._ids)
        return rid

    def _new_ids(self, count: int, taken: set[str]) -> list[str]:
        """``count`` new ids of this router's own, none in flight or in ``taken`` (a batch's
        given ids): what ``count`` calls of ``_request_id(None, taken)`` give, drawn at
        once. O(count)."""
        fresh = list(itertools.islice(self._ids, count))
        flights = self._flights
        if taken.isdisjoint(fresh) and flights.keys().isdisjoint(fresh):
            return fresh
        # A caller's id looks like one of ours: skip those, draw more for them (later
        # counts), as the calls one by one would have.
        kept = [rid for rid in fresh if rid not in flights and rid not in taken]
        while len(kept) < count:
            kept.append(self._request_id(None, taken))
        return kept

    def _commit(self, decision: Decision, match: Any) -> None:
        """Apply a decided request (nothing here raises): mark its pages for its worker
        from its match's walk (exact mode: a hold, released at its end; approximate: an
        insert into the router's model), count its load, and put it in flight (and, when
        the router estimates, hold its prompt in the estimate's in-flight tree)."""
        worker = decision.worker
        if self._exact:
            decision._hold = match.hold(worker)
        else:
            match.insert(worker)
        i = worker.index
        self._registry.requests[i] += 1
        self._registry.prefill[i] += len(decision._request.tokens) - decision.matched
        # The counters of metrics() take the request when it ends (finish, expire,
        # removal); until then metrics() reads it from the flights.
        self._flights[decision.request_id] = decision
        if self._registry.bounded:
            self._estimate.enter(decision)

    def _commit_batch(
        self,
        requests: list[Request],
        matches: list[Any],
        plan: batch.Plan,
        started: float,
    ) -> list[Decision]:
        """Each request of a decided batch made a decision and committed, in order, as
        ``dispatch`` commits one (nothing here raises). Returns the decisions."""
        decisions = []
        planned, views, matched_of = plan
        for request, match, (worker, label, detail), view, matched in zip(
            requests, matches, planned, views, matched_of, strict=True
        ):
            rid = request.request_id
            decision = Decision(rid, worker, matched, label, detail, view, request, None, started)
            self._commit(decision, match)
            decisions.append(decision)
        return decisions

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
        share one dispatch time, which ``expire`` reads.

        One transaction, as ``dispatch``: the whole batch is decided on the
        router's loads as they were (the plan counts its own decisions on copies),
        the clock is read and every request's ``on_dispatch`` hook is told, and
        only then is the batch committed. If a hook raises, the requests already
        told are told ``on_finish`` (the batch never went out; errors of those
        calls are dropped) and its error propagates: a batch that raises
        changes nothing in the router.

        Python's cyclic garbage collector is paused while the batch is decided
        (the batch's objects are not garbage, and walking them again and again
        makes a 100,000-request batch take 1.5 to 2.1 times the CPU); it runs
        again when the call returns or raises, and is left alone when it was off.
        """
        with collector_paused():
            return self._dispatch_batch(requests)

    def _dispatch_batch(self, requests: Sequence[object]) -> list[Decision]:
        """``dispatch_batch``, with the garbage collector paused."""
        items = [batch.batch_item(k, item, token_array) for k, item in enumerate(requests)]
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
            registry = self._registry
            if not registry.up:
                raise NoWorkerError(registry.no_worker())
            # Cursor matches: the first mark after them is along their walk, the later ones
            # (the tree has changed) walk again, still without the binding's lock.
            tree = self.tree
            matches = [
                tree.match(key, cursor=True)
                if extras is None and ns is None
                else tree.match(key, extras=extras, namespace=ns, cursor=True)
                for key, _, ns, extras, _, _ in items
            ]
            # Ids of the router's own for the items without one, none of the given ones.
            fresh = iter(self._new_ids(sum(item[1] is None for item in items), ids))
            requests_ = [
                Request(next(fresh) if rid is None else rid, key, ns, extras, group, expected)
                for key, rid, ns, extras, group, expected in items
            ]
            groups = batch.groups_of(items, self.page_size, self.group_ratio)
            # Decide: the plan (choices and what each request finds on its worker), the
            # clock, the hooks. The router's own state is untouched until the commit.
            held = batch.expected_of(registry, self._estimate, requests_, matches)
            if self._choose_batch is not None:
                plan = batch.by_policy(
                    registry, self._choose_batch, requests_, matches, groups, held,
                    flat=self._flat_groups,
                )
            else:
                plan = batch.by_groups(
                    registry, self._choose, self.group_slack, requests_, matches, groups, held
                )
            started = self._now()  # the batch is decided at one time
            self._tell_dispatched(requests_, plan[0], plan[2])
            # Commit: nothing below raises.
            return self._commit_batch(requests_, matches, plan, started)

    def _tell_dispatched(
        self, requests: list[Request], planned: list[batch.Planned], matched: list[int]
    ) -> None:
        """Each request's ``on_dispatch``, before a batch's commit. If one raises, the
        requests already told are told ``on_finish`` and the error propagates."""
        hook = self._on_dispatch
        if hook is None:
            return
        told = 0
        try:
            for request, plan, length in zip(requests, planned, matched, strict=True):
                hook(request, plan[0], length)
                told += 1
        except BaseException:
            if self._on_finish is not None:
                for request, plan in zip(requests[:told], planned[:told], strict=True):
                    with contextlib.suppress(Exception):  # the first error is the one raised
                        self._on_finish(request, plan[0])
            raise

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
            self._registry.prefill[i] -= flight._uncached
            self._registry.decode[i] += flight._decode

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

        Notes
        -----
        The policy's ``on_finish`` hook is told first: if it raises, the request
        stays in flight, as it was (``expire`` releases it even so, later).
        """
        output = check_int("output_tokens", output_tokens, 0)
        with self._lock:
            flight = self._flight(request_id)
            if self._on_finish is not None:
                self._on_finish(flight._request, flight.worker)
            del self._flights[request_id]
            self._release(flight)
            record = self._registry.records[flight.worker.index]
            assert record is not None
            record.finished += 1
            if output:
                record.output_tokens += output
                self._outputs[0] += 1
                self._outputs[1] += output

    def expire(self, older_than: float) -> list[str]:
        """Release the requests dispatched more than ``older_than`` seconds ago.

        For requests whose ``finish`` never came (a client that went away, a
        lost response). Returns their ids, oldest first.

        Raises
        ------
        InputTypeError, InvalidInputError
            A bad ``older_than``, or a clock reading that is not a finite
            number (then nothing is released).
        HookError
            The policy's ``on_finish`` raised for some of the requests: every
            one of them is released all the same (a hook must not keep requests
            in flight for ever), and then this is raised, with the ids as
            ``released``, every hook error as ``errors``, chained from the first.
        """
        if not isinstance(older_than, (int, float)) or isinstance(older_than, bool):
            msg = f"older_than must be a number of seconds, got {type(older_than).__name__}"
            raise InputTypeError(msg)
        if older_than < 0 or math.isnan(older_than):
            msg = f"older_than must be >= 0, got {older_than}"
            raise InvalidInputError(msg)
        with self._lock:
            cutoff = self._now() - older_than
            gone = []
            for flight in self._flights.values():
                if flight._started > cutoff:
                    break  # dispatched in order, by a clock that never goes back
                gone.append(flight)
            errors = []
            for flight in gone:
                error = self._tell_finished(flight)
                if error is not None:
                    errors.append(error)
                del self._flights[flight.request_id]
                self._release(flight)
                record = self._registry.records[flight.worker.index]
                assert record is not None
                record.expired += 1
            released = [flight.request_id for flight in gone]
            if errors:
                failure = _hook_error("expire", released, errors)
                raise failure
            return released

    def _flight(self, request_id: object) -> Decision:
        flight = self._flights.get(request_id) if type(request_id) is str else None
        if flight is None:
            if type(request_id) is not str:
                msg = f"request_id must be a str, got {type(request_id).__name__}"
                raise InputTypeError(msg)
            msg = f"request {request_id!r} is not in flight (never dispatched, or done already)"
            raise UnknownRequestError(msg)
        return flight

    def _tell_finished(self, flight: Decision) -> Exception | None:
        """The policy's ``on_finish`` for a request that goes whatever it says: its error."""
        if self._on_finish is None:
            return None
        try:
            self._on_finish(flight._request, flight.worker)
        except Exception as exc:  # collected: the caller releases every request, then raises
            return exc
        return None

    def _release(self, flight: Decision, *, hold: bool = True) -> None:
        """Take an ended request's load (and, unless told not to, its hold) back out and
        count it in its worker's record."""
        registry = self._registry
        i = flight.worker.index
        record = registry.records[i]
        assert record is not None
        record.dispatches += 1
        record.hit_tokens += flight.matched
        record.prompt_tokens += len(flight._request.tokens)
        self._decisions[flight.label] = self._decisions.get(flight.label, 0) + 1
        registry.requests[i] -= 1
        decode = getattr(flight, "_decode", -1)
        if decode >= 0:
            registry.decode[i] -= decode
        else:
            registry.prefill[i] -= flight._uncached
        if hold and flight._hold is not None:
            self.tree.release(flight._hold)
        self._estimate.leave(flight)

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
        """One turn of an idle loop: receive, probe for lost tails when due, replay.

        Receives what the subscriptions have (a bounded number of batches each,
        without waiting), sends the probes that are due (every ``probe_interval``,
        in the background), and replays within the budget. Socket waits (repairs,
        probes) run on the replayer's threads, holding no lock: dispatch goes on
        meanwhile against what the router holds. Without a budget the replay
        waits for them (see ``Replayer.replay``); the thread of ``start`` always
        has one.
        """
        self._feed.poll()
        self._feed.probe_if_due()
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
        router keeps the subscription only to poll it in ``idle``, to ask it for
        its workers' gaps, and to close it in ``close`` (or ``unsubscribe``);
        closing the subscription itself detaches it from the router. Arguments
        are those of :class:`~radixmeta.events.subscription.FleetSubscription`,
        whose block size is the router's page size.

        A call that raises changes nothing: everything the subscription checks
        (the codec, the ports, a worker given twice, its sockets' binds) is
        checked, and its sockets opened, before a worker is added.

        Raises
        ------
        InvalidInputError, InputTypeError
            An approximate router, a bad argument or worker name, colliding ports.
        RouterClosedError
            The router is closed (or was closed meanwhile).
        """
        from radixmeta.events.subscription import FleetSubscription

        self._check_exact("subscribe")
        self._check_open()
        for endpoint in workers:
            if not isinstance(endpoint.name, str):
                msg = f"worker name must be a str, got {type(endpoint.name).__name__}"
                raise InputTypeError(msg)
        # Outside the lock (it opens and binds sockets), and before any worker is added.
        subscription = FleetSubscription(
            workers,
            codec=codec,
            block_size=self.page_size,
            topic=topic,
            tiers=tiers,
            replay_timeout=replay_timeout,
            replayer=self.replayer,
            on_close=self._detach,
            **subscriber_options,
        )
        try:
            with self._lock:
                self._check_open()
                for name, rank in subscription.sources:
                    try:
                        self.tree.worker(name, rank)
                    except StaleWorkerError:
                        self.add_worker(name, rank)  # checked above: it cannot fail
                self._feed.attach(subscription)
        except BaseException:
            subscription.close()  # outside the lock; nothing was added (the router closed)
            raise
        return subscription

    def unsubscribe(self, worker: WorkerId) -> FleetSubscription | None:
        """Close the subscription that feeds ``worker`` and stop asking it for gaps.

        Returns that subscription, or None when none fed the worker. A
        subscription serves every worker it was made for (one ``subscribe``
        call): closing it ends the feed of all of them, so subscribe workers one
        by one to be able to drop one alone. The workers stay registered, with
        the pages their events reported until then (``remove_worker`` forgets a
        worker).

        Raises
        ------
        InvalidInputError
            An approximate router (it takes no events).
        StaleWorkerError, InputTypeError
            ``worker`` is not a worker of this router.
        """
        self._check_exact("unsubscribe")
        with self._lock:
            self._registry.record(worker)
            subscription = self._feed.serving((worker.name, worker.dp_rank))
            if subscription is None:
                return None
            self._feed.detach(subscription)
        subscription.close()  # outside the lock: it closes sockets
        return subscription

    def _detach(self, subscription: FleetSubscription) -> None:
        """A subscription of this router was closed: poll it and ask it no more."""
        with self._lock:
            self._feed.detach(subscription)

    def start(
        self,
        interval: float = 0.01,
        *,
        max_records: int | None = None,
        max_seconds: float | None = 0.02,
    ) -> None:
        """Run ``idle`` in a background thread every ``interval`` seconds until ``close``.

        The thread is supervised: a turn that raises is logged and counted, and
        the thread goes on after a backoff that doubles from ``max(interval,
        0.01)`` up to 1 s (``health()`` shows its state). ``interval`` 0 runs turns
        back to back while they succeed. Each
        turn replays within the budget given (``max_seconds`` 0.02 by default, so
        no turn waits on a repair), and probes for lost tails every
        ``probe_interval``.
        """
        interval = check_seconds("interval", interval)
        if max_records is not None:
            max_records = check_int("max_records", max_records, 0)
        if max_seconds is not None:
            max_seconds = check_seconds("max_seconds", max_seconds)
        with self._lock:
            self._check_open()
            self._feed.start(
                interval, lambda: self.idle(max_records=max_records, max_seconds=max_seconds)
            )

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
            decisions, workers = worker_metrics(
                self._registry, self._flights, self._decisions, self.tree, self._exact
            )
            in_flight = len(self._flights)
        replay = replay_metrics(self.replayer)
        return {
            "mode": self.mode,
            "policy": type(self._policy).__name__,
            "dispatches": sum(w["dispatches"] for w in workers),
            "in_flight": in_flight,
            "decisions": decisions,
            "workers": workers,
            "replay": replay,
            "tree": {"nodes": self.tree.node_count, "holds": self.tree.hold_count},
        }

    def metrics_text(self) -> str:
        """``metrics()`` and ``health()`` in the Prometheus text exposition format
        (``radixmeta_router_*``). Never waits on a socket."""
        from radixmeta.router.exposition import exposition

        return exposition(self.metrics(), self.health())

    def health(self) -> dict[str, Any]:
        """Whether the event path is alive, and the state of each worker's view.

        Never waits on a socket: repairs run on threads of their own.

        Returns
        -------
        dict
            ``mode``; ``thread``: the background thread of ``start`` (``state``:
            ``"not started"``, ``"running"``, ``"backing off"`` after a turn
            raised, ``"stopped"``, or ``"dead"``; ``alive``, ``turns``,
            ``errors``, ``last_error``, ``seconds_since_turn``); ``pending``
            records and ``asking`` (repairs and probes in flight); ``workers``:
            per registered worker ``worker``, ``dp_rank``, ``subscribed``,
            ``last_applied`` (seconds since a record of it was applied, None if
            none was), ``lag_records``, ``lag_seconds``, ``stale`` (records were
            lost for good: its view is partial until rebuilt), ``repairing`` (a
            replay or snapshot request is in flight; dispatch uses what the
            router holds meanwhile) and ``last_error``.
        """
        with self._lock:
            workers = list(self.tree.workers)
            subscribed = set(self._feed.sources.by_worker)
        return health_of(self.mode, self._feed.thread, self.replayer, workers, subscribed)

    # -- life ----------------------------------------------------------------------------
    def close(self, timeout: float = 5.0) -> None:
        """Stop the background thread, the repairs and the subscriptions (idempotent).

        The subscriptions are closed first, which ends their requests in flight at
        once (a repair waiting on a dead replay socket returns), then the threads
        are joined, each within ``timeout``: a router mid-repair closes in well under
        a second. Requests in flight can still be finished or expired; nothing can
        be dispatched.
        """
        with self._lock:
            self._closed = True
            thread = self._feed.take_thread()
            subscriptions = self._feed.take_subscriptions()
        for subscription in subscriptions:
            subscription.close()
        started = time.monotonic()
        if thread is not None:
            thread.join(timeout)
        self.replayer.close(max(0.0, timeout - (time.monotonic() - started)))

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
            f"up={len(self.up)}, in_flight={len(self._flights)})"
        )


def _checked_seconds(now: object) -> float:
    """A clock reading that is not a plain finite float: taken if it is a finite number."""
    if isinstance(now, bool) or not isinstance(now, (int, float)):
        msg = f"the router's clock must return a number of seconds, got {type(now).__name__}"
        raise InputTypeError(msg)
    if not math.isfinite(now):
        msg = f"the router's clock must return finite seconds, got {now!r}"
        raise InvalidInputError(msg)
    return float(now)


def _hook_error(call: str, released: list[str], errors: list[Exception]) -> HookError:
    """What ``expire`` and ``remove_worker`` raise after releasing what hooks refused."""
    msg = (
        f"{call} released {len(released)} request(s); the policy's on_finish raised for "
        f"{len(errors)} of them (the first: {errors[0]!r})"
    )
    error = HookError(msg, released, errors)
    error.__cause__ = errors[0]
    return error
