"""The in-process transport: seq numbering, order, the bounded buffer, replay, threads."""

from __future__ import annotations

import doctest
import threading

import pytest

import radixmeta.transport.queue as queue_module
from radixmeta.errors import InputTypeError, InvalidInputError, TransportClosedError
from radixmeta.transport import Message, QueuePublisher, QueueSubscriber

pytestmark = pytest.mark.timeout(30)


def drain(sub: QueueSubscriber) -> list[Message]:
    """Every message the subscriber can take now."""
    out = []
    while (message := sub.recv(timeout=0)) is not None:
        out.append(message)
    return out


def test_docstring_examples() -> None:
    failures, tried = doctest.testmod(queue_module)
    assert tried > 0 and failures == 0


def test_seqs_count_batches_from_zero() -> None:
    with QueuePublisher(topic=b"kv") as pub:
        assert [pub.publish(b"x%d" % i) for i in range(5)] == [0, 1, 2, 3, 4]
        assert pub.next_seq == 5 and pub.oldest_seq == 0
        assert (pub.stats.messages, pub.stats.bytes) == (5, 10)


@pytest.mark.parametrize("ranks", [1, 3])
def test_in_order_across_ranks(ranks: int) -> None:
    pubs = [QueuePublisher(topic=b"kv@w") for _ in range(ranks)]
    with QueueSubscriber(pubs) as sub:
        for seq in range(10):
            for rank, pub in enumerate(pubs):
                pub.publish(f"{rank}:{seq}".encode())
        got = drain(sub)
    assert len(got) == 10 * ranks
    for rank in range(ranks):
        mine = [m for m in got if m.source == rank]
        assert [m.seq for m in mine] == list(range(10))
        assert [m.payload for m in mine] == [f"{rank}:{s}".encode() for s in range(10)]
    # Sources take turns: no rank waits for another to be drained.
    assert {m.source for m in got[:ranks]} == set(range(ranks))


def test_subscriber_sees_what_follows_its_subscription_or_start_seq() -> None:
    with QueuePublisher() as pub:
        pub.publish(b"early")
        late = pub.subscribe()
        catching_up = pub.subscribe(start_seq=0)
        pub.publish(b"later")
        assert [m.payload for m in drain(late)] == [b"later"]
        assert [m.payload for m in drain(catching_up)] == [b"early", b"later"]
        late.close()
        catching_up.close()


def test_topic_filter_is_a_prefix_match() -> None:
    pubs = [QueuePublisher(topic=t) for t in (b"kv@a@m", b"kv@b@m", b"other")]
    with QueueSubscriber(pubs, topic=b"kv@") as sub:
        for pub in pubs:
            pub.publish(pub.topic)
        assert sorted(m.payload for m in drain(sub)) == [b"kv@a@m", b"kv@b@m"]


@pytest.mark.parametrize(("start", "first"), [(0, 0), (3, 3), (9, None)])
def test_replay_from_a_held_seq(start: int, first: int | None) -> None:
    with QueuePublisher(topic=b"t") as pub, pub.subscribe() as sub:
        for i in range(5):
            pub.publish(b"%d" % i)
        result = sub.replay(0, start)
        assert result.complete and not result.timed_out and result.skipped == 0
        assert result.first_seq == first
        assert [b.payload for b in result.batches] == [b"%d" % i for i in range(start, 5)]
        assert all(b.topic == b"t" for b in result.batches)
        assert pub.stats.replays_served == 1 and sub.stats.replays_requested == 1


def test_slow_reader_falls_off_the_buffer_and_replay_starts_later() -> None:
    with QueuePublisher(buffer_steps=4) as pub, pub.subscribe() as sub:
        for i in range(10):
            pub.publish(b"%d" % i)
        got = drain(sub)
        # The reader resumes at the oldest batch held; the jump is its gap, and counted.
        assert [m.seq for m in got] == [6, 7, 8, 9]
        assert sub.stats.dropped == 6
        result = sub.replay(0, 2)
        assert result.first_seq == 6 and result.skipped == 4 and result.complete


def test_restart_numbers_from_zero_again() -> None:
    with QueuePublisher() as pub, pub.subscribe() as sub:
        for i in range(3):
            pub.publish(b"old%d" % i)
        pub.restart()
        pub.publish(b"new0")
        assert [(m.seq, m.payload) for m in drain(sub)] == [
            (0, b"old0"), (1, b"old1"), (2, b"old2"), (0, b"new0")
        ]
        assert pub.next_seq == 1


def test_threads_publish_and_read_in_order() -> None:
    count = 2_000
    with QueuePublisher(buffer_steps=count) as pub, pub.subscribe() as sub:
        got: list[int] = []

        def read() -> None:
            while len(got) < count:
                message = sub.recv(timeout=10)
                if message is None:
                    return
                got.append(message.seq)

        reader = threading.Thread(target=read)
        reader.start()
        for i in range(count):
            pub.publish(b"%d" % i)
        reader.join(15)
        assert not reader.is_alive()
        assert got == list(range(count))


def test_close_wakes_a_blocked_reader_and_is_idempotent() -> None:
    pub = QueuePublisher()
    sub = pub.subscribe()
    result: list[object] = []
    reader = threading.Thread(target=lambda: result.append(sub.recv(timeout=None)))
    reader.start()
    sub.close()
    reader.join(5)
    assert not reader.is_alive() and result == [None]
    sub.close()
    pub.close()
    pub.close()
    assert sub.closed and pub.closed
    assert sub.recv(timeout=0) is None
    with pytest.raises(TransportClosedError):
        pub.publish(b"x")
    with pytest.raises(TransportClosedError):
        sub.replay(0, 0)


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda p, s: p.publish(b""), InvalidInputError),
        (lambda p, s: p.publish("text"), InputTypeError),
        (lambda p, s: p.replay(-1), InvalidInputError),
        (lambda p, s: s.replay(1, 0), InvalidInputError),
        (lambda p, s: s.recv(timeout=-1), InvalidInputError),
        (lambda p, s: QueuePublisher(buffer_steps=0), InvalidInputError),
        (lambda p, s: QueueSubscriber([]), InvalidInputError),
    ],
)
def test_bad_arguments_raise(call: object, error: type[Exception]) -> None:
    with QueuePublisher() as pub, pub.subscribe() as sub:
        with pytest.raises(error):
            call(pub, sub)  # type: ignore[operator]
        assert pub.next_seq == 0  # nothing was published by a failed call


def test_mutable_payloads_are_copied() -> None:
    with QueuePublisher() as pub, pub.subscribe(start_seq=0) as sub:
        data = bytearray(b"abc")
        pub.publish(data)
        data[0] = ord("z")
        assert sub.recv(timeout=0) == Message(0, b"", 0, b"abc")
