"""radixmeta's snapshot request on the replay socket: frames, then real sockets on loopback.

The frame codec is checked without sockets (what it refuses, and that a vLLM replay request
and a snapshot request can never be taken for each other). Over 127.0.0.1 a publisher
answers a snapshot or "none", a bad request or reply is counted and skipped, a callable
that fails is answered with "none", and a socket that never answers times out within its
bound. Every socket is closed by the test that opened it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq

from radixmeta.errors import InputTypeError, InvalidInputError, TransportClosedError
from radixmeta.transport import (
    AsyncZmqSubscriber,
    Snapshot,
    SnapshotResult,
    ZmqPublisher,
    ZmqSubscriber,
)
from radixmeta.transport._frames import END_SEQ, encode_seq, parse_replay_request
from radixmeta.transport._snapshot_frames import (
    SNAPSHOT_TAG,
    check_snapshot,
    no_snapshot_reply,
    parse_snapshot_reply,
    parse_snapshot_request,
    snapshot_reply,
    snapshot_request,
)

pytestmark = pytest.mark.timeout(60)

LOOPBACK = "tcp://127.0.0.1:*"
WAIT = 10.0  # the bound of any single wait; never reached when the tests pass
V1 = b"\x01"


@contextlib.contextmanager
def raw_socket(kind: int, bind: str | None = None) -> Iterator[zmq.Socket[Any]]:
    """A bare socket in its own context, closed and terminated on exit."""
    ctx = zmq.Context()
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        if bind is not None:
            sock.bind(bind)
        yield sock
    finally:
        sock.close(linger=0)
        ctx.term()


def endpoint_of(sock: zmq.Socket[Any]) -> str:
    return str(sock.getsockopt_string(zmq.LAST_ENDPOINT))


# -- frames, no sockets --------------------------------------------------------------------
def test_request_frames_and_the_vllm_request_are_never_confused() -> None:
    request = [b"id", *snapshot_request()]
    assert request == [b"id", b"", SNAPSHOT_TAG, V1]
    assert parse_snapshot_request(request) == b"id"
    assert parse_replay_request(request) is None  # 4 frames: vLLM answers only 3
    vllm_request = [b"id", b"", encode_seq(5)]
    assert parse_snapshot_request(vllm_request) is None
    assert parse_replay_request(vllm_request) == (b"id", 5)


@pytest.mark.parametrize(
    "frames",
    [
        [b"id", b"", SNAPSHOT_TAG, b"\x02"],  # another version
        [b"id", b"", SNAPSHOT_TAG, V1, b"extra"],
        [b"id", b"", SNAPSHOT_TAG],  # 3 frames: a vLLM server would read it as a seq
        [b"id", b"x", SNAPSHOT_TAG, V1],  # no empty delimiter
        [b"id", b"", b"radixmeta-snapshop", V1],
        [],
    ],
    ids=["version-2", "5-frames", "no-version", "no-delimiter", "other-tag", "empty"],
)
def test_parse_snapshot_request_refuses(frames: list[bytes]) -> None:
    assert parse_snapshot_request(frames) is None


@pytest.mark.parametrize(
    ("frames", "kind", "snapshot"),
    [
        ([b"", SNAPSHOT_TAG, V1, encode_seq(9), b"a", b"b"], "snapshot", Snapshot(9, (b"a", b"b"))),
        ([b"", SNAPSHOT_TAG, V1, encode_seq(0)], "snapshot", Snapshot(0, ())),
        ([b"", SNAPSHOT_TAG, V1], "unavailable", None),
        ([b"x", SNAPSHOT_TAG, V1], "malformed", None),  # no empty delimiter
        ([b"", SNAPSHOT_TAG, b"\x02", encode_seq(9), b"a"], "malformed", None),
        ([b"", SNAPSHOT_TAG, V1, b"\x00" * 7, b"a"], "malformed", None),  # 7-byte seq
        ([b"", SNAPSHOT_TAG, V1, encode_seq(9), b"a", b""], "malformed", None),  # empty payload
        ([b"", b"topic", encode_seq(9), b"a"], "malformed", None),  # a replay reply
        ([b"", b"", END_SEQ, b""], "malformed", None),  # a replay end marker
        ([b"", SNAPSHOT_TAG], "malformed", None),
        ([], "malformed", None),
    ],
)
def test_parse_snapshot_reply(frames: list[bytes], kind: str, snapshot: Snapshot | None) -> None:
    assert parse_snapshot_reply(frames) == (kind, snapshot)


def test_reply_frames_round_trip() -> None:
    frames = snapshot_reply(b"id", Snapshot(2**64 - 1, (b"p",)))
    assert frames[:4] == (b"id", b"", SNAPSHOT_TAG, V1)
    assert parse_snapshot_reply(frames[1:]) == ("snapshot", Snapshot(2**64 - 1, (b"p",)))
    assert parse_snapshot_reply(no_snapshot_reply(b"id")[1:]) == ("unavailable", None)


@pytest.mark.parametrize(
    ("value", "error"),
    [
        (b"payload", InputTypeError),  # not a pair
        ((1, 2, 3), InputTypeError),
        (("3", [b"p"]), InputTypeError),
        ((True, [b"p"]), InputTypeError),
        ((-1, [b"p"]), InvalidInputError),
        ((2**64, [b"p"]), InvalidInputError),
        ((3, b"p"), InputTypeError),  # payloads must be a sequence of payloads
        ((3, "p"), InputTypeError),
        ((3, 7), InputTypeError),
        ((3, ["p"]), InputTypeError),
        ((3, [b""]), InvalidInputError),
    ],
)
def test_check_snapshot_refuses(value: object, error: type[Exception]) -> None:
    with pytest.raises(error):
        check_snapshot(value)


def test_check_snapshot_copies_payloads() -> None:
    buffer = bytearray(b"abc")
    snapshot = check_snapshot((4, [buffer, memoryview(b"de")]))
    buffer[0] = 0
    assert snapshot == Snapshot(4, (b"abc", b"de"))


def test_bad_local_arguments() -> None:
    with pytest.raises(InputTypeError):
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, snapshot=42)  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        ZmqPublisher(LOOPBACK, snapshot=lambda: None)  # no replay socket to ask on
    with ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK) as pub:
        both = [pub.endpoint, pub.endpoint]
        with ZmqSubscriber(both, replay_endpoints=[pub.replay_endpoint, None]) as sub:
            with pytest.raises(InvalidInputError):
                sub.snapshot(1)  # no replay endpoint
            with pytest.raises(InvalidInputError):
                sub.snapshot(2)
            with pytest.raises(InputTypeError):
                sub.snapshot(0, timeout="1")  # type: ignore[arg-type]
            with pytest.raises(InvalidInputError):
                sub.snapshot(0, timeout=-1)
        with pytest.raises(TransportClosedError):
            sub.snapshot(0)
    assert sub.stats.snapshots_requested == 0


# -- real sockets ----------------------------------------------------------------------------
@pytest.mark.parametrize("flavour", ["thread", "asyncio"])
def test_a_snapshot_and_none_over_loopback(flavour: str) -> None:
    calls: list[str] = []

    def take() -> Snapshot:
        calls.append(threading.current_thread().name)
        return Snapshot(pub.next_seq - 1, [b"state-1", b"state-2"])

    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, snapshot=take) as pub,
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK) as plain,
    ):
        pub.publish(b"batch 0")
        pub.publish(b"batch 1")
        endpoints = [pub.endpoint, plain.endpoint]
        replays = [pub.replay_endpoint, plain.replay_endpoint]

        def ask(sub: Any) -> Any:
            return sub.snapshot(0, timeout=WAIT), sub.snapshot(1, timeout=WAIT)

        if flavour == "thread":
            with ZmqSubscriber(endpoints, replay_endpoints=replays) as sub:
                got, none = ask(sub)
                stats = sub.stats
        else:

            async def main() -> Any:
                async with AsyncZmqSubscriber(endpoints, replay_endpoints=replays) as s:
                    first = await s.snapshot(0, timeout=WAIT)
                    return first, await s.snapshot(1, timeout=WAIT), s.stats

            got, none, stats = asyncio.run(main())
        assert got == SnapshotResult(0, "snapshot", 1, (b"state-1", b"state-2"))
        assert got.available and not none.available
        assert none == SnapshotResult(1, "unavailable")
        assert calls and calls[0].startswith("radixmeta-replay")  # on the replay thread
        assert (pub.stats.snapshots_served, plain.stats.snapshots_unavailable) == (1, 1)
        assert (stats.snapshots_requested, stats.snapshots_unavailable) == (2, 1)
        assert pub.stats.malformed_requests == plain.stats.malformed_requests == 0


def test_bad_requests_are_counted_and_get_no_reply() -> None:
    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, snapshot=lambda: (0, [b"s"])) as pub,
        raw_socket(zmq.DEALER) as dealer,
    ):
        dealer.connect(pub.replay_endpoint)
        dealer.send_multipart([b"", SNAPSHOT_TAG, b"\x02"])  # a version it does not speak
        dealer.send_multipart([b"", SNAPSHOT_TAG, V1, b"extra"])
        dealer.send_multipart([b"", SNAPSHOT_TAG])  # 3 frames, but no 8-byte seq
        dealer.send_multipart(list(snapshot_request()))  # a good one after them
        assert dealer.poll(int(WAIT * 1000))
        # The first reply answers the good request: the bad ones got nothing.
        assert dealer.recv_multipart() == [b"", SNAPSHOT_TAG, V1, encode_seq(0), b"s"]
        assert dealer.poll(200) == 0
        assert pub.stats.malformed_requests == 3 and pub.stats.snapshots_served == 1


@pytest.mark.parametrize(
    "callable_",
    [
        lambda: 1 / 0,  # raises
        lambda: b"not a snapshot",
        lambda: Snapshot(-1, [b"s"]),
        lambda: Snapshot(0, [b""]),
    ],
    ids=["raises", "not-a-pair", "negative-seq", "empty-payload"],
)
def test_a_failing_snapshot_callable_is_answered_with_none(callable_: Any) -> None:
    with (
        ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK, snapshot=callable_) as pub,
        ZmqSubscriber(pub.endpoint, replay_endpoints=[pub.replay_endpoint]) as sub,
    ):
        pub.publish(b"x")
        assert sub.snapshot(0, timeout=WAIT).status == "unavailable"
        assert (pub.stats.snapshot_errors, pub.stats.snapshots_unavailable) == (1, 1)
        # The replay thread lives on.
        assert [b.payload for b in sub.replay(0, 0, timeout=WAIT).batches] == [b"x"]


def test_malformed_replies_are_skipped() -> None:
    with (
        raw_socket(zmq.ROUTER, LOOPBACK) as router,
        ZmqPublisher(LOOPBACK) as pub,
        ZmqSubscriber(pub.endpoint, replay_endpoints=[endpoint_of(router)]) as sub,
    ):
        results: list[SnapshotResult] = []
        asker = threading.Thread(target=lambda: results.append(sub.snapshot(0, timeout=WAIT)))
        asker.start()
        try:
            assert router.poll(int(WAIT * 1000))
            client, *request = router.recv_multipart()
            assert request == [b"", SNAPSHOT_TAG, V1]
            router.send_multipart([client, b"", b"t", encode_seq(0), b"a replay reply"])
            router.send_multipart([client, b"", SNAPSHOT_TAG, V1, b"short", b"p"])
            router.send_multipart([client, b"", SNAPSHOT_TAG, V1, encode_seq(3), b"good"])
        finally:
            asker.join(WAIT)
        assert not asker.is_alive()
        assert results == [SnapshotResult(0, "snapshot", 3, (b"good",), malformed=2)]
        assert sub.stats.snapshot_malformed == 2


@pytest.mark.parametrize("flavour", ["thread", "asyncio"])
def test_a_snapshot_socket_that_never_answers_times_out(flavour: str) -> None:
    with raw_socket(zmq.ROUTER, LOOPBACK) as router, ZmqPublisher(LOOPBACK) as pub:
        replay = [endpoint_of(router)]
        start = time.monotonic()
        if flavour == "thread":
            with ZmqSubscriber(pub.endpoint, replay_endpoints=replay) as sub:
                result, stats = sub.snapshot(0, timeout=0.3), sub.stats
        else:

            async def ask() -> Any:
                async with AsyncZmqSubscriber(pub.endpoint, replay_endpoints=replay) as s:
                    return await s.snapshot(0, timeout=0.3), s.stats

            result, stats = asyncio.run(ask())
        assert time.monotonic() - start < 0.3 + 2.0
        assert result == SnapshotResult(0, "timed_out")
        assert (stats.snapshots_requested, stats.snapshot_timeouts) == (1, 1)
