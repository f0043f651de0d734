"""The native fast path for map-era batches: one pass over the bytes, no object per token.

msgspec makes a Python int for every hash and (unless told otherwise) every
token, and that, not applying the blocks, is most of what a router spends on a
batch. The binding's ``MapBatchScanner`` (``csrc/include/radixmeta/msgpack_batch.hpp``)
reads a batch whose events are all maps of known types with fields of the
expected kinds straight into arrays, and answers ``None`` for anything else;
:class:`~radixmeta.wire._decode.BatchDecoder` then decodes that batch the usual
way, so errors, unknown events and odd encodings keep their exact handling.

A codec opts in by naming the scanner kind of each of its field kinds, and only
when its public event types take the wire fields positionally, in schema order
(vLLM's do; SGLang's rename and reshape some, so it keeps the msgspec path).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from radixmeta.wire._limits import MAX_DEPTH
from radixmeta.wire._schema import (
    OPTIONAL_ARRAY,
    OPTIONAL_INT,
    OPTIONAL_STR,
    SIZE,
    TOKEN_ROWS,
    TOKENS,
    EventSchema,
    Kind,
)
from radixmeta.wire.types import EventBatch

_scanner_class: Any
try:  # the compiled extension; without it every batch takes the msgspec path
    from radixmeta._core import MapBatchScanner as _scanner_class
except ImportError:  # no compiled extension
    _scanner_class = None

__all__ = ["SHARED_KINDS", "native_scanner"]

# The scanner kind of each shared field kind. "nil" fields (extra keys, lookahead
# rows) are taken only when absent or nil: anything else goes the msgspec way.
SHARED_KINDS: Mapping[Kind, str] = {
    OPTIONAL_INT: "int_or_nil",
    OPTIONAL_STR: "str_or_nil",
    SIZE: "size",
    TOKENS: "tokens",
    TOKEN_ROWS: "nil",
    OPTIONAL_ARRAY: "nil",
}

Scan = Callable[[Any], EventBatch | None]


def native_scanner(
    schemas: Sequence[EventSchema],
    kinds: Mapping[Kind, str],
    build: Sequence[Callable[..., Any]],
) -> Scan | None:
    """A function from batch bytes to an :class:`EventBatch`, or ``None`` to decode exactly.

    Parameters
    ----------
    schemas : sequence of EventSchema
        The engine's event types, every field of the map era in order.
    kinds : mapping of Kind to str
        The scanner kind of each field kind the schemas use.
    build : sequence of callable
        Per schema, what makes the public event from the field values in order.

    Returns
    -------
    callable or None
        ``None`` without the compiled extension.
    """
    if _scanner_class is None:
        return None
    specs = [
        (schema.tag, [(f.name, kinds[f.kind], f.required) for f in schema.fields])
        for schema in schemas
    ]
    scanner = _scanner_class(specs, MAX_DEPTH)  # it takes only what check_structure passes
    makers = tuple(build)

    def scan(data: Any) -> EventBatch | None:
        if type(data) is not bytes:  # zmq frames are bytes; anything else goes the usual way
            return None
        scanned = scanner.scan(data)
        if scanned is None:
            return None
        ts, rank, types, values = scanned
        events = [makers[t](*v) for t, v in zip(types, values, strict=True)]
        return EventBatch(ts, events, rank)

    return scan
