"""Ray Serve LLM's vLLM server advertising what RadixMetaRequestRouter reads.

:func:`kv_event_stats` is tested wherever Ray Serve is installed: the routing stats a
vLLM replica's ``kv_events_config`` and cache size make, read back by the router
itself. :class:`RadixMetaLLMServer` needs Ray Serve LLM (``ray[serve,llm]`` with
vLLM); its tests skip without it. They start the real server class with an engine of
the test's own in place of vLLM (``LLMServer``'s ``engine_cls`` injection: no model
and no GPU), whose engine client carries a vLLM-shaped ``vllm_config``.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("ray.serve", reason="Ray Serve is not installed: pip install 'radixmeta[ray]'")

from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.integrations.ray import CAPACITY_STAT, EVENTS_STAT
from radixmeta.integrations.ray.llm import kv_event_stats, offset_events_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(120)]

CONFIG = {
    "enable_kv_cache_events": True,
    "publisher": "zmq",
    "endpoint": "tcp://*:5557",
    "replay_endpoint": "tcp://*:5657",
}


def _serve_llm_error() -> str | None:
    """Why ``ray.serve.llm`` cannot be imported here, or None when it can."""
    try:
        import ray.serve.llm  # noqa: F401
    except ImportError as exc:
        return f"ray.serve.llm cannot be imported ({exc}): pip install 'ray[serve,llm]'"
    return None


needs_serve_llm = pytest.mark.skipif(
    _serve_llm_error() is not None, reason=str(_serve_llm_error())
)


# -- kv_event_stats ------------------------------------------------------------------------


def test_a_wildcard_bind_is_advertised_at_the_node_with_the_capacity() -> None:
    stats = kv_event_stats(CONFIG, host="10.1.2.3", block_size=16, num_gpu_blocks=4096)
    assert stats == {
        EVENTS_STAT: {
            "endpoint": "tcp://10.1.2.3:5557",
            "replay": "tcp://10.1.2.3:5657",
            "codec": "vllm",
            "dp_size": 1,
        },
        CAPACITY_STAT: 16 * 4096,
    }


def test_a_data_parallel_rank_advertises_the_ports_vllm_moved_it_to() -> None:
    stats = kv_event_stats(CONFIG, host="h", dp_rank=3)
    assert stats[EVENTS_STAT]["endpoint"] == "tcp://h:5560"
    assert stats[EVENTS_STAT]["replay"] == "tcp://h:5660"
    assert CAPACITY_STAT not in stats  # no block counts given


def test_an_explicit_address_stays_and_no_replay_is_none() -> None:
    config = {"enable_kv_cache_events": True, "endpoint": "tcp://192.168.0.9:6000"}
    stats = kv_event_stats(config, host="10.0.0.1")
    assert stats[EVENTS_STAT]["endpoint"] == "tcp://192.168.0.9:6000"
    assert stats[EVENTS_STAT]["replay"] is None


@pytest.mark.parametrize(
    "config",
    [None, {}, {**CONFIG, "enable_kv_cache_events": False}, {**CONFIG, "publisher": "null"}],
)
def test_no_zeromq_events_means_no_kv_events_but_the_capacity_stays(config: Any) -> None:
    assert kv_event_stats(config, host="h", block_size=16, num_gpu_blocks=10) == {
        CAPACITY_STAT: 160
    }


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"kv_events_config": ["tcp://*:1"]}, InputTypeError, "must be a mapping"),
        ({"kv_events_config": {"enable_kv_cache_events": True}}, InvalidInputError, "no endpoint"),
        (
            {"kv_events_config": {**CONFIG, "endpoint": "ipc:///tmp/x"}},
            InvalidInputError,
            "tcp://host:port",
        ),
        (
            {"kv_events_config": {**CONFIG, "replay_endpoint": 5657}},
            InputTypeError,
            "replay_endpoint must be a str",
        ),
        ({"kv_events_config": CONFIG, "dp_rank": 70_000}, InvalidInputError, "not a port"),
        ({"kv_events_config": CONFIG, "dp_rank": -1}, InvalidInputError, "dp_rank must be >= 0"),
        ({"kv_events_config": CONFIG, "block_size": 0}, InvalidInputError, "block_size"),
        ({"kv_events_config": CONFIG, "num_gpu_blocks": 1.5}, InputTypeError, "num_gpu_blocks"),
        ({"kv_events_config": CONFIG, "host": ""}, InputTypeError, "host"),
    ],
)
def test_bad_configs_raise_clear_errors(kwargs: dict[str, Any], error: type, match: str) -> None:
    kwargs = {"host": "h", **kwargs}
    config = kwargs.pop("kv_events_config")
    with pytest.raises(error, match=match):
        kv_event_stats(config, **kwargs)


def test_offset_events_config_moves_both_ports_and_leaves_the_original() -> None:
    moved = offset_events_config(CONFIG, 2)
    assert moved["endpoint"] == "tcp://*:5559" and moved["replay_endpoint"] == "tcp://*:5659"
    assert CONFIG["endpoint"] == "tcp://*:5557"
    assert moved["publisher"] == "zmq"
    with pytest.raises(InvalidInputError, match="tcp://host:port"):
        offset_events_config({"endpoint": "tcp://*:x"}, 1)


def test_the_router_subscribes_to_what_kv_event_stats_advertises() -> None:
    """The stats, as a replica's routing stats, give the router a vLLM subscription
    and the capacity it bounds the replica's model by."""
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID
    from ray.serve.request_router import ReplicaID

    from radixmeta.integrations.ray import RadixMetaRequestRouter

    class Replica:
        def __init__(self, stats: dict[str, Any]) -> None:
            self.replica_id = ReplicaID("r0", DeploymentID("llm", "unit"))
            self.routing_stats = stats
            self.max_ongoing_requests = 8

        async def get_queue_len(self, *, deadline_s: float) -> int:
            return 0

    async def run() -> None:
        stats = kv_event_stats(
            {**CONFIG, "endpoint": "tcp://127.0.0.1:5557", "replay_endpoint": None},
            host="127.0.0.1",
            block_size=16,
            num_gpu_blocks=128,
        )
        router = RadixMetaRequestRouter(DeploymentID("llm", "unit"), DeploymentHandleSource.UNKNOWN)
        router.initialize_state(mode="exact", page_size=16)
        try:
            replica = Replica(stats)
            router.update_replicas([replica])  # type: ignore[list-item]
            worker = router.worker_of(replica.replica_id)
            assert worker is not None
            assert router.router.load(worker).capacity == 2048
            assert router.counts["subscribed"] == 1 and router.counts["bad_stats"] == 0
            assert router._feeds[replica.replica_id] == ("tcp://127.0.0.1:5557", None, "vllm")
        finally:
            router.update_replicas([])
            router.router.close()  # closes its subscriptions; the feed thread ends
            if router._feed_thread is not None:
                router._feed_thread._thread.join(10)
                assert not router._feed_thread._thread.is_alive()

    asyncio.run(asyncio.wait_for(run(), 60))


# Ray 2.60's LLMServer.__del__ is a coroutine function: collecting any instance warns
# that it was never awaited (Ray's, not this test's).
unawaited_del = pytest.mark.filterwarnings(
    "ignore:coroutine 'LLMServer.__del__' was never awaited:RuntimeWarning",
    "ignore::pytest.PytestUnraisableExceptionWarning",
)


# -- RadixMetaLLMServer --------------------------------------------------------------------


class StandinEngine:
    """What ``LLMServer`` drives of an engine, with a vLLM-shaped engine client."""

    def __init__(self, llm_config: Any) -> None:
        self.llm_config = llm_config
        self.started = False
        cache = SimpleNamespace(block_size=16, num_gpu_blocks=1000)
        self._engine_client = SimpleNamespace(vllm_config=SimpleNamespace(cache_config=cache))

    async def start(self) -> None:
        self.started = True

    def routing_stats(self) -> dict[str, Any]:
        return {"ray_own": 1}

    async def check_health(self) -> None:
        return None


def llm_config(events: dict[str, Any] | None) -> Any:
    from ray.serve.llm import LLMConfig

    engine_kwargs = {} if events is None else {"kv_events_config": events}
    return LLMConfig(
        model_loading_config={"model_id": "standin", "model_source": "standin"},
        engine_kwargs=engine_kwargs,
    )


@needs_serve_llm
@unawaited_del
def test_server_advertises_its_engines_events_and_capacity() -> None:
    from radixmeta.integrations.ray.llm import RadixMetaLLMServer

    async def run() -> dict[str, Any]:
        server = RadixMetaLLMServer.sync_init(llm_config(CONFIG), engine_cls=StandinEngine)
        await server.start()
        assert server.engine.started
        return dict(await server.record_routing_stats())

    stats = asyncio.run(asyncio.wait_for(run(), 60))
    assert stats["ray_own"] == 1  # Ray's own stats stay
    assert stats[CAPACITY_STAT] == 16_000
    spec = stats[EVENTS_STAT]
    assert spec["codec"] == "vllm" and spec["endpoint"].endswith(":5557")
    assert not spec["endpoint"].startswith("tcp://*")  # a node address, not the bind
    assert spec["replay"].endswith(":5657")


@needs_serve_llm
@unawaited_del
def test_server_without_events_still_gives_the_capacity() -> None:
    from radixmeta.integrations.ray.llm import RadixMetaLLMServer

    async def run() -> dict[str, Any]:
        server = RadixMetaLLMServer.sync_init(llm_config(None), engine_cls=StandinEngine)
        await server.start()
        return dict(await server.record_routing_stats())

    stats = asyncio.run(asyncio.wait_for(run(), 60))
    assert EVENTS_STAT not in stats and stats[CAPACITY_STAT] == 16_000


def test_the_server_class_needs_ray_serve_llm_or_says_so() -> None:
    from radixmeta.integrations.ray import llm

    if llm._LLM_MISSING is None:
        from ray.serve.llm import LLMServer

        from radixmeta.integrations.ray.llm import RadixMetaLLMServer

        assert issubclass(RadixMetaLLMServer, LLMServer)
    else:
        with pytest.raises(ImportError, match="needs Ray Serve LLM"):
            from radixmeta.integrations.ray.llm import RadixMetaLLMServer


@needs_serve_llm
@unawaited_del
def test_a_colocated_replica_moves_its_engines_ports_by_its_rank(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The replica of node-local rank 2 binds and advertises ports 2 up; the config
    object the deployment was built with is left as it was (other replicas read it)."""
    from radixmeta.integrations.ray import llm
    from radixmeta.integrations.ray.llm import RadixMetaLLMServer

    monkeypatch.setattr(llm, "_local_rank", lambda: 2)  # Serve's replica context, outside Serve
    config = llm_config(CONFIG)

    async def run() -> tuple[Any, dict[str, Any]]:
        server = RadixMetaLLMServer.sync_init(config, engine_cls=StandinEngine)
        await server.start()
        return server.engine.llm_config, dict(await server.record_routing_stats())

    engine_config, stats = asyncio.run(asyncio.wait_for(run(), 60))
    bound = engine_config.engine_kwargs["kv_events_config"]
    assert bound["endpoint"] == "tcp://*:5559" and bound["replay_endpoint"] == "tcp://*:5659"
    assert stats[EVENTS_STAT]["endpoint"].endswith(":5559")
    assert stats[EVENTS_STAT]["replay"].endswith(":5659")
    assert config.engine_kwargs["kv_events_config"]["endpoint"] == "tcp://*:5557"


def test_the_modules_examples_run() -> None:
    import doctest

    from radixmeta.integrations.ray import llm

    failures, tried = doctest.testmod(llm)
    assert tried >= 4 and failures == 0
