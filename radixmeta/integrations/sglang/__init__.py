"""radixmeta as SGLang's radix cache: ``--radix-cache-backend radixmeta``.

Installing radixmeta declares an entry point in SGLang's plugin group
``sglang.srt.plugins``; SGLang calls :func:`register` in each of its processes,
which registers the backend under the name ``radixmeta``. Selecting it builds a
:class:`~radixmeta.integrations.sglang.backend.RadixMetaPrefixCache` in each
scheduler. See ``docs/sglang.md``.

This package imports SGLang only when SGLang itself calls it (or when
``RadixMetaPrefixCache`` is looked up here); radixmeta never depends on SGLang.
"""

from __future__ import annotations

from typing import Any

from radixmeta.integrations.sglang._plugin import (
    BACKEND_NAME,
    EVICTION_POLICIES,
    TESTED_VERSIONS,
    configuration_problems,
    create_cache,
    interface_problems,
    register,
    sglang_version,
)

__all__ = [
    "BACKEND_NAME",
    "EVICTION_POLICIES",
    "TESTED_VERSIONS",
    "RadixMetaPrefixCache",
    "configuration_problems",
    "create_cache",
    "interface_problems",
    "register",
    "sglang_version",
]


def __getattr__(name: str) -> Any:
    # The backend class imports SGLang and torch: only on demand.
    if name == "RadixMetaPrefixCache":
        from radixmeta.integrations.sglang.backend import RadixMetaPrefixCache

        return RadixMetaPrefixCache
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)
