"""End to end: two engine processes publish their caches' events over loopback ZeroMQ, a
Router subscribes, and its per-worker lengths follow what the engines cache and evict.

Everything closes within a bound: the router (its background thread and subscription
sockets) and the child processes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
from _policies import Longest
from _ports import free_port_block
from _router_children import engine
from _transport_children import expect, spawned

from radixmeta import Router
from radixmeta.errors import InvalidInputError, StaleWorkerError
from radixmeta.events import Stored
from radixmeta.subscription import WorkerEndpoint

pytestmark = pytest.mark.timeout(60)

PAGE = 4


def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "the router never caught up"
        time.sleep(0.01)


def test_a_subscribed_router_follows_the_engines_caches() -> None:
    system = list(range(100, 116))  # 4 pages every prompt shares
    a_prompt, b_prompt = [*system, 1, 1, 1, 1, 2, 2, 2, 2], [*system, 7, 7, 7, 7]
    with contextlib.ExitStack() as stack:
        children = {
            name: stack.enter_context(spawned(engine, name, PAGE)) for name in ("e0", "e1")
        }
        endpoints = {name: expect(conn, "ready") for name, conn in children.items()}
        router = stack.enter_context(Router(PAGE, policy=Longest()))
        subscription = router.subscribe(
            [WorkerEndpoint(n, live, replay) for n, (live, replay) in endpoints.items()],
            codec="native",
            replay_timeout=1.0,
        )
        assert subscription.subscriber.wait_connected(timeout=10)
        e0, e1 = router.worker("e0"), router.worker("e1")
        router.start(interval=0.005)  # the router's idle loop: receive and replay

        children["e0"].send(("insert", [a_prompt]))
        children["e1"].send(("insert", [b_prompt]))
        assert expect(children["e0"], "done") == (len(a_prompt),)
        assert expect(children["e1"], "done") == (len(b_prompt),)

        def reported(key: list[int]) -> dict[str, int]:
            m = router.tree.match(key, optimistic=False)
            return {"e0": m.length_of(e0), "e1": m.length_of(e1)}

        until(lambda: reported(a_prompt) == {"e0": 24, "e1": 16})
        assert reported(b_prompt) == {"e0": 16, "e1": 20}
        d = router.dispatch([*a_prompt, 9, 9, 9, 9])
        assert d.worker == e0 and d.lengths == {e0: 24, e1: 16}
        d2 = router.dispatch([*b_prompt, 8, 8, 8, 8])
        assert d2.worker == e1 and d2.matched == 20

        # e0 evicts everything: the router's reported view follows, its own hold stays.
        children["e0"].send(("evict", 10_000))
        assert expect(children["e0"], "done") == (0,)
        until(lambda: reported(a_prompt)["e0"] == 0)
        assert router.tree.match(a_prompt).length_of(e0) == 24  # d's hold, until it finishes
        router.finish(d.request_id)
        router.finish(d2.request_id)
        assert router.tree.match(a_prompt).length_of(e0) == 0
        state = {w["worker"]: w for w in subscription.worker_state()}
        assert state["e0"]["applied"] >= 2 and state["e1"]["gaps"] == 0
        assert router.metrics()["replay"]["stats"]["applied"] >= 3

        started = time.monotonic()
        router.close()
        assert time.monotonic() - started < 5
        assert subscription.subscriber.closed and router.closed
        assert not [t for t in threading.enumerate() if t.name == "radixmeta-router"]
        for conn in children.values():
            conn.send(("exit",))
    router.tree.check()


def test_unsubscribe_and_closing_a_subscription_detach_it() -> None:
    """unsubscribe(worker) closes the subscription that feeds it and the router asks it
    nothing more; a subscription closed by its owner detaches itself the same way."""
    base = free_port_block(4)
    with Router(PAGE, policy=Longest()) as router:
        one = router.subscribe(
            [WorkerEndpoint("w0", f"tcp://127.0.0.1:{base}", f"tcp://127.0.0.1:{base + 1}")],
            codec="native",
        )
        other = router.subscribe(
            [WorkerEndpoint("w1", f"tcp://127.0.0.1:{base + 2}", f"tcp://127.0.0.1:{base + 3}")],
            codec="native",
        )
        w0, w1 = router.worker("w0"), router.worker("w1")
        assert router.unsubscribe(w0) is one
        assert one.subscriber.closed and not other.subscriber.closed
        assert router.unsubscribe(w0) is None  # nothing feeds it any more
        router.idle()  # polls only what is still subscribed (a closed one would raise)
        # A gap of w0 is no longer asked of its closed subscription (which would raise
        # TransportClosedError): no source can serve it, so w0 is resynced, as stale.
        router.submit([Stored("w0", 0, 0, key=np.arange(4, dtype=np.uint32)),
                       Stored("w0", 0, 5, key=np.arange(8, dtype=np.uint32), start=4)])
        stats = router.replay()
        assert (stats.gaps, stats.stale) == (1, 1)
        other.close()  # closed by its owner: detached from the router too
        router.idle()
        assert router.unsubscribe(w1) is None
        assert w0 in router.workers and w1 in router.workers  # still registered
        with pytest.raises(StaleWorkerError):
            Router(PAGE, policy=Longest()).unsubscribe(w0)
    with pytest.raises(InvalidInputError, match="unsubscribe"):
        Router(PAGE, policy=Longest(), mode="approximate").unsubscribe(w0)
