#!/usr/bin/env python3
"""Issue 18's two time bounds on the event path, measured on loopback ZeroMQ.

Run: ``python bench/event_path.py`` (``--quick`` for fewer samples, ``--json out.json``
to keep every number). Not part of the test suite (tests/test_event_path.py checks the
same paths for hangs only, with bounds of seconds).

* ``replay``: ``Router.replay(max_seconds=B)`` returns within B + 10 ms. A router follows
  two native workers; w0's replay socket is a port nothing listens on and w0 has a gap,
  so a repair waits on that socket for the whole ``--replay-timeout``, while 50,000 of
  w1's records (``--records``, below the replayer's ``max_pending``) wait to be applied.
  Each call is timed until w1's records are all in, for B = 1, 10 and 50 ms; the figure
  is the overshoot, the call's time past B.
* ``listen``: in ``radixmeta listen``'s loop (``radixmeta.cli._loop``, run in a thread
  of this process on a real ``FleetSubscription``), a healthy worker's batches are
  applied within 50 ms of publication with three workers unreachable (nothing listens
  on their live or replay ports: each probe of the quiet fleet waits on them). The
  healthy worker publishes a batch every 20 to 250 ms (so the fleet is quiet between
  and the loop probes); a batch's latency is from just before ``publish`` to when this
  thread, polling every 0.2 ms, sees it applied (an upper bound). The same with no
  worker down is the baseline.

Tables print medians and tails in milliseconds; the JSON has every sample's summary.
Numbers from a shared 2-core VM are noisy: the tails there include other processes
holding both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]  # the checkout's radixmeta, tests/_ports

from _ports import free_port_block  # noqa: E402

from radixmeta import EventLog, RadixCache, Router  # noqa: E402
from radixmeta.cli import _loop  # noqa: E402
from radixmeta.events import Stored  # noqa: E402
from radixmeta.events.subscription import FleetSubscription, WorkerEndpoint  # noqa: E402
from radixmeta.transport import ZmqPublisher  # noqa: E402
from radixmeta.wire import native  # noqa: E402

PAGE = 4


def tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


def quantiles(samples: list[float]) -> dict[str, float]:
    """Median, p90, p99 and max of ``samples`` (seconds), in milliseconds."""
    ordered = sorted(samples)

    def at(q: float) -> float:
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"n": len(ordered), "median": 1000 * statistics.median(ordered), "p90": at(0.90),
            "p99": at(0.99), "max": 1000 * ordered[-1]}


# -- replay(max_seconds=B) --------------------------------------------------------------------
def replay_bound(budgets: list[float], records: int, replay_timeout: float) -> list[dict[str, Any]]:
    """Per budget B: the overshoot of each ``replay(max_seconds=B)`` past B."""
    rows = []
    for budget in budgets:
        ports = free_port_block(4)
        router = Router(PAGE)
        try:
            router.subscribe(
                [WorkerEndpoint("w0", tcp(ports), tcp(ports + 1)),  # nothing listens there
                 WorkerEndpoint("w1", tcp(ports + 2), tcp(ports + 3))],
                codec="native",
                replay_timeout=replay_timeout,
            )
            # A gap on w0 (seq 1 to 4 never came): its repair waits on the dead socket.
            router.submit([Stored("w0", 0, 0, key=np.arange(4, dtype=np.uint32)),
                           Stored("w0", 0, 5, key=np.arange(8, dtype=np.uint32), start=4)])
            router.replay(max_seconds=0.05)
            # Then w1's records, one batch each: a prompt of its own (8 tokens) a record.
            router.submit([
                Stored("w1", 0, s, key=np.full(8, s, dtype=np.uint32)) for s in range(records)
            ])
            overshoot, calls, applied = [], 0, 0
            started = time.monotonic()
            while applied < records and time.monotonic() - started < 60:
                t0 = time.perf_counter()
                stats = router.replay(max_seconds=budget)
                elapsed = time.perf_counter() - t0
                overshoot.append(max(0.0, elapsed - budget))
                calls += 1
                applied = router.replayer.worker_stats("w1").applied
            repairing = router.health()["workers"][0]["repairing"]
        finally:
            router.close()
        q = quantiles(overshoot)
        rows.append({"budget_ms": 1000 * budget, "calls": calls, "applied": applied,
                     "w0_repairing": repairing, "overshoot_ms": q,
                     "within_10ms": sum(o <= 0.010 for o in overshoot) / len(overshoot),
                     "last_stats_applied": stats.applied})
    return rows


# -- listen with workers down -----------------------------------------------------------------
def listen_latency(down: int, batches: int, replay_timeout: float,
                   probe_interval: float) -> dict[str, Any]:
    """Publication-to-applied latency of a healthy worker's batches in listen's loop,
    with ``down`` workers whose live and replay ports nothing listens on."""
    ports = free_port_block(2 + 2 * down)
    log = EventLog(worker="w0", form="path")
    cache = RadixCache(PAGE, event_log=log)
    pub = ZmqPublisher(tcp(ports), replay_endpoint=tcp(ports + 1), bind=True)
    workers = [WorkerEndpoint("w0", tcp(ports), tcp(ports + 1))]
    workers += [WorkerEndpoint(f"down{k}", tcp(ports + 2 + 2 * k), tcp(ports + 3 + 2 * k))
                for k in range(down)]
    args = SimpleNamespace(no_table=True, probe_interval=probe_interval, exit_after_idle=None,
                           codec="native",
                           replay_timeout=replay_timeout, block_size=PAGE)
    stop = threading.Event()
    latencies: list[float] = []
    rng = np.random.default_rng(18)
    with FleetSubscription(workers, codec="native", block_size=PAGE,
                           replay_timeout=replay_timeout) as subscription:
        probes = [0]  # probes the loop sent (each waits on the down workers' sockets)
        probe = subscription.probe

        def counted() -> int:
            sent = probe()
            probes[0] += sent
            return sent

        subscription.probe = counted  # type: ignore[method-assign]
        loop = threading.Thread(target=_loop, args=(subscription, args, stop), daemon=True)
        loop.start()
        try:
            replayer = subscription.replayer
            if not pub.wait_subscribers(1, timeout=10.0):
                msg = "the subscription never connected"
                raise RuntimeError(msg)
            seen = -1
            for b in range(batches + 5):  # the first five warm the connection up
                before = replayer.worker_stats("w0").applied
                cache.insert([int(t) for t in rng.integers(0, 1000, 8 + 4 * (b % 6))])
                records = log.read(after=seen)
                seen = records[-1].seq
                t0 = time.perf_counter()
                pub.publish(native.encode_batch(records, worker="w0", dp_rank=0))
                deadline = t0 + 10.0
                while replayer.worker_stats("w0").applied == before:
                    if time.perf_counter() > deadline:
                        msg = f"batch {b} was never applied"
                        raise RuntimeError(msg)
                    time.sleep(0.0002)
                if b >= 5:
                    latencies.append(time.perf_counter() - t0)
                time.sleep(float(rng.uniform(0.020, 0.250)))
        finally:
            stop.set()
            loop.join(3 * replay_timeout + 5)
            pub.close()
    q = quantiles(latencies)
    return {"down": down, "latency_ms": q, "probes": probes[0],
            "within_50ms": sum(s <= 0.050 for s in latencies) / len(latencies)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="fewer records and batches")
    parser.add_argument("--batches", type=int, default=300)
    # Below the replayer's max_pending (65,536), past which records are dropped for a repair.
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--replay-timeout", type=float, default=1.0)
    parser.add_argument("--probe-interval", type=float, default=1.0)
    parser.add_argument("--json", metavar="OUT", help="write every number here")
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.records = 60, 20_000

    rows = replay_bound([0.001, 0.010, 0.050], args.records, args.replay_timeout)
    print(f"replay(max_seconds=B), a repair waiting on a dead replay socket, {args.records:,} "
          "records\nof another worker to apply; the call's time past B (ms)")
    print(f"{'B ms':>6}{'calls':>8}{'median':>9}{'p90':>8}{'p99':>8}{'max':>8}"
          f"{'<= 10 ms':>10}{'repairing':>11}")
    for r in rows:
        o = r["overshoot_ms"]
        print(f"{r['budget_ms']:>6g}{r['calls']:>8,}{o['median']:>9.2f}{o['p90']:>8.2f}"
              f"{o['p99']:>8.2f}{o['max']:>8.2f}{100 * r['within_10ms']:>9.1f}%"
              f"{r['w0_repairing']!s:>11}")

    listen = [listen_latency(down, args.batches, args.replay_timeout, args.probe_interval)
              for down in (0, 3)]
    print(f"\nlisten's loop: a healthy worker's batch, publication to applied (ms), "
          f"{args.batches}\nbatches 20-250 ms apart; probe every {args.probe_interval:g} s, "
          f"replay timeout {args.replay_timeout:g} s")
    print(f"{'down':>5}{'median':>9}{'p90':>8}{'p99':>8}{'max':>8}{'<= 50 ms':>10}"
          f"{'probes':>8}")
    for r in listen:
        q = r["latency_ms"]
        print(f"{r['down']:>5}{q['median']:>9.2f}{q['p90']:>8.2f}{q['p99']:>8.2f}"
              f"{q['max']:>8.2f}{100 * r['within_50ms']:>9.1f}%{r['probes']:>8}")
    if args.json:
        meta = {"platform": platform.platform(), "python": sys.version.split()[0],
                "cpus": os.cpu_count(), "load": os.getloadavg()}
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "replay": rows, "listen": listen}, f, indent=1,
                      allow_nan=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
