"""Imports run one way: each layer of radixmeta uses only the layers below it.

The layers, from the top (docs/development.md's layout table): the console script,
the integrations and the simulator; the router; the policies and the events (with
the wire codecs and the transports they use); the trees; the binding (the native
extension and the pure-Python reference it can be swapped for); and the base
modules below the binding (errors, the input rules, the record types). Every
``from radixmeta... import`` of every module is read (imports for type checking
only are left out: they run no code), and of the binding's Cython sources too.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "radixmeta"

# Lowest first; a module belongs to the first layer whose prefix names it.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "base",
        (
            "radixmeta.errors",
            "radixmeta._keys",
            "radixmeta._types",
            "radixmeta._records",
            "radixmeta._log_settings",
            "radixmeta._hashing",
            "radixmeta._blocks",
            "radixmeta._holds",
            "radixmeta._workers",
            "radixmeta._atomic",
        ),
    ),
    ("binding", ("radixmeta._core", "radixmeta._reference", "radixmeta._impl")),
    (
        "trees",
        (
            "radixmeta.cache",
            "radixmeta.meta",
            "radixmeta._batch",
            "radixmeta.testing",
            "radixmeta.testing_meta",
        ),
    ),
    ("wire", ("radixmeta.wire", "radixmeta.transport")),
    (
        "events",
        (
            "radixmeta.events",
            "radixmeta.replay",
            "radixmeta.ingest",
            "radixmeta.publishing",
            "radixmeta.subscription",
            "radixmeta.log",
        ),
    ),
    ("policies", ("radixmeta.policies",)),
    ("router", ("radixmeta.router",)),
    ("top", ("radixmeta.sim", "radixmeta.integrations", "radixmeta.cli", "radixmeta.demo",
             "radixmeta.__main__", "radixmeta.gateway")),
]
# The package's __init__ gathers the public names of every layer: importing a name
# from it (not a module) is an import from the top.
TOP_LEVEL = "radixmeta"


def layer_of(module: str) -> int:
    if module == TOP_LEVEL:
        return len(LAYERS) - 1
    for rank, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if module == prefix or module.startswith(prefix + ".") or (
                prefix.endswith(("_reference",)) and module.startswith(prefix)
            ):
                return rank
    msg = f"{module} is in no layer of this test: add it"
    raise AssertionError(msg)


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported(tree: ast.AST) -> list[str]:
    """The radixmeta modules a module imports at run time (not under TYPE_CHECKING)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for child in node.body for n in ast.walk(child))
    out = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == TOP_LEVEL:  # from radixmeta import x: a module, or a name
                out += [_submodule(alias.name) for alias in node.names]
            elif node.module.startswith(TOP_LEVEL + "."):
                out.append(node.module)
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names if a.name.startswith(TOP_LEVEL + ".")]
    return out


def _submodule(name: str) -> str:
    """``radixmeta.<name>`` if that is a module of the package, else the package itself."""
    if (PACKAGE / f"{name}.py").exists() or (PACKAGE / name).is_dir():
        return f"{TOP_LEVEL}.{name}"
    if list(PACKAGE.glob(f"{name}.*.so")) or (PACKAGE / f"{name}.pyx").exists():
        return f"{TOP_LEVEL}.{name}"
    return TOP_LEVEL


PYTHON = sorted(p for p in PACKAGE.rglob("*.py") if module_name(p) != TOP_LEVEL)


@pytest.mark.parametrize("path", PYTHON, ids=lambda p: module_name(p))
def test_a_module_imports_only_its_layer_and_below(path: Path) -> None:
    name = module_name(path)
    mine = layer_of(name)
    for target in imported(ast.parse(path.read_text())):
        assert layer_of(target) <= mine, f"{name} ({LAYERS[mine][0]}) imports {target}"


def test_the_binding_imports_nothing_above_the_base() -> None:
    """The native extension builds records, but from base types: no arrow into events."""
    sources = [PACKAGE / "_core.pyx", *sorted(PACKAGE.glob("*.pxi"))]
    pattern = re.compile(
        r"^\s*(?:from\s+(radixmeta(?:\.\w+)*)\s+c?import\s+([\w, ]+)|import\s+(radixmeta\S*))",
        re.MULTILINE,
    )
    found = set()
    for path in sources:
        for module, names, plain in pattern.findall(path.read_text()):
            if module == TOP_LEVEL:
                found.update(_submodule(n.strip()) for n in names.split(",") if n.strip())
            else:
                found.add(module or plain)
    assert found, "no import found: the pattern no longer matches the sources"
    base = LAYERS[0][1]
    cython = {"radixmeta._radix_tree", "radixmeta._meta_tree"}  # cimported declarations
    for target in sorted(found - cython):
        assert target in base, f"the binding imports {target}, above the base modules"
