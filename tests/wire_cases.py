"""Shared data for the wire codec tests: the reference note's golden vectors and the
hypothesis strategies that build batches a given engine release can carry.

Golden vectors: ``../shared/reference/kv-events.md`` sections 3.6 (vLLM) and 5.1
(SGLang), produced by each release's real encoder.
"""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import msgspec
import numpy as np
import pytest
from hypothesis import strategies as st

from radixmeta.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    UnknownEvent,
    WireHashes,
)
from radixmeta.wire import sglang as sglang_codec
from radixmeta.wire import vllm as vllm_codec

_V024 = (
    "93cb3ff8000000000000938ba474797065ab426c6f636b53746f726564ac626c6f636b5f68617368657392cf"
    "1111111111111111cff000000000000001b1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f69"
    "64739401020304aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da3475055a96c6f7261"
    "5f6e616d65c0aa65787472615f6b65797392c0c0a967726f75705f69647800b26b765f63616368655f737065"
    "635f6b696e64ae66756c6c5f617474656e74696f6e84a474797065ac426c6f636b52656d6f766564ac626c6f"
    "636b5f68617368657391cff000000000000001a66d656469756da3475055a967726f75705f6964780081a474"
    "797065b0416c6c426c6f636b73436c656172656400"
)
VLLM_GOLDEN = {
    "0.9.0": "92cb3ff80000000000009396ab426c6f636b53746f72656492cf1111111111111111cff00000000000"
    "0001c0940102030402c092ac426c6f636b52656d6f76656491cff00000000000000191b0416c6c426c6f636b"
    "73436c6561726564",
    "0.9.1": "93cb3ff80000000000009396ab426c6f636b53746f72656492cf1111111111111111cff00000000000"
    "0001c0940102030402c092ac426c6f636b52656d6f76656491cff00000000000000191b0416c6c426c6f636b"
    "73436c656172656400",
    "0.10.2": "93cb3ff80000000000009397ab426c6f636b53746f72656492cf1111111111111111cff0000000000"
    "00001c0940102030402c0a347505593ac426c6f636b52656d6f76656491cff000000000000001a3475055"
    "91b0416c6c426c6f636b73436c656172656400",
    "0.14.0": "93cb3ff80000000000009398ab426c6f636b53746f72656492cf1111111111111111cff0000000000"
    "00001c0940102030402c0a3475055c093ac426c6f636b52656d6f76656491cff000000000000001a34750"
    "5591b0416c6c426c6f636b73436c656172656400",
    "0.17.0": "93cb3ff80000000000009399ab426c6f636b53746f72656492cf1111111111111111cff0000000000"
    "00001c0940102030402c0a3475055c092c0c093ac426c6f636b52656d6f76656491cff000000000000001"
    "a347505591b0416c6c426c6f636b73436c656172656400",
    "0.20.0": "93cb3ff8000000000000939aab426c6f636b53746f72656492cf1111111111111111cff0000000000"
    "00001c0940102030402c0a3475055c092c0c00094ac426c6f636b52656d6f76656491cff0000000000000"
    "01a34750550091b0416c6c426c6f636b73436c656172656400",
    "0.22.0": "93cb3ff8000000000000939cab426c6f636b53746f72656492cf1111111111111111cff0000000000"
    "00001c0940102030402c0a3475055c092c0c000ae66756c6c5f617474656e74696f6ec094ac426c6f636b"
    "52656d6f76656491cff000000000000001a34750550091b0416c6c426c6f636b73436c656172656400",
    "0.24.0": _V024,
    # "identical to 0.24.0 except the BlockStored map header: de000b instead of 8b"
    "0.33.0": _V024.replace("938ba474797065", "93de000ba474797065", 1),
}
VLLM_SIZES = {  # bytes, as the reference lists them
    "0.9.0": 93,
    "0.9.1": 94,
    "0.10.2": 102,
    "0.14.0": 103,
    "0.17.0": 106,
    "0.20.0": 108,
    "0.22.0": 124,
    "0.24.0": 285,
    "0.33.0": 287,
}
SGLANG_GOLDEN = {
    "0.5.10": "93cb3ff80000000000009397ab426c6f636b53746f72656492fbcf7fffffffffffffffc092070802c0"
    "a347505593ac426c6f636b52656d6f76656491fba347505591b0416c6c426c6f636b73436c656172656400",
    "0.5.23": "93cb3ff80000000000009387a474797065ab426c6f636b53746f726564ac626c6f636b5f686173686573"
    "92fbcf7fffffffffffffffb1706172656e745f626c6f636b5f68617368c0a9746f6b656e5f696473920708"
    "aa626c6f636b5f73697a6502a76c6f72615f6964c0a66d656469756da347505583a474797065ac426c6f63"
    "6b52656d6f766564ac626c6f636b5f68617368657391fba66d656469756da347505581a474797065b0416c"
    "6c426c6f636b73436c656172656400",
}


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in version.split("."))


# The golden input of section 3.6, and the release that first carries each of its
# optional values ("fields that a version lacks are simply not passed").
_VLLM_FIELD_SINCE = {
    "medium": "0.10.2",
    "extra_keys": "0.17.0",
    "group_idx": "0.20.0",
    "kv_cache_spec_kind": "0.22.0",
}


def vllm_golden_batch(version: str) -> EventBatch:
    """The documented content of the vLLM golden vector of ``version``."""
    v = version_tuple(version)

    def has(name: str) -> bool:
        return v >= version_tuple(_VLLM_FIELD_SINCE[name])

    stored = BlockStored(
        np.array([0x1111111111111111, 0xF000000000000001], dtype=np.uint64),
        None,
        np.array([1, 2, 3, 4], dtype=np.uint32),
        2,
        medium="GPU" if has("medium") else None,
        extra_keys=[None, None] if has("extra_keys") else None,
        group_idx=0 if has("group_idx") else None,
        kv_cache_spec_kind="full_attention" if has("kv_cache_spec_kind") else None,
    )
    removed = BlockRemoved(
        np.array([0xF000000000000001], dtype=np.uint64),
        medium="GPU" if has("medium") else None,
        group_idx=0 if has("group_idx") else None,
    )
    rank = None if version == "0.9.0" else 0
    return EventBatch(1.5, [stored, removed, AllBlocksCleared()], rank)


def sglang_golden_batch(version: str) -> EventBatch:
    """The documented content of the SGLang golden vectors (the same for both)."""
    hashes = np.array([-5, 2**63 - 1], dtype=np.int64).view(np.uint64)
    stored = BlockStored(hashes, None, np.array([7, 8], dtype=np.uint32), 2, medium="GPU")
    removed = BlockRemoved(hashes[:1].copy(), medium="GPU")
    return EventBatch(1.5, [stored, removed, AllBlocksCleared()], 0)


# -- hypothesis: batches a release can carry ---------------------------------------------------
U64 = st.integers(0, 2**64 - 1)
MSGPACK_INT = st.integers(-(2**63), 2**64 - 1)
TOKEN = st.integers(0, 2**32 - 1)
SHORT_TEXT = st.text(max_size=6)
OPTIONAL_TEXT = st.none() | SHORT_TEXT
SCALAR = st.none() | st.booleans() | MSGPACK_INT | SHORT_TEXT | st.binary(max_size=8)
EXTRA_KEY = st.none() | st.lists(SCALAR | st.lists(SCALAR, max_size=2), max_size=3)


def u32(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def u64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def _fields(codec: ModuleType, version: str, struct: str) -> frozenset[str]:
    layout = codec.layout(version)
    names = set(getattr(layout, struct).__struct_fields__)
    if struct == "stored" and layout.salted is not None:
        names.add("cache_salt")  # 0.5.18's metadata element
    return frozenset(names)


@st.composite
def _wire_hashes(
    draw: st.DrawFn, codec: ModuleType, n: int, stored: bool
) -> tuple[list[int], int | None, WireHashes | None]:
    """Normalised hashes, the parent, and the wire form when it is not canonical."""
    has_parent = stored and draw(st.booleans())
    slots = n + has_parent
    if slots == 0 or draw(st.integers(0, 3)):  # mostly canonical
        hashes = draw(st.lists(U64, min_size=n, max_size=n))
        return hashes, draw(U64) if has_parent else None, None
    # Non-canonical, at least one value: vLLM negative ints or raw digests
    # (hash() in 0.9-0.10, VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0); SGLang u64 >= 2**63.
    if codec is vllm_codec:
        plain, odd = U64, st.integers(-(2**63), -1) | st.binary(max_size=32)
    else:
        plain, odd = st.integers(-(2**63), 2**63 - 1), st.integers(2**63, 2**64 - 1)
    sent: list[int | bytes] = draw(st.lists(plain | odd, min_size=slots, max_size=slots))
    sent[draw(st.integers(0, slots - 1))] = draw(odd)
    parent_sent = sent.pop() if has_parent else None
    parent = None if parent_sent is None else _norm(parent_sent)
    return [_norm(v) for v in sent], parent, WireHashes(tuple(sent), parent_sent)


def _norm(value: int | bytes) -> int:
    if isinstance(value, bytes):
        return int.from_bytes(value[-8:], "big")
    return value % 2**64


@st.composite
def stored_events(draw: st.DrawFn, codec: ModuleType, version: str) -> BlockStored:
    fields = _fields(codec, version, "stored")
    n = draw(st.integers(0, 4))
    hashes, parent, wire = draw(_wire_hashes(codec, n, stored=True))
    tokens = draw(st.lists(TOKEN, max_size=12))
    pairs = codec is sglang_codec and len(tokens) >= 2 and draw(st.booleans())
    values: dict[str, Any] = {
        "lora_id": st.none() | MSGPACK_INT,
        "medium": OPTIONAL_TEXT,
        "lora_name": OPTIONAL_TEXT,
        "extra_keys": st.none() | st.lists(EXTRA_KEY, max_size=n),
        "group_idx": st.none() | MSGPACK_INT,
        "kv_cache_spec_kind": OPTIONAL_TEXT,
        "kv_cache_spec_sliding_window": st.none() | MSGPACK_INT,
        "locality": OPTIONAL_TEXT,
        "ownership": OPTIONAL_TEXT,
        "session_id": OPTIONAL_TEXT,
        "lookahead_token_ids": st.none() | st.lists(st.lists(TOKEN, max_size=3), max_size=2),
        "cache_salt": OPTIONAL_TEXT,
    }
    chosen = {name: draw(strategy) for name, strategy in values.items() if name in fields}
    return BlockStored(
        u64(hashes),
        parent,
        u32(tokens),
        draw(st.integers(0, 2**32)),
        token_pairs=pairs,
        wire_hashes=wire,
        **chosen,
    )


@st.composite
def removed_events(draw: st.DrawFn, codec: ModuleType, version: str) -> BlockRemoved:
    fields = _fields(codec, version, "removed")
    hashes, _, wire = draw(_wire_hashes(codec, draw(st.integers(0, 4)), stored=False))
    optional = {"medium": OPTIONAL_TEXT, "group_idx": st.none() | MSGPACK_INT}
    optional |= {"locality": OPTIONAL_TEXT, "ownership": OPTIONAL_TEXT}
    chosen = {name: draw(strategy) for name, strategy in optional.items() if name in fields}
    return BlockRemoved(u64(hashes), wire_hashes=wire, **chosen)


KNOWN_TAGS = {"BlockStored", "BlockRemoved", "AllBlocksCleared"}


@st.composite
def unknown_events(draw: st.DrawFn) -> UnknownEvent:
    tag = draw(SHORT_TEXT.filter(lambda t: t not in KNOWN_TAGS))
    body = draw(st.lists(SCALAR, max_size=3))
    if draw(st.booleans()):
        raw = msgspec.msgpack.encode([tag, *body])
    else:
        raw = msgspec.msgpack.encode({"type": tag, **{f"k{i}": v for i, v in enumerate(body)}})
    return UnknownEvent(tag, raw)


@st.composite
def batches(
    draw: st.DrawFn, codec: ModuleType, version: str, *, unknown: bool = True
) -> EventBatch:
    """A batch whose every field the release carries, so encode then decode gives it back.

    Without ``unknown`` events every batch is one the fast decode path takes.
    """
    kinds = [stored_events(codec, version), removed_events(codec, version)]
    kinds.append(st.just(AllBlocksCleared()))
    event = st.one_of(*kinds, *([unknown_events()] if unknown else []))
    events = draw(st.lists(event, max_size=5))
    ranked = codec.layout(version).batch_rank
    rank = draw(st.none() | st.integers(0, 2**16)) if ranked else None
    return EventBatch(draw(st.floats(allow_nan=False)), events, rank)


CODECS = {"vllm": vllm_codec, "sglang": sglang_codec}
# Every release that starts a layout, and a few in between.
VLLM_RELEASES = ["0.9.0", "0.9.1", "0.10.1.1", "0.10.2", "0.14.0", "0.17.0", "0.20.0"]
VLLM_RELEASES += ["0.22.0", "0.23.0", "0.24.0", "0.26.0", "0.29.0", "0.30.0", "0.32.0", "0.33.0"]
SGLANG_RELEASES = ["0.4.6.post5", "0.4.7", "0.5.6", "0.5.10", "0.5.18", "0.5.20", "0.5.22"]
SGLANG_RELEASES += ["0.5.23"]
ROUND_TRIP_VERSIONS = [("vllm", v) for v in VLLM_RELEASES]
ROUND_TRIP_VERSIONS += [("sglang", v) for v in SGLANG_RELEASES]


def raises(exc: type[BaseException], message: str) -> Any:
    """``pytest.raises`` for exactly this exception message."""
    return pytest.raises(exc, match=f"^{re.escape(message)}$")
