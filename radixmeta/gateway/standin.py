"""A stand-in engine: an OpenAI-compatible server with a real RadixCache and no model.

It answers what a vLLM or SGLang server answers to a gateway (``/health``, ``/v1/models``,
``/v1/completions``, ``/v1/chat/completions``, ``/metrics`` with the engine's load
gauges, SGLang's ``/get_load``, and the ``/server_info``, ``/version`` and ``/loads`` that
SMG asks of a worker it registers), and publishes its cache's KV events in vLLM's format
over ZeroMQ (radixmeta's :class:`~radixmeta.transport.ZmqPublisher`, live and replay
sockets), so routers can be tried and compared on a laptop:

.. code-block:: bash

    python -m radixmeta.gateway.standin --port 8001 --events tcp://127.0.0.1:5557 \\
        --replay tcp://127.0.0.1:5558

Time model: prefills run one at a time (a GPU computes one prefill batch at a time), each
taking :mod:`radixmeta.policies.costs`' prefill time of the prompt's uncached tokens,
times ``--time-scale``; so the cache's hits show in the time to first token. Generated
tokens then stream every ``--token-interval`` seconds, concurrently. The cache stores
each prompt after its prefill and evicts least recently used pages past ``--capacity``.
``GET /standin/stats`` reports the real hit rate; ``POST /standin/control`` injects
faults (an error status, a delay before the answer) or resets the engine as new.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import secrets
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from radixmeta.cache import RadixCache
from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.events import EventLog
from radixmeta.events.ingest import engine_batch
from radixmeta.gateway._disconnect import unless_disconnected
from radixmeta.gateway.tokenize import load_tokenizer, namespace_of, prompt_of
from radixmeta.policies import costs
from radixmeta.transport import ZmqPublisher
from radixmeta.wire import vllm

__all__ = ["StandinEngine", "main"]

_JSON = msgspec.json.Decoder()


class StandinEngine:
    """One stand-in engine: its cache, event publisher, time model and HTTP app.

    Parameters
    ----------
    model : str
        The model name it serves.
    page_size : int
        Its KV block size (the gateway's ``--page-size``).
    capacity : int
        Tokens its cache holds.
    events, replay : str, optional
        ZeroMQ endpoints of its KV-event PUB and replay ROUTER (bound).
    tokenizer : str, optional
        As the gateway's ``--tokenizer`` (the two must tokenize alike).
    prefill_model : str
        A :mod:`radixmeta.policies.costs` prefill model.
    time_scale : float
        Multiplies every prefill time (0: prefills take no time).
    token_interval : float
        Seconds between streamed tokens.
    max_tokens : int
        Tokens generated when a request names none (and the most it may name).
    flavor : {"vllm", "sglang"}
        Whose load gauge names ``/metrics`` uses.
    """

    def __init__(
        self,
        *,
        model: str = "standin",
        page_size: int = 16,
        capacity: int = 200_000,
        events: str | None = None,
        replay: str | None = None,
        tokenizer: str | None = None,
        prefill_model: str = costs.DEFAULT_PREFILL,
        time_scale: float = 1.0,
        token_interval: float = 0.005,
        max_tokens: int = 16,
        flavor: str = "vllm",
    ) -> None:
        self.model = model
        self.page_size = page_size
        self.capacity = capacity
        self.tokenizer = load_tokenizer(tokenizer)
        self.prefill_time = costs.prefill_model(prefill_model)
        self.time_scale = time_scale
        self.token_interval = token_interval
        self._start_token_interval = token_interval
        self.max_tokens = max_tokens
        self.flavor = flavor
        self.log = EventLog(form="blocks", worker=model, capacity=1 << 20, max_tokens=1 << 26)
        self.cache = RadixCache(page_size, capacity=capacity, event_log=self.log)
        self.publisher = (
            # Bound, whatever the address looks like: gateways connect to it.
            None if events is None else ZmqPublisher(events, replay_endpoint=replay, bind=True)
        )
        self._published = -1
        self._prefill = asyncio.Lock()
        # What /standin/stats and /metrics report.
        self.requests = 0
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.running = 0
        self.waiting = 0
        self.generated = 0
        self.cancelled = 0
        # Data-parallel rank hints seen: vLLM's header and SGLang's body field.
        self.rank_hints: dict[str, int] = {}
        # Injected faults (POST /standin/control).
        self.fail_status: int | None = None
        self.delay = 0.0
        routes = [
            Route("/health", self.health, methods=["GET"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/server_info", self.server_info, methods=["GET"]),
            Route("/get_server_info", self.server_info, methods=["GET"]),
            Route("/version", self.version, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/get_load", self.get_load, methods=["GET"]),
            Route("/loads", self.loads, methods=["GET"]),
            Route("/v1/loads", self.loads, methods=["GET"]),
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/standin/stats", self.stats, methods=["GET"]),
            Route("/standin/control", self.control, methods=["POST"]),
        ]
        self.app = Starlette(routes=routes, lifespan=self._lifespan)

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        try:
            yield
        finally:
            if self.publisher is not None:
                self.publisher.close()

    # -- events ---------------------------------------------------------------------------
    def _flush(self) -> None:
        """Publish what the cache stored and removed since the last flush, as one batch."""
        records = self.log.read(after=self._published)
        if not records:
            return
        self._published = records[-1].seq
        if self.publisher is not None:
            batch = engine_batch(
                records, block_size=self.page_size, timestamp=time.time(), dp_rank=0
            )
            self.publisher.publish(vllm.encode_batch(batch))

    # -- info -----------------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def models(self, request: Request) -> Response:
        entry = {
            "id": self.model,
            "object": "model",
            "created": 0,
            "owned_by": "radixmeta-standin",
            "root": self.model,
            "parent": None,
            "max_model_len": 131072,
        }
        return JSONResponse({"object": "list", "data": [entry]})

    async def server_info(self, request: Request) -> Response:
        return JSONResponse(
            {
                "model_path": self.model,
                "served_model_name": self.model,
                "page_size": self.page_size,
                "dp_size": 1,
                "tp_size": 1,
                "max_total_num_tokens": self.capacity,
                "version": "standin",
            }
        )

    async def version(self, request: Request) -> Response:
        return JSONResponse({"version": "0.0.0-standin"})

    def _usage(self) -> float:
        return min(1.0, self.cache.total_size / self.capacity)

    async def metrics(self, request: Request) -> Response:
        labels = f'{{model_name="{self.model}"}}'
        if self.flavor == "sglang":
            gauges = {
                "sglang:num_running_reqs": self.running,
                "sglang:num_queue_reqs": self.waiting,
                "sglang:token_usage": self._usage(),
            }
        else:
            gauges = {
                "vllm:num_requests_running": self.running,
                "vllm:num_requests_waiting": self.waiting,
                "vllm:kv_cache_usage_perc": self._usage(),
            }
        lines = []
        for name, value in gauges.items():
            lines += [f"# TYPE {name} gauge", f"{name}{labels} {float(value)}"]
        counters = {
            "vllm:prefix_cache_queries": self.prompt_tokens,
            "vllm:prefix_cache_hits": self.cached_tokens,
        }
        for name, value in counters.items():
            lines += [f"# TYPE {name} counter", f"{name}_total{labels} {float(value)}"]
        return Response("\n".join(lines) + "\n", media_type="text/plain; version=0.0.4")

    async def get_load(self, request: Request) -> Response:
        load = {
            "dp_rank": 0,
            "num_reqs": self.running + self.waiting,
            "num_waiting_reqs": self.waiting,
            "num_tokens": self.cache.total_size,
        }
        return JSONResponse([load])

    async def loads(self, request: Request) -> Response:
        return JSONResponse(
            {
                "loads": [
                    {
                        "dp_rank": 0,
                        "num_running_reqs": self.running,
                        "num_waiting_reqs": self.waiting,
                        "num_total_tokens": self.cache.total_size,
                        "token_usage": self._usage(),
                    }
                ]
            }
        )

    async def stats(self, request: Request) -> Response:
        return JSONResponse(
            {
                "requests": self.requests,
                "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens,
                "hit_rate": self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0,
                "cache_tokens": self.cache.total_size,
                "running": self.running,
                "waiting": self.waiting,
                "generated": self.generated,
                "cancelled": self.cancelled,
                "events_published": self._published + 1,
                "rank_hints": self.rank_hints,
            }
        )

    async def control(self, request: Request) -> Response:
        body = _JSON.decode(await request.body())
        if body.get("reset"):
            # As a freshly started engine: an empty cache (its AllBlocksCleared published),
            # zero counters, no faults. Tests share one process across many cases this way.
            self.cache.reset()
            self._flush()
            self.requests = self.prompt_tokens = self.cached_tokens = 0
            self.generated = self.cancelled = 0
            self.rank_hints = {}
            self.fail_status, self.delay = None, 0.0
            self.token_interval = self._start_token_interval
        if "fail_status" in body:
            self.fail_status = body["fail_status"]
        if "delay" in body:
            self.delay = float(body["delay"])
        if "token_interval" in body:
            self.token_interval = float(body["token_interval"])
        return JSONResponse({"fail_status": self.fail_status, "delay": self.delay})

    # -- generation -----------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        return await self._generate(request, "completions")

    async def chat(self, request: Request) -> Response:
        return await self._generate(request, "chat")

    async def _generate(self, request: Request, kind: str) -> Response:
        try:
            body = _JSON.decode(await request.body())
            tokens, _ = prompt_of(body, kind, self.tokenizer)
            namespace = namespace_of(body)
        except (msgspec.DecodeError, InvalidInputError, InputTypeError) as exc:
            return JSONResponse(
                {"error": {"message": str(exc), "type": "BadRequestError", "code": 400}}, 400
            )
        for hint in (request.headers.get("x-data-parallel-rank"), body.get("data_parallel_rank")):
            if hint is not None:
                self.rank_hints[str(hint)] = self.rank_hints.get(str(hint), 0) + 1
        # As vLLM aborts a request whose client went away, the work races the disconnect.
        answer = await unless_disconnected(
            self._answer(body, kind, tokens, namespace), request.receive
        )
        if answer is not None:
            return answer
        self.cancelled += 1
        return Response(status_code=499)

    async def _answer(
        self, body: dict[str, Any], kind: str, tokens: Any, namespace: str | None
    ) -> Response:
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_status is not None:
            error = {"message": "injected failure", "type": "InternalServerError"}
            return JSONResponse(
                {"error": {**error, "code": self.fail_status}}, status_code=self.fail_status
            )
        wanted = body.get("max_tokens", body.get("max_completion_tokens"))
        n = self.max_tokens if type(wanted) is not int else max(1, min(wanted, self.max_tokens))
        self.waiting += 1
        admitted = False
        try:
            async with self._prefill:
                self.waiting -= 1
                self.running += 1
                admitted = True
                cached = self.cache.match_prefix(tokens, namespace=namespace, values=False).length
                seconds = self.prefill_time(len(tokens) - cached, len(tokens)) * self.time_scale
                if seconds > 0:
                    await asyncio.sleep(seconds)
                self.cache.insert(tokens, namespace=namespace)
                self._flush()
        except BaseException:  # cancelled (the client went away) while queued or in prefill
            if admitted:
                self.running -= 1
            else:
                self.waiting -= 1
            raise
        self.requests += 1
        self.prompt_tokens += len(tokens)
        self.cached_tokens += cached
        rid = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{secrets.token_hex(8)}"
        usage = {
            "prompt_tokens": len(tokens),
            "completion_tokens": n,
            "total_tokens": len(tokens) + n,
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        if body.get("stream"):
            include = isinstance(body.get("stream_options"), dict) and bool(
                body["stream_options"].get("include_usage")
            )
            return StreamingResponse(
                self._stream(kind, rid, n, usage if include else None),
                media_type="text/event-stream",
            )
        try:
            if self.token_interval > 0:
                await asyncio.sleep(self.token_interval * n)
            self.generated += n
        finally:
            self.running -= 1
        text = "".join(f" t{i}" for i in range(n))
        created = int(time.time())
        if kind == "chat":
            choice: dict[str, Any] = {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "length",
            }
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": "length"}
            obj = "text_completion"
        answer = {
            "id": rid,
            "object": obj,
            "created": created,
            "model": self.model,
            "choices": [choice],
            "usage": usage,
        }
        return JSONResponse(answer)

    async def _stream(
        self, kind: str, rid: str, n: int, usage: dict[str, Any] | None
    ) -> AsyncIterator[bytes]:
        created = int(time.time())
        obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
        done = False

        def event(piece: str | None, finish: str | None, first: bool = False) -> bytes:
            if kind == "chat":
                delta: dict[str, Any] = {"content": piece} if piece is not None else {}
                if first:
                    delta["role"] = "assistant"
                choice: dict[str, Any] = {"index": 0, "delta": delta, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": piece or "", "logprobs": None,
                          "finish_reason": finish}
            data = {"id": rid, "object": obj, "created": created, "model": self.model,
                    "choices": [choice]}
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        try:
            for i in range(n):
                if i and self.token_interval > 0:
                    await asyncio.sleep(self.token_interval)
                yield event(f" t{i}", "length" if i == n - 1 else None, first=i == 0)
                self.generated += 1
            if usage is not None:
                data = {"id": rid, "object": obj, "created": created, "model": self.model,
                        "choices": [], "usage": usage}
                yield b"data: " + json.dumps(data).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
            done = True
        finally:
            self.running -= 1
            if not done:
                self.cancelled += 1


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m radixmeta.gateway.standin",
        description="A stand-in LLM engine: OpenAI endpoints, a real RadixCache, vLLM KV events.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--model", default="standin")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--capacity", type=int, default=200_000, help="tokens the cache holds")
    p.add_argument("--events", help="ZeroMQ PUB endpoint of its KV events (bound)")
    p.add_argument("--replay", help="ZeroMQ replay ROUTER endpoint")
    p.add_argument("--tokenizer", help="as the gateway's --tokenizer (default: UTF-8 bytes)")
    p.add_argument("--prefill-model", default=costs.DEFAULT_PREFILL)
    p.add_argument("--time-scale", type=float, default=1.0, help="multiplies prefill times")
    p.add_argument("--token-interval", type=float, default=0.005, metavar="SECONDS")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--flavor", choices=("vllm", "sglang"), default="vllm")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Serve one stand-in engine until SIGINT or SIGTERM."""
    import uvicorn

    args = _parser().parse_args(argv)
    engine = StandinEngine(
        model=args.model,
        page_size=args.page_size,
        capacity=args.capacity,
        events=args.events,
        replay=args.replay,
        tokenizer=args.tokenizer,
        prefill_model=args.prefill_model,
        time_scale=args.time_scale,
        token_interval=args.token_interval,
        max_tokens=args.max_tokens,
        flavor=args.flavor,
    )
    uvicorn.run(
        engine.app,
        host=args.host,
        port=args.port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
