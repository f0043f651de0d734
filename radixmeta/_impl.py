"""Choose the implementation behind the public classes.

``RADIXMETA_IMPLEMENTATION=python`` selects the pure-Python reference; anything
else (or nothing) requires the compiled extension. There is deliberately no
silent fallback: a serving stack that loses its native core would run orders of
magnitude slower without noticing, so a missing extension is an import error
that says how to fix it.
"""

from __future__ import annotations

import os
from types import ModuleType

_CHOICES = ("native", "python")


def _select() -> tuple[str, ModuleType]:
    wanted = os.environ.get("RADIXMETA_IMPLEMENTATION", "native").strip().lower() or "native"
    if wanted == "cpp":  # accepted alias: the native core is C++
        wanted = "native"
    if wanted not in _CHOICES:
        msg = (
            f"RADIXMETA_IMPLEMENTATION must be 'native' or 'python', got {wanted!r}"
        )
        raise ImportError(msg)
    if wanted == "python":
        from radixmeta import _reference

        return "python", _reference
    try:
        from radixmeta import _core
    except ImportError as exc:
        msg = (
            "radixmeta's compiled extension radixmeta._core could not be imported "
            f"({exc}). Reinstall with a C++17 compiler available (pip install "
            "--force-reinstall radixmeta, or pip install -e . in a checkout), or set "
            "RADIXMETA_IMPLEMENTATION=python to run on the slow pure-Python reference."
        )
        raise ImportError(msg) from exc
    return "native", _core


implementation, backend = _select()
