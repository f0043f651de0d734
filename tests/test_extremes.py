"""``extremes``, the one scan the load and affinity policies make: native and reference agree
with min, max, index and count, on ints of every size and on what is not an int."""

from __future__ import annotations

import math
from typing import Any

import pytest
from conftest import NATIVE, REFERENCE
from hypothesis import given
from hypothesis import strategies as st

from radixmeta.errors import InvalidInputError

CORES = [REFERENCE] + ([NATIVE] if NATIVE is not None else [])

numbers = st.one_of(
    st.integers(0, 3),  # many ties
    st.integers(-(2**63), 2**63 - 1),
    st.integers(2**63, 2**70),  # past int64: the generic path
    st.floats(allow_nan=False),
    st.booleans(),
)


def definition(row: list[Any]) -> tuple[Any, int, Any, int, int]:
    low, high = min(row), max(row)
    return low, row.index(low), high, row.index(high), row.count(high)


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.__name__)
@given(row=st.lists(numbers, min_size=1, max_size=80), as_tuple=st.booleans())
def test_extremes_are_min_max_index_and_count(core: Any, row: list[Any], as_tuple: bool) -> None:
    got = core.extremes(tuple(row) if as_tuple else row)
    want = definition(row)
    assert got == want
    # The same objects, not only equal ones (an int stays an int, a bool a bool).
    assert [type(v) for v in got] == [type(v) for v in want]


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.__name__)
def test_extremes_of_other_sequences_and_nan(core: Any) -> None:
    assert core.extremes(range(5, 0, -1)) == (1, 4, 5, 0, 1)
    nan = math.nan
    assert core.extremes([nan, 1.0]) == definition([nan, 1.0])
    assert core.extremes([7] * 70) == (7, 0, 7, 0, 70)  # more than the stack row


@pytest.mark.parametrize("core", CORES, ids=lambda c: c.__name__)
def test_extremes_of_nothing_is_an_error(core: Any) -> None:
    with pytest.raises(InvalidInputError, match="empty"):
        core.extremes([])
    with pytest.raises(InvalidInputError, match="empty"):
        core.extremes(())
