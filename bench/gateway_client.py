"""The gateway's upstream HTTP client: httpx.AsyncClient against aiohttp.ClientSession.

The gateway relays each request to an engine over a pooled keep-alive client, and its
budget for everything it adds is 1 ms at p50 (issue 19). This bench times the calls the
gateway makes, through both clients, against one stand-in engine
(``radixmeta.gateway.standin`` as a process, prefill and token times zero, so the engine's
own work is small and the same for both):

* **plain**: ``POST /v1/completions`` (non-streaming, 2 tokens), the body read whole;
* **stream**: the same streamed, the body read chunk by chunk as the gateway relays it.

Each is measured sequentially (one request at a time: latency p50/p99, and the client
process's CPU per request) and with ``--concurrency`` requests in flight (requests/s).
A raw asyncio HTTP/1.1 connection (``bench/_http.py``, no client library) gives the floor:
what the engine and the loopback cost without a client; "client ms" is a client's p50
minus the floor's. Rounds alternate the clients (raw, httpx, aiohttp, raw, ...), on the
event loop the gateway runs on (uvloop when installed, as uvicorn[standard] uses), so
drift on this shared machine falls on all of them alike.

    python bench/gateway_client.py                         # 5 rounds of 300 requests
    python bench/gateway_client.py --rounds 3 --requests 200 --json-out client.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

import aiohttp  # noqa: E402
import httpx  # noqa: E402
from _gateway import Standin  # noqa: E402
from _http import Pool  # noqa: E402

PLAIN = json.dumps({"prompt": "hello there", "max_tokens": 2}).encode()
STREAM = json.dumps({"prompt": "hello there", "max_tokens": 2, "stream": True}).encode()
HEADERS = {"content-type": "application/json"}
CLIENTS = ("raw", "httpx", "aiohttp")

Call = Callable[[bytes, bool], Awaitable[int]]


def _httpx_client(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    # As a gateway would configure it: pooled keep-alive, no cap, bytes passed through.
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    client = httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(30.0))

    async def call(body: bytes, stream: bool) -> int:
        request = client.build_request("POST", url + "/v1/completions", content=body,
                                       headers=HEADERS)
        response = await client.send(request, stream=True)
        try:
            size = 0
            if stream:
                async for chunk in response.aiter_raw():
                    size += len(chunk)
            else:
                size = len(await response.aread())
            return size
        finally:
            await response.aclose()

    return call, client.aclose


def _aiohttp_client(url: str) -> tuple[Call, Callable[[], Awaitable[None]]]:
    # As radixmeta/gateway/upstream.py configures it.
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=30.0),
        timeout=aiohttp.ClientTimeout(total=None, connect=5.0, sock_read=30.0),
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept-Encoding"),
    )

    async def call(body: bytes, stream: bool) -> int:
        response = await session.post(url + "/v1/completions", data=body, headers=HEADERS)
        try:
            size = 0
            if stream:
                async for chunk in response.content.iter_any():
                    size += len(chunk)
            else:
                size = len(await response.read())
            return size
        finally:
            response.release()

    return call, session.close


def _raw_client(url: str, concurrency: int) -> tuple[Call, Callable[[], Awaitable[None]]]:
    pool = Pool(url, concurrency)

    async def call(body: bytes, stream: bool) -> int:
        return len((await pool.post("/v1/completions", body)).body)

    async def close() -> None:
        pool.close()

    return call, close


async def _measure(
    url: str, name: str, body: bytes, requests: int, concurrency: int
) -> dict[str, Any]:
    """One round for one client: sequential latencies and CPU, then concurrent req/s."""
    stream = body is STREAM
    factories = {"httpx": _httpx_client, "aiohttp": _aiohttp_client}
    call, close = _raw_client(url, concurrency) if name == "raw" else factories[name](url)
    try:
        for _ in range(20):  # open the connections, warm both sides
            await call(body, stream)
        latencies = np.empty(requests)
        cpu = time.process_time()
        for i in range(requests):
            started = time.perf_counter()
            await call(body, stream)
            latencies[i] = time.perf_counter() - started
        cpu = time.process_time() - cpu
        remaining = requests * 2

        async def worker() -> None:
            nonlocal remaining
            while remaining > 0:
                remaining -= 1
                await call(body, stream)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        rate = requests * 2 / (time.perf_counter() - started)
    finally:
        await close()
    return {
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
        "cpu_ms_per_request": cpu / requests * 1e3,
        "requests_per_s": rate,
    }


async def _run(url: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    rounds: list[dict[str, Any]] = []
    for number in range(args.rounds):
        for mode, body in (("plain", PLAIN), ("stream", STREAM)):
            for name in CLIENTS:
                row = await _measure(url, name, body, args.requests, args.concurrency)
                rounds.append({"round": number, "mode": mode, "client": name, **row})
    return rounds


def _summary(rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per mode and client: the median over rounds of each figure, its range, and the
    client's own p50 (its p50 minus the raw floor's, in the same round)."""
    rows = []
    for mode in ("plain", "stream"):
        floor = {r["round"]: r["p50_ms"] for r in rounds if r["mode"] == mode
                 and r["client"] == "raw"}
        for name in CLIENTS:
            mine = [r for r in rounds if r["mode"] == mode and r["client"] == name]
            row: dict[str, Any] = {"mode": mode, "client": name, "rounds": len(mine)}
            for key in ("p50_ms", "p99_ms", "cpu_ms_per_request", "requests_per_s"):
                values = [r[key] for r in mine]
                row[key] = statistics.median(values)
                row[key + "_range"] = [min(values), max(values)]
            own = [r["p50_ms"] - floor[r["round"]] for r in mine]
            row["client_p50_ms"] = statistics.median(own)
            row["client_p50_ms_range"] = [min(own), max(own)]
            rows.append(row)
    return rows


def _table(rows: list[dict[str, Any]]) -> str:
    head = (f"{'mode':<7}{'client':<9}{'p50 ms':>8}{'p99 ms':>8}{'client ms':>11}"
            f"{'cpu ms/req':>12}{'req/s':>8}  {'client ms range':<15}")
    lines = [head, "-" * len(head)]
    for r in rows:
        low, high = r["client_p50_ms_range"]
        lines.append(
            f"{r['mode']:<7}{r['client']:<9}{r['p50_ms']:>8.3f}{r['p99_ms']:>8.3f}"
            f"{r['client_p50_ms']:>11.3f}{r['cpu_ms_per_request']:>12.3f}"
            f"{r['requests_per_s']:>8.0f}  {low:.3f}-{high:.3f}"
        )
    return "\n".join(lines)



def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=300, help="sequential, per round")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--json-out", type=Path)
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        loop = "asyncio"
        runner: Callable[[Any], Any] = asyncio.run
    else:
        loop = "uvloop"
        runner = uvloop.run
    with Standin(time_scale=0.0, token_interval=0.0) as engine:
        rounds = runner(_run(engine.url, args))
    rows = _summary(rounds)
    print(f"One stand-in engine on 127.0.0.1, event loop {loop}. {args.rounds} rounds of\n"
          f"{args.requests} sequential requests (p50, p99, CPU), then {args.requests * 2} "
          f"at concurrency {args.concurrency}\n(req/s). Medians over rounds; client ms = "
          f"p50 minus the raw floor's p50 that round.")
    print(_table(rows))
    if args.json_out:
        out = {
            "bench": "gateway_client",
            "machine": {"cpus": os.cpu_count(), "load_average": os.getloadavg(),
                        "python": platform.python_version(), "loop": loop,
                        "httpx": httpx.__version__, "aiohttp": aiohttp.__version__},
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "summary": rows,
            "rounds": rounds,
        }
        args.json_out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
