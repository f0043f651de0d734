"""Decision: what the router decided for one request, and its record while in flight."""

from __future__ import annotations

import math

from radixmeta._workers import WorkerId
from radixmeta.policies.base import Request, View

__all__ = ["CHOSEN", "Decision"]

CHOSEN = "chosen"  # the label of a decision whose policy returned a bare worker


class Decision:
    """What ``dispatch`` decided for one request, and why.

    Attributes
    ----------
    request_id : str
        The request's id (generated when the caller gave none).
    worker : WorkerId
        The worker chosen.
    matched : int
        Tokens of the prompt that worker held (by the events and the router's
        own marks) when it was chosen, less what the requests queued ahead of it
        there are expected to evict before it runs (``View.expected``): the
        estimated cache hit.
    label : str
        The policy's short reason (``"affinity"``, ``"balance"``...), or
        ``"chosen"`` when it gave none; counted by ``Router.metrics()``.
    detail : tuple of (str, float)
        The numbers the policy's rule used.
    ranking : tuple of WorkerId or None
        With ``dispatch(..., ranked=True)``: every worker of the view, the chosen
        one first, then the others in the policy's ``rank`` order (see
        :mod:`radixmeta.policies.base`); else ``None``.

    Notes
    -----
    ``lengths`` and ``reason`` are built when read, so a decision costs its
    slots and nothing else until someone logs or explains it. It is also the
    router's record of the request while it is in flight (the private slots:
    what ``finish`` releases), so a dispatch makes one object, not two.
    """

    __slots__ = (
        "request_id",
        "worker",
        "matched",
        "label",
        "detail",
        "_view",
        "_request",
        "_hold",
        "_started",
        "_decode",  # set by prefill_done: the tokens counted in decode_tokens
        "_inflight",  # its prompt's hold in the estimate's in-flight tree (None: not held)
        "_ranking",  # set by dispatch(ranked=True) only
    )
    _decode: int
    _ranking: tuple[WorkerId, ...]

    def __init__(
        self,
        request_id: str,
        worker: WorkerId,
        matched: int,
        label: str,
        detail: tuple[tuple[str, float], ...],
        view: View,
        request: Request,
        hold: int | None,
        started: float,
    ) -> None:
        self.request_id = request_id
        self.worker = worker
        self.matched = matched
        self.label = label
        self.detail = detail
        self._view = view
        self._request = request
        self._hold = hold  # the hold of its pages (exact mode)
        self._started = started
        self._inflight: int | None = None

    @property
    def lengths(self) -> dict[WorkerId, int]:
        """Every worker the policy could choose, with the tokens of the prompt it held."""
        return dict(zip(self._view.workers, self._view.lengths, strict=True))

    @property
    def ranking(self) -> tuple[WorkerId, ...] | None:
        """Every worker the policy could choose, in the order to try them: the chosen
        worker first, then the policy's fallbacks (``dispatch(..., ranked=True)``);
        ``None`` when the dispatch did not ask for it."""
        try:
            return self._ranking
        except AttributeError:
            return None

    @property
    def _uncached(self) -> int:
        """Its tokens in prefill_tokens until prefill_done."""
        return len(self._request.tokens) - self.matched

    @property
    def reason(self) -> str:
        """The label and the numbers behind it, as one line: ``"balance (max_load=9, ...)"``."""
        if not self.detail:
            return self.label
        numbers = ", ".join(f"{name}={_number(value)}" for name, value in self.detail)
        return f"{self.label} ({numbers})"

    def __repr__(self) -> str:
        return (
            f"Decision(request_id={self.request_id!r}, worker={self.worker.name!r}/"
            f"{self.worker.dp_rank}, matched={self.matched}, reason={self.reason!r})"
        )


def _number(value: float) -> str:
    """A detail number as a reason shows it: an integer without a point, else 3 digits."""
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    if isinstance(value, (int, float)) and math.isfinite(value):
        return str(int(value))
    return str(value)
