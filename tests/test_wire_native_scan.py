"""The native scanner of map-era batches changes nothing but the speed.

For any bytes, ``vllm.decode_batch`` with the native fast path gives exactly
what it gives without it: the same batch, or the same error. The scanner
answers "not mine" for any shape it does not fully take, so these tests also
check that it does take the batches vLLM publishes (else they would pass
without testing anything).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import msgspec
import numpy as np
import pytest
from conftest import require_native
from hypothesis import given, settings
from hypothesis import strategies as st

from radixmeta.errors import DecodeError
from radixmeta.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, vllm

MAP_ERA = ["0.24", "0.26", "0.29", "0.30", "0.33"]
DECODER = vllm._CODEC.decoder


@contextmanager
def native_off() -> Iterator[None]:
    saved = DECODER._native
    DECODER._native = None
    try:
        yield
    finally:
        DECODER._native = saved


def outcome(data: bytes) -> tuple[str, Any]:
    try:
        return "ok", vllm.decode_batch(data)
    except DecodeError as exc:
        return "error", str(exc)


def same_batch(a: EventBatch, b: EventBatch) -> bool:
    if not (a.timestamp == b.timestamp or (math.isnan(a.timestamp) and math.isnan(b.timestamp))):
        return False
    if a.dp_rank != b.dp_rank or len(a.events) != len(b.events):
        return False
    for x, y in zip(a.events, b.events, strict=True):
        if type(x) is not type(y) or x != y:
            return False
        for name in getattr(x, "__struct_fields__", ()):
            vx, vy = getattr(x, name), getattr(y, name)
            if isinstance(vx, np.ndarray) and vx.dtype != vy.dtype:
                return False
            if type(vx) is not type(vy):  # an int is not a numpy scalar, a str not bytes
                return False
    return True


def assert_agree(data: bytes) -> None:
    fast = outcome(data)
    with native_off():
        exact = outcome(data)
    assert fast[0] == exact[0], (fast, exact)
    if fast[0] == "ok":
        assert same_batch(fast[1], exact[1]), (fast[1], exact[1])
    else:
        assert fast[1] == exact[1]


hashes = st.lists(st.integers(0, 2**64 - 1), max_size=6).map(lambda v: np.array(v, dtype=np.uint64))
tokens = st.lists(
    st.one_of(st.integers(0, 127), st.integers(128, 2**16), st.integers(2**16, 2**32 - 1)),
    max_size=40,
).map(lambda v: np.array(v, dtype=np.uint32))
opt_str = st.one_of(st.none(), st.sampled_from(["GPU", "CPU", "LOCAL", "é", ""]))
opt_int = st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1))
stored = st.builds(
    BlockStored,
    hashes,
    st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    tokens,
    st.integers(0, 2**20),
    lora_id=opt_int,
    medium=opt_str,
    lora_name=opt_str,
    group_idx=opt_int,
    kv_cache_spec_kind=opt_str,
    kv_cache_spec_sliding_window=opt_int,
    locality=opt_str,
    ownership=opt_str,
    session_id=opt_str,
)
removed = st.builds(
    BlockRemoved,
    hashes,
    medium=opt_str,
    group_idx=opt_int,
    locality=opt_str,
    ownership=opt_str,
)
events = st.lists(st.one_of(stored, removed, st.just(AllBlocksCleared())), max_size=6)
batches = st.builds(
    EventBatch, st.floats(allow_nan=False), events, st.one_of(st.none(), st.integers(0, 64))
)


@settings(max_examples=300, deadline=None)
@given(batches, st.sampled_from(MAP_ERA))
def test_published_batches_take_the_native_path_and_decode_the_same(
    batch: EventBatch, version: str
) -> None:
    require_native()
    data = vllm.encode_batch(batch, version=version)
    assert DECODER._native is not None and DECODER._native(data) is not None
    assert_agree(data)
    if version == "0.33":  # the release that sends every field generated here
        assert same_batch(vllm.decode_batch(data), batch)


# Hand-built events: keys in any order (the type key anywhere), unknown keys with
# nested values, and values of every msgpack kind in known fields.
any_value = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(),
        st.text(max_size=4),
        st.binary(max_size=4),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
FIELDS = [
    "block_hashes",
    "parent_block_hash",
    "token_ids",
    "block_size",
    "medium",
    "lora_id",
    "extra_keys",
    "group_idx",
    "lookahead_token_ids",
    "session_id",
]
good_values = {
    "block_hashes": st.lists(st.integers(0, 2**64 - 1), max_size=3),
    "parent_block_hash": st.one_of(st.none(), st.integers(0, 2**64 - 1)),
    "token_ids": st.lists(st.integers(0, 2**32 - 1), max_size=5),
    "block_size": st.integers(0, 64),
    "medium": opt_str,
    "lora_id": opt_int,
    "extra_keys": st.none(),
    "group_idx": opt_int,
    "lookahead_token_ids": st.none(),
    "session_id": opt_str,
}


@st.composite
def hand_event(draw: st.DrawFn) -> list[tuple[Any, Any]]:
    tag = draw(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "Other"]))
    pairs: list[tuple[Any, Any]] = [("type", tag)]
    for name in draw(st.lists(st.sampled_from(FIELDS), unique=True)):
        bad = draw(st.integers(0, 9)) == 0
        pairs.append((name, draw(any_value if bad else good_values[name])))
    if draw(st.booleans()):
        pairs.append((draw(st.text(max_size=5)), draw(any_value)))
    if draw(st.integers(0, 19)) == 0:
        pairs.append(draw(st.sampled_from(pairs)))  # a duplicate key
    return draw(st.permutations(pairs))


def encode_pairs(ts: Any, evs: list[list[tuple[Any, Any]]], rank: Any) -> bytes:
    # msgspec cannot write duplicate keys, so maps are written by hand around it.
    enc = msgspec.msgpack.encode
    out = bytearray(b"\x93") + enc(ts) + bytearray([0xDC]) + len(evs).to_bytes(2, "big")
    for pairs in evs:
        out += bytes([0xDE]) + len(pairs).to_bytes(2, "big")
        for k, v in pairs:
            out += enc(k) + enc(v)
    return bytes(out + enc(rank))


@settings(max_examples=400, deadline=None)
@given(
    st.one_of(st.floats(), st.integers(-(2**63), 2**63 - 1)),
    st.lists(hand_event(), max_size=4),
    st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=2)),
)
def test_hand_built_batches_decode_the_same(ts: Any, evs: Any, rank: Any) -> None:
    require_native()
    assert_agree(encode_pairs(ts, evs, rank))


@settings(max_examples=300, deadline=None)
@given(batches, st.data())
def test_damaged_bytes_decode_the_same(batch: EventBatch, data: st.DataObject) -> None:
    require_native()
    raw = bytearray(vllm.encode_batch(batch, version="0.33"))
    for _ in range(data.draw(st.integers(1, 3))):
        if raw:
            raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(raw)))
    assert_agree(bytes(raw[:cut]) if data.draw(st.booleans()) else bytes(raw))


def test_other_inputs_go_the_usual_way() -> None:
    require_native()
    batch = EventBatch(1.0, [BlockRemoved(np.array([7], dtype=np.uint64))], 0)
    data = vllm.encode_batch(batch, version="0.33")
    for form in (bytearray(data), memoryview(data)):
        assert same_batch(vllm.decode_batch(form), batch)
    signed = EventBatch(1.0, [BlockRemoved(np.array([2**64 - 1], dtype=np.uint64))], 0)
    assert DECODER._native(vllm.encode_batch(signed, version="0.33")) is not None
    with pytest.raises(DecodeError):
        vllm.decode_batch(b"")
