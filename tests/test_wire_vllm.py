"""vLLM's codec against the reference note: golden vectors of every documented release,
the array lengths and map headers of each release, and vLLM's hash forms."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest
from wire_cases import VLLM_GOLDEN, VLLM_SIZES, raises, vllm_golden_batch

from radixmeta.errors import DecodeError, InvalidInputError
from radixmeta.wire import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch, WireHashes, vllm

enc = msgspec.msgpack.encode


@pytest.mark.parametrize("version", list(VLLM_GOLDEN))
def test_golden_vector_decodes_to_its_documented_content(version: str) -> None:
    data = bytes.fromhex(VLLM_GOLDEN[version])
    assert len(data) == VLLM_SIZES[version]
    assert vllm.decode_batch(data) == vllm_golden_batch(version)


@pytest.mark.parametrize("version", list(VLLM_GOLDEN))
def test_golden_vector_re_encodes_byte_exactly(version: str) -> None:
    data = bytes.fromhex(VLLM_GOLDEN[version])
    assert vllm.encode_batch(vllm.decode_batch(data), version=version) == data
    assert vllm.encode_batch(vllm_golden_batch(version), version=version) == data


def test_decoded_0_22_matches_the_reference_listing() -> None:
    """Section 3.6 prints the generic decode of 0.22.0: every nil slot is there."""
    generic = msgspec.msgpack.decode(bytes.fromhex(VLLM_GOLDEN["0.22.0"]))
    assert generic == [
        1.5,
        [
            ["BlockStored", [1229782938247303441, 17293822569102704641], None, [1, 2, 3, 4], 2,
             None, "GPU", None, [None, None], 0, "full_attention", None],
            ["BlockRemoved", [17293822569102704641], "GPU", 0],
            ["AllBlocksCleared"],
        ],
        0,
    ]  # fmt: skip


# Section 3.2: (batch length, BlockStored array length, BlockRemoved array length).
ARRAY_ERA = {
    "0.9.0": (2, 6, 2),
    "0.9.1": (3, 6, 2),
    "0.10.1": (3, 6, 2),
    "0.10.2": (3, 7, 3),
    "0.13.0": (3, 7, 3),
    "0.14.0": (3, 8, 3),
    "0.16.0": (3, 8, 3),
    "0.17.0": (3, 9, 3),
    "0.19.1": (3, 9, 3),
    "0.20.0": (3, 10, 4),
    "0.21.0": (3, 10, 4),
    "0.22.0": (3, 12, 4),
    "0.23.0": (3, 12, 4),
}

EVERY_FIELD = EventBatch(
    1.0,
    [
        BlockStored(
            np.array([1, 2], np.uint64),
            3,
            np.array([4, 5, 6, 7], np.uint32),
            2,
            lora_id=8,
            medium="CPU",
            lora_name="adapter",
            extra_keys=[["k"], None],
            group_idx=1,
            kv_cache_spec_kind="sliding_window",
            kv_cache_spec_sliding_window=128,
            locality="LOCAL",
            ownership="tier-2",
            session_id="s",
            lookahead_token_ids=[[9], [10]],
        ),
        BlockRemoved(
            np.array([2], np.uint64), medium="CPU", group_idx=1, locality="REMOTE", ownership="o"
        ),
    ],
    5,
)


@pytest.mark.parametrize("version", list(ARRAY_ERA))
def test_array_era_lengths_per_release(version: str) -> None:
    """Every field of the release is sent, nil or not; fields it lacks are not."""
    batch_len, stored_len, _ = ARRAY_ERA[version]
    generic = msgspec.msgpack.decode(vllm.encode_batch(EVERY_FIELD, version=version))
    assert (len(generic), len(generic[1][0]), len(generic[1][1])) == ARRAY_ERA[version]
    empty = BlockStored(np.array([], np.uint64), None, np.array([], np.uint32), 0)
    sparse = msgspec.msgpack.decode(vllm.encode_batch(EventBatch(0.0, [empty]), version=version))
    assert len(sparse[1][0]) == stored_len  # trailing nils are sent (msgspec issue #720)
    assert len(sparse) == batch_len  # so is a nil rank


# Declared fields per release, tag included (see the table in radixmeta/wire/vllm.py).
MAP_ERA = {
    "0.24.0": (12, 4),
    "0.25.1": (12, 4),
    "0.26.0": (13, 5),
    "0.28.0": (13, 5),
    "0.29.0": (14, 6),
    "0.30.0": (15, 6),
    "0.32.0": (15, 6),
    "0.33.0": (16, 6),
}


@pytest.mark.parametrize("version", list(MAP_ERA))
def test_map_era_declared_fields_size_the_header(version: str) -> None:
    stored_fields, removed_fields = MAP_ERA[version]
    layout = vllm.layout(version)
    assert layout.maps and layout.batch_rank
    assert layout.declared_fields == {"BlockStored": stored_fields, "BlockRemoved": removed_fields}
    golden = vllm.encode_batch(vllm_golden_batch("0.24.0"), version=version)
    # 11 entries: a fixmap (0x8b) unless 16 declared fields ask msgspec for a map16.
    header = golden[11:14] if stored_fields == 16 else golden[11:12]  # after [ts, [
    assert header == (b"\xde\x00\x0b" if stored_fields == 16 else b"\x8b")
    full = msgspec.msgpack.decode(vllm.encode_batch(EVERY_FIELD, version=version))
    assert len(full[1][0]) == stored_fields and len(full[1][1]) == removed_fields


def test_map_era_omits_only_optional_nones() -> None:
    empty = BlockStored(np.array([7], np.uint64), None, np.array([], np.uint32), 0)
    generic = msgspec.msgpack.decode(
        vllm.encode_batch(EventBatch(0.0, [empty, BlockRemoved(np.array([7], np.uint64))], 0))
    )
    assert generic[1][0] == {
        "type": "BlockStored", "block_hashes": [7], "parent_block_hash": None, "token_ids": [],
        "block_size": 0, "lora_id": None, "medium": None, "lora_name": None,
    }  # fmt: skip
    assert generic[1][1] == {"type": "BlockRemoved", "block_hashes": [7], "medium": None}


def test_kthena_0_26_stream_example() -> None:
    """The real 0.26.0 batch quoted in volcano-sh/kthena issue #1535 (its 16 tokens elided)."""
    tokens = list(range(1000, 1016))
    event = {
        "type": "BlockStored", "block_hashes": [15760518052499183552], "parent_block_hash": None,
        "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": "GPU",
        "lora_name": None, "extra_keys": [None], "group_idx": 0,
        "kv_cache_spec_kind": "full_attention",
    }  # fmt: skip
    data = enc([1789095808.83, [event], 0])
    batch = vllm.decode_batch(data)
    expected = BlockStored(
        np.array([15760518052499183552], np.uint64),
        None,
        np.array(tokens, np.uint32),
        16,
        medium="GPU",
        extra_keys=[None],
        group_idx=0,
        kv_cache_spec_kind="full_attention",
    )
    assert batch == EventBatch(1789095808.83, [expected], 0)
    assert vllm.encode_batch(batch, version="0.26.0") == data  # its key order is 0.26's


# -- vLLM's hash forms ------------------------------------------------------------------------
DIGEST = bytes(range(32))


@pytest.mark.parametrize(
    ("sent", "normalised"),
    [
        (DIGEST, int.from_bytes(DIGEST[-8:], "big")),  # sha256 digest, INT_BLOCK_HASHES=0
        (DIGEST[:16], int.from_bytes(DIGEST[8:16], "big")),  # xxh3_128
        (b"\x01\x02", 0x0102),
        (b"", 0),
        (-1, 2**64 - 1),  # hash() in 0.9 and 0.10
        (-(2**63), 2**63),
        (2**64 - 1, 2**64 - 1),
    ],
)
def test_hashes_normalise_to_u64_and_re_encode_as_sent(sent: int | bytes, normalised: int) -> None:
    data = enc([1.0, [["BlockStored", [sent, 5], sent, [1], 1, None], ["BlockRemoved", [sent]]], 0])
    stored, removed = vllm.decode_batch(data).events
    assert stored.block_hashes.tolist() == [normalised, 5]
    assert stored.parent_block_hash == normalised and removed.block_hashes.tolist() == [normalised]
    canonical = isinstance(sent, int) and sent >= 0
    assert stored.wire_hashes == (None if canonical else WireHashes((sent, 5), sent))
    assert vllm.encode_batch(vllm.decode_batch(data), version="0.9.1") == data


def test_unsigned_hashes_are_canonical() -> None:
    stored = vllm.decode_batch(enc([1.0, [["BlockStored", [2**64 - 1], 3, [], 0, None]]])).events[0]
    assert stored.wire_hashes is None and stored.parent_block_hash == 3


def test_wire_hashes_must_match_the_normalised_hashes() -> None:
    event = BlockRemoved(np.array([1], np.uint64), wire_hashes=WireHashes((b"\x02",)))
    with raises(InvalidInputError, "wire_hashes.block_hashes do not normalise to block_hashes"):
        vllm.encode_batch(EventBatch(1.0, [event], 0))
    stored = BlockStored(
        np.array([1], np.uint64), 5, np.array([], np.uint32), 0, wire_hashes=WireHashes((1,), -5)
    )
    message = "wire_hashes.parent_block_hash does not normalise to parent_block_hash"
    with raises(InvalidInputError, message):
        vllm.encode_batch(EventBatch(1.0, [stored], 0))


# -- vLLM-only fields -------------------------------------------------------------------------
def test_lookahead_token_ids() -> None:
    event = {"type": "BlockStored", "block_hashes": [1], "token_ids": [1], "block_size": 1}
    data = enc([1.0, [event | {"lookahead_token_ids": [[5, 6], []]}], 0])
    assert vllm.decode_batch(data).events[0].lookahead_token_ids == [[5, 6], []]
    bad = enc([1.0, [event | {"lookahead_token_ids": [[5, -6]]}], 0])
    message = (
        "batch[1][0]: BlockStored.lookahead_token_ids[0][1] = -6 is outside the token range "
        "[0, 2**32)"
    )
    with raises(DecodeError, message):
        vllm.decode_batch(bad)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("extra_keys", "k", "BlockStored.extra_keys must be an array or nil, got str"),
        ("group_idx", "0", "BlockStored.group_idx must be an integer or nil, got str"),
        (
            "kv_cache_spec_sliding_window",
            1.5,
            "BlockStored.kv_cache_spec_sliding_window must be an integer or nil, got float",
        ),
        ("locality", 1, "BlockStored.locality must be a string or nil, got int"),
        (
            "lookahead_token_ids",
            [1],
            "BlockStored.lookahead_token_ids[0] must be an array of integers, got int",
        ),
        (
            "parent_block_hash",
            "p",
            "BlockStored.parent_block_hash must be a hash (an integer or bytes) or nil, got str",
        ),
        (
            "block_hashes",
            [1.0],
            "BlockStored.block_hashes[0] must be a hash (an integer or bytes), got float",
        ),
    ],
)
def test_vllm_field_errors(field: str, value: object, message: str) -> None:
    event = {"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": 0}
    with raises(DecodeError, f"batch[1][1]: {message}"):
        vllm.decode_batch(enc([1.0, [["AllBlocksCleared"], event | {field: value}], 0]))


def test_default_version_is_the_newest() -> None:
    assert vllm.layout() is vllm.layout("0.33")
    assert vllm.SUPPORTED == "0.9.0 to 0.33.x"
    cleared = EventBatch(1.0, [AllBlocksCleared()], 0)
    assert vllm.encode_batch(cleared) == vllm.encode_batch(cleared, version="0.33.0")
