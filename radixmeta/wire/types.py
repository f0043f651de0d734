"""Engine-level KV-cache events: what vLLM and SGLang publish, in one normalised form.

The decoders of :mod:`radixmeta.wire.vllm` and :mod:`radixmeta.wire.sglang`
return these types and the encoders take them. A field is the union of what
any release of either engine sends (reference note, sections 3.1 and 5.1); a
field an engine or release does not send is ``None``.

Normalisation, the same for both engines:

* hashes are unsigned 64-bit ints: a negative int is read as two's
  complement, ``bytes`` by their last 8 bytes big-endian (as vLLM and llm-d
  fold raw digests); ``block_hashes`` is a ``numpy.uint64`` array;
* ``token_ids`` is a ``numpy.uint32`` array; SGLang's EAGLE bigram pairs
  ``[[t0, t1], [t1, t2], ...]`` are flattened to ``[t0, t1, t2, ...]`` (N pairs,
  N + 1 tokens) and ``token_pairs`` is set;
* SGLang 0.5.18's ``metadata: {"cache_salt": ...}`` element becomes ``cache_salt``.

What an encoder needs to give the engine's bytes back exactly is kept only where
it differs from the engine's usual form: ``token_pairs``, and ``wire_hashes``
when the hashes were not sent as the engine's canonical integers.

The structs are frozen (fields cannot be reassigned) and picklable. Events
holding arrays compare equal when every field is equal, arrays element-wise;
they are not hashable.
"""

from __future__ import annotations

from typing import Any, TypeAlias

import msgspec
import numpy as np
import numpy.typing as npt

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "Event",
    "EventBatch",
    "UnknownEvent",
    "WireHashes",
]


class _WithArrays(msgspec.Struct, frozen=True, gc=False):
    """Events holding arrays: equal when every field is, arrays element-wise."""

    def __eq__(self, other: object) -> bool:
        if type(other) is not type(self):
            return NotImplemented
        for name in self.__struct_fields__:
            x, y = getattr(self, name), getattr(other, name)
            if isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
                if not np.array_equal(x, y):
                    return False
            elif bool(x != y):
                return False
        return True


class WireHashes(msgspec.Struct, frozen=True, gc=False):
    """The hashes of one event exactly as the engine sent them.

    Kept by a decoder only when they are not in the engine's canonical form
    (vLLM: unsigned ints; SGLang: signed int64), for example vLLM's raw digest
    ``bytes`` (``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``, the offload connector
    of 0.11 to 0.23) or the signed ``hash()`` values of vLLM 0.9 and 0.10. The
    encoders send these values verbatim.

    Parameters
    ----------
    block_hashes : tuple of int or bytes
        The event's ``block_hashes`` as sent.
    parent_block_hash : int, bytes or None
        The event's ``parent_block_hash`` as sent (always ``None`` for removals).
    """

    block_hashes: tuple[int | bytes, ...]
    parent_block_hash: int | bytes | None = None


class BlockStored(_WithArrays, frozen=True, gc=False):
    """Blocks that became cached: one run of contiguous blocks under one parent.

    Parameters
    ----------
    block_hashes : numpy.ndarray of uint64
        One hash per block, in order.
    parent_block_hash : int or None
        Hash of the block just before the first one; ``None`` when the run
        starts at the root.
    token_ids : numpy.ndarray of uint32
        The blocks' tokens (block *i* covers ``token_ids[i*block_size:(i+1)*block_size]``).
        Not checked against ``len(block_hashes) * block_size``: engines send
        token-less residency updates and partial blocks.
    block_size : int
        Tokens per block (SGLang's page size); 0 in vLLM's offload placeholders.
    lora_id : int or None
        vLLM's deprecated LoRA id (SGLang always sends ``None``).
    medium : str or None
        The storage tier: ``"GPU"``, vLLM's ``"CPU"`` and ``"STORAGE"``, SGLang's
        ``"CPU_PINNED"``, ``"DISK"`` and ``"EXTERNAL"``; ``None`` before vLLM 0.10.2
        and SGLang 0.5.10.
    lora_name : str or None
        The LoRA adapter (vLLM 0.14+, SGLang 0.5.22+).
    extra_keys : list or None
        vLLM 0.17+: per block, the extra keys of its hash (LoRA, multimodal
        inputs, salt), msgpack arrays as lists.
    group_idx : int or None
        vLLM 0.20+: the KV-cache group (hybrid models).
    kv_cache_spec_kind : str or None
        vLLM 0.22+: the group's attention kind, such as ``"full_attention"``.
    kv_cache_spec_sliding_window : int or None
        vLLM 0.22+: the group's sliding window.
    locality : str or None
        vLLM 0.26+: ``"LOCAL"`` or ``"REMOTE"``.
    ownership : str or None
        vLLM 0.29+: the secondary offload tier.
    session_id : str or None
        vLLM 0.30+, SGLang 0.5.20+.
    lookahead_token_ids : list of list of int, or None
        vLLM 0.33+, as decoded.
    cache_salt : str or None
        SGLang's cache salt: the map field of 0.5.20+, or 0.5.18's ``metadata``.
    token_pairs : bool
        ``token_ids`` arrived as SGLang bigram pairs (and are sent back as pairs).
    wire_hashes : WireHashes or None
        The hashes as sent, when they were not in the engine's canonical form.
    """

    block_hashes: npt.NDArray[np.uint64]
    parent_block_hash: int | None
    token_ids: npt.NDArray[np.uint32]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: list[Any] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[list[int]] | None = None
    cache_salt: str | None = None
    token_pairs: bool = False
    wire_hashes: WireHashes | None = None


class BlockRemoved(_WithArrays, frozen=True, gc=False):
    """Blocks that were evicted (vLLM: one event per block; SGLang: a node's pages).

    Parameters
    ----------
    block_hashes : numpy.ndarray of uint64
        The removed blocks' hashes.
    medium : str or None
        The storage tier, as for :class:`BlockStored`.
    group_idx : int or None
        vLLM 0.20+: the KV-cache group.
    locality, ownership : str or None
        vLLM 0.26+ and 0.29+, as for :class:`BlockStored`.
    wire_hashes : WireHashes or None
        The hashes as sent, when they were not in the engine's canonical form.
    """

    block_hashes: npt.NDArray[np.uint64]
    medium: str | None = None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None
    wire_hashes: WireHashes | None = None


class AllBlocksCleared(msgspec.Struct, frozen=True, gc=False):
    """The engine dropped its whole prefix cache (``reset_prefix_cache``)."""


class UnknownEvent(msgspec.Struct, frozen=True, gc=False):
    """An event whose type tag the decoder does not know: kept, never an error.

    A consumer counts and skips it; the encoders send ``raw`` back verbatim.

    Parameters
    ----------
    tag : str
        The event's type tag (``"BlockTransferred"``, say).
    raw : bytes
        The event's own msgpack bytes, tag included.
    """

    tag: str
    raw: bytes

    @property
    def fields(self) -> list[Any] | dict[str, Any]:
        """The event's fields without its tag: a list (array form) or a dict (map form)."""
        body = msgspec.msgpack.decode(self.raw)
        if isinstance(body, dict):
            return {k: v for k, v in body.items() if k != "type"}
        return list(body[1:])


Event: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared | UnknownEvent


class EventBatch(msgspec.Struct, frozen=True, gc=False):
    """One published message: the events of one scheduler step.

    Parameters
    ----------
    timestamp : float
        The publisher's ``time.time()`` when the batch was made.
    events : list of Event
        The events, in the order the engine produced them.
    dp_rank : int or None
        The data-parallel rank (vLLM ``data_parallel_rank``, SGLang
        ``attn_dp_rank``); ``None`` when the batch has only two elements.
    """

    timestamp: float
    events: list[Event]
    dp_rank: int | None = None
