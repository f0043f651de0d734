"""Snapshot resyncs on loopback ZeroMQ: a router that lost more than a worker's buffer.

Each worker is a real RadixCache with an EventLog. A radixmeta worker publishes it with
:class:`LogPublisher` (native codec, snapshots on the replay socket); the router loses
batches in transit (it receives and drops them, as past a high-water mark) until the
worker's replay buffer no longer reaches back. It must then rebuild the worker from the
snapshot, so that its MetaTree pages equal the cache's, also while the worker keeps
changing its cache in another thread. A snapshot that never comes, is refused or does not
decode leaves the worker cleared and stale within a bound; a vLLM or SGLang worker is never
asked. Publishers bind 127.0.0.1 on free ports; every socket and thread is closed by the
test that opened it.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from radixmeta import EventLog, RadixCache
from radixmeta.errors import InvalidInputError
from radixmeta.events import Unavailable
from radixmeta.ingest import engine_batch
from radixmeta.publishing import LogPublisher
from radixmeta.subscription import FleetSubscription, WorkerEndpoint
from radixmeta.transport import Snapshot, ZmqPublisher
from radixmeta.wire import native, sglang, vllm

pytestmark = pytest.mark.timeout(60)

PAGE = 4
LOOPBACK = "tcp://127.0.0.1:*"
WAIT = 10.0  # the bound of any single wait; never reached when the tests pass


class Worker:
    """A cache with a log, and a key generator for its traffic."""

    def __init__(self, name: str, seed: int, form: str = "path") -> None:
        self.name = name
        self.log = EventLog(worker=name, form=form)
        self.cache = RadixCache(PAGE, capacity=96, event_log=self.log)
        self.rng = random.Random(seed)
        self.seen = -1

    def traffic(self, steps: int = 2) -> None:
        for _ in range(steps):
            key = [self.rng.randrange(3) for _ in range(self.rng.randrange(4, 28))]
            self.cache.insert(key)

    def new_records(self) -> list[Any]:
        records = self.log.read(after=self.seen)
        if records:
            self.seen = records[-1].seq
        return records


@contextlib.contextmanager
def router(*workers: WorkerEndpoint, codec: str = "native", **kw: Any) -> Iterator[Any]:
    options = {"replay_timeout": 0.5, **kw}
    with FleetSubscription(list(workers), codec=codec, block_size=PAGE, **options) as sub:
        assert sub.subscriber.wait_connected(timeout=WAIT)
        yield sub


def endpoint_of(name: str, pub: ZmqPublisher, **kw: Any) -> WorkerEndpoint:
    return WorkerEndpoint(name, pub.endpoint, pub.replay_endpoint, **kw)


def lose_in_transit(sub: FleetSubscription, count: int) -> None:
    """Receive ``count`` batches and drop them, as a subscriber past its high-water mark."""
    for _ in range(count):
        assert sub.subscriber.recv(timeout=WAIT) is not None


def catch_up(sub: FleetSubscription) -> None:
    """Receive until a quiet moment, then probe: what is still in flight comes by replay."""
    while sub.poll(timeout=0.05):
        pass
    sub.replayer.replay()
    sub.probe()
    sub.replayer.replay()


def tree_pages(sub: FleetSubscription, name: str) -> set[tuple[int, ...]]:
    """The worker's pages in the router's tree, each named by its full path."""
    out = set()
    for record in sub.tree.dump(sub.tree.worker(name)):
        path = tuple(record.key.tolist())
        out.update(path[:end] for end in range(record.start + PAGE, len(path) + 1, PAGE))
    return out


def cache_pages(cache: Any) -> set[tuple[int, ...]]:
    out = set()
    for key, _ in cache.items():
        path = tuple(key.tolist())
        out.update(path[:end] for end in range(PAGE, len(path) + 1, PAGE))
    return out


def state_of(sub: FleetSubscription, name: str) -> dict[str, Any]:
    (state,) = [w for w in sub.worker_state() if w["worker"] == name]
    return state


# -- a radixmeta worker is rebuilt ------------------------------------------------------------
@pytest.mark.parametrize("ending", ["held", "emptied"])
def test_a_worker_lost_past_its_buffer_is_rebuilt_from_a_snapshot(ending: str) -> None:
    w = Worker("w0", 1)
    with (
        LogPublisher(w.cache, LOOPBACK, replay_endpoint=LOOPBACK, buffer_steps=4) as lp,
        router(endpoint_of("w0", lp.publisher)) as sub,
    ):
        assert lp.publisher.wait_subscribers(1, timeout=WAIT)
        for _ in range(5):
            w.traffic()
            lp.flush()
        catch_up(sub)
        assert tree_pages(sub, "w0") == cache_pages(w.cache)
        for _ in range(10):  # more than the buffer's 4 batches, all lost on the way
            w.traffic()
            lp.flush()
        lose_in_transit(sub, 10)
        if ending == "emptied":
            w.cache.evict(10_000)  # the snapshot is of an empty cache
            lp.flush()
        w.traffic()
        lp.flush()  # the batch that shows the gap
        catch_up(sub)
        assert tree_pages(sub, "w0") == cache_pages(w.cache)
        state = state_of(sub, "w0")
        assert (state["gaps"], state["resyncs"], state["stale"]) == (1, 1, False)
        assert lp.publisher.stats.snapshots_served == 1 and sub.snapshot_failures == 0
        for _ in range(3):  # and it follows on from the snapshot
            w.traffic()
            lp.flush()
        catch_up(sub)
        assert tree_pages(sub, "w0") == cache_pages(w.cache)
        sub.tree.check()


def test_a_snapshot_taken_while_the_worker_keeps_changing_is_consistent() -> None:
    w = Worker("busy", 2)
    stop = threading.Event()
    errors: list[BaseException] = []

    def engine(lp: LogPublisher) -> None:
        try:
            while not stop.is_set():
                w.traffic(1)
                # Changed but not yet flushed most of the time, so a snapshot usually finds
                # records no batch has carried and must publish them first.
                time.sleep(0.001)
                lp.flush()
        except BaseException as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    with (
        LogPublisher(w.cache, LOOPBACK, replay_endpoint=LOOPBACK, buffer_steps=4) as lp,
        router(endpoint_of("busy", lp.publisher)) as sub,
    ):
        assert lp.publisher.wait_subscribers(1, timeout=WAIT)
        thread = threading.Thread(target=engine, args=(lp,), name="engine")
        thread.start()
        try:
            deadline = time.monotonic() + 0.2
            while time.monotonic() < deadline:  # the router loses a stretch of batches
                sub.subscriber.recv(timeout=0.05)
            deadline = time.monotonic() + 0.4
            while time.monotonic() < deadline:  # then reads again, as the engine runs
                sub.step(timeout=0.05)
        finally:
            stop.set()
            thread.join(WAIT)
        assert not thread.is_alive() and not errors
        lp.flush()
        catch_up(sub)
        assert tree_pages(sub, "busy") == cache_pages(w.cache)
        state = state_of(sub, "busy")
        assert state["resyncs"] >= 1 and not state["stale"]
        assert lp.publisher.stats.snapshots_served >= 1 and sub.snapshot_failures == 0


# -- a snapshot that does not come ------------------------------------------------------------
@contextlib.contextmanager
def native_publisher(
    snapshot: Callable[[], Any], release: threading.Event
) -> Iterator[ZmqPublisher]:
    """A native stream whose snapshot callable misbehaves; released before it closes."""
    pub = ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, buffer_steps=2, snapshot=snapshot)
    try:
        yield pub
    finally:
        release.set()  # a callable still waiting lets the replay thread stop
        pub.close()


@pytest.mark.parametrize("failure", ["never-answers", "refused", "undecodable"])
def test_a_snapshot_that_fails_leaves_the_worker_cleared_and_stale(failure: str) -> None:
    release = threading.Event()
    pub_seq = [0]

    def snapshot() -> Snapshot | None:
        if failure == "never-answers":
            release.wait(WAIT)  # longer than the router waits
            return None
        if failure == "refused":
            return None
        return Snapshot(pub_seq[0], [b"\xc1 not msgpack"])

    w = Worker("w0", 3)
    timeout = 0.3
    with (
        native_publisher(snapshot, release) as pub,
        router(endpoint_of("w0", pub), snapshot_timeout=timeout) as sub,
    ):
        assert pub.wait_subscribers(1, timeout=WAIT)

        def publish(last_only: bool = False) -> None:
            records = w.new_records()
            data = native.encode_batch(records[-1:] if last_only else records, worker="w0")
            pub_seq[0] = pub.publish(data)

        for _ in range(3):
            w.traffic()
            publish()
        catch_up(sub)
        for _ in range(4):
            w.traffic()
            publish()
        lose_in_transit(sub, 4)
        w.traffic()
        publish(last_only=True)  # one record: the baseline, so the worker stays stale
        assert sub.poll(timeout=WAIT) == 1
        start = time.monotonic()
        stats = sub.replayer.replay()
        elapsed = time.monotonic() - start
        assert (stats.resyncs, stats.stale) == (1, 1)
        assert elapsed < timeout + 2.0  # one snapshot timeout at most, never a hang
        assert sub.snapshot_failures == 1
        assert [lag.stale for lag in sub.replayer.lag()] == [True]
        assert sub.tree.held_tokens(sub.tree.worker("w0")) <= w.cache.total_size
        counts = sub.subscriber.stats
        expected = {
            "never-answers": (counts.snapshot_timeouts, 1),
            "refused": (counts.snapshots_unavailable, 1),
            "undecodable": (sub.decode_errors, 1),
        }[failure]
        assert expected[0] == expected[1]
        sub.tree.check()


# -- vLLM and SGLang workers are never asked ----------------------------------------------------
def vllm_payload(records: list[Any]) -> bytes:
    return vllm.encode_batch(engine_batch(records, block_size=PAGE))


def sglang_payload(records: list[Any]) -> bytes:
    return sglang.encode_batch(engine_batch(records, block_size=PAGE))


def native_payload(records: list[Any]) -> bytes:
    return native.encode_batch(records, worker="w0")


@pytest.mark.parametrize(
    ("codec", "declared", "encode"),
    [
        ("vllm", None, vllm_payload),
        ("sglang", None, sglang_payload),
        ("native", False, native_payload),  # a radixmeta publisher older than snapshots
    ],
)
def test_a_worker_that_serves_no_snapshot_is_never_asked(
    codec: str, declared: bool | None, encode: Callable[[list[Any]], bytes]
) -> None:
    w = Worker("w0", 4, form="blocks")
    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, buffer_steps=2) as pub,
        router(endpoint_of("w0", pub, snapshot=declared), codec=codec) as sub,
    ):
        assert pub.wait_subscribers(1, timeout=WAIT)
        for lose in (False, True, True, True, True, False):
            w.traffic()
            pub.publish(encode(w.new_records()))
            if lose:
                lose_in_transit(sub, 1)
        catch_up(sub)
        state = state_of(sub, "w0")
        # Stale for good: what was lost is still lost, whatever records follow (only a
        # snapshot, a Cleared event or a restart rebuilds the view).
        assert (state["resyncs"], state["stale"]) == (1, True)
        assert sub.replayer.worker_stats("w0").stale == 1
        assert sub.subscriber.stats.snapshots_requested == 0
        # Nothing but replay requests reached the publisher's ROUTER.
        served = pub.stats
        assert served.replays_served >= 1
        assert served.snapshots_served == served.snapshots_unavailable == 0
        assert served.malformed_requests == 0


def test_only_native_workers_with_a_replay_endpoint_declare_snapshots() -> None:
    with pytest.raises(InvalidInputError, match="replay endpoint"):
        WorkerEndpoint("w0", "tcp://127.0.0.1:1", snapshot=True)
    with pytest.raises(InvalidInputError, match="native codec"):
        FleetSubscription(
            [WorkerEndpoint("w0", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2", snapshot=True)],
            codec="vllm",
            block_size=PAGE,
        )
    with FleetSubscription(
        [
            WorkerEndpoint("a", "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"),
            WorkerEndpoint("b", "tcp://127.0.0.1:3"),  # no replay endpoint to ask on
            WorkerEndpoint("c", "tcp://127.0.0.1:4", "tcp://127.0.0.1:5", snapshot=False),
        ],
        codec="native",
        block_size=PAGE,
    ) as sub:
        assert sub.serves_snapshots == [True, False, False]
        # Each refusal says why (what the log and Router.health() show).
        assert sub.snapshot("b", 0) == Unavailable("no snapshot (no replay endpoint)")
        assert sub.snapshot("c", 0) == Unavailable("no snapshot (the worker is declared "
                                                   "snapshot=no)")
        assert sub.snapshot("nobody", 0) == Unavailable("not a worker of this subscription")
        assert sub.subscriber.stats.snapshots_requested == 0


# -- the LogPublisher alone ---------------------------------------------------------------------
def test_log_publisher_batches_and_stamps() -> None:
    w = Worker("w0", 5)
    with LogPublisher(w.cache, LOOPBACK, replay_endpoint=LOOPBACK) as lp:
        assert lp.snapshot() is None  # nothing published yet: no batch to stamp with
        assert lp.flush() is None
        w.traffic()
        assert lp.flush() == 0 and lp.flush() is None
        w.traffic()  # logged, not flushed: the snapshot publishes it first
        snapshot = lp.snapshot()
        assert snapshot is not None and snapshot.seq == 1 == lp.publisher.next_seq - 1
        (payload,) = snapshot.payloads
        records = native.decode_batch(payload, seq=snapshot.seq).records
        assert {r.seq for r in records} == {1}
        assert sum(len(r.key) - r.start for r in records) == w.cache.total_size
        assert lp.flush() is None
        assert "LogPublisher(" in repr(lp)
    assert lp.closed


def test_log_publisher_resyncs_when_its_log_dropped_records() -> None:
    log = EventLog(capacity=2, worker="w0")
    cache = RadixCache(PAGE, event_log=log)
    with (
        LogPublisher(cache, LOOPBACK, replay_endpoint=LOOPBACK) as lp,
        router(endpoint_of("w0", lp.publisher)) as sub,
    ):
        assert lp.publisher.wait_subscribers(1, timeout=WAIT)
        cache.insert([1, 1, 1, 1])
        lp.flush()
        for k in range(2, 8):  # more records than the log holds between two flushes
            cache.insert([k, k, k, k])
        assert lp.flush() == 1
        batch = native.decode_batch(lp.publisher._buffer.read(1)[0][1], seq=1)
        assert batch.records[0].kind == "cleared" and len(batch.records) == 8
        catch_up(sub)
        assert tree_pages(sub, "w0") == cache_pages(cache)


def test_log_publisher_refuses_bad_arguments() -> None:
    with pytest.raises(InvalidInputError, match="event log"):
        LogPublisher(RadixCache(PAGE), LOOPBACK)
    cache = RadixCache(PAGE, event_log=EventLog())
    with pytest.raises(InvalidInputError, match="snapshots"):
        LogPublisher(cache, LOOPBACK, replay_endpoint=LOOPBACK, snapshot=lambda: None)
    with LogPublisher(cache, LOOPBACK) as lp:  # no replay socket: nothing serves snapshots
        assert lp.publisher.replay_endpoint is None
