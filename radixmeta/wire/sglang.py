"""SGLang's KV-cache event payloads, every release 0.4.6 to 0.5.23.

SGLang's structs live in ``python/sglang/srt/disaggregation/kv_events.py``.

The batch is the same positional array as vLLM's (``[ts, events,
attn_dp_rank]``, two elements in 0.4.6); events are tagged arrays up to
0.5.18 and tagged maps from 0.5.20 (SGLang PR #37482). Hashes are signed
int64 on the wire; ``token_ids`` may be EAGLE bigram pairs.

>>> from radixmeta.wire import sglang
>>> data = bytes.fromhex(
...     "93cb3ff80000000000009397ab426c6f636b53746f72656492fbcf7fffffffffffffffc092"
...     "070802c0a347505593ac426c6f636b52656d6f76656491fba347505591b0416c6c426c6f"
...     "636b73436c656172656400"
... )
>>> batch = sglang.decode_batch(data)  # an SGLang 0.5.10 batch
>>> batch.events[0].block_hashes.view("int64").tolist()
[-5, 9223372036854775807]
>>> sglang.encode_batch(batch, version="0.5.10") == data
True
"""

from __future__ import annotations

from typing import Any

import msgspec

from radixmeta.wire._codec import Codec
from radixmeta.wire._encode import Layout, Profile
from radixmeta.wire._normalise import (
    canonical_signed,
    decoded_tokens,
    flatten_pairs,
    raw_token_ids,
)
from radixmeta.wire._schema import (
    OPTIONAL_INT,
    OPTIONAL_STR,
    SIZE,
    EventSchema,
    Field,
    Kind,
    Size,
    Token,
)
from radixmeta.wire._sglang_hash import block_hashes, page_digests
from radixmeta.wire.types import BlockRemoved, BlockStored, EventBatch

__all__ = ["SUPPORTED", "block_hashes", "decode_batch", "encode_batch", "layout", "page_digests"]

_HASHES = Kind(("an array of integers", "an integer"))
_PARENT = Kind(("an integer or nil",))
# Token ids, or bigram pairs. Not `tuple[Token, Token]`: msgspec 0.23 crashes
# (SIGSEGV) decoding a 3-element array into a union of a constrained int and a
# fixed-length tuple, so pairs are checked by flatten_pairs instead.
_TOKENS = list[Token | list[Token]]
# The native reader's fallback: ints, or SGLang's EAGLE bigram pairs.
_TOKEN_ITEMS = msgspec.msgpack.Decoder(list[int | list[int]])
_TOKEN_KIND = Kind(
    ("an array of integers or of integer pairs", "an integer or a pair of integers", "an integer"),
    limit="token",
)


class _Metadata(msgspec.Struct, gc=False):
    # 0.5.18's BlockStoredMetadata: {"cache_salt": str}; other keys are ignored.
    cache_salt: str | None = None


# Fields in declaration order, with the release that added each: reference
# note section 5.1 (the per-release table and the golden vectors), and
# SGLang's 0.5.10-0.5.18 source (medium defaults to None but, the events
# being array_like, is always sent). Map era (0.5.20+): block_hashes to
# lora_id always sent, the rest omitted when None; the map-only fields come in
# the order the reference lists them (cache_salt, session_id, then lora_name in
# 0.5.22), which only matters for byte-exact maps that carry them.
_STORED = EventSchema(
    "BlockStored",
    (
        Field("block_hashes", (0, 4, 6), list[int], _HASHES, always=True, required=True),
        Field("parent_block_hash", (0, 4, 6), int | None, _PARENT, always=True),
        Field(
            "token_ids",
            (0, 4, 6),
            _TOKENS,
            _TOKEN_KIND,
            always=True,
            required=True,
            fast_type=msgspec.Raw,  # read by raw_token_ids: no Python int per token
        ),
        Field("block_size", (0, 4, 6), Size, SIZE, always=True, required=True),
        Field("lora_id", (0, 4, 6), int | None, OPTIONAL_INT, always=True),
        Field("medium", (0, 5, 10), str | None, OPTIONAL_STR),
        Field("cache_salt", (0, 5, 20), str | None, OPTIONAL_STR),
        Field("session_id", (0, 5, 20), str | None, OPTIONAL_STR),
        Field("lora_name", (0, 5, 22), str | None, OPTIONAL_STR),
    ),
    # 0.5.18's BlockStoredWithMetadata (tag "BlockStored"): a kw_only field after
    # the others, so the 8th element, sent only for salted stores.
    array_extra=(
        Field("metadata", (0, 5, 18), _Metadata | None, Kind(("a map or nil", "a string or nil"))),
    ),
)
_REMOVED = EventSchema(
    "BlockRemoved",
    (
        Field("block_hashes", (0, 4, 6), list[int], _HASHES, always=True, required=True),
        Field("medium", (0, 5, 10), str | None, OPTIONAL_STR),
    ),
)
_CLEARED = EventSchema("AllBlocksCleared", ())

# Declared field counts of the map era, tag included: BlockStored 9 in
# 0.5.20 and 10 from 0.5.22, BlockRemoved 3: all fixmap headers.
_PROFILE = Profile(
    engine="SGLang",
    stored=_STORED,
    removed=_REMOVED,
    cleared=_CLEARED,
    map_since=(0, 5, 20),
    rank_since=(0, 4, 7),  # EventBatch.attn_dp_rank
    end=(0, 5, 24),
    newest="0.5.23",
    signed=True,
    pairs=True,
    salted_since=(0, 5, 18),
)


def _stored(e: Any) -> BlockStored:
    hashes, parent, wire = canonical_signed(e.block_hashes, e.parent_block_hash)
    ids = raw_token_ids(e.token_ids, _TOKEN_ITEMS)
    try:
        tokens = decoded_tokens(ids)
        pairs = False
    except TypeError:  # a pair among the integers: EAGLE bigram keys
        tokens = flatten_pairs(ids, "BlockStored.token_ids")
        pairs = True
    salt = e.cache_salt if e.metadata is None else e.metadata.cache_salt
    return BlockStored(
        hashes,
        parent,
        tokens,
        e.block_size,
        lora_id=e.lora_id,
        medium=e.medium,
        lora_name=e.lora_name,
        session_id=e.session_id,
        cache_salt=salt,
        token_pairs=pairs,
        wire_hashes=wire,
    )


def _removed(e: Any) -> BlockRemoved:
    hashes, _, wire = canonical_signed(e.block_hashes, None)
    return BlockRemoved(hashes, medium=e.medium, wire_hashes=wire)


_CODEC = Codec(_PROFILE, stored=_stored, removed=_removed)
SUPPORTED = _CODEC.layouts.range_text
"""The releases this module knows, as ``"0.4.6 to 0.5.23"``."""


def decode_batch(data: bytes) -> EventBatch:
    """Decode one SGLang ``KVEventBatch`` payload, of any release 0.4.6 to 0.5.23.

    Array-era events (up to 0.5.18, including the salted stores' 8th element
    ``metadata``) and map-era events (0.5.20 on) may appear in one batch;
    unknown fields and batch elements are ignored, and an event of an unknown
    type becomes an :class:`~radixmeta.wire.UnknownEvent`. Signed hashes become
    unsigned, bigram ``token_ids`` are flattened (``token_pairs`` is set).

    Parameters
    ----------
    data : bytes
        The payload frame (bytes, bytearray or memoryview).

    Returns
    -------
    EventBatch

    Raises
    ------
    DecodeError
        The bytes are not msgpack, or not a batch of valid events (also: bigram
        pairs that do not chain); no partial batch is returned.
    InputTypeError
        ``data`` is not bytes-like.

    Notes
    -----
    Complexity: O(len(data)), as :func:`radixmeta.wire.vllm.decode_batch`.
    """
    return _CODEC.decode(data)


def layout(version: str = "0.5.23") -> Layout:
    """The wire layout of an SGLang release (field counts, era, batch length).

    Raises
    ------
    InvalidInputError
        ``version`` is not a release number, or outside :data:`SUPPORTED`.
    """
    return _CODEC.layout(version)


def encode_batch(batch: EventBatch, *, version: str = "0.5.23") -> bytes:
    """Encode a batch exactly as SGLang release ``version`` does.

    Hashes go out as signed int64 (or the event's ``wire_hashes``),
    ``token_pairs`` events as bigram pairs, a salted store of 0.5.18 with its
    ``metadata`` element; fields the release does not have are not sent.

    Parameters
    ----------
    batch : EventBatch
        The batch.
    version : str, default "0.5.23"
        An SGLang release, such as ``"0.4.7"``, ``"0.5.10"`` or ``"0.4.6.post5"``.

    Returns
    -------
    bytes
        One msgpack ``KVEventBatch`` payload.

    Raises
    ------
    InvalidInputError
        An unknown release, a hash or token id out of range, a negative
        ``block_size``, ``token_pairs`` with fewer than 2 tokens.
    InputTypeError
        ``batch`` is not an :class:`~radixmeta.wire.EventBatch`, or holds something
        other than an event.

    Notes
    -----
    Complexity: O(number of tokens and hashes), through Python lists.
    """
    return _CODEC.encode(batch, version)
