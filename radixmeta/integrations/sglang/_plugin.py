"""Registration with SGLang, its version check, and the startup check of its configuration.

Nothing here imports SGLang at module import: :func:`register` runs in every
SGLang process that loads plugins (scheduler, DP controller, engine), so it
only registers a factory; the backend and torch are imported when SGLang calls
that factory, in the scheduler that builds the cache.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from typing import Any

from radixmeta.errors import UnsupportedConfigurationError, UnsupportedVersionError

__all__ = [
    "BACKEND_NAME",
    "EVICTION_POLICIES",
    "TESTED_VERSIONS",
    "configuration_problems",
    "create_cache",
    "interface_problems",
    "register",
    "sglang_version",
]

BACKEND_NAME = "radixmeta"
# The SGLang releases whose cache interface the backend was written and tested against.
TESTED_VERSIONS: tuple[str, ...] = ("0.5.23",)

# What the backend needs from SGLang, by module: it is refused (with this list)
# where a release lacks any of it, instead of failing on the scheduler's first step.
_INTERFACE: dict[str, tuple[str, ...]] = {
    "sglang.srt.mem_cache.registry": ("register_radix_cache_backend", "get_radix_cache_factory"),
    "sglang.srt.mem_cache.base_prefix_cache": (
        "BasePrefixCache",
        "MatchResult",
        "InsertResult",
        "EvictResult",
        "IncLockRefResult",
        "DecLockRefResult",
        "DecLockRefParams",
        "TreeLock",
    ),
    "sglang.srt.disaggregation.kv_events": (
        "BlockStored",
        "BlockRemoved",
        "AllBlocksCleared",
        "StorageMedium",
    ),
    "sglang.srt.mem_cache.events": ("KvEventLoraNames",),
}
# The methods SGLang declares abstract that the backend implements; a release with
# others has changed the contract.
_ABSTRACT = frozenset(
    {"reset", "match_prefix", "checkpoint", "evict", "inc_lock_ref", "dec_lock_ref"}
)
# SGLang's eviction policy names that radixmeta implements, with the same meaning
# (docs/cache.md gives the orders); the others are refused at startup.
EVICTION_POLICIES = ("lru", "lfu", "fifo", "priority")
# The other names SGLang 0.5.23 takes (its --radix-eviction-policy choices are lru,
# lfu, slru, priority and tlru; its strategy table adds fifo, mru and filo), and why
# each is refused.
_REFUSED_POLICIES = {
    "slru": "its segmented order (hit count past a threshold, then recency) is not implemented",
    "tlru": "SGLang keeps T-LRU's per-branch history only in its own UnifiedRadixCache",
    "mru": "a most-recently-used order is not implemented",
    "filo": "a last-in-first-out order is not implemented",
}
_MATCH_FIELDS = ("device_prefix_len", "last_device_node", "last_host_node", "best_match_node")


def sglang_version() -> str | None:
    """The installed SGLang release, from its metadata (no import), or None if absent."""
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def interface_problems() -> list[str]:
    """What the installed SGLang lacks of the interface the backend uses (empty: none).

    Imports the SGLang modules the backend imports, and compares the abstract
    methods of ``BasePrefixCache`` and the fields of ``MatchResult`` with the
    ones it was written for.
    """
    problems: list[str] = []
    modules: dict[str, Any] = {}
    for name, attributes in _INTERFACE.items():
        try:
            modules[name] = importlib.import_module(name)
        except ImportError as exc:
            problems.append(f"module {name} cannot be imported ({exc})")
            continue
        problems.extend(
            f"{name}.{attr} is missing"
            for attr in attributes
            if not hasattr(modules[name], attr)
        )
    base = modules.get("sglang.srt.mem_cache.base_prefix_cache")
    if base is not None and hasattr(base, "BasePrefixCache"):
        abstract = frozenset(getattr(base.BasePrefixCache, "__abstractmethods__", ()))
        if abstract != _ABSTRACT:
            problems.append(
                f"BasePrefixCache's abstract methods are {sorted(abstract)}, "
                f"not {sorted(_ABSTRACT)}"
            )
        if not callable(getattr(base.BasePrefixCache, "path_device_indices", None)):
            problems.append("BasePrefixCache.path_device_indices is missing")
    if base is not None and hasattr(base, "MatchResult"):
        fields = getattr(base.MatchResult, "_fields", ())
        missing = [f for f in _MATCH_FIELDS if f not in fields]
        if missing:
            problems.append(f"MatchResult has no field {', '.join(missing)}")
    return problems


def _tested() -> str:
    return ", ".join(TESTED_VERSIONS)


def register() -> None:
    """Register the ``radixmeta`` radix-cache backend with SGLang (its plugin entry point).

    Called by SGLang's plugin loader (entry-point group ``sglang.srt.plugins``)
    in each of its processes; calling it again does nothing. On a release other
    than :data:`TESTED_VERSIONS` it warns; where the interface differs it still
    registers, but selecting the backend then fails at startup naming what
    differs, so an unrelated server is not affected.

    Raises
    ------
    UnsupportedVersionError
        SGLang has no radix-cache backend registry (releases before it).
    """
    # The DP dispatcher's hook first: it does not depend on the cache registry,
    # and registers nothing unless its switch is on.
    from radixmeta.integrations.sglang.dispatch import register_hooks

    register_hooks()
    version = sglang_version()
    try:
        registry = importlib.import_module("sglang.srt.mem_cache.registry")
    except ImportError as exc:
        found = "sglang is not installed" if version is None else f"sglang {version} has no "
        if version is not None:
            found += "radix-cache backend registry (sglang.srt.mem_cache.registry)"
        msg = f"{found}: radixmeta's backend is tested with sglang {_tested()}"
        raise UnsupportedVersionError(msg) from exc
    if registry.get_radix_cache_factory(BACKEND_NAME) is not None:
        return
    problems = interface_problems()
    if problems:
        msg = (
            f"radixmeta's SGLang backend does not support sglang {version}: "
            f"{'; '.join(problems)}. Tested with sglang {_tested()}."
        )
        warnings.warn(msg, RuntimeWarning, stacklevel=2)
        registry.register_radix_cache_backend(BACKEND_NAME, _refuse(msg))
        return
    if version not in TESTED_VERSIONS:
        warnings.warn(
            f"radixmeta's SGLang backend is tested with sglang {_tested()}; found {version}. "
            "Its cache interface is the expected one, but the release is untested.",
            RuntimeWarning,
            stacklevel=2,
        )
    registry.register_radix_cache_backend(BACKEND_NAME, create_cache)


def _refuse(message: str) -> Any:
    def factory(ctx: Any) -> Any:
        raise UnsupportedVersionError(message)

    return factory


def configuration_problems(ctx: Any) -> list[str]:
    """Why the backend cannot serve the configuration in ``ctx`` (empty: it can).

    ``ctx`` is SGLang's ``TreeCacheBuildContext``; only plain attributes are
    read, so any object with them will do.
    """
    args = ctx.server_args
    params = ctx.params

    def flag(name: str) -> Any:
        return getattr(args, name, None)

    problems: list[str] = []
    if ctx.disable_radix_cache:
        problems.append(
            "--disable-radix-cache turns prefix caching off: there is no tree to back; "
            "drop --radix-cache-backend"
        )
    if ctx.enable_hierarchical_cache or flag("enable_hierarchical_cache"):
        problems.append(
            "HiCache (--enable-hierarchical-cache) needs host tiers and storage hooks "
            "that the radixmeta backend does not implement"
        )
    if flag("disaggregation_decode_retraction_backup") == "host_pool":
        problems.append(
            "--disaggregation-decode-retraction-backup host_pool needs HiCache's host pool"
        )
    if ctx.is_hybrid_ssm:
        problems.append("Mamba (hybrid SSM) models keep state that only UnifiedRadixCache tracks")
    if ctx.is_hybrid_swa:
        problems.append(
            "sliding-window (hybrid SWA) models need a per-window tree that the radixmeta "
            "backend does not keep"
        )
    for name, what in (
        ("enable_session_radix_cache", "--enable-session-radix-cache"),
        ("enable_streaming_session", "--enable-streaming-session"),
        ("enable_lmcache", "--enable-lmcache"),
        ("enable_flexkv", "--enable-flexkv"),
        ("enable_unified_cache_external_linker", "--enable-unified-cache-external-linker"),
        ("enable_kv_cache_sharding", "--enable-kv-cache-sharding"),
        ("enable_int8_mamba_checkpoint", "--enable-int8-mamba-checkpoint"),
    ):
        if flag(name) or getattr(params, name, None):
            problems.append(f"{what} needs SGLang's own UnifiedRadixCache")
    policy = str(getattr(params, "eviction_policy", "lru")).lower()
    if policy not in EVICTION_POLICIES:
        reason = _REFUSED_POLICIES.get(policy, "SGLang 0.5.23 has no such policy either")
        problems.append(
            f"--radix-eviction-policy {policy} is not one of radixmeta's "
            f"({', '.join(EVICTION_POLICIES)}): {reason}"
        )
    if getattr(params, "eviction_policy_config", None):
        problems.append(
            "--radix-eviction-policy-config has no meaning for radixmeta's eviction policies"
        )
    if getattr(params, "is_eagle", False) and getattr(params, "enable_kv_cache_events", False):
        problems.append(
            "KV events with EAGLE bigram keys: the backend caches bigram keys but does not "
            "publish their events; drop --kv-events-config or the speculative algorithm"
        )
    return problems


def create_cache(ctx: Any) -> Any:
    """SGLang's factory for the backend: check the configuration, then build the cache.

    Raises
    ------
    UnsupportedConfigurationError
        The configuration uses something the backend does not implement; the
        message lists every such setting.
    """
    problems = configuration_problems(ctx)
    if problems:
        msg = "--radix-cache-backend radixmeta cannot serve this configuration: " + "; ".join(
            problems
        )
        raise UnsupportedConfigurationError(msg)
    from radixmeta.integrations.sglang.backend import RadixMetaPrefixCache

    return RadixMetaPrefixCache(ctx.params)
