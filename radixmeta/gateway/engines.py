"""The engines behind the gateway: their router workers, health, breakers and loads.

:class:`Fleet` owns the :class:`~radixmeta.Router` and one :class:`Engine` per URL. It
adds and removes engines at run time (a router worker per data-parallel rank, and a KV-event
subscription for an engine that has an events endpoint), checks each engine's ``/health``
and scrapes its ``/metrics`` for load, and keeps a circuit breaker per engine whose state
is what the router's up and down marks follow.

Everything here runs on the gateway's event loop, except the router's own background
thread, which receives and replays the KV events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from radixmeta import policies
from radixmeta._workers import WorkerId
from radixmeta.cache import RadixCache
from radixmeta.errors import InvalidInputError, StaleWorkerError
from radixmeta.events import EventLog
from radixmeta.events.subscription import FleetSubscription, WorkerEndpoint
from radixmeta.gateway.breaker import CircuitBreaker
from radixmeta.gateway.config import DEFAULT_CAPACITY, GatewayConfig, WorkerSpec
from radixmeta.gateway.loads import parse_loads
from radixmeta.gateway.metrics import GatewayMetrics
from radixmeta.gateway.policy import Avoiding
from radixmeta.gateway.upstream import Upstream, UpstreamError
from radixmeta.router import Router

__all__ = ["DuplicateEngineError", "Engine", "Fleet"]

logger = logging.getLogger("radixmeta.gateway")


class _Models(msgspec.Struct):
    """What the gateway reads of an engine's ``/v1/models``."""

    data: list[Any] = []


_MODELS = msgspec.json.Decoder(_Models)


class DuplicateEngineError(InvalidInputError):
    """An engine of that name or URL is behind the gateway already (a 409)."""


@dataclass
class Engine:
    """One engine (one URL) behind the gateway.

    Attributes
    ----------
    spec : WorkerSpec
    workers : list of WorkerId
        Its router workers, one per data-parallel rank.
    breaker : CircuitBreaker
    subscription : FleetSubscription or None
        Its KV-event stream, for an exact engine.
    shadows : list of RadixCache
        For a modelled engine (no events), per rank: the gateway's model of its cache.
    models : list of dict
        What its ``/v1/models`` listed (the first healthy check fetches it).
    healthy : bool
        Whether its last ``/health`` check passed.

    Notes
    -----
    Requests and health checks feed the breaker differently: a request's outcome
    counts either way, a failed check counts as a failure, and a passing check only
    says the engine is healthy (an engine whose ``/health`` answers while its requests
    fail stays open until a request succeeds, without flapping).
    """

    spec: WorkerSpec
    workers: list[WorkerId]
    breaker: CircuitBreaker
    subscription: FleetSubscription | None = None
    shadows: list[RadixCache] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    healthy: bool = False  # its last health check passed (none yet: False)
    marked_up: bool = False  # what the router was last told
    removed: bool = False

    @property
    def up(self) -> bool:
        """Whether it may take traffic: healthy, and its breaker not open."""
        return self.healthy and self.breaker.state != "open"

    def as_dict(self, router: Router) -> dict[str, Any]:
        """Its spec, state and per-rank loads, as ``GET /workers`` shows them."""
        ranks = []
        for w in self.workers:
            try:
                load = router.load(w)
            except StaleWorkerError:
                continue
            reported = load.reported
            ranks.append(
                {
                    "dp_rank": w.dp_rank,
                    "up": load.up,
                    "requests": load.requests,
                    "prefill_tokens": load.prefill_tokens,
                    "decode_tokens": load.decode_tokens,
                    "queue_length": None if reported is None else reported.queue_length,
                    "running": None if reported is None else reported.running,
                    "kv_usage": None if reported is None else reported.kv_usage,
                    "held_tokens": router.tree.held_tokens(w),
                }
            )
        return {
            **self.spec.as_dict(),
            "healthy": self.healthy,
            "breaker": self.breaker.state,
            "up": self.up,
            "consecutive_failures": self.breaker.failures,
            "models": [m.get("id") for m in self.models],
            "ranks": ranks,
        }


class Fleet:
    """The router and the engines it routes to.

    Parameters
    ----------
    config : GatewayConfig
    metrics : GatewayMetrics

    Attributes
    ----------
    router : Router
    upstream : Upstream
        The pooled HTTP client to every engine.
    engines : dict of str to Engine
        By name.

    Notes
    -----
    One exact-mode Router serves both kinds of engine. An engine with an events endpoint
    is fed by its KV events (the router's subscription). One without is *modelled*: the
    gateway keeps a shadow :class:`~radixmeta.RadixCache` per rank, bounded by the
    engine's capacity, inserts each prompt it sends there, and submits the shadow's
    :class:`~radixmeta.EventLog` records (its stores and its LRU evictions) to the router
    as that worker's events. So the Router needs no per-worker mode: a modelled engine is
    an event-fed one whose events the gateway writes.
    """

    def __init__(self, config: GatewayConfig, metrics: GatewayMetrics) -> None:
        self.config = config
        self.metrics = metrics
        self.upstream = Upstream(config.request_timeout, config.connect_timeout)
        self.policy = Avoiding(policies.create(config.policy))
        self.router = Router(config.page_size, policy=self.policy)
        self.engines: dict[str, Engine] = {}
        self._by_index: dict[int, Engine] = {}  # router worker index -> its engine
        self._tasks: list[asyncio.Task[None]] = []
        self.lora_models: frozenset[str] = frozenset()

    # -- membership -----------------------------------------------------------------------
    def add(self, spec: WorkerSpec) -> Engine:
        """Put an engine behind the router (down until its first health check passes).

        Raises
        ------
        DuplicateEngineError
            Its name or URL is taken.
        InvalidInputError
            Its event endpoints do not parse.
        """
        for e in self.engines.values():
            if spec.name == e.spec.name or spec.url == e.spec.url:
                msg = f"engine {spec.name} ({spec.url}) is behind the gateway already"
                raise DuplicateEngineError(msg)
        config = self.config
        workers = []
        shadows: list[RadixCache] = []
        capacity = spec.capacity
        if not spec.exact and capacity is None:
            capacity = DEFAULT_CAPACITY  # a modelled engine's cache needs a bound
        try:
            for rank in range(spec.dp_size):
                workers.append(self.router.add_worker(spec.name, rank, capacity=capacity))
            subscription = None
            if spec.exact:
                assert spec.events is not None
                endpoint = WorkerEndpoint(spec.name, spec.events, spec.replay, spec.dp_size)
                subscription = self.router.subscribe([endpoint], codec=spec.codec)
            else:
                for rank in range(spec.dp_size):
                    log = EventLog(worker=spec.name, dp_rank=rank)
                    shadows.append(RadixCache(config.page_size, capacity=capacity, event_log=log))
        except BaseException:
            for w in workers:
                self.router.remove_worker(w)
            raise
        breaker = CircuitBreaker(
            config.failures_to_open, config.open_seconds, config.max_open_seconds
        )
        engine = Engine(spec, workers, breaker, subscription, shadows)
        for w in workers:  # down until its first health check passes
            self.router.mark_down(w)
            self._by_index[w.index] = engine
        self.engines[spec.name] = engine
        self.metrics.engine_up.labels(spec.name).set(0)
        return engine

    def remove(self, name: str) -> Engine:
        """Take an engine out: its router workers, requests in flight and event stream.

        Raises
        ------
        KeyError
            No engine of that name (or URL).
        """
        engine = self.find(name)
        engine.removed = True
        del self.engines[engine.spec.name]
        if engine.subscription is not None:  # its own (one subscribe per engine)
            self.router.unsubscribe(engine.workers[0])
        for w in engine.workers:
            self._by_index.pop(w.index, None)
            self.router.remove_worker(w)
        self.metrics.forget(engine.spec.name)
        return engine

    def find(self, name: str) -> Engine:
        """The engine named ``name``, or served at URL ``name``."""
        engine = self.engines.get(name)
        if engine is None:
            for e in self.engines.values():
                if e.spec.url == name.rstrip("/"):
                    return e
            msg = f"no engine {name!r} behind the gateway"
            raise KeyError(msg)
        return engine

    def engine_of(self, worker: WorkerId) -> Engine | None:
        """The engine of a router worker (None once removed)."""
        return self._by_index.get(worker.index)

    def model(self, engine: Engine, worker: WorkerId, tokens: Any, namespace: Any) -> None:
        """A prompt sent to a modelled engine: into its shadow cache, whose records
        (the store, and what its capacity evicted) go to the router as its events."""
        shadow = engine.shadows[worker.dp_rank]
        log = shadow.event_log
        assert log is not None
        last = log.next_seq - 1
        shadow.insert(tokens, namespace=namespace)
        records = log.read(after=last)
        if records:
            self.router.submit(records)

    @property
    def up_count(self) -> int:
        return sum(1 for e in self.engines.values() if e.up)

    # -- health ---------------------------------------------------------------------------
    def _sync(self, engine: Engine) -> None:
        """Tell the router when the engine's up state changed."""
        up = engine.up
        if up == engine.marked_up or engine.removed:
            return
        engine.marked_up = up
        for w in engine.workers:
            if up:
                self.router.mark_up(w)
            else:
                self.router.mark_down(w)
        self.metrics.engine_up.labels(engine.spec.name).set(1 if up else 0)
        if up:
            logger.info("engine %s is up", engine.spec.name)
        else:
            logger.warning(
                "engine %s is down (healthy=%s, breaker %s)",
                engine.spec.name, engine.healthy, engine.breaker.state,
            )

    def succeeded(self, engine: Engine) -> None:
        """A request reached the engine and was answered: close its breaker."""
        if engine.breaker.state != "closed" or engine.breaker.failures:
            engine.breaker.success()
            self._sync(engine)

    def failed(self, engine: Engine, kind: str) -> None:
        """A request or check failed on the engine: count it; K in a row open the breaker."""
        self.metrics.upstream_errors.labels(engine.spec.name, kind).inc()
        engine.breaker.failure()
        self._sync(engine)

    async def check(self, engine: Engine) -> bool:
        """One health check: ``GET /health`` (and ``/v1/models`` until known)."""
        timeout = self.config.connect_timeout * 2
        url = engine.spec.url
        try:
            status, _ = await self.upstream.get(url + "/health", timeout)
            healthy = status == 200
            if healthy and not engine.models:
                status, body = await self.upstream.get(url + "/v1/models", timeout)
                if status == 200:
                    data = _MODELS.decode(body).data
                    engine.models = [m for m in data if isinstance(m, dict)]
                    self._learn_lora()
        except (UpstreamError, msgspec.DecodeError):
            healthy = False
        engine.healthy = healthy
        if healthy:
            self._sync(engine)
        else:
            self.failed(engine, "health")
        return healthy

    def _learn_lora(self) -> None:
        """LoRA adapters the engines serve: vLLM lists each with its base as ``parent``."""
        self.lora_models = frozenset(
            str(m["id"])
            for e in self.engines.values()
            for m in e.models
            if m.get("parent") and m.get("id") != m.get("parent")
        )

    async def check_all(self, engines: Iterable[Engine] | None = None) -> None:
        """Health-check the engines; an open breaker whose wait is over goes half-open
        (the engine takes traffic again, and its next request decides)."""
        chosen = list(self.engines.values()) if engines is None else list(engines)
        for e in chosen:
            e.breaker.try_half_open()
        if chosen:
            await asyncio.gather(*(self.check(e) for e in chosen))

    async def scrape(self, engine: Engine) -> None:
        """Read the engine's ``/metrics`` and report each rank's load to the router."""
        try:
            status, body = await self.upstream.get(
                engine.spec.url + "/metrics", self.config.connect_timeout
            )
            if status != 200:
                self.metrics.load_scrape_errors.labels(engine.spec.name).inc()
                return
            loads = parse_loads(body.decode("utf-8", "replace"))
        except (UpstreamError, ValueError):
            self.metrics.load_scrape_errors.labels(engine.spec.name).inc()
            return
        if engine.removed:
            return
        for w in engine.workers:
            load = loads.get(w.dp_rank)
            if load is not None:
                try:
                    self.router.report_load(
                        w,
                        queue_length=load.queue_length,
                        kv_usage=load.kv_usage,
                        running=load.running,
                    )
                except StaleWorkerError:  # removed meanwhile
                    return

    # -- background -----------------------------------------------------------------------
    def start(self) -> None:
        """Start the router's event thread and the health, load and expiry loops."""
        self.router.start(interval=0.002)
        config = self.config
        loops = [(min(60.0, config.expire_after), self._expire)]
        if config.health_interval > 0:
            loops.append((config.health_interval, self.check_all))
        if config.load_interval > 0:
            loops.append((config.load_interval, self._scrape_all))
        for interval, job in loops:
            self._tasks.append(asyncio.create_task(self._every(interval, job)))

    async def _scrape_all(self) -> None:
        engines = [e for e in self.engines.values() if e.up]
        if engines:
            await asyncio.gather(*(self.scrape(e) for e in engines))

    async def _expire(self) -> None:
        self.router.expire(self.config.expire_after)

    @staticmethod
    async def _every(interval: float, job: Any) -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await job()
            except Exception:  # a loop of the gateway never dies of one bad turn
                logger.exception("gateway background job failed")

    async def close(self) -> None:
        """Stop the loops, the router's thread and subscriptions, the client (bounded)."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        await asyncio.to_thread(self.router.close, 5.0)
        await self.upstream.close()
