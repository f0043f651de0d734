"""The discrete-event simulator of a data-parallel fleet behind a radixmeta Router.

Real parts, simulated time: every worker is a :class:`~radixmeta.sim.worker.SimWorker`
(a real :class:`~radixmeta.RadixCache` with its :class:`~radixmeta.EventLog`), the
router is a real :class:`~radixmeta.Router` with its policy and its Replayer, and
only the clock is simulated. Time advances through a heap of timed events of our
own, ``(time, kind, order, payload)``: ties break by kind (a step that ends comes
before a delivery of records, which comes before an arrival) and then by the order
they were scheduled, so a run is a pure function of its inputs and seed. A
process-based DES library (SimPy) would cost a generator switch and an event
object per step, several microseconds each; the heap keeps the engine's own cost
per request to a few microseconds so the real parts dominate the wall time.

Consistency, how the workers' records reach the router's tree:

``immediate``
    applied as soon as the step that produced them ends;
``delayed``
    applied ``latency`` simulated seconds later;
``idle``
    queued, and applied when the router is idle: when the next thing to happen is
    not another arrival at the same instant (the A.4 design: replay "during periods
    of low activity");
``none``
    never sent: the router runs in approximate mode and models each worker's
    cache from its own decisions, bounded by the worker's capacity.

The router itself can take simulated time (``SimConfig.dispatch_time`` per
request, ``replay_time`` per replayed record, both 0 by default): it is one
server, so arrivals wait while it replays and idle replay waits while it
dispatches, and a dispatched request reaches its worker when the router is done
with its group. Every ``report_interval`` seconds of simulated time each worker
reports its queue, running batch and KV usage through ``Router.report_load``.

The real wall time of dispatch and replay is measured and kept apart from the
simulated results (:attr:`SimRun.timing`), so the same seed gives the same
results byte for byte.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from radixmeta.errors import InvalidInputError
from radixmeta.policies import costs
from radixmeta.sim.worker import BatchLimits, SimWorker

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from radixmeta.policies.base import Policy

__all__ = ["CACHE_BLIND", "CONSISTENCIES", "MODEL", "SimConfig", "SimRun", "Simulation"]

CONSISTENCIES = ("immediate", "delayed", "idle", "none")

#: Policies that route without looking at prefixes: a batch of theirs is dispatched
#: request by request, since grouping by prefix would make them affinity policies.
CACHE_BLIND = frozenset({"round_robin", "random", "least_loaded", "power_of_two"})

#: ``SimConfig.capacity`` and ``context_len``: take the figure from the cost model.
MODEL = "model"

# Event kinds, in the order they are handled at one instant.
_STEP_DONE = 0
_DELIVER = 1
_ENQUEUE = 2  # dispatched requests reach their workers (router time > 0)
_WAKE = 3  # the router is free again (router time > 0)
_ARRIVAL = 4


@dataclass(frozen=True)
class SimConfig:
    """One simulated fleet and how it is run.

    Attributes
    ----------
    workers : int
        Data-parallel workers.
    policy : str or Policy
        The router's policy, by name (:func:`radixmeta.policies.names`) or an object.
    policy_params : dict
        Parameters for a policy given by name.
    consistency : {"immediate", "delayed", "idle", "none"}
        How the workers' records reach the router (module docstring).
    latency : float
        Seconds a record takes under ``delayed``.
    capacity : int, None or "model"
        Each worker's KV pool in tokens, the prefix cache and the running
        requests' KV together; ``None`` is unbounded (no memory bound at all);
        ``"model"`` (the default) is the cost model's pool
        (:attr:`~radixmeta.policies.costs.CostModel.kv_tokens`).
    context_len : int, None or "model"
        The model's context length: longer requests are rejected; ``None``: no
        limit; ``"model"`` (the default): the cost model's.
    page_size : int
        Tokens per page, for the workers' caches and the router's tree.
    prefill, decode : str or callable
        Cost models (names of :mod:`radixmeta.policies.costs`, or callables).
    limits : BatchLimits
        Each worker's batch bounds.
    log_form : {"path", "blocks"}
        The workers' EventLog form.
    seed : int
        Seeds a policy given by name that takes a seed.
    batch_dispatch : bool or None
        Whether requests arriving at one instant go through ``Router.dispatch_batch``
        (which keeps a batch's shared-prefix groups together) or one by one.
        ``None``: through the batch path, except for the cache-blind baselines
        (``CACHE_BLIND``), whose rule is to ignore prefixes.
    trace : bool
        Keep the spans for a Chrome trace (costs memory on long runs).
    report_interval : float
        Simulated seconds between the workers' load reports to the router
        (``Router.report_load``); ``inf`` never reports.
    dispatch_time, replay_time : float
        Simulated router seconds per dispatched request and per replayed record.
    check : bool
        Check every worker's KV invariants after every step, and that every pool
        drained at the end (:meth:`~radixmeta.sim.worker.SimWorker.check`): for
        tests, O(tree) a step.
    """

    workers: int = 4
    policy: str | Policy = "default"
    policy_params: dict[str, Any] = field(default_factory=dict)
    consistency: str = "idle"
    latency: float = 0.05
    capacity: int | str | None = MODEL
    context_len: int | str | None = MODEL
    page_size: int = 1
    prefill: str | Callable[[int, int], float] = costs.DEFAULT_PREFILL
    decode: str | Callable[[int, int], float] = costs.DEFAULT_PREFILL
    limits: BatchLimits = field(default_factory=BatchLimits)
    log_form: str = "path"
    seed: int = 0
    batch_dispatch: bool | None = None
    trace: bool = False
    report_interval: float = 0.1
    dispatch_time: float = 0.0
    replay_time: float = 0.0
    check: bool = False

    def __post_init__(self) -> None:
        if self.consistency not in CONSISTENCIES:
            msg = f"consistency must be one of {', '.join(CONSISTENCIES)}, got {self.consistency!r}"
            raise InvalidInputError(msg)
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            msg = f"workers must be a positive int, got {self.workers!r}"
            raise InvalidInputError(msg)
        for what in ("capacity", "context_len"):
            value = getattr(self, what)
            if value is None or value == MODEL:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                msg = (
                    f"{what} must be a positive number of tokens, None or {MODEL!r}, "
                    f"got {value!r}"
                )
                raise InvalidInputError(msg)
        for what in ("latency", "dispatch_time", "replay_time"):
            value = getattr(self, what)
            if not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
                msg = f"{what} must be a finite number of seconds >= 0, got {value!r}"
                raise InvalidInputError(msg)
        interval = self.report_interval
        if not isinstance(interval, (int, float)) or not interval > 0:  # also refuses NaN
            msg = f"report_interval must be > 0 seconds (inf: never), got {interval!r}"
            raise InvalidInputError(msg)
        self.resolved("capacity")  # "model" without a cost model: refused here, not at run
        self.resolved("context_len")
        if self.limits.max_running < 1 or self.limits.max_prefill_tokens < 1:
            msg = (
                f"max_running and max_prefill_tokens must be >= 1, got "
                f"{self.limits.max_running} and {self.limits.max_prefill_tokens}"
            )
            raise InvalidInputError(msg)

    @property
    def cost_model(self) -> costs.CostModel | None:
        """The cost model named by ``prefill`` (or ``decode``), if it is one of ``COST_MODELS``."""
        for name in (self.prefill, self.decode):
            if isinstance(name, str) and name in costs.COST_MODELS:
                return costs.COST_MODELS[name]
        return None

    def resolved(self, what: str) -> int | None:
        """``capacity`` or ``context_len`` in tokens, ``"model"`` taken from the cost model.

        Raises
        ------
        InvalidInputError
            ``"model"`` with time models that are not a cost model (callables, or
            a prefill-only fit): give the figure yourself.
        """
        value = getattr(self, what)
        if value != MODEL:
            return value  # type: ignore[no-any-return]
        model = self.cost_model
        if model is None:
            msg = (
                f"{what}={MODEL!r} needs a cost model of radixmeta.policies.costs.COST_MODELS "
                f"({', '.join(sorted(costs.COST_MODELS))}) as prefill or decode model; "
                f"give {what} in tokens (or None) instead"
            )
            raise InvalidInputError(msg)
        return model.kv_tokens if what == "capacity" else model.context_len

    @property
    def policy_name(self) -> str:
        """The policy's name for reports."""
        if isinstance(self.policy, str):
            return self.policy
        return getattr(self.policy, "name", type(self.policy).__name__)


@dataclass
class SimRun:
    """What one run recorded, before it is summarised (see :mod:`radixmeta.sim.metrics`).

    Per-request lists are indexed like the workload's requests; times are simulated
    seconds (``nan`` where the run never reached that point).
    """

    config: SimConfig
    arrival: list[float]
    prompt_len: list[int]
    output_len: list[int]
    worker: list[int]  # index of the worker the router chose
    estimated: list[int]  # the router's matched length at dispatch
    hits: list[int]  # tokens the worker's own cache matched at admission
    admitted: list[float]
    first_token: list[float]
    finished: list[float]
    worker_names: list[str]
    prefill_busy: list[float]
    decode_busy: list[float]
    steps: list[int]
    insert_refused: list[int]
    rejected: list[bool] = field(default_factory=list)  # per request: longer than allowed
    capacity: int | None = None  # the pool per worker, resolved
    context_len: int | None = None
    worker_rejected: list[int] = field(default_factory=list)  # per worker, like steps
    admission_refused: list[int] = field(default_factory=list)
    retracted: list[int] = field(default_factory=list)
    requeued: list[int] = field(default_factory=list)
    kv_peak: list[float | None] = field(default_factory=list)  # of the pool, None: unbounded
    lags: list[tuple[float, int]] = field(default_factory=list)  # (seconds, records) per apply
    lag_sum: float = 0.0  # record-seconds between a record's step and its replay
    lag_max: float = 0.0
    records: int = 0  # records the workers produced
    removed: int = 0  # of which removals (evictions)
    replay_stats: dict[str, Any] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)  # real seconds: not deterministic
    load: list[tuple[float, int, int, int]] = field(
        default_factory=list
    )  # (t, w, waiting, running)
    spans: list[tuple[str, int, float, float]] = field(default_factory=list)  # (kind, w, t, dur)


class Simulation:
    """Runs one :class:`SimConfig` over a list of requests.

    Parameters
    ----------
    tokens : sequence of numpy.ndarray
        Each request's prompt (uint32).
    arrivals : sequence of float
        Each request's arrival time in seconds, non-decreasing.
    outputs : sequence of int
        Each request's output tokens (at least one is produced: the prefill's).
    config : SimConfig
        The fleet.
    """

    def __init__(
        self,
        tokens: Sequence[npt.NDArray[np.uint32]],
        arrivals: Sequence[float],
        outputs: Sequence[int],
        config: SimConfig,
    ) -> None:
        n = len(tokens)
        if len(arrivals) != n or len(outputs) != n:
            lengths = f"{n}, {len(arrivals)}, {len(outputs)}"
            msg = f"tokens, arrivals and outputs differ in length: {lengths}"
            raise InvalidInputError(msg)
        if any(b < a for a, b in itertools.pairwise(arrivals)):
            msg = "arrivals must be in non-decreasing order"
            raise InvalidInputError(msg)
        self.tokens = list(tokens)
        self.arrivals = [float(a) for a in arrivals]
        self.outputs = [max(1, int(o)) for o in outputs]
        self.config = config

    @classmethod
    def from_workload(cls, workload: Any, config: SimConfig) -> Simulation:
        """The simulation of a :class:`~radixmeta.sim.workloads.Workload` (or any sequence of
        requests with ``tokens``, ``arrival`` and ``output_len``)."""
        requests = list(workload)
        return cls(
            [r.tokens for r in requests],
            [r.arrival for r in requests],
            [r.output_len for r in requests],
            config,
        )

    def run(self, progress: Callable[[int], None] | None = None) -> SimRun:
        """Simulate to the last finish; ``progress(k)`` is told of every k requests finished."""
        from radixmeta.router import Router  # the layer above the trees and events

        cfg = self.config
        tokens, arrivals, outputs = self.tokens, self.arrivals, self.outputs
        n = len(tokens)
        nan = float("nan")
        prefill = costs.prefill_model(cfg.prefill)
        decode = costs.decode_model(cfg.decode)
        capacity = cfg.resolved("capacity")
        context_len = cfg.resolved("context_len")
        exact = cfg.consistency != "none"
        clock_now = [0.0]  # the simulated time, for every clock the router and policy read

        def sim_clock() -> float:
            return clock_now[0]

        router = Router(
            cfg.page_size,
            policy=_policy(cfg, sim_clock),
            mode="exact" if exact else "approximate",
            clock=sim_clock,
        )
        batched = (
            cfg.batch_dispatch
            if cfg.batch_dispatch is not None
            else cfg.policy_name not in CACHE_BLIND
        )
        remaining = list(outputs)
        workers: list[SimWorker] = []
        ids: dict[Any, int] = {}
        by_name: dict[str, SimWorker] = {}
        router_ids: list[Any] = []
        for i in range(cfg.workers):
            name = f"w{i}"
            worker = SimWorker(
                name,
                cfg.page_size,
                capacity,
                prefill,
                decode,
                cfg.limits,
                cfg.log_form,
                context_len=context_len,
                check=cfg.check,
                fuse=not cfg.trace,  # a trace shows every step
                records=exact,  # approximate routing reads no records
            )
            worker.bind(self.tokens, outputs, remaining)
            workers.append(worker)
            by_name[name] = worker
            # Approximate mode needs a bound for its modelled cache; unbounded is "huge".
            bound = capacity if (capacity is not None or exact) else 1 << 62
            wid = router.add_worker(name, capacity=bound)
            ids[wid] = i
            router_ids.append(wid)
        run = SimRun(
            cfg,
            arrivals,
            [len(t) for t in tokens],
            outputs,
            [-1] * n,
            [0] * n,
            [0] * n,
            [nan] * n,
            [nan] * n,
            [nan] * n,
            [w.name for w in workers],
            [],
            [],
            [],
            [],
            rejected=[False] * n,
            capacity=capacity,
            context_len=context_len,
        )
        hits = run.hits
        heap: list[tuple[float, int, int, Any]] = []
        order = 0
        current: list[Any] = [None] * len(workers)  # per worker, the step in flight
        generation = [0] * len(workers)  # a cut plan's old end event is stale
        deliveries: dict[int, tuple[float, list[Any]]] = {}
        queued: list[tuple[float, list[Any]]] = []  # idle: records waiting for an idle router
        wall = {"dispatch": 0.0, "replay": 0.0, "workers": 0.0}
        trace, spans, load = cfg.trace, run.spans, run.load
        next_arrival = 0
        clock = time.perf_counter
        dispatch_time, replay_time = cfg.dispatch_time, cfg.replay_time
        router_free = 0.0  # when the router is done with its dispatches and replays
        interval = cfg.report_interval
        reporting = math.isfinite(interval)
        next_tick = 0  # the next report instant not yet sent, in intervals
        reported: list[tuple[int, int, float | None] | None] = [None] * len(workers)
        pending: list[tuple[int, int, float | None] | None] = [None] * len(workers)

        def push(at: float, kind: int, payload: Any) -> None:
            nonlocal order
            heapq.heappush(heap, (at, kind, order, payload))
            order += 1

        def start(wi: int, now: float) -> None:
            w = workers[wi]
            t0 = clock()
            admitted = w.admit(hits)
            if admitted is not None:
                rs, duration = admitted
                for r in rs:
                    run.admitted[r] = now  # the admission of its last prefill counts
                current[wi] = ("prefill", rs)
            elif w.running:
                ends = w.plan_decode(now)
                if ends is not None:  # steps with nothing to decide between them
                    wall["workers"] += clock() - t0
                    w.busy = True
                    current[wi] = ("decode_run", None)
                    push(ends[-1], _STEP_DONE, (wi, generation[wi]))
                    return
                # A retracted request stays in flight at the router (dispatched, not
                # finished): its worker prefills it again, so the router is not told.
                duration, _ = w.decode_step()
                current[wi] = ("decode", None)
            else:
                w.busy = False
                if not w.waiting:
                    w.idle()
                wall["workers"] += clock() - t0
                return
            wall["workers"] += clock() - t0
            w.busy = True
            if trace:
                spans.append((current[wi][0], wi, now, duration))
                load.append((now, wi, len(w.waiting), len(w.running)))
            push(now + duration, _STEP_DONE, (wi, generation[wi]))

        def apply(deliveries_now: list[tuple[float, list[Any]]], now: float) -> None:
            """Submit every (produced at, records) pair, then replay them in one call."""
            nonlocal router_free
            t0 = clock()
            count = 0
            for produced, records in deliveries_now:
                router.submit(records)
                lag = now - produced
                run.lag_sum += lag * len(records)
                run.lag_max = max(run.lag_max, lag)
                run.lags.append((lag, len(records)))
                count += len(records)
            router.replay()
            # Applied: the workers' logs need not keep them (the router is their only reader).
            for _, records in deliveries_now:
                by_name[records[-1].worker].applied(records[-1].seq)
            wall["replay"] += clock() - t0
            if replay_time:
                router_free = max(router_free, now) + replay_time * count
            if trace:  # no simulated time passes: an instant on the router's track
                spans.append(("replay", -1, now, replay_time * count))

        def publish(records: list[Any], now: float) -> None:
            run.records += len(records)
            run.removed += sum(1 for r in records if r.kind == "removed")
            if cfg.consistency == "immediate":
                apply([(now, records)], now)
            elif cfg.consistency == "delayed":
                key = order
                deliveries[key] = (now, records)
                push(now + cfg.latency, _DELIVER, key)
            else:  # idle
                queued.append((now, records))

        def schedule_arrival(now: float) -> None:
            if next_arrival < n:
                push(max(arrivals[next_arrival], now), _ARRIVAL, next_arrival)

        def enqueue(placed: list[tuple[int, int]], now: float) -> None:
            """Dispatched requests reach their workers: queued, or rejected as too long."""
            t0 = clock()
            touched = set()
            for r, wi in placed:
                w = workers[wi]
                if w.accepts(r):
                    if not w.waiting and current[wi] is not None and current[wi][0] == "decode_run":
                        # The plan assumed an empty queue: it ends with the step in flight.
                        end = w.cut_plan(now)
                        if end is not None:
                            generation[wi] += 1
                            push(end, _STEP_DONE, (wi, generation[wi]))
                    w.waiting.append(r)
                    touched.add(wi)
                else:  # the engine refuses it on arrival, as SGLang's tokenizer manager
                    w.rejected += 1
                    run.rejected[r] = True
                    router.finish(str(r))
            wall["dispatch"] += clock() - t0
            for wi in sorted(touched):
                if not workers[wi].busy:
                    start(wi, now)

        def sample(at: float) -> None:
            """Every worker's numbers at the report instant ``at``."""
            for wi, w in enumerate(workers):
                pending[wi] = w.snapshot(at)

        def report(at: float) -> None:
            """Hand the router what the workers reported at the instant ``at``, where it
            changed, on the router's clock at that instant.

            Called as the report instant is sampled, before the event that crosses
            it: the router's own counts are then as they were at ``at`` too (they
            change only in events), so the report's stamp (its time and the router's
            count then) agrees with what it says.
            """
            t0 = clock()
            clock_now[0] = at
            for wi, numbers in enumerate(pending):
                if numbers is not None and numbers != reported[wi]:
                    reported[wi] = numbers
                    router.report_load(
                        router_ids[wi],
                        queue_length=numbers[0],
                        running=numbers[1],
                        kv_usage=numbers[2],
                    )
            wall["dispatch"] += clock() - t0

        schedule_arrival(0.0)
        while heap:
            now, kind, _, payload = heapq.heappop(heap)
            if reporting and next_tick * interval <= now:
                # Nothing changed since the last event, so the last report instant up
                # to now sees the state as it is: one report stands for them all.
                tick = max(next_tick, int(now / interval) - 1)
                while (tick + 1) * interval <= now:
                    tick += 1
                sample(tick * interval)
                report(tick * interval)
                next_tick = tick + 1
            clock_now[0] = now
            if kind == _ARRIVAL:
                if router_free > now:  # busy replaying or dispatching: the arrival waits
                    push(router_free, _ARRIVAL, payload)
                    continue
                first = payload
                last = first + 1
                while last < n and arrivals[last] == arrivals[first]:
                    last += 1
                next_arrival = last
                t0 = clock()
                if last - first == 1 or not batched:
                    decisions = [
                        router.dispatch(tokens[r], request_id=str(r), expected_output=outputs[r])
                        for r in range(first, last)
                    ]
                else:
                    decisions = router.dispatch_batch(
                        [
                            {
                                "tokens": tokens[r],
                                "request_id": str(r),
                                "expected_output": outputs[r],
                            }
                            for r in range(first, last)
                        ]
                    )
                wall["dispatch"] += clock() - t0
                placed = []
                for r, d in zip(range(first, last), decisions, strict=True):
                    wi = ids[d.worker]
                    run.worker[r] = wi
                    run.estimated[r] = d.matched
                    placed.append((r, wi))
                if dispatch_time:  # they reach their workers when the router is done
                    router_free = now + dispatch_time * (last - first)
                    push(router_free, _ENQUEUE, placed)
                else:
                    enqueue(placed, now)
                schedule_arrival(now)
            elif kind == _STEP_DONE:
                wi, gen = payload
                if gen != generation[wi]:
                    continue  # the end of a plan that was cut short
                w = workers[wi]
                what, rs = current[wi]
                current[wi] = None
                t0 = clock()
                if what == "prefill":
                    finished = w.finish_prefill(rs)
                    for r in rs:
                        if math.isnan(run.first_token[r]):  # not again after a retraction
                            run.first_token[r] = now
                elif what == "decode_run":
                    finished = w.commit_decode()
                else:
                    finished = w.advance()
                records = w.new_records() if exact else []
                wall["workers"] += clock() - t0
                t0 = clock()
                if what == "prefill":
                    for r in rs:
                        if run.first_token[r] == now:
                            router.prefill_done(str(r))
                for r in finished:
                    run.finished[r] = now
                    router.finish(str(r), output_tokens=outputs[r])
                wall["dispatch"] += clock() - t0
                if progress is not None and finished:
                    progress(len(finished))
                if records:
                    publish(records, now)
                start(wi, now)
            elif kind == _DELIVER:
                apply([deliveries.pop(payload)], now)
            elif kind == _ENQUEUE:
                enqueue(payload, now)
            # _WAKE: nothing but the idle check below.
            # The router is idle unless it is busy or another arrival is due by now.
            if (
                queued
                and router_free <= now
                and not (next_arrival < n and arrivals[next_arrival] <= now)
            ):
                apply(queued, now)
                queued.clear()
                if router_free > now:
                    push(router_free, _WAKE, None)
        for w in workers:
            if cfg.check:
                w.check_drained()
            run.prefill_busy.append(w.prefill_busy)
            run.decode_busy.append(w.decode_busy)
            run.steps.append(w.steps)
            run.insert_refused.append(w.insert_refused)
            run.worker_rejected.append(w.rejected)
            run.admission_refused.append(w.admission_refused)
            run.retracted.append(w.retracted)
            run.requeued.append(w.requeued)
            run.kv_peak.append(None if capacity is None else w.kv_peak_tokens / capacity)
        run.timing = wall
        if exact:
            run.replay_stats = dataclasses.asdict(router.replayer.stats)
        router.close()
        return run


def _policy(cfg: SimConfig, clock: Callable[[], float]) -> Any:
    """The policy object; a built-in gets the run's seed, the simulated clock and the run's
    own prefill and decode models (a policy that predicts times predicts the fleet's)."""
    if not isinstance(cfg.policy, str):
        return cfg.policy
    import inspect

    from radixmeta import policies

    params = dict(cfg.policy_params)
    cls = policies.POLICIES.get(cfg.policy)
    if cls is not None:
        accepted = inspect.signature(cls).parameters
        if "seed" in accepted:
            params.setdefault("seed", cfg.seed)
        if "clock" in accepted:
            params.setdefault("clock", clock)
        if "prefill" in accepted:
            params.setdefault("prefill", cfg.prefill)
        if "decode" in accepted:
            params.setdefault("decode", cfg.decode)
    return policies.create(cfg.policy, **params)
