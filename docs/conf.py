"""Sphinx configuration for the radixmeta documentation.

Build with::

    sphinx-build -W -b html docs docs/_build/html
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Document the checkout this file lives in, not some other installed copy.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# `import radixmeta` raises ImportError when the compiled extension is not built:
# the package refuses to fall back silently (see radixmeta/_impl.py). Autodoc only
# reads pure-Python modules (radixmeta.errors, radixmeta.testing), so in that case
# the docs build on the pure-Python reference instead. An explicit
# RADIXMETA_IMPLEMENTATION in the environment is left alone.
try:
    import radixmeta
except ImportError:
    if "RADIXMETA_IMPLEMENTATION" in os.environ:
        raise
    os.environ.setdefault("RADIXMETA_IMPLEMENTATION", "python")
    for name in [m for m in sys.modules if m == "radixmeta" or m.startswith("radixmeta.")]:
        del sys.modules[name]  # drop the half-imported package before trying again
    import radixmeta

project = "radixmeta"
author = "the radixmeta authors"
copyright = "the radixmeta authors"
release = radixmeta.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# No network access while building, so no intersphinx; unresolved references to
# outside projects are not errors.
nitpicky = False

myst_heading_anchors = 3
myst_enable_extensions = ["deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"

napoleon_google_docstring = False
napoleon_numpy_docstring = True
napoleon_use_rtype = False

html_theme = "alabaster"
html_title = f"radixmeta {release}"
html_theme_options = {
    "description": "Radix KV-cache trees for LLM serving",
    "fixed_sidebar": True,
}
