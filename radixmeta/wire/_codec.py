"""One engine's codec: the decoder and the per-release encoders built from its profile.

The engine modules (:mod:`radixmeta.wire.vllm`, :mod:`radixmeta.wire.sglang`) hold the
facts (field tables, releases, converters) and their documented public functions;
this is the plumbing they share.
"""

from __future__ import annotations

from collections.abc import Mapping

from radixmeta.wire._decode import BatchDecoder, Converter
from radixmeta.wire._encode import Layout, Profile, encode
from radixmeta.wire._scan import SHARED_KINDS, native_scanner
from radixmeta.wire._schema import Kind
from radixmeta.wire.types import AllBlocksCleared, BlockRemoved, BlockStored, EventBatch

__all__ = ["Codec"]

_CLEARED = AllBlocksCleared()  # no fields: every decoded reset is this one immutable instance


class Codec:
    """Decode and encode one engine's batches.

    Parameters
    ----------
    profile : Profile
        The engine's event tables and releases.
    stored, removed : callable
        Converters from a decoded wire struct to ``BlockStored`` and ``BlockRemoved``.
    native_kinds : mapping of Kind to str, optional
        The native scanner kinds of the engine's own field kinds (its hashes),
        for engines whose map-era fields are the first fields of ``BlockStored``
        and ``BlockRemoved`` in order; map-era batches then take the native path.
    """

    def __init__(
        self,
        profile: Profile,
        *,
        stored: Converter,
        removed: Converter,
        native_kinds: Mapping[Kind, str] | None = None,
    ) -> None:
        self.layouts = profile.layouts()
        schemas = (profile.stored, profile.removed, profile.cleared)
        native = None
        if native_kinds is not None:
            native = native_scanner(
                schemas,
                {**SHARED_KINDS, **native_kinds},
                (BlockStored, BlockRemoved, lambda: _CLEARED),
            )
        self.decoder = BatchDecoder(
            schemas,
            profile.map_since,
            {
                profile.stored.tag: stored,
                profile.removed.tag: removed,
                profile.cleared.tag: lambda wire: _CLEARED,
            },
            native,
        )

    def decode(self, data: bytes) -> EventBatch:
        return self.decoder.decode(data)

    def layout(self, version: str) -> Layout:
        return self.layouts.find(version)

    def encode(self, batch: EventBatch, version: str) -> bytes:
        return encode(batch, self.layouts.find(version))
