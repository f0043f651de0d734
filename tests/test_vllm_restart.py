"""vLLM's real KV-event publisher restarted after 6 batches: the router follows the new engine.

Optional: it runs vLLM's own ``ZmqEventPublisher`` in a child process of a vLLM virtualenv
(``tests/_vllm_publisher.py``; ``RADIXMETA_VLLM_PYTHON``, default /work/venv-vllm/bin/python)
and is skipped when that interpreter is absent. The new engine numbers its batches from 0
again; without the reconnect the subscriber's socket monitor reports, those seqs were
dropped as duplicates and the router kept the dead engine's pages for good (issue 18).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from _policies import Longest
from _ports import free_port_block

from radixmeta import Router
from radixmeta.events.subscription import WorkerEndpoint

PYTHON = os.environ.get("RADIXMETA_VLLM_PYTHON", "/work/venv-vllm/bin/python")
CHILD = Path(__file__).with_name("_vllm_publisher.py")
PAGE = 4

pytestmark = [
    pytest.mark.timeout(60),
    pytest.mark.skipif(
        not os.access(PYTHON, os.X_OK),
        reason=f"no vLLM virtualenv at {PYTHON} (set RADIXMETA_VLLM_PYTHON; see the module)",
    ),
]


@contextmanager
def vllm_engine(live: str, replay: str) -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen(
        [PYTHON, str(CHILD), live, replay, str(PAGE)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        yield proc
    finally:
        proc.kill()
        proc.wait(10)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


def store(proc: subprocess.Popen[str], k: int) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"store {k}\n")
    proc.stdin.flush()
    assert proc.stdout.readline().strip() == "published"


def until(condition: object, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "the router never caught up"
        time.sleep(0.005)


def test_the_router_follows_a_restarted_vllm_engine() -> None:
    base = free_port_block(1)
    replay_base = free_port_block(1)
    live, replay = f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{replay_base}"
    with Router(PAGE, policy=Longest()) as router:
        # vLLM connects a PUB given a host's address (it binds only wildcards), so the
        # router's SUB binds the loopback endpoint and the engine connects to it.
        sub = router.subscribe([WorkerEndpoint("w0", live, replay)], codec="vllm", bind=True)
        router.start(interval=0.002)
        w0 = router.worker("w0")

        def holds(k: int) -> int:
            return router.tree.match([k] * PAGE, optimistic=False).length_of(w0)

        with vllm_engine(live, replay) as engine:
            until(lambda: sub.subscriber.connections == (1,))
            time.sleep(0.2)  # the subscription reaches the publisher after the handshake
            for k in range(1, 7):
                store(engine, k)
            until(lambda: router.tree.held_tokens(w0) == 6 * PAGE)
            # A probe of the replay socket sent before the live batches arrived (the router's
            # start or idle probe, on a loaded machine) is answered with them again: the
            # first engine's duplicates, rightly counted as such.
            time.sleep(0.3)
            duplicates_before = router.replayer.worker_stats("w0").duplicates
        with vllm_engine(live, replay) as engine:  # killed and started again: seqs from 0
            until(lambda: sub.subscriber.connections == (2,))
            time.sleep(0.2)
            store(engine, 100)
            # Within one batch the view is the new engine's: its block, none of the old.
            until(lambda: router.tree.held_tokens(w0) == PAGE and holds(100) == PAGE)
            assert all(holds(k) == 0 for k in range(1, 7))
            stats = router.replayer.worker_stats("w0")
            # None of the new engine's batches is taken for a duplicate.
            assert stats.restarts == 1 and stats.duplicates == duplicates_before
