"""Code that the ZeroMQ transport tests run in spawned child processes.

A separate module so a child imports only radixmeta's transport, not pytest and the test
module. Each child talks to the parent over a ``multiprocessing`` pipe, and every wait in
it is bounded, so a parent that fails half-way never leaves a child hanging for long.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from multiprocessing.connection import Connection
from typing import Any

from radixmeta.transport.zmq import ZmqPublisher

# A child gives up waiting for its parent after this long (the parent's own waits are
# shorter, so this is only reached when the parent has already failed).
CHILD_WAIT = 20.0


def payload(rank: int, seq: int) -> bytes:
    """The payload a child publishes as batch ``seq`` of rank ``rank``."""
    return f"rank={rank} seq={seq}".encode()


def publish_batches(
    conn: Connection,
    endpoint: str,
    rank: int,
    count: int,
    options: dict[str, Any],
) -> None:
    """Run a publisher: report its endpoints, wait for a subscriber, publish, wait to exit.

    Sends ``("ready", endpoint, replay_endpoint)``, then ``("published", subscribed,
    next_seq)``, and returns when the parent sends anything (or after ``CHILD_WAIT``).
    """
    with ZmqPublisher(endpoint, **options) as pub:
        conn.send(("ready", pub.endpoint, pub.replay_endpoint))
        subscribed = pub.wait_subscribers(1, timeout=CHILD_WAIT)
        for seq in range(count):
            pub.publish(payload(rank, seq))
        conn.send(("published", subscribed, pub.next_seq))
        with contextlib.suppress(EOFError, OSError):
            conn.poll(CHILD_WAIT)
    conn.close()


@contextlib.contextmanager
def spawned(target: Any, *args: Any) -> Iterator[Connection]:
    """Run ``target(conn, *args)`` in a spawned process; stop it on exit, within a bound.

    On exit the child is told to finish, joined for a few seconds, and terminated (then
    killed) if it is still alive, so no test leaves a process behind.
    """
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    process = ctx.Process(target=target, args=(child, *args), daemon=True)
    process.start()
    child.close()
    try:
        yield parent
    finally:
        with contextlib.suppress(OSError):
            parent.send("exit")
        process.join(10)
        if process.is_alive():
            process.terminate()
            process.join(5)
        if process.is_alive():
            process.kill()
            process.join(5)
        parent.close()
        process.close()


def expect(conn: Connection, kind: str, timeout: float = 15.0) -> tuple[Any, ...]:
    """Receive the child's next message, which must be of ``kind``, within ``timeout``."""
    if not conn.poll(timeout):
        msg = f"the child sent no {kind!r} message within {timeout} s"
        raise AssertionError(msg)
    message = conn.recv()
    assert message[0] == kind, message
    return tuple(message[1:])
