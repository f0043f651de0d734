"""The ZeroMQ transport on real sockets, loopback only (127.0.0.1, ephemeral ports).

Publishers that stand for workers run in spawned child processes where a process matters
(several dp ranks, a restart). No test sleeps to let connections settle: a publisher
waits until its subscriber's subscription has arrived (XPUB), and a subscriber that binds
is polled meanwhile. Every socket, thread and process is closed by the test that opened
it, and the module timeout bounds each test.
"""

from __future__ import annotations

import asyncio
import contextlib
import doctest
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from _transport_children import expect, payload, publish_batches, spawned

import radixmeta.transport._endpoints as endpoints_module
from radixmeta.errors import InputTypeError, InvalidInputError, TransportClosedError
from radixmeta.transport import (
    AsyncZmqSubscriber,
    Message,
    ReplayLayout,
    ZmqPublisher,
    ZmqSubscriber,
    dp_endpoints,
    offset_endpoint,
    publisher_binds,
    subscriber_binds,
)
from radixmeta.transport._frames import (
    END_SEQ,
    encode_seq,
    parse_live,
    parse_replay_reply,
    parse_replay_request,
)

pytestmark = pytest.mark.timeout(60)

LOOPBACK = "tcp://127.0.0.1:*"  # binds 127.0.0.1 on a free port
WAIT = 10.0  # the bound of any single wait in these tests; never reached when they pass


def receive(sub: ZmqSubscriber, count: int) -> list[Message]:
    """Receive ``count`` messages, failing (not hanging) if they do not come."""
    out = []
    for _ in range(count):
        message = sub.recv(timeout=WAIT)
        assert message is not None, f"got {len(out)} of {count} messages"
        out.append(message)
    return out


def subscribed(pub: ZmqPublisher, sub: ZmqSubscriber, count: int = 1) -> None:
    """Wait until ``pub`` has ``count`` subscriptions, polling ``sub`` meanwhile.

    The subscriber needs polling only when it binds (reference note section 1.2); doing it
    always keeps one helper for both layouts.
    """
    for _ in range(int(WAIT / 0.05)):
        if pub.wait_subscribers(count, timeout=0.05):
            return
        sub.wait_connected(timeout=0.0)
    msg = "the subscription never reached the publisher"
    raise AssertionError(msg)


@contextlib.contextmanager
def silent_router() -> Iterator[tuple[zmq.Socket[Any], str]]:
    """A bare ROUTER on loopback that takes requests and never answers."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(LOOPBACK)
    try:
        yield router, router.getsockopt_string(zmq.LAST_ENDPOINT)
    finally:
        router.close(linger=0)
        ctx.term()


# -- rules and frames, no sockets ----------------------------------------------------------
def test_docstring_examples() -> None:
    failures, tried = doctest.testmod(endpoints_module)
    assert tried > 0 and failures == 0


@pytest.mark.parametrize(
    ("endpoint", "pub_binds", "sub_binds"),
    [
        ("tcp://*:5557", True, True),
        ("tcp://[::]:5557", True, True),
        ("tcp://0.0.0.0:5557", True, True),
        ("tcp://127.0.0.1:*", True, True),
        ("tcp://127.0.0.1:5557", False, False),
        ("tcp://router.example:5557", False, False),
        ("ipc:///tmp/kv", True, False),
        ("inproc://kv", True, False),
    ],
)
def test_bind_connect_rule(endpoint: str, pub_binds: bool, sub_binds: bool) -> None:
    assert publisher_binds(endpoint) is pub_binds
    assert subscriber_binds(endpoint) is sub_binds


@pytest.mark.parametrize(
    ("endpoint", "size", "expected"),
    [
        ("tcp://10.0.0.5:5557", 3, ["tcp://10.0.0.5:5557", "tcp://10.0.0.5:5558",
                                    "tcp://10.0.0.5:5559"]),
        ("tcp://[::1]:6000", 2, ["tcp://[::1]:6000", "tcp://[::1]:6001"]),
        ("tcp://127.0.0.1:0", 2, ["tcp://127.0.0.1:0", "tcp://127.0.0.1:0"]),
        ("inproc://kv", 3, ["inproc://kv", "inproc://kv_dp1", "inproc://kv_dp2"]),
        ("ipc:///tmp/kv", 1, ["ipc:///tmp/kv"]),
    ],
)
def test_dp_endpoints(endpoint: str, size: int, expected: list[str]) -> None:
    assert dp_endpoints(endpoint, size) == expected


@pytest.mark.parametrize(
    ("endpoint", "rank"),
    [("tcp://host", 1), ("tcp://host:http", 1), ("tcp://h:65535", 1), ("ipc:///x", 1),
     ("tcp://h:1", -1)],
)
def test_offset_endpoint_refuses(endpoint: str, rank: int) -> None:
    with pytest.raises(InvalidInputError):
        offset_endpoint(endpoint, rank)


@pytest.mark.parametrize(
    "frames",
    [
        [b"t", encode_seq(1)],  # 2 frames
        [b"t", b"\x00" * 7, b"p"],  # 7-byte seq
        [b"t", encode_seq(1), b"p", b"extra"],  # 4 frames
        [],
    ],
    ids=["2-frames", "7-byte-seq", "4-frames", "empty"],
)
def test_parse_live_refuses(frames: list[bytes]) -> None:
    assert parse_live(frames) is None


@pytest.mark.parametrize(
    ("frames", "kind", "layout", "seq"),
    [
        ([b"", b"t", encode_seq(7), b"p"], "batch", "new", 7),
        ([b"", encode_seq(7), b"p"], "batch", "old", 7),
        ([b"", b"", END_SEQ, b""], "end", "new", None),
        ([b"", END_SEQ, b""], "end", "old", None),
        ([b"x", encode_seq(7), b"p"], "malformed", None, None),  # no empty delimiter
        ([b"", b"t", b"\x00" * 7, b"p"], "malformed", None, None),
        ([b"", b"p"], "malformed", None, None),
    ],
)
def test_parse_replay_reply(frames: list[bytes], kind: str, layout: str | None,
                            seq: int | None) -> None:
    got_kind, got_layout, batch = parse_replay_reply(frames)
    assert (got_kind, got_layout) == (kind, layout)
    assert (batch.seq if batch else None) == seq


def test_parse_replay_request() -> None:
    assert parse_replay_request([b"id", b"", encode_seq(5)]) == (b"id", 5)
    assert parse_replay_request([b"id", encode_seq(5)]) is None
    assert parse_replay_request([b"id", b"", b"\x05"]) is None


# -- live delivery -------------------------------------------------------------------------
def test_in_order_across_dp_ranks_from_child_processes() -> None:
    ranks, count = 2, 30
    with contextlib.ExitStack() as stack:
        children = [
            stack.enter_context(spawned(publish_batches, LOOPBACK, rank, count,
                                        {"topic": b"kv@w0@m"}))
            for rank in range(ranks)
        ]
        endpoints = [expect(conn, "ready")[0] for conn in children]
        sub = stack.enter_context(ZmqSubscriber(endpoints, topic=b"kv@"))
        got = receive(sub, ranks * count)
        for conn in children:
            assert expect(conn, "published") == (True, count)
    for rank in range(ranks):
        mine = [m for m in got if m.source == rank]
        assert [m.seq for m in mine] == list(range(count))
        assert [m.payload for m in mine] == [payload(rank, s) for s in range(count)]
        assert all(m.topic == b"kv@w0@m" for m in mine)
    assert sub.stats.messages == ranks * count and sub.stats.malformed == 0


def test_dp_endpoints_over_inproc_in_one_context() -> None:
    ctx = zmq.Context()
    base = f"inproc://kv-{id(ctx)}"
    try:
        with contextlib.ExitStack() as stack:
            pubs = [stack.enter_context(ZmqPublisher(offset_endpoint(base, r), context=ctx))
                    for r in range(3)]
            assert all(p.bound for p in pubs)  # inproc binds, by vLLM's rule
            sub = stack.enter_context(ZmqSubscriber(dp_endpoints(base, 3), context=ctx))
            for pub in pubs:
                subscribed(pub, sub)
                pub.publish(pub.endpoint.encode())
            got = sorted(receive(sub, 3))
            assert [(m.source, m.payload) for m in got] == [
                (r, offset_endpoint(base, r).encode()) for r in range(3)
            ]
    finally:
        ctx.term()


def test_topic_filter() -> None:
    with contextlib.ExitStack() as stack:
        wanted = stack.enter_context(ZmqPublisher(LOOPBACK, topic=b"kv@a@model"))
        other = stack.enter_context(ZmqPublisher(LOOPBACK, topic=b"metrics"))
        sub = stack.enter_context(ZmqSubscriber([wanted.endpoint, other.endpoint],
                                                topic=b"kv@"))
        subscribed(wanted, sub)
        subscribed(other, sub)  # it gets the subscription too, and filters by it
        for i in range(5):
            other.publish(b"no %d" % i)
            wanted.publish(b"yes %d" % i)
        got = receive(sub, 5)
        assert [m.payload for m in got] == [b"yes %d" % i for i in range(5)]
        assert sub.recv(timeout=0.2) is None  # nothing of the other topic follows


def test_central_indexer_layout_subscriber_binds_publisher_connects() -> None:
    with (
        ZmqSubscriber(LOOPBACK) as sub,  # a wildcard port: the SUB binds
        ZmqPublisher(sub.endpoints[0]) as pub,  # a named peer: the PUB connects
    ):
        assert not pub.bound
        assert sub.wait_connected(timeout=WAIT)
        subscribed(pub, sub)
        for i in range(5):
            pub.publish(b"%d" % i)
        assert [m.seq for m in receive(sub, 5)] == list(range(5))


@pytest.mark.parametrize(
    "bad",
    [
        [b"kv", encode_seq(0)],
        [b"kv", b"\x00" * 7, b"payload"],
        [b"kv", encode_seq(0), b"payload", b"extra"],
    ],
    ids=["2-frames", "7-byte-seq", "4-frames"],
)
def test_malformed_live_message_is_counted_and_skipped(bad: list[bytes]) -> None:
    ctx = zmq.Context()
    raw = ctx.socket(zmq.XPUB)  # a raw publisher; XPUB shows when the subscriber is in
    raw.setsockopt(zmq.LINGER, 0)
    try:
        raw.bind(LOOPBACK)
        with ZmqSubscriber(raw.getsockopt_string(zmq.LAST_ENDPOINT)) as sub:
            assert raw.poll(int(WAIT * 1000)) and raw.recv()[:1] == b"\x01"
            raw.send_multipart(bad)
            raw.send_multipart([b"kv", encode_seq(1), b"good"])
            assert sub.recv(timeout=WAIT) == Message(0, b"kv", 1, b"good")
            assert sub.stats.malformed == 1 and sub.stats.messages == 1
    finally:
        raw.close(linger=0)
        ctx.term()


def test_publisher_restart_is_visible_as_seq_going_back() -> None:
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(spawned(publish_batches, LOOPBACK, 0, 10, {}))
        (endpoint, _) = expect(first, "ready")
        sub = stack.enter_context(ZmqSubscriber(endpoint))
        before = receive(sub, 10)
        assert expect(first, "published") == (True, 10)
        first.send("exit")
        # The same endpoint again, in a new process: the new publisher counts from 0. The
        # subscriber reconnects by itself; recv keeps its sockets polled meanwhile. A
        # resolved port names no wildcard, so vLLM's rule would connect: bind explicitly.
        with spawned(publish_batches, endpoint, 0, 3, {"bind": True}) as second:
            assert expect(second, "ready")[0] == endpoint
            after = receive(sub, 3)
            assert expect(second, "published") == (True, 3)
    seqs = [m.seq for m in before + after]
    assert seqs == [*range(10), 0, 1, 2]  # the drop from 9 to 0 is the restart


def test_a_closed_publisher_frees_its_port_for_a_new_one_at_seq_0() -> None:
    with ZmqPublisher(LOOPBACK) as first, ZmqSubscriber(first.endpoint) as sub:
        endpoint = first.endpoint
        subscribed(first, sub)
        first.publish(b"old")
        assert sub.recv(timeout=WAIT) == Message(0, b"", 0, b"old")
        first.close()  # its private context is terminated: the port is free at once
        with ZmqPublisher(endpoint, bind=True) as second:
            subscribed(second, sub)
            assert second.publish(b"new") == 0
            assert sub.recv(timeout=WAIT) == Message(0, b"", 0, b"new")


# -- replay --------------------------------------------------------------------------------
@pytest.mark.parametrize("reply_format", ["new", "old"])
@pytest.mark.parametrize("start", [0, 3])
def test_replay_both_layouts(reply_format: ReplayLayout, start: int) -> None:
    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, topic=b"kv@w",
                     reply_format=reply_format) as pub,
        ZmqSubscriber(pub.endpoint, replay_endpoints=[pub.replay_endpoint]) as sub,
    ):
        subscribed(pub, sub)
        sent = [pub.publish(b"batch %d" % i) for i in range(6)]
        live = receive(sub, 6)
        for source in (0, pub.endpoint, pub.replay_endpoint):
            result = sub.replay(source, start, timeout=WAIT)
            assert result.complete and not result.timed_out
            assert result.layout == reply_format and result.skipped == 0
            assert [b.seq for b in result.batches] == sent[start:]
            # Replayed batches are byte-identical to the live ones.
            assert [b.payload for b in result.batches] == [m.payload for m in live[start:]]
            topic = b"kv@w" if reply_format == "new" else b""  # the old layout has none
            assert all(b.topic == topic for b in result.batches)
        assert pub.stats.replays_served == 3 and sub.stats.replays_requested == 3


def test_replay_older_than_the_buffer_starts_later() -> None:
    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, buffer_steps=4) as pub,
        ZmqSubscriber(pub.endpoint, replay_endpoints=pub.replay_endpoint) as sub,
    ):
        for i in range(10):
            pub.publish(b"%d" % i)
        result = sub.replay(0, 2, timeout=WAIT)
        assert result.complete
        assert result.first_seq == 6 and result.skipped == 4
        assert [b.payload for b in result.batches] == [b"6", b"7", b"8", b"9"]
        empty = sub.replay(0, 10, timeout=WAIT)  # nothing from 10 on: just the end
        assert empty.complete and empty.batches == ()


@pytest.mark.parametrize("flavour", ["thread", "asyncio"])
def test_replay_socket_that_never_answers_times_out(flavour: str) -> None:
    with silent_router() as (router, endpoint), ZmqPublisher(LOOPBACK) as pub:
        if flavour == "thread":
            with ZmqSubscriber(pub.endpoint, replay_endpoints=[endpoint]) as sub:
                result = sub.replay(0, 5, timeout=0.3)
                stats = sub.stats
        else:
            async def ask() -> Any:
                async with AsyncZmqSubscriber(pub.endpoint, replay_endpoints=[endpoint]) as s:
                    return await s.replay(0, 5, timeout=0.3), s.stats

            result, stats = asyncio.run(ask())
        assert result.timed_out and not result.complete and result.batches == ()
        assert stats.replay_timeouts == 1
        # The request did arrive, framed as vLLM expects: [identity, b"", start_seq].
        assert router.poll(int(WAIT * 1000))
        request = router.recv_multipart()
        assert request[1:] == [b"", encode_seq(5)]


def test_replay_skips_malformed_replies() -> None:
    with (
        silent_router() as (router, endpoint),
        ZmqPublisher(LOOPBACK) as pub,
        ZmqSubscriber(pub.endpoint, replay_endpoints=[endpoint]) as sub,
    ):
        results: list[Any] = []
        asker = threading.Thread(
            target=lambda: results.append(sub.replay(0, 0, timeout=WAIT))
        )
        asker.start()
        try:
            assert router.poll(int(WAIT * 1000))
            client = router.recv_multipart()[0]
            router.send_multipart([client, b"", b"junk"])
            router.send_multipart([client, b"", b"t", b"\x01" * 7, b"short seq"])
            router.send_multipart([client, b"", b"t", encode_seq(0), b"good"])
            router.send_multipart([client, b"", b"", END_SEQ, b""])
        finally:
            asker.join(WAIT)
        assert not asker.is_alive()
        (result,) = results
        assert result.complete and result.malformed == 2
        assert [b.payload for b in result.batches] == [b"good"]
        assert sub.stats.replay_malformed == 2


def test_malformed_replay_request_gets_no_reply() -> None:
    with ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK) as pub:
        pub.publish(b"x")
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        try:
            dealer.connect(pub.replay_endpoint)
            dealer.send_multipart([b"", encode_seq(0), b"extra"])  # 4 frames at the ROUTER
            dealer.send_multipart([b"", encode_seq(0)])  # a good one after it
            assert dealer.poll(int(WAIT * 1000))
            # The first reply answers the good request: the bad one got nothing.
            assert dealer.recv_multipart() == [b"", b"", encode_seq(0), b"x"]
            assert dealer.recv_multipart() == [b"", b"", END_SEQ, b""]
            assert pub.stats.malformed_requests == 1 and pub.stats.replays_served == 1
        finally:
            dealer.close(linger=0)
            ctx.term()


def test_slow_subscriber_with_tiny_hwm_loses_batches_and_replay_fills_them() -> None:
    count, size = 200, 64 * 1024
    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, hwm=1, buffer_steps=count,
                     sockopts={zmq.SNDBUF: 4096}) as pub,
        ZmqSubscriber(pub.endpoint, replay_endpoints=[pub.replay_endpoint], hwm=1,
                      sockopts={zmq.RCVBUF: 4096}) as sub,
    ):
        subscribed(pub, sub)
        sent = {pub.publish(b"%06d" % i + bytes(size)): b"%06d" % i for i in range(count)}
        # The subscriber reads only now: what did not fit in one message of queue on
        # either side (and a few kilobytes of kernel buffer) was dropped by ZeroMQ.
        live = {}
        while (message := sub.recv(timeout=0.5)) is not None:
            live[message.seq] = message.payload[:6]
        missing = sorted(set(sent) - set(live))
        assert missing, "nothing was lost: the high-water mark did not bite"
        result = sub.replay(0, missing[0], timeout=WAIT)
        assert result.complete and result.skipped == 0
        replayed = {b.seq: b.payload[:6] for b in result.batches}
        assert {**replayed, **live} == sent  # the gap is filled, byte for byte


# -- asyncio ---------------------------------------------------------------------------------
def test_asyncio_subscriber() -> None:
    async def main() -> None:
        with ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, topic=b"kv") as pub:
            async with AsyncZmqSubscriber([pub.endpoint],
                                          replay_endpoints=[pub.replay_endpoint]) as sub:
                assert await sub.wait_connected(timeout=WAIT)
                for _ in range(int(WAIT / 0.05)):
                    if pub.wait_subscribers(1, timeout=0.05):
                        break
                for i in range(5):
                    pub.publish(b"%d" % i)
                got = [await sub.recv(timeout=WAIT) for _ in range(5)]
                assert [m.seq for m in got if m] == list(range(5))
                assert await sub.recv(timeout=0) is None
                # A replay and a pending recv run side by side; close ends the recv.
                pending = asyncio.ensure_future(sub.recv(timeout=None))
                result = await sub.replay(0, 2, timeout=WAIT)
                assert [b.seq for b in result.batches] == [2, 3, 4]
                sub.close()
                assert await asyncio.wait_for(pending, WAIT) is None
                assert sub.closed

    asyncio.run(main())


# -- closing and misuse ----------------------------------------------------------------------
def test_close_is_idempotent_and_later_use_is_refused() -> None:
    pub = ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK)
    sub = ZmqSubscriber(pub.endpoint, replay_endpoints=[pub.replay_endpoint])
    asub = AsyncZmqSubscriber(pub.endpoint)
    for closable in (sub, asub, pub):
        closable.close()
        closable.close()
        assert closable.closed
    with pytest.raises(TransportClosedError):
        pub.publish(b"x")
    assert pub.wait_subscribers(1, timeout=0) is False
    assert sub.recv(timeout=0) is None
    with pytest.raises(TransportClosedError):
        sub.replay(0, 0)


def test_close_from_another_thread_ends_a_blocked_recv() -> None:
    with ZmqPublisher(LOOPBACK) as pub:
        sub = ZmqSubscriber(pub.endpoint)
        results: list[object] = []
        reader = threading.Thread(target=lambda: results.append(sub.recv(timeout=None)))
        reader.start()
        sub.close()
        reader.join(WAIT)
        assert not reader.is_alive() and results == [None]


def test_a_port_in_use_raises_and_leaks_nothing() -> None:
    with ZmqPublisher(LOOPBACK) as pub:
        with pytest.raises(zmq.ZMQError):
            ZmqPublisher(pub.endpoint, bind=True)
        with pytest.raises(zmq.ZMQError):
            ZmqSubscriber(pub.endpoint, bind=True)


@pytest.mark.parametrize(
    ("make", "error"),
    [
        (lambda: ZmqPublisher("127.0.0.1:5557"), InvalidInputError),
        (lambda: ZmqPublisher(LOOPBACK, reply_format="newest"), InvalidInputError),
        (lambda: ZmqPublisher(LOOPBACK, buffer_steps=0), InvalidInputError),
        (lambda: ZmqPublisher(LOOPBACK, topic="kv"), InputTypeError),
        (lambda: ZmqPublisher(LOOPBACK, bind=1), InputTypeError),
        (lambda: ZmqSubscriber([]), InvalidInputError),
        (lambda: ZmqSubscriber(["tcp://127.0.0.1:1"], replay_endpoints=[None, None]),
         InvalidInputError),
    ],
)
def test_bad_constructor_arguments(make: Any, error: type[Exception]) -> None:
    with pytest.raises(error):
        make()


def test_bad_call_arguments() -> None:
    with ZmqPublisher(LOOPBACK) as pub, ZmqSubscriber(pub.endpoint) as sub:
        with pytest.raises(InvalidInputError):
            pub.publish(b"")  # an empty payload frame is the replay end marker
        with pytest.raises(InvalidInputError):
            sub.replay(0, 0)  # no replay endpoint
        with pytest.raises(InvalidInputError):
            sub.replay(1, 0)
        with pytest.raises(InvalidInputError):
            sub.replay("tcp://127.0.0.1:1", 0)
        with pytest.raises(InvalidInputError):
            sub.recv(timeout=-1)
        assert pub.next_seq == 0
