"""Decode error messages: msgspec's error, reworded to name the batch position and the field.

msgspec already says what failed and where (``Expected `int` >= 0 - at
`$[3][1]```); these functions only translate that path into the engine's
field names and the project's wording, looking the offending value up in a
generic decode of the same bytes. They run only after a decode has failed.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import Any

import msgspec

from radixmeta.wire._schema import Field

__all__ = ["batch_message", "event_message", "malformed_message", "placed_message", "type_name"]

_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.S)
_SEGMENT = re.compile(r"\[(\d+)\]|\.(\w+)")
_GOT = re.compile(r"got `(\w+)`")
_MSGSPEC_NAMES = {"object": "map", "null": "nil", "None": "nil"}
_BATCH_FIELDS = (
    ("timestamp", "a number"),
    ("events", "an array"),
    ("dp_rank", "an integer or nil"),
)
_NAMES: dict[type, str] = {
    type(None): "nil",
    bool: "bool",
    int: "int",
    float: "float",
    str: "str",
    bytes: "bytes",
    list: "array",
    tuple: "array",  # an array as a map key
    dict: "map",
    msgspec.msgpack.Ext: "ext",
    datetime.datetime: "timestamp",  # the msgpack timestamp extension
}


def type_name(value: object) -> str:
    """The msgpack name of a decoded value's type: ``int``, ``str``, ``array``, ``map``..."""
    return _NAMES.get(type(value), type(value).__name__)


def _split(exc: msgspec.DecodeError) -> tuple[str, list[int | str]]:
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    path = match["path"] or ""
    segments: list[int | str] = [
        int(index) if index else key for index, key in _SEGMENT.findall(path)
    ]
    return match["what"], segments


def _got(what: str) -> str:
    match = _GOT.search(what)
    name = match[1] if match else "?"
    return _MSGSPEC_NAMES.get(name, name)


def malformed_message(exc: msgspec.DecodeError, size: int, of: str = "") -> str:
    """Bytes that msgspec cannot read: truncated, an invalid byte, trailing bytes, a map
    key that cannot be a dict key. ``of`` follows an offset: what it counts from, when
    that is not the message (``" of the event"``)."""
    text = str(exc)
    if "truncated" in text:
        return f"truncated msgpack: the data ends inside a value at offset {size}{of}"
    detail = text.removeprefix("MessagePack data is malformed: ")
    detail = detail[:1].lower() + detail[1:]  # msgspec capitalises some ("Invalid UTF-8 ...")
    detail = re.sub(r" \(byte (\d+)\)$", rf" at offset \1{of}", detail)
    return f"malformed msgpack: {detail}"


def placed_message(exc: msgspec.DecodeError, where: str, of: str) -> str:
    """What msgspec refused in one part of a message that passed the structure check (an
    event, a namespace): a map key that cannot be a dict key, a bad msgpack timestamp.

    msgspec's path, when it gives one (``$[1]``, ``$[...][0]`` inside a map), follows
    ``where``; a byte offset counts from the part's first byte, which ``of`` names.
    """
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    if match["path"] is None:
        return f"{where}: {malformed_message(exc, 0, of)}"
    what = match["what"]
    return f"{where}{match['path']}: malformed msgpack: {what[:1].lower()}{what[1:]}"


def batch_message(exc: msgspec.ValidationError) -> str:
    """The batch array itself is wrong: not an array, too short, or a bad element."""
    what, segments = _split(exc)
    if not segments:
        length = re.search(r"at least length \d+, got (\d+)", what)
        if length:
            n = int(length[1])
            return (
                f"batch has {n} element{'s' if n != 1 else ''}; it needs at least "
                "[timestamp, events]"
            )
        return f"batch must be an array [timestamp, events, dp_rank], got {_got(what)}"
    index = segments[0]
    assert isinstance(index, int)
    name, expected = _BATCH_FIELDS[index]
    return f"batch[{index}]: {name} must be {expected}, got {_got(what)}"


def event_message(
    exc: msgspec.ValidationError, body: Any, tag: str, fields: Sequence[Field], maps: bool
) -> str:
    """One event of a known type does not fit its schema.

    Parameters
    ----------
    exc : msgspec.ValidationError
        The error from decoding the event on its own.
    body : list or dict
        The same event, decoded without a type.
    tag : str
        Its type tag.
    fields : sequence of Field
        The fields of its form: in array order for the array form.
    maps : bool
        Whether the event is a map.
    """
    what, segments = _split(exc)
    if not segments:  # the event as a whole: a field is missing
        missing = re.search(r"missing required field `(\w+)`", what)
        if missing:
            return f"{tag}.{missing[1]} is missing"
        length = re.search(r"at least length \d+, got (\d+)", what)
        if length:  # elements count the tag, so the first missing field is at len - 1
            return f"{tag}.{fields[int(length[1]) - 1].name} is missing"
        return f"{tag}: {what}"
    head, rest = segments[0], segments[1:]
    if head == 0:  # the tag itself (a known tag reaches here only by a msgspec surprise)
        return f"{tag}: {what}"
    name = fields[head - 1].name if isinstance(head, int) else head
    kind = next(f.kind for f in fields if f.name == name)
    value = body[head]
    for segment in rest:
        value = value[segment]
    where = f"{tag}.{name}" + "".join(f"[{s}]" if isinstance(s, int) else f".{s}" for s in rest)
    if re.match(r"Expected `int` [<>]=", what):
        if kind.limit == "token":
            return f"{where} = {value} is outside the token range [0, 2**32)"
        return f"{where} must be >= 0, got {value}"
    depth = len(rest)
    if depth < len(kind.expected):
        return f"{where} must be {kind.expected[depth]}, got {type_name(value)}"
    return f"{where}: {what}"
