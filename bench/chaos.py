"""Chaos: a Router following 8 publisher processes that are killed, garbled and paused.

Half the workers publish with radixmeta's ``LogPublisher`` (native codec, snapshots),
half in vLLM's format (``ZmqPublisher`` + ``wire.vllm``, no snapshots). Each child
inserts random shared-prefix prompts into its RadixCache and publishes every few ms;
one batch in 1,000 is garbage, now and then a child pauses for 2-3 s, and one vLLM
worker's replay endpoint is a dead port. Every child's live stream goes through a lossy
link (:func:`lossy_link`, real sockets in the child: one batch in ``--drop-every`` never
reaches the router, though the publisher keeps it for replay), and two children's
replay sockets answer slowly through :func:`slow_replay_link` (a native worker's within
the router's replay timeout, a vLLM worker's past it one time in four). Every
``--kill-every`` seconds one child is killed with SIGKILL and started again on the same
ports (its numbering from 0). Four threads dispatch and finish meanwhile.

At the end the children go quiet, each publishes one last batch, and the bench checks:
the event thread alive and never dead; every worker's view equal to its cache, or
flagged stale (a vLLM worker that lost records keeps no snapshot) and, for a native
worker, rebuilt within 2 s of its last batch; no holds or load left; and memory flat.

Memory. RSS is sampled every 15 s after a warm-up (a quarter of the run, at most 60 s:
the trees' pools and the allocators reach the fleet's working set in about a minute),
beside what it is made of (``bench/_memory.py``): glibc's heap in use and freed but
kept, Python's arenas and live blocks, and the router's pending records. What grows
is what the allocators keep after a burst, not what anything holds: on a loaded machine
the router falls behind for a while, libzmq's receive queues and the pending records
fill, and once they drain glibc keeps the freed pages (24.6 -> 51.8 MiB "kept" in a
10-minute run at load 47-56, given back by ``malloc_trim(0)``) and Python keeps 1 MiB
arenas partly empty (17 -> 21 MiB mapped, its live blocks flat at 14.1-14.3 MiB), while
glibc's heap in use stayed at 11.4-11.8 MiB. So the check holds *live* memory (glibc's
heap in use plus Python's live blocks, at the baseline and at the end, the bench's own
end-of-run data dropped first) within 5 %: a leak, glibc's or Python's, fails it as
plainly as RSS would. RSS is reported beside it, untrimmed (maximum and final against
the baseline) and after a trim at the baseline and at the end, so the allocators' share
is in plain sight. Prints tables and writes ``--json`` (strict JSON)::

    python bench/chaos.py --seconds 600 --json /tmp/chaos.json

``tests/test_chaos.py`` runs it for 60 s in CI. Numbers are from a shared 2-core VM.
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import json
import multiprocessing as mp
import os
import random
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import Any

PAGE = 4
REPLAY_TIMEOUT = 0.5
#: Seconds between two memory samples after the warm-up.
SAMPLE_EVERY = 15.0
#: Per slow replay link: the range of its delays (seconds), and the share past the
#: router's replay timeout. The native worker's stays within it (its view must be
#: rebuilt within 2 s at the end); the vLLM worker's times out one time in four.
SLOW = {"native": ((0.1, 0.4), 0.0), "vllm": ((0.1, 0.4), 0.25)}


def _memory_sample(started: float, router: Any, tracer: Any) -> dict[str, Any]:
    """RSS, glibc's heap, Python's arenas and blocks (KiB), the router's pending records
    and, when tracing, Python's traced KiB (see bench/_memory.py)."""
    from _memory import heap_kib, python_kib, rss_kib

    sample: dict[str, Any] = {"t": round(time.monotonic() - started, 1), "rss": rss_kib(),
                              **heap_kib(), **python_kib(), "pending": router.replayer.pending}
    if tracer is not None:
        sample["traced"] = tracer.traced_kib()
        sample["tracing_overhead"] = tracer.overhead_kib()
        sample["rss"] -= sample["tracing_overhead"]  # tracemalloc's own memory is not ours
    return sample


# -- the children ----------------------------------------------------------------------------
def lossy_link(inner: str, outer: str, drop_every: int, seed: int, stop: threading.Event,
               counts: dict[str, int]) -> None:
    """Forward every live batch from the publisher's ``inner`` endpoint to ``outer`` (the
    one the router subscribes to), dropping one in ``drop_every`` at random: a batch
    lost in the network, which the publisher still keeps for replay."""
    import zmq

    rng = random.Random(seed)
    ctx = zmq.Context.instance()
    sub, pub = ctx.socket(zmq.SUB), ctx.socket(zmq.PUB)
    try:
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(inner)
        pub.bind(outer)
        while not stop.is_set():
            if not sub.poll(50):
                continue
            frames = sub.recv_multipart()
            if drop_every and rng.randrange(drop_every) == 0:
                counts["dropped"] += 1
                continue
            pub.send_multipart(frames)
    finally:
        sub.close(linger=0)
        pub.close(linger=0)


def slow_replay_link(inner: str, outer: str, delays: tuple[float, float], late: float,
                     seed: int, stop: threading.Event, counts: dict[str, int]) -> None:
    """A replay endpoint that answers slowly: each request (replay or snapshot) reaching
    ``outer`` waits a random delay in ``delays`` (or, with probability ``late``, past
    the router's replay timeout) before it goes on to the publisher's ``inner`` replay
    socket through a DEALER of its own, whose replies are handed back as they come."""
    import zmq

    rng = random.Random(seed)
    ctx = zmq.Context.instance()
    front = ctx.socket(zmq.ROUTER)
    waiting: list[tuple[float, int, bytes, list[bytes]]] = []  # (due, order, client, frames)
    open_: dict[Any, tuple[bytes, float]] = {}  # DEALER -> (client, opened)
    poller = zmq.Poller()
    order = 0
    try:
        front.bind(outer)
        poller.register(front, zmq.POLLIN)
        while not stop.is_set():
            now = time.monotonic()
            wait = min([50.0] + [max(0.0, (w[0] - now) * 1000) for w in waiting[:1]])
            for sock, _ in poller.poll(wait):
                if sock is front:
                    client, *frames = front.recv_multipart()
                    low, high = delays
                    delay = rng.uniform(low, high)
                    if rng.random() < late:
                        delay = rng.uniform(REPLAY_TIMEOUT + 0.1, 2 * REPLAY_TIMEOUT + 0.5)
                    order += 1
                    heapq.heappush(waiting, (time.monotonic() + delay, order, client, frames))
                    counts["slowed"] += 1
                else:
                    front.send_multipart([open_[sock][0], *sock.recv_multipart()])
            while waiting and waiting[0][0] <= time.monotonic():
                _, _, client, frames = heapq.heappop(waiting)
                dealer = ctx.socket(zmq.DEALER)
                dealer.setsockopt(zmq.LINGER, 0)
                dealer.connect(inner)
                dealer.send_multipart(frames)
                poller.register(dealer, zmq.POLLIN)
                open_[dealer] = (client, time.monotonic())
            for dealer, (_, opened) in list(open_.items()):
                if time.monotonic() - opened > 10.0:  # its client gave up long ago
                    poller.unregister(dealer)
                    dealer.close(linger=0)
                    del open_[dealer]
    finally:
        for dealer in open_:
            dealer.close(linger=0)
        front.close(linger=0)


def publisher(name: str, codec: str, live: str, replay: str, inner: tuple[str, str],
              drop_every: int, slow: bool, seed: int, conn: Connection) -> None:
    """One worker: insert, publish, garble 1 in 1,000, pause now and then; obey ``conn``.

    It publishes on the ``inner`` endpoints; a lossy link forwards its live stream to
    ``live``, and its replay socket is ``replay`` itself or, when ``slow``, behind a
    slow replay link there."""
    from radixmeta import EventLog, RadixCache
    from radixmeta.events.ingest import engine_batch
    from radixmeta.publishing import LogPublisher
    from radixmeta.transport import ZmqPublisher
    from radixmeta.wire import vllm

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    rng = random.Random(seed)
    log = EventLog(worker=name, form="path" if codec == "native" else "blocks")
    cache = RadixCache(PAGE, capacity=4096, event_log=log)
    inner_live, inner_replay = inner
    own_replay = inner_replay if slow else replay
    if codec == "native":
        native_pub = LogPublisher(
            cache, inner_live, replay_endpoint=own_replay, bind=True, buffer_steps=64
        )
        pub = native_pub.publisher
    else:
        pub = ZmqPublisher(inner_live, replay_endpoint=own_replay, bind=True, buffer_steps=64)
    stop = threading.Event()
    counts = {"dropped": 0, "slowed": 0}
    links = [threading.Thread(target=lossy_link,
                              args=(inner_live, live, drop_every, seed, stop, counts))]
    if slow:
        delays, late = SLOW[codec]
        links.append(threading.Thread(
            target=slow_replay_link,
            args=(inner_replay, replay, delays, late, seed + 1, stop, counts),
        ))
    for link in links:
        link.start()
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
            elif command == "counts":
                conn.send(dict(counts))
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
    stop.set()
    for link in links:
        link.join(5)
    (native_pub if codec == "native" else pub).close()


class Child:
    def __init__(self, ctx: Any, name: str, codec: str, live: str, replay: str,
                 inner: tuple[str, str], drop_every: int, slow: bool) -> None:
        self.ctx, self.name, self.codec, self.live, self.replay = ctx, name, codec, live, replay
        self.inner, self.drop_every, self.slow = inner, drop_every, slow
        self.starts = 0
        self.counts = {"dropped": 0, "slowed": 0}  # of the runs before the current one
        self.start()

    def start(self) -> None:
        self.conn, theirs = self.ctx.Pipe()
        self.proc = self.ctx.Process(
            target=publisher,
            args=(self.name, self.codec, self.live, self.replay, self.inner, self.drop_every,
                  self.slow, hash((self.name, self.starts)), theirs),
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
        return self.conn.recv() if command in ("dump", "counts") else None

    def close(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(OSError):
                self.conn.send("exit")
            self.proc.join(5)
            if self.proc.is_alive():
                self.kill()


# -- the run ---------------------------------------------------------------------------------
def run(seconds: float, kill_every: float, workers: int, seed: int,
        drop_every: int = 300, trace_memory: bool = False) -> dict[str, Any]:
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
    sys.path[:0] = [root, os.path.join(root, "tests")]
    from _ports import free_port_block

    from radixmeta import Router
    from radixmeta.events.subscription import WorkerEndpoint

    rng = random.Random(seed)
    ctx = mp.get_context("spawn")
    base, replay_base, dead = free_port_block(workers), free_port_block(workers), free_port_block(1)
    inner_base, inner_replay_base = free_port_block(workers), free_port_block(workers)
    # The two slow replay links: the first native worker after w0, and a vLLM worker
    # other than the last (whose replay endpoint is the dead port).
    slow = {2 % workers, max(1, workers - 3)}
    children: list[Child] = []
    router = Router(PAGE, policy="longest_prefix", probe_interval=0.5)
    stop = threading.Event()
    dispatched = [0]
    try:
        for i in range(workers):
            codec = "native" if i % 2 == 0 else "vllm"
            live, replay = f"tcp://127.0.0.1:{base + i}", f"tcp://127.0.0.1:{replay_base + i}"
            inner = (
                f"tcp://127.0.0.1:{inner_base + i}", f"tcp://127.0.0.1:{inner_replay_base + i}"
            )
            children.append(
                Child(ctx, f"w{i}", codec, live, replay, inner, drop_every, i in slow)
            )
        for codec in ("native", "vllm"):
            endpoints = []
            for i, c in enumerate(children):
                if c.codec != codec:
                    continue
                # The last vLLM worker's replay endpoint is a port nothing listens on.
                replay = f"tcp://127.0.0.1:{dead}" if i == workers - 1 else c.replay
                endpoints.append(WorkerEndpoint(c.name, c.live, replay))
            router.subscribe(endpoints, codec=codec, replay_timeout=REPLAY_TIMEOUT)
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
        # RSS climbs for about the first minute (50.2 MB at 10 s, 53.7 at 70 s in a 300 s
        # run: the trees' pools and the allocator reaching the fleet's working set), then
        # creeps by about 1 MB in 200 s: the flatness check starts after that ramp.
        warm = min(60.0, seconds / 4)
        time.sleep(warm)
        tracer = None
        if trace_memory:
            from _memory import Tracer

            tracer = Tracer()
            tracer.start()
        from _memory import trim

        memory = [_memory_sample(started, router, tracer)]  # its shape tells a leak from a swing
        trim()  # RSS once glibc gave back its free pages: the allocators' share shows
        trimmed_start = _memory_sample(started, router, tracer)
        kills = 0
        next_kill = time.monotonic() + kill_every
        while time.monotonic() - started < seconds:
            time.sleep(0.2)
            if time.monotonic() >= next_kill:
                victim = rng.choice(children)
                with contextlib.suppress(OSError, EOFError):  # what its run did so far
                    for key, value in victim.ask("counts").items():
                        victim.counts[key] += value
                victim.kill()
                victim.start()
                kills += 1
                next_kill = time.monotonic() + kill_every
            thread = router.health()["thread"]
            assert thread["state"] != "dead", thread
            if time.monotonic() - started - memory[-1]["t"] >= SAMPLE_EVERY:
                memory.append(_memory_sample(started, router, tracer))
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
            for key, value in c.ask("counts").items():
                c.counts[key] += value
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
                "applied": stats.applied, "dropped": c.counts["dropped"],
                "slowed": c.counts["slowed"], "slow_replay": c.slow,
            })
        metrics = router.metrics()
        del truth, pending  # the bench's own data: not the router's memory
        memory.append(_memory_sample(started, router, tracer))
        growth = tracer.growth() if tracer is not None else None
        if tracer is not None:
            tracer.stop()
        # What of the heap was only kept: the pages glibc gives back once asked to.
        trim()
        trimmed = _memory_sample(started, router, None)
        rss_start, rss_end = memory[0]["rss"], memory[-1]["rss"]
        held = [trimmed_start["rss"], trimmed["rss"]]
        live = [_live_kib(trimmed_start), _live_kib(trimmed)]
        flat = (live[1] <= live[0] * 1.05 if live[0] is not None and live[1] is not None
                else held[1] <= held[0] * 1.05)  # without glibc's figures: RSS after a trim
        thread = router.health()["thread"]
        return {
            "seconds": seconds, "workers": workers, "kills": kills, "drop_every": drop_every,
            "dispatched": dispatched[0], "thread": thread, "rows": rows,
            "in_flight": metrics["in_flight"], "holds": metrics["tree"]["holds"],
            "load": sum(w["requests"] for w in metrics["workers"]),
            "rss_kib": [rss_start, rss_end], "rss_max_kib": max(m["rss"] for m in memory),
            "memory": memory, "trimmed": [trimmed_start, trimmed], "python_growth": growth,
            "held_kib": held, "live_kib": live,
            "ok": bool(
                thread["alive"]
                and all(r["equal"] or (r["stale"] and r["codec"] == "vllm") for r in rows)
                and metrics["in_flight"] == 0 and metrics["tree"]["holds"] == 0
                and flat
            ),
        }
    finally:
        stop.set()
        router.close()
        for c in children:
            c.close()


def _live_kib(sample: dict[str, Any]) -> int | None:
    """Memory live objects hold: glibc's heap in use plus Python's live blocks (KiB)."""
    if sample["in_use"] is None or sample["py_blocks"] is None:
        return None
    return int(sample["in_use"] + sample["py_blocks"])


def _view_equals(router: Any, name: str, total: int, keys: list[list[int]]) -> bool:
    w = router.worker(name)
    if router.tree.held_tokens(w) != total:
        return False
    return all(router.tree.match(k, optimistic=False).length_of(w) == len(k) for k in keys)


def _print_memory(result: dict[str, Any]) -> None:
    """The memory samples as a table (MiB; about a dozen rows), then what grew in Python."""
    def mib(kib: int | None) -> str:
        return "-" if kib is None else f"{kib / 1024:.1f}"

    samples = result["memory"]
    step = max(1, (len(samples) - 2) // 10)
    first, last = result["trimmed"]
    shown = [samples[0], {**first, "t": "trim"}, *samples[1:-1:step], samples[-1],
             {**last, "t": "trim"}]
    print("memory (MiB): glibc's heap in use and freed but kept; Python's arenas mapped and")
    print("its blocks in use; traced by tracemalloc; and the router's pending records")
    print(f"{'s':>6} {'RSS':>6} {'in use':>6} {'kept':>6} {'arenas':>6} {'blocks':>6} "
          f"{'traced':>6} {'pending':>8}")
    for m in shown:
        print(f"{m['t']!s:>6} {mib(m['rss']):>6} {mib(m['in_use']):>6} "
              f"{mib(m['free_kept']):>6} {mib(m['py_arenas']):>6} {mib(m['py_blocks']):>6} "
              f"{mib(m.get('traced')):>6} {m['pending']:>8}")
    for g in result["python_growth"] or []:
        print(f"  grew {g['kib']:>9.1f} KiB {g['blocks']:>7} blocks  {g['where'][:46]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=600.0)
    parser.add_argument("--kill-every", type=float, default=5.0)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--drop-every", type=int, default=300,
                        help="one live batch in N is lost on its way (0: none)")
    parser.add_argument("--trace-memory", action="store_true",
                        help="trace Python's allocations after the warm-up (tracemalloc; "
                        "slower) and print the lines that grew most")
    parser.add_argument("--json", metavar="FILE")
    args = parser.parse_args(argv)
    result = run(args.seconds, args.kill_every, args.workers, args.seed, args.drop_every,
                 trace_memory=args.trace_memory)
    print(f"chaos: {result['seconds']:g} s, {result['workers']} workers, {result['kills']} "
          f"kills, {result['dispatched']} dispatches, thread {result['thread']['state']} "
          f"({result['thread']['errors']} errors)")
    # (column, key, width): 80 columns at most; "slow" marks a slow replay link.
    columns = (("worker", "worker", 6), ("codec", "codec", 6), ("starts", "starts", 6),
               ("equal", "equal", 6), ("stale", "stale", 6), ("restart", "restarts", 7),
               ("gaps", "gaps", 5), ("resync", "resyncs", 6), ("bad", "malformed", 4),
               ("applied", "applied", 8), ("drops", "dropped", 6), ("slow", "slowed", 5))
    print(" ".join(f"{h:>{w}}" for h, _, w in columns))
    for r in result["rows"]:
        cells = {**r, "slowed": r["slowed"] if r["slow_replay"] else "-"}
        print(" ".join(f"{cells[k]!s:>{w}}" for _, k, w in columns))
    rows = result["rows"]
    for codec in ("native", "vllm"):
        mine = [r for r in rows if r["codec"] == codec]
        print(f"{codec}: {sum(r['equal'] for r in mine)} of {len(mine)} equal to their cache, "
              f"{sum(r['stale'] for r in mine)} flagged stale, "
              f"{sum(r['resyncs'] for r in mine)} resyncs")
    _print_memory(result)
    rss, held = result["rss_kib"], result["held_kib"]
    print(f"in flight {result['in_flight']}, holds {result['holds']}, load {result['load']}")
    print(f"RSS {rss[0]} -> {rss[1]} KiB ({100 * (rss[1] - rss[0]) / rss[0]:+.1f} %), max "
          f"{result['rss_max_kib']} ({100 * (result['rss_max_kib'] - rss[0]) / rss[0]:+.1f} %);"
          f" after a trim {held[0]} -> {held[1]} KiB "
          f"({100 * (held[1] - held[0]) / held[0]:+.1f} %)")
    live = result["live_kib"]
    if live[0] is not None and live[1] is not None:
        print(f"live memory (glibc's heap in use + Python's blocks) {live[0]} -> {live[1]} KiB "
              f"({100 * (live[1] - live[0]) / live[0]:+.1f} %)")
    print(f"ok: {result['ok']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2, allow_nan=False)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
