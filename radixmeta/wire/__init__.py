"""Wire codecs for KV-cache event streams: vLLM's and SGLang's payloads.

:mod:`radixmeta.wire.vllm` and :mod:`radixmeta.wire.sglang` each have
``decode_batch(data) -> EventBatch`` and ``encode_batch(batch, *, version=...)``;
both decode into the engine-neutral event types of :mod:`radixmeta.wire.types`,
re-exported here. :mod:`radixmeta.wire.native` carries radixmeta's own records
(:mod:`radixmeta.events`) for a radixmeta-based engine. See the wire page of the
documentation.
"""

from __future__ import annotations

from radixmeta.wire.types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    Event,
    EventBatch,
    UnknownEvent,
    WireHashes,
)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "UnknownEvent",
    "WireHashes",
]
