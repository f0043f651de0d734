"""Ray Serve request routers side by side on the same stand-in deployment and client load.

One local Ray (``ray.init(num_cpus=2)``, no dashboard, no HTTP proxy: the client calls
a ``DeploymentHandle``, whose router lives in this process). Every cell deploys a fresh
application of ``radixmeta.integrations.ray.StandinReplica`` (a real ``RadixCache`` per
replica, prefills one at a time with :mod:`radixmeta.policies.costs`' prefill time of
the uncached tokens) at 4 and 8 replicas under one router:

``ray``             Ray's ``PrefixCacheAffinityRouter`` with its defaults
                    (``imbalanced_threshold=inf``, ``match_rate_threshold=0.1``)
``ray-tuned``       the same with ``--tuned-imbalance`` / ``--tuned-match``
``pow2``            Ray Serve's default power-of-two-choices router
``radixmeta``       ``RadixMetaRequestRouter``, approximate mode (its default)
``radixmeta-tuned`` the same with ``policy_params`` from ``--tuned-params`` (JSON;
                    default ``{"work_weight": 3.0}``: a recompute weighs more
                    against a queue, the hit-rate-first setting)
``radixmeta-exact`` ``RadixMetaRequestRouter``, exact mode (the replicas publish
                    their KV events on 127.0.0.1)

and the same closed-loop client (``--concurrency`` requests in flight, ``--requests``
per cell, in workload order) on three workloads:

``gsp``       generated shared-prefix groups (``radixmeta.sim.workloads.gsp``), each
              token id one printable character, so a prompt's characters (what Ray's
              router matches) are its bytes (what the stand-ins and radixmeta match)
``mooncake``  the first ``--mooncake-requests`` (default ``--requests``) requests of the
              Mooncake conversation trace in trace order (the closed-loop client
              ignores its timestamps: time is compressed to what the replicas
              serve), each 512-token hash block ``--block-chars`` characters (so
              prompts are 512 / block-chars times shorter than the trace's); the
              trace's first 300 requests share little beyond its common first
              block, its first 1,000 to 2,000 reuse conversation turns
``evict``     ``gsp`` again, on replicas that cache only ``--evict-capacity`` tokens:
              an approximate tree that never forgets drifts from the caches

The stand-ins evict by pages (``--granularity page``, vLLM's block pool, which is
what radixmeta's approximate model does) or by whole radix leaves (``node``, SGLang's
tree; before that option the stand-ins evicted by leaves, and radixmeta's model kept
the heads of the prompts they dropped: ``bench/ray_standin_drift.py``).

Measured per cell: the replicas' real hit rate (cached / prompt tokens, as each
replica's ``RadixCache`` found them), the stand-in latency p50 / p99 (queue wait for the
prefill slot plus the prefill, as each replica timed it), the client's end-to-end
latency (JSON only) and the routing cost per request inside Serve (wall time in
``choose_replicas`` plus ``on_request_routed``, measured by a thin subclass of each
router). For radixmeta's columns the JSON also has ``router_view``: in the router's own
view at dispatch, the share of the prompt tokens the longest match held, what the chosen
replica held and what the estimate expected to stay there, the share of requests sent
away from the longest match, and the decisions' labels (why a hit rate is below Ray's:
the policy's moves, or its view). The machine is shared and small: compare routers within
one run.
``--repeats N`` runs every cell N times, the repeats interleaved (all cells once, then
again), and the table shows each figure's mean and, after ``~``, half its range
(max - min) / 2; the JSON keeps every run.

    python bench/ray_router.py --requests 300 --json-out ray_router.json
    python bench/ray_router.py --replicas 4 --workloads gsp --routers ray,radixmeta
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import math
import os
import platform
import sys
import textwrap
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import ray  # noqa: E402
from ray import serve  # noqa: E402
from ray.llm._internal.serve.routing_policies.prefix_aware.prefix_aware_router import (  # noqa: E402
    PrefixCacheAffinityRouter,
)
from ray.serve._private.request_router import PowerOfTwoChoicesRequestRouter  # noqa: E402
from ray.serve.config import RequestRouterConfig  # noqa: E402

from radixmeta.cache import RadixCache  # noqa: E402
from radixmeta.integrations.ray import RadixMetaRequestRouter, StandinReplica  # noqa: E402
from radixmeta.sim.workloads import gsp  # noqa: E402

TRACE = Path("/work/shared/data/mooncake/conversation_trace.jsonl")
ROUTERS = ("ray", "ray-tuned", "pow2", "radixmeta", "radixmeta-tuned", "radixmeta-exact")
WORKLOADS = ("gsp", "mooncake", "evict")
FIRST_CHAR = 33  # token id t of a gsp prompt is the character chr(33 + t): '!' .. '~'
VOCAB = 94


# -- routers, timed ---------------------------------------------------------------------------
# Each router is a thin subclass that times its two per-request hooks. Ray Serve ships the
# class by value to the handle's process (this one), so the instances are found by gc.
class _Timing:
    """Wall seconds in ``choose_replicas`` and ``on_request_routed``, per call.

    First in each timed router's bases, so its hooks wrap the router's own.
    """

    bench_timed = True

    def _bench_record(self, hook: str, seconds: float) -> None:
        store = self.__dict__.setdefault("bench_seconds", {"choose": [], "routed": []})
        store[hook].append(seconds)

    async def choose_replicas(self, candidate_replicas, pending_request=None):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return await super().choose_replicas(candidate_replicas, pending_request)
        finally:
            self._bench_record("choose", time.perf_counter() - start)

    def on_request_routed(self, pending_request, replica_id, result):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return super().on_request_routed(pending_request, replica_id, result)
        finally:
            self._bench_record("routed", time.perf_counter() - start)


class TimedPrefixAffinity(_Timing, PrefixCacheAffinityRouter):
    pass


class TimedPowerOfTwo(_Timing, PowerOfTwoChoicesRequestRouter):
    pass


class TimedRadixMeta(_Timing, RadixMetaRequestRouter):
    """Also notes, per routed request, what its decision gave up in the router's own view:
    the longest prefix any replica held against what the chosen one held (the tokens a
    move to a less loaded replica recomputes), and what the estimate expected to stay."""

    async def choose_replicas(self, candidate_replicas, pending_request=None):  # type: ignore[no-untyped-def]
        ranks = await super().choose_replicas(candidate_replicas, pending_request)
        if pending_request is not None:
            decision = self._open.get(pending_request.metadata.internal_request_id)
            if decision is not None:
                lengths = decision._view.lengths
                chosen = decision._view.workers.index(decision.worker)
                store = self.__dict__.setdefault("bench_choices", [])
                store.append((max(lengths), lengths[chosen], decision.matched,
                              len(decision._request.tokens), decision.label))
        return ranks


def router_config(name: str, args: argparse.Namespace) -> RequestRouterConfig:
    """The ``request_router_config`` of one router column."""
    if name == "ray":
        cls: type = TimedPrefixAffinity
        kwargs: dict[str, Any] = {}
    elif name == "ray-tuned":
        cls = TimedPrefixAffinity
        kwargs = {
            "imbalanced_threshold": args.tuned_imbalance,
            "match_rate_threshold": args.tuned_match,
        }
    elif name == "pow2":
        cls, kwargs = TimedPowerOfTwo, {}
    elif name in ("radixmeta", "radixmeta-tuned", "radixmeta-exact"):
        cls = TimedRadixMeta
        kwargs = {
            "page_size": args.page_size,
            "mode": "exact" if name == "radixmeta-exact" else "approximate",
        }
        if name == "radixmeta-tuned":
            kwargs["policy_params"] = args.tuned_params
    else:
        msg = f"unknown router {name!r} (one of {', '.join(ROUTERS)})"
        raise SystemExit(msg)
    return RequestRouterConfig(
        request_router_class=cls,
        request_router_kwargs=kwargs,
        request_routing_stats_period_s=0.5,
    )


def routers_of(app: str) -> list[Any]:
    """The timed router instances of application ``app`` in this process."""
    found = []
    for obj in gc.get_objects():
        if getattr(type(obj), "bench_timed", False) is True:
            deployment = getattr(obj, "_deployment_id", None)
            if deployment is not None and deployment.app_name == app:
                found.append(obj)
    return found


# -- workloads --------------------------------------------------------------------------------
@dataclass
class PromptRequest:
    """What the client sends: an object with a ``prompt`` attribute, as Ray Serve LLM's
    ingress hands its LLM servers (Ray's router reads only attributes; radixmeta's and
    the stand-in read attributes or mappings)."""

    prompt: str


def gsp_prompts(args: argparse.Namespace) -> list[str]:
    per_group = math.ceil(args.requests / args.gsp_groups)
    w = gsp(
        num_groups=args.gsp_groups,
        prompts_per_group=per_group,
        system_prompt_len=args.gsp_system,
        question_len=args.gsp_question,
        vocab_size=VOCAB,
        seed=args.seed,
    )
    return [
        (np.asarray(r.tokens, dtype=np.int64) + FIRST_CHAR).astype(np.uint8).tobytes().decode()
        for r in list(w)[: args.requests]
    ]


def block_text(hash_id: int, chars: int) -> str:
    """A hash block's text: printable characters drawn from a generator seeded by its id."""
    codes = np.random.default_rng(hash_id).integers(FIRST_CHAR, FIRST_CHAR + VOCAB, chars)
    return codes.astype(np.uint8).tobytes().decode()


def mooncake_prompts(args: argparse.Namespace) -> list[str]:
    path = Path(args.mooncake)
    if not path.exists():
        msg = f"the Mooncake trace is not at {path} (pass --mooncake PATH)"
        raise FileNotFoundError(msg)
    prompts = []
    with path.open() as f:
        for line in f:
            if len(prompts) >= (args.mooncake_requests or args.requests):
                break
            row = json.loads(line)
            text = "".join(block_text(h, args.block_chars) for h in row["hash_ids"])
            # The last block is partial: cut the text as the trace cuts the tokens.
            prompts.append(text[: max(1, row["input_length"] * args.block_chars // 512)])
    return prompts


def best_hit_rate(prompts: list[str], page_size: int) -> float:
    """The hit rate of one unbounded cache that sees every prompt in order: what no
    fleet of replicas can beat (every prefix kept, all in one place)."""
    cache = RadixCache(page_size)
    cached = total = 0
    for p in prompts:
        tokens = np.frombuffer(p.encode(), dtype=np.uint8).astype(np.uint32)
        cached += cache.match_prefix(tokens, values=False).length
        total += len(tokens)
        cache.insert(tokens)
    return cached / total if total else 0.0


# -- one cell ---------------------------------------------------------------------------------
def quantile(values: list[float], q: float) -> float | None:
    return float(np.quantile(values, q)) if values else None


async def drive(handle: Any, prompts: list[str], concurrency: int) -> list[dict[str, Any]]:
    """Send every prompt, ``concurrency`` in flight, in order; each answer with its
    client-side seconds."""
    queue = list(enumerate(prompts))
    queue.reverse()
    answers: list[dict[str, Any]] = [{} for _ in prompts]

    async def client() -> None:
        while queue:
            index, prompt = queue.pop()
            start = time.perf_counter()
            answer = await handle.remote(PromptRequest(prompt))
            answer["client_seconds"] = time.perf_counter() - start
            answers[index] = answer

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return answers


def kill_tree_actor(app: str) -> None:
    """Ray's prefix tree actor of ``app`` (detached; serve.shutdown would clean it up)."""
    try:
        actor = ray.get_actor("LlmPrefixTreeActor", namespace=f"serve::{app}::standin")
    except ValueError:
        return
    ray.kill(actor)


def run_cell(workload: str, prompts: list[str], replicas: int, router: str,
             args: argparse.Namespace, repeat: int = 0) -> dict[str, Any]:
    app = f"{workload}-{replicas}-{router}-{repeat}"
    capacity = args.evict_capacity if workload == "evict" else args.capacity
    exact = router == "radixmeta-exact"
    deployment = serve.deployment(
        StandinReplica,
        name="standin",
        num_replicas=replicas,
        max_ongoing_requests=args.max_ongoing,
        ray_actor_options={"num_cpus": 0},
        request_router_config=router_config(router, args),
    )
    cell: dict[str, Any] = {"workload": workload, "replicas": replicas, "router": router,
                            "repeat": repeat, "capacity": capacity, "requests": len(prompts)}
    started = time.perf_counter()
    try:
        handle = serve.run(
            deployment.bind(page_size=args.page_size, capacity=capacity, events=exact,
                            time_scale=args.time_scale, granularity=args.granularity),
            name=app, route_prefix=None,
        )
        # One tiny request builds the router here; exact mode then waits for its feeds.
        handle.remote(PromptRequest("warm")).result(timeout_s=60)
        if exact:
            deadline = time.monotonic() + 60
            while True:
                routers = routers_of(app)
                if routers and routers[0].counts["subscribed"] >= replicas:
                    break
                if time.monotonic() > deadline:
                    msg = "exact mode: the event feeds never all subscribed"
                    raise TimeoutError(msg)
                time.sleep(0.1)
        for r in routers_of(app):  # forget the warm-up's timings
            r.__dict__.pop("bench_seconds", None)
            r.__dict__.pop("bench_choices", None)
        cell["deploy_seconds"] = time.perf_counter() - started
        t0 = time.perf_counter()
        answers = asyncio.run(asyncio.wait_for(
            drive(handle, prompts, args.concurrency), timeout=args.cell_timeout))
        cell["run_seconds"] = time.perf_counter() - t0
        routers = routers_of(app)
        choose = [s for r in routers for s in r.__dict__.get("bench_seconds", {}).get("choose", [])]
        routed = [s for r in routers for s in r.__dict__.get("bench_seconds", {}).get("routed", [])]
        prompt_tokens = sum(a["prompt_tokens"] for a in answers)
        cached = sum(a["cached_tokens"] for a in answers)
        seconds = [a["seconds"] for a in answers]
        client = [a["client_seconds"] for a in answers]
        spread = Counter(a["replica"] for a in answers)
        cell.update(
            hit_rate=cached / prompt_tokens if prompt_tokens else 0.0,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached,
            standin_p50=quantile(seconds, 0.5),
            standin_p99=quantile(seconds, 0.99),
            client_p50=quantile(client, 0.5),
            client_p99=quantile(client, 0.99),
            router_instances=len(routers),
            choose_calls=len(choose),
            route_seconds_per_request=(sum(choose) + sum(routed)) / len(prompts),
            choose_p50=quantile(choose, 0.5),
            choose_p99=quantile(choose, 0.99),
            replicas_used=len(spread),
            busiest_share=max(spread.values()) / len(prompts),
        )
        if router.startswith("radixmeta") and routers:
            cell["router_counts"] = dict(routers[0].counts)
            choices = [c for r in routers for c in r.__dict__.get("bench_choices", [])]
            if choices and prompt_tokens:
                # In the router's own view at dispatch: the share of the prompt tokens the
                # longest match held, what the chosen replica held, and what the estimate
                # expected to stay cached there; how many requests left the longest match.
                cell["router_view"] = {
                    "best_held": sum(c[0] for c in choices) / sum(c[3] for c in choices),
                    "chosen_held": sum(c[1] for c in choices) / sum(c[3] for c in choices),
                    "expected": sum(c[2] for c in choices) / sum(c[3] for c in choices),
                    "moved": sum(1 for c in choices if c[1] < c[0]) / len(choices),
                    "labels": dict(Counter(c[4] for c in choices)),
                }
    except Exception as exc:  # a failed cell is reported, and the next one runs
        cell["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        try:
            serve.delete(app)
        except Exception as exc:  # the cell's figures stand
            cell.setdefault("cleanup_error", f"{type(exc).__name__}: {exc}")
        kill_tree_actor(app)
    return cell


# -- output -----------------------------------------------------------------------------------
def fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def spread(values: list[float], scale: float, digits: int) -> str:
    """``mean`` of ``values`` times ``scale``, and ``~half range`` when there are several."""
    mean = scale * sum(values) / len(values)
    if len(values) == 1:
        return f"{mean:.{digits}f}"
    half = scale * (max(values) - min(values)) / 2
    return f"{mean:.{digits}f}~{half:.{digits}f}"


def table(cells: list[dict[str, Any]], caption: str) -> str:
    """One line per (workload, replicas, router): each figure's mean over the repeats
    that completed (``~``: half their range), and how many completed."""
    head = (f"{'workload':<9}{'rep':>3} {'router':<16}{'n':>2}{'hit %':>10}{'p50 s':>10}"
            f"{'p99 s':>10}{'route ms':>12}{'busy %':>7}")
    lines = [caption, "", head, "-" * len(head)] if caption else [head]
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for c in cells:
        groups.setdefault((c["workload"], c["replicas"], c["router"]), []).append(c)
    for (workload, replicas, router), runs in groups.items():
        start = f"{workload:<9}{replicas:>3} {router:<16}"
        done = [c for c in runs if "error" not in c]
        if not done:
            lines.append(start + f"failed: {runs[0]['error']}"[:80 - len(start)])
            continue
        p50 = [c["standin_p50"] for c in done if c["standin_p50"] is not None]
        p99 = [c["standin_p99"] for c in done if c["standin_p99"] is not None]
        lines.append(
            start
            + f"{len(done):>2}"
            + f"{spread([c['hit_rate'] for c in done], 100, 1):>10}"
            + f"{spread(p50, 1, 2) if p50 else '-':>10}"
            + f"{spread(p99, 1, 2) if p99 else '-':>10}"
            + f"{spread([c['route_seconds_per_request'] for c in done], 1000, 2):>12}"
            + f"{spread([c['busiest_share'] for c in done], 100, 0):>7}"
        )
    return "\n".join(lines)


def strict(value: Any) -> Any:
    """``value`` with every non-finite float as null (strict JSON)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: strict(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [strict(v) for v in value]
    return value


def csv(kind: type, allowed: tuple[str, ...] | None = None):  # type: ignore[no-untyped-def]
    def parse(text: str) -> list[Any]:
        items = [kind(x) for x in text.split(",") if x]
        if allowed is not None:
            bad = [x for x in items if x not in allowed]
            if bad:
                msg = f"unknown {bad} (choose from {', '.join(allowed)})"
                raise argparse.ArgumentTypeError(msg)
        return items
    return parse


def report(cells: list[dict[str, Any]], reference: dict[str, float],
           args: argparse.Namespace) -> None:
    """Print the table and write the JSON (before Ray shuts down and its own
    shutdown messages reach the terminal)."""
    load = os.getloadavg()[0]
    caption = textwrap.fill(
        f"Ray Serve routers, stand-in replicas ({args.requests} requests a cell, "
        f"mooncake {args.mooncake_requests or args.requests}; {args.concurrency} in "
        f"flight; {args.repeats} repeat(s); shared 2-core VM, load {load:.1f} at the end: "
        "reduced scale, compare within a run). Best hit rate (one unbounded cache): "
        + ", ".join(f"{w} {100 * h:.1f} %" for w, h in reference.items())
        + ". p50/p99: stand-in queue wait + prefill, seconds; route ms: choose_replicas"
        " + on_request_routed per request; busy %: the busiest replica's share; n: runs"
        " completed; a~b: mean a, half range b.",
        width=78,
    )
    print(table(cells, caption), flush=True)
    write_json(cells, reference, args)


def write_json(cells: list[dict[str, Any]], reference: dict[str, float],
               args: argparse.Namespace) -> None:
    """Every cell so far (rewritten after each cell, so a run cut short keeps its figures)."""
    load = os.getloadavg()[0]
    if args.json_out is not None:
        doc = {
            "bench": "ray_router",
            "command": " ".join([Path(sys.executable).name, *sys.argv]),
            "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                        "load_average_1m": load, "ray": ray.__version__},
            "settings": {k: (str(v) if isinstance(v, Path) else v)
                         for k, v in vars(args).items()},
            "best_hit_rate": reference,
            "cells": cells,
        }
        args.json_out.write_text(json.dumps(strict(doc), indent=2, allow_nan=False) + "\n")



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", type=csv(int), default=[4, 8])
    p.add_argument("--routers", type=csv(str, ROUTERS), default=list(ROUTERS))
    p.add_argument("--workloads", type=csv(str, WORKLOADS), default=list(WORKLOADS))
    p.add_argument("--requests", type=int, default=300, help="per cell (default 300)")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight")
    p.add_argument("--max-ongoing", type=int, default=64,
                   help="each replica's max_ongoing_requests (default 64)")
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--capacity", type=int, default=200_000,
                   help="tokens a replica caches (gsp, mooncake)")
    p.add_argument("--evict-capacity", type=int, default=2048,
                   help="tokens a replica caches in the evict workload (default 2048)")
    p.add_argument("--time-scale", type=float, default=1.0,
                   help="multiplies every stand-in prefill time")
    p.add_argument("--granularity", choices=("page", "node"), default="page",
                   help="what a stand-in's eviction frees: a page (vLLM's block pool, the "
                   "default) or a whole radix leaf (SGLang's tree)")
    p.add_argument("--gsp-groups", type=int, default=16)
    p.add_argument("--gsp-system", type=int, default=1024, help="system prompt tokens")
    p.add_argument("--gsp-question", type=int, default=64, help="question tokens")
    p.add_argument("--mooncake", default=str(TRACE), help="the conversation trace")
    p.add_argument("--mooncake-requests", type=int, default=None,
                   help="requests of the Mooncake slice (default: --requests)")
    p.add_argument("--repeats", type=int, default=1,
                   help="runs of every cell, interleaved (default 1)")
    p.add_argument("--tuned-params", type=json.loads, default={"work_weight": 3.0},
                   help='radixmeta-tuned\'s policy_params, JSON (default {"work_weight": 3})')
    p.add_argument("--block-chars", type=int, default=64,
                   help="characters per 512-token hash block (default 64)")
    p.add_argument("--tuned-imbalance", type=float, default=4.0,
                   help="ray-tuned's imbalanced_threshold (default 4)")
    p.add_argument("--tuned-match", type=float, default=0.5,
                   help="ray-tuned's match_rate_threshold (default 0.5)")
    p.add_argument("--cell-timeout", type=float, default=300.0, help="seconds per cell")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path)
    p.add_argument("--table-from", type=Path,
                   help="print the table of a JSON this bench wrote, and run nothing")
    args = p.parse_args()
    if args.table_from is not None:
        print(table(json.loads(args.table_from.read_text())["cells"], ""))
        return

    builders = {"gsp": gsp_prompts, "evict": gsp_prompts, "mooncake": mooncake_prompts}
    prompts: dict[str, list[str]] = {}
    for w in args.workloads:
        try:
            prompts[w] = builders[w](args)
        except FileNotFoundError as exc:
            print(f"skipping {w}: {exc}", file=sys.stderr)
    reference = {w: best_hit_rate(ps, args.page_size) for w, ps in prompts.items()}
    env = {"PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    if "RADIXMETA_IMPLEMENTATION" in os.environ:
        env["RADIXMETA_IMPLEMENTATION"] = os.environ["RADIXMETA_IMPLEMENTATION"]
    cells: list[dict[str, Any]] = []
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, runtime_env={"env_vars": env})
    try:
        serve.start(proxy_location="Disabled")
        for repeat in range(args.repeats):
            for w, ps in prompts.items():
                for n in args.replicas:
                    for r in args.routers:
                        cell = run_cell(w, ps, n, r, args, repeat)
                        cells.append(cell)
                        write_json(cells, reference, args)
                        print(f"[{repeat}] " + table([cell], "").splitlines()[-1],
                              file=sys.stderr, flush=True)
        report(cells, reference, args)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()


if __name__ == "__main__":
    main()
