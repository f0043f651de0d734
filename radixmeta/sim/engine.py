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

The real wall time of dispatch and replay is measured and kept apart from the
simulated results (:attr:`SimResult.timing`), so the same seed gives the same
results byte for byte.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
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

__all__ = ["CACHE_BLIND", "CONSISTENCIES", "SimConfig", "SimRun", "Simulation"]

CONSISTENCIES = ("immediate", "delayed", "idle", "none")

#: Policies that route without looking at prefixes: a batch of theirs is dispatched
#: request by request, since grouping by prefix would make them affinity policies.
CACHE_BLIND = frozenset({"round_robin", "random", "least_loaded", "power_of_two"})

# Event kinds, in the order they are handled at one instant.
_STEP_DONE = 0
_DELIVER = 1
_ARRIVAL = 2


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
    capacity : int or None
        Each worker's cache capacity in tokens; ``None`` is unbounded.
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
    """

    workers: int = 4
    policy: str | Policy = "default"
    policy_params: dict[str, Any] = field(default_factory=dict)
    consistency: str = "idle"
    latency: float = 0.05
    capacity: int | None = None
    page_size: int = 1
    prefill: str | Callable[[int, int], float] = costs.DEFAULT_PREFILL
    decode: str | Callable[[int, int], float] = costs.DEFAULT_PREFILL
    limits: BatchLimits = field(default_factory=BatchLimits)
    log_form: str = "path"
    seed: int = 0
    batch_dispatch: bool | None = None
    trace: bool = False

    def __post_init__(self) -> None:
        if self.consistency not in CONSISTENCIES:
            msg = f"consistency must be one of {', '.join(CONSISTENCIES)}, got {self.consistency!r}"
            raise InvalidInputError(msg)
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            msg = f"workers must be a positive int, got {self.workers!r}"
            raise InvalidInputError(msg)
        if self.capacity is not None and self.capacity < 1:
            msg = f"capacity must be a positive number of tokens or None, got {self.capacity!r}"
            raise InvalidInputError(msg)
        if self.latency < 0:
            msg = f"latency must be >= 0, got {self.latency!r}"
            raise InvalidInputError(msg)

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
        workers: list[SimWorker] = []
        ids: dict[Any, int] = {}
        for i in range(cfg.workers):
            name = f"w{i}"
            workers.append(
                SimWorker(
                    name, cfg.page_size, cfg.capacity, prefill, decode, cfg.limits, cfg.log_form
                )
            )
            # Approximate mode needs a bound for its modelled cache; unbounded is "huge".
            capacity = cfg.capacity if (cfg.capacity is not None or exact) else 1 << 62
            ids[router.add_worker(name, capacity=capacity)] = i
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
        )
        remaining = list(outputs)
        prompt_lens = run.prompt_len
        hits = run.hits
        heap: list[tuple[float, int, int, Any]] = []
        order = 0
        current: list[Any] = [None] * len(workers)  # per worker, the step in flight
        deliveries: dict[int, tuple[float, list[Any]]] = {}
        queued: list[tuple[float, list[Any]]] = []  # idle: records waiting for an idle router
        wall = {"dispatch": 0.0, "replay": 0.0, "workers": 0.0}
        trace, spans, load = cfg.trace, run.spans, run.load
        next_arrival = 0
        clock = time.perf_counter

        def start(wi: int, now: float) -> None:
            nonlocal order
            w = workers[wi]
            t0 = clock()
            admitted = w.admit(tokens, hits)
            if admitted is not None:
                rs, duration = admitted
                for r in rs:
                    run.admitted[r] = now
                current[wi] = ("prefill", rs)
            elif w.running:
                duration = w.decode_step()
                current[wi] = ("decode", None)
            else:
                w.busy = False
                wall["workers"] += clock() - t0
                return
            wall["workers"] += clock() - t0
            w.busy = True
            if trace:
                spans.append((current[wi][0], wi, now, duration))
                load.append((now, wi, len(w.waiting), len(w.running)))
            heapq.heappush(heap, (now + duration, _STEP_DONE, order, wi))
            order += 1

        def apply(deliveries_now: list[tuple[float, list[Any]]], now: float) -> None:
            """Submit every (produced at, records) pair, then replay them in one call."""
            t0 = clock()
            for produced, records in deliveries_now:
                router.submit(records)
                run.lag_sum += (now - produced) * len(records)
                run.lag_max = max(run.lag_max, now - produced)
            router.replay()
            wall["replay"] += clock() - t0
            if trace:  # no simulated time passes: an instant on the router's track
                spans.append(("replay", -1, now, 0.0))

        def publish(records: list[Any], now: float) -> None:
            nonlocal order
            run.records += len(records)
            run.removed += sum(1 for r in records if r.kind == "removed")
            if cfg.consistency == "immediate":
                apply([(now, records)], now)
            elif cfg.consistency == "delayed":
                deliveries[order] = (now, records)
                heapq.heappush(heap, (now + cfg.latency, _DELIVER, order, order))
                order += 1
            else:  # idle
                queued.append((now, records))

        def schedule_arrival() -> None:
            nonlocal order
            if next_arrival < n:
                heapq.heappush(heap, (arrivals[next_arrival], _ARRIVAL, order, next_arrival))
                order += 1

        schedule_arrival()
        while heap:
            now, kind, _, payload = heapq.heappop(heap)
            clock_now[0] = now
            if kind == _ARRIVAL:
                first = payload
                last = first + 1
                while last < n and arrivals[last] == now:
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
                touched = set()
                for r, d in zip(range(first, last), decisions, strict=True):
                    wi = ids[d.worker]
                    run.worker[r] = wi
                    run.estimated[r] = d.matched
                    workers[wi].waiting.append(r)
                    touched.add(wi)
                for wi in sorted(touched):
                    if not workers[wi].busy:
                        start(wi, now)
                schedule_arrival()
            elif kind == _STEP_DONE:
                wi = payload
                w = workers[wi]
                what, rs = current[wi]
                t0 = clock()
                if what == "prefill":
                    finished = w.finish_prefill(rs, tokens, remaining)
                    for r in rs:
                        run.first_token[r] = now
                else:
                    finished = w.advance(remaining, prompt_lens, outputs)
                records = w.new_records() if exact else []
                wall["workers"] += clock() - t0
                t0 = clock()
                if what == "prefill":
                    for r in rs:
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
            else:  # _DELIVER
                apply([deliveries.pop(payload)], now)
            # The router is idle unless another arrival is due at this very instant.
            if queued and not (heap and heap[0][1] == _ARRIVAL and heap[0][0] == now):
                apply(queued, now)
                queued.clear()
        for w in workers:
            run.prefill_busy.append(w.prefill_busy)
            run.decode_busy.append(w.decode_busy)
            run.steps.append(w.steps)
            run.insert_refused.append(w.insert_refused)
        run.timing = wall
        if exact:
            run.replay_stats = dataclasses.asdict(router.replayer.stats)
        router.close()
        return run


def _policy(cfg: SimConfig, clock: Callable[[], float]) -> Any:
    """The policy object; a built-in gets the run's seed and the simulated clock."""
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
    return policies.create(cfg.policy, **params)
