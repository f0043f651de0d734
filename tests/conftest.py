"""Shared fixtures: hypothesis profiles, the implementations under test, a seeded RNG.

The native core ``radixmeta._core`` is required: if it cannot be imported, every
test that needs it fails, unless ``RADIXMETA_IMPLEMENTATION=python`` is set, in
which case those tests are skipped (the pure-Python job of CI).
"""

from __future__ import annotations

import os
import random
import sys
from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import HealthCheck, Verbosity, settings

from radixmeta import _reference

# -- hypothesis profiles -------------------------------------------------------------------
# ``dev`` is quick for local runs; CI sets HYPOTHESIS_PROFILE=ci (``sanitize`` on the
# sanitizer build). No profile has a deadline: wall-clock limits would make the suite
# flaky on a loaded 2-core runner.
settings.register_profile("dev", max_examples=30, stateful_step_count=30, deadline=None)
# 120 examples a property (hypothesis's default is 100) keeps .ci/run within its 20
# minutes now that it also serves a gateway, a Ray cluster and a minute of chaos.
settings.register_profile(
    "ci",
    max_examples=120,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
# The sanitizer stage of .ci/run: the same machines on a much slower build. The ci
# profile's 120 examples already ran on the optimised build; here the aim is memory errors
# on every path, which 50 examples at full length still walk.
settings.register_profile(
    "sanitize",
    max_examples=50,
    stateful_step_count=50,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "debug", max_examples=10, stateful_step_count=20, deadline=None, verbosity=Verbosity.verbose
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# -- implementations -----------------------------------------------------------------------
PYTHON_ONLY = os.environ.get("RADIXMETA_IMPLEMENTATION", "").strip().lower() == "python"

try:
    from radixmeta import _core as _native
except ImportError as exc:
    NATIVE: ModuleType | None = None
    NATIVE_ERROR = f"{type(exc).__name__}: {exc}"
else:
    NATIVE = _native
    NATIVE_ERROR = ""

REFERENCE: ModuleType = _reference


def require_native() -> ModuleType:
    """Return ``radixmeta._core``; skip (python-only run) or fail when it is missing."""
    if NATIVE is not None:
        return NATIVE
    reason = f"native core radixmeta._core is not importable ({NATIVE_ERROR})"
    if PYTHON_ONLY:
        pytest.skip(f"{reason}; skipped because RADIXMETA_IMPLEMENTATION=python")
    pytest.fail(
        f"{reason}. Build it (pip install -e '.[test]') or set "
        "RADIXMETA_IMPLEMENTATION=python to test only the pure-Python reference.",
        pytrace=False,
    )


@pytest.fixture(params=["reference", "native"])
def impl(request: pytest.FixtureRequest) -> type:
    """A ``CacheCore`` class: the pure-Python reference, then the native core."""
    if request.param == "reference":
        return REFERENCE.CacheCore
    return require_native().CacheCore


@pytest.fixture
def native() -> ModuleType:
    """The native module ``radixmeta._core`` (skipped or failed as described above)."""
    return require_native()


# -- meta-tree implementations ---------------------------------------------------------------
# The meta-tree tests run on the reference and on the native MetaCore. When the native core is
# missing they run on the reference only, and test_native_meta_core_is_under_test fails (or
# skips, when RADIXMETA_IMPLEMENTATION=python), as require_native does for the cache tests.
from radixmeta._reference_meta import MetaCore as REFERENCE_META  # noqa: E402

NATIVE_META: type | None = NATIVE.MetaCore if NATIVE is not None else None
META_CORES: dict[str, type] = {"reference": REFERENCE_META}
if NATIVE_META is not None:
    META_CORES["native"] = NATIVE_META


@pytest.fixture(params=list(META_CORES))
def meta_impl(request: pytest.FixtureRequest) -> type:
    """A ``MetaCore`` class: the pure-Python reference, then the native core."""
    return META_CORES[request.param]


# -- threads ---------------------------------------------------------------------------------
@pytest.fixture
def fast_switching() -> Iterator[None]:
    """Switch threads as often as possible, to interleave calls finely."""
    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(old)


# -- seeded randomness ---------------------------------------------------------------------
class SeededRandom(random.Random):
    """``random.Random`` whose repr shows the seed, so a failure can be replayed."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.initial_seed = seed

    def __repr__(self) -> str:
        seed = self.initial_seed
        return f"SeededRandom(seed={seed}) [rerun with RADIXMETA_TEST_SEED={seed}]"


@pytest.fixture
def rng() -> SeededRandom:
    """A fresh seeded RNG; the seed comes from RADIXMETA_TEST_SEED or is drawn at random.

    The seed is printed, so pytest shows it with the captured output of a failing test.
    """
    env = os.environ.get("RADIXMETA_TEST_SEED", "").strip()
    seed = int(env) if env else random.SystemRandom().randrange(2**32)
    generator = SeededRandom(seed)
    print(f"rng = {generator!r}")
    return generator
