"""The SGLang integration's parts that need no SGLang: hashes, startup checks, packaging.

These run in every environment; the tests that drive SGLang itself are in
``test_sglang_backend.py`` (skipped where SGLang is not installed).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from radixmeta.errors import UnsupportedConfigurationError, UnsupportedVersionError
from radixmeta.integrations import sglang as integration
from radixmeta.integrations.sglang._hashes import (
    EventHasher,
    Namespace,
    event_hashes,
    signed,
)

ROOT = Path(__file__).resolve().parent.parent
PATH = np.array([151644, 872, 198, 9064, 374, 279, 6722, 315], dtype=np.uint32)
LORA = "x" * 32


def published(hashes: np.ndarray) -> list[int]:
    return [signed(h) for h in hashes.tolist()]


# Expected values: what SGLang 0.5.23's own RadixCache published for PATH at page
# size 4 in each namespace (computed once with SGLang installed; data, not code).
@pytest.mark.parametrize(
    ("namespace", "names", "dynamo", "expected"),
    [
        (None, {}, False, [-1944566869021170841, 9056173362842263460]),
        (None, {}, True, [-1944566869021170841, 9056173362842263460]),
        (Namespace(None, "s1"), {}, False, [8584150298581109562, 6663409877506898736]),
        (Namespace(None, "s1"), {}, True, [-5010193881979277950, 8410238363890187993]),
        # An extra key SGLang has no adapter name for is not namespaced by default.
        (Namespace(LORA, None), {}, False, [-1944566869021170841, 9056173362842263460]),
        (Namespace(LORA, None), {}, True, [-3316291724371654561, 1127822144013392032]),
        (
            Namespace(LORA, None),
            {LORA: "adapter"},
            False,
            [-3316291724371654561, 1127822144013392032],
        ),
        (
            Namespace("e" + "y" * 32, "s2"),
            {"e" + "y" * 32: "ad2"},
            False,
            [-1818618658779243759, -7359798349943961470],
        ),
        (
            Namespace("e" + "y" * 32, "s2"),
            {"e" + "y" * 32: "ad2"},
            True,
            [-8917814505139846468, -7948536576220680518],
        ),
    ],
)
def test_event_hashes_are_sglangs(
    namespace: Namespace | None, names: dict[str, str], dynamo: bool, expected: list[int]
) -> None:
    got = event_hashes(PATH, 4, namespace, dynamo=dynamo, lora_name=names.get)
    assert got.dtype == np.uint64
    assert published(got) == expected


@pytest.mark.parametrize("dynamo", [False, True])
@pytest.mark.parametrize("page_size", [1, 3])
def test_the_remembering_hasher_is_event_hashes(dynamo: bool, page_size: int) -> None:
    """EventHasher gives event_hashes' answer for shared, split and new paths alike."""
    rng = np.random.default_rng(page_size)
    names = {LORA: "adapter"}
    hasher = EventHasher(dynamo=dynamo, lora_name=names.get, max_pages=40)
    stems = [rng.integers(0, 50, size=30, dtype=np.uint32) for _ in range(3)]
    spaces = [None, Namespace(None, "s"), Namespace(LORA, None), Namespace("e", "t")]
    for _ in range(200):
        stem = stems[int(rng.integers(3))]
        cut = int(rng.integers(0, 31))
        tail = rng.integers(0, 50, size=int(rng.integers(0, 8)), dtype=np.uint32)
        path = np.concatenate((stem[:cut], tail))
        ns = spaces[int(rng.integers(len(spaces)))]
        want = event_hashes(path, page_size, ns, dynamo=dynamo, lora_name=names.get)
        assert hasher(path, page_size, namespace=ns).tolist() == want.tolist()
        assert len(hasher) <= 40 + len(path)
    hasher.clear()
    assert len(hasher) == 0


def test_bigram_pages_hash_pairs() -> None:
    """A bigram page of P pairs hashes like a plain page of the 2P words of its pairs."""
    raw = [5, 6, 7, 8, 9]
    got = event_hashes(np.array(raw[1:], dtype=np.uint32), 2, Namespace(None, None, raw[0]))
    words = np.array([5, 6, 6, 7, 7, 8, 8, 9], dtype=np.uint32)
    assert published(got) == published(event_hashes(words, 4, None))


def ctx(**overrides: Any) -> SimpleNamespace:
    """A stand-in for SGLang's TreeCacheBuildContext: plain attributes only."""
    params = SimpleNamespace(
        eviction_policy="lru",
        eviction_policy_config=None,
        is_eagle=False,
        enable_kv_cache_events=False,
        enable_session_radix_cache=False,
    )
    server_args = SimpleNamespace(
        enable_hierarchical_cache=False,
        disaggregation_decode_retraction_backup=None,
        enable_session_radix_cache=False,
        enable_streaming_session=False,
        enable_lmcache=False,
        enable_flexkv=False,
        enable_unified_cache_external_linker=False,
        enable_kv_cache_sharding=False,
        enable_int8_mamba_checkpoint=False,
    )
    fields: dict[str, Any] = {
        "params": params,
        "server_args": server_args,
        "disable_radix_cache": False,
        "enable_hierarchical_cache": False,
        "is_hybrid_ssm": False,
        "is_hybrid_swa": False,
    }
    for name, value in overrides.items():
        if hasattr(params, name) and name not in fields:
            setattr(params, name, value)
        elif name in fields:
            fields[name] = value
        else:
            setattr(server_args, name, value)
    return SimpleNamespace(**fields)


def test_a_plain_configuration_has_no_problem() -> None:
    assert integration.configuration_problems(ctx()) == []
    assert integration.configuration_problems(ctx(eviction_policy="LFU")) == []


@pytest.mark.parametrize(
    ("overrides", "says"),
    [
        ({"disable_radix_cache": True}, "--disable-radix-cache"),
        ({"enable_hierarchical_cache": True}, "HiCache (--enable-hierarchical-cache)"),
        ({"disaggregation_decode_retraction_backup": "host_pool"}, "host_pool"),
        ({"is_hybrid_ssm": True}, "Mamba"),
        ({"is_hybrid_swa": True}, "sliding-window"),
        ({"enable_session_radix_cache": True}, "--enable-session-radix-cache"),
        ({"enable_streaming_session": True}, "--enable-streaming-session"),
        ({"enable_lmcache": True}, "--enable-lmcache"),
        ({"enable_unified_cache_external_linker": True}, "--enable-unified-cache-external"),
        ({"enable_kv_cache_sharding": True}, "--enable-kv-cache-sharding"),
        ({"enable_int8_mamba_checkpoint": True}, "--enable-int8-mamba-checkpoint"),
        ({"eviction_policy": "slru"}, "--radix-eviction-policy slru is not one of"),
        ({"eviction_policy": "tlru"}, "lru, lfu, fifo, priority): SGLang keeps T-LRU"),
        ({"eviction_policy": "mru"}, "most-recently-used order is not implemented"),
        ({"eviction_policy": "filo"}, "last-in-first-out order is not implemented"),
        ({"eviction_policy": "lifo"}, "SGLang 0.5.23 has no such policy either"),
        ({"eviction_policy_config": {"x": 1}}, "--radix-eviction-policy-config"),
        ({"is_eagle": True, "enable_kv_cache_events": True}, "EAGLE bigram keys"),
    ],
)
def test_unsupported_configurations_are_refused_by_name(
    overrides: dict[str, Any], says: str
) -> None:
    problems = integration.configuration_problems(ctx(**overrides))
    assert len(problems) == 1 and says in problems[0], problems
    with pytest.raises(UnsupportedConfigurationError, match="cannot serve this configuration"):
        integration.create_cache(ctx(**overrides))


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(UnsupportedConfigurationError) as info:
        integration.create_cache(ctx(is_hybrid_ssm=True, enable_hierarchical_cache=True))
    assert "HiCache" in str(info.value) and "Mamba" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_eagle_without_events_is_supported() -> None:
    assert integration.configuration_problems(ctx(is_eagle=True)) == []


def test_the_entry_point_is_declared() -> None:
    """pip install radixmeta declares the plugin SGLang's loader calls."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    eps = project["project"]["entry-points"]["sglang.srt.plugins"]
    assert eps == {"radixmeta": "radixmeta.integrations.sglang:register"}
    module, _, attr = eps["radixmeta"].partition(":")
    assert getattr(sys.modules[module], attr) is integration.register
    packages = project["tool"]["setuptools"]["packages"]
    assert {"radixmeta.integrations", "radixmeta.integrations.sglang"} <= set(packages)


def test_the_integration_imports_neither_sglang_nor_torch() -> None:
    code = (
        "import sys, radixmeta, radixmeta.integrations.sglang as s\n"
        "s.configuration_problems, s.register, s.TESTED_VERSIONS\n"
        "print(sorted(m for m in ('sglang', 'torch') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert out.stdout.strip() == "[]"


def test_tested_versions_are_named() -> None:
    assert integration.TESTED_VERSIONS == ("0.5.23",)
    assert integration.BACKEND_NAME == "radixmeta"


@pytest.mark.skipif(integration.sglang_version() is not None, reason="sglang is installed here")
def test_registration_without_sglang_says_so() -> None:
    with pytest.raises(UnsupportedVersionError, match=r"tested with sglang 0\.5\.23"):
        integration.register()
    with pytest.raises(ModuleNotFoundError):
        integration.RadixMetaPrefixCache  # noqa: B018  (the lookup is the test)
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        integration.Nothing  # noqa: B018
