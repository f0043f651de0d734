"""Seeded mutation fuzzing of the wire codecs, shared by ``tests/test_wire_fuzz.py`` (CI, a
few thousand mutations) and ``bench/fuzz_wire.py`` (a million and more).

The contract under test: every decoder (``vllm``, ``sglang``, ``native``) either decodes
any byte string or raises radixmeta's :class:`~radixmeta.errors.DecodeError`; the
pure-Python paths (no native scanner, token reader or structure check) answer the same,
error message included; what decodes encodes again to bytes that decode to the same;
the binding's entry points (``msgpack_check``, ``msgpack_tokens``, ``MapBatchScanner``)
never raise for any bytes.

Seeds: the golden vectors of the reference note (``wire_cases``), each engine's golden
batch encoded by every release of :data:`wire_cases.VLLM_RELEASES` and
:data:`wire_cases.SGLANG_RELEASES`, richer batches (every optional field, odd hashes,
bigram pairs, unknown events, mixed eras) and native batches of every record form.
Mutations: bit flips, byte changes, insertions, deletions, truncations, splices of two
seeds, header swaps (one value's type byte for another's), length inflation (a count or
length raised, up to a 2**32 - 1 bomb), nesting (a value wrapped in arrays or maps,
past the depth limit at times), duplicated values and values replaced by others of
every type (the structure intact, so the schema is what is tested).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import msgspec
import numpy as np
from wire_cases import (
    SGLANG_GOLDEN,
    SGLANG_RELEASES,
    VLLM_GOLDEN,
    VLLM_RELEASES,
    sglang_golden_batch,
    vllm_golden_batch,
)

from radixmeta import _reference_msgpack
from radixmeta._records import Cleared, Removed, Stored
from radixmeta.errors import DecodeError
from radixmeta.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    UnknownEvent,
    WireHashes,
    _limits,
    _normalise,
    native,
    sglang,
    vllm,
)

try:
    from radixmeta import _core
except ImportError:  # no compiled extension: only the Python paths are fuzzed
    _core = None

CODECS: dict[str, ModuleType] = {"vllm": vllm, "sglang": sglang, "native": native}
MAX_MESSAGE = 240  # a DecodeError is logged per bad batch: its message stays one line
NEWEST = {"vllm": "0.33", "sglang": "0.5.23"}
enc = msgspec.msgpack.encode


# -- seeds -------------------------------------------------------------------------------------
def _u64(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint64)


def _u32(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=np.uint32)


def _rich_vllm() -> list[bytes]:
    stored = BlockStored(
        _u64([1, 2**64 - 1]),
        7,
        _u32([0, 127, 128, 65535, 65536, 2**32 - 1]),
        3,
        lora_id=5,
        medium="CPU",
        lora_name="adapter",
        extra_keys=[["mm", 3], None],
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=4096,
        locality="local",
        ownership="own",
        session_id="s-1",
        lookahead_token_ids=[[1, 2], [3]],
    )
    odd = BlockStored(  # hashes as vLLM 0.9 (negative) and raw digests sent them
        _u64([2**64 - 5, int.from_bytes(b"\x01" * 8, "big")]),
        2**64 - 1,
        _u32([9, 9]),
        1,
        wire_hashes=WireHashes((-5, b"\x01" * 8), -1),
    )
    removed = BlockRemoved(_u64([3]), medium="GPU", group_idx=0, locality="x", ownership="y")
    unknown = UnknownEvent("Future", enc({"type": "Future", "payload": [1, "a", b"b"]}))
    batch = EventBatch(2.5, [stored, odd, removed, AllBlocksCleared(), unknown], 3)
    out = [vllm.encode_batch(batch, version=v) for v in ("0.22.0", "0.26.0", "0.33")]
    # A rollout: array-era and map-era events in one batch, and a trailing element.
    array_event = msgspec.msgpack.decode(out[0])[1][0]
    map_event = msgspec.msgpack.decode(out[2])[1][2]
    out.append(enc([1.0, [array_event, map_event, ["Future", 1]], 0, "publisher-id"]))
    return out


def _rich_sglang() -> list[bytes]:
    pairs = BlockStored(_u64([11]), None, _u32([5, 6, 7]), 2, token_pairs=True, medium="GPU")
    salted = BlockStored(_u64([12]), 11, _u32([8, 9]), 2, cache_salt="salt", lora_name="l")
    signed = BlockStored(  # a u64 hash sent as such (SGLang never does): kept as sent
        _u64([2**63 + 1]), None, _u32([1]), 1, wire_hashes=WireHashes((2**63 + 1,), None)
    )
    batch = EventBatch(3.0, [pairs, salted, signed, BlockRemoved(_u64([12]))], 1)
    return [sglang.encode_batch(batch, version=v) for v in ("0.5.10", "0.5.18", "0.5.23")]


def _native_seeds() -> list[bytes]:
    key = _u32([1, 2, 3, 4, 5, 6])
    records = [
        Stored("w", 0, 0, 0, namespace="lora", key=key, start=2),
        Stored(
            "w",
            0,
            0,
            1,
            tier=1,
            namespace=7,
            block_hashes=_u64([1, 2]),
            parent_hash=9,
            token_ids=key[:4],
            extras=_u64([0, 5]),
        ),
        Removed("w", 0, 0, 2, namespace=b"salt", key=key, start=4),
        Removed("w", 0, 0, 3, block_hashes=_u64([2])),
        Cleared("w", 0, 0, 4),
    ]
    return [
        native.encode_batch(records, worker="worker-é", dp_rank=2, timestamp=1.25),
        native.encode_batch(records[:1], worker="w", timestamp=0.0),
        native.encode_batch([], worker="", timestamp=0.0),
    ]


def seeds() -> list[tuple[str, bytes]]:
    """``(codec, bytes)`` pairs: every era of every codec, valid as they stand."""
    out = [("vllm", bytes.fromhex(h)) for h in VLLM_GOLDEN.values()]
    out += [("sglang", bytes.fromhex(h)) for h in SGLANG_GOLDEN.values()]
    out += [("vllm", vllm.encode_batch(vllm_golden_batch(v), version=v)) for v in VLLM_RELEASES]
    out += [
        ("sglang", sglang.encode_batch(sglang_golden_batch(v), version=v))
        for v in SGLANG_RELEASES
    ]
    out += [("vllm", b) for b in _rich_vllm()]
    out += [("sglang", b) for b in _rich_sglang()]
    out += [("native", b) for b in _native_seeds()]
    return out


# -- mutations ---------------------------------------------------------------------------------
def value_spans(data: bytes) -> list[tuple[int, int]]:
    """``(start, end)`` of every msgpack value in ``data``, as far as it is well formed."""
    spans: list[tuple[int, int]] = []
    open_: list[list[int]] = []  # per open container: [its span's index, values left]
    at = 0
    while at < len(data):
        n, head = _container(data, at)
        if n is not None:
            spans.append((at, -1))
            at += head
            if open_:
                open_[-1][1] -= 1
            open_.append([len(spans) - 1, n])
        else:
            size = _scalar_size(data, at)
            if size is None or at + size > len(data):
                break
            spans.append((at, at + size))
            at += size
            if open_:
                open_[-1][1] -= 1
        while open_ and open_[-1][1] == 0:  # containers that end here
            index, _ = open_.pop()
            spans[index] = (spans[index][0], at)
        if not open_:
            break  # the top-level value is complete
    return [(s, e) for s, e in spans if e >= 0]


def _container(data: bytes, at: int) -> tuple[int | None, int]:
    tag = data[at]
    if 0x90 <= tag <= 0x9F:
        return tag & 0x0F, 1
    if 0x80 <= tag <= 0x8F:
        return 2 * (tag & 0x0F), 1
    width = {0xDC: 2, 0xDD: 4, 0xDE: 2, 0xDF: 4}.get(tag)
    if width is None or at + 1 + width > len(data):
        return None, 0
    n = int.from_bytes(data[at + 1 : at + 1 + width], "big")
    return (2 * n if tag >= 0xDE else n), 1 + width


def _scalar_size(data: bytes, at: int) -> int | None:
    tag = data[at]
    if tag <= 0x7F or tag >= 0xE0 or tag in (0xC0, 0xC2, 0xC3):
        return 1
    fixed = {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5}
    fixed |= {0xD3: 9, 0xD4: 3, 0xD5: 4, 0xD6: 6, 0xD7: 10, 0xD8: 18}
    if tag in fixed:
        return fixed[tag]
    if 0xA0 <= tag <= 0xBF:
        return 1 + (tag & 0x1F)
    sized = {0xD9: (1, 2), 0xDA: (2, 3), 0xDB: (4, 5), 0xC4: (1, 2), 0xC5: (2, 3)}
    sized |= {0xC6: (4, 5), 0xC7: (1, 3), 0xC8: (2, 4), 0xC9: (4, 6)}
    if tag not in sized:
        return None
    width, head = sized[tag]
    if at + 1 + width > len(data):
        return None
    return head + int.from_bytes(data[at + 1 : at + 1 + width], "big")


# Representative headers of every msgpack type, for header swaps.
HEADERS = [0x00, 0x7F, 0xE0, 0xFF, 0xC0, 0xC2, 0xC3, 0xCA, 0xCB, 0xCC, 0xCD, 0xCE, 0xCF, 0xD0]
HEADERS += [0xD3, 0xD4, 0xD8, 0xC7, 0xC4, 0xC6, 0xA0, 0xA5, 0xBF, 0xD9, 0xDB, 0x80, 0x83]
HEADERS += [0x8F, 0xDE, 0xDF, 0x90, 0x93, 0x9F, 0xDC, 0xDD, 0xC1]
INTERESTING = [0x00, 0x01, 0x7F, 0x80, 0xFF, 0xC0, 0xC1, 0xCF, 0xD3, 0xDD, 0xDF, 0xDB]


def _bit_flip(rng: random.Random, data: bytes, other: bytes) -> bytes:
    if not data:
        return data
    b = bytearray(data)
    b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def _set_byte(rng: random.Random, data: bytes, other: bytes) -> bytes:
    if not data:
        return data
    b = bytearray(data)
    b[rng.randrange(len(b))] = rng.choice(INTERESTING) if rng.random() < 0.5 else rng.randrange(256)
    return bytes(b)


def _insert(rng: random.Random, data: bytes, other: bytes) -> bytes:
    at = rng.randrange(len(data) + 1)
    return data[:at] + bytes(rng.randrange(256) for _ in range(rng.randint(1, 4))) + data[at:]


def _delete(rng: random.Random, data: bytes, other: bytes) -> bytes:
    if not data:
        return data
    at = rng.randrange(len(data))
    return data[:at] + data[at + rng.randint(1, 4) :]


def _truncate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)]


def _splice(rng: random.Random, data: bytes, other: bytes) -> bytes:
    return data[: rng.randrange(len(data) + 1)] + other[rng.randrange(len(other) + 1) :]


def _swap_header(rng: random.Random, data: bytes, other: bytes) -> bytes:
    spans = value_spans(data)
    if not spans:
        return _set_byte(rng, data, other)
    start, _ = rng.choice(spans)
    return data[:start] + bytes([rng.choice(HEADERS)]) + data[start + 1 :]


def _inflate_length(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """A container's count or a string's length raised: by one, to its form's maximum, or to
    2**32 - 1 in its 32-bit form (a length bomb)."""
    starts = [s for s, _ in value_spans(data) if _is_sized(data[s])]
    if not starts:
        return _set_byte(rng, data, other)
    start = rng.choice(starts)
    tag, head = _header(data, start)
    family = _family(tag)
    choice = rng.randrange(3)
    if choice == 2:
        big = {"array": 0xDD, "map": 0xDF, "str": 0xDB, "bin": 0xC6, "ext": 0xC9}[family]
        ext_type = b"\x00" if family == "ext" else b""
        bomb = bytes([big]) + (2**32 - 1).to_bytes(4, "big") + ext_type
        return data[:start] + bomb + data[start + head :]
    if tag < 0xC0:  # a fix form: its count or length is in the low bits
        mask = 0x1F if tag >= 0xA0 else 0x0F
        low = mask if choice == 1 else min(mask, (tag & mask) + 1)
        return data[:start] + bytes([(tag & ~mask) | low]) + data[start + 1 :]
    width = head - 1 - (1 if family == "ext" else 0)
    value = int.from_bytes(data[start + 1 : start + 1 + width], "big")
    top = 2 ** (8 * width) - 1
    value = top if choice == 1 else min(top, value + 1)
    return data[:start + 1] + value.to_bytes(width, "big") + data[start + 1 + width :]


def _is_sized(tag: int) -> bool:
    return 0x80 <= tag <= 0xBF or 0xC4 <= tag <= 0xC9 or 0xD9 <= tag <= 0xDF


def _family(tag: int) -> str:
    if 0x90 <= tag <= 0x9F or tag in (0xDC, 0xDD):
        return "array"
    if 0x80 <= tag <= 0x8F or tag in (0xDE, 0xDF):
        return "map"
    if 0xC4 <= tag <= 0xC6:
        return "bin"
    if 0xC7 <= tag <= 0xC9:
        return "ext"
    return "str"


def _header(data: bytes, at: int) -> tuple[int, int]:
    """(the header's byte, its length in bytes with count or length and ext type)."""
    tag = data[at]
    if tag < 0xC0:
        return tag, 1
    heads = {0xDC: 3, 0xDD: 5, 0xDE: 3, 0xDF: 5, 0xD9: 2, 0xDA: 3, 0xDB: 5, 0xC4: 2, 0xC5: 3}
    heads |= {0xC6: 5, 0xC7: 3, 0xC8: 4, 0xC9: 6}
    return tag, heads[tag]


def _nest(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """A value wrapped in one-item arrays or one-entry maps, 1 to 5,000 deep."""
    spans = value_spans(data)
    start, end = rng.choice(spans) if spans else (0, len(data))
    levels = rng.choice([1, 2, 8, 59, 60, 61, 62, 63, 64, 80, 1_000, 5_000])
    wrap = b"\x91" * levels if rng.random() < 0.7 else b"\x81\x00" * levels
    return data[:start] + wrap + data[start:end] + data[end:]


# Whole values a field might wrongly hold: every type, the edges of every range, the
# engines' tags and keys, pairs, nesting at the limit and one past it.
VALUES = [
    enc(v)
    for v in (
        None, True, False, 0, -1, 127, 2**32 - 1, 2**32, 2**63, 2**64 - 1, -(2**63), 1.5,
        float("nan"), "", "x", "type", "BlockStored", "BlockRemoved", "AllBlocksCleared",
        "GPU", b"", b"\x00" * 8, [], [1, 2], [[1, 2], [2, 3]], [-1], {}, {"type": "x"},
        {"type": "BlockRemoved", "block_hashes": [1]}, {"cache_salt": "s"}, [None, None],
    )
]
VALUES += [b"\x91" * 61 + b"\xc0", b"\x91" * 62 + b"\xc0", b"\xd6\xff" + bytes(4)]  # timestamp


def _replace_value(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """One value (any, at any depth) replaced by another well-formed one: the structure
    stays valid, so the schema's checks are what is tested."""
    spans = value_spans(data)
    if not spans:
        return rng.choice(VALUES)
    start, end = rng.choice(spans)
    return data[:start] + rng.choice(VALUES) + data[end:]


def _duplicate(rng: random.Random, data: bytes, other: bytes) -> bytes:
    """One value repeated in place (its container's count left as it was)."""
    spans = value_spans(data)
    if not spans:
        return _insert(rng, data, other)
    start, end = rng.choice(spans)
    return data[:end] + data[start:end] + data[end:]


MUTATORS: dict[str, Callable[[random.Random, bytes, bytes], bytes]] = {
    "bit_flip": _bit_flip,
    "set_byte": _set_byte,
    "insert": _insert,
    "delete": _delete,
    "truncate": _truncate,
    "splice": _splice,
    "swap_header": _swap_header,
    "inflate_length": _inflate_length,
    "nest": _nest,
    "duplicate": _duplicate,
    "replace_value": _replace_value,
}


def mutate(rng: random.Random, corpus: list[tuple[str, bytes]]) -> tuple[str, bytes, list[str]]:
    """A codec (each as likely), one of its seeds mutated 1 to 3 times, the mutations' names."""
    codec = rng.choice(sorted({name for name, _ in corpus}))
    data = rng.choice([seed for name, seed in corpus if name == codec])
    names = [rng.choice(list(MUTATORS)) for _ in range(rng.randint(1, 3))]
    for name in names:
        data = MUTATORS[name](rng, data, rng.choice(corpus)[1])
    return codec, data, names


# -- outcomes ----------------------------------------------------------------------------------
@contextmanager
def python_paths() -> Iterator[None]:
    """The codecs as they run without the compiled extension: msgspec alone, the Python
    structure check, no native scanner or token reader."""
    saved = (_limits._check, vllm._CODEC.decoder._native, _normalise._native_tokens)
    _limits._check = _reference_msgpack.msgpack_check
    vllm._CODEC.decoder._native = None
    _normalise._native_tokens = None
    try:
        yield
    finally:
        _limits._check, vllm._CODEC.decoder._native, _normalise._native_tokens = saved


@dataclass
class Result:
    """What a decoder did with one input: ``"decoded"`` (and the value) or ``"error"``
    (a DecodeError, and its message); anything else is a failure of the contract."""

    kind: str
    value: Any


def run(name: str, data: bytes) -> Result:
    try:
        return Result("decoded", CODECS[name].decode_batch(data))
    except DecodeError as exc:
        return Result("error", str(exc))
    except Exception as exc:  # the contract is that nothing else escapes
        return Result("failure", f"{type(exc).__module__}.{type(exc).__name__}: {exc}")


def _same_value(a: Any, b: Any) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (
            isinstance(a, np.ndarray)
            and isinstance(b, np.ndarray)
            and a.dtype == b.dtype
            and np.array_equal(a, b)
        )
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):  # extra_keys and the like: NaN may sit inside
        return len(a) == len(b) and all(_same_value(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same_value(a[k], b[k]) for k in a)
    return bool(a == b)


def same_decoded(a: Any, b: Any) -> bool:
    """Equal batches (vLLM/SGLang) or native batches, NaN timestamps equal, dtypes and
    types of every field the same."""
    if type(a) is not type(b):
        return False
    if isinstance(a, EventBatch):
        items = [(a.timestamp, b.timestamp), (a.dp_rank, b.dp_rank)]
        if len(a.events) != len(b.events):
            return False
        for x, y in zip(a.events, b.events, strict=True):
            if type(x) is not type(y):
                return False
            items += [(getattr(x, f), getattr(y, f)) for f in x.__struct_fields__]
    else:
        items = [(a.timestamp, b.timestamp), (a.worker, b.worker), (a.dp_rank, b.dp_rank)]
        if len(a.records) != len(b.records):
            return False
        for x, y in zip(a.records, b.records, strict=True):
            if type(x) is not type(y):
                return False
            items += [(getattr(x, f), getattr(y, f)) for f in x.__struct_fields__]
    return all(_same_value(x, y) for x, y in items)


def reencoded(name: str, decoded: Any) -> bytes:
    """What decoded to ``decoded``, encoded again (by the newest release for the engines,
    which carries every field)."""
    if name == "native":
        return native.encode_batch(
            decoded.records,
            worker=decoded.worker,
            dp_rank=decoded.dp_rank,
            timestamp=decoded.timestamp,
        )
    return CODECS[name].encode_batch(decoded, version=NEWEST[name])


def problems(data: bytes) -> tuple[dict[str, Result], list[str]]:
    """Every codec on ``data``: what each did, and what broke the contract (each problem
    named by its codec, or by the binding's entry point)."""
    results: dict[str, Result] = {}
    broken: list[str] = []
    for name in CODECS:
        got = results[name] = run(name, data)
        if got.kind == "failure":
            broken.append(f"{name}: {got.value}")
            continue
        if got.kind == "error" and len(got.value) > MAX_MESSAGE:
            broken.append(f"{name}: a {len(got.value)}-character message: {got.value[:80]}...")
        with python_paths():
            slow = run(name, data)
        if slow.kind != got.kind or (got.kind == "error" and slow.value != got.value):
            broken.append(f"{name}: native paths {got.kind} {got.value!r}, Python paths "
                          f"{slow.kind} {slow.value!r}")
        elif got.kind == "decoded" and not same_decoded(got.value, slow.value):
            broken.append(f"{name}: the native and Python paths decode differently")
        if got.kind == "decoded":
            broken += [f"{name}: {p}" for p in _round_trip(name, got.value)]
    broken += _entry_points(data)
    return results, broken


def _round_trip(name: str, decoded: Any) -> list[str]:
    try:
        again = reencoded(name, decoded)
    except Exception as exc:
        return [f"what decoded does not encode: {type(exc).__name__}: {exc}"]
    second = run(name, again)
    if second.kind != "decoded":
        return [f"re-encoded bytes do not decode: {second.value}"]
    if not same_decoded(second.value, decoded):
        return [f"re-encoded bytes decode to another batch: {second.value!r} != {decoded!r}"]
    return []


_SCANNER = vllm._CODEC.decoder._native


def _entry_points(data: bytes) -> list[str]:
    """The binding's functions on raw bytes: answers, never exceptions."""
    broken = []
    reference = _reference_msgpack.msgpack_check(data, _limits.MAX_DEPTH)
    if _core is not None:
        try:
            native_check = _core.msgpack_check(data, _limits.MAX_DEPTH)
            if native_check != reference:
                broken.append(f"msgpack_check: native {native_check}, reference {reference}")
            tokens = _core.msgpack_tokens(data)
            if tokens is not None and not isinstance(tokens, np.ndarray):
                broken.append(f"msgpack_tokens answered {type(tokens).__name__}")
            if _SCANNER is not None:
                scanned = _SCANNER(data)
                if scanned is not None and reference is not None:
                    broken.append(f"the scanner took what msgpack_check refuses: {reference}")
        except Exception as exc:
            broken.append(f"entry point raised {type(exc).__name__}: {exc}")
    return broken
