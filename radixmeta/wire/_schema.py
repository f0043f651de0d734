"""One table per engine describes its events; the msgspec structs are built from it.

A field is listed once, in the engine's declaration order, with the release
that added it. From that one table come the decoding structs (every field of
every release, so one struct reads all of an era), the encoding structs of
each release (exactly that release's fields, so msgspec writes the engine's
bytes), and the wording of decode errors. Field order matters twice: it is
the array position in the array era, and the key order in the map era.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any

import msgspec

from radixmeta.wire._versions import Version

__all__ = [
    "OPTIONAL_ARRAY",
    "OPTIONAL_INT",
    "OPTIONAL_STR",
    "SIZE",
    "TOKENS",
    "TOKEN_ROWS",
    "EventSchema",
    "Field",
    "Kind",
    "Size",
    "Token",
    "decode_struct",
    "encode_struct",
]

# msgspec checks these while it decodes. The fast path reads token lists as plain ints
# (Field.fast_type) and lets array.array check their range, which is cheaper.
Token = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
Size = Annotated[int, msgspec.Meta(ge=0)]


@dataclass(frozen=True)
class Kind:
    """How a decode error in a field is worded.

    ``expected[d]`` is what the value at nesting depth ``d`` must be (0: the
    field itself, 1: an element, ...); ``limit`` words a range error:
    ``"token"`` (outside ``[0, 2**32)``) or ``"nonnegative"``.
    """

    expected: tuple[str, ...]
    limit: str | None = None


@dataclass(frozen=True)
class Field:
    """One field of an engine's event struct.

    Parameters
    ----------
    name : str
        The engine's field name (the map key).
    since : Version
        The first release that sends it.
    wire_type : type
        What msgspec decodes it as.
    kind : Kind
        Error wording.
    always : bool
        In the map era the field is sent even when ``None``: the engine's
        struct gives it no default, so ``omit_defaults`` keeps it.
    required : bool
        A decoded event without it is malformed.
    fast_type : type, optional
        What the fast path decodes it as, when that differs: token lists are
        decoded unconstrained there (2 ns a token less) and range-checked by
        their conversion, which hands a bad batch to the exact path.
    """

    name: str
    since: Version
    wire_type: Any
    kind: Kind
    always: bool = False
    required: bool = False
    fast_type: Any = None


@dataclass(frozen=True)
class EventSchema:
    """One event type of one engine.

    Parameters
    ----------
    tag : str
        The type tag (the engine's class name).
    fields : tuple of Field
        Every field of every release, in declaration order.
    array_extra : tuple of Field
        Array-era elements after the fields that are not map fields (SGLang
        0.5.18's ``metadata``).
    """

    tag: str
    fields: tuple[Field, ...]
    array_extra: tuple[Field, ...] = ()

    def sent_by(self, version: Version) -> tuple[Field, ...]:
        """The fields release ``version`` declares."""
        return tuple(f for f in self.fields if f.since <= version)

    def array_fields(self, map_since: Version) -> tuple[Field, ...]:
        """The array-era positions after the tag: fields older than the map era, then extras."""
        return tuple(f for f in self.fields if f.since < map_since) + self.array_extra


def decode_struct(
    schema: EventSchema, fields: Sequence[Field], *, maps: bool, fast: bool
) -> type[msgspec.Struct]:
    """A struct that decodes every release of one era of ``schema``'s event.

    Array form: fields are positional, so everything up to the last required
    field is required and the rest default to ``None``; a longer array (a newer
    release) has its extra elements ignored by msgspec. Map form: only
    ``required`` fields are required; unknown keys are ignored. Fields the form
    lacks are class attributes equal to ``None``, so one converter reads both.
    ``fast`` picks each field's ``fast_type``.
    """
    names = {f.name for f in fields}
    types = [(f.fast_type or f.wire_type) if fast else f.wire_type for f in fields]
    if maps:
        required = [f.required for f in fields]
    else:
        last = max((i for i, f in enumerate(fields) if f.required), default=-1)
        required = [i <= last for i in range(len(fields))]
    spec: list[Any] = [
        (f.name, t) if req else (f.name, t, None)
        for f, t, req in zip(fields, types, required, strict=True)
    ]
    absent = {f.name: None for f in (*schema.fields, *schema.array_extra) if f.name not in names}
    return msgspec.defstruct(
        f"{schema.tag}{'Map' if maps else 'Array'}",
        spec,
        tag=schema.tag,
        array_like=not maps,
        kw_only=maps,  # map keys have no positions: required after optional is fine
        gc=False,
        namespace=absent,
        module=__name__,
    )


def encode_struct(
    tag: str, fields: Sequence[Field], *, maps: bool, extra: Sequence[str] = ()
) -> type[msgspec.Struct]:
    """A copy of the engine's own struct of one release, for byte-exact encoding.

    The same options (``tag``, ``array_like`` up to the map era,
    ``omit_defaults``), fields in the same order, and the same defaults: in
    the map era a field without a default in the engine is always sent, one
    with a ``None`` default is omitted when ``None``. msgspec sizes a map's
    header by the struct's declared field count (tag included), so the copy
    must declare exactly the release's fields: 16 in vLLM 0.33 give ``map16``.
    ``extra`` appends always-sent fields (SGLang 0.5.18's ``metadata``).
    """
    spec: list[Any] = [
        (f.name, Any) if f.always or not maps else (f.name, Any, None) for f in fields
    ]
    spec += [(name, Any) for name in extra]
    return msgspec.defstruct(
        tag,
        spec,
        tag=tag,
        array_like=not maps,
        omit_defaults=True,
        gc=False,
        module=__name__,
    )


# -- the wordings fields share ----------------------------------------------------------------
OPTIONAL_INT = Kind(("an integer or nil",))
OPTIONAL_STR = Kind(("a string or nil",))
SIZE = Kind(("an integer",), limit="nonnegative")
TOKENS = Kind(("an array of integers", "an integer"), limit="token")
TOKEN_ROWS = Kind(
    ("an array of arrays of integers, or nil", "an array of integers", "an integer"),
    limit="token",
)
OPTIONAL_ARRAY = Kind(("an array or nil",))
