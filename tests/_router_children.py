"""An engine in a child process for the Router's end-to-end test: a RadixCache with an
EventLog behind a ZeroMQ publisher on 127.0.0.1, driven by commands from its parent.

A separate module so that a spawned child imports radixmeta only, not pytest. Every wait
is bounded (``CHILD_WAIT``), so a parent that fails half-way never leaves a child behind
for long.
"""

from __future__ import annotations

from multiprocessing.connection import Connection

from radixmeta import EventLog, RadixCache
from radixmeta.transport.zmq import ZmqPublisher
from radixmeta.wire import native

CHILD_WAIT = 20.0
LOOPBACK = "tcp://127.0.0.1:*"  # a free port on loopback only


def engine(conn: Connection, name: str, page: int) -> None:
    """Serve ``("insert", keys)``, ``("evict", tokens)`` and ``("exit",)`` until told to exit.

    Sends ``("ready", endpoint, replay_endpoint)`` first; after each command it publishes
    what the cache's log recorded as one native batch and answers ``("done", total_size)``.
    """
    log = EventLog(worker=name)
    cache = RadixCache(page, event_log=log)
    seen = -1
    with ZmqPublisher(LOOPBACK, replay_endpoint=LOOPBACK) as pub:
        conn.send(("ready", pub.endpoint, pub.replay_endpoint))
        subscribed = False
        while conn.poll(CHILD_WAIT):
            command = conn.recv()
            if command[0] == "exit":
                break
            if not subscribed:  # the first batch must not go out before the router listens
                subscribed = pub.wait_subscribers(1, timeout=CHILD_WAIT)
            if command[0] == "insert":
                for key in command[1]:
                    cache.insert(key)
            elif command[0] == "evict":
                cache.evict(command[1])
            records = log.read(after=seen)
            if records:
                seen = records[-1].seq
                pub.publish(native.encode_batch(records, worker=name, dp_rank=0))
            conn.send(("done", cache.total_size))
    conn.close()
