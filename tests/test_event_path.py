"""Nothing from outside stops a router's event path (issue 18), on real loopback ZeroMQ.

The Router's event thread is supervised and survives what its turns raise and a closed
subscription; bad batches are counted per worker; a repair waiting on a dead replay
socket holds no lock (replay, metrics, dispatch and close do not wait for it); a quick
restart is a new stream, not duplicates; a batch is filed under its endpoint's worker;
only configured workers have cursors; pending records are bounded; a router started
after the engines went quiet finds what they published by probing; a subscriber
re-subscribes to a restarted publisher without a recv; a DP port layout whose ranks
collide is refused.

Bounds on time here are liveness checks an order of magnitude from the failure they
catch (a lock held for a whole socket timeout), not performance figures.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
from _policies import Longest
from _ports import free_port_block

from radixmeta import EventLog, MetaTree, RadixCache, Router
from radixmeta.errors import InvalidInputError
from radixmeta.events import LogSource, Replayer, Stored
from radixmeta.events.ingest import engine_batch
from radixmeta.events.subscription import FleetSubscription, WorkerEndpoint, check_ports
from radixmeta.transport import ZmqPublisher, ZmqSubscriber
from radixmeta.wire import native, vllm

pytestmark = pytest.mark.timeout(60)

PAGE = 4


def until(condition: Callable[[], bool], seconds: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} never happened"
        time.sleep(0.005)


def tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


class Engine:
    """A worker: a RadixCache whose log a ZmqPublisher sends, natively or as vLLM does."""

    def __init__(self, name: str, port: int, replay_port: int | None, codec: str) -> None:
        self.name, self.codec = name, codec
        form = "blocks" if codec == "vllm" else "path"
        self.log = EventLog(worker=name, form=form)
        self.cache = RadixCache(PAGE, event_log=self.log)
        replay = None if replay_port is None else tcp(replay_port)
        self.pub = ZmqPublisher(tcp(port), replay_endpoint=replay, bind=True)
        self.seen = -1

    def payload(self, worker: str | None = None) -> bytes:
        records = self.log.read(after=self.seen)
        if records:
            self.seen = records[-1].seq
        if self.codec == "vllm":
            return vllm.encode_batch(engine_batch(list(records), block_size=PAGE))
        return native.encode_batch(records, worker=worker or self.name, dp_rank=0)

    def insert(self, key: list[int]) -> int:
        self.cache.insert(key)
        return self.pub.publish(self.payload())

    def close(self) -> None:
        self.pub.close()


def mirrors(tree: Any, name: str, cache: RadixCache) -> bool:
    w = tree.worker(name)
    if tree.held_tokens(w) != cache.total_size:
        return False
    return all(tree.match(key, optimistic=False).length_of(w) == len(key) for key, _ in
               cache.items())


@pytest.fixture
def ports() -> Iterator[int]:
    yield free_port_block(8)


# -- the supervised thread -----------------------------------------------------------------
def test_a_turn_that_raises_is_logged_counted_and_the_thread_goes_on() -> None:
    with Router(PAGE, policy=Longest()) as router:
        real, failures = router.idle, [0]

        def flaky(**budget: Any) -> Any:
            if failures[0] < 3:
                failures[0] += 1
                msg = "a bug in a turn"
                raise RuntimeError(msg)
            return real(**budget)

        router.idle = flaky  # type: ignore[method-assign]
        router.start(interval=0.001)
        until(lambda: router.health()["thread"]["turns"] > 5, what="turns after the errors")
        thread = router.health()["thread"]
        assert (thread["alive"], thread["state"], thread["errors"]) == (True, "running", 3)
        assert "a bug in a turn" in thread["last_error"]
        w = router.add_worker("w0")
        router.submit([Stored("w0", 0, 0, key=np.arange(8, dtype=np.uint32))])
        until(lambda: router.tree.match(list(range(8))).length_of(w) == 8, what="the apply")
        text = router.metrics_text()
        assert "radixmeta_router_event_thread_up 1.0" in text
        assert 'radixmeta_router_event_thread_state{state="running"} 1.0' in text
    assert router.health()["thread"]["state"] == "stopped"


def test_closing_a_subscription_and_bad_batches_never_stop_the_thread(ports: int) -> None:
    engine = Engine("w0", ports, ports + 4, "native")
    try:
        with Router(PAGE, policy=Longest()) as router:
            sub = router.subscribe(
                [WorkerEndpoint("w0", tcp(ports), tcp(ports + 4))],
                codec="native",
                replay_timeout=0.5,
            )
            assert sub.subscriber.wait_connected(timeout=10)
            assert engine.pub.wait_subscribers(1, timeout=10)
            router.start(interval=0.002)
            engine.insert([1, 2, 3, 4])
            # Bombs: nested 1,000 deep, a namespace that is not UTF-8, plain garbage. Each
            # is dropped whole and counted for w0; the next good batch shows the gap.
            engine.pub.publish(b"\x91" * 1000 + b"\xc0")
            engine.pub.publish(b"\xff\x00garbage")
            engine.insert([1, 2, 3, 4, 5, 6, 7, 8])  # the gap: replay brings the bombs again
            engine.insert([9, 9, 9, 9])
            until(lambda: sub.intake[("w0", 0)].decode_errors >= 2, what="the decode errors")
            until(lambda: router.tree.match([9, 9, 9, 9]).length_of(router.worker("w0")) == 4,
                  what="the batch after the bombs")
            # What the bombs held is lost for good: w0 is stale, and says why.
            (w0,) = router.health()["workers"]
            assert w0["stale"] and "records before seq 3 lost" in w0["last_error"]
            sub.close()  # by its owner: detached, and the thread goes on
            w1 = router.add_worker("w1")
            router.submit([Stored("w1", 0, 0, key=np.arange(4, dtype=np.uint32))])
            until(lambda: router.tree.match([0, 1, 2, 3]).length_of(w1) == 4,
                  what="an apply after the close")
            thread = router.health()["thread"]
            assert thread["alive"] and thread["errors"] == 0
    finally:
        engine.close()


# -- no socket waits under a lock ----------------------------------------------------------
def test_a_repair_on_a_dead_replay_socket_holds_up_nothing(ports: int) -> None:
    """Nothing listens on w0's replay port: its repair waits out a 3 s timeout, while
    replay, health, metrics and dispatch go on at once and close ends it."""
    router = Router(PAGE, policy=Longest())
    try:
        router.subscribe(
            [WorkerEndpoint("w0", tcp(ports), tcp(ports + 1)),
             WorkerEndpoint("w1", tcp(ports + 2), tcp(ports + 3))],
            codec="native",
            replay_timeout=3.0,
        )
        w0, w1 = router.worker("w0"), router.worker("w1")
        router.submit([Stored("w0", 0, 0, key=np.arange(4, dtype=np.uint32)),
                       Stored("w0", 0, 5, key=np.arange(8, dtype=np.uint32), start=4)])
        router.replay(max_seconds=0.05)  # finds the gap and asks, in the background
        until(lambda: router.health()["workers"][0]["repairing"], what="the repair")
        started = time.monotonic()
        router.submit([Stored("w1", 0, 0, key=np.arange(4, dtype=np.uint32))])
        stats = router.replay(max_seconds=0.001)
        assert stats.applied == 1  # the healthy worker's record, behind no one's repair
        router.metrics_text()
        router.metrics()
        router.replayer.worker_stats("w0")
        decision = router.dispatch([0, 1, 2, 3, 9, 9, 9, 9])
        assert decision.lengths[w0] == 4  # what the router holds, while w0 repairs
        assert time.monotonic() - started < 1.0  # each of these would wait ~3 s under a lock
        assert router.health()["workers"][0]["repairing"]  # still waiting on the socket
        assert w1 in decision.lengths
        router.finish(decision.request_id)
        started = time.monotonic()
        router.close()
        assert time.monotonic() - started < 1.0
    finally:
        router.close()


# -- restarts, identity, cursors -----------------------------------------------------------
def test_a_quick_vllm_restart_is_a_new_stream_not_duplicates(ports: int) -> None:
    """A vLLM-format engine restarts after 6 batches with its seqs from 0 again: the
    subscriber's monitor saw it reconnect, so seq 0 starts a new stream, and the view is
    the new engine's as soon as its first batch is applied."""
    engine = Engine("w0", ports, None, "vllm")
    try:
        with Router(PAGE, policy=Longest()) as router:
            sub = router.subscribe([WorkerEndpoint("w0", tcp(ports))], codec="vllm")
            assert sub.subscriber.wait_connected(timeout=10)
            assert engine.pub.wait_subscribers(1, timeout=10)
            router.start(interval=0.002)
            for k in range(6):
                engine.insert([k, k, k, k, 7, 7, 7, 7])
            until(lambda: mirrors(router.tree, "w0", engine.cache), what="the first engine")
            engine.close()
            engine = Engine("w0", ports, None, "vllm")  # same port, new numbering
            assert engine.pub.wait_subscribers(1, timeout=10)
            assert engine.insert([9, 9, 9, 9]) == 0
            until(lambda: mirrors(router.tree, "w0", engine.cache), what="the new engine")
            stats = router.replayer.worker_stats("w0")
            assert (stats.restarts, stats.duplicates) == (1, 0)
            assert router.replayer.lag()[0].newest_seq == 0
    finally:
        engine.close()


def test_a_batch_is_filed_under_its_endpoint_and_only_known_workers_have_cursors(
    ports: int,
) -> None:
    engine = Engine("w0", ports, None, "native")
    try:
        with Router(PAGE, policy=Longest()) as router:
            sub = router.subscribe(
                [WorkerEndpoint("w0", tcp(ports)), WorkerEndpoint("w1", tcp(ports + 1))],
                codec="native",
            )
            assert sub.subscriber.wait_connected(timeout=10) is False  # w1 has no publisher
            assert engine.pub.wait_subscribers(1, timeout=10)
            router.start(interval=0.002)
            engine.cache.insert([5, 5, 5, 5])
            engine.pub.publish(engine.payload(worker="w1"))  # names the other worker
            for k in range(50):
                engine.pub.publish(native.encode_batch([], worker=f"made-up-{k}", dp_rank=0))
            until(lambda: sub.intake[("w0", 0)].identity_mismatch == 51, what="the drops")
            assert router.tree.held_tokens(router.worker("w1")) == 0
            last_error = router.health()["workers"][0]["last_error"] or ""
            assert "names worker 'made-up-49'" in last_error
            router.submit([Stored(f"nobody-{k}", 0, 0, key=np.arange(4, dtype=np.uint32))
                           for k in range(2000)])
            router.replay()  # (or the thread's turn) counts them as they are dropped
            assert router.replayer.stats.unknown_worker == 2000
            assert sorted(w.worker for w in router.replayer.lag()) == ["w0", "w1"]
    finally:
        engine.close()


def test_pending_records_are_bounded_and_the_worker_is_repaired_instead() -> None:
    log = EventLog(worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    tree = MetaTree(PAGE)
    tree.add_worker("w0")
    with Replayer(tree, source=LogSource({("w0", 0): cache}), max_pending=10) as replayer:
        for k in range(100):
            cache.insert([k, k, k, k])
        replayer.submit(log.read())
        assert replayer.pending == 10
        stats = replayer.replay()
        assert (stats.dropped, stats.applied) == (90, 10)
        cache.insert([1000, 1, 1, 1])
        replayer.submit(log.read()[-1:])  # after the dropped ones: a gap, repaired
        stats = replayer.replay()
        assert stats.gaps == 1 and stats.applied == 91
        assert mirrors(tree, "w0", cache)
        assert replayer.worker_stats("w0").dropped == 90


def test_a_router_started_after_the_engines_went_quiet_probes_what_they_published(
    ports: int,
) -> None:
    engine = Engine("w0", ports, ports + 4, "native")
    try:
        for k in range(3):  # published before anyone subscribed: lost on the live stream
            engine.insert([k, k, k, k, 3, 3, 3, 3])
        with Router(PAGE, policy=Longest(), probe_interval=0.05) as router:
            router.subscribe([WorkerEndpoint("w0", tcp(ports), tcp(ports + 4))],
                             codec="native", replay_timeout=1.0)
            router.start(interval=0.002)
            until(lambda: mirrors(router.tree, "w0", engine.cache), what="the probe")
            # Counted a gap once the next probe finds the worker still quiet (lost, not
            # in flight).
            until(lambda: router.replayer.worker_stats("w0").gaps >= 1, what="the gap")
            assert router.replayer.worker_stats("w0").replays_requested >= 1
    finally:
        engine.close()


# -- subscriptions and ports ---------------------------------------------------------------
def test_a_subscriber_resubscribes_to_a_restarted_publisher_without_a_recv(ports: int) -> None:
    pub = ZmqPublisher(tcp(ports), bind=True)
    with ZmqSubscriber([tcp(ports)]) as sub:
        try:
            assert sub.wait_connected(timeout=10) and pub.wait_subscribers(1, timeout=10)
            pub.close()
            pub = ZmqPublisher(tcp(ports), bind=True)
            # No recv in between: the subscriber's keeper sends the subscription again.
            assert pub.wait_subscribers(1, timeout=10)
            seq = pub.publish(b"first batch of the new publisher")
            message = sub.recv(timeout=5)
            assert message is not None and (message.seq, message.payload) == (
                seq, b"first batch of the new publisher")
            assert sub.connections == (2,)
        finally:
            pub.close()


def test_a_dp_layout_whose_ranks_share_a_port_is_refused() -> None:
    colliding = WorkerEndpoint("w", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5558", 2)
    with pytest.raises(InvalidInputError, match="rank 1's live endpoint"):
        check_ports([colliding])
    with pytest.raises(InvalidInputError, match="leave 2 ports"):
        FleetSubscription([colliding], codec="vllm", block_size=PAGE)
    check_ports([WorkerEndpoint("w", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5657", 2)])
    check_ports([WorkerEndpoint("a", "tcp://127.0.0.1:5557", "tcp://127.0.0.1:5559", 2),
                 WorkerEndpoint("b", "tcp://127.0.0.1:5561", "tcp://127.0.0.1:5563", 2)])
