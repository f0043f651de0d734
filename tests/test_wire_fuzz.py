"""Nothing from the wire stops a decoder: every byte string decodes or raises DecodeError.

A seeded mutation run over every codec and era (``wire_fuzz``; ``bench/fuzz_wire.py``
runs the same for a million and more), then the inputs a mutation finds only by luck,
built on purpose: nesting bombs at every place a value can nest, length bombs of every
sized type, and invalid UTF-8 in every string of every seed.
"""

from __future__ import annotations

import random
import tracemalloc
from collections import Counter

import msgspec
import numpy as np
import pytest
import wire_fuzz
from conftest import require_native
from wire_fuzz import CODECS, python_paths, run, seeds, value_spans

from radixmeta import _reference_msgpack
from radixmeta.errors import DecodeError, InputTypeError
from radixmeta.wire import MAX_DEPTH, vllm

MUTATIONS = 6_000  # over the three codecs: at least 5,000 a run
SEED = 20_260_518

enc = msgspec.msgpack.encode
TS = b"\xcb" + bytes(8)  # the float 0.0
PREFIX = {"vllm": "", "sglang": "", "native": "batch: "}  # native names the batch


def decode_error(codec: str, data: bytes, message: str) -> None:
    """``data`` raises exactly ``message`` on the native paths and the Python paths."""
    for paths in ("native", "python"):
        if paths == "python":
            with python_paths():
                got = run(codec, data)
        else:
            got = run(codec, data)
        assert (got.kind, got.value) == ("error", PREFIX[codec] + message), paths


# -- the seeded run --------------------------------------------------------------------------
def test_every_seed_decodes_and_round_trips() -> None:
    for codec, data in seeds():
        results, broken = wire_fuzz.problems(data)
        assert results[codec].kind == "decoded", (codec, data.hex())
        assert not broken, (codec, data.hex(), broken)


def test_mutations_decode_or_raise_decode_error() -> None:
    """Per mutation, every codec: DecodeError or a batch (the same on the Python paths,
    and again after re-encoding), and the binding's entry points answer."""
    corpus = seeds()
    rng = random.Random(SEED)
    outcomes: Counter[tuple[str, str]] = Counter()
    failures = []
    for i in range(MUTATIONS):
        _, data, names = wire_fuzz.mutate(rng, corpus)
        results, broken = wire_fuzz.problems(data)
        outcomes.update((name, r.kind) for name, r in results.items())
        if broken:
            failures.append(f"mutation {i} ({'+'.join(names)}) {data.hex()}: {broken}")
    assert not failures, "\n".join(failures[:5])
    # The run reaches both outcomes of every codec, or it would test less than it says.
    for codec in CODECS:
        assert outcomes[(codec, "decoded")] > 0 and outcomes[(codec, "error")] > 0, outcomes


# -- depth bombs -----------------------------------------------------------------------------
def nested(levels: int, leaf: bytes = b"\xc0") -> bytes:
    return b"\x91" * levels + leaf


def too_deep(offset: int, kind: str = "array") -> str:
    return (
        f"malformed msgpack: the {kind} at offset {offset} is nested deeper than "
        f"{MAX_DEPTH} arrays and maps"
    )


# Where a value may nest in an engine batch: (prefix, suffix, the containers around it).
# Each place is inside the batch; the nested value is the prefix's last element.
STORED_MAP = (
    b"\x84\xa4type\xabBlockStored\xacblock_hashes\x91\x01\xa9token_ids\x90"
    b"\xaablock_size\x00"
)
ENGINE_PLACES = {
    # The whole batch, nested: [[[... [ts, []] ...]]].
    "batch": (b"", b"\x92" + TS + b"\x90", 0),
    # A trailing batch element (ignored): [ts, [], 0, <value>].
    "trailing": (b"\x94" + TS + b"\x90\x00", b"", 1),
    # An event of an unknown type's body: [ts, [["Future", <value>]]].
    "unknown event": (b"\x92" + TS + b"\x91\x92\xa6Future", b"", 3),
    # An event itself: [ts, [<value>]].
    "event": (b"\x92" + TS + b"\x91", b"", 2),
    # A field the decoder ignores, in a map-era event: {"future": <value>}.
    "unknown key": (b"\x92" + TS + b"\x91" + STORED_MAP.replace(b"\x84", b"\x85", 1)
                    + b"\xa6future", b"", 3),
}


@pytest.mark.parametrize("codec", ["vllm", "sglang"])
@pytest.mark.parametrize("place", list(ENGINE_PLACES))
@pytest.mark.parametrize("levels", [1, 1_000, 100_000])
def test_engine_depth_bombs(codec: str, place: str, levels: int) -> None:
    prefix, suffix, around = ENGINE_PLACES[place]
    if place == "batch":  # the batch's own array is the innermost
        data = b"\x91" * (MAX_DEPTH + levels - 1) + suffix
        decode_error(codec, data, too_deep(MAX_DEPTH))
        return
    data = prefix + nested(MAX_DEPTH - around + levels) + suffix
    # The first container past the limit: the (MAX_DEPTH - around + 1)-th of the nest.
    decode_error(codec, data, too_deep(len(prefix) + MAX_DEPTH - around))


def test_nesting_up_to_the_limit_decodes() -> None:
    """vLLM's extra_keys take any value: nested to exactly MAX_DEPTH it decodes, one more
    does not (an event map is at depth 3, its extra_keys array at 4)."""
    head = b"\x92" + TS + b"\x91" + STORED_MAP.replace(b"\x84", b"\x85", 1) + b"\xaaextra_keys"
    fits = head + nested(MAX_DEPTH - 3)
    (stored,) = vllm.decode_batch(fits).events
    depth, value = 4, stored.extra_keys
    while value != [None]:
        value, depth = value[0], depth + 1
    assert depth == MAX_DEPTH
    decode_error("vllm", head + nested(MAX_DEPTH - 2), too_deep(len(head) + MAX_DEPTH - 3))


def test_maps_count_as_nesting_too() -> None:
    data = b"\x81\xa1k" * (MAX_DEPTH + 1) + b"\xc0"
    for codec in CODECS:
        decode_error(codec, data, too_deep(3 * MAX_DEPTH, "map"))


@pytest.mark.parametrize("levels", [MAX_DEPTH, 10_000])
def test_native_depth_bombs(levels: int) -> None:
    record = enc([0, 0, "NS", b"", 0])
    # A namespace nested (it must be a scalar: too deep first), and a trailing element.
    at_namespace = enc(["radixmeta", 1, 0.0, "w", 0, []])[:-1] + b"\x91" + record.replace(
        b"\xa2NS", nested(levels)
    )
    offset = at_namespace.index(b"\x91\x91") + MAX_DEPTH - 3
    decode_error("native", at_namespace, too_deep(offset))
    trailing = enc(["radixmeta", 1, 0.0, "w", 0, []]).replace(b"\x96", b"\x97", 1)
    trailing += nested(levels)
    decode_error("native", trailing, too_deep(len(trailing) - levels - 1 + MAX_DEPTH - 1))


def test_the_native_scanner_skips_deep_values_only_within_the_limit() -> None:
    """A vLLM map-era batch the native scanner takes whole: an ignored field may nest to the
    limit and no further, so both paths give the same answer at the edge."""
    require_native()
    decoder = vllm._CODEC.decoder
    head = b"\x92" + TS + b"\x91" + STORED_MAP.replace(b"\x84", b"\x85", 1) + b"\xa6future"
    fits = head + nested(MAX_DEPTH - 3)
    assert decoder._native(fits) is not None  # taken by the native scanner
    assert len(vllm.decode_batch(fits).events) == 1
    over = head + nested(MAX_DEPTH - 2)
    assert decoder._native(over) is None
    decode_error("vllm", over, too_deep(len(head) + MAX_DEPTH - 3))


def test_the_scanner_refuses_a_limit_below_its_own_nesting() -> None:
    core = require_native()
    with pytest.raises(ValueError, match="max_depth must be at least 4"):
        core.MapBatchScanner([("A", [])], 3)


# -- length bombs ----------------------------------------------------------------------------
# A 32-bit header of every sized type claiming 2**32 - 1, with a few bytes after it.
BOMBS = {
    "array": (b"\xdd\xff\xff\xff\xff", "4294967295 items"),
    "map": (b"\xdf\xff\xff\xff\xff", "4294967295 entries"),
    "str": (b"\xdb\xff\xff\xff\xff", "4294967295 bytes"),
    "bin": (b"\xc6\xff\xff\xff\xff", "4294967295 bytes"),
    "ext": (b"\xc9\xff\xff\xff\xff\x01", "4294967295 bytes"),
}


def bomb_message(kind: str, offset: int, end: int) -> str:
    claims = BOMBS[kind][1]
    return (
        f"truncated msgpack: the {kind} at offset {offset} claims {claims}, more than fit "
        f"before the data ends at offset {end}"
    )


@pytest.mark.parametrize("kind", list(BOMBS))
@pytest.mark.parametrize("codec", list(CODECS))
def test_length_bombs_are_refused_before_anything_is_allocated(codec: str, kind: str) -> None:
    header = BOMBS[kind][0]
    places = {
        "top": b"",
        "events": b"\x92" + TS,  # the events array itself, or a value in its place
        "event": b"\x92" + TS + b"\x91",
        "field": b"\x92" + TS + b"\x91\x82\xa4type\xabBlockStored\xa9token_ids",
    }
    if codec == "native":
        places = {
            "top": b"",
            "records": enc(["radixmeta", 1, 0.0, "w", 0, []])[:-1],
            "key": enc(["radixmeta", 1, 0.0, "w", 0, []])[:-1] + b"\x91\x95\x00\x00\xc0",
        }
    for prefix in places.values():
        data = prefix + header + b"\x01\x02"
        tracemalloc.start()
        try:
            decode_error(codec, data, bomb_message(kind, len(prefix), len(data)))
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert peak < 1 << 20, peak  # nothing like 2**32 items or bytes


def test_a_container_claiming_more_than_one_byte_per_item() -> None:
    # 3 items need 3 bytes, 2 are left; a map of 2 entries needs 4 bytes, 3 are left.
    decode_error(
        "vllm",
        b"\x93\x01\x02",
        "truncated msgpack: the array at offset 0 claims 3 items, more than fit before the data "
        "ends at offset 3",
    )
    decode_error(
        "sglang",
        b"\x82\x01\x02\x03",
        "truncated msgpack: the map at offset 0 claims 2 entries, more than fit before the data "
        "ends at offset 4",
    )


# -- invalid UTF-8 ---------------------------------------------------------------------------
def strings(data: bytes) -> list[tuple[int, int]]:
    """(header offset, first content byte) of every non-empty str of a valid message."""
    out = []
    for start, end in value_spans(data):
        tag = data[start]
        if 0xA1 <= tag <= 0xBF:
            out.append((start, start + 1))
        elif 0xD9 <= tag <= 0xDB and end > start + 2 ** (tag - 0xD9) + 1:
            out.append((start, start + 2 ** (tag - 0xD9) + 1))
    return out


def not_utf8(offset: int) -> str:
    return f"malformed msgpack: the str at offset {offset} is not valid UTF-8"


def test_invalid_utf8_in_every_string_of_every_seed() -> None:
    """Every str: tags, keys, values and namespaces, in every era; found by the check at
    the str's header, on every path (the native scanner included)."""
    checked: Counter[str] = Counter()
    for codec, data in seeds():
        for header, first in strings(data):
            for bad in (b"\xff", b"\xc0", b"\xed"):  # never UTF-8; overlong; a surrogate lead
                broken = data[:first] + bad + data[first + 1 :]
                decode_error(codec, broken, not_utf8(header))
            checked[codec] += 1
    assert min(checked.values()) >= 5, checked


def test_invalid_utf8_where_the_decoder_would_not_look() -> None:
    """A bad string in a field or element every decoder ignores still fails the batch, so
    whether a batch decodes never depends on where a bad string sits."""
    ignored_key = b"\x92" + TS + b"\x91" + STORED_MAP.replace(b"\x84", b"\x85", 1)
    ignored_key += b"\xa6future\xa2\xc3\x28"
    trailing = b"\x94" + TS + b"\x90\x00\xa1\xff"
    for codec in ("vllm", "sglang"):
        decode_error(codec, ignored_key, not_utf8(len(ignored_key) - 3))
        decode_error(codec, trailing, not_utf8(len(trailing) - 2))
    native_trailing = enc(["radixmeta", 1, 0.0, "w", 0, []]).replace(b"\x96", b"\x97", 1)
    decode_error("native", native_trailing + b"\xa1\xff", not_utf8(len(native_trailing)))


def test_the_utf8_rule_is_pythons() -> None:
    """The native check's UTF-8 against Python's strict decoder: every 1- and 2-byte string,
    and 3- and 4-byte ones around the edges of the encoding."""
    core = require_native()
    edges = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF, 0xE0]
    edges += [0xED, 0xEE, 0xEF, 0xF0, 0xF4, 0xF5, 0xFF]
    samples = [bytes([a]) for a in range(256)]
    samples += [bytes([a, b]) for a in range(256) for b in range(256)]
    rng = random.Random(SEED)
    samples += [bytes(rng.choice(edges) for _ in range(rng.choice([3, 4]))) for _ in range(20000)]
    disagree = []
    for text in samples:
        try:
            text.decode("utf-8")
            valid = True
        except UnicodeDecodeError:
            valid = False
        data = bytes([0xA0 | len(text)]) + text
        native = core.msgpack_check(data, MAX_DEPTH) is None
        reference = _reference_msgpack.msgpack_check(data, MAX_DEPTH) is None
        if not native == reference == valid:
            disagree.append(text.hex())
    assert not disagree, disagree[:10]


# -- the messages ----------------------------------------------------------------------------
def test_every_problem_has_its_message() -> None:
    """One input per answer of the structure check, worded the same on every codec."""
    cases = [
        (b"", "truncated msgpack: the data ends inside a value at offset 0"),
        (b"\x92\xcb\x00", "truncated msgpack: the data ends inside a value at offset 3"),
        (b"\x92\x01\xc1", "malformed msgpack: invalid opcode '\\xc1' at offset 2"),
        (b"\x90\x00", "malformed msgpack: trailing characters at offset 1"),
        (b"\x91\xa1\x80", not_utf8(1)),
        (nested(MAX_DEPTH + 1), too_deep(MAX_DEPTH)),
        (b"\x91\xdb\x00\x00\x01\x00", bomb_message("str", 1, 6).replace(
            "4294967295 bytes", "256 bytes")),
    ]
    for data, message in cases:
        for codec in CODECS:
            decode_error(codec, data, message)


def test_buffers_are_read_as_their_bytes() -> None:
    """A memoryview of any format or shape decodes as its bytes if they are contiguous; a
    view that is not is the caller's type error, never another exception."""
    first_seeds = dict(reversed(seeds()))  # the first seed of each codec
    for codec, data in first_seeds.items():
        as_ints = np.frombuffer(data + bytes(-len(data) % 4), np.uint8)[: len(data)]
        for view in (memoryview(data), memoryview(as_ints), memoryview(as_ints.reshape(1, -1))):
            assert wire_fuzz.same_decoded(
                CODECS[codec].decode_batch(view), CODECS[codec].decode_batch(data)
            )
        wide = memoryview(np.frombuffer(data[: len(data) // 4 * 4], np.int32))
        assert run(codec, bytes(wide)).kind == run(codec, wide).kind
        with pytest.raises(InputTypeError, match="non-contiguous memoryview"):
            CODECS[codec].decode_batch(memoryview(data)[::2])
        with pytest.raises(InputTypeError, match="data must be bytes, got str"):
            CODECS[codec].decode_batch("93")


def test_what_msgspec_still_refuses_is_placed() -> None:
    """Past the structure check, msgspec refuses map keys that cannot be dict keys and bad
    msgpack timestamps in values it decodes as any value: the message names the event (or
    the namespace) and msgspec's path in it, and a type tag that is no string by its type."""
    raw = msgspec.Raw
    unhashable = enc([1.0, [{"type": "Future", "k": raw(b"\x81\x80\x01")}]])
    bad_time = enc([1.0, [["Future", raw(b"\xd5\xff\x00\x00")]]])
    in_extra_keys = enc(
        [1.0, [{"type": "BlockStored", "block_hashes": [1], "token_ids": [], "block_size": 0,
                "extra_keys": raw(b"\x91\xd5\xff\x00\x00")}]]
    )
    ext_tag = enc([1.0, [{"type": msgspec.msgpack.Ext(5, b"a")}]])
    for codec in ("vllm", "sglang"):
        decode_error(
            codec,
            unhashable,
            "batch[1][0]: malformed msgpack: map keys must be hashable at offset 18 of the event",
        )
        decode_error(codec, bad_time, "batch[1][0][1]: malformed msgpack: invalid MessagePack "
                     "timestamp")
        decode_error(
            codec,
            ext_tag,
            "batch[1][0]: an event map must have a string 'type' key, got 'type' of type ext",
        )
    decode_error("vllm", in_extra_keys, "batch[1][0][...][0]: malformed msgpack: invalid "
                 "MessagePack timestamp")
    for namespace, message in [
        (b"\x81\x80\x01", "malformed msgpack: map keys must be hashable at offset 3 of the "
         "namespace"),
        (b"\x91\xd5\xff\x00\x00", "malformed msgpack: invalid MessagePack timestamp"),
    ]:
        data = enc(["radixmeta", 1, 0.0, "w", 0, [[0, 0, raw(namespace), b"", 0]]])
        where = "batch[5][0][2]" + ("[0]" if namespace[0] == 0x91 else "")
        with pytest.raises(DecodeError) as info:
            CODECS["native"].decode_batch(data)
        assert str(info.value) == f"{where}: {message}"
