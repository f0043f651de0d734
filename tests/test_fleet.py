"""Fault injection on loopback ZeroMQ: a router subscribed to a fleet converges to its truth.

Each worker rank is a real RadixCache with an EventLog, publishing its records with
radixmeta's native codec through a vLLM-compatible publisher (PUB + replay ROUTER) on
127.0.0.1. The publishers drop, repeat and reorder batches, send a malformed frame,
overflow a slow subscriber and restart with their sequence reset; one worker's replay
socket never answers. After the router catches up, the MetaTree equals every worker's
cache, and the worker whose gap could not be replayed is in the documented
cleared-and-stale state.
"""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from _ports import free_port_block

from radixmeta import EventLog, RadixCache
from radixmeta.subscription import FleetSubscription, WorkerEndpoint
from radixmeta.transport import ZmqPublisher
from radixmeta.transport._frames import live_frames
from radixmeta.wire import native

pytestmark = pytest.mark.timeout(90)

PAGE = 4


class FaultyPublisher(ZmqPublisher):
    """A publisher that can also lose, repeat, reorder and garble what it sends."""

    def keep_only(self, payload: bytes) -> int:
        """Buffer a batch for replay without sending it live (a lost message)."""
        with self._pub_lock:
            return self._buffer.append(payload)

    def send_again(self, seq: int) -> None:
        """Send a buffered batch live once more (a duplicate, or a late one)."""
        ((held, payload),) = self._buffer.read(seq, limit=1)
        with self._pub_lock:
            self._pub.send_multipart(live_frames(self.topic, held, payload))

    def send_raw(self, *frames: bytes) -> None:
        with self._pub_lock:
            self._pub.send_multipart(frames)


class Rank:
    """One dp rank of a worker: its cache, its log and its publisher."""

    def __init__(
        self, name: str, rank: int, port: int, replay_port: int | None, hwm: int = 100_000
    ) -> None:
        self.name, self.rank, self.port, self.replay_port = name, rank, port, replay_port
        self.hwm = hwm
        self.rng = random.Random(f"{name}-{rank}")
        self.start()

    def start(self) -> None:
        self.log = EventLog(worker=self.name, dp_rank=self.rank)
        self.cache = RadixCache(PAGE, capacity=96, event_log=self.log)
        replay = None if self.replay_port is None else f"tcp://127.0.0.1:{self.replay_port}"
        self.pub = FaultyPublisher(
            f"tcp://127.0.0.1:{self.port}", replay_endpoint=replay, bind=True, hwm=self.hwm
        )
        self.seen = -1

    def restart(self) -> None:
        self.pub.close()
        self.start()

    def traffic(self, steps: int = 3) -> None:
        for _ in range(steps):
            key = [self.rng.randrange(3) for _ in range(self.rng.randrange(4, 28))]
            self.cache.insert(key)

    def payload(self) -> bytes | None:
        records = self.log.read(after=self.seen)
        if not records:
            return None
        self.seen = records[-1].seq
        return native.encode_batch(records, worker=self.name, dp_rank=self.rank)

    def publish(self, how: str = "send") -> int | None:
        data = self.payload()
        if data is None:
            return None
        return self.pub.keep_only(data) if how == "drop" else self.pub.publish(data)


@pytest.fixture
def fleet() -> Iterator[dict[str, Any]]:
    base_a, base_b, base_m = free_port_block(4), free_port_block(4), free_port_block(2)
    ranks = {
        ("w0", 0): Rank("w0", 0, base_a, base_a + 2),
        ("w0", 1): Rank("w0", 1, base_a + 1, base_a + 3, hwm=4),  # the one a burst overflows
        ("w1", 0): Rank("w1", 0, base_b, base_b + 2),
        ("w1", 1): Rank("w1", 1, base_b + 1, base_b + 3),
        ("mute", 0): Rank("mute", 0, base_m, None),
    }
    # The mute worker's replay endpoint is a ROUTER that reads requests and never answers.
    ctx = zmq.Context()
    silent = ctx.socket(zmq.ROUTER)
    silent.setsockopt(zmq.LINGER, 0)
    silent.bind(f"tcp://127.0.0.1:{base_m + 1}")
    workers = [
        WorkerEndpoint("w0", f"tcp://127.0.0.1:{base_a}", f"tcp://127.0.0.1:{base_a + 2}", 2),
        WorkerEndpoint("w1", f"tcp://127.0.0.1:{base_b}", f"tcp://127.0.0.1:{base_b + 2}", 2),
        WorkerEndpoint("mute", f"tcp://127.0.0.1:{base_m}", f"tcp://127.0.0.1:{base_m + 1}", 1),
    ]
    sub = FleetSubscription(
        workers, codec="native", block_size=PAGE, replay_timeout=0.3, restart_window=2, hwm=8
    )
    try:
        assert sub.subscriber.wait_connected(timeout=10)
        for r in ranks.values():
            assert r.pub.wait_subscribers(1, timeout=10)
        yield {"ranks": ranks, "sub": sub}
    finally:
        sub.close()
        for r in ranks.values():
            r.pub.close()
        silent.close()
        ctx.term()


def catch_up(sub: FleetSubscription) -> None:
    """Receive until a quiet moment, probe for losses at the tail, apply everything pending."""
    while sub.poll(timeout=0.3):
        pass
    sub.replayer.replay()
    sub.probe()
    sub.replayer.replay()


def mirrors(sub: FleetSubscription, rank: Rank) -> bool:
    tree = sub.tree
    w = tree.worker(rank.name, rank.rank)
    if tree.held_tokens(w) != rank.cache.total_size:
        return False
    return all(tree.match(key).length_of(w) == len(key) for key, _ in rank.cache.items())


def test_the_router_converges_despite_the_transport(fleet: dict[str, Any]) -> None:
    ranks, sub = fleet["ranks"], fleet["sub"]
    for round_ in range(12):
        for key, r in ranks.items():
            r.traffic()
            if key == ("w0", 0) and round_ == 2:
                r.publish("drop")  # lost: the next batch shows a gap, replay fills it
                r.traffic()
                r.publish()
            elif key == ("w0", 1) and round_ == 3:
                seq = r.publish()
                if seq is not None:
                    r.pub.send_again(seq)  # delivered twice
            elif key == ("w1", 0) and round_ == 4:
                late = r.publish("drop")
                r.traffic()
                r.publish()
                if late is not None:
                    r.pub.send_again(late)  # arrives after the batch that followed it
            elif key == ("w1", 1) and round_ == 5:
                r.pub.send_raw(r.pub.topic, b"1234567", b"x")  # a 7-byte seq: malformed
                r.publish()
            elif key == ("mute", 0) and round_ == 6:
                r.publish("drop")  # lost, and its replay socket never answers
                r.traffic()
                r.publish()
            else:
                r.publish()
        catch_up(sub)
    # A slow subscriber: a burst far past its high-water mark while it does not read.
    burst = ranks[("w0", 1)]
    for _ in range(3000):
        burst.traffic(1)
        burst.publish()
    # A restart: the worker comes back empty, numbering its batches from 0 again.
    restarted = ranks[("w1", 1)]
    restarted.restart()
    # The subscriber reconnects on its own, but only while its sockets are used (reference
    # note 1.2): keep polling until the new publisher sees the subscription.
    deadline = time.monotonic() + 10
    while not restarted.pub.wait_subscribers(1, timeout=0.05):
        sub.poll(timeout=0.05)
        assert time.monotonic() < deadline, "the subscriber never reconnected"
    for _ in range(4):
        restarted.traffic()
        restarted.publish()
    catch_up(sub)

    for key in [("w0", 0), ("w0", 1), ("w1", 0), ("w1", 1)]:
        assert mirrors(sub, ranks[key]), f"{key} differs from its cache"
    state = {(w["worker"], w["dp_rank"]): w for w in sub.worker_state()}
    assert state[("w0", 0)]["gaps"] >= 1 and state[("w0", 0)]["replays"] >= 1
    assert state[("w0", 1)]["duplicates"] >= 1 and state[("w0", 1)]["gaps"] >= 1  # the burst
    assert state[("w1", 0)]["gaps"] >= 1 and state[("w1", 0)]["duplicates"] >= 1
    assert state[("w1", 1)]["restarts"] == 1
    assert sub.subscriber.stats.malformed >= 1
    # The mute worker: cleared at its gap, then rebuilt only from the records after it.
    mute = state[("mute", 0)]
    assert mute["resyncs"] == 1 and mute["gaps"] == 1
    assert sub.subscriber.stats.replay_timeouts >= 1
    assert mute["tokens"] <= ranks[("mute", 0)].cache.total_size
    sub.tree.check()


def test_an_undecodable_batch_is_dropped_and_counted(fleet: dict[str, Any]) -> None:
    ranks, sub = fleet["ranks"], fleet["sub"]
    r = ranks[("w0", 0)]
    r.traffic()
    r.publish()
    r.pub.publish(b"\xc1 not msgpack")  # a whole batch that does not decode
    catch_up(sub)
    assert sub.decode_errors >= 1
    r.traffic()
    r.publish()
    catch_up(sub)
    w0 = {(w["worker"], w["dp_rank"]): w for w in sub.worker_state()}[("w0", 0)]
    # The batch after it shows a gap; its replay does not decode either, so w0/0 resyncs
    # (no snapshot from this publisher): cleared, then only what followed.
    assert w0["gaps"] == 1 and w0["resyncs"] == 1
    sub.tree.check()


def test_routers_on_the_same_publishers_converge_to_the_same_tree() -> None:
    base = free_port_block(4)
    ranks = [Rank(f"w{i}", 0, base + 2 * i, base + 2 * i + 1) for i in range(2)]
    workers = [
        WorkerEndpoint(r.name, f"tcp://127.0.0.1:{r.port}", f"tcp://127.0.0.1:{r.replay_port}")
        for r in ranks
    ]
    routers = [
        FleetSubscription(workers, codec="native", block_size=PAGE, replay_timeout=1.0)
        for _ in range(2)
    ]
    try:
        for router in routers:
            assert router.subscriber.wait_connected(timeout=10)
        for r in ranks:
            assert r.pub.wait_subscribers(2, timeout=10)
        for round_ in range(10):
            for r in ranks:
                r.traffic()
                r.publish("drop" if round_ % 4 == 1 else "send")
            routers[round_ % 2].poll(timeout=0.05)  # the two read at different moments
        for router in routers:
            catch_up(router)

        def pages(router: FleetSubscription, name: str) -> set[tuple[int, ...]]:
            """The worker's pages, each named by its full path: the tree's meaning, which
            (unlike its node boundaries) does not depend on the order records arrived in."""
            out = set()
            for record in router.tree.dump(router.tree.worker(name)):
                path = tuple(record.key.tolist())
                out.update(path[:end] for end in range(record.start + PAGE, len(path) + 1, PAGE))
            return out

        for r in ranks:
            assert pages(routers[0], r.name) == pages(routers[1], r.name)
        for r in ranks:
            assert all(mirrors(router, r) for router in routers)
    finally:
        for router in routers:
            router.close()
        for r in ranks:
            r.pub.close()
