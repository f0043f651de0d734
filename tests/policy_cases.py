"""Hand-built requests and views for the policy tests: no Router, no MetaTree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from radixmeta import WorkerId
from radixmeta.policies import Choice, EngineLoad, Request, View, worker_of

WORKERS = tuple(WorkerId(f"10.0.0.{i}:30000", 0, i, 0) for i in range(16))


def request(size: int, request_id: str = "r", expected_output: int | None = None) -> Request:
    """A request with a ``size``-token prompt (the token values do not matter to a policy)."""
    tokens = np.arange(size, dtype=np.uint32)
    return Request(request_id, tokens, expected_output=expected_output)


def view(
    lengths: Sequence[int],
    *,
    requests: Sequence[int] | None = None,
    prefill: Sequence[int] | None = None,
    decode: Sequence[int] | None = None,
    host: Sequence[int] | None = None,
    capacities: Sequence[int | None] | None = None,
    reported: Sequence[EngineLoad | None] | None = None,
    page_size: int = 1,
    prefix_key: int | None = None,
) -> View:
    """A view of ``len(lengths)`` workers; every unspecified list is zeros (or None)."""
    n = len(lengths)
    zeros = [0] * n
    return View(
        workers=WORKERS[:n],
        lengths=list(lengths),
        host_lengths=list(host) if host is not None else list(lengths),
        requests=list(requests) if requests is not None else zeros[:],
        prefill_tokens=list(prefill) if prefill is not None else zeros[:],
        decode_tokens=list(decode) if decode is not None else zeros[:],
        capacities=list(capacities) if capacities is not None else [None] * n,
        reported=list(reported) if reported is not None else [None] * n,
        page_size=page_size,
        prefix_key=prefix_key,
    )


def with_(v: View, **changes: object) -> View:
    """A copy of ``v`` with some fields replaced (lists are copied, never shared)."""
    return replace(v, **changes)  # type: ignore[arg-type]


def index_of(v: View, choice: object) -> int:
    """Position in ``v`` of the worker ``choose`` returned."""
    return v.workers.index(worker_of(choice))  # type: ignore[arg-type]


def reason(choice: object) -> str:
    """The reason label of a Choice (``""`` for a bare worker)."""
    return choice.reason if isinstance(choice, Choice) else ""


def detail(choice: object) -> dict[str, float]:
    """The detail numbers of a Choice as a dict."""
    return dict(choice.detail) if isinstance(choice, Choice) else {}


class FakeClock:
    """A settable clock for the windowed policies."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now
