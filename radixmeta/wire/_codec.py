"""One engine's codec: the decoder and the per-release encoders built from its profile.

The engine modules (:mod:`radixmeta.wire.vllm`, :mod:`radixmeta.wire.sglang`) hold the
facts (field tables, releases, converters) and their documented public functions;
this is the plumbing they share.
"""

from __future__ import annotations

from radixmeta.wire._decode import BatchDecoder, Converter
from radixmeta.wire._encode import Layout, Profile, encode
from radixmeta.wire.types import AllBlocksCleared, EventBatch

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
    """

    def __init__(self, profile: Profile, *, stored: Converter, removed: Converter) -> None:
        self.layouts = profile.layouts()
        self.decoder = BatchDecoder(
            (profile.stored, profile.removed, profile.cleared),
            profile.map_since,
            {
                profile.stored.tag: stored,
                profile.removed.tag: removed,
                profile.cleared.tag: lambda wire: _CLEARED,
            },
        )

    def decode(self, data: bytes) -> EventBatch:
        return self.decoder.decode(data)

    def layout(self, version: str) -> Layout:
        return self.layouts.find(version)

    def encode(self, batch: EventBatch, version: str) -> bytes:
        return encode(batch, self.layouts.find(version))
