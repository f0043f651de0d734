"""The decoding driver shared by the engine codecs: a typed fast path and an exact slow path.

Fast path: one msgspec decode of the whole batch into typed structs (a tagged
union of the era's three event types), then one converter call per event. It
handles every well-formed batch whose events are all arrays or all maps and
all of known types, which is every batch a released engine publishes.

Slow path, taken when the fast path raises: the batch is decoded with its
events left as raw msgpack, and each event is decoded on its own with the
decoder of its form. This is what makes mixed array/map batches (a rollout)
and unknown event types (kept as :class:`UnknownEvent`) work, and what gives
an error its position. A batch either decodes whole or raises
:class:`~radixmeta.errors.DecodeError`; no partial batch is returned.

Before either path, the bytes pass :func:`~radixmeta.wire._limits.check_structure`
(one msgpack value, nested at most ``MAX_DEPTH`` deep, no length claimed that the
bytes cannot hold), so msgspec never recurses past the limit nor allocates for a
length bomb; the native scanner of map-era batches enforces the same limits itself.

msgspec cannot put ``array_like`` and map structs in one union, hence two
fast decoders; the first event's header byte picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Union

import msgspec

from radixmeta.errors import DecodeError
from radixmeta.wire._limits import as_message, check_structure
from radixmeta.wire._messages import (
    batch_message,
    event_message,
    malformed_message,
    placed_message,
    type_name,
)
from radixmeta.wire._normalise import Invalid
from radixmeta.wire._schema import EventSchema, Field, decode_struct
from radixmeta.wire._versions import Version
from radixmeta.wire.types import Event, EventBatch, UnknownEvent

__all__ = ["BatchDecoder"]

Converter = Callable[[Any], Event]


class _RawBatch(msgspec.Struct, array_like=True, gc=False):
    # Positional on the wire: [ts, events, dp_rank, ...]; later elements are ignored.
    ts: float
    events: list[msgspec.Raw]
    dp_rank: int | None = None


_RAW_BATCH = msgspec.msgpack.Decoder(_RawBatch)
_GENERIC = msgspec.msgpack.Decoder()


def _is_map(header: int) -> bool:
    return 0x80 <= header <= 0x8F or header in (0xDE, 0xDF)


def _is_array(header: int) -> bool:
    return 0x90 <= header <= 0x9F or header in (0xDC, 0xDD)


# Bytes taken by a msgpack header byte and its length or value bytes, for the
# timestamp and array headers that precede the first event.
_ARRAY_HEAD = {0xDC: 3, 0xDD: 5}
_NUMBER_SIZE = {0xCA: 5, 0xCB: 9, 0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9}
_NUMBER_SIZE |= {0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}


def _first_event_is_map(data: Any) -> bool:
    """Whether the first event of a well-formed batch is a map; ``True`` when unsure."""
    try:
        head = data[0]
        i = 1 if 0x90 <= head <= 0x9F else _ARRAY_HEAD[head]
        ts = data[i]
        i += 1 if ts < 0x80 or ts >= 0xE0 else _NUMBER_SIZE[ts]
        events = data[i]
        i += 1 if 0x90 <= events <= 0x9F else _ARRAY_HEAD[events]
        return not _is_array(data[i])
    except (IndexError, KeyError):
        return True


def _shown(name: str, value: object) -> str:
    """``name = 5`` for a scalar; for anything else its type, so that a message stays short
    and the same from run to run (an ext's repr names its address)."""
    if value is None or isinstance(value, (bool, int, float)):
        return f"{name} = {value!r}"
    return f"{name} of type {type_name(value)}"


def _malformed(exc: msgspec.DecodeError, where: str = "") -> DecodeError:
    # What check_structure leaves to msgspec: a map key that cannot be a dict key (an
    # array or a map) or a bad msgpack timestamp, in a value decoded as any value. With
    # `where`, msgspec read one event: its offsets count from the event's first byte.
    if not where:
        return DecodeError(malformed_message(exc, 0))
    return DecodeError(placed_message(exc, where, " of the event"))


def _generic(where: str, raw: bytes) -> Any:
    try:
        return _GENERIC.decode(raw)
    except msgspec.DecodeError as exc:
        raise _malformed(exc, where) from None


class BatchDecoder:
    """Decodes one engine's batches.

    Parameters
    ----------
    events : sequence of EventSchema
        The engine's event types.
    map_since : Version
        The first map-era release: fields added from it on have no array position.
    converters : mapping of str to callable
        Per tag, the function from a decoded wire struct to the public event.
        It may raise :class:`~radixmeta.wire._normalise.Invalid`.
    native : callable, optional
        Tried first on map-era batches (:mod:`radixmeta.wire._scan`); its
        ``None`` sends the batch down the two msgspec paths.
    """

    def __init__(
        self,
        events: Sequence[EventSchema],
        map_since: Version,
        converters: Mapping[str, Converter],
        native: Callable[[Any], EventBatch | None] | None = None,
    ) -> None:
        self._native = native
        self._convert: dict[type, Converter] = {}
        self._fields: dict[tuple[str, bool], tuple[Field, ...]] = {}
        # Per form (array, map) and path (fast, exact): the structs of the three events.
        unions: dict[tuple[bool, bool], list[type]] = {}
        for schema in events:
            for maps in (False, True):
                fields = schema.fields if maps else schema.array_fields(map_since)
                self._fields[(schema.tag, maps)] = fields
                for fast in (False, True):
                    struct = decode_struct(schema, fields, maps=maps, fast=fast)
                    self._convert[struct] = converters[schema.tag]
                    unions.setdefault((maps, fast), []).append(struct)
        self._fast: dict[bool, msgspec.msgpack.Decoder[Any]] = {}
        self._single: dict[bool, msgspec.msgpack.Decoder[Any]] = {}
        for (maps, fast), structs in unions.items():
            union: Any = Union[tuple(structs)]  # noqa: UP007 (a runtime-built union)
            if not fast:
                self._single[maps] = msgspec.msgpack.Decoder(union)
                continue
            batch = msgspec.defstruct(
                "Batch",
                [("ts", float), ("events", list[union]), ("dp_rank", int | None, None)],
                array_like=True,
                gc=False,
                module=__name__,
            )
            self._fast[maps] = msgspec.msgpack.Decoder(batch)

    def decode(self, data: bytes | bytearray | memoryview) -> EventBatch:
        """Decode one batch; see the module docstring for the two paths."""
        data = as_message(data)
        is_map = _first_event_is_map(data)
        if is_map and self._native is not None:
            batch = self._native(data)  # what it takes passes check_structure
            if batch is not None:
                return batch
        check_structure(data)  # no deeper than MAX_DEPTH, no length bombs: msgspec may read
        try:
            wire = self._fast[is_map].decode(data)
            convert = self._convert
            events = [convert[type(e)](e) for e in wire.events]
        except (msgspec.DecodeError, Invalid):
            return self._decode_exactly(data)
        return EventBatch(wire.ts, events, wire.dp_rank)

    def _decode_exactly(self, data: Any) -> EventBatch:
        try:
            raw = _RAW_BATCH.decode(data)
        except msgspec.ValidationError as exc:
            raise DecodeError(batch_message(exc)) from None
        except msgspec.DecodeError as exc:
            raise _malformed(exc) from None
        events = [self._event(f"batch[1][{i}]", bytes(e)) for i, e in enumerate(raw.events)]
        return EventBatch(raw.ts, events, raw.dp_rank)

    def _event(self, where: str, raw: bytes) -> Event:
        maps = _is_map(raw[0])
        if not maps and not _is_array(raw[0]):
            got = type_name(_generic(where, raw))
            msg = f"{where}: an event must be an array or a map, got {got}"
            raise DecodeError(msg)
        try:
            wire = self._single[maps].decode(raw)
        except msgspec.ValidationError as exc:
            return self._unknown_or_raise(where, raw, maps, exc)
        except msgspec.DecodeError as exc:  # what slicing out raw events does not check
            raise _malformed(exc, where) from None
        try:
            return self._convert[type(wire)](wire)
        except Invalid as exc:
            msg = f"{where}: {exc}"
            raise DecodeError(msg) from None

    def _unknown_or_raise(
        self, where: str, raw: bytes, maps: bool, exc: msgspec.ValidationError
    ) -> Event:
        body = _generic(where, raw)
        if maps:
            tag = body.get("type")
            if not isinstance(tag, str):
                got = "no 'type' key" if "type" not in body else _shown("'type'", tag)
                msg = f"{where}: an event map must have a string 'type' key, got {got}"
                raise DecodeError(msg)
        else:
            tag = body[0] if body else None
            if not isinstance(tag, str):
                got = "an empty array" if not body else type_name(tag)
                msg = f"{where}: an event array must start with its type tag (a string), got {got}"
                raise DecodeError(msg)
        fields = self._fields.get((tag, maps))
        if fields is None:
            return UnknownEvent(tag, raw)
        msg = f"{where}: {event_message(exc, body, tag, fields, maps)}"
        raise DecodeError(msg) from None
