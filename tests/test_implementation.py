"""Backend selection (RADIXMETA_IMPLEMENTATION) and API parity of the two cores."""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import radixmeta
from radixmeta import _reference

PACKAGE_DIR = Path(radixmeta.__file__).resolve().parent
API_CLASSES = ("CacheCore", "Node", "MatchResult", "EvictResult")


def run_python(code: str, implementation: str | None) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a fresh interpreter with the given RADIXMETA_IMPLEMENTATION."""
    env = dict(os.environ)
    env.pop("RADIXMETA_IMPLEMENTATION", None)
    if implementation is not None:
        env["RADIXMETA_IMPLEMENTATION"] = implementation
    # Import this very checkout, installed or not.
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE_DIR.parent), env.get("PYTHONPATH", "")) if p
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


REPORT = (
    "import radixmeta; print(radixmeta.implementation, radixmeta.RadixCache.__mro__[1].__module__)"
)


@pytest.mark.parametrize("value", [None, "", "native", "cpp", " Native "])
def test_native_is_the_default(native: ModuleType, value: str | None) -> None:
    proc = run_python(REPORT, value)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["native", "radixmeta._core"]


@pytest.mark.parametrize("value", ["python", "PYTHON", " python "])
def test_python_selects_the_reference(value: str) -> None:
    proc = run_python(REPORT, value)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["python", "radixmeta._reference"]


def test_invalid_value_is_a_clear_import_error() -> None:
    proc = run_python("import radixmeta", "rust")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "ImportError: RADIXMETA_IMPLEMENTATION must be 'native' or 'python', got 'rust'"


def test_public_classes_come_from_the_active_backend() -> None:
    backend = sys.modules[radixmeta.RadixCache.__mro__[1].__module__]
    assert radixmeta.implementation == ("python" if backend is _reference else "native")
    for name in ("Node", "MatchResult", "EvictResult"):
        assert getattr(radixmeta, name) is getattr(backend, name)
    cache = radixmeta.RadixCache()
    cache.insert([1, 2])
    match = cache.match_prefix([1, 2])
    assert isinstance(match, radixmeta.MatchResult)
    assert isinstance(match.node, radixmeta.Node)
    assert isinstance(cache.evict(2), radixmeta.EvictResult)


# -- hypothesis stays optional ------------------------------------------------------------
TESTING_KITS = ("testing.py", "testing_meta.py")  # the modules that may import hypothesis


def test_only_radixmeta_testing_imports_hypothesis() -> None:
    sources = sorted(PACKAGE_DIR.glob("*.py")) + sorted(PACKAGE_DIR.glob("*.pyx"))
    assert {p.name for p in sources} >= set(TESTING_KITS)
    offenders = []
    for path in sources:
        if path.name in TESTING_KITS:
            continue
        text = path.read_text()
        if path.suffix == ".pyx":  # not Python syntax: look for the import lines
            lines = [ln.strip() for ln in text.splitlines()]
            if any(ln.startswith(("import hypothesis", "from hypothesis")) for ln in lines):
                offenders.append(path.name)
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            if any(n == "hypothesis" or n.startswith("hypothesis.") for n in names):
                offenders.append(path.name)
    assert offenders == []


def test_importing_the_library_does_not_import_hypothesis() -> None:
    code = (
        "import importlib, pkgutil, sys, radixmeta\n"
        "for info in pkgutil.iter_modules(radixmeta.__path__):\n"
        "    if info.name in ('testing', 'testing_meta', '__main__'):\n"
        "        continue\n"
        "    try:\n"
        "        importlib.import_module('radixmeta.' + info.name)\n"
        "    except ImportError:\n"
        "        if info.name != '_core':  # the extension may be missing here\n"
        "            raise\n"
        "print('hypothesis' in sys.modules)\n"
    )
    proc = run_python(code, "python")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


# -- API parity ---------------------------------------------------------------------------
def public_names(cls: type) -> set[str]:
    return {name for name in dir(cls) if not name.startswith("_")}


def parameters(func: Any) -> list[tuple[str, Any, Any]]:
    """Names, kinds and defaults (annotations differ between Python and Cython)."""
    sig = inspect.signature(func)
    return [(p.name, p.kind, p.default) for p in sig.parameters.values()]


@pytest.mark.parametrize("name", API_CLASSES)
def test_both_cores_expose_the_same_names(native: ModuleType, name: str) -> None:
    ref_cls, nat_cls = getattr(_reference, name), getattr(native, name)
    assert public_names(nat_cls) == public_names(ref_cls)


@pytest.mark.parametrize("name", API_CLASSES)
def test_both_cores_have_the_same_signatures(native: ModuleType, name: str) -> None:
    ref_cls, nat_cls = getattr(_reference, name), getattr(native, name)
    for attr in sorted(public_names(ref_cls)):
        ref_attr, nat_attr = getattr(ref_cls, attr), getattr(nat_cls, attr)
        if inspect.isdatadescriptor(ref_attr):
            assert inspect.isdatadescriptor(nat_attr), f"{name}.{attr} should be an attribute"
            assert not callable(nat_attr)
            continue
        assert callable(nat_attr), f"{name}.{attr} should be a method"
        assert parameters(nat_attr) == parameters(ref_attr), f"{name}.{attr}"


def test_cache_py_helpers_exist_on_both_cores(native: ModuleType) -> None:
    """RadixCache.pretty() relies on the private ``_structure`` of the backend."""
    for module in (_reference, native):
        cache = module.CacheCore()
        cache.insert([1, 2, 3])
        cache.match_prefix([1])
        structure = [(lvl, label.tolist(), locks) for lvl, label, locks in cache._structure(None)]
        assert structure == [(0, [1], 0), (1, [2, 3], 0)]


@pytest.mark.parametrize("core", ["reference", "native"])
def test_constructor_signature(core: str, request: pytest.FixtureRequest) -> None:
    module = _reference if core == "reference" else request.getfixturevalue("native")
    cache = module.CacheCore(2, eviction="fifo", capacity=10)
    assert (cache.page_size, cache.eviction, cache.capacity) == (2, "fifo", 10)
    default = module.CacheCore()
    assert (default.page_size, default.eviction, default.capacity) == (1, "lru", None)
    assert module.CacheCore(page_size=3).page_size == 3
    with pytest.raises(TypeError):
        module.CacheCore(2, "fifo")  # eviction and capacity are keyword-only
    with pytest.raises(TypeError):
        module.CacheCore(2, evicton="fifo")


def test_every_public_method_is_documented_on_both_cores(native: ModuleType) -> None:
    """help() must be useful whichever implementation RADIXMETA_IMPLEMENTATION picks."""
    for core in (native.CacheCore, _reference.CacheCore):
        public = [name for name in dir(core) if not name.startswith("_")]
        assert public
        undocumented = [name for name in public if not (getattr(core, name).__doc__ or "").strip()]
        assert undocumented == [], f"{core.__module__}: {undocumented}"
