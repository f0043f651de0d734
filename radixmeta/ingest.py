"""The old path of the engine-event converter, now :mod:`radixmeta.events.ingest`.

Kept so that ``from radixmeta.ingest import ...`` goes on working: the names here are the
very objects of the events package (no warning; nobody is asked to move yet).
"""

from __future__ import annotations

from radixmeta.events.ingest import (
    DEFAULT_TIERS,
    BatchConverter,
    ConversionCounts,
    engine_batch,
    extras_tag,
    namespace_of,
)

__all__ = [
    "DEFAULT_TIERS",
    "BatchConverter",
    "ConversionCounts",
    "engine_batch",
    "extras_tag",
    "namespace_of",
]
