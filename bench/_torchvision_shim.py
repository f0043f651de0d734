"""Serve inert ``torchvision`` modules so SGLang can be imported on a CPU-only box.

Why this exists (benchmark harness only, never imported by ``radixmeta``):
importing ``sglang.srt.mem_cache.radix_cache`` drags in SGLang's model configs,
some of which ``import torchvision`` at module level. PyPI ships no CPU build
of torchvision; its CUDA build fails against a CPU ``torch`` and then breaks at
import time. The cache code never *uses* torchvision, so for the benchmark it
is enough that the import succeeds.

:func:`install` puts a finder at the front of ``sys.meta_path`` that answers
every ``torchvision`` / ``torchvision.*`` import with an empty package whose
unknown attributes are inert stand-ins (callable, subclassable, attribute
chains all work; calling one raises). Two rules keep this harmless:

* it does nothing when a real, working torchvision can be imported;
* it stays invisible to ``importlib.util.find_spec`` probes, so libraries that
  *check* for torchvision (``transformers`` does) still conclude it is absent
  and take their no-vision code paths.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

__all__ = ["install", "installed", "uninstall"]

_PACKAGE = "torchvision"
# The code object of the public availability probe. While a frame running it is
# on the stack, the lookup is a "is it installed?" question, not a real import.
_PROBE_CODE = importlib.util.find_spec.__code__


def _is_ours(fullname: str) -> bool:
    return fullname == _PACKAGE or fullname.startswith(_PACKAGE + ".")


def _inside_probe() -> bool:
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code is _PROBE_CODE:
            return True
        frame = frame.f_back
    return False


class _Inert:
    """Any name looked up on a placeholder module: a chainable, inert value."""

    __slots__ = ("_qualname",)

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, name: str) -> _Inert:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert(f"{self._qualname}.{name}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        msg = f"{self._qualname} is unavailable: torchvision is a placeholder in this environment"
        raise RuntimeError(msg)

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        # ``class Foo(torchvision.X): ...`` builds a plain class instead.
        return (object,)

    def __repr__(self) -> str:
        return f"<placeholder {self._qualname}>"


class _PlaceholderModule(types.ModuleType):
    def __getattr__(self, name: str) -> _Inert:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _Inert(f"{self.__name__}.{name}")


class _PlaceholderFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(
        self, fullname: str, path: Any = None, target: Any = None
    ) -> importlib.machinery.ModuleSpec | None:
        if not _is_ours(fullname) or _inside_probe():
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _PlaceholderModule(spec.name)
        module.__path__ = []  # a package, so ``torchvision.a.b`` imports resolve here too
        module.__dict__["__version__"] = "0.0.0+placeholder"
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


_finder: _PlaceholderFinder | None = None


def _real_torchvision_works() -> bool:
    try:
        import torchvision  # noqa: F401
    except Exception:
        # A broken install can leave half-initialised entries behind.
        for name in [n for n in sys.modules if _is_ours(n)]:
            del sys.modules[name]
        return False
    return True


def install() -> bool:
    """Activate the placeholder finder unless a working torchvision exists.

    Returns True when placeholders are now being served. Idempotent.
    """
    global _finder
    if _finder is not None:
        return True
    if _real_torchvision_works():
        return False
    _finder = _PlaceholderFinder()
    sys.meta_path.insert(0, _finder)
    return True


def installed() -> bool:
    """Whether :func:`install` put the finder in place."""
    return _finder is not None


def uninstall() -> None:
    """Remove the finder and any placeholder modules it created."""
    global _finder
    if _finder is None:
        return
    sys.meta_path[:] = [f for f in sys.meta_path if f is not _finder]
    for name in [n for n in sys.modules if _is_ours(n)]:
        if isinstance(sys.modules[name], _PlaceholderModule):
            del sys.modules[name]
    _finder = None
