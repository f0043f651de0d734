"""Cache-aware dispatch across SGLang's DP ranks: a radixmeta Router in the DP controller.

Enabled by one switch, the environment variable :data:`ENABLE_ENV`
(``RADIXMETA_SGLANG_DP_DISPATCH=default``, or any policy name of
:func:`radixmeta.policies.names`). When it is unset, empty or ``0``,
:func:`register_hooks` registers nothing and SGLang is untouched.

When it is set, the plugin entry point registers one ``AFTER`` hook on
``DataParallelController.__init__`` through SGLang's ``HookRegistry``. Once the
controller has launched its schedulers, the hook builds a :class:`DPDispatcher`
and points the controller's ``dispatching`` attribute (the bound method its
``dispatching_with_trace`` calls for every request) at it. Nothing else of the
controller changes: health checks, control messages and batches take SGLang's
own paths, and a batch still calls ``dispatching`` once per request.

The dispatcher keeps a :class:`~radixmeta.Router` with one worker per DP rank,
subscribed to the ranks' KV-event publishers (``--kv-events-config`` with
``"publisher": "zmq"``; rank ``r`` publishes on the base port plus ``r``), and
reads SGLang's load snapshots (``controller.load_snapshot_reader``) for load.
Events are received and applied by the router's background thread, so the
controller's loop only pays for a match, a policy call and the bookkeeping.

Nothing here imports SGLang at module import.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from radixmeta.errors import PolicyError, UnsupportedConfigurationError
from radixmeta.policies import create, names
from radixmeta.policies.base import Request, View

__all__ = [
    "CONTROLLER_TARGET",
    "ENABLE_ENV",
    "DPDispatcher",
    "RankLoad",
    "enabled_policy",
    "event_endpoints",
    "install",
    "lora_names",
    "register_hooks",
]

logger = logging.getLogger("radixmeta.sglang.dispatch")

#: The switch: a policy name turns the dispatcher on; unset, empty or ``0`` leaves SGLang alone.
ENABLE_ENV = "RADIXMETA_SGLANG_DP_DISPATCH"
#: What the hook wraps (SGLang's dotted path, as ``HookRegistry`` resolves it).
CONTROLLER_TARGET = "sglang.srt.managers.data_parallel_controller.DataParallelController.__init__"
_OFF = frozenset({"", "0", "off", "false", "no"})
_WORKER = "sglang-dp"  # the router's worker name; its dp_rank is SGLang's
_registered = False
_register_lock = threading.Lock()


def enabled_policy(environ: Mapping[str, str] | None = None) -> str | None:
    """The policy name :data:`ENABLE_ENV` asks for, or None when the dispatcher is off.

    Raises
    ------
    PolicyError
        The variable names no built-in policy.
    """
    value = (os.environ if environ is None else environ).get(ENABLE_ENV, "").strip()
    if value.lower() in _OFF:
        return None
    if value.lower() in ("1", "on", "true", "yes"):
        return "default"
    if value not in names():
        msg = (
            f"{ENABLE_ENV}={value!r} names no policy; use one of {', '.join(names())} "
            "(or unset it to keep SGLang's own dispatch)"
        )
        raise PolicyError(msg)
    return value


def register_hooks() -> bool:
    """Register the controller hook with SGLang's ``HookRegistry`` if the switch is on.

    Called by the plugin entry point in every SGLang process; the hook only
    acts where a ``DataParallelController`` is built. Returns whether a hook
    was registered (by this call or an earlier one).
    """
    global _registered
    if enabled_policy() is None:
        return False
    with _register_lock:
        if _registered:
            return True
        hooks = importlib.import_module("sglang.srt.plugins.hook_registry")
        hooks.HookRegistry.register(CONTROLLER_TARGET, _after_init, hooks.HookType.AFTER)
        _registered = True
    return True


def _after_init(result: Any, controller: Any, *args: Any, **kw: Any) -> None:
    # The switch is read again here, not when the plugin loaded: a test or a
    # launcher may change it in between, and off must mean untouched.
    policy = enabled_policy()
    if policy is not None:
        install(controller, controller.server_args, policy=policy)


def event_endpoints(
    kv_events_config: str | Mapping[str, Any] | None, dp_size: int, host: str = "127.0.0.1"
) -> tuple[list[str], list[str | None], bytes]:
    """Where a subscriber connects for each rank's events: live, replay, and the topic.

    SGLang's publishers bind the configured endpoint offset by the rank (base
    port plus rank); a wildcard host (``*``, ``0.0.0.0``) is replaced by
    ``host`` to connect to it.

    Raises
    ------
    UnsupportedConfigurationError
        No ZeroMQ publisher is configured, or its endpoint is not TCP.
    """
    from radixmeta.transport import dp_endpoints

    if not kv_events_config:
        msg = (
            f"{ENABLE_ENV} needs the ranks' KV events: add --kv-events-config "
            "'{\"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\"}'"
        )
        raise UnsupportedConfigurationError(msg)
    cfg = json.loads(kv_events_config) if isinstance(kv_events_config, str) else kv_events_config
    if cfg.get("publisher") != "zmq":
        msg = f"{ENABLE_ENV} needs --kv-events-config with \"publisher\": \"zmq\", got {cfg!r}"
        raise UnsupportedConfigurationError(msg)

    def connectable(endpoint: str) -> str:
        if not endpoint.startswith("tcp://"):
            msg = f"{ENABLE_ENV} subscribes over TCP; the KV-event endpoint is {endpoint!r}"
            raise UnsupportedConfigurationError(msg)
        address, _, port = endpoint[len("tcp://"):].rpartition(":")
        if address in ("*", "0.0.0.0", ""):
            address = host
        return f"tcp://{address}:{port}"

    live = dp_endpoints(connectable(str(cfg.get("endpoint", "tcp://*:5557"))), dp_size)
    replay_base = cfg.get("replay_endpoint")
    replays: list[str | None] = (
        list(dp_endpoints(connectable(str(replay_base)), dp_size))
        if replay_base
        else [None] * dp_size
    )
    return live, replays, str(cfg.get("topic", "")).encode()


@dataclass
class RankLoad:
    """One rank's load as the policy sees it: the last snapshot plus what was sent since.

    SGLang's snapshots come from the scheduler (``time.time()`` stamps), so the
    requests dispatched after a snapshot was taken are added on top, as
    SGLang's own ``DPBudget`` adds its ``+1`` per dispatch.
    """

    timestamp: float = 0.0
    requests: int = 0
    prefill_tokens: int = 0
    decode_tokens: int = 0
    # (wall time of dispatch, uncached prompt tokens) of requests sent after the snapshot
    since: deque[tuple[float, int]] = field(default_factory=deque)
    since_tokens: int = 0  # the sum of ``since``'s tokens, kept so a view costs O(1) per rank

    def add(self, when: float, tokens: int) -> None:
        self.since.append((when, tokens))
        self.since_tokens += tokens

    def drop_until(self, when: float) -> None:
        while self.since and self.since[0][0] <= when:
            self.since_tokens -= self.since.popleft()[1]

    def update(self, snapshot: Any) -> None:
        self.timestamp = float(snapshot.timestamp)
        self.requests = int(snapshot.num_running_reqs) + int(snapshot.num_waiting_reqs)
        self.prefill_tokens = int(getattr(snapshot, "num_waiting_uncached_tokens", 0))
        self.decode_tokens = int(getattr(snapshot, "num_used_tokens", 0))
        self.drop_until(self.timestamp)

    def totals(self) -> tuple[int, int, int]:
        return (
            self.requests + len(self.since),
            self.prefill_tokens + self.since_tokens,
            self.decode_tokens,
        )


class _SnapshotLoads:
    """Wraps a policy so that its view's loads are SGLang's snapshots, not the router's.

    The router never hears when a request finishes (outputs bypass the
    controller), so its own counters only grow; the ranks' snapshots say what
    each one is doing.
    """

    def __init__(self, inner: Any, dispatcher: DPDispatcher) -> None:
        self.inner = inner
        self.dispatcher = dispatcher
        self.on_dispatch = getattr(inner, "on_dispatch", None)
        self.on_finish = getattr(inner, "on_finish", None)
        if self.on_dispatch is None:
            del self.on_dispatch
        if self.on_finish is None:
            del self.on_finish

    def choose(self, request: Request, view: View) -> Any:
        loads = self.dispatcher.loads
        requests, prefill, decode = [], [], []
        for worker in view.workers:
            load = loads[worker.dp_rank]
            requests.append(load.requests + len(load.since))
            prefill.append(load.prefill_tokens + load.since_tokens)
            decode.append(load.decode_tokens)
        # A new view (views are read-only), built positionally: dataclasses.replace
        # costs ten times as much, on every request.
        mine = View(
            view.workers, view.lengths, view.host_lengths, requests, prefill, decode,
            view.capacities, view.reported, view.page_size, view.prefix_key,
        )
        return self.inner.choose(request, mine)


class DPDispatcher:
    """Dispatch an SGLang DP controller's requests with a radixmeta Router.

    Parameters
    ----------
    controller : DataParallelController
        SGLang's controller (or any object with ``workers``, ``_active_workers``,
        ``maybe_external_dp_rank_routing`` and ``load_snapshot_reader``).
    dp_size : int
        The number of DP ranks (one router worker each).
    page_size : int
        SGLang's ``--page-size``: the router's page size.
    policy : str
        A policy name of :func:`radixmeta.policies.names`.
    live, replays : sequence of str
        Each rank's event endpoint to connect to, and its replay endpoint or None.
    topic : bytes
        The publishers' topic.
    stale_after : float, default 2.0
        Seconds after a dispatch to a rank within which its events must move;
        a rank whose events stopped is stale.
    hold_seconds : float, default 5.0
        How long a request's optimistic marks last (the controller never hears
        of its end; by then the rank's events have reported its pages).
    refresh_interval : float, default 0.02
        Least seconds between two reads of the load snapshots (SGLang's 20 ms).
    send : callable, optional
        ``send(socket, req)``; SGLang's ``sock_send`` by default.
    interval : float, default 0.002
        Seconds between two turns of the router's event thread.
    lora_names : mapping, optional
        ``lora_id -> adapter name`` of the adapters the ranks' events name
        (:func:`lora_names` of the server arguments, which ``install`` passes).
    """

    def __init__(
        self,
        controller: Any,
        *,
        dp_size: int,
        page_size: int,
        policy: str,
        live: Sequence[str],
        replays: Sequence[str | None],
        topic: bytes = b"",
        stale_after: float = 2.0,
        hold_seconds: float = 5.0,
        refresh_interval: float = 0.02,
        send: Callable[[Any, Any], Any] | None = None,
        interval: float = 0.002,
        lora_names: Mapping[str, str] | None = None,
    ) -> None:
        from radixmeta.router import Router
        from radixmeta.subscription import WorkerEndpoint

        if send is None:
            # The controller module's own binding: what SGLang's dispatchers call.
            dpc = importlib.import_module("sglang.srt.managers.data_parallel_controller")
            send = dpc.sock_send
        self.controller = controller
        self.send = send
        self.dp_size = dp_size
        self.page_size = page_size
        self.stale_after = stale_after
        self.hold_seconds = hold_seconds
        self.refresh_interval = refresh_interval
        self.loads = [RankLoad() for _ in range(dp_size)]
        self.policy_name = policy
        self.lora_names: Mapping[str, str] = dict(lora_names or {})
        self.router = Router(page_size, policy=_SnapshotLoads(create(policy), self))
        # One endpoint of dp_size ranks: the subscription offsets the ports by the
        # rank, SGLang's rule, and registers worker (_WORKER, rank) for each.
        self.subscription = self.router.subscribe(
            [WorkerEndpoint(_WORKER, live[0], replays[0], dp_size)], codec="sglang", topic=topic
        )
        self.workers = [self.router.worker(_WORKER, r) for r in range(dp_size)]
        self._seen: list[int | None] = [None] * dp_size
        self._pending: list[float | None] = [None] * dp_size  # oldest unconfirmed dispatch
        self.stale: list[bool] = [False] * dp_size
        self._up: tuple[int, ...] = tuple(range(dp_size))
        self._last_refresh = 0.0
        self._last_expire = time.monotonic()
        self.counts = {"routed": 0, "passthrough": 0, "stale_fallback": 0}
        self.overhead_ns = 0
        # Events are received and applied off the controller's loop.
        self.router.start(interval)

    # -- the controller's hot path -----------------------------------------------------------
    def __call__(self, req: Any) -> None:
        """Dispatch one ``TokenizedGenerateReqInput`` (or embedding request)."""
        t0 = time.perf_counter_ns()
        if self.controller.maybe_external_dp_rank_routing(req):
            self.counts["passthrough"] += 1
            self.overhead_ns += time.perf_counter_ns() - t0
            return
        self.refresh()
        rank = self.choose(req)
        self.overhead_ns += time.perf_counter_ns() - t0
        self.send(self.controller.workers[rank], req)

    def choose(self, req: Any) -> int:
        """The rank for ``req`` (no routed rank); records it as dispatched there."""
        active = self.controller._active_workers
        if not active:
            msg = "No active DP workers are available for routing."
            raise RuntimeError(msg)
        # input_ids is an array('q') (or a list): one conversion, no Python loop.
        tokens = np.asarray(req.input_ids).astype(np.uint32, copy=False)
        stale = self.stale
        if True in stale:
            fresh = tuple(r for r in active if not stale[r])
            least = min(active, key=lambda r: (self.loads[r].totals()[:2], r))
        else:  # the common case: every rank fresh, no least-loaded scan
            fresh = tuple(active)
            least = -1
        if not fresh or (least >= 0 and stale[least]):
            # A rank whose events stopped has no trustworthy cache view: it is chosen
            # only as the least loaded of all, and only while it is.
            rank = int(least)
            uncached = len(tokens)
            self.counts["stale_fallback"] += 1
        else:
            if fresh != self._up:
                for r in range(self.dp_size):
                    if (r in fresh) != (r in self._up):
                        (self.router.mark_up if r in fresh else self.router.mark_down)(
                            self.workers[r]
                        )
                self._up = fresh
            decision = self.router.dispatch(tokens, namespace=_namespace(req, self.lora_names))
            rank = decision.worker.dp_rank
            uncached = len(tokens) - decision.matched
            self.counts["routed"] += 1
        self.loads[rank].add(time.time(), uncached)
        # Only a request that will store a page is owed an event; a fully cached
        # short one may publish nothing, which must not make its rank stale.
        if uncached >= self.page_size and self._pending[rank] is None:
            self._pending[rank] = time.monotonic()
        return rank

    def refresh(self, force: bool = False) -> None:
        """Read the load snapshots and the ranks' event progress (at most every 20 ms)."""
        now = time.monotonic()
        if not force and now - self._last_refresh < self.refresh_interval:
            return
        self._last_refresh = now
        reader = getattr(self.controller, "load_snapshot_reader", None)
        if reader is not None:
            for snapshot in reader.read_all():
                rank = int(snapshot.dp_rank)
                if 0 <= rank < self.dp_size and snapshot.timestamp != self.loads[rank].timestamp:
                    self.loads[rank].update(snapshot)
        for rank in range(self.dp_size):
            newest = self.router.replayer.worker_stats(_WORKER, rank).applied
            if newest != self._seen[rank]:
                self._seen[rank] = newest
                self._pending[rank] = None
                if self.stale[rank]:
                    logger.info("DP rank %d: events resumed", rank)
                self.stale[rank] = False
            pending = self._pending[rank]
            if not self.stale[rank] and pending is not None and now - pending > self.stale_after:
                logger.warning(
                    "DP rank %d: no KV events %.1f s after a dispatch; least-loaded fallback",
                    rank, now - pending,
                )
                self.stale[rank] = True
        if now - self._last_expire > self.hold_seconds / 4:
            self._last_expire = now
            self.router.expire(self.hold_seconds)
            # Without snapshots (a rank that stopped writing them) the increments
            # would only grow: they count for hold_seconds at most.
            for load in self.loads:
                load.drop_until(time.time() - self.hold_seconds)

    def metrics(self) -> dict[str, Any]:
        """Counts by path, the mean dispatch overhead, stale ranks and the router's metrics."""
        n = sum(self.counts.values())
        return {
            "policy": self.policy_name,
            **self.counts,
            "mean_overhead_us": self.overhead_ns / n / 1e3 if n else 0.0,
            "stale": [r for r in range(self.dp_size) if self.stale[r]],
            "router": self.router.metrics(),
        }

    def close(self, timeout: float = 5.0) -> None:
        """Stop the router's thread and close its subscriptions (bounded by ``timeout``)."""
        self.router.close(timeout)


def _namespace(req: Any, lora_names: Mapping[str, str]) -> str | None:
    """The namespace SGLang's events give the pages ``req`` will store.

    A scheduler's events name a page's adapter by ``lora_name``, which it
    finds from the ``lora_id`` at the end of the extra key in its table of the
    ``--lora-paths`` adapters; for any other adapter (one loaded later) it
    sends no name, so its pages share the base model's namespace in the
    events, and here too. The cache salt is sent as it is. The rest of the
    extra key is not sent, so it cannot count (radixmeta.ingest keys alike).
    """
    parts = []
    lora_id = getattr(req, "lora_id", None)
    name = lora_names.get(lora_id) if lora_id else None
    if name is not None:
        parts.append(f"lora:{name}")
    salt = getattr(req, "cache_salt", None)
    if salt is not None:  # as radixmeta.ingest.namespace_of names it
        parts.append(f"salt:{salt}")
    return "|".join(parts) if parts else None


def lora_names(server_args: Any) -> dict[str, str]:
    """``lora_id -> adapter name`` of the ``--lora-paths`` adapters, as the schedulers
    build their event table (``KvEventLoraNames``): SGLang's ids for those are
    ``LoRARef.deterministic_id(name, path)``, the same in every process."""
    paths = getattr(server_args, "lora_paths", None)
    if not paths:
        return {}
    refs: list[Any] = []
    if isinstance(paths, Mapping):
        pairs: list[tuple[str, str]] = [(str(k), str(v)) for k, v in paths.items()]
    else:
        pairs = []
        for item in paths:
            if hasattr(item, "lora_id") and hasattr(item, "lora_name"):
                refs.append(item)  # parsed already (a LoRARef)
            elif isinstance(item, Mapping):
                pairs.append((str(item["lora_name"]), str(item["lora_path"])))
            elif isinstance(item, str):
                name, _, path = item.partition("=")
                pairs.append((name, path) if path else (item, item))
    table = {str(ref.lora_id): str(ref.lora_name) for ref in refs if ref.lora_name}
    if pairs:
        registry = importlib.import_module("sglang.srt.lora.lora_registry")
        for name, path in pairs:
            table[registry.LoRARef.deterministic_id(name, path)] = name
    return table


def install(
    controller: Any, server_args: Any, *, policy: str = "default", **options: Any
) -> DPDispatcher:
    """Build a :class:`DPDispatcher` for ``controller`` and make it the controller's dispatch.

    Reads ``--kv-events-config``, ``--page-size`` and the DP size from
    ``server_args`` and the controller. The dispatcher is ``controller.radixmeta_dispatcher``.
    """
    mode = getattr(server_args, "disaggregation_mode", None)
    if mode not in (None, "null"):
        # PD pairs a prefill rank with its decode rank by bootstrap room: a cache
        # choice would break the pairing.
        msg = f"{ENABLE_ENV} does not support --disaggregation-mode {mode}; unset it"
        raise UnsupportedConfigurationError(msg)
    dp_size = int(getattr(controller, "launch_dp_size", None) or server_args.dp_size)
    live, replays, topic = event_endpoints(
        getattr(server_args, "kv_events_config", None), dp_size
    )
    dispatcher = DPDispatcher(
        controller,
        dp_size=dp_size,
        page_size=int(getattr(server_args, "page_size", None) or 1),
        policy=policy,
        live=live,
        replays=replays,
        topic=topic,
        lora_names=lora_names(server_args),
        **options,
    )
    controller.radixmeta_dispatcher = dispatcher
    controller.dispatching = dispatcher
    logger.info(
        "radixmeta DP dispatch active: policy %s over %d ranks, events from %s",
        policy, dp_size, ", ".join(live),
    )
    return dispatcher
