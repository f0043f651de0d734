"""The gateway's ASGI app: OpenAI endpoints in, the chosen engine's answer out.

Each ``POST /v1/completions`` or ``/v1/chat/completions`` is tokenized, dispatched by the
:class:`~radixmeta.Router` and sent to the engine it chose, whose status and body come
back as the engine wrote them: a stream is relayed chunk by chunk (never buffered whole),
its first data event marking the end of prefill (``Router.prefill_done``); the end of the
response, an error or the client's going away ``finish`` the request, and a client that
goes away cancels the upstream request. An engine that fails before its first byte is
counted by its circuit breaker and the request is sent once more, to another engine.

Control plane: ``GET /health``, ``GET /metrics``, ``GET /v1/models`` and
``GET/POST/DELETE /workers``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import json
import logging
import secrets
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import anyio
import msgspec
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from radixmeta.errors import (
    InputTypeError,
    InvalidInputError,
    NoWorkerError,
    RouterClosedError,
    UnknownRequestError,
)
from radixmeta.gateway._disconnect import unless_disconnected
from radixmeta.gateway.config import GatewayConfig, WorkerSpec
from radixmeta.gateway.engines import DuplicateEngineError, Engine, Fleet
from radixmeta.gateway.metrics import GatewayMetrics
from radixmeta.gateway.tokenize import Tokenizer, load_tokenizer, namespace_of, prompt_of
from radixmeta.gateway.upstream import MID_STREAM_ERRORS, UpstreamError

__all__ = ["Gateway", "create_app"]

logger = logging.getLogger("radixmeta.gateway")
request_log = logging.getLogger("radixmeta.gateway.requests")

_JSON = msgspec.json.Decoder()
_ENCODE = msgspec.json.Encoder().encode
# Headers of the engine's response that the gateway passes on (the rest are hop-by-hop
# or recomputed by the server).
_PASS_HEADERS = ("content-type", "content-encoding", "x-request-id", "openai-processing-ms")


class _Usage(msgspec.Struct):
    completion_tokens: int = 0


class _Completion(msgspec.Struct):
    """What the gateway reads of an engine's answer: its usage, nothing else."""

    usage: _Usage | None = None


_COMPLETION = msgspec.json.Decoder(_Completion)


def _error(status: int, message: str, kind: str) -> JSONResponse:
    """An OpenAI-style error body."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "code": status}}, status_code=status
    )


def _output_tokens(content: bytes) -> int:
    try:
        usage = _COMPLETION.decode(content).usage
    except msgspec.DecodeError:
        return 0
    return 0 if usage is None else max(0, usage.completion_tokens)


class Gateway:
    """An OpenAI-compatible front door over a :class:`~radixmeta.Router` and its engines.

    Parameters
    ----------
    config : GatewayConfig
    tokenizer : Tokenizer, optional
        Default: :func:`~radixmeta.gateway.tokenize.load_tokenizer` of ``config.tokenizer``.

    Attributes
    ----------
    app : starlette.applications.Starlette
        The ASGI app (mount it, or serve it with uvicorn). Its lifespan health-checks the
        engines and starts the background loops, and closes everything at shutdown.
    fleet : Fleet
        The router (``fleet.router``) and the engines.
    metrics : GatewayMetrics

    Raises
    ------
    InvalidInputError
        A bad engine, or engines of both kinds (see :class:`Fleet`).
    """

    def __init__(self, config: GatewayConfig, *, tokenizer: Tokenizer | None = None) -> None:
        self.config = config
        self.tokenizer = load_tokenizer(config.tokenizer) if tokenizer is None else tokenizer
        self.metrics = GatewayMetrics()
        self.fleet = Fleet(config, self.metrics)
        for spec in config.workers:
            self.fleet.add(spec)
        self._ids = map(f"gw-{secrets.token_hex(4)}-".__add__, map(str, itertools.count()))
        self._closed = False
        routes = [
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
            Route("/metrics", self.metrics_endpoint, methods=["GET"]),
            Route("/workers", self.list_workers, methods=["GET"]),
            Route("/workers", self.add_worker, methods=["POST"]),
            Route("/workers/{name:path}", self.remove_worker, methods=["DELETE"]),
        ]
        self.app = Starlette(routes=routes, lifespan=self._lifespan)
        self.app.state.gateway = self

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        if not self.tokenizer.exact:
            logger.warning(
                "no --tokenizer: routing on UTF-8 bytes, which approximates the engines' "
                "tokens (exact KV-event matches need the engines' tokenizer)"
            )
        await self.fleet.check_all()
        self.fleet.start()
        try:
            yield
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Stop the loops, the router and the engines' clients (idempotent, bounded)."""
        if self._closed:
            return
        self._closed = True
        await self.fleet.close()

    # -- auth ---------------------------------------------------------------------------
    @staticmethod
    def _has_key(request: Request, key: str | None) -> bool:
        if key is None:
            return True
        given = request.headers.get("authorization", "")
        scheme, _, token = given.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip(), key)

    def _admin(self, request: Request) -> bool:
        # The admin key when one is set; else the API key guards /workers too.
        key = self.config.admin_key if self.config.admin_key is not None else self.config.api_key
        return self._has_key(request, key)

    # -- data plane -----------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        return await self._proxy(request, "completions", "/v1/completions")

    async def chat_completions(self, request: Request) -> Response:
        return await self._proxy(request, "chat", "/v1/chat/completions")

    async def _proxy(self, request: Request, kind: str, path: str) -> Response:
        started = time.perf_counter()
        if not self._has_key(request, self.config.api_key):
            return _error(401, "a valid API key is required", "authentication_error")
        raw = await request.body()
        try:
            body = _JSON.decode(raw)
            tokens, _ = prompt_of(body, kind, self.tokenizer)
            namespace = namespace_of(body, self.fleet.lora_models)
            stream = body.get("stream", False)
            if not isinstance(stream, bool):
                msg = f"'stream' must be true or false, got {stream!r}"
                raise InvalidInputError(msg)
            expected = body.get("max_tokens", body.get("max_completion_tokens"))
            if type(expected) is not int or expected < 0:
                expected = None
        except (msgspec.DecodeError, InvalidInputError, InputTypeError) as exc:
            self.metrics.bad_requests.inc()
            return _error(400, f"malformed request: {exc}", "invalid_request_error")
        rid = next(self._ids)
        # The engine's work races the client's going away: a client that leaves before
        # the answer's headers (or, not streamed, its whole body) cancels the engine's work.
        answer = await unless_disconnected(
            self._route(rid, raw, body, tokens, namespace, expected, stream, path, started),
            request.receive,
        )
        if answer is not None:
            return answer
        self.metrics.disconnects.inc()
        return Response(status_code=499)

    async def _route(
        self,
        rid: str,
        raw: bytes,
        body: dict[str, Any],
        tokens: Any,
        namespace: str | None,
        expected: int | None,
        stream: bool,
        path: str,
        started: float,
    ) -> Response:
        """Dispatch, send (once more elsewhere if the engine fails before answering),
        and answer; cancelled, it releases the request and closes the upstream call."""
        avoid: set[str] = set()
        first_error = ""
        for attempt in (0, 1):
            try:
                if avoid:
                    self.fleet.policy.avoid[rid] = frozenset(avoid)
                try:
                    decision = self.fleet.router.dispatch(
                        tokens, request_id=rid, namespace=namespace, expected_output=expected
                    )
                finally:
                    self.fleet.policy.avoid.pop(rid, None)
            except (NoWorkerError, RouterClosedError) as exc:
                if attempt:
                    return _error(502, first_error, "upstream_error")
                return _error(503, f"no engine is up: {exc}", "service_unavailable")
            engine = self.fleet.engine_of(decision.worker)
            if engine is None:  # removed between dispatch and here: cannot happen on one loop
                self._finish(rid)
                return _error(503, "the chosen engine was removed", "service_unavailable")
            if engine.shadows:  # no events of its own: the gateway models its cache
                self.fleet.model(engine, decision.worker, tokens, namespace)
            headers = {"content-type": "application/json", "x-request-id": rid}
            payload = raw
            if engine.spec.dp_size > 1:
                # The rank chosen, as each engine takes it: vLLM's header, SGLang's field.
                rank = decision.worker.dp_rank
                headers["x-data-parallel-rank"] = str(rank)
                if engine.spec.codec == "sglang":
                    payload = _ENCODE({**body, "data_parallel_rank": rank})
            try:
                upstream = await self.fleet.upstream.post(engine.spec.url + path, payload, headers)
            except asyncio.CancelledError:  # the client went away before any answer
                self._finish(rid)
                raise
            except UpstreamError as exc:
                self._finish(rid)
                self.fleet.failed(engine, exc.kind)
                first_error = first_error or (
                    f"engine {engine.spec.name} failed before responding: {exc}"
                )
                avoid.add(engine.spec.name)
                if attempt == 0:
                    self.metrics.retries.inc()
                    continue
                return _error(502, first_error, "upstream_error")
            break
        assert engine is not None  # each turn above returns, continues or breaks with one
        status = upstream.status
        if status >= 500:
            self.fleet.failed(engine, "status")
        else:
            self.fleet.succeeded(engine)
        out_headers = {
            "x-radixmeta-worker": engine.spec.name,
            "x-radixmeta-matched": str(decision.matched),
        }
        if engine.spec.dp_size > 1:
            out_headers["x-radixmeta-dp-rank"] = str(decision.worker.dp_rank)
        for name in _PASS_HEADERS:
            value = upstream.headers.get(name)
            if value is not None:
                out_headers[name] = value
        endpoint = path
        if stream and status == 200:
            return _Relay(
                self, upstream, engine, rid, out_headers, started, endpoint, tokens.size,
                decision.matched,
            )
        try:
            content = await upstream.read()
        except asyncio.CancelledError:  # the client went away: so does the engine's work
            upstream.close()
            self._finish(rid)
            self._count(endpoint, engine, 499, started)
            raise
        except MID_STREAM_ERRORS as exc:
            upstream.close()
            self.fleet.failed(engine, "read")
            self._finish(rid)
            self._count(endpoint, engine, 502, started)
            return _error(
                502, f"engine {engine.spec.name} failed mid-response: {exc!r}", "upstream_error"
            )
        upstream.release()
        self._finish(rid, _output_tokens(content) if status == 200 else 0)
        self._count(endpoint, engine, status, started)
        self._log(rid, endpoint, engine, decision.matched, tokens.size, status, started, None)
        return Response(content, status_code=status, headers=out_headers)

    def _finish(self, rid: str, output_tokens: int = 0) -> None:
        # Unknown: its engine was removed (its requests went with it), or it expired.
        with contextlib.suppress(UnknownRequestError):
            self.fleet.router.finish(rid, output_tokens)

    def _count(self, endpoint: str, engine: Engine, status: int, started: float) -> None:
        self.metrics.requests.labels(endpoint, engine.spec.name, str(status)).inc()
        self.metrics.latency.labels(endpoint).observe(time.perf_counter() - started)

    def _log(
        self,
        rid: str,
        endpoint: str,
        engine: Engine,
        matched: int,
        prompt: int,
        status: int,
        started: float,
        ttft: float | None,
        **more: Any,
    ) -> None:
        if not self.config.log_requests:
            return
        line = {
            "request_id": rid,
            "endpoint": endpoint,
            "worker": engine.spec.name,
            "matched": matched,
            "prompt_tokens": prompt,
            "status": status,
            "seconds": round(time.perf_counter() - started, 6),
            "ttft": None if ttft is None else round(ttft, 6),
            **more,
        }
        request_log.info(json.dumps(line))

    # -- control plane --------------------------------------------------------------------
    async def health(self, request: Request) -> Response:
        up = self.fleet.up_count
        body = {"status": "ok" if up else "unavailable", "engines": len(self.fleet.engines)}
        body["engines_up"] = up
        return JSONResponse(body, status_code=200 if up else 503)

    async def metrics_endpoint(self, request: Request) -> Response:
        text = self.metrics.text() + self.fleet.router.metrics_text().encode()
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def models(self, request: Request) -> Response:
        if not self._has_key(request, self.config.api_key):
            return _error(401, "a valid API key is required", "authentication_error")
        seen: dict[str, dict[str, Any]] = {}
        for engine in self.fleet.engines.values():
            for m in engine.models:
                seen.setdefault(str(m.get("id")), m)
        return JSONResponse({"object": "list", "data": list(seen.values())})

    async def list_workers(self, request: Request) -> Response:
        if not self._admin(request):
            return _error(401, "a valid admin key is required", "authentication_error")
        engines = [e.as_dict(self.fleet.router) for e in self.fleet.engines.values()]
        return JSONResponse({"workers": engines})

    async def add_worker(self, request: Request) -> Response:
        if not self._admin(request):
            return _error(401, "a valid admin key is required", "authentication_error")
        try:
            entry = _JSON.decode(await request.body())
            if isinstance(entry, str):
                spec = WorkerSpec.parse(entry)
            else:
                spec = WorkerSpec.from_mapping(entry, where="POST /workers")
            engine = self.fleet.add(spec)
        except DuplicateEngineError as exc:
            return _error(409, str(exc), "conflict")
        except (msgspec.DecodeError, InvalidInputError, InputTypeError) as exc:
            self.metrics.bad_requests.inc()
            return _error(400, f"malformed engine: {exc}", "invalid_request_error")
        await self.fleet.check(engine)
        return JSONResponse(engine.as_dict(self.fleet.router), status_code=201)

    async def remove_worker(self, request: Request) -> Response:
        if not self._admin(request):
            return _error(401, "a valid admin key is required", "authentication_error")
        name = request.path_params["name"]
        try:
            engine = self.fleet.remove(name)
        except KeyError as exc:
            return _error(404, str(exc.args[0]), "not_found")
        return JSONResponse({"removed": engine.spec.as_dict()})


class _Relay(Response):
    """A streamed answer, relayed chunk by chunk as the engine writes it.

    The first chunk with a data event marks the end of prefill; the relay ends with the
    engine's stream, on an engine error (an SSE error event is sent, so an OpenAI client
    raises), or when the client goes away, which cancels the upstream request.
    """

    def __init__(
        self,
        gateway: Gateway,
        upstream: aiohttp.ClientResponse,
        engine: Engine,
        rid: str,
        headers: Mapping[str, str],
        started: float,
        endpoint: str,
        prompt_tokens: int,
        matched: int,
    ) -> None:
        # Not Response.__init__: it would add a content-length of 0 to a body-less response.
        self.status_code = 200
        self.background = None
        self.raw_headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()]
        self.matched = matched
        self.gateway = gateway
        self.upstream = upstream
        self.engine = engine
        self.rid = rid
        self.started = started
        self.endpoint = endpoint
        self.prompt_tokens = prompt_tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        gateway, router = self.gateway, self.gateway.fleet.router
        events = 0
        ttft: float | None = None
        finished = False  # [DONE] was relayed
        outcome = "done"
        try:
            await send(
                {"type": "http.response.start", "status": 200, "headers": self.raw_headers}
            )
            async with anyio.create_task_group() as group:

                async def watch() -> None:
                    while (await receive())["type"] != "http.disconnect":
                        pass
                    nonlocal outcome
                    # A client that leaves once it has [DONE] had the whole answer.
                    outcome = "done" if finished else "disconnect"
                    group.cancel_scope.cancel()

                group.start_soon(watch)
                try:
                    async for chunk in self.upstream.content.iter_any():
                        found = chunk.count(b"data:")
                        if found:
                            if ttft is None:
                                ttft = time.perf_counter() - self.started
                                with contextlib.suppress(UnknownRequestError):
                                    router.prefill_done(self.rid)
                                gateway.metrics.ttft.labels(self.endpoint).observe(ttft)
                            done = chunk.count(b"data: [DONE]")
                            events += found - done
                            finished = finished or bool(done)
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                except MID_STREAM_ERRORS as exc:
                    outcome = "upstream_error"
                    gateway.fleet.failed(self.engine, "read")
                    error = {
                        "error": {
                            "message": f"engine {self.engine.spec.name} failed mid-stream: "
                            f"{exc!r}",
                            "type": "upstream_error",
                            "code": 502,
                        }
                    }
                    data = b"data: " + json.dumps(error).encode() + b"\n\n"
                    await send({"type": "http.response.body", "body": data, "more_body": True})
                except OSError:  # the client's socket went away under a send
                    outcome = "done" if finished else "disconnect"
                if outcome != "disconnect":
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                group.cancel_scope.cancel()
        except OSError:
            outcome = "done" if finished else "disconnect"
        finally:
            if outcome == "done":
                self.upstream.release()  # its connection goes back to the pool
            else:
                self.upstream.close()  # a client gone: closing cancels the engine's work
            if outcome == "disconnect":
                gateway.metrics.disconnects.inc()
            gateway._finish(self.rid, events)
            status = 200 if outcome == "done" else (499 if outcome == "disconnect" else 502)
            gateway._count(self.endpoint, self.engine, status, self.started)
            gateway._log(
                self.rid,
                self.endpoint,
                self.engine,
                self.matched,
                self.prompt_tokens,
                status,
                self.started,
                ttft,
                outcome=outcome,
            )


def create_app(config: GatewayConfig, *, tokenizer: Tokenizer | None = None) -> Starlette:
    """The gateway's ASGI app for ``config`` (``app.state.gateway`` is its :class:`Gateway`).

    Examples
    --------
    >>> from radixmeta.gateway import GatewayConfig, WorkerSpec, create_app
    >>> app = create_app(GatewayConfig([WorkerSpec("http://127.0.0.1:8001")]))
    >>> sorted(e.spec.name for e in app.state.gateway.fleet.engines.values())
    ['http://127.0.0.1:8001']
    >>> import asyncio; asyncio.run(app.state.gateway.aclose())
    """
    return Gateway(config, tokenizer=tokenizer).app
