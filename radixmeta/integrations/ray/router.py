"""RadixMetaRequestRouter: Ray Serve's pluggable request router, backed by a radixmeta Router.

Ray Serve (>= 2.47) builds one request router per deployment handle and per HTTP
proxy, in whatever process holds the handle. Each instance here keeps its own
:class:`~radixmeta.Router` whose workers are the deployment's replicas (named by
``ReplicaID.to_full_id_str()``):

- ``update_replicas`` adds the replicas autoscaling or a redeploy brings, removes the
  ones that went away (their pages, their requests in flight and their event feed),
  gives a replica whose routing stats report another ``kv_capacity`` that capacity in
  place (``Router.set_capacity``: the bound of its model, trimmed at once when smaller;
  a replica listed before its first stats had the default),
  and, in exact mode, subscribes to the KV events a replica advertises in its routing
  stats; ``on_replica_actor_died`` marks a replica down at once.
- ``choose_replicas`` reads the request's prompt (:mod:`.prompts`, the gateway's token
  rule), dispatches it with the configured policy and returns the chosen replica
  first, then every other one as a fallback rank, in the order of the policy's own
  scores (``Router.dispatch(..., ranked=True)``: the policy's ``rank``; for a policy
  without one, by the tokens of the prompt it holds and then by the requests it has
  in flight). Ray sends the request to the first rank
  whose replica has room (``max_ongoing_requests``), so a fallback is taken only
  when the chosen replica is full.
- ``on_request_routed`` notes where the request really went; ``on_request_completed``
  calls ``Router.finish``. The queue lengths Ray Serve tracks per replica feed
  ``Router.report_load``.

Approximate mode (the default) models each replica's cache from this instance's own
decisions, bounded by the replica's capacity. Exact mode follows the replicas' own
caches through their KV-event streams: every instance subscribes to every replica,
so instances on different nodes converge on the same view.
"""

from __future__ import annotations

import contextlib
import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from radixmeta._workers import WorkerId
from radixmeta.errors import (
    HookError,
    InputTypeError,
    InvalidInputError,
    NoWorkerError,
    RadixMetaError,
    UnknownRequestError,
)
from radixmeta.events.subscription import WorkerEndpoint
from radixmeta.gateway.tokenize import Tokenizer, load_tokenizer
from radixmeta.integrations.ray import _live
from radixmeta.integrations.ray.feed import FeedThread
from radixmeta.integrations.ray.loads import ServeView
from radixmeta.integrations.ray.prompts import body_of, prompt_of_request
from radixmeta.policies import create
from radixmeta.router import Router

if TYPE_CHECKING:
    from ray.serve._private.replica_result import ReplicaResult

__all__ = ["CAPACITY_STAT", "EVENTS_STAT", "QUEUE_STAT", "RadixMetaRequestRouter"]

logger = logging.getLogger(__name__)

#: Routing-stats key of a replica's KV-event streams (exact mode): a mapping with
#: ``endpoint`` (the live PUB), optional ``replay``, ``codec`` (``"native"`` for a
#: radixmeta ``LogPublisher``, ``"vllm"`` for vLLM's ``--kv-events-config``) and
#: optional ``dp_size``.
EVENTS_STAT = "kv_events"
#: Routing-stats key of the tokens a replica's KV cache holds (approximate mode bounds
#: its model of the replica by it; else the router's ``capacity`` argument).
CAPACITY_STAT = "kv_capacity"
#: Routing-stats key of a replica's own queue length, used when Ray's queue-length
#: cache has no fresh entry for it.
QUEUE_STAT = "queue_length"

_MODES = ("approximate", "exact")
_CODECS = ("native", "vllm", "sglang")
_EXPIRE_EVERY = 256  # dispatches between two sweeps for requests that never completed


class RadixMetaRequestRouter(RequestRouter):
    """A Ray Serve request router that routes by radixmeta's trees and policies.

    Name it in a deployment's ``request_router_config``::

        RequestRouterConfig(
            request_router_class="radixmeta.integrations.ray.router:RadixMetaRequestRouter",
            request_router_kwargs={"page_size": 16, "capacity": 200_000},
        )

    Ray Serve passes ``request_router_kwargs`` to :meth:`initialize_state`.

    Attributes
    ----------
    router : Router
        This instance's router (one per handle or proxy).
    counts : collections.Counter
        ``routed`` (requests dispatched), ``fallbacks`` (sent to another replica than
        the one chosen), ``unroutable`` (no prompt, or a malformed one: routed by load),
        ``completed``, ``subscribed`` (event feeds opened), ``bad_stats`` (routing stats
        that could not be read: skipped), ``resized`` (replicas whose stats gave another
        ``kv_capacity``, applied in place with ``Router.set_capacity``).
    """

    router: Router
    counts: Counter[str]

    def initialize_state(  # type: ignore[override]  # Ray's is **kwargs
        self,
        *,
        policy: str = "default",
        policy_params: Mapping[str, Any] | None = None,
        mode: str = "approximate",
        page_size: int = 16,
        capacity: int = 200_000,
        tokenizer: str | None = None,
        lora_models: Sequence[str] = (),
        expire_after: float = 600.0,
        replay_interval: float = 0.01,
    ) -> None:
        """Build this instance's router (Ray Serve calls this with ``request_router_kwargs``).

        Parameters
        ----------
        policy : str, default "default"
            A built-in policy (``radixmeta.policies.names()``).
        policy_params : mapping, optional
            Its parameters, as ``radixmeta.policies.create(policy, **policy_params)``.
        mode : {"approximate", "exact"}, default "approximate"
            Approximate: model each replica's cache from this instance's decisions.
            Exact: follow the KV events each replica advertises under
            :data:`EVENTS_STAT` in its routing stats.
        page_size : int, default 16
            The engines' KV block size.
        capacity : int, default 200000
            Tokens a replica caches, when its routing stats do not say
            (:data:`CAPACITY_STAT`); bounds the approximate model.
        tokenizer : str, optional
            The engines' tokenizer (as ``radixmeta serve --tokenizer``); bytes without.
        lora_models : sequence of str
            Model names that are LoRA adapters (their pages are namespaced).
        expire_after : float, default 600
            Seconds after which a request whose completion never came is released.
        replay_interval : float, default 0.01
            Exact mode: seconds between two turns of the router's replay thread.

        Raises
        ------
        InvalidInputError, InputTypeError
            A bad argument (the deployment fails to start with the message).
        """
        if mode not in _MODES:
            msg = f"mode must be 'approximate' or 'exact', got {mode!r}"
            raise InvalidInputError(msg)
        if isinstance(expire_after, bool) or not isinstance(expire_after, (int, float)):
            msg = f"expire_after must be a number of seconds, got {type(expire_after).__name__}"
            raise InputTypeError(msg)
        if not expire_after > 0:
            msg = f"expire_after must be > 0, got {expire_after}"
            raise InvalidInputError(msg)
        chosen = create(policy, **dict(policy_params or {}))
        self.router = Router(page_size, policy=ServeView(chosen), mode=mode)
        self.mode = mode
        self.capacity = capacity
        self.tokenizer: Tokenizer = load_tokenizer(tokenizer)
        self.lora_models = frozenset(lora_models)
        self.expire_after = float(expire_after)
        self.counts = Counter()
        self._workers: dict[ReplicaID, WorkerId] = {}
        self._capacities: dict[ReplicaID, int] = {}  # the capacity each was registered with
        self._replica_of: dict[WorkerId, ReplicaID] = {}
        self._feeds: dict[ReplicaID, tuple[str, str | None, str]] = {}
        self._reported: dict[ReplicaID, int] = {}
        self._open: dict[str, Any] = {}  # Ray's internal request id -> its Decision
        self._sent_to: dict[str, ReplicaID] = {}  # ... -> the replica that accepted it
        # Exact mode: one thread owns every event socket after its subscription is made.
        self._feed_thread: FeedThread | None = None
        if mode == "exact":
            self._feed_thread = FeedThread(self.router, replay_interval)
        _live.add(self)

    @classmethod
    def instances(cls) -> list[RadixMetaRequestRouter]:
        """The live router instances of this process (for tests, metrics and debugging).

        Ray Serve ships a router class to the processes that route by value, so an
        instance there is of a copy of this class: they are told apart by registration,
        not by ``isinstance``.
        """
        return list(_live.instances())

    def worker_of(self, replica_id: ReplicaID) -> WorkerId | None:
        """The router's worker for a replica, or None if it is not one of this router's."""
        return self._workers.get(replica_id)

    # -- replicas -------------------------------------------------------------------------
    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        """Keep the router's workers in step with the deployment's replicas."""
        super().update_replicas(replicas)
        current = {r.replica_id: r for r in replicas}
        for replica_id in [rid for rid in self._workers if rid not in current]:
            self._forget(replica_id)
        for replica_id, replica in current.items():
            stats = _stats_of(replica)
            worker = self._workers.get(replica_id)
            # Stats without the key (none recorded yet, or lost) keep the capacity too.
            capacity = self._capacity_in(stats) if CAPACITY_STAT in stats else None
            if (
                worker is not None
                and capacity is not None
                and capacity != self._capacities[replica_id]
            ):
                # The replica reports another KV capacity (its first stats arrived after
                # it was listed with the default, or its engine was resized): bound its
                # model by it, or the model keeps pages the replica evicted long ago
                # (requests herd onto it). In place: the pages that still fit, its
                # requests in flight and its event feed stay. A malformed value keeps
                # the capacity it has.
                self.router.set_capacity(worker, capacity)
                self._capacities[replica_id] = capacity
                self.counts["resized"] += 1
            if worker is None:
                worker = self._add(replica_id, stats)
            elif not self.router.load(worker).up:
                self.router.mark_up(worker)  # listed again after an unavailable spell
            if self.mode == "exact" and replica_id not in self._feeds:
                self._subscribe(replica_id, worker, stats)

    def _capacity_in(self, stats: Mapping[str, Any]) -> int | None:
        """The KV capacity a replica's stats give: the router's ``capacity`` when they
        give none, None when the value is malformed."""
        capacity = stats.get(CAPACITY_STAT, self.capacity)
        if isinstance(capacity, bool) or not isinstance(capacity, int):
            return None
        if not 0 <= capacity < 2**63:  # the tree's bound
            return None
        return capacity

    def _add(self, replica_id: ReplicaID, stats: Mapping[str, Any]) -> WorkerId:
        capacity = self._capacity_in(stats)
        if capacity is None:
            self.counts["bad_stats"] += 1
            capacity = self.capacity
        worker = self.router.add_worker(replica_id.to_full_id_str(), capacity=capacity)
        self._workers[replica_id] = worker
        self._replica_of[worker] = replica_id
        self._capacities[replica_id] = capacity
        return worker

    def _subscribe(
        self, replica_id: ReplicaID, worker: WorkerId, stats: Mapping[str, Any]
    ) -> None:
        """Follow a replica's KV events, once it advertises them (else route it by load)."""
        spec = stats.get(EVENTS_STAT)
        if spec is None:
            return
        try:
            if not isinstance(spec, Mapping):
                msg = f"{EVENTS_STAT} must be a mapping, got {type(spec).__name__}"
                raise InputTypeError(msg)
            codec = spec.get("codec", "native")
            if codec not in _CODECS:
                msg = f"{EVENTS_STAT} codec must be one of {', '.join(_CODECS)}, got {codec!r}"
                raise InvalidInputError(msg)
            endpoint = WorkerEndpoint(
                worker.name,
                spec["endpoint"],
                spec.get("replay"),
                int(spec.get("dp_size", 1)),
            )
            subscription = self.router.subscribe([endpoint], codec=codec)
        except (RadixMetaError, KeyError, TypeError, ValueError) as exc:
            self.counts["bad_stats"] += 1
            logger.warning("replica %s: unusable %s (%s)", worker.name, EVENTS_STAT, exc)
            return
        self._feeds[replica_id] = (endpoint.endpoint, endpoint.replay, codec)
        self.counts["subscribed"] += 1
        if self._feed_thread is not None:
            self._feed_thread.follow(worker, subscription)

    def _forget(self, replica_id: ReplicaID) -> None:
        """A replica left the deployment: drop its worker, its feed and its requests."""
        worker = self._workers.pop(replica_id)
        del self._replica_of[worker]
        del self._capacities[replica_id]
        self._reported.pop(replica_id, None)
        if self._feeds.pop(replica_id, None) is not None and self._feed_thread is not None:
            self._feed_thread.drop(worker)  # closed by the thread that uses its sockets
        for request in [k for k, d in self._open.items() if d.worker is worker]:
            del self._open[request]
            self._sent_to.pop(request, None)
        try:
            self.router.remove_worker(worker)
        except HookError as exc:  # removed all the same; a policy hook complained
            logger.warning("removing replica %s: %s", worker.name, exc)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        """A replica died: never choose it again (the next update removes it)."""
        super().on_replica_actor_died(replica_id)
        worker = self._workers.get(replica_id)
        if worker is not None:
            self.router.mark_down(worker)

    # -- routing --------------------------------------------------------------------------
    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        """The chosen replica first, then the others, each a rank of its own."""
        if not candidate_replicas:
            return []
        self._feed_loads(candidate_replicas)
        if pending_request is None:
            return self._by_load(candidate_replicas)
        request = pending_request.metadata.internal_request_id
        # Asked again for the same request: the earlier choice was never sent (its
        # replica was full, or it rejected the request), so it is released first.
        self._release(request)
        body = body_of(pending_request.args, pending_request.kwargs)
        if body is None:
            self.counts["unroutable"] += 1
            return self._by_load(candidate_replicas)
        try:
            tokens, namespace = prompt_of_request(body, self.tokenizer, self.lora_models)
            decision = self.router.dispatch(
                tokens, request_id=request, namespace=namespace, ranked=True
            )
        except (InputTypeError, InvalidInputError):
            self.counts["unroutable"] += 1
            return self._by_load(candidate_replicas)
        except NoWorkerError:  # every replica this router knows is down
            return self._by_load(candidate_replicas)
        self._open[request] = decision
        self.counts["routed"] += 1
        if self.counts["routed"] % _EXPIRE_EVERY == 0:
            self._expire()
        return self._ranks(decision.ranking or (decision.worker,), candidate_replicas)

    def _ranks(
        self, ranking: Sequence[WorkerId], candidate_replicas: list[RunningReplica]
    ) -> list[list[RunningReplica]]:
        """The candidates in the order of a dispatch's ranking, one replica per rank."""
        by_id = {r.replica_id: r for r in candidate_replicas}
        order = [self._replica_of.get(w) for w in ranking]
        ranks = [[by_id[rid]] for rid in order if rid in by_id]
        listed = {rank[0].replica_id for rank in ranks}
        # Candidates this router has no worker for yet (an update still on its way).
        ranks += [[r] for r in candidate_replicas if r.replica_id not in listed]
        return ranks

    def _by_load(self, candidates: list[RunningReplica]) -> list[list[RunningReplica]]:
        """Every candidate, fewest requests in flight (by this router and Ray) first."""

        def load(replica: RunningReplica) -> tuple[int, int]:
            worker = self._workers.get(replica.replica_id)
            mine = self.router.load(worker).requests if worker is not None else 0
            return (self._reported.get(replica.replica_id, 0), mine)

        return [[r] for r in sorted(candidates, key=load)]

    def _feed_loads(self, candidates: list[RunningReplica]) -> None:
        """Report the queue lengths Ray Serve tracks (else the replicas' own) to the router."""
        cache = self.replica_queue_len_cache
        for replica in candidates:
            replica_id = replica.replica_id
            worker = self._workers.get(replica_id)
            if worker is None:
                continue
            queue = cache.get(replica_id)
            if queue is None:
                queue = _stats_of(replica).get(QUEUE_STAT)
                if isinstance(queue, bool) or not isinstance(queue, int) or queue < 0:
                    continue
            if self._reported.get(replica_id) != queue:
                self._reported[replica_id] = queue
                self.router.report_load(worker, queue_length=queue)

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: ReplicaResult
    ) -> None:
        """Note the replica that accepted the request (a fallback is counted)."""
        request = pending_request.metadata.internal_request_id
        decision = self._open.get(request)
        if decision is None:
            return
        self._sent_to[request] = replica_id
        if self._replica_of.get(decision.worker) != replica_id:
            self.counts["fallbacks"] += 1

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        """The request ended on ``replica_id``: finish it in the router."""
        decision = self._open.get(internal_request_id)
        if decision is None:
            return
        sent = self._sent_to.get(internal_request_id)
        if sent is not None and sent != replica_id:
            return  # the end of an earlier attempt, rejected by another replica
        self.counts["completed"] += 1
        self._release(internal_request_id)

    def _release(self, request: str) -> None:
        decision = self._open.pop(request, None)
        self._sent_to.pop(request, None)
        if decision is None:
            return
        with contextlib.suppress(UnknownRequestError):  # expired, or dropped with its replica
            self.router.finish(decision.request_id)

    def _expire(self) -> None:
        """Release requests whose completion never came (cancelled before they were sent)."""
        try:
            gone = self.router.expire(self.expire_after)
        except HookError as exc:
            gone = list(exc.released)
        for request in gone:
            self._open.pop(request, None)
            self._sent_to.pop(request, None)


def _stats_of(replica: RunningReplica) -> Mapping[str, Any]:
    """A replica's routing stats, or an empty mapping (none recorded yet)."""
    stats = replica.routing_stats
    return stats if isinstance(stats, Mapping) else {}
