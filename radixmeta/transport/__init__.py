"""Moving KV-event batches from workers to routers: in-process, or ZeroMQ as vLLM does.

A transport moves ``(topic, seq, payload)`` batches and knows nothing of their content
(the codecs in :mod:`radixmeta.wire` do). ``seq`` numbers the batches of one publisher
from 0; a subscriber that sees it jump has lost batches and asks the publisher's replay
buffer for them; one that sees it fall has met a restarted publisher.

- :mod:`radixmeta.transport.queue`: :class:`QueuePublisher` and :class:`QueueSubscriber`,
  in one process (the simulator, tests).
- :mod:`radixmeta.transport.zmq`: :class:`ZmqPublisher`, :class:`ZmqSubscriber` and
  :class:`AsyncZmqSubscriber`, wire-compatible with vLLM and SGLang.

Both subscribers share one interface: ``recv(timeout) -> Message | None`` and
``replay(source, start_seq, timeout=...) -> ReplayResult``. The ZeroMQ ones also ask a
radixmeta publisher for a snapshot: ``snapshot(source, timeout=...) -> SnapshotResult``.
"""

from __future__ import annotations

from radixmeta.transport._endpoints import (
    dp_endpoints,
    offset_endpoint,
    publisher_binds,
    subscriber_binds,
)
from radixmeta.transport.base import (
    Batch,
    Message,
    PublisherStats,
    ReplayLayout,
    ReplayResult,
    Snapshot,
    SnapshotResult,
    SnapshotSource,
    SnapshotStatus,
    SubscriberStats,
)
from radixmeta.transport.queue import QueuePublisher, QueueSubscriber
from radixmeta.transport.zmq import AsyncZmqSubscriber, ZmqPublisher, ZmqSubscriber

__all__ = [
    "AsyncZmqSubscriber",
    "Batch",
    "Message",
    "PublisherStats",
    "QueuePublisher",
    "QueueSubscriber",
    "ReplayLayout",
    "ReplayResult",
    "Snapshot",
    "SnapshotResult",
    "SnapshotSource",
    "SnapshotStatus",
    "SubscriberStats",
    "ZmqPublisher",
    "ZmqSubscriber",
    "dp_endpoints",
    "offset_endpoint",
    "publisher_binds",
    "subscriber_binds",
]
