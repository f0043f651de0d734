"""The gateway when things go wrong, with real parts: engines that fail, hang, die, come
and go, events lost and replayed, no engine at all, and keys.

Each test builds its own gateway (under uvicorn, in this process) on stand-in engines
taken from one pool for the module (processes, reset as new for each test; one a test
kills is replaced), and closes what it opened within the test's bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import httpx
import pytest

pytest.importorskip("uvicorn", reason="the gateway extra (uvicorn) is not installed")
openai = pytest.importorskip("openai", reason="the openai client is not installed")

from _gateway import ROOT, ServedGateway, StandinPool, config, wait_for  # noqa: E402
from _ports import free_port_block  # noqa: E402

from radixmeta.gateway import WorkerSpec  # noqa: E402

pytestmark = [pytest.mark.timeout(60), pytest.mark.processes]

LONG = "A shared system prompt that is long enough to be worth routing by. " * 30


@pytest.fixture(scope="module")
def pool():
    with StandinPool() as shared:
        yield shared


@pytest.fixture
def engines(pool):
    """``engines(n)``: n stand-ins from the module's pool, as new; given back after the test."""
    taken = []

    def take(n=1):
        got = [pool.take() for _ in range(n)]
        taken.extend(got)
        return got

    yield take
    for standin in taken:
        pool.give_back(standin)


def _post(url, prompt="hello", **body):
    return httpx.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 2, **body},
                      timeout=15)


def test_an_engine_error_is_passed_through_and_k_of_them_take_it_down(engines):
    [engine] = engines()
    # The breaker stays open 4 s, so the 503 below is not raced by a half-open retry that
    # a loaded machine lets come first (open_seconds is 0.2 s in config()).
    options = {"failures_to_open": 2, "open_seconds": 4.0, "max_open_seconds": 4.0}
    with ServedGateway(config(engine.spec(), **options)) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        engine.control(fail_status=500)
        for _ in range(2):
            r = _post(gw.url)
            assert r.status_code == 500
            assert r.json() == {"error": {"message": "injected failure",
                                          "type": "InternalServerError", "code": 500}}
            assert r.headers["x-radixmeta-worker"] == engine.url
        # Two failures in a row: the breaker is open, no engine is up.
        assert gw.gateway.fleet.up_count == 0
        r = _post(gw.url)
        assert r.status_code == 503
        assert r.json()["error"]["type"] == "service_unavailable"
        assert httpx.get(gw.url + "/health").status_code == 503
        # It recovers: its /health still answers, so the half-open check closes the breaker.
        engine.control(fail_status=None)
        wait_for(lambda: gw.gateway.fleet.up_count == 1, timeout=20)
        assert _post(gw.url).status_code == 200
        text = httpx.get(gw.url + "/metrics").text
        errors = f'upstream_errors_total{{kind="status",worker="{engine.url}"}} 2.0'
        assert "radixmeta_gateway_" + errors in text
        assert gw.router.in_flight == 0


def test_an_engine_killed_mid_stream_ends_the_stream_with_an_error_and_traffic_moves(engines):
    a, b = engines(2)
    with ServedGateway(config(a.spec(), b.spec(), failures_to_open=1)) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 2)
        for e in (a, b):
            e.control(token_interval=0.1)
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, timeout=15)
        try:
            stream = client.completions.create(
                model="m", prompt="tell me a story", max_tokens=100, stream=True
            )
            got = []
            with pytest.raises(openai.APIError, match="failed mid-stream"):
                for chunk in stream:
                    got.append(chunk.choices[0].text)
                    if len(got) == 2:
                        busy = gw.router.load(gw.gateway.fleet.find(a.url).workers[0])
                        victim = a if busy.requests else b
                        victim.kill()
            assert 2 <= len(got) < 100
            survivor = b if victim is a else a
            wait_for(lambda: gw.router.in_flight == 0)
            # Down after one failure (K=1): the next requests go to the survivor. One
            # sent before the breaker saw the death would be retried on it too.
            for _ in range(3):
                r = _post(gw.url)
                assert r.status_code == 200
                assert r.headers["x-radixmeta-worker"] == survivor.url
        finally:
            client.close()


def test_an_engine_that_fails_before_the_first_byte_is_retried_on_another(engines):
    # Health checks only at start: the death below is found by requests alone.
    alive, dead = engines(2)
    with ServedGateway(config(alive.spec(), dead.spec(), health_interval=0)) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 2)
        dead.kill()
        seen = set()
        for i in range(6):
            r = _post(gw.url, prompt=f"retry me {i}")
            assert r.status_code == 200
            seen.add(r.headers["x-radixmeta-worker"])
        assert seen == {alive.url}
        registry = gw.gateway.metrics.registry
        assert registry.get_sample_value("radixmeta_gateway_retries_total") >= 1
        # Three connection failures in a row opened its breaker.
        assert not gw.gateway.fleet.find(dead.url).up
        assert gw.router.in_flight == 0


def test_a_slow_engine_times_out_and_the_request_goes_to_another(engines):
    slow, quick = engines(2)
    cfg = config(slow.spec(), quick.spec(), request_timeout=0.5, failures_to_open=5)
    with ServedGateway(cfg) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 2)
        slow.control(delay=3.0)
        for i in range(4):
            r = _post(gw.url, prompt=f"hurry {i}")
            assert r.status_code == 200
            assert r.headers["x-radixmeta-worker"] == quick.url
        text = httpx.get(gw.url + "/metrics").text
        assert f'kind="timeout",worker="{slow.url}"' in text


def test_a_single_slow_engine_gives_a_502_json_error(engines):
    [slow] = engines()
    with ServedGateway(config(slow.spec(), request_timeout=0.3)) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        slow.control(delay=2.0)
        r = _post(gw.url)
        assert r.status_code == 502
        assert "failed before responding" in r.json()["error"]["message"]
        assert gw.router.in_flight == 0


def test_engines_added_and_removed_at_run_time(engines):
    a, b = engines(2)
    with ServedGateway(config(a.spec())) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        added = httpx.post(gw.url + "/workers", json={"url": b.url, "events": b.events,
                                                       "replay": b.replay, "name": "b"})
        assert added.status_code == 201, added.text
        assert added.json()["name"] == "b" and added.json()["up"] is True
        listed = httpx.get(gw.url + "/workers").json()
        assert [w["name"] for w in listed["workers"]] == [a.url, "b"]
        seen = {_post(gw.url, prompt=f"{i} {LONG}").headers["x-radixmeta-worker"]
                for i in range(8)}
        assert seen == {a.url, "b"}
        # The same engine twice, malformed ones; one that does not answer is taken in, down.
        def add(**kwargs):
            return httpx.post(gw.url + "/workers", **kwargs).status_code

        assert add(json={"url": b.url, "events": b.events}) == 409
        assert add(json={"url": "nope"}) == 400
        assert add(content=b"{") == 400
        assert add(json={"url": "http://127.0.0.1:1", "dp-size": 0}) == 400
        assert add(json={"url": "http://127.0.0.1:1", "name": "silent"}) == 201
        assert not gw.gateway.fleet.find("silent").up
        assert httpx.delete(gw.url + "/workers/silent").status_code == 200
        stream = gw.gateway.fleet.find("b").subscription
        removed = httpx.delete(gw.url + "/workers/b")
        assert removed.status_code == 200 and removed.json()["removed"]["name"] == "b"
        assert httpx.delete(gw.url + "/workers/b").status_code == 404
        seen = {_post(gw.url, prompt=f"{i} {LONG}").headers["x-radixmeta-worker"]
                for i in range(4)}
        assert seen == {a.url}
        assert [w.name for w in gw.router.workers] == [a.url]
        assert stream.subscriber.closed  # its KV-event stream went with it
        # Removed by URL as well.
        assert httpx.delete(gw.url + "/workers/" + a.url).status_code == 200
        assert _post(gw.url).status_code == 503


def test_no_engine_up_gives_503_json():
    port = free_port_block(1)
    with ServedGateway(config(WorkerSpec(f"http://127.0.0.1:{port}"))) as gw:
        health = httpx.get(gw.url + "/health")
        assert health.status_code == 503 and health.json()["engines_up"] == 0
        r = _post(gw.url)
        assert r.status_code == 503
        assert r.json()["error"] == {
            "message": "no engine is up: every worker is down",
            "type": "service_unavailable",
            "code": 503,
        }


def test_api_and_admin_keys(engines):
    [engine] = engines()
    cfg = config(engine.spec(), api_key="data-key", admin_key="admin-key")
    with ServedGateway(cfg) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        assert _post(gw.url).status_code == 401
        wrong = {"authorization": "Bearer nope"}
        assert httpx.post(gw.url + "/v1/completions", json={"prompt": "a"},
                          headers=wrong).status_code == 401
        client = openai.OpenAI(base_url=gw.url + "/v1", api_key="data-key", max_retries=0)
        try:
            assert client.completions.create(model="m", prompt="a", max_tokens=1).choices
            with pytest.raises(openai.AuthenticationError):
                openai.OpenAI(base_url=gw.url + "/v1", api_key="bad", max_retries=0
                              ).models.list()
        finally:
            client.close()
        data = {"authorization": "Bearer data-key"}
        admin = {"authorization": "Bearer admin-key"}
        assert httpx.get(gw.url + "/workers", headers=data).status_code == 401
        assert httpx.get(gw.url + "/workers", headers=admin).status_code == 200
        assert httpx.delete(gw.url + "/workers/x", headers=data).status_code == 401
        # Probes need no key.
        assert httpx.get(gw.url + "/health").status_code == 200
        assert httpx.get(gw.url + "/metrics").status_code == 200


def test_events_lost_before_the_gateway_subscribed_are_replayed(engines):
    """The engine served requests with nobody listening, then went quiet: the router's
    probe of a new subscription finds the tail in the engine's replay buffer, so the
    router holds what the engine holds before any live batch comes, and stays in step."""
    [engine] = engines()
    for i in range(5):
        assert _post(engine.url, prompt=LONG + f"before {i}").status_code == 200
    with ServedGateway(config(engine.spec())) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        worker = gw.gateway.fleet.find(engine.url).workers[0]
        quiet = engine.stats()["cache_tokens"]
        wait_for(lambda: gw.router.tree.held_tokens(worker) == quiet, timeout=10)
        assert gw.router.replayer.stats.replays_requested >= 1
        assert _post(engine.url, prompt="a live batch").status_code == 200  # seq 5
        held = engine.stats()["cache_tokens"]
        wait_for(lambda: gw.router.tree.held_tokens(worker) == held, timeout=10)
        r = _post(gw.url, prompt=LONG + "after")
        assert int(r.headers["x-radixmeta-matched"]) >= len(LONG) - 4


def test_engines_without_events_are_routed_on_the_gateways_model_of_their_caches(engines):
    a, b = engines(2)
    modelled = config(a.spec(exact=False, capacity=100_000), b.spec(exact=False))
    with ServedGateway(modelled) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 2)
        first = _post(gw.url, prompt=LONG + "one")
        second = _post(gw.url, prompt=LONG + "two")
        assert second.headers["x-radixmeta-worker"] == first.headers["x-radixmeta-worker"]
        assert int(second.headers["x-radixmeta-matched"]) >= len(LONG) - 4
        # And the engine agrees: it had the prefix cached.
        cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached == int(second.headers["x-radixmeta-matched"])


def test_a_data_parallel_engine_gets_the_rank_chosen(engines):
    [engine] = engines()
    spec = engine.spec(exact=False, dp_size=2, codec="sglang")
    with ServedGateway(config(spec)) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        assert [(w.name, w.dp_rank) for w in gw.router.workers] == [
            (engine.url, 0), (engine.url, 1)]
        ranks = [_post(gw.url, prompt=f"{i} {LONG}").headers["x-radixmeta-dp-rank"]
                 for i in range(6)]
        assert set(ranks) == {"0", "1"}
        # Each request told the engine its rank twice: the header and the body field.
        hints = engine.stats()["rank_hints"]
        assert hints == {r: 2 * ranks.count(r) for r in set(ranks)}


def test_a_client_gone_before_a_plain_answer_cancels_the_engine_work(engines):
    [engine] = engines()
    with ServedGateway(config(engine.spec())) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        engine.control(delay=3.0)
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(gw.url + "/v1/completions", json={"prompt": "x"}, timeout=0.5)
        wait_for(lambda: engine.stats()["cancelled"] == 1, timeout=10)
        wait_for(lambda: gw.router.in_flight == 0)
        registry = gw.gateway.metrics.registry
        assert registry.get_sample_value("radixmeta_gateway_client_disconnects_total") == 1


def test_engines_with_and_without_events_share_one_router(engines):
    exact, modelled = engines(2)
    with ServedGateway(config(exact.spec(), modelled.spec(exact=False, capacity=2_000))) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 2)
        modes = {w["url"]: w["mode"] for w in httpx.get(gw.url + "/workers").json()["workers"]}
        assert modes == {exact.url: "exact", modelled.url: "approximate"}
        # Each keeps the prompts it was sent: the exact one by its events, the modelled one
        # by the gateway's shadow of its cache.
        by_engine: dict[str, list[str]] = {}
        for i in range(6):
            prompt = f"{i} {LONG}"[:600]
            first = _post(gw.url, prompt=prompt)
            by_engine.setdefault(first.headers["x-radixmeta-worker"], []).append(prompt)
        assert set(by_engine) == {exact.url, modelled.url}
        engine = gw.gateway.fleet.find(exact.url)
        wait_for(lambda: gw.router.tree.held_tokens(engine.workers[0]) > 0)
        for url, prompts in by_engine.items():
            again = _post(gw.url, prompt=prompts[-1] + " again")
            assert again.headers["x-radixmeta-worker"] == url
            assert int(again.headers["x-radixmeta-matched"]) >= 596
        # The modelled engine's model is bounded by its capacity (LRU, as the engine's own).
        shadow = gw.gateway.fleet.find(modelled.url).workers[0]
        assert 0 < gw.router.tree.held_tokens(shadow) <= 2_000


def test_two_gateways_on_one_fleet_converge_on_what_the_engines_hold(engines):
    a, b = engines(2)
    with (
        ServedGateway(config(a.spec(), b.spec())) as one,
        ServedGateway(config(a.spec(), b.spec())) as other,
    ):
        wait_for(lambda: one.gateway.fleet.up_count == other.gateway.fleet.up_count == 2)
        sent = {}
        for i in range(6):  # all through the first gateway
            r = _post(one.url, prompt=f"{i} {LONG}"[:500])
            sent[r.headers["x-radixmeta-worker"]] = True
        assert set(sent) == {a.url, b.url}

        def held(gw):
            return {e.url: gw.router.tree.held_tokens(gw.gateway.fleet.find(e.url).workers[0])
                    for e in (a, b)}

        engines = {e.url: e.stats()["cache_tokens"] for e in (a, b)}
        wait_for(lambda: held(one) == held(other) == engines, timeout=10)
        # So the second gateway routes a follow-up where the first sent its prefix.
        first = _post(one.url, prompt=f"9 {LONG}"[:500])
        engine = next(e for e in (a, b) if e.url == first.headers["x-radixmeta-worker"])
        wait_for(lambda: held(other)[engine.url] == engine.stats()["cache_tokens"])
        again = _post(other.url, prompt=f"9 {LONG}"[:500] + " more")
        assert again.headers["x-radixmeta-worker"] == engine.url
        assert int(again.headers["x-radixmeta-matched"]) >= 496


def test_one_json_log_line_per_request_when_asked(engines, caplog):
    [engine] = engines()
    with ServedGateway(config(engine.spec(), log_requests=True)) as gw:
        wait_for(lambda: gw.gateway.fleet.up_count == 1)
        with caplog.at_level("INFO", logger="radixmeta.gateway.requests"):
            _post(gw.url, prompt="log me")
            with httpx.stream("POST", gw.url + "/v1/completions",
                              json={"prompt": "log me too", "stream": True}) as r:
                r.read()
            wait_for(lambda: len([x for x in caplog.records
                                  if x.name == "radixmeta.gateway.requests"]) == 2)
        lines = [json.loads(x.getMessage()) for x in caplog.records
                 if x.name == "radixmeta.gateway.requests"]
        assert [line["status"] for line in lines] == [200, 200]
        assert lines[0]["worker"] == engine.url and lines[0]["prompt_tokens"] == 6
        assert lines[0]["ttft"] is None and lines[1]["ttft"] > 0
        assert lines[1]["outcome"] == "done"


def _health_of(process, url):
    """``"exited"``, the status of ``url/health``, or None while it does not answer yet."""
    if process.poll() is not None:
        return "exited"
    try:
        return httpx.get(url + "/health", timeout=1).status_code
    except httpx.HTTPError:
        return None


def _serve(*args):
    """``python -m radixmeta serve`` on a free port: (process, url) once it answers."""
    for attempt in range(3):  # a port free when probed may be taken when bound
        port = free_port_block(1)
        process = subprocess.Popen(
            [sys.executable, "-m", "radixmeta", "serve", "--port", str(port), *args],
            stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        url = f"http://127.0.0.1:{port}"
        try:
            state = wait_for(lambda p=process, u=url: _health_of(p, u), timeout=30)
        except BaseException:
            process.kill()
            process.communicate(timeout=15)
            raise
        if state != "exited":
            return process, url
        err = process.communicate(timeout=15)[1]
        assert attempt < 2 and "address already in use" in err, err
    msg = "radixmeta serve found no free port in three tries"
    raise AssertionError(msg)


def test_radixmeta_serve_as_a_process_from_a_workers_file(engines, tmp_path):
    """The console command end to end: engines from a YAML file, the start-up warning of
    byte routing, a routed completion, and a clean exit on SIGTERM."""
    [engine] = engines()
    workers = tmp_path / "workers.yaml"
    workers.write_text(f"workers:\n  - url: {engine.url}\n    events: {engine.events}\n"
                       f"    replay: {engine.replay}\n    name: only\n")
    process, url = _serve("--page-size", "4", "--workers-file", str(workers),
                          "--log-level", "warning")
    try:
        r = _post(url, prompt="from the console")
        assert r.status_code == 200 and r.headers["x-radixmeta-worker"] == "only"
    finally:
        process.terminate()
        err = process.communicate(timeout=15)[1]
    # uvicorn shuts down gracefully, then raises the signal it caught again (as it should:
    # the parent sees how its child ended).
    assert process.returncode == -signal.SIGTERM, err
    assert "Traceback" not in err
    assert "no --tokenizer: routing on UTF-8 bytes" in err
