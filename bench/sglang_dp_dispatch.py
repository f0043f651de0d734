"""What the radixmeta DP dispatcher adds per request to SGLang's DP controller.

Runs in SGLang's virtualenv (``PYTHONPATH=. /work/venv-sgl/bin/python
bench/sglang_dp_dispatch.py``). The controller is built without schedulers
(``__new__``, as the tests do); each rank's socket only counts what it is sent,
so the numbers are the dispatch itself: SGLang's round robin, then the
dispatcher (a match, the policy, the bookkeeping) with every rank holding a
shared prefix reported through real loopback KV events. Prints a table;
``--json`` prints the numbers instead.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
import warnings
from array import array
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from _ports import free_port_block


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=4)
    parser.add_argument("--page-size", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=2048)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--policy", default="default")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    import _torchvision_shim

    _torchvision_shim.install()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.managers import data_parallel_controller as dpc
        from sglang.srt.managers.io_struct import TokenizedGenerateReqInput
        from sglang.srt.sampling.sampling_params import SamplingParams

    from radixmeta.integrations.sglang import dispatch as D
    from radixmeta.transport import ZmqPublisher
    from radixmeta.wire import BlockStored, EventBatch, sglang

    class Sink:
        def send(self, data: bytes, flags: int = 0) -> None:
            pass

        def send_pyobj(self, obj: Any, flags: int = 0, protocol: int = 0) -> None:
            pass

    def controller(kv: str | None) -> Any:
        c = dpc.DataParallelController.__new__(dpc.DataParallelController)
        c.workers = [Sink() for _ in range(args.dp)]
        c.launch_dp_size = args.dp
        c.status = [True] * args.dp
        c._active_workers = list(range(args.dp))
        c.round_robin_counter = 0
        c.dispatching = c.round_robin_scheduler
        c.load_snapshot_reader = type("R", (), {"read_all": lambda self: []})()
        c.server_args = type("A", (), {"kv_events_config": kv, "page_size": args.page_size,
                                       "dp_size": args.dp})()
        return c

    rng = np.random.default_rng(0)
    groups = [rng.integers(0, 32000, args.prompt - 64).tolist() for _ in range(8)]
    reqs = []
    for i in range(args.requests):
        tokens = groups[i % len(groups)] + rng.integers(0, 32000, 64).tolist()
        reqs.append(TokenizedGenerateReqInput(
            input_text=None, input_ids=array("q", tokens), input_embeds=None, mm_inputs=None,
            token_type_ids=None, sampling_params=SamplingParams(), return_logprob=False,
            logprob_start_len=-1, top_logprobs_num=0, token_ids_logprob=None, stream=False,
            rid=f"r{i}"))

    def run(c: Any) -> dict[str, float]:
        # SGLang's import leaves a large heap whose first full collection (about 0.4 s
        # here) falls on whatever allocates next; a long-running controller paid it
        # at startup. Collect and freeze it first, so the timing is the dispatch's.
        gc.collect()
        gc.freeze()
        samples = []
        clock = time.perf_counter_ns
        for r in reqs:
            t0 = clock()
            c.dispatching(r)
            samples.append(clock() - t0)
        gc.unfreeze()
        us = np.array(samples) / 1e3
        return {
            "mean": float(us.mean()),
            "p50": float(np.percentile(us, 50)),
            "p99": float(np.percentile(us, 99)),
            "max": float(us.max()),
        }

    rr = run(controller(None))
    base = free_port_block(args.dp)
    pubs = [ZmqPublisher(f"tcp://127.0.0.1:{base + r}", bind=True) for r in range(args.dp)]
    c = controller(f'{{"publisher": "zmq", "endpoint": "tcp://*:{base}"}}')
    d = D.install(c, c.server_args, policy=args.policy)
    time.sleep(0.3)
    for g, tokens in enumerate(groups):  # each group's prefix held by one rank
        n = len(tokens) // args.page_size
        ev = BlockStored(np.arange(1 + g * 10_000, 1 + g * 10_000 + n, dtype=np.uint64), None,
                         np.array(tokens[: n * args.page_size], np.uint32), args.page_size,
                         medium="GPU")
        pubs[g % args.dp].publish(sglang.encode_batch(EventBatch(time.time(), [ev], 0),
                                                      version="0.5.23"))
    time.sleep(0.5)
    radix = run(c)
    m = d.metrics()
    d.close()
    for p in pubs:
        p.close()
    hit = m["router"]["workers"]
    hits = sum(w["hit_tokens"] for w in hit) / max(1, sum(w["prompt_tokens"] for w in hit))
    out = {
        "dp": args.dp, "page_size": args.page_size, "prompt": args.prompt,
        "requests": args.requests, "policy": args.policy,
        "round_robin_us": {k: round(v, 2) for k, v in rr.items()},
        "radixmeta_us": {k: round(v, 2) for k, v in radix.items()},
        "dispatcher_mean_us": round(m["mean_overhead_us"], 2),
        "estimated_hit_rate": round(hits, 3),
    }
    if args.json:
        print(json.dumps(out))
        return
    print(f"{'dispatch, us/request':<26}{'p50':>9}{'p99':>9}{'max':>9}{'mean':>9}")
    for name, row in (("SGLang round robin", rr), (f"radixmeta ({args.policy})", radix)):
        print(f"{name:<26}{row['p50']:>9.2f}{row['p99']:>9.2f}{row['max']:>9.2f}{row['mean']:>9.2f}")
    print(f"dp={args.dp} page={args.page_size} prompt={args.prompt} requests={args.requests} "
          f"estimated hit rate {hits:.1%}")


if __name__ == "__main__":
    main()
