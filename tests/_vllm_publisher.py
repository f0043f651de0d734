"""A child process that runs vLLM's own ZmqEventPublisher (vllm/distributed/kv_events.py).

Run by a vLLM virtualenv's interpreter (``RADIXMETA_VLLM_PYTHON``, default
/work/venv-vllm/bin/python, made with ``pip install --no-deps vllm==0.33.0 msgspec pyzmq
psutil urllib3``). vLLM's package ``__init__`` and config modules import torch, which that
venv lacks, so the few modules kv_events.py imports besides zmq and msgspec are stood in
for (its logger, its config dataclass, a type alias): the publisher, its wire format, its
sequence numbers and its replay socket are vLLM's own code.

Commands, one per stdin line: ``store K`` publishes a batch with one block (hash K, tokens
[K] * block size); ``exit`` shuts the publisher down. Prints ``ready`` once it is bound.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import sys
import types

_SPEC = importlib.util.find_spec("vllm")  # found, not imported (its __init__ needs torch)
assert _SPEC is not None and _SPEC.origin is not None, "vllm is not installed here"
SITE = os.path.dirname(_SPEC.origin)


def _package(name: str) -> None:
    module = types.ModuleType(name)
    module.__path__ = [os.path.join(SITE, *name.split(".")[1:])]
    sys.modules[name] = module


def _module(name: str, **attrs: object) -> None:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    sys.modules[name] = module


@dataclasses.dataclass
class _KVEventsConfig:  # vllm.config.kv_events.KVEventsConfig's fields, as the publisher sets them
    enable_kv_cache_events: bool = False
    publisher: str = "zmq"
    endpoint: str = ""
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""


for _name in ("vllm", "vllm.config", "vllm.utils", "vllm.distributed", "vllm.v1", "vllm.v1.core"):
    _package(_name)
_module("vllm.v1.core.kv_cache_utils", ExternalBlockHash=bytes | int)
_module("vllm.logger", init_logger=logging.getLogger)
_module("vllm.config.kv_events", KVEventsConfig=_KVEventsConfig)

from vllm.distributed.kv_events import (  # noqa: E402
    BlockStored,
    KVEventBatch,
    ZmqEventPublisher,
)


def main() -> None:
    endpoint, replay, block_size = sys.argv[1], sys.argv[2], int(sys.argv[3])
    publisher = ZmqEventPublisher(
        data_parallel_rank=0, endpoint=endpoint, replay_endpoint=replay or None
    )
    print("ready", flush=True)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "exit":
            break
        k = int(rest[0])
        event = BlockStored(
            block_hashes=[k], parent_block_hash=None, token_ids=[k] * block_size,
            block_size=block_size, lora_id=None, medium="GPU", lora_name=None,
        )
        publisher.publish(KVEventBatch(ts=float(k), events=[event]))
        print("published", flush=True)
    publisher.shutdown()


if __name__ == "__main__":
    main()
