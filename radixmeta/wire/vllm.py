"""vLLM's KV-cache event payloads, every release 0.9.0 to 0.33.x.

vLLM's structs live in ``vllm/distributed/kv_events.py``.

A payload is one msgpack ``EventBatch``: always a positional array
``[ts, events, data_parallel_rank]`` (two elements in 0.9.0), whose events are
tagged arrays up to 0.23 and tagged maps from 0.24 (vLLM PR #42892).

>>> from radixmeta.wire import vllm
>>> data = bytes.fromhex(
...     "93cb3ff80000000000009396ab426c6f636b53746f72656492cf1111111111111111"
...     "cff000000000000001c0940102030402c092ac426c6f636b52656d6f76656491cff0"
...     "0000000000000191b0416c6c426c6f636b73436c656172656400"
... )
>>> batch = vllm.decode_batch(data)  # a vLLM 0.9.1 batch
>>> stored = batch.events[0]
>>> [hex(h) for h in stored.block_hashes.tolist()], stored.token_ids.tolist()
(['0x1111111111111111', '0xf000000000000001'], [1, 2, 3, 4])
>>> vllm.encode_batch(batch, version="0.9.1") == data
True
"""

from __future__ import annotations

from typing import Any

import msgspec

from radixmeta.wire._codec import Codec
from radixmeta.wire._encode import Layout, Profile
from radixmeta.wire._normalise import canonical_unsigned, decoded_tokens, raw_token_ids
from radixmeta.wire._schema import (
    OPTIONAL_ARRAY,
    OPTIONAL_INT,
    OPTIONAL_STR,
    SIZE,
    TOKEN_ROWS,
    TOKENS,
    EventSchema,
    Field,
    Kind,
    Size,
    Token,
)
from radixmeta.wire.types import BlockRemoved, BlockStored, EventBatch

__all__ = ["SUPPORTED", "decode_batch", "encode_batch", "layout"]

_HASH = int | bytes  # ExternalBlockHash (0.10.2+): a uint64, or the raw digest
# Token ids the native reader cannot take (no extension, or an odd encoding) are
# decoded as a checked list; anything but ints sends the batch to the exact path.
_TOKEN_LIST = msgspec.msgpack.Decoder(list[int])
_HASHES = Kind(("an array of hashes (integers or bytes)", "a hash (an integer or bytes)"))
_PARENT = Kind(("a hash (an integer or bytes) or nil",))

# Fields in declaration order (= array position after the tag), with the release
# that added each: reference note section 3.1, checked against the per-release
# table of section 3.2 (array lengths 6, 7, 8, 9, 10, 12 for 0.9.0, 0.10.2,
# 0.14.0, 0.17.0, 0.20.0, 0.22.0) and a vLLM v0.29.0 struct fixture seen in
# public code (the same order; lora_id, medium and lora_name without defaults).
# `always`: no default in vLLM's struct, so sent as nil in maps; the rest
# default to None and are omitted from maps when None.
_STORED = EventSchema(
    "BlockStored",
    (
        Field("block_hashes", (0, 9, 0), list[_HASH], _HASHES, always=True, required=True),
        Field("parent_block_hash", (0, 9, 0), _HASH | None, _PARENT, always=True),
        Field(
            "token_ids",
            (0, 9, 0),
            list[Token],
            TOKENS,
            always=True,
            required=True,
            fast_type=msgspec.Raw,  # read by raw_token_ids: no Python int per token
        ),
        Field("block_size", (0, 9, 0), Size, SIZE, always=True, required=True),
        Field("lora_id", (0, 9, 0), int | None, OPTIONAL_INT, always=True),
        Field("medium", (0, 10, 2), str | None, OPTIONAL_STR, always=True),  # PR #19737
        Field("lora_name", (0, 14, 0), str | None, OPTIONAL_STR, always=True),  # PR #27577
        Field("extra_keys", (0, 17, 0), list[Any] | None, OPTIONAL_ARRAY),  # PR #33304
        Field("group_idx", (0, 20, 0), int | None, OPTIONAL_INT),  # PR #37688
        Field("kv_cache_spec_kind", (0, 22, 0), str | None, OPTIONAL_STR),  # PR #40984
        Field("kv_cache_spec_sliding_window", (0, 22, 0), int | None, OPTIONAL_INT),
        # Map era only from here on: no array position.
        Field("locality", (0, 26, 0), str | None, OPTIONAL_STR),
        Field("ownership", (0, 29, 0), str | None, OPTIONAL_STR),
        Field("session_id", (0, 30, 0), str | None, OPTIONAL_STR),
        Field("lookahead_token_ids", (0, 33, 0), list[list[Token]] | None, TOKEN_ROWS),
    ),
)
_REMOVED = EventSchema(
    "BlockRemoved",
    (
        Field("block_hashes", (0, 9, 0), list[_HASH], _HASHES, always=True, required=True),
        Field("medium", (0, 10, 2), str | None, OPTIONAL_STR, always=True),
        Field("group_idx", (0, 20, 0), int | None, OPTIONAL_INT),
        Field("locality", (0, 26, 0), str | None, OPTIONAL_STR),
        Field("ownership", (0, 29, 0), str | None, OPTIONAL_STR),
    ),
)
_CLEARED = EventSchema("AllBlocksCleared", ())

# Declared field counts of the map era, tag included (msgspec sizes a map's
# header by them, reference note section 2): BlockStored 12 in 0.24-0.25,
# 13 in 0.26-0.28 (locality), 14 in 0.29 (ownership), 15 in 0.30-0.32
# (session_id): all fixmap (at most 15 entries); 16 in 0.33
# (lookahead_token_ids): map16, "de 00 0b" for an 11-entry map, as the golden
# vector of section 3.6 shows. BlockRemoved: 4, 5, 6, 6, 6: fixmap.
# tests/test_wire_vllm.py checks these counts and the header bytes.
_PROFILE = Profile(
    engine="vLLM",
    stored=_STORED,
    removed=_REMOVED,
    cleared=_CLEARED,
    map_since=(0, 24, 0),  # PR #42892: array_like dropped from KVCacheEvent
    rank_since=(0, 9, 1),  # PR #18925: EventBatch.data_parallel_rank
    end=(0, 34, 0),
    newest="0.33.x",
    signed=False,
    pairs=False,
)


def _stored(e: Any) -> BlockStored:
    hashes, parent, wire = canonical_unsigned(e.block_hashes, e.parent_block_hash)
    return BlockStored(
        hashes,
        parent,
        decoded_tokens(raw_token_ids(e.token_ids, _TOKEN_LIST)),
        e.block_size,
        lora_id=e.lora_id,
        medium=e.medium,
        lora_name=e.lora_name,
        extra_keys=e.extra_keys,
        group_idx=e.group_idx,
        kv_cache_spec_kind=e.kv_cache_spec_kind,
        kv_cache_spec_sliding_window=e.kv_cache_spec_sliding_window,
        locality=e.locality,
        ownership=e.ownership,
        session_id=e.session_id,
        lookahead_token_ids=e.lookahead_token_ids,
        wire_hashes=wire,
    )


def _removed(e: Any) -> BlockRemoved:
    hashes, _, wire = canonical_unsigned(e.block_hashes, None)
    return BlockRemoved(
        hashes,
        medium=e.medium,
        group_idx=e.group_idx,
        locality=e.locality,
        ownership=e.ownership,
        wire_hashes=wire,
    )


# The native scanner takes canonical hashes only (non-negative ints); signed and
# bytes hashes go the msgspec way, which keeps them as sent in WireHashes.
_NATIVE_KINDS = {_HASHES: "hashes_u64", _PARENT: "hash_u64_or_nil"}
_CODEC = Codec(_PROFILE, stored=_stored, removed=_removed, native_kinds=_NATIVE_KINDS)
SUPPORTED = _CODEC.layouts.range_text
"""The releases this module knows, as ``"0.9.0 to 0.33.x"``."""


def decode_batch(data: bytes) -> EventBatch:
    """Decode one vLLM ``KVEventBatch`` payload, of any release 0.9.0 to 0.33.x.

    Array-era events (up to 0.23) may have 6 to 12 elements, map-era events
    (0.24 on) may omit optional fields; both may appear in one batch, fields and
    batch elements this decoder does not know are ignored, and an event of an
    unknown type becomes an :class:`~radixmeta.wire.UnknownEvent`.

    Parameters
    ----------
    data : bytes
        The payload frame (bytes, bytearray or memoryview).

    Returns
    -------
    EventBatch
        Normalised as :mod:`radixmeta.wire.types` describes.

    Raises
    ------
    DecodeError
        The bytes are not msgpack, or not a batch of valid events; no partial
        batch is returned.
    InputTypeError
        ``data`` is not bytes-like.

    Notes
    -----
    Complexity: O(len(data)). One typed msgspec decode of the whole batch plus
    one small conversion per event; token and hash lists become numpy arrays
    through ``array.array`` (a C loop). Batches it cannot take that way (mixed
    array and map events, unknown event types, errors) are decoded event by
    event.
    """
    return _CODEC.decode(data)


def layout(version: str = "0.33") -> Layout:
    """The wire layout of a vLLM release (field counts, era, batch length).

    Raises
    ------
    InvalidInputError
        ``version`` is not a release number, or outside :data:`SUPPORTED`.
    """
    return _CODEC.layout(version)


def encode_batch(batch: EventBatch, *, version: str = "0.33") -> bytes:
    """Encode a batch exactly as vLLM release ``version`` does.

    The bytes equal those of vLLM's own encoder for the same batch: the
    release's array lengths up to 0.23, its omitted fields and map header size
    from 0.24 (0.33 declares 16 ``BlockStored`` fields, so its header is
    ``map16``). Event fields the release does not have are not sent, so the
    batch is projected onto the release. Hashes go out as unsigned ints, or as
    the event's ``wire_hashes`` when it has them; unknown events as they came.

    Parameters
    ----------
    batch : EventBatch
        The batch; events built by hand may hold lists where decoded events
        hold arrays.
    version : str, default "0.33"
        A vLLM release, such as ``"0.9.0"``, ``"0.22.0"`` or ``"0.33"``.

    Returns
    -------
    bytes
        One msgpack ``KVEventBatch`` payload.

    Raises
    ------
    InvalidInputError
        An unknown release, a hash or token id out of range, a negative
        ``block_size``.
    InputTypeError
        ``batch`` is not an :class:`~radixmeta.wire.EventBatch`, or holds something
        other than an event.

    Notes
    -----
    Complexity: O(number of tokens and hashes), through Python lists.
    """
    return _CODEC.encode(batch, version)
