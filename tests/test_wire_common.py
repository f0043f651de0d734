"""What both engine codecs share: round trips of every era, the two decode paths agreeing,
batch-level errors, tolerance (unknown tags and keys, extra elements, mixed eras), and
inputs that must never crash the decoder."""

from __future__ import annotations

import pickle
from types import ModuleType
from typing import Any
from unittest import mock

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from wire_cases import (
    CODECS,
    ROUND_TRIP_VERSIONS,
    SCALAR,
    SGLANG_GOLDEN,
    VLLM_GOLDEN,
    batches,
    raises,
    removed_events,
    stored_events,
)

from radixmeta.errors import DecodeError, InputTypeError, InvalidInputError, RadixMetaError
from radixmeta.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    UnknownEvent,
)

enc = msgspec.msgpack.encode
HASH_RANGE = "[-2**63, 2**64)"
GOLDEN = [("vllm", v, h) for v, h in VLLM_GOLDEN.items()]
GOLDEN += [("sglang", v, h) for v, h in SGLANG_GOLDEN.items()]


@pytest.fixture(params=list(CODECS))
def codec(request: pytest.FixtureRequest) -> ModuleType:
    return CODECS[request.param]


def decode_error(codec: ModuleType, data: Any, message: str) -> None:
    with raises(DecodeError, message) as info:
        codec.decode_batch(data)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RadixMetaError)


# -- round trips --------------------------------------------------------------------------------
@pytest.mark.parametrize(("engine", "version"), ROUND_TRIP_VERSIONS)
@given(data=st.data())
def test_round_trip(engine: str, version: str, data: st.DataObject) -> None:
    codec = CODECS[engine]
    batch = data.draw(batches(codec, version))
    wire = codec.encode_batch(batch, version=version)
    decoded = codec.decode_batch(wire)
    assert decoded == batch
    assert codec.encode_batch(decoded, version=version) == wire


def fast_path_only(codec: ModuleType, data: bytes) -> EventBatch:
    """Decode with the event-by-event path switched off: only the typed fast path."""

    def refuse(data: Any) -> None:
        msg = "slow path taken"
        raise AssertionError(msg)

    with mock.patch.object(codec._CODEC.decoder, "_decode_exactly", refuse):
        batch: EventBatch = codec.decode_batch(data)
    return batch


@pytest.mark.parametrize(("engine", "version"), ROUND_TRIP_VERSIONS)
@given(data=st.data())
def test_exact_path_agrees_with_fast_path(engine: str, version: str, data: st.DataObject) -> None:
    """The event-by-event path (mixed eras, errors) decodes valid batches identically."""
    codec = CODECS[engine]
    wire = codec.encode_batch(data.draw(batches(codec, version, unknown=False)), version=version)
    assert codec._CODEC.decoder._decode_exactly(wire) == fast_path_only(codec, wire)


@pytest.mark.parametrize(("engine", "version", "hexdata"), GOLDEN)
def test_engine_batches_take_the_fast_path(engine: str, version: str, hexdata: str) -> None:
    """A released engine's batch never needs the slow path (it would cost throughput)."""
    codec = CODECS[engine]
    data = bytes.fromhex(hexdata)
    assert fast_path_only(codec, data) == codec._CODEC.decoder._decode_exactly(data)


# -- tolerance ----------------------------------------------------------------------------------
def _events_of(codec: ModuleType, batch: EventBatch, version: str) -> list[Any]:
    """The batch's events as generic msgpack values, as the release encodes them."""
    events: list[Any] = msgspec.msgpack.decode(codec.encode_batch(batch, version=version))[1]
    return events


MIXED = {"vllm": ("0.22.0", "0.33"), "sglang": ("0.5.18", "0.5.23")}


@pytest.mark.parametrize("engine", list(CODECS))
@given(data=st.data())
def test_mixed_array_and_map_events_in_one_batch(engine: str, data: st.DataObject) -> None:
    codec = CODECS[engine]
    old, new = MIXED[engine]
    event = st.one_of(stored_events(codec, old), removed_events(codec, old))
    events = data.draw(st.lists(event, min_size=1, max_size=6))
    forms = data.draw(st.lists(st.booleans(), min_size=len(events), max_size=len(events)))
    wire_events = [
        _events_of(codec, EventBatch(0.0, [e], 0), new if as_map else old)[0]
        for e, as_map in zip(events, forms, strict=True)
    ]
    decoded = codec.decode_batch(enc([2.5, wire_events, 1]))
    assert decoded == EventBatch(2.5, events, 1)


def test_unknown_event_types_are_kept(codec: ModuleType) -> None:
    unknown_array = ["BlockTransferred", [1, 2], "GPU", "CPU"]
    unknown_map = {"type": "Heartbeat", "n": 1}
    stored = BlockStored(np.array([5], np.uint64), None, np.array([1, 2], np.uint32), 2)
    known = _events_of(
        codec,
        EventBatch(0.0, [stored], 0),
        "0.22.0" if codec.__name__.endswith("vllm") else "0.5.10",
    )
    batch = codec.decode_batch(enc([1.0, [unknown_array, known[0], unknown_map], 0]))
    first, middle, last = batch.events
    assert first == UnknownEvent("BlockTransferred", enc(unknown_array))
    assert first.fields == [[1, 2], "GPU", "CPU"]
    assert last == UnknownEvent("Heartbeat", enc(unknown_map)) and last.fields == {"n": 1}
    assert middle == stored
    assert codec.decode_batch(codec.encode_batch(batch)).events[::2] == [first, last]


@pytest.mark.parametrize("extra", [[None], [b"\x01" * 16, 7], [[1, 2], {"a": 1}, "x"]])
def test_extra_trailing_batch_elements_are_ignored(codec: ModuleType, extra: list[Any]) -> None:
    """vLLM PR #57789 would add publisher_id as a 4th element; decoders must not care."""
    hexdata = VLLM_GOLDEN["0.24.0"] if codec is CODECS["vllm"] else SGLANG_GOLDEN["0.5.23"]
    plain = msgspec.msgpack.decode(bytes.fromhex(hexdata))
    assert codec.decode_batch(enc([*plain, *extra])) == codec.decode_batch(enc(plain))


def test_unknown_map_keys_and_extra_array_elements_are_ignored(codec: ModuleType) -> None:
    stored = {"type": "BlockStored", "future": [1, {"x": 2}], "block_hashes": [9]}
    stored |= {"token_ids": [1, 2], "block_size": 2, "parent_block_hash": None, "z": None}
    removed = ["BlockRemoved", [9], "GPU", 0, "later", ["more"], {}]
    cleared = ["AllBlocksCleared", "CPU"]  # a future AllBlocksCleared(medium) field
    batch = codec.decode_batch(enc([1.0, [stored], 0]))
    assert batch.events == [
        BlockStored(np.array([9], np.uint64), None, np.array([1, 2], np.uint32), 2)
    ]
    tail = codec.decode_batch(enc([1.0, [removed, cleared], 0])).events
    assert tail[1] == AllBlocksCleared()
    assert tail[0].block_hashes.tolist() == [9] and tail[0].medium == "GPU"


def test_two_element_batch_has_no_rank(codec: ModuleType) -> None:
    batch = codec.decode_batch(enc([3.0, [["AllBlocksCleared"]]]))
    assert batch == EventBatch(3.0, [AllBlocksCleared()], None)


def test_integer_timestamp_and_buffer_inputs(codec: ModuleType) -> None:
    data = enc([7, [], 2])
    expected = EventBatch(7.0, [], 2)
    for buffer in (data, bytearray(data), memoryview(data)):
        assert codec.decode_batch(buffer) == expected
    assert type(codec.decode_batch(data).timestamp) is float


def test_decoded_arrays_have_the_documented_dtypes(codec: ModuleType) -> None:
    for hexdata in (VLLM_GOLDEN["0.33.0"], SGLANG_GOLDEN["0.5.23"]):
        stored, removed, _ = codec.decode_batch(bytes.fromhex(hexdata)).events
        assert stored.block_hashes.dtype == np.uint64 and stored.token_ids.dtype == np.uint32
        assert removed.block_hashes.dtype == np.uint64


# -- batch-level errors ---------------------------------------------------------------------------
STORED_ARRAY = ["BlockStored", [1], None, [1, 2], 2, None]
BATCH_ERRORS = [
    pytest.param(b"\xc1", "malformed msgpack: invalid opcode '\\xc1' at offset 0", id="opcode"),
    pytest.param(
        enc([1.5, [], 0]) + b"\x00",
        "malformed msgpack: trailing characters at offset 12",
        id="trailing",
    ),
    pytest.param(
        enc([1.5, [["BlockRemoved", [1], "GPU"]]]).replace(b"GPU", b"\xffPU"),
        "malformed msgpack: the str at offset 27 is not valid UTF-8",
        id="utf8",
    ),
    pytest.param(
        enc({"ts": 1.5}), "batch must be an array [timestamp, events, dp_rank], got map", id="map"
    ),
    pytest.param(enc(7), "batch must be an array [timestamp, events, dp_rank], got int", id="int"),
    pytest.param(b"", "truncated msgpack: the data ends inside a value at offset 0", id="empty"),
    pytest.param(
        enc([1.5]), "batch has 1 element; it needs at least [timestamp, events]", id="short"
    ),
    pytest.param(
        enc([]), "batch has 0 elements; it needs at least [timestamp, events]", id="empty-array"
    ),
    pytest.param(enc(["now", [], 0]), "batch[0]: timestamp must be a number, got str", id="ts"),
    pytest.param(enc([None, [], 0]), "batch[0]: timestamp must be a number, got nil", id="ts-nil"),
    pytest.param(
        enc([1.5, {"a": 1}, 0]), "batch[1]: events must be an array, got map", id="events"
    ),
    pytest.param(
        enc([1.5, [], "r0"]), "batch[2]: dp_rank must be an integer or nil, got str", id="rank"
    ),
    pytest.param(
        enc([1.5, [], 1.0]),
        "batch[2]: dp_rank must be an integer or nil, got float",
        id="rank-float",
    ),
    pytest.param(
        enc([1.5, [7]]), "batch[1][0]: an event must be an array or a map, got int", id="event-int"
    ),
    pytest.param(
        enc([1.5, [["AllBlocksCleared"], "x"]]),
        "batch[1][1]: an event must be an array or a map, got str",
        id="event-str",
    ),
    pytest.param(
        enc([1.5, [[]]]),
        "batch[1][0]: an event array must start with its type tag (a string), got an empty array",
        id="event-empty",
    ),
    pytest.param(
        enc([1.5, [[3, 4]]]),
        "batch[1][0]: an event array must start with its type tag (a string), got int",
        id="tag-int",
    ),
    pytest.param(
        enc([1.5, [{"block_hashes": [1]}]]),
        "batch[1][0]: an event map must have a string 'type' key, got no 'type' key",
        id="no-type",
    ),
    pytest.param(
        enc([1.5, [{"type": 5}]]),
        "batch[1][0]: an event map must have a string 'type' key, got 'type' = 5",
        id="type-int",
    ),
    pytest.param(
        enc(
            [
                1.5,
                [
                    STORED_ARRAY,
                    STORED_ARRAY,
                    ["AllBlocksCleared"],
                    ["BlockStored", [1], None, "abc", 2, None],
                ],
                0,
            ]
        ),
        "batch[1][3]: BlockStored.token_ids must be {tokens}, got str",
        id="tokens-str",
    ),
    pytest.param(
        enc([1.5, [["BlockStored", [1], None, [1, -1], 2, None]]]),
        "batch[1][0]: BlockStored.token_ids[1] = -1 is outside the token range [0, 2**32)",
        id="token-negative",
    ),
    pytest.param(
        enc(
            [
                1.5,
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": [],
                        "token_ids": [2**32],
                        "block_size": 1,
                    }
                ],
            ]
        ),
        "batch[1][0]: BlockStored.token_ids[0] = 4294967296 is outside the token range [0, 2**32)",
        id="token-big",
    ),
    pytest.param(
        enc([1.5, [["BlockStored", [1], None, [1, "2"], 2, None]]]),
        "batch[1][0]: BlockStored.token_ids[1] must be {token}, got str",
        id="token-str",
    ),
    pytest.param(
        enc([1.5, [["BlockStored", [1], None, [1, 2], -2, None]]]),
        "batch[1][0]: BlockStored.block_size must be >= 0, got -2",
        id="block-size",
    ),
    pytest.param(
        enc(
            [
                1.5,
                [{"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": "16"}],
            ]
        ),
        "batch[1][0]: BlockStored.block_size must be an integer, got str",
        id="block-size-str",
    ),
    pytest.param(
        enc([1.5, [["BlockStored", [1], None, [1, 2], 2, "lora"]]]),
        "batch[1][0]: BlockStored.lora_id must be an integer or nil, got str",
        id="lora-id",
    ),
    pytest.param(
        enc(
            [
                1.5,
                [
                    {
                        "type": "BlockStored",
                        "block_hashes": [1],
                        "token_ids": [],
                        "block_size": 0,
                        "medium": 1,
                    }
                ],
            ]
        ),
        "batch[1][0]: BlockStored.medium must be a string or nil, got int",
        id="medium",
    ),
    pytest.param(
        enc([1.5, [["BlockStored", [1], None]]]),
        "batch[1][0]: BlockStored.token_ids is missing",
        id="short-array",
    ),
    pytest.param(
        enc([1.5, [{"type": "BlockStored", "block_hashes": [1], "token_ids": []}]]),
        "batch[1][0]: BlockStored.block_size is missing",
        id="missing-key",
    ),
    pytest.param(
        enc([1.5, [{"type": "BlockRemoved", "medium": "GPU"}]]),
        "batch[1][0]: BlockRemoved.block_hashes is missing",
        id="removed-missing",
    ),
    pytest.param(
        enc([1.5, [["BlockRemoved", 5]]]),
        "batch[1][0]: BlockRemoved.block_hashes must be {hashes}, got int",
        id="removed-hashes",
    ),
    pytest.param(
        enc([1.5, [["BlockRemoved", [1], True]]]),
        "batch[1][0]: BlockRemoved.medium must be a string or nil, got bool",
        id="removed-medium",
    ),
]


# Where the engines' types differ, so does the wording.
WORDING = {
    "vllm": {
        "hashes": "an array of hashes (integers or bytes)",
        "hash": "a hash (an integer or bytes)",
        "tokens": "an array of integers",
        "token": "an integer",
    },
    "sglang": {
        "hashes": "an array of integers",
        "hash": "an integer",
        "tokens": "an array of integers or of integer pairs",
        "token": "an integer or a pair of integers",
    },
}


def wording(codec: ModuleType) -> dict[str, str]:
    return WORDING[codec.__name__.rsplit(".", 1)[1]]


@pytest.mark.parametrize(("data", "message"), BATCH_ERRORS)
def test_batch_errors(codec: ModuleType, data: bytes, message: str) -> None:
    decode_error(codec, data, message.format(**wording(codec)))


def test_truncated_golden_batches(codec: ModuleType) -> None:
    data = bytes.fromhex(
        VLLM_GOLDEN["0.33.0"] if codec is CODECS["vllm"] else SGLANG_GOLDEN["0.5.23"]
    )
    # Cut inside a value: where the data ends. Cut after a header: what it claims.
    cut_str = 140 if codec is CODECS["vllm"] else 85  # a map key's header ("block_size")
    for end in (10, len(data) - 1):
        decode_error(
            codec, data[:end], f"truncated msgpack: the data ends inside a value at offset {end}"
        )
    decode_error(
        codec,
        data[:1],
        "truncated msgpack: the array at offset 0 claims 3 items, more than fit before the data "
        "ends at offset 1",
    )
    decode_error(
        codec,
        data[: cut_str + 3],
        f"truncated msgpack: the str at offset {cut_str} claims 10 bytes, more than fit before "
        f"the data ends at offset {cut_str + 3}",
    )


def test_an_error_in_the_last_event_fails_the_whole_batch(codec: ModuleType) -> None:
    good = ["AllBlocksCleared"]
    decode_error(
        codec,
        enc([1.0, [good, good, ["BlockRemoved", ["x"]]], 0]),
        f"batch[1][2]: BlockRemoved.block_hashes[0] must be {wording(codec)['hash']}, got str",
    )


def test_data_must_be_bytes(codec: ModuleType) -> None:
    with raises(InputTypeError, "data must be bytes, got str"):
        codec.decode_batch("93cb")


# -- no input crashes the decoder ----------------------------------------------------------------
VALUES = st.recursive(
    SCALAR | st.floats(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "type",
                    "block_hashes",
                    "token_ids",
                    "block_size",
                    "medium",
                    "parent_block_hash",
                    "metadata",
                    "x",
                ]
            ),
            inner,
            max_size=4,
        )
    ),
    max_leaves=12,
)
EVENT_LIKE = st.one_of(
    VALUES,
    st.tuples(
        st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
        VALUES,
        VALUES,
        VALUES,
        VALUES,
    ).map(list),
    st.fixed_dictionaries(
        {
            "type": st.sampled_from(["BlockStored", "BlockRemoved"]),
            "block_hashes": VALUES,
            "token_ids": VALUES,
            "block_size": VALUES,
        }
    ),
)


def decodes_or_raises_decode_error(codec: ModuleType, data: bytes) -> None:
    """Anything else (another exception, or a crash of the interpreter) fails the test."""
    try:
        batch = codec.decode_batch(data)
    except DecodeError:
        return
    assert isinstance(batch, EventBatch)


@given(events=st.lists(EVENT_LIKE, max_size=4), rank=VALUES)
def test_structured_garbage_decodes_or_raises_decode_error(events: list[Any], rank: Any) -> None:
    for codec in CODECS.values():
        decodes_or_raises_decode_error(codec, enc([1.0, events, rank]))


@given(data=st.data())
def test_mutated_golden_bytes_decode_or_raise_decode_error(data: st.DataObject) -> None:
    engine, _, hexdata = data.draw(st.sampled_from(GOLDEN))
    wire = bytearray(bytes.fromhex(hexdata))
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(wire) - 1))
        wire[i] = data.draw(st.integers(0, 255))
    decodes_or_raises_decode_error(CODECS[engine], bytes(wire))


# -- the event types ------------------------------------------------------------------------------
def test_events_compare_arrays_element_wise_and_pickle() -> None:
    a = BlockStored(np.array([1, 2], np.uint64), 7, np.array([3, 4, 5, 6], np.uint32), 2)
    same = BlockStored(np.array([1, 2], np.uint64), 7, np.array([3, 4, 5, 6], np.uint32), 2)
    assert a == same
    assert not a.__ne__(same)
    assert a != BlockStored(np.array([1], np.uint64), 7, np.array([3, 4, 5, 6], np.uint32), 2)
    assert a != BlockStored(np.array([1, 2], np.uint64), 7, np.array([3, 4, 5, 6], np.uint32), 4)
    assert a != BlockRemoved(np.array([1, 2], np.uint64))
    assert pickle.loads(pickle.dumps(a)) == a
    batch = EventBatch(1.0, [a, AllBlocksCleared(), UnknownEvent("X", enc(["X"]))], 0)
    assert pickle.loads(pickle.dumps(batch)) == batch
    with pytest.raises(AttributeError):
        a.block_size = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        hash(a)


def test_encode_rejects_what_is_not_a_batch(codec: ModuleType) -> None:
    with raises(InputTypeError, "batch must be an EventBatch, got list"):
        codec.encode_batch([1.0, []])
    message = (
        "batch.events[1] must be a BlockStored, BlockRemoved, AllBlocksCleared or "
        "UnknownEvent, got dict"
    )
    with raises(InputTypeError, message):
        codec.encode_batch(EventBatch(1.0, [AllBlocksCleared(), {"type": "x"}]))
    with raises(InputTypeError, "batch.timestamp must be a number, got str"):
        codec.encode_batch(EventBatch("now", []))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kwargs", "exc", "message"),
    [
        (
            {"block_hashes": [2**64]},
            InvalidInputError,
            f"block_hashes[0] = {2**64} is outside the 64-bit hash range {HASH_RANGE}",
        ),
        (
            {"block_hashes": [1, -(2**63) - 1]},
            InvalidInputError,
            f"block_hashes[1] = {-(2**63) - 1} is outside the 64-bit hash range {HASH_RANGE}",
        ),
        ({"block_hashes": [1.5]}, InputTypeError, "block_hashes[0] must be an integer, got float"),
        (
            {"parent_block_hash": 2**64},
            InvalidInputError,
            f"parent_block_hash = {2**64} is outside the 64-bit hash range {HASH_RANGE}",
        ),
        (
            {"token_ids": [1, 2**32]},
            InvalidInputError,
            "token_ids[1] = 4294967296 is outside the token range [0, 2**32)",
        ),
        (
            {"token_ids": [-1]},
            InvalidInputError,
            "token_ids[0] = -1 is outside the token range [0, 2**32)",
        ),
        ({"token_ids": "abc"}, InputTypeError, "token_ids must be a sequence of integers, got str"),
        ({"block_size": -1}, InvalidInputError, "block_size must be >= 0, got -1"),
    ],
)
def test_encode_checks_hand_built_events(
    codec: ModuleType, kwargs: dict[str, Any], exc: type[Exception], message: str
) -> None:
    fields: dict[str, Any] = {
        "block_hashes": [1],
        "parent_block_hash": None,
        "token_ids": [1],
        "block_size": 1,
    }
    event = BlockStored(**(fields | kwargs))
    with raises(exc, message):
        codec.encode_batch(EventBatch(1.0, [event], 0))


def test_hand_built_events_with_lists_encode_like_arrays(codec: ModuleType) -> None:
    listed = BlockStored([1, 2**64 - 1], -1, [5, 6], 1)  # type: ignore[arg-type]
    arrays = BlockStored(
        np.array([1, 2**64 - 1], np.uint64), 2**64 - 1, np.array([5, 6], np.uint32), 1
    )
    assert codec.encode_batch(EventBatch(1.0, [listed], 0)) == codec.encode_batch(
        EventBatch(1.0, [arrays], 0)
    )
    assert codec.decode_batch(codec.encode_batch(EventBatch(1.0, [listed], 0))).events == [arrays]


# -- versions -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("engine", "version", "exc", "message"),
    [
        (
            "vllm",
            "0.8.5",
            InvalidInputError,
            "vLLM version '0.8.5' is outside the supported range 0.9.0 to 0.33.x",
        ),
        (
            "vllm",
            "0.34",
            InvalidInputError,
            "vLLM version '0.34' is outside the supported range 0.9.0 to 0.33.x",
        ),
        (
            "vllm",
            "1.0.0",
            InvalidInputError,
            "vLLM version '1.0.0' is outside the supported range 0.9.0 to 0.33.x",
        ),
        (
            "vllm",
            "latest",
            InvalidInputError,
            "vLLM version must look like '0.33' or '0.9.0', got 'latest'",
        ),
        ("vllm", "", InvalidInputError, "vLLM version must look like '0.33' or '0.9.0', got ''"),
        ("vllm", 0.33, InputTypeError, "version must be a string such as '0.33', got float"),
        (
            "sglang",
            "0.4.5",
            InvalidInputError,
            "SGLang version '0.4.5' is outside the supported range 0.4.6 to 0.5.23",
        ),
        (
            "sglang",
            "0.5.24",
            InvalidInputError,
            "SGLang version '0.5.24' is outside the supported range 0.4.6 to 0.5.23",
        ),
        (
            "sglang",
            "0.6",
            InvalidInputError,
            "SGLang version '0.6' is outside the supported range 0.4.6 to 0.5.23",
        ),
    ],
)
def test_unknown_versions(engine: str, version: Any, exc: type[Exception], message: str) -> None:
    with raises(exc, message):
        CODECS[engine].encode_batch(EventBatch(1.0, []), version=version)


@pytest.mark.parametrize(
    ("engine", "version", "same_as"),
    [
        ("vllm", "0.33", "0.33.0"),
        ("vllm", "0.33.2", "0.33.0"),
        ("vllm", "0.10.1.1", "0.9.1"),
        ("vllm", "0.23.0rc1", "0.22.0"),
        ("vllm", "0.25.1", "0.24.0"),
        ("sglang", "0.4.6.post5", "0.4.6"),
        ("sglang", "0.5.19", "0.5.18"),
        ("sglang", "0.5.21", "0.5.20"),
    ],
)
def test_releases_between_layouts_use_the_one_before(
    engine: str, version: str, same_as: str
) -> None:
    codec = CODECS[engine]
    assert codec.layout(version) is codec.layout(same_as)
