"""The encoding driver shared by the engine codecs: one layout per range of releases.

A layout holds copies of the engine's own structs for those releases (see
:func:`~radixmeta.wire._schema.encode_struct`), so msgspec writes the same
bytes the engine's encoder writes: the same field counts in the array era, the
same omitted fields and map header sizes in the map era. An event field the
release does not have is not sent (the event is projected onto the release).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import msgspec
import numpy as np

from radixmeta._keys import as_int, check_int
from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.wire._normalise import hash_list, parent_value, token_array
from radixmeta.wire._schema import EventSchema, encode_struct
from radixmeta.wire._versions import Version, VersionTable
from radixmeta.wire.types import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    UnknownEvent,
)

__all__ = ["Layout", "Profile", "encode"]

_ENCODER = msgspec.msgpack.Encoder()  # default settings, as both engines use


@dataclass(frozen=True)
class Layout:
    """What one range of releases sends.

    Attributes
    ----------
    since : Version
        The first release of the range.
    maps : bool
        Events are tagged maps (else tagged arrays).
    batch_rank : bool
        The batch has its third element, the dp rank.
    stored, removed, cleared : type
        Copies of the engine's event structs.
    signed : bool
        Hashes go out as signed int64 (SGLang) rather than unsigned (vLLM).
    pairs : bool
        The engine sends ``token_pairs`` events as bigram pairs (SGLang).
    salted : type or None
        SGLang 0.5.18's ``BlockStoredWithMetadata``, used for salted stores.
    """

    since: Version
    maps: bool
    batch_rank: bool
    stored: type[msgspec.Struct]
    removed: type[msgspec.Struct]
    cleared: type[msgspec.Struct]
    signed: bool
    pairs: bool
    salted: type[msgspec.Struct] | None = None

    @property
    def declared_fields(self) -> dict[str, int]:
        """Per event type, the fields its struct declares plus the tag (sizes map headers)."""
        structs = {"BlockStored": self.stored, "BlockRemoved": self.removed}
        return {tag: len(s.__struct_fields__) + 1 for tag, s in structs.items()}


@dataclass(frozen=True)
class Profile:
    """One engine's encoding rules across its releases.

    Parameters
    ----------
    engine : str
        ``"vLLM"`` or ``"SGLang"``.
    stored, removed, cleared : EventSchema
        The engine's event tables.
    map_since, rank_since : Version
        First release with map events; first with the batch's dp rank.
    end : Version
        First release not supported; ``newest`` shows the newest supported one.
    signed, pairs : bool
        As in :class:`Layout`.
    salted_since : Version or None
        First release with SGLang's salted ``metadata`` element (array era only).
    """

    engine: str
    stored: EventSchema
    removed: EventSchema
    cleared: EventSchema
    map_since: Version
    rank_since: Version
    end: Version
    newest: str
    signed: bool
    pairs: bool
    salted_since: Version | None = None

    def layouts(self) -> VersionTable[Layout]:
        """Every layout, keyed by the release that introduced it."""
        starts = {f.since for s in (self.stored, self.removed) for f in s.fields}
        starts |= {self.map_since, self.rank_since}
        if self.salted_since is not None:
            starts.add(self.salted_since)
        entries = [(v, self._layout(v)) for v in sorted(starts)]
        return VersionTable(self.engine, entries, self.end, self.newest)

    def _layout(self, version: Version) -> Layout:
        maps = version >= self.map_since
        stored = self.stored.sent_by(version)
        salted = None
        if not maps and self.salted_since is not None and version >= self.salted_since:
            salted = encode_struct(self.stored.tag, stored, maps=False, extra=["metadata"])
        return Layout(
            since=version,
            maps=maps,
            batch_rank=version >= self.rank_since,
            stored=encode_struct(self.stored.tag, stored, maps=maps),
            removed=encode_struct(self.removed.tag, self.removed.sent_by(version), maps=maps),
            cleared=encode_struct(self.cleared.tag, (), maps=maps),
            signed=self.signed,
            pairs=self.pairs,
            salted=salted,
        )


def _value(event: Any, name: str, layout: Layout) -> Any:
    """One field of an event as the engine sends it."""
    if name == "block_hashes":
        return hash_list(event, layout.signed)
    if name == "parent_block_hash":
        return parent_value(event, layout.signed)
    if name == "token_ids":
        tokens: list[int] = token_array(event.token_ids, "token_ids").tolist()
        if layout.pairs and event.token_pairs:
            if len(tokens) < 2:
                msg = f"token_pairs needs at least 2 tokens, got {len(tokens)}"
                raise InvalidInputError(msg)
            return [[a, b] for a, b in pairwise(tokens)]
        return tokens
    if name == "block_size":
        return check_int("block_size", event.block_size, 0)
    return getattr(event, name)


def _values(event: Any, names: Sequence[str], layout: Layout) -> list[Any]:
    return [_value(event, name, layout) for name in names]


def _event(index: int, event: object, layout: Layout) -> Any:
    if isinstance(event, BlockStored):
        if layout.salted is not None and event.cache_salt is not None:
            values = _values(event, layout.salted.__struct_fields__[:-1], layout)
            return layout.salted(*values, {"cache_salt": event.cache_salt})
        return layout.stored(*_values(event, layout.stored.__struct_fields__, layout))
    if isinstance(event, BlockRemoved):
        return layout.removed(*_values(event, layout.removed.__struct_fields__, layout))
    if isinstance(event, AllBlocksCleared):
        return layout.cleared()
    if isinstance(event, UnknownEvent):
        return msgspec.Raw(event.raw)  # sent back exactly as it came
    msg = (
        f"batch.events[{index}] must be a BlockStored, BlockRemoved, AllBlocksCleared or "
        f"UnknownEvent, got {type(event).__name__}"
    )
    raise InputTypeError(msg)


def encode(batch: EventBatch, layout: Layout) -> bytes:
    """``batch`` in ``layout``'s bytes: the positional array ``[ts, events(, dp_rank)]``."""
    if not isinstance(batch, EventBatch):
        msg = f"batch must be an EventBatch, got {type(batch).__name__}"
        raise InputTypeError(msg)
    timestamp = batch.timestamp
    if isinstance(timestamp, bool) or not isinstance(timestamp, (int, float, np.floating)):
        msg = f"batch.timestamp must be a number, got {type(timestamp).__name__}"
        raise InputTypeError(msg)
    events = [_event(i, e, layout) for i, e in enumerate(batch.events)]
    items: list[Any] = [float(timestamp), events]  # engines always send a float64
    if layout.batch_rank:
        rank = batch.dp_rank
        items.append(None if rank is None else as_int("dp_rank", rank))
    return _ENCODER.encode(items)
