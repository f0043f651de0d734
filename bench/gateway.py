"""radixmeta serve beside SMG and vllm-router, on the same stand-in fleet and client load.

Three measurements, each printed as a table and written to JSON (``--json-out``):

* **routing**: 4 and 8 stand-in engines (``radixmeta.gateway.standin``: a real
  RadixCache per engine, vLLM KV events, prefill time from
  ``radixmeta.policies.costs``) behind each gateway, with two client loads replayed over
  HTTP as streamed completions: the Mooncake conversation trace (its first
  ``--trace-requests`` requests; each hash id becomes a block of ``--block-chars``
  characters, so prompts are 512 / block-chars times shorter than the trace's tokens;
  arrivals compressed to ``--rate`` requests/s) and ``gsp`` (generated shared-prefix
  groups, as SGLang's bench_serving). Each runs twice: with caches that hold the
  working set ("roomy") and with caches a fraction of it ("evicting"). Measured: the
  engines' own hit rate (cached / prompt tokens, from their caches), and the client's
  time to first token and end-to-end latency, p50 and p99.
* **overhead**: tiny non-streaming requests at a fixed 200 requests/s (open loop) through
  each gateway and straight to the engines (round robin): the latency each gateway adds.
* **throughput**: tiny non-streaming requests from 64 connections (closed loop) for a
  few seconds: the most requests per second each gateway passes on this machine.

Every process (engines, gateways) runs on this machine's 2 cores together with the load
client, and the machine is shared: compare gateways within one run, and repeat.

    python bench/gateway.py                      # everything (about 15 minutes)
    python bench/gateway.py --quick              # 4 engines, fewer requests
    python bench/gateway.py --only overhead throughput --json-out gw.json

SMG (``pip install smg==1.13.0``) and vllm-router (``pip install vllm-router==0.1.17``)
are used when their console scripts are on PATH, and reported missing otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

from _http import Pool  # noqa: E402
from _ports import free_port_block  # noqa: E402

TRACE = ROOT.parent.parent / "shared" / "data" / "mooncake" / "conversation_trace.jsonl"
if not TRACE.exists():
    TRACE = Path("/work/shared/data/mooncake/conversation_trace.jsonl")
PAGE = 16  # the engines' block size (characters: the stand-ins tokenize by UTF-8 bytes)
MODEL = "m"


# -- workloads -------------------------------------------------------------------------------
@dataclass
class Item:
    arrival: float
    prompt: str
    output: int


def mooncake(requests: int, block_chars: int, rate: float) -> tuple[list[Item], int]:
    """The trace's first requests as text prompts; returns them and the distinct chars."""
    ids: dict[int, int] = {}
    rows = []
    with TRACE.open() as f:
        for line in f:
            if len(rows) >= requests:
                break
            r = json.loads(line)
            rows.append(r)
    first, last = rows[0]["timestamp"], rows[-1]["timestamp"]
    stretch = (len(rows) / rate) / max(1e-9, (last - first) / 1000.0)
    items = []
    for r in rows:
        blocks = []
        for h in r["hash_ids"]:
            d = ids.setdefault(h, len(ids))
            blocks.append((f"{d:07x}|" * (block_chars // 8 + 1))[:block_chars])
        # The trace's last block may be partial: cut as the tokens are.
        chars = max(1, r["input_length"] * block_chars // 512)
        items.append(Item((r["timestamp"] - first) / 1000.0 * stretch, "".join(blocks)[:chars],
                          min(4, max(1, r["output_length"]))))
    return items, len(ids) * block_chars


def gsp(groups: int, per_group: int, system: int, question: int, rate: float,
        seed: int = 0) -> tuple[list[Item], int]:
    """Generated shared-prefix groups as text: each group's prompts share a system prompt."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    systems = ["".join(rng.choices(letters, k=system)) for _ in range(groups)]
    prompts = [s + "".join(rng.choices(letters, k=question)) for s in systems
               for _ in range(per_group)]
    rng.shuffle(prompts)
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(prompts))
    arrivals = np.concatenate(([0.0], np.cumsum(gaps)[:-1]))
    items = [Item(float(t), p, 4) for t, p in zip(arrivals, prompts, strict=True)]
    return items, groups * system + len(prompts) * question


# -- processes -------------------------------------------------------------------------------
def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}


def _wait(ok: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            msg = f"{what} did not come up within {timeout} s"
            raise RuntimeError(msg)
        time.sleep(0.1)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


@dataclass
class Engine:
    url: str
    events: str
    replay: str
    process: subprocess.Popen[bytes]

    def stats(self) -> dict[str, Any]:
        return httpx.get(self.url + "/standin/stats", timeout=10).json()  # type: ignore[no-any-return]


def _engine(capacity: int, time_scale: float, token_interval: float) -> Engine:
    """One stand-in on free ports, up and warm; started again elsewhere if its ports were
    taken meanwhile (the machine is shared: free when probed is not free when bound)."""
    for _ in range(3):
        base = free_port_block(3)
        url = f"http://127.0.0.1:{base}"
        events, replay = f"tcp://127.0.0.1:{base + 1}", f"tcp://127.0.0.1:{base + 2}"
        args = [sys.executable, "-m", "radixmeta.gateway.standin", "--port", str(base),
                "--model", MODEL, "--page-size", str(PAGE), "--capacity", str(capacity),
                "--events", events, "--replay", replay, "--time-scale", str(time_scale),
                "--token-interval", str(token_interval)]
        process = subprocess.Popen(args, env=_env(), stderr=subprocess.DEVNULL)
        engine = Engine(url, events, replay, process)
        try:
            _wait(lambda p=process, u=url: p.poll() is not None or _answers(u + "/health"),
                  60, "a stand-in engine")
        except BaseException:
            process.kill()
            raise
        if process.poll() is not None:
            continue  # it could not bind: try other ports
        # An engine's first request pays its process's first-use costs (tens of ms):
        # paid here, for every gateway alike (SMG's registration would pay it anyway).
        httpx.post(url + "/v1/completions", timeout=10,
                   json={"model": MODEL, "prompt": "warm up the engine", "max_tokens": 1,
                         "stream": True}).raise_for_status()
        return engine
    msg = "a stand-in engine exited three times at start"
    raise RuntimeError(msg)


@dataclass
class Fleet:
    engines: list[Engine] = field(default_factory=list)

    @classmethod
    def start(cls, n: int, capacity: int, time_scale: float, token_interval: float) -> Fleet:
        fleet = cls()
        try:
            for _ in range(n):
                fleet.engines.append(_engine(capacity, time_scale, token_interval))
        except BaseException:
            fleet.stop()
            raise
        return fleet

    def totals(self) -> tuple[int, int]:
        stats = [e.stats() for e in self.engines]
        return sum(s["prompt_tokens"] for s in stats), sum(s["cached_tokens"] for s in stats)

    def stop(self) -> None:
        for e in self.engines:
            e.process.terminate()
        for e in self.engines:
            try:
                e.process.wait(10)
            except subprocess.TimeoutExpired:
                e.process.kill()


@dataclass
class Gateway:
    name: str
    url: str
    process: subprocess.Popen[bytes] | None

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


GATEWAYS = ("radixmeta", "smg", "vllm-router")


def start_gateway(name: str, fleet: Fleet) -> Gateway:
    port = free_port_block(2)
    url = f"http://127.0.0.1:{port}"
    urls = [e.url for e in fleet.engines]
    log = open(os.devnull, "wb")  # noqa: SIM115 - the process owns it
    if name.startswith("radixmeta"):
        policy = name.partition(":")[2] or "default"
        args = [sys.executable, "-m", "radixmeta", "serve", "--port", str(port),
                "--page-size", str(PAGE), "--log-level", "warning", "--policy", policy]
        for e in fleet.engines:
            args += ["--worker", f"{e.url},events={e.events},replay={e.replay}"]
    elif name == "smg":
        args = ["smg", "launch", "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                *urls, "--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(port + 1), "--log-level", "error"]
    elif name == "vllm-router":
        args = ["vllm-router", "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
                *urls, "--policy", "cache_aware", "--prometheus-host", "127.0.0.1",
                "--prometheus-port", str(port + 1), "--log-level", "error"]
    else:
        msg = f"unknown gateway {name!r}: radixmeta[:POLICY], smg or vllm-router"
        raise ValueError(msg)
    process = subprocess.Popen(args, env=_env(), stdout=log, stderr=log)
    gateway = Gateway(name, url, process)
    try:
        # Up when a completion goes through (SMG and vllm-router register workers
        # in the background after their health checks).
        def routes() -> bool:
            if process.poll() is not None:
                msg = f"{name} exited with {process.returncode}"
                raise RuntimeError(msg)
            try:
                # Both paths once (plain and streamed): their first-use costs paid here.
                ok = True
                for stream in (False, True):
                    r = httpx.post(url + "/v1/completions", timeout=2.0,
                                   json={"model": MODEL, "prompt": "warm up", "max_tokens": 1,
                                         "stream": stream})
                    ok = ok and r.status_code == 200
                return ok
            except httpx.HTTPError:
                return False

        _wait(routes, 60, name)
        if not name.startswith("radixmeta"):
            time.sleep(1.0)  # let every worker finish registering
    except BaseException:
        gateway.stop()
        raise
    return gateway


# -- load ------------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def _clean(value: Any) -> Any:
    """``value`` with every NaN as None: the JSON file is strict."""
    if isinstance(value, float) and value != value:
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


async def replay(items: list[Item], url: str | list[str], stream: bool,
                 connections: int = 256) -> dict[str, Any]:
    """Send each item at its arrival time; returns the latencies and the failures."""
    urls = url if isinstance(url, list) else [url]
    pools = [Pool(u, connections) for u in urls]
    ttft: list[float] = []
    total: list[float] = []
    failed = 0
    start = time.perf_counter() + 0.05

    async def one(k: int, item: Item) -> None:
        nonlocal failed
        delay = start + item.arrival - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        body = json.dumps({"model": MODEL, "prompt": item.prompt, "max_tokens": item.output,
                           "stream": stream}).encode()
        sent = time.perf_counter()
        try:
            answer = await pools[k % len(pools)].post("/v1/completions", body)
        except (ConnectionError, OSError, asyncio.IncompleteReadError):
            failed += 1
            return
        if answer.status != 200:
            failed += 1
            return
        lag = sent - (start + item.arrival)  # the client's own lateness
        ttft.append(answer.first + max(0.0, lag))
        total.append(answer.total + max(0.0, lag))

    began = time.perf_counter()
    await asyncio.gather(*(one(k, it) for k, it in enumerate(items)))
    elapsed = time.perf_counter() - began
    for p in pools:
        p.close()
    return {"ttft": ttft, "total": total, "failed": failed, "seconds": elapsed}


async def closed_loop(url: str, seconds: float, connections: int) -> tuple[int, int]:
    pool = Pool(url, connections)
    body = json.dumps({"model": MODEL, "prompt": "a small prompt", "max_tokens": 1}).encode()
    done = failed = 0
    stop = time.perf_counter() + seconds

    async def worker() -> None:
        nonlocal done, failed
        while time.perf_counter() < stop:
            try:
                answer = await pool.post("/v1/completions", body)
                if answer.status == 200:
                    done += 1
                else:
                    failed += 1
            except (ConnectionError, OSError, asyncio.IncompleteReadError):
                failed += 1

    await asyncio.gather(*(worker() for _ in range(connections)))
    pool.close()
    return done, failed


def _run(coro: Any) -> Any:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)


# -- experiments -----------------------------------------------------------------------------
def routing(args: argparse.Namespace, gateways: list[str]) -> list[dict[str, Any]]:
    rows = []
    for n in args.engines:
        loads = {
            "mooncake": mooncake(args.trace_requests, args.block_chars, args.rate * n / 4),
            "gsp": gsp(args.gsp_groups * n // 4, 16, 2048, 128, args.rate * n / 4),
        }
        for workload, (items, distinct) in loads.items():
            for regime in ("roomy", "evicting"):
                # Evicting: each engine holds a fraction of the working set it would see.
                capacity = 10 * distinct if regime == "roomy" else max(
                    4096, int(distinct * args.evict_share / n)
                )
                for name in gateways:
                    fleet = Fleet.start(n, capacity, args.time_scale, 0.002)
                    gateway = None
                    try:
                        gateway = start_gateway(name, fleet)
                        before = fleet.totals()
                        result = _run(replay(items, gateway.url, stream=True))
                        prompt, cached = (a - b for a, b in zip(fleet.totals(), before,
                                                                 strict=True))
                    finally:
                        if gateway is not None:
                            gateway.stop()
                        fleet.stop()
                    row = {
                        "engines": n, "workload": workload, "regime": regime, "gateway": name,
                        "capacity": capacity, "requests": len(items),
                        "failed": result["failed"],
                        "hit_rate": cached / prompt if prompt else 0.0,
                        "ttft_p50_ms": _pct(result["ttft"], 50) * 1e3,
                        "ttft_p99_ms": _pct(result["ttft"], 99) * 1e3,
                        "e2e_p50_ms": _pct(result["total"], 50) * 1e3,
                        "e2e_p99_ms": _pct(result["total"], 99) * 1e3,
                    }
                    rows.append(row)
                    print(_line(row), flush=True)
    return rows


def overhead(args: argparse.Namespace, gateways: list[str]) -> list[dict[str, Any]]:
    rows = []
    fleet = Fleet.start(4, 1 << 20, 0.0, 0.0)
    try:
        rng = np.random.default_rng(1)
        count = int(args.overhead_seconds * 200)
        arrivals = np.arange(count) / 200.0
        items = [Item(float(t), f"tiny {int(rng.integers(1e9))}", 1) for t in arrivals]
        direct = _run(replay(items, [e.url for e in fleet.engines], stream=False, connections=64))
        base50, base99 = _pct(direct["total"], 50), _pct(direct["total"], 99)
        rows.append({"gateway": "direct", "p50_ms": base50 * 1e3, "p99_ms": base99 * 1e3,
                     "added_p50_ms": 0.0, "added_p99_ms": 0.0, "failed": direct["failed"]})
        print(_line(rows[-1]), flush=True)
        for name in gateways:
            gateway = start_gateway(name, fleet)
            try:
                result = _run(replay(items, gateway.url, stream=False, connections=64))
            finally:
                gateway.stop()
            p50, p99 = _pct(result["total"], 50), _pct(result["total"], 99)
            rows.append({"gateway": name, "p50_ms": p50 * 1e3, "p99_ms": p99 * 1e3,
                         "added_p50_ms": (p50 - base50) * 1e3,
                         "added_p99_ms": (p99 - base99) * 1e3, "failed": result["failed"]})
            print(_line(rows[-1]), flush=True)
    finally:
        fleet.stop()
    return rows


def throughput(args: argparse.Namespace, gateways: list[str]) -> list[dict[str, Any]]:
    rows = []
    fleet = Fleet.start(4, 1 << 20, 0.0, 0.0)
    try:
        for name in gateways:
            gateway = start_gateway(name, fleet)
            try:
                done, failed = _run(closed_loop(gateway.url, args.throughput_seconds, 64))
            finally:
                gateway.stop()
            rows.append({"gateway": name, "requests_per_s": done / args.throughput_seconds,
                         "failed": failed})
            print(_line(rows[-1]), flush=True)
    finally:
        fleet.stop()
    return rows


def _line(row: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in row.items())


def _table(rows: list[dict[str, Any]], columns: list[tuple[str, str, str]]) -> str:
    """A plain table (fits 80 columns): (header, key, format) per column."""
    cells = [[h for h, _, _ in columns]]
    for r in rows:
        cells.append([format(r[k], f) if f else str(r[k]) for _, k, f in columns])
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in
                       enumerate(zip(row, widths, strict=True))) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", nargs="+", choices=("routing", "overhead", "throughput"),
                   default=["routing", "overhead", "throughput"])
    p.add_argument("--gateways", nargs="+", default=list(GATEWAYS), metavar="GATEWAY",
                   help="radixmeta (radixmeta:POLICY for another --policy), smg, vllm-router")
    p.add_argument("--engines", nargs="+", type=int, default=[4, 8])
    p.add_argument("--trace-requests", type=int, default=1200)
    p.add_argument("--block-chars", type=int, default=64,
                   help="characters per trace hash id (512 tokens in the trace)")
    p.add_argument("--gsp-groups", type=int, default=24, help="gsp groups for 4 engines")
    p.add_argument("--rate", type=float, default=40.0, help="requests/s for 4 engines")
    p.add_argument("--time-scale", type=float, default=0.2,
                   help="the engines' prefill times are the cost model's times this")
    p.add_argument("--evict-share", type=float, default=0.5,
                   help="evicting regime: the fleet's caches hold this share of the working set")
    p.add_argument("--overhead-seconds", type=float, default=10.0)
    p.add_argument("--throughput-seconds", type=float, default=6.0)
    p.add_argument("--quick", action="store_true", help="4 engines, fewer requests")
    p.add_argument("--json-out", metavar="FILE")
    args = p.parse_args(argv)
    if args.quick:
        args.engines, args.trace_requests, args.gsp_groups = [4], 400, 8
        args.overhead_seconds, args.throughput_seconds = 5.0, 4.0
    gateways = []
    for name in args.gateways:
        if name.startswith("radixmeta") or shutil.which(name):
            gateways.append(name)
        else:
            print(f"{name}: not installed (pip install it to compare); skipped", flush=True)
    load = os.getloadavg()
    print(f"machine: {platform.machine()} {os.cpu_count()} cpus, load {load[0]:.2f}, "
          f"python {platform.python_version()}", flush=True)
    out: dict[str, Any] = {"load_before": load, "args": vars(args), "gateways": gateways}
    if "routing" in args.only:
        out["routing"] = routing(args, gateways)
        print(_table(out["routing"], [
            ("eng", "engines", ""), ("load", "workload", ""), ("cache", "regime", ""),
            ("gateway", "gateway", ""), ("hit", "hit_rate", ".3f"),
            ("ttft50", "ttft_p50_ms", ".0f"), ("ttft99", "ttft_p99_ms", ".0f"),
            ("e2e50", "e2e_p50_ms", ".0f"), ("e2e99", "e2e_p99_ms", ".0f"),
            ("fail", "failed", "")]))
    if "overhead" in args.only:
        out["overhead"] = overhead(args, gateways)
        print(_table(out["overhead"], [
            ("gateway", "gateway", ""), ("p50 ms", "p50_ms", ".2f"), ("p99 ms", "p99_ms", ".2f"),
            ("added p50", "added_p50_ms", ".2f"), ("added p99", "added_p99_ms", ".2f"),
            ("fail", "failed", "")]))
    if "throughput" in args.only:
        out["throughput"] = throughput(args, gateways)
        print(_table(out["throughput"], [
            ("gateway", "gateway", ""), ("req/s", "requests_per_s", ".0f"),
            ("fail", "failed", "")]))
    out["load_after"] = os.getloadavg()
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(_clean(out), f, indent=2, allow_nan=False, default=float)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
