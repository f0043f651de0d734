"""SGLang's codec against the reference note: golden vectors, each release's layout, the
0.5.18 salted element, bigram pairs, signed hashes, and the SHA-256 page-hash chain."""

from __future__ import annotations

import hashlib
import struct
from itertools import pairwise

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wire_cases import SGLANG_GOLDEN, TOKEN, raises, sglang_golden_batch

from radixmeta.errors import DecodeError, InputTypeError, InvalidInputError
from radixmeta.wire import BlockRemoved, BlockStored, EventBatch, WireHashes, sglang

enc = msgspec.msgpack.encode


def decode_error(data: bytes, message: str) -> None:
    with raises(DecodeError, message):
        sglang.decode_batch(data)


@pytest.mark.parametrize("version", list(SGLANG_GOLDEN))
def test_golden_vector_decodes_and_re_encodes_exactly(version: str) -> None:
    data = bytes.fromhex(SGLANG_GOLDEN[version])
    assert sglang.decode_batch(data) == sglang_golden_batch(version)
    assert sglang.encode_batch(sglang.decode_batch(data), version=version) == data
    assert sglang.encode_batch(sglang_golden_batch(version), version=version) == data


def test_golden_hashes_are_signed_on_the_wire() -> None:
    stored = sglang.decode_batch(bytes.fromhex(SGLANG_GOLDEN["0.5.23"])).events[0]
    assert stored.block_hashes.tolist() == [2**64 - 5, 2**63 - 1]
    assert stored.wire_hashes is None  # signed int64 is SGLang's canonical form


# Section 5.1: (batch length, BlockStored array length, BlockRemoved array length).
ARRAY_ERA = {
    "0.4.6.post5": (2, 6, 2),
    "0.4.7": (3, 6, 2),
    "0.4.10": (3, 6, 2),
    "0.5.8": (3, 6, 2),
    "0.5.10": (3, 7, 3),
    "0.5.16": (3, 7, 3),
    "0.5.18": (3, 7, 3),
}
SALTED = BlockStored(
    np.array([3], np.uint64), 2, np.array([1, 2], np.uint32), 2, medium="GPU", cache_salt="tenant"
)


@pytest.mark.parametrize("version", list(ARRAY_ERA))
def test_array_era_lengths_per_release(version: str) -> None:
    plain = BlockStored(np.array([3], np.uint64), None, np.array([1, 2], np.uint32), 2)
    batch = EventBatch(1.0, [plain, BlockRemoved(np.array([3], np.uint64))], 0)
    generic = msgspec.msgpack.decode(sglang.encode_batch(batch, version=version))
    assert (len(generic), len(generic[1][0]), len(generic[1][1])) == ARRAY_ERA[version]
    salted = msgspec.msgpack.decode(
        sglang.encode_batch(EventBatch(1.0, [SALTED], 0), version=version)
    )
    assert len(salted[1][0]) == ARRAY_ERA[version][1] + (version == "0.5.18")


def test_0_5_18_salted_store_is_block_stored_with_metadata() -> None:
    data = sglang.encode_batch(EventBatch(1.0, [SALTED], 0), version="0.5.18")
    # BlockStoredWithMetadata keeps the tag "BlockStored"; metadata is a 1-field map.
    assert data == enc(
        [1.0, [["BlockStored", [3], 2, [1, 2], 2, None, "GPU", {"cache_salt": "tenant"}]], 0]
    )
    assert sglang.decode_batch(data) == EventBatch(1.0, [SALTED], 0)
    extra_keys = enc(
        [1.0, [["BlockStored", [3], 2, [1, 2], 2, None, "GPU", {"cache_salt": "t", "x": 1}]], 0]
    )
    assert sglang.decode_batch(extra_keys).events[0].cache_salt == "t"


@pytest.mark.parametrize(
    ("version", "declared"), [("0.5.20", 9), ("0.5.21", 9), ("0.5.22", 10), ("0.5.23", 10)]
)
def test_map_era_fields(version: str, declared: int) -> None:
    assert sglang.layout(version).declared_fields == {"BlockStored": declared, "BlockRemoved": 3}
    event = BlockStored(
        np.array([3], np.uint64),
        None,
        np.array([1], np.uint32),
        1,
        cache_salt="s",
        session_id="q",
        lora_name="a",
    )
    generic = msgspec.msgpack.decode(
        sglang.encode_batch(EventBatch(1.0, [event], 0), version=version)
    )
    keys = [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "cache_salt",
        "session_id",
    ]
    assert list(generic[1][0]) == keys + (["lora_name"] if declared == 10 else [])


# -- bigram pairs (EAGLE) ---------------------------------------------------------------------
@given(tokens=st.lists(TOKEN, min_size=2, max_size=20))
def test_bigram_pairs_flatten_and_re_encode(tokens: list[int]) -> None:
    pairs = [[a, b] for a, b in pairwise(tokens)]
    for event in (
        ["BlockStored", [1], None, pairs, 1, None, "GPU"],
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "parent_block_hash": None,
            "token_ids": pairs,
            "block_size": 1,
            "lora_id": None,
        },
    ):
        data = enc([1.0, [event], 0])
        stored = sglang.decode_batch(data).events[0]
        assert stored.token_ids.tolist() == tokens and stored.token_pairs
        version = "0.5.10" if isinstance(event, list) else "0.5.23"
        assert sglang.encode_batch(sglang.decode_batch(data), version=version) == data


@pytest.mark.parametrize(
    ("tokens", "message"),
    [
        (
            [[1, 2], [3, 4]],
            "BlockStored.token_ids[1] = [3, 4] does not continue the pair before it, [1, 2]",
        ),
        (
            [[1, 2], 3],
            "BlockStored.token_ids mixes integers and pairs: BlockStored.token_ids[1] = 3",
        ),
        (
            [1, [1, 2]],
            "BlockStored.token_ids mixes integers and pairs: BlockStored.token_ids[0] = 1",
        ),
        ([[1, 2, 3]], "BlockStored.token_ids[0] must be a pair of integers, got an array of 3"),
        ([[]], "BlockStored.token_ids[0] must be a pair of integers, got an array of 0"),
        (
            [[1, 2], [2, -1]],
            "BlockStored.token_ids[1][1] = -1 is outside the token range [0, 2**32)",
        ),
        ([[1, 2], [2, "x"]], "BlockStored.token_ids[1][1] must be an integer, got str"),
        ([None], "BlockStored.token_ids[0] must be an integer or a pair of integers, got nil"),
    ],
)
def test_bad_bigram_pairs(tokens: list[object], message: str) -> None:
    decode_error(
        enc([1.0, [["BlockStored", [1], None, tokens, 1, None]], 0]), f"batch[1][0]: {message}"
    )


def test_token_pairs_need_two_tokens() -> None:
    event = BlockStored(
        np.array([1], np.uint64), None, np.array([5], np.uint32), 1, token_pairs=True
    )
    with raises(InvalidInputError, "token_pairs needs at least 2 tokens, got 1"):
        sglang.encode_batch(EventBatch(1.0, [event], 0))


# -- hashes ---------------------------------------------------------------------------------
def test_unsigned_hashes_are_accepted_and_kept_as_sent() -> None:
    """SGLang never sends u64 >= 2**63, but a consumer can read it; re-encoding keeps it."""
    data = enc(
        [1.0, [["BlockStored", [2**63, -1], 2**64 - 1, [1], 1, None], ["BlockRemoved", [2**63]]], 0]
    )
    stored, removed = sglang.decode_batch(data).events
    assert (
        stored.block_hashes.tolist() == [2**63, 2**64 - 1] and stored.parent_block_hash == 2**64 - 1
    )
    assert stored.wire_hashes == WireHashes((2**63, -1), 2**64 - 1)
    assert removed.wire_hashes == WireHashes((2**63,))
    assert sglang.encode_batch(sglang.decode_batch(data), version="0.4.7") == data


@pytest.mark.parametrize(
    ("event", "message"),
    [
        (
            ["BlockStored", [b"\x01"], None, [], 0, None],
            "BlockStored.block_hashes[0] must be an integer, got bytes",
        ),
        (
            ["BlockStored", [1], b"\x01", [], 0, None],
            "BlockStored.parent_block_hash must be an integer or nil, got bytes",
        ),
        (
            ["BlockStored", [1], None, [], 0, None, "GPU", "salt"],
            "BlockStored.metadata must be a map or nil, got str",
        ),
        (
            ["BlockStored", [1], None, [], 0, None, "GPU", {"cache_salt": 5}],
            "BlockStored.metadata.cache_salt must be a string or nil, got int",
        ),
        (
            {
                "type": "BlockStored",
                "block_hashes": [1],
                "token_ids": [],
                "block_size": 0,
                "cache_salt": 1,
            },
            "BlockStored.cache_salt must be a string or nil, got int",
        ),
        (
            {
                "type": "BlockStored",
                "block_hashes": [1],
                "token_ids": [],
                "block_size": 0,
                "lora_name": [],
            },
            "BlockStored.lora_name must be a string or nil, got array",
        ),
    ],
)
def test_sglang_field_errors(event: object, message: str) -> None:
    decode_error(enc([1.0, [event], 0]), f"batch[1][0]: {message}")


# -- the SHA-256 page-hash chain (0.5.6+) -----------------------------------------------------
CHECK_TOKENS = [151644, 872, 198, 9064, 374, 279, 6722, 315]


def test_check_vector() -> None:
    hashes = sglang.block_hashes(CHECK_TOKENS, 4)
    assert hashes.dtype == np.uint64
    assert hashes.view(np.int64).tolist() == [-1944566869021170841, 9056173362842263460]


def _reimplemented(tokens: list[int], page: int) -> list[int]:
    """Section 5.3 as written: d_i = sha256(d_{i-1} || <u4 tokens), first 8 bytes big-endian."""
    out, previous = [], b""
    for start in range(0, len(tokens) - page + 1, page):
        previous = hashlib.sha256(
            previous + struct.pack(f"<{page}I", *tokens[start : start + page])
        ).digest()
        out.append(int.from_bytes(previous[:8], "big"))
    return out


@given(tokens=st.lists(TOKEN, max_size=40), page=st.integers(1, 8), split=st.integers(0, 5))
def test_chain_matches_the_spec_and_continues_from_a_parent(
    tokens: list[int], page: int, split: int
) -> None:
    hashes = sglang.block_hashes(tokens, page)
    assert hashes.tolist() == _reimplemented(
        tokens, page
    )  # a tail shorter than a page is not hashed
    cut = min(split, len(tokens) // page) * page
    head = sglang.page_digests(tokens[:cut], page)
    parent = head[-1] if head else None
    assert (
        sglang.block_hashes(tokens[cut:], page, parent=parent).tolist()
        == hashes.tolist()[len(head) :]
    )
    assert sglang.block_hashes(np.array(tokens, dtype=np.int64), page).tolist() == hashes.tolist()


def test_chain_hashes_are_what_the_decoder_returns() -> None:
    """A worker publishing block_hashes() and a router decoding them agree on every bit."""
    hashes = sglang.block_hashes(CHECK_TOKENS, 4)
    event = BlockStored(hashes, None, np.array(CHECK_TOKENS, np.uint32), 4, medium="GPU")
    data = sglang.encode_batch(EventBatch(1.0, [event], 0))
    assert msgspec.msgpack.decode(data)[1][0]["block_hashes"] == [
        -1944566869021170841,
        9056173362842263460,
    ]
    assert sglang.decode_batch(data).events[0].block_hashes.tolist() == hashes.tolist()


@pytest.mark.parametrize(
    ("args", "kwargs", "exc", "message"),
    [
        (([1, 2], 0), {}, InvalidInputError, "page_size must be >= 1, got 0"),
        (
            ([1, -2], 1),
            {},
            InvalidInputError,
            "tokens[1] = -2 is outside the token range [0, 2**32)",
        ),
        (("ab", 1), {}, InputTypeError, "tokens must be a sequence of integers, got str"),
        (
            ([1], 1),
            {"parent": b"short"},
            InvalidInputError,
            "parent must be a 32-byte digest, got 5 bytes",
        ),
        (
            ([1], 1),
            {"parent": 7},
            InputTypeError,
            "parent must be a 32-byte digest or None, got int",
        ),
    ],
)
def test_chain_input_errors(
    args: tuple[object, ...], kwargs: dict[str, object], exc: type[Exception], message: str
) -> None:
    with raises(exc, message):
        sglang.block_hashes(*args, **kwargs)


def test_default_version_is_the_newest() -> None:
    assert sglang.layout() is sglang.layout("0.5.23")
    assert sglang.SUPPORTED == "0.4.6 to 0.5.23"
