#!/usr/bin/env python3
"""Soak benchmark: does one RadixCache keep a flat memory footprint under a serving loop?

An SGLang-style scheduler runs on one ``radixmeta.RadixCache`` for millions of
requests. Users arrive and leave (churn); a request's key is one of a few
shared system prompts + the user's conversation so far + new tokens, under the
user's cache salt as namespace (most users) or under ``None`` (the others), so
namespaces are created and fully evicted all the time. Per request, as a
scheduler does: ``match_prefix``, ``lock`` the matched node, take KV slots for
the uncached tokens from a slot pool (evicting under memory pressure), and
when the request finishes ``insert`` the full key, give back the duplicate
slots ``insert`` reports, ``unlock``. A few requests are in flight at once.

Two modes: with ``--capacity`` the cache evicts on its own inside ``insert``
and hands the freed slots back through ``on_evict``; without it the slot pool
has ``--pool`` slots and the scheduler calls ``evict(n)`` when it runs short.
``--no-drain`` builds the capacity-mode cache without ``on_evict``: memory
stays flat, and the books show the slots the engine never got back.

Process RSS is read after a warm-up of 10 % of the requests and at the end;
growth above 10 % is reported as GROWING. At the end the slot pool's books must
balance: slots handed out == slots in the cache + slots given back, and every
slot id is either cached or free, exactly once.

Usage (see bench/README.md)::

    python bench/soak.py --quick
    python bench/soak.py --ops 2000000 --json soak.json
    python bench/soak.py --capacity 100000 --no-drain   # no on_evict: slots lost to the pool
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# Measure the radixmeta of this checkout (and its in-place built extension), even
# when an editable install of another checkout is on the path.
sys.path.insert(0, REPO)

import radixmeta  # noqa: E402
from radixmeta import RadixCache  # noqa: E402
from radixmeta.errors import CacheFullError  # noqa: E402

MIB = 1 << 20
VOCAB = 32_000
STEM_LENGTHS = (256, 512, 768, 1024)  # the shared system prompts
TURN_TOKENS = (32, 256)  # new tokens per request (prompt + generated), uniform
MAX_KEY = 4096  # a conversation that would outgrow this starts over
INFLIGHT = 8  # requests holding a lock at once
FLAT = 0.10  # largest RSS growth after warm-up (the 10 % progress mark) still called flat


COUNTS = (
    "key_tokens",
    "namespaces_created",
    "evict_calls",
    "evicted_slots",
    "cache_evicted_slots",
    "duplicate_slots",
    "rejected_no_slots",
    "rejected_cache_full",
)


@dataclass
class Config:
    ops: int
    page_size: int
    capacity: int | None
    pool: int
    namespaces_live: int
    churn: float
    drain: bool
    seed: int


def rss_bytes() -> tuple[int, str]:
    """Current resident set size of this process, and where it was read."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE"), "statm"
    except OSError:  # not Linux: the peak, not the current size
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak * (1 if sys.platform == "darwin" else 1024), "ru_maxrss"


class SlotPool:
    """KV slot ids as an engine's token-to-KV pool hands them out: a LIFO free list.

    ``limit`` is the pool size; ``None`` makes new ids whenever the free list is
    empty (capacity mode, where the cache bounds itself). The counters and
    ``audit`` prove that no slot leaked and none was given back twice.
    """

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._free = np.empty(1 << 16, dtype=np.int64)
        self._top = 0  # free ids are _free[:_top]
        self._next = 0  # ids >= _next were never handed out
        self.handed_out = 0
        self.given_back = 0

    @property
    def available(self) -> int:
        if self.limit is None:
            return sys.maxsize
        return self._top + self.limit - self._next

    def take(self, n: int) -> np.ndarray:
        """``n`` slots; the caller checked ``available``."""
        k = min(n, self._top)
        out = np.empty(n, dtype=np.int64)
        out[:k] = self._free[self._top - k : self._top]
        self._top -= k
        out[k:] = np.arange(self._next, self._next + n - k, dtype=np.int64)
        self._next += n - k
        self.handed_out += n
        return out

    def give(self, slots: np.ndarray) -> None:
        n = len(slots)
        if self._top + n > len(self._free):
            grown = np.empty(max(2 * len(self._free), self._top + n), dtype=np.int64)
            grown[: self._top] = self._free[: self._top]
            self._free = grown
        self._free[self._top : self._top + n] = slots
        self._top += n
        self.given_back += n

    def audit(self, cached: np.ndarray, in_cache: int) -> list[str]:
        """Problems with the books, given the distinct slot ids the cache holds and its size.

        Call it with no request in flight. O(ids ever made), one byte each.
        """
        problems = []
        if self.handed_out != in_cache + self.given_back:
            problems.append(
                f"handed out {self.handed_out} != in cache {in_cache} + freed {self.given_back}"
            )
        if len(cached) != in_cache:
            problems.append(f"{len(cached)} distinct cached slots for {in_cache} cached tokens")
        if cached.size and (cached.min() < 0 or cached.max() >= self._next):
            problems.append("the cache holds a slot id the pool never handed out")
            return problems
        free = self._free[: self._top]
        seen = np.zeros(self._next, dtype=bool)
        seen[free] = True
        if np.count_nonzero(seen) != len(free):
            problems.append("a slot was given back twice")
        if seen[cached].any():
            problems.append("a cached slot is also free")
        seen[cached] = True
        lost = self._next - np.count_nonzero(seen)
        if lost:
            problems.append(f"{lost} slot ids neither cached nor free (leaked)")
        return problems


class User:
    __slots__ = ("history", "namespace", "stem")

    def __init__(self, namespace: str | None, stem: int) -> None:
        self.namespace = namespace
        self.stem = stem
        self.history = np.empty(0, dtype=np.int32)


@dataclass
class Request:
    key: np.ndarray
    namespace: str | None
    matched: int
    node: Any
    values: np.ndarray


class Soak:
    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.rnd = random.Random(cfg.seed)
        self.np_rng = np.random.default_rng(cfg.seed)
        self.stems = [self.np_rng.integers(0, VOCAB, n, dtype=np.int32) for n in STEM_LENGTHS]
        self.pool = SlotPool(None if cfg.capacity is not None else cfg.pool)
        self.counts = dict.fromkeys(COUNTS, 0)
        self.cache, self.drain_mode = self._make_cache()
        self.users_created = 0
        # Slots 0..K-1 hold salted users (one namespace each), the rest unsalted ones.
        n_plain = max(1, cfg.namespaces_live // 4)
        live = cfg.namespaces_live
        self.users = [self._new_user(i < live) for i in range(live + n_plain)]
        self.inflight: collections.deque[Request] = collections.deque()

    def _on_evict(self, values: np.ndarray) -> None:
        self.pool.give(values)
        self.counts["cache_evicted_slots"] += len(values)

    def _make_cache(self) -> tuple[RadixCache, str]:
        cfg = self.cfg
        if cfg.capacity is None:
            return RadixCache(cfg.page_size), "explicit evict"
        if not cfg.drain:
            return RadixCache(cfg.page_size, capacity=cfg.capacity), "none (--no-drain)"
        cache = RadixCache(cfg.page_size, capacity=cfg.capacity, on_evict=self._on_evict)
        return cache, "on_evict"

    def _new_user(self, salted: bool) -> User:
        self.users_created += 1
        namespace = f"salt-{self.users_created:08x}" if salted else None
        self.counts["namespaces_created"] += salted
        return User(namespace, self.rnd.randrange(len(self.stems)))

    def admit(self) -> None:
        """One request arrives: match, lock, take slots for the uncached tokens."""
        slot = self.rnd.randrange(len(self.users))
        user = self.users[slot]
        stem = self.stems[user.stem]
        new = self.np_rng.integers(0, VOCAB, self.rnd.randint(*TURN_TOKENS), dtype=np.int32)
        if len(stem) + len(user.history) + len(new) > MAX_KEY:
            user.history = user.history[:0]  # a new conversation
        key = np.concatenate((stem, user.history, new))
        user.history = key[len(stem) :]
        if self.rnd.random() < self.cfg.churn:  # the user leaves; a new one takes the slot
            self.users[slot] = self._new_user(user.namespace is not None)
        self.counts["key_tokens"] += len(key)

        cache, pool = self.cache, self.pool
        m = cache.match_prefix(key, namespace=user.namespace)
        cache.lock(m.node)
        need = len(key) - m.length
        if need > pool.available:  # memory pressure: the scheduler evicts
            freed = cache.evict(need - pool.available)
            pool.give(freed.values)
            self.counts["evict_calls"] += 1
            self.counts["evicted_slots"] += freed.count
            if need > pool.available:  # everything else is locked: turn the request away
                cache.unlock(m.node)
                self.counts["rejected_no_slots"] += 1
                return
        values = np.concatenate((m.values, pool.take(need)))
        self.inflight.append(Request(key, user.namespace, m.length, m.node, values))

    def finish(self) -> None:
        """The oldest request finishes: insert its key, free what the cache does not keep."""
        req = self.inflight.popleft()
        cache, pool = self.cache, self.pool
        try:
            cached = cache.insert(req.key, req.values, namespace=req.namespace)
        except CacheFullError:  # locked nodes fill the capacity: nothing was stored
            cache.unlock(req.node)
            pool.give(req.values[req.matched :])
            self.counts["rejected_cache_full"] += 1
            return
        stored = len(req.key) // self.cfg.page_size * self.cfg.page_size
        assert cached >= req.matched, "a locked prefix was evicted"
        pool.give(req.values[req.matched : cached])  # duplicates of cached tokens
        pool.give(req.values[stored:])  # the tail past the last full page
        self.counts["duplicate_slots"] += cached - req.matched
        cache.unlock(req.node)

    def step(self) -> None:
        self.admit()
        if len(self.inflight) > INFLIGHT:
            self.finish()

    def flush(self) -> None:
        while self.inflight:
            self.finish()

    def sample(self, ops: int, elapsed: float) -> dict[str, Any]:
        rss, _ = rss_bytes()
        cache = self.cache
        return {
            "ops": ops,
            "elapsed_s": round(elapsed, 3),
            "rss_mib": round(rss / MIB, 2),
            "node_count": cache.node_count,
            "namespaces": len(cache.namespaces()),
            "total_tokens": cache.total_size,
            "tree_mib": round(cache.memory_usage() / MIB, 2),
        }

    def close_books(self) -> tuple[int, list[str]]:
        """Settle the slot pool against the cache; the slots still queued, and any problem."""
        queued = 0  # the cache keeps no queue of evicted slots (on_evict, or nothing)
        parts = [v for ns in self.cache.namespaces() for _, v in self.cache.items(namespace=ns)]
        cached = np.unique(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)
        return queued, self.pool.audit(cached, self.cache.total_size)


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", REPO, "describe", "--always", "--dirty", "--abbrev=40"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def run(cfg: Config) -> dict[str, Any]:
    soak = Soak(cfg)
    rss0, rss_source = rss_bytes()
    if cfg.capacity is None:
        mode = f"explicit evict, pool {cfg.pool:,} slots"
    else:
        mode = f"capacity {cfg.capacity:,} tokens"
    print(
        f"soak: {cfg.ops:,} requests, page {cfg.page_size}, {mode}, "
        f"{cfg.namespaces_live:,} live salted users, churn {cfg.churn}, seed {cfg.seed}\n"
        f"      drain: {soak.drain_mode}; radixmeta {radixmeta.implementation} from "
        f"{os.path.dirname(radixmeta.__file__)}; RSS at start {rss0 / MIB:.1f} MiB ({rss_source})",
        flush=True,
    )
    marks = [max(1, cfg.ops * i // 10) for i in range(1, 10)]
    samples = []
    start = last_t = time.perf_counter()
    last_ops = 0

    def record(done: int) -> None:
        nonlocal last_t, last_ops
        now = time.perf_counter()
        s = soak.sample(done, now - start)
        s["ops_per_s"] = round((done - last_ops) / (now - last_t)) if now > last_t else 0
        samples.append(s)
        print(
            f"  {100 * done // cfg.ops:3d}% {done:>11,} ops  {s['ops_per_s']:>8,} ops/s  "
            f"RSS {s['rss_mib']:8.1f} MiB  tree {s['tree_mib']:7.1f} MiB  "
            f"nodes {s['node_count']:>8,}  namespaces {s['namespaces']:>8,}",
            flush=True,
        )
        last_t, last_ops = time.perf_counter(), done

    done = 0
    for mark in marks:
        while done < mark:
            soak.step()
            done += 1
        record(done)
    while done < cfg.ops:
        soak.step()
        done += 1
    soak.flush()
    record(done)
    wall = time.perf_counter() - start

    books_start = time.perf_counter()
    queued, problems = soak.close_books()
    books_s = time.perf_counter() - books_start
    warm, end = samples[0], samples[-1]
    growth = (end["rss_mib"] - warm["rss_mib"]) / warm["rss_mib"]
    pool = soak.pool
    return {
        "config": asdict(cfg),
        "environment": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "radixmeta": os.path.dirname(radixmeta.__file__),
            "implementation": radixmeta.implementation,
            "commit": git_commit(),
            "drain": soak.drain_mode,
            "rss_source": rss_source,
        },
        "samples": samples,
        "summary": {
            "rss_start_mib": round(rss0 / MIB, 2),
            "rss_warmup_mib": warm["rss_mib"],
            "rss_end_mib": end["rss_mib"],
            "growth_pct": round(100 * growth, 1),
            "verdict": "FLAT" if growth <= FLAT else "GROWING",
            "wall_s": round(wall, 2),
            "ops_per_s": round(cfg.ops / wall),
            "node_count": end["node_count"],
            "namespaces": end["namespaces"],
            "total_tokens": end["total_tokens"],
            "tree_mib": end["tree_mib"],
            "hit_rate": round(soak.cache.stats.hit_tokens / max(1, soak.counts["key_tokens"]), 4),
            "users_created": soak.users_created,
            **soak.counts,
            "queued_evicted_slots_at_end": queued,
            "slots_handed_out": pool.handed_out,
            "slots_freed": pool.given_back,
            "books_s": round(books_s, 2),
            "books_balance": not problems,
            "books_problems": problems,
        },
    }


def report(result: dict[str, Any]) -> None:
    s = c = result["summary"]
    books = "balanced" if s["books_balance"] else "UNBALANCED: " + "; ".join(s["books_problems"])
    rows = [
        ("RSS after warm-up (10 %)", f"{s['rss_warmup_mib']:.1f} MiB"),
        ("RSS at end", f"{s['rss_end_mib']:.1f} MiB"),
        ("growth", f"{s['growth_pct']:+.1f} %"),
        ("verdict", f"{s['verdict']} (flat = within {FLAT:.0%})"),
        ("wall time", f"{s['wall_s']:.1f} s"),
        ("ops/s", f"{s['ops_per_s']:,}"),
        ("node_count", f"{s['node_count']:,}"),
        ("len(namespaces())", f"{s['namespaces']:,}"),
        ("total tokens", f"{s['total_tokens']:,}"),
        ("hit rate (matched / key tokens)", f"{s['hit_rate']:.1%}"),
        ("tree memory_usage()", f"{s['tree_mib']:.1f} MiB"),
        ("namespaces created", f"{c['namespaces_created']:,}"),
        ("evict calls / slots", f"{c['evict_calls']:,} / {c['evicted_slots']:,}"),
        ("capacity-evicted slots", f"{c['cache_evicted_slots']:,}"),
        ("queued at end (--no-drain)", f"{s['queued_evicted_slots_at_end']:,}"),
        ("duplicate slots freed", f"{c['duplicate_slots']:,}"),
        ("rejected (no slots / full)", f"{c['rejected_no_slots']} / {c['rejected_cache_full']}"),
        (
            "books",
            f"handed out {s['slots_handed_out']:,} = in cache {s['total_tokens']:,} "
            f"+ freed {s['slots_freed']:,}: {books} (checked in {s['books_s']:.1f} s)",
        ),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(
        f"\nverdict: RSS {s['verdict']} ({s['rss_warmup_mib']:.1f} -> {s['rss_end_mib']:.1f} MiB, "
        f"{s['growth_pct']:+.1f} % after warm-up)"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--ops", type=int, default=2_000_000, metavar="N", help="requests (default 2000000)"
    )
    ap.add_argument("--quick", action="store_true", help="100,000 requests (smoke run)")
    ap.add_argument("--page-size", type=int, default=1, metavar="P", help="default 1")
    ap.add_argument(
        "--capacity",
        type=int,
        default=None,
        metavar="TOKENS",
        help="capacity mode: the cache holds at most TOKENS and evicts on its own",
    )
    ap.add_argument(
        "--pool",
        type=int,
        default=1 << 20,
        metavar="SLOTS",
        help="explicit-evict mode: KV slots in the pool (default 1048576)",
    )
    ap.add_argument(
        "--namespaces-live",
        type=int,
        default=256,
        metavar="K",
        help="live users with a cache salt, one namespace each (default 256); K/4 more use None",
    )
    ap.add_argument(
        "--churn",
        type=float,
        default=0.125,
        metavar="P",
        help="chance a user leaves after a request (default 1/8; 0: no new namespaces)",
    )
    ap.add_argument(
        "--no-drain",
        action="store_true",
        help="capacity mode: never collect evicted slots (reproduces the queue leak; "
        "~8 bytes per evicted slot, so keep --ops to ~200k)",
    )
    ap.add_argument("--seed", type=int, default=0, metavar="S", help="default 0")
    ap.add_argument("--json", metavar="FILE", help="write config, samples and summary as JSON")
    args = ap.parse_args(argv)

    cfg = Config(
        ops=100_000 if args.quick else args.ops,
        page_size=args.page_size,
        capacity=args.capacity,
        pool=args.pool,
        namespaces_live=args.namespaces_live,
        churn=args.churn,
        drain=not args.no_drain,
        seed=args.seed,
    )
    if cfg.ops < 10:
        ap.error("--ops must be at least 10")
    if args.no_drain and cfg.capacity is None:
        ap.error("--no-drain needs --capacity (only capacity mode queues evicted slots)")
    least = (INFLIGHT + 1) * MAX_KEY
    if cfg.capacity is None and cfg.pool < least:
        ap.error(f"--pool must be at least {least} ({INFLIGHT} requests in flight)")
    result = run(cfg)
    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
            f.write("\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
