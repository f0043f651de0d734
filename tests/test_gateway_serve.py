"""The gateway with real parts: stand-in engines as processes, uvicorn, httpx and openai.

One fleet for the module (two event-publishing stand-ins behind one gateway), so the
set stays quick; each test leaves the fleet as it found it (nothing in flight).
"""

from __future__ import annotations

import asyncio
from collections import Counter

import httpx
import pytest

pytest.importorskip("uvicorn", reason="the gateway extra (uvicorn) is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")

from _gateway import ServedGateway, Standin, config, wait_for  # noqa: E402

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]

PREFIX = "You are a careful assistant. Answer briefly and cite the rule you used. " * 30


@pytest.fixture(scope="module")
def fleet():
    with (
        Standin(model="m") as a, Standin(model="m") as b,
        # Long upstream timeouts: the burst below queues 1,000 requests on two engines
        # (slow ones under RADIXMETA_IMPLEMENTATION=python, on a loaded machine), and the
        # gateway's event loop shares this process's GIL with the 1,000 httpx requests: at
        # load average 10 its connects to the engines were noticed after the default 2 s.
        ServedGateway(config(a.spec(), b.spec(), request_timeout=120.0,
                             connect_timeout=30.0)) as served,
    ):
        wait_for(lambda: served.gateway.fleet.up_count == 2)
        yield served, (a, b)


@pytest.fixture
def gw(fleet):
    served, _engines = fleet
    yield served
    wait_for(lambda: served.router.in_flight == 0)


def test_completion_passes_the_engine_answer_through(gw, fleet):
    r = httpx.post(gw.url + "/v1/completions", json={"prompt": "hello", "max_tokens": 3})
    assert r.status_code == 200
    body = r.json()
    assert body["object"] == "text_completion" and body["choices"][0]["text"] == " t0 t1 t2"
    assert body["usage"]["completion_tokens"] == 3
    names = {e.url for e in fleet[1]}
    assert r.headers["x-radixmeta-worker"] in names
    assert int(r.headers["x-radixmeta-matched"]) >= 0


def test_requests_sharing_a_prefix_follow_the_engine_that_holds_it(gw):
    """Exact routing: the engine's events report the prefix, the next request matches it."""
    first = httpx.post(
        gw.url + "/v1/completions", json={"prompt": PREFIX + "one", "max_tokens": 1}
    )
    worker = first.headers["x-radixmeta-worker"]
    engine = gw.gateway.fleet.find(worker)
    # The engine's events reach the router's tree (not the router's own marks: those
    # were released when the request finished).
    wait_for(lambda: gw.router.tree.held_tokens(engine.workers[0]) >= len(PREFIX) - 4)
    second = httpx.post(
        gw.url + "/v1/completions", json={"prompt": PREFIX + "two", "max_tokens": 1}
    )
    assert second.headers["x-radixmeta-worker"] == worker
    matched = int(second.headers["x-radixmeta-matched"])
    assert len(PREFIX) - 4 <= matched <= len(PREFIX) + 4
    # The engine itself found it cached.
    assert second.json()["usage"]["prompt_tokens_details"]["cached_tokens"] == matched


def test_openai_client_chat_streams_token_by_token(gw):
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    try:
        stream = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
        )
        pieces = [c.choices[0].delta.content for c in stream if c.choices]
    finally:
        client.close()
    assert pieces == [" t0", " t1", " t2", " t3"]


def test_openai_client_completions_and_chat_without_streaming(gw):
    client = openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0, timeout=10)
    try:
        done = client.completions.create(model="m", prompt="abc", max_tokens=2)
        chat = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
        models = client.models.list()
    finally:
        client.close()
    assert done.choices[0].text == " t0 t1"
    assert chat.choices[0].message.content == " t0 t1"
    assert [m.id for m in models.data] == ["m"]


def test_stream_is_relayed_as_the_engine_writes_it(gw, fleet):
    """The first chunk reaches the client long before the engine has finished."""
    for engine in fleet[1]:
        engine.control(token_interval=0.2)
    try:
        with httpx.stream(
            "POST",
            gw.url + "/v1/completions",
            json={"prompt": "slow", "max_tokens": 10, "stream": True},
            timeout=10,
        ) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            chunks = r.iter_raw()
            first = next(chunks)
            assert first.startswith(b"data: ")
            # 10 tokens at 0.2 s: the rest is still being generated upstream.
            name = r.headers["x-radixmeta-worker"]
            assert gw.gateway.fleet.find(name) is not None
            assert gw.router.in_flight == 1
            rest = b"".join(chunks)
    finally:
        for engine in fleet[1]:
            engine.control(token_interval=0.0)
    assert rest.endswith(b"data: [DONE]\n\n")
    assert (first + rest).count(b"data: ") == 11


def test_client_disconnect_cancels_the_upstream_request(gw, fleet):
    for engine in fleet[1]:
        engine.control(token_interval=0.1)
    registry = gw.gateway.metrics.registry
    disconnects = registry.get_sample_value("radixmeta_gateway_client_disconnects_total")
    try:
        before = {e.url: e.stats()["cancelled"] for e in fleet[1]}
        with httpx.stream(
            "POST",
            gw.url + "/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 100,
                  "stream": True},
            timeout=10,
        ) as r:
            name = r.headers["x-radixmeta-worker"]
            next(r.iter_raw())  # one token, then the client goes away
        engine = next(e for e in fleet[1] if e.url == name)
        wait_for(lambda: engine.stats()["cancelled"] > before[name], timeout=10)
        wait_for(lambda: gw.router.in_flight == 0)
        assert engine.stats()["running"] == 0
    finally:
        for engine in fleet[1]:
            engine.control(token_interval=0.0)
    after = registry.get_sample_value("radixmeta_gateway_client_disconnects_total")
    assert after == disconnects + 1
    assert "radixmeta_gateway_client_disconnects_total" in httpx.get(gw.url + "/metrics").text


@pytest.mark.parametrize(
    ("path", "body", "needle"),
    [
        ("/v1/completions", b"{not json", "malformed"),
        ("/v1/completions", b"[1, 2]", "JSON object"),
        ("/v1/completions", b'{"max_tokens": 3}', "prompt"),
        ("/v1/completions", b'{"prompt": "a", "stream": "yes"}', "stream"),
        ("/v1/completions", b'{"prompt": [1, -2]}', "token ids"),
        ("/v1/chat/completions", b'{"messages": []}', "messages"),
        ("/v1/chat/completions", b'{"messages": [{"content": "no role"}]}', "role"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": 5}]}', "content"),
        ("/v1/completions", b'{"prompt": "a", "cache_salt": 7}', "cache_salt"),
    ],
)
def test_malformed_bodies_get_400_json(gw, path, body, needle):
    r = httpx.post(gw.url + path, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and needle in error["message"]
    assert gw.router.in_flight == 0


def test_health_models_and_metrics(gw):
    health = httpx.get(gw.url + "/health")
    assert health.status_code == 200 and health.json()["engines_up"] == 2
    models = httpx.get(gw.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["m"]
    httpx.post(gw.url + "/v1/completions", json={"prompt": "count me", "max_tokens": 1})
    text = httpx.get(gw.url + "/metrics").text
    for name in (
        "radixmeta_gateway_requests_total{",
        "radixmeta_gateway_request_seconds_bucket{",
        "radixmeta_gateway_engine_up{",
        "radixmeta_router_dispatches_total{",
        "radixmeta_router_held_tokens{",
        "radixmeta_router_engine_kv_usage{",  # scraped from the engines' /metrics
    ):
        assert name in text, name


def test_engine_loads_are_scraped_into_the_router(gw, fleet):
    engine = gw.gateway.fleet.find(fleet[1][0].url)
    wait_for(lambda: gw.router.load(engine.workers[0]).reported is not None, timeout=5)
    reported = gw.router.load(engine.workers[0]).reported
    assert reported.queue_length == 0 and 0.0 <= reported.kv_usage <= 1.0


# 10-15 s here, most of it httpx's (the client shares this process, and its GIL, with the
# gateway); the bound leaves room for a machine loaded four times over.
@pytest.mark.timeout(180)
def test_a_burst_of_1000_concurrent_requests(gw, fleet):
    before = sum(e.stats()["requests"] for e in fleet[1])

    async def burst():
        limits = httpx.Limits(max_connections=1000)
        async with httpx.AsyncClient(limits=limits, timeout=150) as client:
            async def one(i):
                body = {"prompt": f"{PREFIX[:200]} burst {i % 37}", "max_tokens": 2}
                if i % 2:
                    body["stream"] = True
                r = await client.post(gw.url + "/v1/completions", json=body)
                return r.status_code, r.headers.get("x-radixmeta-worker")

            return await asyncio.gather(*(one(i) for i in range(1000)))

    results = asyncio.run(burst())
    statuses = Counter(s for s, _ in results)
    errors = [line for line in httpx.get(gw.url + "/metrics").text.splitlines()
              if line.startswith("radixmeta_gateway_upstream_errors_total{")]
    assert statuses == {200: 1000}, (statuses, errors)
    assert {w for _, w in results} <= {e.url for e in fleet[1]}
    wait_for(lambda: gw.router.in_flight == 0)
    assert sum(e.stats()["requests"] for e in fleet[1]) - before == 1000
    assert sum(w["requests"] for w in gw.router.metrics()["workers"]) == 0
