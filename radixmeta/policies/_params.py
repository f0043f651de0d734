"""Checks of policy parameters and the small loops the policies share.

Constructors validate every parameter once, so ``choose`` never checks anything:
a bad value raises :class:`~radixmeta.errors.PolicyError`, a bad type
:class:`~radixmeta.errors.InputTypeError`, and both name the parameter.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from radixmeta._impl import backend
from radixmeta._workers import WorkerId
from radixmeta.errors import InputTypeError, PolicyError
from radixmeta.policies.base import Choice, EngineLoad, View, extra_requests

__all__ = [
    "LOAD_MEASURES",
    "ReportedExtra",
    "fresh_loads",
    "check_choice",
    "check_number",
    "check_seed",
    "extremes",
    "loads_of",
    "new_choice",
]

#: The load measures of the load-based policies: in-flight requests, or uncached
#: prefill plus decode tokens in flight.
LOAD_MEASURES = ("requests", "tokens")


def check_number(
    name: str,
    value: object,
    *,
    low: float = 0.0,
    high: float = math.inf,
    low_open: bool = False,
    integer: bool = False,
) -> float:
    """Return ``value`` as a float after checking its type and range.

    Parameters
    ----------
    name : str
        The parameter's name, for the message.
    value : object
        What the caller passed; an int or a float (never a bool).
    low, high : float
        The allowed range, ``low <= value <= high`` (``low < value`` with ``low_open``).
    integer : bool
        Require an integer.

    Raises
    ------
    InputTypeError
        ``value`` is not a number (or not an integer when ``integer`` is set).
    PolicyError
        ``value`` is outside the range or not finite.
    """
    kinds: tuple[type, ...] = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds):
        kind = "an integer" if integer else "a number"
        msg = f"{name} must be {kind}, got {type(value).__name__}"
        raise InputTypeError(msg)
    number = float(value)  # type: ignore[arg-type]  # an int or a float, checked above
    too_low = number <= low if low_open else number < low
    if math.isnan(number) or too_low or number > high or math.isinf(number):
        bound = f"> {low:g}" if low_open else f">= {low:g}"
        if high != math.inf:
            bound += f" and <= {high:g}"
        msg = f"{name} must be finite and {bound}, got {value!r}"
        raise PolicyError(msg)
    return number


def check_choice(name: str, value: object, allowed: Sequence[str]) -> str:
    """Return ``value`` if it is one of ``allowed``; raise a clear error otherwise."""
    if not isinstance(value, str):
        msg = f"{name} must be a str, got {type(value).__name__}"
        raise InputTypeError(msg)
    if value not in allowed:
        msg = f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}"
        raise PolicyError(msg)
    return value


def check_seed(seed: object) -> int:
    """Return ``seed`` if it is an int (any value); the policies never seed from the clock."""
    if isinstance(seed, bool) or not isinstance(seed, int):
        msg = f"seed must be an int, got {type(seed).__name__}"
        raise InputTypeError(msg)
    return seed


def loads_of(view: View, by_tokens: bool) -> list[int]:
    """Per worker, requests in flight, or uncached prefill plus decode tokens in flight."""
    if by_tokens:
        return [p + d for p, d in zip(view.prefill_tokens, view.decode_tokens, strict=True)]
    return view.requests


class ReportedExtra:
    """Per worker, the requests its engine reported beyond the router's own (``extra_requests``).

    Remembered for the list object a view carries: the router builds a new
    ``reported`` list only when a report arrives, so between reports this costs
    one identity check. Returns ``None`` when no worker has any extra load, the
    common case, so that the caller keeps the router's own list as it is.
    """

    __slots__ = ("_extra", "_list")

    def __init__(self) -> None:
        self._list: object = None
        self._extra: list[int] | None = None

    def __call__(self, reported: list[EngineLoad | None]) -> list[int] | None:
        if reported is not self._list:
            self._list = reported
            extra = [extra_requests(r) for r in reported]
            self._extra = extra if any(extra) else None
        return self._extra


def fresh_loads(view: View, by_tokens: bool, extra: list[int] | None) -> list[int]:
    """Per worker, its load: the router's own counts plus what only its engine reported.

    ``extra`` (from :class:`ReportedExtra`) counts requests; in tokens each one
    weighs the fleet's mean tokens per request in flight (the router's own), or
    one token when nothing is in flight (every own load is 0 then: only the
    order matters).
    """
    loads = loads_of(view, by_tokens)
    if extra is None:
        return loads
    if not by_tokens:
        return [n + e for n, e in zip(loads, extra, strict=True)]
    requests = sum(view.requests)
    unit = sum(loads) / requests if requests else 1.0
    return [n + round(e * unit) for n, e in zip(loads, extra, strict=True)]


#: ``extremes(values) -> (low, low_at, high, high_at, high_count)``: the smallest and
#: largest value of a view's list, the first position of each, and how many hold the
#: largest, in one pass in C (``min``, ``max``, ``index`` and ``count`` are four walks
#: through the generic object protocol, which cost more than a policy's rule).
extremes: Callable[[Sequence[float]], tuple[float, int, float, int, int]] = backend.extremes


#: ``new_choice(Choice, (worker, reason, detail))``: Choice's own constructor is a
#: Python function, twice the cost of building the tuple directly, on every request.
new_choice: Callable[[type[Choice], tuple[WorkerId, str, tuple[tuple[str, float], ...]]], Choice]
new_choice = tuple.__new__
