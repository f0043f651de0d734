"""What radixmeta's approximate model of a stand-in replica holds, against the replica itself.

In-process, no Ray: the Ray bench's ``evict`` workload (``gsp``, 16 groups of a
1,024-token system prompt and 64-token questions, 300 requests) on ``StandinReplica``
caches of ``--capacity`` tokens, routed by a radixmeta ``Router`` in approximate mode
(the default policy, every worker with the replica's capacity), as
``RadixMetaRequestRouter`` routes them in Ray Serve. A closed loop keeps
``--concurrency`` requests in flight: each replica serves its queue in order, one
request at a time (the stand-in's prefill slot), and the busiest queue serves next.

Per cell (stand-in eviction granularity, replicas, the estimate):

- ``real``: the replicas' hit rate (cached / prompt tokens, as their caches found them);
- ``model``: what the router's model matched on the chosen replica at dispatch;
- ``expected``: the estimate there (``Decision.matched``);
- ``drift``: after each request, tokens the model holds for the replica that served
  it less what the replica holds (mean and max; by pages it is the prompts queued
  there, which the model wrote at their dispatch and the replica has yet to serve).

``--estimate queued`` also runs the estimate as it was before this script (the queue
rule of exact mode, cutting the match by the prompts queued ahead, which the model
has already written). Time in the stand-ins is 0: this compares states, not latency.

    python bench/ray_standin_drift.py --replicas 4,8 --json-out drift.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from radixmeta import Router  # noqa: E402
from radixmeta.integrations.ray import StandinReplica  # noqa: E402
from radixmeta.router.estimate import Estimate  # noqa: E402
from radixmeta.sim.workloads import gsp  # noqa: E402


def prompts(args: argparse.Namespace) -> list[list[int]]:
    per_group = -(-args.requests // args.groups)
    w = gsp(num_groups=args.groups, prompts_per_group=per_group, system_prompt_len=args.system,
            question_len=args.question, vocab_size=94, seed=args.seed)
    return [[int(t) + 33 for t in r.tokens] for r in list(w)[: args.requests]]


def cell(stream: list[list[int]], replicas: int, granularity: str, estimate: str,
         args: argparse.Namespace) -> dict[str, Any]:
    page = args.page_size
    router = Router(page, mode="approximate")
    if estimate == "queued":  # the estimate before: exact mode's rule on the model
        router._estimate = Estimate(page)
    workers = [router.add_worker(f"r{i}", capacity=args.capacity) for i in range(replicas)]
    standins = {w.index: StandinReplica(page_size=page, capacity=args.capacity,
                                        time_scale=0.0, granularity=granularity,
                                        name=w.name) for w in workers}
    queues: dict[int, deque[Any]] = {w.index: deque() for w in workers}
    pending = deque(stream)
    total = real = model = expected = 0
    drift: list[int] = []
    while pending or any(queues.values()):
        while pending and sum(len(q) for q in queues.values()) < args.concurrency:
            tokens = pending.popleft()
            d = router.dispatch(tokens)
            model += d._view.lengths[d._view.workers.index(d.worker)]
            expected += d.matched
            total += len(tokens)
            queues[d.worker.index].append((d, tokens))
        busiest = max(queues, key=lambda k: len(queues[k]))
        d, tokens = queues[busiest].popleft()
        answer = asyncio.run(standins[busiest]({"input_ids": tokens}))
        real += answer["cached_tokens"]
        router.finish(d.request_id)
        drift.append(router.tree.held_tokens(d.worker) - standins[busiest].cache.total_size)
    return {"granularity": granularity, "replicas": replicas, "estimate": estimate,
            "real": real / total, "model": model / total, "expected": expected / total,
            "drift_mean": float(np.mean(drift)), "drift_max": int(max(drift))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--replicas", default="4,8")
    p.add_argument("--granularity", default="page,node")
    p.add_argument("--estimate", default="match,queued",
                   help="match (approximate mode's estimate now), queued (before)")
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--capacity", type=int, default=2048)
    p.add_argument("--page-size", type=int, default=16)
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--system", type=int, default=1024)
    p.add_argument("--question", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json-out", type=Path)
    args = p.parse_args()
    stream = prompts(args)
    cells = [
        cell(stream, int(n), g, e, args)
        for g in args.granularity.split(",")
        for n in args.replicas.split(",")
        for e in args.estimate.split(",")
    ]
    head = f"{'evicts by':<10}{'rep':>4} {'estimate':<9}{'real %':>8}{'model %':>9}" \
           f"{'expected %':>11}{'drift mean':>11}{'max':>6}"
    print(head)
    print("-" * len(head))
    for c in cells:
        print(f"{c['granularity']:<10}{c['replicas']:>4} {c['estimate']:<9}"
              f"{100 * c['real']:>8.1f}{100 * c['model']:>9.1f}{100 * c['expected']:>11.1f}"
              f"{c['drift_mean']:>11.1f}{c['drift_max']:>6}")
    if args.json_out is not None:
        doc = {"bench": "ray_standin_drift", "command": " ".join(["python", *sys.argv]),
               "load_average_1m": os.getloadavg()[0], "settings": vars(args) | {
                   "json_out": str(args.json_out)}, "cells": cells}
        args.json_out.write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
