"""From engines' KV-event batches to radixmeta's records.

A vLLM or SGLang batch (decoded by :mod:`radixmeta.wire`) carries events in the
engine's terms: a medium, a LoRA adapter, a cache salt, extra keys, a KV-cache
group. :class:`BatchConverter` turns them into :class:`~radixmeta.events.Stored`,
:class:`~radixmeta.events.Removed` and :class:`~radixmeta.events.Cleared` records
named by ``(seq, index)``, the batch's sequence number and the event's position
in it, and counts what it leaves out:

* a store without tokens (vLLM's offload placeholders) cannot be placed in a
  token tree: ``tokenless``;
* an event of a KV-cache group other than 0 (hybrid models' other attention
  groups): ``other_group``;
* an event whose medium maps to no tier: ``unmapped_medium``;
* a store whose ``block_size`` differs from the router's: ``wrong_block_size``;
* an event type the decoder did not know: ``unknown``.

Page identity: the adapter (``lora_name``, or ``lora_id``) and the cache salt
become the record's namespace (see :func:`namespace_of`); the per-block extra
keys (multimodal inputs, prompt embeddings) become one 64-bit tag per page
(:func:`extras_tag`), so the router matches a request by the identity the
engine used.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

import msgspec
import numpy as np

from radixmeta._records import Cleared, Namespace, Record, Removed, Stored
from radixmeta.errors import InvalidInputError
from radixmeta.wire.types import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

__all__ = [
    "DEFAULT_TIERS",
    "BatchConverter",
    "ConversionCounts",
    "engine_batch",
    "extras_tag",
    "namespace_of",
]

# Media by engine and release (reference note, sections 3.4 and 5.1): the device,
# and host memory (vLLM's KV offloading "CPU", SGLang HiCache's "CPU_PINNED").
# Disk and remote stores (vLLM "STORAGE", "FS", "OBJ"; SGLang "DISK", "EXTERNAL")
# are not a tier a router counts as a hit: unmapped unless the caller maps them.
DEFAULT_TIERS: Mapping[str | None, int] = {None: 0, "GPU": 0, "CPU": 1, "CPU_PINNED": 1}

logger = logging.getLogger("radixmeta.ingest")

_ENCODE = msgspec.msgpack.Encoder()


def extras_tag(extra_keys: Any) -> int:
    """The 64-bit tag of one block's extra keys: 0 for none, else a stable hash.

    The keys (vLLM's per-block tuple of LoRA key, multimodal ``(id, offset)``
    pairs, cache salt, prompt-embeds digests) are encoded as msgpack and hashed
    with BLAKE2b to 8 bytes, read big-endian; a hash of 0 becomes 1, so 0 always
    means "no extra keys". Lists and tuples hash alike (msgpack arrays).

    Examples
    --------
    >>> extras_tag(None), extras_tag([])
    (0, 0)
    >>> extras_tag(("mm-hash-1", 0)) == extras_tag(["mm-hash-1", 0]) != 0
    True
    """
    if extra_keys is None or (isinstance(extra_keys, (list, tuple)) and not extra_keys):
        return 0
    digest = hashlib.blake2b(_ENCODE.encode(extra_keys), digest_size=8).digest()
    return int.from_bytes(digest, "big") or 1


def namespace_of(event: BlockStored) -> Namespace:
    """A stored event's namespace: its LoRA adapter and cache salt, or None for neither.

    ``"lora:<name>"`` for an adapter (``lora_name``, else ``lora_id``),
    ``"salt:<salt>"`` for a salt, both joined by ``"|"`` when both are set.
    """
    lora = event.lora_name if event.lora_name is not None else event.lora_id
    parts = []
    if lora is not None:
        parts.append(f"lora:{lora}")
    if event.cache_salt is not None:
        parts.append(f"salt:{event.cache_salt}")
    return "|".join(parts) if parts else None


@dataclass
class ConversionCounts:
    """What a :class:`BatchConverter` produced and left out, cumulative."""

    batches: int = 0
    records: int = 0
    tokenless: int = 0
    other_group: int = 0
    unmapped_medium: int = 0
    wrong_block_size: int = 0
    unknown: int = 0

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class BatchConverter:
    """Turn one worker's engine batches into records, counting what it leaves out.

    Parameters
    ----------
    block_size : int
        The router's page size: the engine's block size (vLLM ``--block-size``,
        SGLang ``--page-size``) must equal it.
    tiers : mapping, optional
        Medium name (None for an event with no medium) to tier, 0 the device
        and 1 the host. Defaults to :data:`DEFAULT_TIERS`.
    namespace : callable, optional
        ``BlockStored -> namespace``; defaults to :func:`namespace_of`.
    """

    def __init__(
        self,
        block_size: int,
        *,
        tiers: Mapping[str | None, int] | None = None,
        namespace: Callable[[BlockStored], Namespace] = namespace_of,
    ) -> None:
        self.block_size = block_size
        self.tiers = dict(DEFAULT_TIERS if tiers is None else tiers)
        self.namespace = namespace
        self.counts = ConversionCounts()
        #: The block size the engine's stores carry, when it differs from ``block_size``
        #: (the first one seen): a misconfiguration, warned of once per converter.
        self.wrong_block_size: int | None = None

    def records(self, batch: EventBatch, *, worker: str, dp_rank: int, seq: int) -> list[Record]:
        """The records of ``batch``, number ``seq`` of worker ``(worker, dp_rank)``."""
        counts = self.counts
        counts.batches += 1
        out: list[Record] = []
        for index, event in enumerate(batch.events):
            record = self._record(event, worker, dp_rank, seq, index)
            if record is not None:
                out.append(record)
        counts.records += len(out)
        return out

    def _record(self, event: Any, worker: str, rank: int, seq: int, index: int) -> Record | None:
        counts = self.counts
        if isinstance(event, AllBlocksCleared):
            return Cleared(worker, rank, seq, index)
        if not isinstance(event, (BlockStored, BlockRemoved)):
            counts.unknown += 1
            return None
        if event.group_idx not in (None, 0):
            counts.other_group += 1
            return None
        tier = self.tiers.get(event.medium)
        if tier is None:
            counts.unmapped_medium += 1
            return None
        if isinstance(event, BlockRemoved):
            return Removed(worker, rank, seq, index, tier=tier, block_hashes=event.block_hashes)
        if len(event.token_ids) == 0:
            counts.tokenless += 1
            return None
        if event.block_size != self.block_size:
            counts.wrong_block_size += 1
            if self.wrong_block_size is None:
                self.wrong_block_size = event.block_size
                logger.warning(
                    "worker (%r, dp_rank=%d) stores blocks of %d tokens, but the router's "
                    "block size is %d: every store of it is left out until they agree "
                    "(pass the engine's --block-size / --page-size)",
                    worker,
                    rank,
                    event.block_size,
                    self.block_size,
                )
            return None
        return Stored(
            worker,
            rank,
            seq,
            index,
            tier=tier,
            namespace=self.namespace(event),
            block_hashes=event.block_hashes,
            parent_hash=event.parent_block_hash,
            token_ids=event.token_ids,
            extras=_tags(event.extra_keys, len(event.block_hashes)),
        )


def _tags(extra_keys: list[Any] | None, blocks: int) -> np.ndarray | None:
    """One tag per block, or None when no block has extra keys (the common case)."""
    if not extra_keys or all(k is None for k in extra_keys):
        return None
    tags = np.zeros(blocks, dtype=np.uint64)
    for i, keys in enumerate(extra_keys[:blocks]):
        tags[i] = extras_tag(keys)
    return tags if tags.any() else None


def engine_batch(
    records: list[Record],
    *,
    block_size: int,
    medium: str | None = "GPU",
    timestamp: float = 0.0,
    dp_rank: int | None = None,
) -> EventBatch:
    """The engine events of block-form records: what a radixmeta-based engine publishes.

    The inverse of :class:`BatchConverter` for a worker whose
    :class:`~radixmeta.EventLog` has ``form="blocks"``: each ``Stored`` becomes a
    ``BlockStored``, each ``Removed`` a ``BlockRemoved``, each ``Cleared`` an
    ``AllBlocksCleared``; encode the batch with :mod:`radixmeta.wire.vllm` or
    :mod:`radixmeta.wire.sglang` and a vLLM or SGLang consumer reads it. With
    ``hash="sglang"`` on the log, the hashes are SGLang's own.

    Raises
    ------
    InvalidInputError
        A record in token-path form (it names no blocks).
    """
    events: list[Any] = []
    for r in records:
        if isinstance(r, Cleared):
            events.append(AllBlocksCleared())
        elif r.block_hashes is None or (isinstance(r, Stored) and r.token_ids is None):
            msg = f"record {r.seq}.{r.index} is in token-path form: use EventLog(form='blocks')"
            raise InvalidInputError(msg)
        elif isinstance(r, Removed):
            events.append(BlockRemoved(r.block_hashes, medium=medium))
        else:
            assert r.token_ids is not None  # checked above
            events.append(
                BlockStored(r.block_hashes, r.parent_hash, r.token_ids, block_size, medium=medium)
            )
    return EventBatch(timestamp, events, dp_rank)
