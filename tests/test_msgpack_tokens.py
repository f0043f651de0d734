"""The native reader of msgpack token arrays agrees with msgspec and refuses other shapes."""

from __future__ import annotations

import msgspec
import pytest
from conftest import require_native
from hypothesis import given
from hypothesis import strategies as st

ints = st.one_of(
    st.integers(0, 127), st.integers(128, 2**16), st.integers(2**16, 2**32 - 1)
)


@given(st.lists(ints, max_size=300))
def test_reads_what_msgspec_writes(tokens: list[int]) -> None:
    native = require_native()
    out = native.msgpack_tokens(msgspec.msgpack.encode(tokens))
    assert out is not None and out.dtype.name == "uint32" and out.tolist() == tokens


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\xc0",  # nil, not an array
        msgspec.msgpack.encode([1, 2]) + b"\x00",  # trailing bytes
        msgspec.msgpack.encode([1, 2])[:-1],  # truncated
        msgspec.msgpack.encode([-1]),
        msgspec.msgpack.encode([2**32]),
        msgspec.msgpack.encode([1.0]),
        msgspec.msgpack.encode([[1, 2], [2, 3]]),  # SGLang bigram pairs: the slow path
        b"\xdd\xff\xff\xff\xff\x01",  # a count larger than the bytes could hold
    ],
)
def test_refuses_other_shapes(raw: bytes) -> None:
    assert require_native().msgpack_tokens(raw) is None


@pytest.mark.parametrize(
    ("raw", "tokens"),
    [
        (b"\x92\xd0\x05\xd1\x01\x00", [5, 256]),  # signed encodings of non-negative ints
        (b"\x91\xcf\x00\x00\x00\x00\xff\xff\xff\xff", [2**32 - 1]),  # uint 64 below 2**32
        (b"\xdc\x00\x02\x01\x02", [1, 2]),  # array 16
    ],
)
def test_accepts_every_integer_encoding(raw: bytes, tokens: list[int]) -> None:
    out = require_native().msgpack_tokens(raw)
    assert out is not None and out.tolist() == tokens
