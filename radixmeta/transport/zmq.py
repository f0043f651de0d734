"""ZeroMQ transport that speaks vLLM's KV-event protocol (pyzmq).

:class:`ZmqPublisher` is what a vLLM or SGLang worker runs: live batches on a PUB socket,
the latest ``buffer_steps`` of them behind an optional ROUTER replay socket.
:class:`ZmqSubscriber` (threads) and :class:`AsyncZmqSubscriber` (asyncio) are what a router
runs: one SUB socket per worker endpoint and a DEALER replay client that reads both reply
layouts. Payloads are opaque bytes; the frames are described in
:mod:`radixmeta.transport._frames` and, with the bind/connect rule and the pitfalls each
class avoids, in the transport page of the documentation.
"""

from __future__ import annotations

from radixmeta.transport._endpoints import (
    dp_endpoints,
    offset_endpoint,
    publisher_binds,
    subscriber_binds,
)
from radixmeta.transport._zmq_publisher import ZmqPublisher
from radixmeta.transport._zmq_subscriber import AsyncZmqSubscriber, ZmqSubscriber
from radixmeta.transport._zmq_util import DEFAULT_ENDPOINT, SocketOptions

__all__ = [
    "DEFAULT_ENDPOINT",
    "AsyncZmqSubscriber",
    "SocketOptions",
    "ZmqPublisher",
    "ZmqSubscriber",
    "dp_endpoints",
    "offset_endpoint",
    "publisher_binds",
    "subscriber_binds",
]

# Document (and show in reprs of the classes) the public module, not the private ones.
for _cls in (ZmqPublisher, ZmqSubscriber, AsyncZmqSubscriber):
    _cls.__module__ = __name__
del _cls
