"""Chaos: a Router following 8 publisher processes that are killed, garbled and paused.

Half the workers publish with radixmeta's ``LogPublisher`` (native codec, snapshots),
half in vLLM's format (``ZmqPublisher`` + ``wire.vllm``, no snapshots). Each child
inserts random shared-prefix prompts into its RadixCache and publishes every few ms;
one batch in 1,000 is garbage, now and then a child pauses for 2-3 s, and one vLLM
worker's replay endpoint is a dead port. Every ``--kill-every`` seconds one child is
killed with SIGKILL and started again on the same ports (its numbering from 0). Four
threads dispatch and finish meanwhile.

At the end the children go quiet, each publishes one last batch, and the bench checks:
the event thread alive and never dead; every worker's view equal to its cache, or
flagged stale (a vLLM worker that lost records keeps no snapshot) and, for a native
worker, rebuilt within 2 s of its last batch; no holds or load left; RSS within 5 %
of the RSS after the warm-up. Prints a table and writes ``--json`` (strict JSON)::

    python bench/chaos.py --seconds 600 --json /tmp/chaos.json

``tests/test_chaos.py`` runs it for 60 s in CI. Numbers are from a shared 2-core VM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import random
import resource
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

PAGE = 4


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# -- the children ----------------------------------------------------------------------------
def publisher(name: str, codec: str, live: str, replay: str, seed: int, conn: Connection) -> None:
    """One worker: insert, publish, garble 1 in 1,000, pause now and then; obey ``conn``."""
    from radixmeta import EventLog, RadixCache
    from radixmeta.events.ingest import engine_batch
    from radixmeta.publishing import LogPublisher
    from radixmeta.transport import ZmqPublisher
    from radixmeta.wire import vllm

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rng = random.Random(seed)
    log = EventLog(worker=name, form="path" if codec == "native" else "blocks")
    cache = RadixCache(PAGE, capacity=4096, event_log=log)
    if codec == "native":
        native_pub = LogPublisher(cache, live, replay_endpoint=replay, bind=True, buffer_steps=64)
        pub = native_pub.publisher
    else:
        pub = ZmqPublisher(live, replay_endpoint=replay, bind=True, buffer_steps=64)
    seen = -1
    busy, batches = True, 0
    conn.send("ready")
    while True:
        if conn.poll(0.004 if busy else 0.05):
            command = conn.recv()
            if command == "quiet":
                busy = False
            elif command == "last":
                cache.insert([rng.randrange(50) for _ in range(12)])
                busy = False
            elif command == "dump":
                conn.send((cache.total_size, [k.tolist() for k, _ in cache.items()]))
                continue
            elif command == "exit":
                break
            if command != "last":
                continue
        elif not busy:
            continue
        else:
            if rng.random() < 0.0005:
                time.sleep(rng.uniform(2.0, 3.0))  # a paused engine
            prefix = [rng.randrange(4)] * 8
            cache.insert([*prefix, *(rng.randrange(50) for _ in range(rng.randrange(4, 24)))])
        batches += 1
        if busy and batches % 1000 == 0:
            pub.publish(b"\x91" * 200 + b"\xc1 garbage")
        if codec == "native":
            native_pub.flush()
        else:
            records = log.read(after=seen)
            if records:
                seen = records[-1].seq
                pub.publish(vllm.encode_batch(engine_batch(list(records), block_size=PAGE)))
    (native_pub if codec == "native" else pub).close()


class Child:
    def __init__(self, ctx: Any, name: str, codec: str, live: str, replay: str) -> None:
        self.ctx, self.name, self.codec, self.live, self.replay = ctx, name, codec, live, replay
        self.starts = 0
        self.start()

    def start(self) -> None:
        self.conn, theirs = self.ctx.Pipe()
        self.proc = self.ctx.Process(
            target=publisher,
            args=(self.name, self.codec, self.live, self.replay, hash((self.name, self.starts)),
                  theirs),
            daemon=True,
        )
        self.proc.start()
        theirs.close()
        assert self.conn.poll(30) and self.conn.recv() == "ready"
        self.starts += 1

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.join(10)
        self.conn.close()

    def ask(self, command: str) -> Any:
        self.conn.send(command)
        return self.conn.recv() if command == "dump" else None

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send("exit")
            self.proc.join(5)
            if self.proc.is_alive():
                self.kill()


# -- the run ---------------------------------------------------------------------------------
def run(seconds: float, kill_every: float, workers: int, seed: int) -> dict[str, Any]:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.path[:0] = [root, os.path.join(root, "tests")]
    from _ports import free_port_block

    from radixmeta import Router
    from radixmeta.events.subscription import WorkerEndpoint

    rng = random.Random(seed)
    ctx = mp.get_context("spawn")
    base, replay_base, dead = free_port_block(workers), free_port_block(workers), free_port_block(1)
    children: list[Child] = []
    router = Router(PAGE, policy="longest_prefix", probe_interval=0.5)
    stop = threading.Event()
    dispatched = [0]
    try:
        for i in range(workers):
            codec = "native" if i % 2 == 0 else "vllm"
            live, replay = f"tcp://127.0.0.1:{base + i}", f"tcp://127.0.0.1:{replay_base + i}"
            children.append(Child(ctx, f"w{i}", codec, live, replay))
        for codec in ("native", "vllm"):
            endpoints = []
            for i, c in enumerate(children):
                if c.codec != codec:
                    continue
                # The last vLLM worker's replay endpoint is a port nothing listens on.
                replay = f"tcp://127.0.0.1:{dead}" if i == workers - 1 else c.replay
                endpoints.append(WorkerEndpoint(c.name, c.live, replay))
            router.subscribe(endpoints, codec=codec, replay_timeout=0.5)
        router.start(interval=0.002)

        def dispatcher(k: int) -> None:
            local = random.Random(k)
            while not stop.is_set():
                prompt = [local.randrange(4)] * 8 + [local.randrange(50) for _ in range(16)]
                d = router.dispatch(prompt)
                time.sleep(local.uniform(0, 0.004))
                router.finish(d.request_id)
                dispatched[0] += 1

        threads = [threading.Thread(target=dispatcher, args=(k,), daemon=True) for k in range(4)]
        for t in threads:
            t.start()
        started = time.monotonic()
        warm = min(10.0, seconds / 4)
        time.sleep(warm)
        rss_start = _rss_kib()
        kills = 0
        next_kill = time.monotonic() + kill_every
        while time.monotonic() - started < seconds:
            time.sleep(0.2)
            if time.monotonic() >= next_kill:
                victim = rng.choice(children)
                victim.kill()
                victim.start()
                kills += 1
                next_kill = time.monotonic() + kill_every
            thread = router.health()["thread"]
            assert thread["state"] != "dead", thread
        stop.set()
        for t in threads:
            t.join(5)
        for c in children:
            c.ask("quiet")
        time.sleep(1.0)
        for c in children:
            c.ask("last")
        last_batch = time.monotonic()
        rows = []
        deadline = last_batch + 2.0
        pending = {c.name: c for c in children}
        truth: dict[str, tuple[int, list[list[int]]]] = {}
        for c in children:
            truth[c.name] = c.ask("dump")
        while pending and time.monotonic() < deadline:
            for name in list(pending):
                if _view_equals(router, name, *truth[name]):
                    del pending[name]
            time.sleep(0.02)
        health = {w["worker"]: w for w in router.health()["workers"]}
        for c in children:
            equal = c.name not in pending
            stats = router.replayer.worker_stats(c.name)
            rows.append({
                "worker": c.name, "codec": c.codec, "starts": c.starts, "equal": equal,
                "stale": health[c.name]["stale"], "restarts": stats.restarts,
                "gaps": stats.gaps, "resyncs": stats.resyncs, "malformed": stats.malformed,
                "applied": stats.applied,
            })
        metrics = router.metrics()
        rss_end = _rss_kib()
        thread = router.health()["thread"]
        return {
            "seconds": seconds, "workers": workers, "kills": kills,
            "dispatched": dispatched[0], "thread": thread, "rows": rows,
            "in_flight": metrics["in_flight"], "holds": metrics["tree"]["holds"],
            "load": sum(w["requests"] for w in metrics["workers"]),
            "rss_kib": [rss_start, rss_end],
            "ok": bool(
                thread["alive"]
                and all(r["equal"] or (r["stale"] and r["codec"] == "vllm") for r in rows)
                and metrics["in_flight"] == 0 and metrics["tree"]["holds"] == 0
                and rss_end <= rss_start * 1.05
            ),
        }
    finally:
        stop.set()
        router.close()
        for c in children:
            c.close()


def _view_equals(router: Any, name: str, total: int, keys: list[list[int]]) -> bool:
    w = router.worker(name)
    if router.tree.held_tokens(w) != total:
        return False
    return all(router.tree.match(k, optimistic=False).length_of(w) == len(k) for k in keys)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--kill-every", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.kill_every, args.workers, args.seed)
    print(f"chaos: {result['seconds']:g} s, {result['workers']} workers, {result['kills']} "
          f"kills, {result['dispatched']} dispatches, thread {result['thread']['state']} "
          f"({result['thread']['errors']} errors)")
    header = ("worker", "codec", "starts", "equal", "stale", "restarts", "gaps", "resyncs",
              "malformed", "applied")
    print(" ".join(f"{h:>9}" for h in header))
    for r in result["rows"]:
        print(" ".join(f"{r[h]!s:>9}" for h in header))
    rss = result["rss_kib"]
    print(f"in flight {result['in_flight']}, holds {result['holds']}, load {result['load']}; "
          f"RSS {rss[0]} -> {rss[1]} KiB ({100 * (rss[1] - rss[0]) / rss[0]:+.1f} %); "
          f"ok: {result['ok']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, allow_nan=False)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
