"""Ray Serve LLM's vLLM replicas as radixmeta workers: :class:`RadixMetaLLMServer`.

Ray Serve LLM (``ray.serve.llm``) runs vLLM engines as the replicas of an
``LLMServer`` deployment. Its own ``record_routing_stats`` advertises the engine's
KV-event sockets only to Ray's ``KVAwareRouter`` (and under its own keys), and never
the engine's KV capacity. :class:`RadixMetaLLMServer` is that server with the routing
stats :class:`~radixmeta.integrations.ray.RadixMetaRequestRouter` reads:

- ``kv_events`` (exact mode): the engine's ``kv_events_config`` (vLLM's
  ``--kv-events-config``: a ZeroMQ publisher and its replay socket), rewritten from
  the address the engine binds (``tcp://*:5557``) to one the routers on other nodes
  can reach (this node's IP), with ``codec="vllm"``;
- ``kv_capacity``: the tokens the engine's KV cache holds (its GPU blocks times its
  block size), the bound of the router's model of the replica in approximate mode.

:func:`kv_event_stats` builds the same mapping from plain values, for a server of
one's own (and for tests). Colocated replicas share one ``engine_kwargs``, so each
replica's server moves its sockets' ports by its node-local rank before the engine
binds them (as Ray's KV-aware deployments do), and advertises the moved ports.

Needs Ray Serve LLM (``pip install 'ray[serve,llm]'``, with vLLM);
:func:`kv_event_stats` needs nothing beyond this package, and
``RadixMetaLLMServer`` raises a clear :class:`ImportError` when Ray Serve LLM
cannot be imported.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.integrations.ray.router import CAPACITY_STAT, EVENTS_STAT

__all__ = ["RadixMetaLLMServer", "kv_event_stats", "offset_events_config"]

logger = logging.getLogger(__name__)

_REPLAY_KEY = "replay_endpoint"


def _port_moved(endpoint: str, offset: int, what: str) -> str:
    """``endpoint`` (``tcp://host:port``) with its port moved by ``offset``."""
    base, sep, port = endpoint.rpartition(":")
    if not sep or not base.startswith("tcp://") or not port.isdigit():
        msg = f"{what} must be a tcp://host:port endpoint, got {endpoint!r}"
        raise InvalidInputError(msg)
    moved = int(port) + offset
    if not 0 < moved < 65536:
        msg = f"{what} {endpoint!r} moved by {offset} is not a port"
        raise InvalidInputError(msg)
    return f"{base}:{moved}"


def _reachable(endpoint: str, host: str, offset: int, what: str) -> str:
    """The address a router dials for a socket the engine binds at ``endpoint``."""
    moved = _port_moved(endpoint, offset, what)
    bound = moved[len("tcp://") : moved.rindex(":")]
    if bound in ("*", "0.0.0.0", "[::]", "::"):  # a wildcard bind: this node's address
        return f"tcp://{host}:{moved.rsplit(':', 1)[1]}"
    return moved


def _events_enabled(config: Mapping[str, Any]) -> bool:
    return bool(config.get("enable_kv_cache_events", False)) and (
        config.get("publisher", "zmq") == "zmq"
    )


def kv_event_stats(
    kv_events_config: Mapping[str, Any] | None,
    *,
    host: str,
    dp_rank: int = 0,
    block_size: int | None = None,
    num_gpu_blocks: int | None = None,
) -> dict[str, Any]:
    """The routing stats that :class:`RadixMetaRequestRouter` reads, for a vLLM engine.

    Parameters
    ----------
    kv_events_config : mapping or None
        The engine's ``kv_events_config`` (vLLM's ``--kv-events-config``:
        ``enable_kv_cache_events``, ``publisher``, ``endpoint``, ``replay_endpoint``),
        with the ports this replica's engine binds. None, events off, or a publisher
        other than ZeroMQ: no ``kv_events`` (the router routes the replica
        approximately).
    host : str
        This node's address, as routers on other nodes reach it (a wildcard bind,
        ``tcp://*:port``, is advertised at it).
    dp_rank : int, default 0
        The engine's data-parallel rank: vLLM moves each rank's ports by its rank,
        so the stats advertise the moved ones (one stream per rank: ``dp_size`` 1).
    block_size, num_gpu_blocks : int, optional
        The engine's KV block size and GPU block count: ``kv_capacity`` is their
        product (absent when either is unknown).

    Returns
    -------
    dict
        ``{"kv_events": {"endpoint", "replay", "codec": "vllm", "dp_size"},
        "kv_capacity": tokens}``, each key only when known.

    Raises
    ------
    InputTypeError, InvalidInputError
        A config that is not a mapping, an enabled ZeroMQ publisher without an
        endpoint or with one that is not ``tcp://host:port``, or bad numbers.

    Notes
    -----
    O(1). A pure function of its arguments: a replica calls it with what its engine
    was started with.

    Examples
    --------
    >>> config = {"enable_kv_cache_events": True, "publisher": "zmq",
    ...           "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5657"}
    >>> stats = kv_event_stats(config, host="10.0.0.7", block_size=16, num_gpu_blocks=1000)
    >>> stats["kv_events"]["endpoint"], stats["kv_events"]["replay"], stats["kv_capacity"]
    ('tcp://10.0.0.7:5557', 'tcp://10.0.0.7:5657', 16000)
    """
    for name, value, low in (
        ("dp_rank", dp_rank, 0),
        ("block_size", block_size, 1),
        ("num_gpu_blocks", num_gpu_blocks, 0),
    ):
        if value is None and name != "dp_rank":
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            msg = f"{name} must be an int, got {type(value).__name__}"
            raise InputTypeError(msg)
        if value < low:
            msg = f"{name} must be >= {low}, got {value}"
            raise InvalidInputError(msg)
    if not isinstance(host, str) or not host:
        msg = f"host must be a non-empty str, got {host!r}"
        raise InputTypeError(msg)
    stats: dict[str, Any] = {}
    if kv_events_config is not None:
        if not isinstance(kv_events_config, Mapping):
            msg = f"kv_events_config must be a mapping, got {type(kv_events_config).__name__}"
            raise InputTypeError(msg)
        if _events_enabled(kv_events_config):
            endpoint = kv_events_config.get("endpoint")
            if not isinstance(endpoint, str):
                msg = "kv_events_config enables ZeroMQ events but gives no endpoint"
                raise InvalidInputError(msg)
            spec: dict[str, Any] = {
                "endpoint": _reachable(endpoint, host, dp_rank, "endpoint"),
                "replay": None,
                "codec": "vllm",
                "dp_size": 1,  # this replica's rank alone: one stream, already offset
            }
            replay = kv_events_config.get(_REPLAY_KEY)
            if replay is not None:
                if not isinstance(replay, str):
                    msg = f"{_REPLAY_KEY} must be a str, got {type(replay).__name__}"
                    raise InputTypeError(msg)
                spec["replay"] = _reachable(replay, host, dp_rank, _REPLAY_KEY)
            stats[EVENTS_STAT] = spec
    if block_size is not None and num_gpu_blocks is not None:
        stats[CAPACITY_STAT] = block_size * num_gpu_blocks
    return stats


def offset_events_config(kv_events_config: Mapping[str, Any], offset: int) -> dict[str, Any]:
    """A copy of ``kv_events_config`` with its sockets' ports moved by ``offset``.

    Replicas on one node share one ``engine_kwargs``; each moves the ports by its
    node-local rank before its engine binds them, so no two bind the same port.
    O(1); raises :class:`InvalidInputError` for an endpoint that is not
    ``tcp://host:port``.

    Examples
    --------
    >>> offset_events_config({"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5657"}, 2)
    {'endpoint': 'tcp://*:5559', 'replay_endpoint': 'tcp://*:5659'}
    """
    moved = dict(kv_events_config)
    for key in ("endpoint", _REPLAY_KEY):
        value = moved.get(key)
        if isinstance(value, str):
            moved[key] = _port_moved(value, offset, key)
    return moved


def _engine_blocks(server: Any) -> tuple[int | None, int | None]:
    """(block size, GPU blocks) of a started ``LLMServer``'s vLLM engine, when it says.

    Read through vLLM's engine client (``vllm_config.cache_config``); Ray Serve LLM
    keeps no copy of it. (None, None) for an engine that is not vLLM's, or not
    started.
    """
    client = getattr(getattr(server, "engine", None), "_engine_client", None)
    cache = getattr(getattr(client, "vllm_config", None), "cache_config", None)
    block_size = getattr(cache, "block_size", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    if not isinstance(block_size, int) or not isinstance(blocks, int):
        return None, None
    return block_size, blocks


def _node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())  # type: ignore[no-untyped-call]


def _local_rank() -> int:
    from ray import serve
    from ray.serve.exceptions import RayServeException

    try:
        return int(serve.get_replica_context().rank.local_rank)
    except (RayServeException, RuntimeError, AttributeError):  # not inside a Serve replica
        return 0


try:
    from ray.serve.llm import LLMServer as _LLMServer
except ImportError as _missing:  # pragma: no cover - exercised where Ray Serve LLM is absent
    _LLM_MISSING: ImportError | None = _missing
else:
    _LLM_MISSING = None

if TYPE_CHECKING or _LLM_MISSING is None:
    from ray.serve.llm import LLMServer as _LLMServer

    class RadixMetaLLMServer(_LLMServer):
        """Ray Serve LLM's vLLM server, advertising what radixmeta's router reads.

        Use it as a deployment's server class, with the router named in the
        deployment config::

            from ray.serve.config import RequestRouterConfig
            from ray.serve.llm import LLMConfig, build_llm_deployment
            from radixmeta.integrations.ray.llm import RadixMetaLLMServer

            config = LLMConfig(
                model_loading_config={"model_id": "qwen", "model_source": "Qwen/Qwen2.5-0.5B"},
                engine_kwargs={"kv_events_config": {
                    "enable_kv_cache_events": True, "publisher": "zmq",
                    "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5657"}},
                deployment_config={"request_router_config": RequestRouterConfig(
                    request_router_class=
                        "radixmeta.integrations.ray.router:RadixMetaRequestRouter",
                    request_router_kwargs={"mode": "exact", "page_size": 16})},
            )
            app = build_llm_deployment(config, deployment_cls=RadixMetaLLMServer)

        Before its engine starts, the server moves the ``kv_events_config`` ports by
        the replica's node-local rank (colocated replicas share one config). Its
        ``record_routing_stats`` returns Ray's own stats plus :func:`kv_event_stats`
        of its engine; a failure to read them is logged and leaves Ray's stats as
        they are (the router then routes the replica approximately).
        """

        def _init_shared(self, llm_config: Any, *args: Any, **kwargs: Any) -> None:
            config = llm_config.engine_kwargs.get("kv_events_config")
            rank = _local_rank()
            if isinstance(config, Mapping) and _events_enabled(config) and rank:
                # A copy: the config object may be shared with other replicas' builds.
                llm_config = copy.deepcopy(llm_config)
                llm_config.update_engine_kwargs(
                    kv_events_config=offset_events_config(config, rank)
                )
            super()._init_shared(llm_config, *args, **kwargs)

        async def record_routing_stats(self) -> dict[str, Any]:
            """Ray's routing stats plus ``kv_events`` and ``kv_capacity`` (module docstring)."""
            stats = dict(await super().record_routing_stats() or {})
            engine_kwargs = self._llm_config.engine_kwargs
            block_size, blocks = _engine_blocks(self)
            try:
                stats.update(
                    kv_event_stats(
                        engine_kwargs.get("kv_events_config"),
                        host=_node_ip(),
                        dp_rank=int(engine_kwargs.get("data_parallel_rank") or 0),
                        block_size=block_size,
                        num_gpu_blocks=blocks,
                    )
                )
            except (InputTypeError, InvalidInputError) as exc:
                logger.warning("routing stats without KV events: %s", exc)
            return stats

else:  # pragma: no cover - exercised where Ray Serve LLM is absent

    def __getattr__(name: str) -> Any:
        if name == "RadixMetaLLMServer":
            msg = (
                "RadixMetaLLMServer needs Ray Serve LLM (pip install 'ray[serve,llm]', "
                f"with vLLM): {_LLM_MISSING}"
            )
            raise ImportError(msg) from _LLM_MISSING
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
