"""Build of the native extension radixmeta._core (everything else is in pyproject.toml).

Environment switches:
  RADIXMETA_SANITIZE=1  AddressSanitizer + UndefinedBehaviorSanitizer (tests must
                        then run with libasan preloaded; .ci/run does this)
  RADIXMETA_DEBUG=1     -O0 -g, no optimisation
"""

import os

import numpy as np
from Cython.Build import cythonize
from setuptools import Extension, setup

sanitize = os.environ.get("RADIXMETA_SANITIZE") == "1"
debug = os.environ.get("RADIXMETA_DEBUG") == "1"

compile_args = ["-std=c++17", "-Wall", "-Wno-unused-function", "-Wno-unreachable-code"]
link_args = []
if debug or sanitize:
    compile_args += ["-O1" if sanitize else "-O0", "-g", "-fno-omit-frame-pointer"]
else:
    compile_args += ["-O3"]
if sanitize:
    flags = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"]
    compile_args += flags
    link_args += flags

extension = Extension(
    "radixmeta._core",
    ["radixmeta/_core.pyx"],
    language="c++",
    include_dirs=[np.get_include(), "csrc/include", "radixmeta"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    extra_compile_args=compile_args,
    extra_link_args=link_args,
    depends=[os.path.join("csrc/include/radixmeta", f) for f in os.listdir("csrc/include/radixmeta")]
    + ["radixmeta/_pyint.h"],
)

setup(
    ext_modules=cythonize(
        [extension],
        compiler_directives={"language_level": 3},
        force=sanitize or debug,  # flags changed: never reuse a differently built module
    )
)
