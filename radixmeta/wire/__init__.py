"""Wire codecs for KV-cache event streams: vLLM's and SGLang's payloads.

:mod:`radixmeta.wire.vllm` and :mod:`radixmeta.wire.sglang` each have
``decode_batch(data) -> EventBatch`` and ``encode_batch(batch, *, version=...)``;
both decode into the engine-neutral event types of :mod:`radixmeta.wire.types`,
re-exported here. :mod:`radixmeta.wire.native` carries radixmeta's own records
(:mod:`radixmeta.events`) for a radixmeta-based engine. See the wire page of the
documentation.

Every decoder is total: any byte string decodes or raises
:class:`~radixmeta.errors.DecodeError`, with messages nested at most
:data:`MAX_DEPTH` arrays and maps deep and no length trusted before the bytes
are there to hold it.
"""

from __future__ import annotations

from radixmeta.wire._limits import MAX_DEPTH
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
    "MAX_DEPTH",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "UnknownEvent",
    "WireHashes",
]
