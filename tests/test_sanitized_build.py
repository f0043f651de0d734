"""Guards the sanitizer stage of .ci/run against silently testing the wrong build."""

import os

import pytest

import radixmeta


@pytest.mark.skipif(
    os.environ.get("RADIXMETA_EXPECT_SANITIZED") != "1",
    reason="only meaningful in .ci/run's sanitizer stage (RADIXMETA_EXPECT_SANITIZED=1)",
)
def test_the_sanitized_extension_is_the_one_imported() -> None:
    from radixmeta import _core

    # The sanitizer stage builds in a scratch copy of the tree; importing the
    # editable install instead would run the tests on the optimised build.
    assert os.path.dirname(_core.__file__) == os.path.dirname(radixmeta.__file__)
    assert os.path.realpath(os.getcwd()) in os.path.realpath(_core.__file__)
    with open(_core.__file__, "rb") as handle:
        assert b"__asan_init" in handle.read()
