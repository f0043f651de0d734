"""The examples in the public modules' docstrings run and print what they show."""

import doctest

import pytest

import radixmeta.cache
import radixmeta.log
import radixmeta.meta

MODULES = [radixmeta.cache, radixmeta.log, radixmeta.meta]


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_docstring_examples(module: object) -> None:
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert tried > 0, "no examples found: the docstrings lost their examples"
    assert failures == 0
