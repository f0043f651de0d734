"""A stand-in LLM replica for Ray Serve: a real RadixCache, a time model, and no model.

Wrap it in a deployment (``serve.deployment(StandinReplica)``) to try request routers
on a laptop: each replica holds its own :class:`~radixmeta.RadixCache`, serves a
request by matching its prompt (the gateway's token rule) and inserting it, and
answers with what it found cached. It reports its queue length, its KV capacity and,
with ``events``, its KV-event streams (live and replay sockets on 127.0.0.1) in
``record_routing_stats``, under the keys
:class:`~radixmeta.integrations.ray.RadixMetaRequestRouter` reads. The events go out
as radixmeta's own (``events="native"`` or ``True``: a
:class:`~radixmeta.events.LogPublisher`) or in an engine's wire format
(``events="vllm"``: what vLLM's ``--kv-events-config`` publisher sends;
``events="sglang"``: SGLang's, with SGLang's own block hashes), so that a router's
exact mode is tried with the codec it would use on that engine.

Time model (the gateway's stand-in engine's): prefills run one at a time (a GPU
computes one prefill batch at a time), each taking :mod:`radixmeta.policies.costs`'
prefill time of the prompt's uncached tokens, times ``time_scale``; so the cache's hits
show in the latency. A request's ``seconds`` is its wait for the prefill slot plus its
prefill; no decode is modelled. The cache stores each prompt after its prefill and
evicts least recently used pages past ``capacity``.

Eviction (``granularity``): ``"page"`` (the default) frees one page at a time, the
least recently used first and the deepest of a path first, as vLLM's block pool
does (each block is evicted on its own); the cache keeps every page in a node of
its own so that its leaf eviction frees exactly what is needed. ``"node"`` frees
whole leaves of the radix tree, as SGLang's tree does: past the capacity by one
page, a leaf that is a whole 1,024-token system prompt goes at once. A router's
approximate model (:class:`~radixmeta.MetaTree` with a capacity) evicts by pages,
so on ``"node"`` replicas it keeps the heads of prompts the replicas dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Hashable, Mapping
from typing import Any

from radixmeta.cache import RadixCache
from radixmeta.errors import InvalidInputError
from radixmeta.events import EventLog
from radixmeta.events.ingest import engine_batch
from radixmeta.events.publishing import LogPublisher
from radixmeta.gateway.tokenize import load_tokenizer
from radixmeta.integrations.ray.prompts import body_of, prompt_of_request
from radixmeta.integrations.ray.router import CAPACITY_STAT, EVENTS_STAT, QUEUE_STAT
from radixmeta.policies import costs
from radixmeta.transport import ZmqPublisher
from radixmeta.wire import sglang, vllm

__all__ = ["StandinReplica"]

_LOOPBACK = "tcp://127.0.0.1:*"  # an ephemeral port on loopback only
_ENGINE_ENCODERS = {"vllm": vllm.encode_batch, "sglang": sglang.encode_batch}
_EVENT_FORMATS = ("native", *_ENGINE_ENCODERS)
_GRANULARITIES = ("page", "node")


def _replica_name() -> str:
    """This replica's full id, the name routers give its worker (``"standin"`` outside Serve)."""
    from ray import serve

    try:
        return str(serve.get_replica_context().replica_id.to_full_id_str())
    except RuntimeError:  # not inside a Serve replica (a unit test, a script)
        return "standin"


class StandinReplica:
    """One stand-in replica: its cache, time model and (optionally) event publisher.

    Parameters
    ----------
    page_size : int, default 16
        Its KV block size (the router's ``page_size``).
    capacity : int, default 200000
        Tokens its cache holds.
    events : bool or {"native", "vllm", "sglang"}, default False
        Publish the cache's KV events on 127.0.0.1 and advertise them: ``True`` or
        ``"native"`` through a ``LogPublisher``, ``"vllm"`` or ``"sglang"`` as that
        engine's publisher does (blocks of ``page_size`` tokens, numbered batches,
        a replay socket); the routing stats name the codec.
    tokenizer : str, optional
        As the router's ``tokenizer`` (the two must tokenize alike).
    prefill_model : str
        A :mod:`radixmeta.policies.costs` prefill model.
    time_scale : float, default 1.0
        Multiplies every prefill time (0: prefills take no time).
    granularity : {"page", "node"}, default "page"
        What an eviction frees (module docstring): a page at a time (vLLM's block
        pool) or a whole leaf of the radix tree (SGLang's).
    name : str, optional
        Its worker name; by default the Serve replica id (``to_full_id_str()``).
    """

    def __init__(
        self,
        *,
        page_size: int = 16,
        capacity: int = 200_000,
        events: bool | str = False,
        tokenizer: str | None = None,
        prefill_model: str = costs.DEFAULT_PREFILL,
        time_scale: float = 1.0,
        granularity: str = "page",
        name: str | None = None,
    ) -> None:
        codec = "native" if events is True else events or None
        if codec is not None and codec not in _EVENT_FORMATS:
            msg = f"events must be a bool or one of {', '.join(_EVENT_FORMATS)}, got {events!r}"
            raise InvalidInputError(msg)
        if granularity not in _GRANULARITIES:
            msg = f"granularity must be 'page' or 'node', got {granularity!r}"
            raise InvalidInputError(msg)
        self.granularity = granularity
        self.name = _replica_name() if name is None else name
        self.page_size = page_size
        self.capacity = capacity
        self.tokenizer = load_tokenizer(tokenizer)
        self.prefill_time = costs.prefill_model(prefill_model)
        self.time_scale = time_scale
        self.codec = codec
        if codec in _ENGINE_ENCODERS:  # engines name pages by block hashes
            self.log = EventLog(
                worker=self.name,
                capacity=1 << 20,
                max_tokens=1 << 26,
                form="blocks",
                hash="sglang" if codec == "sglang" else "chain",
            )
        else:
            self.log = EventLog(worker=self.name, capacity=1 << 20, max_tokens=1 << 26)
        self.cache = RadixCache(page_size, capacity=capacity, event_log=self.log)
        self.publisher = (
            LogPublisher(self.cache, _LOOPBACK, replay_endpoint=_LOOPBACK)
            if codec == "native"
            else None
        )
        # An engine's publisher: numbered batches of its wire format, a replay socket.
        self.engine_publisher = (
            ZmqPublisher(_LOOPBACK, replay_endpoint=_LOOPBACK)
            if codec in _ENGINE_ENCODERS
            else None
        )
        self._published = -1  # the last log record an engine batch carried
        self._prefill = asyncio.Lock()
        self.waiting = 0
        self.running = 0
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0

    async def __call__(self, body: Mapping[str, Any]) -> dict[str, Any]:
        """Serve one request: wait for the prefill slot, prefill what is not cached, store it.

        Returns
        -------
        dict
            ``replica`` (its name), ``prompt_tokens``, ``cached_tokens``, ``seconds``
            (queue wait plus prefill, in the time model) and ``prefill_seconds``.
        """
        found = body_of([body], {})
        if found is None:
            msg = "a stand-in request needs 'prompt', 'messages' or 'input_ids'"
            raise ValueError(msg)
        tokens, namespace = prompt_of_request(found, self.tokenizer)
        arrived = time.perf_counter()
        self.waiting += 1
        async with self._prefill:
            self.waiting -= 1
            self.running += 1
            try:
                cached = self.cache.match_prefix(tokens, namespace=namespace, values=False).length
                seconds = self.prefill_time(len(tokens) - cached, len(tokens)) * self.time_scale
                if seconds > 0:
                    await asyncio.sleep(seconds)
                self._store(tokens, namespace, cached)
                self._publish()
            finally:
                self.running -= 1
        self.requests += 1
        self.prompt_tokens += len(tokens)
        self.cached_tokens += cached
        return {
            "replica": self.name,
            "prompt_tokens": len(tokens),
            "cached_tokens": cached,
            "prefill_seconds": seconds,
            "seconds": time.perf_counter() - arrived,
        }

    def _store(self, tokens: Any, namespace: Hashable, cached: int) -> None:
        """Insert a prompt whose first ``cached`` tokens the cache holds, by its granularity.

        By pages, each new page is a node of its own: the prompt's prefixes are
        inserted one page longer each time (O(pages x path) in all), so the cache's
        leaf eviction frees a page at a time, the deepest of a path first (every
        node of the path is stamped by the last insert; only leaves are freed).
        """
        if self.granularity == "node":
            self.cache.insert(tokens, namespace=namespace)
            return
        page = self.page_size
        for end in range(cached + page, len(tokens) + 1, page):
            self.cache.insert(tokens[:end], namespace=namespace)

    def _publish(self) -> None:
        """Send the cache's new events (what an engine does after each scheduler step)."""
        if self.publisher is not None:
            self.publisher.flush()
        elif self.engine_publisher is not None and self.codec is not None:
            records = self.log.read(after=self._published)
            if records:
                self._published = records[-1].seq
                batch = engine_batch(list(records), block_size=self.page_size)
                self.engine_publisher.publish(_ENGINE_ENCODERS[self.codec](batch))

    def record_routing_stats(self) -> dict[str, Any]:
        """What Ray Serve hands the routers as ``RunningReplica.routing_stats``."""
        stats: dict[str, Any] = {
            QUEUE_STAT: self.waiting + self.running,
            CAPACITY_STAT: self.capacity,
        }
        publisher = self.engine_publisher
        if self.publisher is not None:
            publisher = self.publisher.publisher
        if publisher is not None:
            stats[EVENTS_STAT] = {
                "endpoint": publisher.endpoint,
                "replay": publisher.replay_endpoint,
                "codec": self.codec,
            }
        return stats

    def stats(self) -> dict[str, Any]:
        """Its name and counters: requests served, prompt tokens, tokens found cached."""
        return {
            "replica": self.name,
            "requests": self.requests,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
        }

    def __del__(self) -> None:
        for attribute in ("publisher", "engine_publisher"):
            publisher = getattr(self, attribute, None)
            if publisher is not None:
                publisher.close()
