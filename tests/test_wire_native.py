"""radixmeta's own wire format: round trips of every record form, and bad bytes refused."""

from __future__ import annotations

import random
import re
from typing import Any

import msgspec
import numpy as np
import pytest

from radixmeta import EventLog, RadixCache
from radixmeta.errors import DecodeError, InputTypeError
from radixmeta.events import Cleared, Removed, Stored
from radixmeta.wire import native


def _log_records(form: str) -> list[Any]:
    log = EventLog(form=form, worker="w")
    cache = RadixCache(2, capacity=40, event_log=log)
    rng = random.Random(5)
    for _ in range(60):
        key = [rng.randrange(3) for _ in range(rng.randrange(2, 20))]
        cache.insert(key, namespace=rng.choice([None, "salt-a", 7, b"raw"]))
    cache.reset()
    return log.read()


@pytest.mark.parametrize("form", ["path", "blocks"])
def test_round_trip_of_a_log(form: str) -> None:
    records = _log_records(form)
    data = native.encode_batch(records, worker="w", dp_rank=3, timestamp=1.5)
    batch = native.decode_batch(data, seq=42)
    assert (batch.timestamp, batch.worker, batch.dp_rank) == (1.5, "w", 3)
    # On the wire a record is named by the batch's seq and its index in it.
    expected = [
        msgspec.structs.replace(r, seq=42, index=i, dp_rank=3) for i, r in enumerate(records)
    ]
    assert batch.records == expected
    assert {type(r) for r in batch.records} == {Stored, Removed, Cleared}


def test_extras_and_tiers_travel() -> None:
    record = Stored(
        "w",
        0,
        0,
        tier=1,
        block_hashes=np.array([1, 2], np.uint64),
        parent_hash=2**64 - 1,
        token_ids=np.arange(4, dtype=np.uint32),
        extras=np.array([0, 9], np.uint64),
    )
    (back,) = native.decode_batch(native.encode_batch([record], worker="w")).records
    assert back == record


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\xc1", "batch: malformed msgpack: invalid opcode '\\xc1' at offset 0"),
        (msgspec.msgpack.encode([1, 2]), "batch: not a radixmeta batch"),
        (msgspec.msgpack.encode(["radixmeta", 2, 0.0, "w", 0, []]), "batch[1]: version 2 is not"),
        (
            msgspec.msgpack.encode(["radixmeta", 1, "t", "w", 0, []]),
            "batch[2]: Expected `float`, got `str`",
        ),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, 5, 0, []]),
            "batch[3]: Expected `str`, got `int`",
        ),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", -1, []]),
            "batch[4]: Expected `int` >= 0",
        ),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", 0, {}]),
            "batch[5]: Expected `array`, got `object`",
        ),
        (msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", 0, [[9]]]), "batch[5][0][0]"),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", 0, [[0, 0]]]),
            "batch[5][0]: Expected `array` of at least length 5, got 2",
        ),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", 0, [[0, 0, None, b"abc", 0]]]),
            "must be bin of whole <u4 values",
        ),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", 0, [[0, 0, 1.5, b"", 0]]]),
            "a namespace must be None, str, int or bytes",
        ),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", 0, [[0, 2, None, b"", 0]]]),
            "batch[5][0][1]: Expected `int` <= 1",
        ),
        (
            msgspec.msgpack.encode(["radixmeta", 1, 0.0, "w", 0, [[0, 0, None, b"\0" * 4, 2]]]),
            "batch[5][0][4]",
        ),
    ],
)
def test_bad_bytes(data: bytes, message: str) -> None:
    with pytest.raises(DecodeError, match=re.escape(message)):
        native.decode_batch(data)


def test_what_cannot_be_encoded() -> None:
    with pytest.raises(InputTypeError, match="a namespace must be None, str, int or bytes"):
        native.encode_batch(
            [Stored("w", 0, 0, namespace=("a", 1), key=np.zeros(2, np.uint32))], worker="w"
        )
    with pytest.raises(InputTypeError, match="worker must be a str"):
        native.encode_batch([], worker=3)  # type: ignore[arg-type]
