"""Ranking: every worker of a dispatch's view in the order a caller should try them.

``Router.dispatch(..., ranked=True)`` asks the policy's optional ``rank(request,
view)`` hook (see :mod:`radixmeta.policies.base`) for its order, checks it, and keeps
it as ``Decision.ranking`` with the chosen worker first. A policy without the hook
gets :func:`by_held`: the tokens of the prompt each worker holds, most first, then
its requests in flight, then its index. Plain dispatches never come here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from radixmeta._workers import WorkerId
from radixmeta.errors import PolicyError
from radixmeta.policies.base import Request, View

__all__ = ["by_held", "chosen_first", "ranking_of"]

Rank = Callable[[Request, View], Any]


def by_held(view: View) -> list[WorkerId]:
    """The rule for a policy without ``rank``: most of the prompt held, then fewest requests
    in flight, then the lowest worker index. O(workers log workers)."""
    lengths, requests, workers = view.lengths, view.requests, view.workers
    order = sorted(
        range(len(workers)), key=lambda i: (-lengths[i], requests[i], workers[i].index)
    )
    return [workers[i] for i in order]


def ranking_of(rank: Rank | None, request: Request, view: View) -> list[WorkerId]:
    """The policy's ranking of ``view`` (``rank``'s, checked), or :func:`by_held`'s.

    Raises
    ------
    PolicyError
        ``rank`` returned something that is not every worker of the view exactly
        once (the dispatch then raises before it changes anything).
    """
    if rank is None:
        return by_held(view)
    order = rank(request, view)
    workers = view.workers
    out: list[WorkerId] = []
    if isinstance(order, (list, tuple)) and len(order) == len(workers):
        at = {w.index: k for k, w in enumerate(workers)}
        seen: set[int] = set()
        for worker in order:
            k = at.get(worker.index) if type(worker) is WorkerId else None
            if k is None or k in seen or not (workers[k] is worker or workers[k] == worker):
                break
            seen.add(k)
            out.append(workers[k])
    if len(out) != len(workers):
        msg = (
            f"the policy's rank returned {order!r}: it must list each of its view's "
            f"{len(workers)} workers exactly once"
        )
        raise PolicyError(msg)
    return out


def chosen_first(order: list[WorkerId], chosen: WorkerId) -> tuple[WorkerId, ...]:
    """``order`` with ``chosen`` moved to its front (where it is already, for a policy
    whose ``rank`` agrees with its ``choose``)."""
    if order[0] is chosen:
        return tuple(order)
    return (chosen, *(w for w in order if w is not chosen))
