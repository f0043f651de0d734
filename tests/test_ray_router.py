"""RadixMetaRequestRouter inside a real local Ray Serve, with stand-in replicas.

One local Ray (2 CPUs, no dashboard) for the module, Serve's HTTP proxy on 127.0.0.1,
stand-in replicas that each hold a real RadixCache (and, in exact mode, publish its
KV events over ZeroMQ on 127.0.0.1). Requests go through a DeploymentHandle (whose
router lives in this process) and through Serve's HTTP proxy to an ingress deployment
(whose router lives in its replica), as Ray Serve LLM's OpenAI ingress calls its
LLM servers. Skipped when Ray Serve is not installed (``pip install 'radixmeta[ray]'``).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

serve = pytest.importorskip(
    "ray.serve", reason="Ray Serve is not installed: pip install 'radixmeta[ray]'"
)
import ray  # noqa: E402
from ray.serve.config import RequestRouterConfig  # noqa: E402

import radixmeta  # noqa: E402
from radixmeta.integrations.ray import (  # noqa: E402
    RadixMetaRequestRouter,
    StandinReplica,
)
from tests._ports import free_port_block  # noqa: E402

pytestmark = [pytest.mark.ray, pytest.mark.timeout(240)]
# pytest imports this file as a top-level module the replicas cannot import: the
# Ingress deployment below reaches them by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

PAGE = 16
ROOT = str(Path(radixmeta.__file__).resolve().parent.parent)


def prefix(group: int) -> str:
    """A shared system prompt of about 3,000 bytes (tokens), different per group: long
    enough that recomputing it costs more than the default policy's fixed costs."""
    return f"group {group}: " + "you are a careful assistant who answers briefly. " * 60


def router_config(**kwargs: Any) -> RequestRouterConfig:
    return RequestRouterConfig(
        request_router_class=RadixMetaRequestRouter,
        request_router_kwargs={"page_size": PAGE, **kwargs},
        request_routing_stats_period_s=0.5,
    )


def standin(name: str, replicas: int, **router_kwargs: Any) -> Any:
    return serve.deployment(
        StandinReplica,
        name=name,
        num_replicas=replicas,
        max_ongoing_requests=64,
        ray_actor_options={"num_cpus": 0},
        request_router_config=router_config(**router_kwargs),
    )


@serve.deployment(ray_actor_options={"num_cpus": 0})
class Ingress:
    """A front deployment: JSON over HTTP to the stand-ins' handle (its router is here)."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend

    async def __call__(self, request: Any) -> dict[str, Any]:
        return await self.backend.remote(await request.json())  # type: ignore[no-any-return]

    async def route(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self.backend.remote(body)  # type: ignore[no-any-return]

    async def held(self, text: str, timeout: float = 20.0) -> dict[str, int]:
        """Per replica, the tokens of ``text`` this replica's router sees it hold, once
        some replica holds all its whole pages (or the timeout passes)."""
        await self.backend.remote({"prompt": "warm up this router"})
        tokens = list(text.encode())
        want = len(tokens) // PAGE * PAGE
        deadline = time.monotonic() + timeout
        while True:
            view = lengths_seen(RadixMetaRequestRouter.instances(), tokens)
            if max(view.values(), default=0) >= want or time.monotonic() > deadline:
                return view
            await asyncio.sleep(0.05)


def lengths_seen(routers: list[RadixMetaRequestRouter], tokens: list[int]) -> dict[str, int]:
    """What the routers (one, in practice) see each worker hold of ``tokens``."""
    out: dict[str, int] = {}
    for r in routers:
        lengths = r.router.tree.match(tokens).length_list
        for w in r.router.workers:
            out[w.name] = max(out.get(w.name, 0), lengths[w.index])
    return out


def routers_of(app: str) -> list[RadixMetaRequestRouter]:
    return [r for r in RadixMetaRequestRouter.instances() if r.app_name == app]


def wait_for(condition: Any, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


#: Serve's proxy sets SO_REUSEPORT unless told not to: two suites on one host whose proxies
#: got the same port would then share it silently, each answering some of the other's
#: requests. Without it, a port taken between the probe and Serve's bind is refused.
NO_REUSEPORT = {"SERVE_SOCKET_REUSE_PORT_ENABLED": "0"}
START_ATTEMPTS = 5


def start_serve() -> int:
    """Start Serve's HTTP proxy on a free loopback port; returns the port.

    The port is probed free, then bound by the proxy a moment later: when another
    process took it in between, ``serve.start`` fails with "Failed to bind" (the proxy
    does not share ports: :data:`NO_REUSEPORT`) and another port is tried, a few times
    at most. The common case costs one start, as before.
    """
    for _ in range(START_ATTEMPTS):
        port = free_port_block(1)
        try:
            serve.start(http_options={"host": "127.0.0.1", "port": port})
        except Exception as exc:  # a RayTaskError wrapping the proxy's RuntimeError
            if "Failed to bind" not in str(exc):
                raise
            serve.shutdown()
            continue
        return port
    pytest.fail(f"Serve's proxy found no free port in {START_ATTEMPTS} attempts")


@pytest.fixture(scope="module")
def http_port() -> Iterator[int]:
    env = {"PYTHONPATH": ROOT, "OPENBLAS_NUM_THREADS": "1", **NO_REUSEPORT}
    if "RADIXMETA_IMPLEMENTATION" in os.environ:
        env["RADIXMETA_IMPLEMENTATION"] = os.environ["RADIXMETA_IMPLEMENTATION"]
    saved = {k: os.environ.get(k) for k in NO_REUSEPORT}
    os.environ.update(NO_REUSEPORT)  # the raylet and the workers it starts inherit it
    try:
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
            runtime_env={"env_vars": env},
        )
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        yield start_serve()
    finally:
        serve.shutdown()
        ray.shutdown()


def test_serve_refuses_a_taken_port_and_start_serve_moves_on(
    http_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The port race, forced: the probe hands out a port that another socket, sharing
    ports itself, holds; Serve's proxy must refuse it (else it would share it), and
    ``start_serve`` take the next, here the module's own port again."""
    import socket

    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    ports = iter([holder.getsockname()[1], http_port])
    monkeypatch.setattr(sys.modules[__name__], "free_port_block", lambda n: next(ports))
    try:
        serve.shutdown()  # the module's Serve: started again below, on its port
        assert start_serve() == http_port
    finally:
        holder.close()
    assert next(ports, None) is None  # both tried: the taken one was refused


def test_shared_prefixes_go_where_they_are_cached_and_cold_load_spreads(http_port: int) -> None:
    handle = serve.run(
        standin("approx", 3).bind(time_scale=0.0), name="approx", route_prefix=None
    )
    # Three groups, each a cold first request then followers with new suffixes.
    homes: dict[int, str] = {}
    for group in range(3):
        for k in range(4):
            answer = handle.remote({"prompt": prefix(group) + f"question {k}?"}).result()
            # A sequential client: its previous request has ended in the router too.
            (router,) = routers_of("approx")
            wait_for(lambda: router.router.in_flight == 0, what="the completion")  # noqa: B023
            if k == 0:
                homes[group] = answer["replica"]
            else:
                assert answer["replica"] == homes[group]
                assert answer["cached_tokens"] >= len(prefix(group)) // PAGE * PAGE
    (router,) = routers_of("approx")
    assert router.counts["routed"] == 12 and router.counts["completed"] == 12
    assert router.counts["unroutable"] == 0 and router.counts["fallbacks"] == 0
    # Cold, distinct prompts sent at once spread over the replicas by requests in flight.
    slow = serve.run(
        standin("approx_load", 3).bind(time_scale=20.0), name="approx_load", route_prefix=None
    )
    prompts = [f"{k} a distinct prompt with nothing shared " * 8 for k in range(12)]

    async def at_once() -> list[dict[str, Any]]:  # one event loop: one router instance
        return list(await asyncio.gather(*(slow.remote({"prompt": p}) for p in prompts)))

    answers = asyncio.run(at_once())
    assert len(routers_of("approx_load")) == 1
    spread = Counter(a["replica"] for a in answers)
    assert len(spread) == 3 and max(spread.values()) <= 6, spread


def test_a_replica_removed_by_a_redeploy_is_never_chosen(http_port: int) -> None:
    app = standin("shrink", 3).bind(time_scale=0.0)
    handle = serve.run(app, name="shrink", route_prefix=None)
    before = {handle.remote({"prompt": prefix(9) + str(k)}).result()["replica"] for k in range(3)}
    (router,) = routers_of("shrink")
    wait_for(lambda: len(router.router.workers) == 3, what="three workers")
    every = {w.name for w in router.router.workers}
    handle = serve.run(
        standin("shrink", 2).bind(time_scale=0.0), name="shrink", route_prefix=None
    )
    wait_for(lambda: len(router.router.workers) == 2, what="the removal to reach the router")
    kept = {w.name for w in router.router.workers}
    removed = every - kept  # one replica, or all three when the redeploy rolled them
    assert removed
    # Prompts that the removed replicas held, and new ones: never sent there.
    seen = {
        handle.remote({"prompt": prefix(g) + str(k)}).result()["replica"]
        for g in (9, 10)
        for k in range(8)
    }
    assert not removed & seen and seen <= kept
    assert before <= every


def test_through_serve_http_proxy_shared_prefix_sticks(http_port: int) -> None:
    backend = standin("behind", 3).bind(time_scale=0.0)
    serve.run(Ingress.bind(backend), name="http", route_prefix="/llm")

    def post(body: dict[str, Any]) -> dict[str, Any]:
        request = urllib.request.Request(
            f"http://127.0.0.1:{http_port}/llm",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            return json.loads(response.read())  # type: ignore[no-any-return]

    first = post({"messages": [{"role": "system", "content": prefix(3)},
                               {"role": "user", "content": "hello"}]})
    for k in range(4):
        answer = post({"messages": [{"role": "system", "content": prefix(3)},
                                    {"role": "user", "content": f"and then {k}"}]})
        assert answer["replica"] == first["replica"]
        assert answer["cached_tokens"] >= len(prefix(3)) // PAGE * PAGE


@pytest.mark.parametrize("codec", ["native", "vllm", "sglang"])
def test_exact_mode_converges_across_two_router_instances(http_port: int, codec: str) -> None:
    """Replicas publish radixmeta's own events, or vLLM's or SGLang's wire format (what
    ``--kv-events-config`` sends): the routers decode them with that codec."""
    app = f"exact_{codec}"
    backend = standin(f"{app}_backend", 2, mode="exact").bind(time_scale=0.0, events=codec)
    ingress = serve.run(Ingress.bind(backend), name=app, route_prefix=f"/{app}")
    # This process's router instance for the stand-ins, and the ingress replica's one.
    mine = serve.get_deployment_handle(f"{app}_backend", app_name=app)
    mine.remote({"prompt": "warm up"}).result()
    (here,) = routers_of(app)
    wait_for(lambda: here.counts["subscribed"] == 2, what="both event feeds")
    assert {spec[2] for spec in here._feeds.values()} == {codec}
    text = prefix(5) + f"converge, {codec}?"
    served = mine.remote({"prompt": text}).result()["replica"]
    # The ingress's router never routed this prompt: it learns it from the events only.
    there = ingress.held.remote(text).result()
    want = len(text) // PAGE * PAGE
    assert there[served] == want, there
    assert all(v == 0 for name, v in there.items() if name != served), there
    wait_for(lambda: lengths_seen([here], list(text.encode()))[served] == want, what="events")
    # The other instance now routes a follower to the replica that holds the prefix.
    follower = ingress.route.remote({"prompt": prefix(5) + "and a follower"}).result()
    assert follower["replica"] == served
    assert follower["cached_tokens"] >= len(prefix(5)) // PAGE * PAGE


# -- the parts, without a cluster --------------------------------------------------------
def test_import_radixmeta_never_imports_ray() -> None:
    import subprocess

    code = "import radixmeta, radixmeta.integrations, sys; assert 'ray' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


def test_prompts_of_bodies_and_request_objects() -> None:
    import doctest

    from radixmeta.gateway.tokenize import ByteTokenizer
    from radixmeta.integrations.ray import body_of, prompt_of_request, prompts

    failures, tried = doctest.testmod(prompts)
    assert failures == 0 and tried > 0

    class ChatRequest:  # the shape of Ray Serve LLM's request models: attributes
        def __init__(self) -> None:
            self.messages = [{"role": "user", "content": "hi"}]
            self.model = "m"
            self.temperature = 0.5

    body = body_of([ChatRequest()], {})
    assert body == {"messages": [{"role": "user", "content": "hi"}], "model": "m"}
    tokens, namespace = prompt_of_request(body, ByteTokenizer())
    assert bytes(tokens.astype("uint8")) == b"<|user|>\nhi\n<|assistant|>\n"
    assert namespace is None
    with pytest.raises(radixmeta.errors.InvalidInputError):
        prompt_of_request({"prompt": 3}, ByteTokenizer())


def test_serve_view_folds_ray_queue_lengths_and_rotates() -> None:
    from radixmeta import Router
    from radixmeta.integrations.ray.loads import ServeView
    from radixmeta.policies import create

    seen = []

    class Spy:
        def choose(self, request: Any, view: Any) -> Any:
            seen.append(view)
            return view.workers[0]

    router = Router(4, policy=ServeView(Spy(), seed=1), mode="approximate")
    _, b, _ = (router.add_worker(n, capacity=1000) for n in "abc")
    router.report_load(b, queue_length=5)
    decision = router.dispatch([1, 2, 3, 4, 5, 6, 7, 8])
    view = seen[-1]
    by_name = {w.name: i for i, w in enumerate(view.workers)}
    assert view.requests[by_name["b"]] == 5 and view.prefill_tokens[by_name["b"]] == 5 * 8
    assert view.requests[by_name["a"]] == 0
    assert decision.worker is view.workers[0]
    # Fresh instances start their rotation at different replicas.
    starts = set()
    for seed in range(12):
        r = Router(4, policy=ServeView(create("default"), seed=seed), mode="approximate")
        for n in "abc":
            r.add_worker(n, capacity=1000)
        starts.add(r.dispatch([9] * 8).worker.name)
    assert len(starts) > 1


def test_bad_router_settings_raise_before_anything_is_built() -> None:
    router = RadixMetaRequestRouter.__new__(RadixMetaRequestRouter)
    with pytest.raises(radixmeta.errors.InvalidInputError, match="mode must be"):
        router.initialize_state(mode="psychic")
    with pytest.raises(radixmeta.errors.InvalidInputError, match="expire_after"):
        router.initialize_state(expire_after=0)
    assert not hasattr(router, "router")


class FakeReplica:
    """What ``RadixMetaRequestRouter`` and Ray's base router read of a replica."""

    def __init__(self, deployment: Any, name: str, queue: int) -> None:
        from ray.serve.request_router import ReplicaID

        self.replica_id = ReplicaID(name, deployment)
        self.queue = queue
        self.routing_stats = {"queue_length": queue, "kv_capacity": 100_000}
        self.max_ongoing_requests = 8

    async def get_queue_len(self, *, deadline_s: float) -> int:
        return self.queue


def test_fallback_ranks_follow_the_policy_scores_without_a_cluster() -> None:
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve.request_router import PendingRequest

    async def ranks_of(policy: str, queues: list[int], prompt: str) -> list[str]:
        deployment = DeploymentID("standin", "unit")
        router = RadixMetaRequestRouter(deployment, DeploymentHandleSource.UNKNOWN)
        router.initialize_state(policy=policy, page_size=PAGE)
        replicas = [FakeReplica(deployment, f"r{i}", q) for i, q in enumerate(queues)]
        router.update_replicas(replicas)  # type: ignore[arg-type]
        await asyncio.sleep(0.05)  # Ray's base router probes the queue lengths
        pending = PendingRequest(
            args=[{"prompt": prompt}], kwargs={}, metadata=RequestMetadata("x", "rid")
        )
        ranks = await router.choose_replicas(replicas, pending)  # type: ignore[arg-type]
        decision = router._open["rid"]
        # The ranks are the decision's ranking: the chosen replica first.
        assert [router.worker_of(r[0].replica_id) for r in ranks] == list(decision.ranking)
        assert ranks[0][0].replica_id == router._replica_of[decision.worker]
        return [r[0].replica_id.unique_id for r in ranks]

    # least_loaded ranks by the queue lengths Ray reports; the old rule (tokens held,
    # then this router's own requests) gave index order for a cold prompt.
    assert asyncio.run(ranks_of("least_loaded", [3, 0, 2, 1], "cold")) == ["r1", "r3", "r2", "r0"]
    # The default policy, a cold prompt: by the queued prefill its score reads.
    assert asyncio.run(ranks_of("default", [0, 6, 1, 3], prefix(1))) == ["r0", "r2", "r3", "r1"]


def test_standin_publishes_engine_formats_and_rejects_unknown_ones() -> None:
    import zmq

    from radixmeta.wire import sglang, vllm

    with pytest.raises(radixmeta.errors.InvalidInputError, match="events must be"):
        StandinReplica(events="tensorrt", name="w")
    context = zmq.Context()
    try:
        for codec, decode in (("vllm", vllm.decode_batch), ("sglang", sglang.decode_batch)):
            replica = StandinReplica(events=codec, name="w", page_size=PAGE, time_scale=0.0)
            sub = context.socket(zmq.SUB)
            sub.setsockopt(zmq.LINGER, 0)
            sub.setsockopt(zmq.RCVTIMEO, 10_000)
            try:
                spec = replica.record_routing_stats()["kv_events"]
                assert spec["codec"] == codec
                sub.setsockopt(zmq.SUBSCRIBE, b"")
                sub.connect(spec["endpoint"])
                assert replica.engine_publisher is not None
                assert replica.engine_publisher.wait_subscribers(1, timeout=10.0)
                asyncio.run(replica({"prompt": "x" * (3 * PAGE + 5)}))
                _topic, _seq, payload = sub.recv_multipart()
                events = decode(payload).events
                stored = [e for e in events if type(e).__name__ == "BlockStored"]
                assert sum(len(e.block_hashes) for e in stored) == 3
            finally:
                sub.close(linger=0)
                replica.__del__()
    finally:
        context.term()


def test_a_replica_whose_stats_give_another_capacity_is_resized_in_place() -> None:
    asyncio.run(asyncio.wait_for(_resized_in_place(), 60))


async def _resized_in_place() -> None:
    """The first update often lists a replica before its first routing stats: it gets
    the router's default capacity, which must not stay its bound once it reports its own
    (the model would keep what the replica evicted, and requests would herd onto it).
    The new capacity applies in place: the worker, its requests in flight and the pages
    that still fit stay; the least recent pages over it go."""
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID

    deployment = DeploymentID("standin", "unit")
    router = RadixMetaRequestRouter(deployment, DeploymentHandleSource.UNKNOWN)
    router.initialize_state(page_size=PAGE, capacity=100_000)
    replicas = [FakeReplica(deployment, f"r{i}", 0) for i in range(2)]
    replicas[0].routing_stats = {}  # no stats recorded yet

    def capacities() -> list[int | None]:
        return [router.router.load(router._workers[r.replica_id]).capacity for r in replicas]

    router.update_replicas(replicas)  # type: ignore[arg-type]
    assert capacities() == [100_000, 100_000]
    first = router._workers[replicas[0].replica_id]
    tree = router.router.tree
    old, tokens = list(prefix(1).encode()), list(prefix(2).encode())
    second = router._workers[replicas[1].replica_id]
    router.router.mark_down(second)  # both requests go to the first replica
    router.router.dispatch(old, request_id="old")  # the least recent pages
    router.router.dispatch(tokens, request_id="held")
    router.router.mark_up(second)
    router.router.finish("old")
    before = router.router.load(first)
    assert tree.held_tokens(first) > 2048
    replicas[0].routing_stats = {"kv_capacity": 2048}
    router.update_replicas(replicas)  # type: ignore[arg-type]
    assert capacities() == [2048, 100_000]
    assert router.counts["resized"] == 1
    assert router._workers[replicas[0].replica_id] is first  # the same worker
    assert tree.capacity_of(first) == 2048 and tree.held_tokens(first) <= 2048
    after = router.router.load(first)
    assert (after.requests, after.prefill_tokens) == (before.requests, before.prefill_tokens)
    assert after.requests == 1 and router.router.in_flight == 1
    # The trim took the least recent prefix; of the newer one, its first pages stay.
    assert tree.match(old).length_of(first) == 0
    assert tree.match(tokens).length_of(first) > 0
    # The same stats, stats without the key, or a malformed value change nothing more.
    bad = [{"kv_capacity": 2048}, {}, {"kv_capacity": "lots"}, {"kv_capacity": -1}]
    for stats in [*bad, {"kv_capacity": 2**63}]:
        replicas[0].routing_stats = stats
        router.update_replicas(replicas)  # type: ignore[arg-type]
        assert capacities() == [2048, 100_000]
        assert router._workers[replicas[0].replica_id] is first
    assert router.counts["resized"] == 1
    assert router.counts["bad_stats"] == 0
    # A larger capacity keeps every page; routing goes on over the same worker.
    kept = tree.held_tokens(first)
    replicas[0].routing_stats = {"kv_capacity": 200_000}
    router.update_replicas(replicas)  # type: ignore[arg-type]
    assert tree.held_tokens(first) == kept and router.counts["resized"] == 2
    router.router.finish("held")
    decision = router.router.dispatch(tokens, request_id="after")
    assert decision.worker in router.router.workers
