"""Prefix-affinity policies: pure longest prefix match, and sgl-router's ``cache_aware``.

Both read the per-worker device match lengths of the view (``view.lengths``: the
tokens of the prompt each worker holds on the device, from the MetaTree). Each
``choose`` is O(workers).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType

from radixmeta._workers import WorkerId
from radixmeta.policies._params import (
    LOAD_MEASURES,
    ReportedExtra,
    check_choice,
    check_number,
    extremes,
    fresh_loads,
    loads_of,
    new_choice,
)
from radixmeta.policies._ranking import in_order
from radixmeta.policies.base import Choice, Request, View

__all__ = ["CACHE_AWARE_PRESETS", "CacheAware", "LongestPrefix"]


def _best_match(lengths: Sequence[int], loads: Sequence[float]) -> int:
    """The worker with the longest match; among equals the least loaded, then the first."""
    best = 0
    top = lengths[0]
    low = loads[0]
    for i in range(1, len(lengths)):
        length = lengths[i]
        if length > top or (length == top and loads[i] < low):
            best = i
            top = length
            low = loads[i]
    return best


def _by_match(view: View, loads: Sequence[float]) -> list[WorkerId]:
    """Every worker by ``_best_match``'s keys: longest match, then least loaded, then first."""
    lengths = view.lengths
    return in_order(view.workers, range(len(lengths)), lambda i: (-lengths[i], loads[i]))


def _by_load(view: View, loads: Sequence[float]) -> list[WorkerId]:
    """Every worker by load, least first, ties in view order (as ``extremes`` takes the first)."""
    return in_order(view.workers, range(len(loads)), loads.__getitem__)


class LongestPrefix:
    """Each request to the worker holding the longest prefix of it; ties to the least loaded.

    Pure affinity (SGLang's longest-prefix-match, applied across workers): it reaches
    the best hit rate a single tree could, and it has no load term at all. When every
    request shares a root prefix (a system prompt), the worker that got the first one
    holds the longest match of every later one, so all traffic collapses onto it; the
    published prefix-aware routers all add a load term for that reason. Kept as the
    baseline that shows the collapse.

    Parameters
    ----------
    load : {"requests", "tokens"}, default "requests"
        The load measure that breaks ties (ties left after it go to the first worker).

    Complexity: O(workers) per ``choose``.
    """

    #: choose_batch takes the router's PrefixGroups (BatchPolicy's docstring).
    flat_groups = True

    __slots__ = ("_by_tokens", "_load")

    def __init__(self, load: str = "requests") -> None:
        self._load = check_choice("load", load, LOAD_MEASURES)
        self._by_tokens = load == "tokens"

    def __repr__(self) -> str:
        return f"LongestPrefix(load={self._load!r})"

    def choose_batch(
        self,
        requests: Sequence[Request],
        views: Sequence[View],
        groups: Sequence[tuple[Sequence[int], int]],
    ) -> list[Choice]:
        """Each prefix group of a batch whole to its first member's longest-match worker.

        Pure affinity for a batch: no group is ever split for load. Ties (a group
        nobody holds) go to the least loaded worker, counting the batch's earlier
        groups, so the groups spread, but each stays on one worker however large
        it is: that is the imbalance pure affinity shows. O(groups x workers).
        """
        if not requests:
            return []
        workers = views[0].workers
        loads = [float(x) for x in loads_of(views[0], self._by_tokens)]
        out: list[Choice | None] = [None] * len(requests)
        for indices, _shared in groups:
            if not indices:
                continue
            lengths = views[indices[0]].lengths
            i = _best_match(lengths, loads)
            matched = lengths[i]
            reason = "affinity" if matched else "balance"
            detail = (("matched", float(matched)), ("load", loads[i]))
            choice = new_choice(Choice, (workers[i], reason, detail))
            for k in indices:
                out[k] = choice
                if self._by_tokens:  # each member's own uncached part
                    loads[i] += max(0, len(requests[k].tokens) - views[k].lengths[i])
                else:
                    loads[i] += 1
        return [c for c in out if c is not None]

    def choose(self, request: Request, view: View) -> Choice:
        """Return the longest-match worker; reason ``"affinity"``, ``"balance"`` if none matched."""
        loads = loads_of(view, self._by_tokens)
        i = _best_match(view.lengths, loads)
        matched = view.lengths[i]
        reason = "affinity" if matched else "balance"
        detail = (("matched", float(matched)), ("load", float(loads[i])))
        return new_choice(Choice, (view.workers[i], reason, detail))

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """Every worker by match length, longest first, then by load (``choose``'s keys).

        O(workers log workers).
        """
        return _by_match(view, loads_of(view, self._by_tokens))


#: sgl-router's two sets of defaults, as ``(cache_threshold, balance_abs_threshold,
#: balance_rel_threshold)``: ``"cli"`` is what its command line and its Python
#: ``RouterArgs`` use (what a deployment gets), ``"rust"`` is ``CacheAwareConfig::default()``.
CACHE_AWARE_PRESETS = MappingProxyType({"cli": (0.3, 64.0, 1.5), "rust": (0.5, 32.0, 1.1)})


class CacheAware:
    """sgl-router's ``cache_aware`` rule: balance when the loads drift apart, else match.

    Source: ``sgl-router/src/policies/cache_aware.rs`` (SGLang v0.4 onwards), on the
    router's in-flight request counts:

    1. If ``max_load - min_load > balance_abs_threshold`` **and**
       ``max_load > balance_rel_threshold * min_load``, the pool is imbalanced: the
       least loaded worker (reason ``"balance"``).
    2. Otherwise ``match_rate = longest match / prompt length``; if
       ``match_rate > cache_threshold``, the worker holding that match (``"affinity"``).
    3. Otherwise the least loaded worker (``"miss"``; sgl-router took the worker with
       the smallest tree here until its PR #14650).

    Both comparisons are strict, so a spread exactly at a threshold is balanced and a
    rate exactly at ``cache_threshold`` is a miss. Ties in load go to the first worker
    of the view, as ``min_by_key`` does. Four differences from sgl-router come from
    what radixmeta knows: the match is in tokens against the MetaTree's pages (which
    engines' events keep exact) rather than in characters against a tree of routing
    history; when several workers hold the longest match the least loaded of them is
    taken (sgl-router's tree returns one of them arbitrarily); the comparisons
    are in float64 where Rust uses f32; and a worker's load is the router's count
    plus the requests its engine reported beyond the router's own
    (``view.reported``), which sgl-router, counting only its own in-flight requests,
    cannot see (a second router's traffic, requests it thinks finished). Without
    reports the rule is sgl-router's exactly.

    Parameters
    ----------
    cache_threshold : float, optional
        Match rate in ``[0, 1]`` above which affinity wins.
    balance_abs_threshold : float, optional
        Load spread (requests) above which the pool may be imbalanced, ``>= 0``.
    balance_rel_threshold : float, optional
        Ratio of the largest to the smallest load above which it may be, ``>= 0``.
    preset : {"cli", "rust"}, default "cli"
        Where the parameters not given come from: ``"cli"`` is 0.3, 64, 1.5 (the
        command line and Python defaults), ``"rust"`` 0.5, 32, 1.1 (the Rust
        ``CacheAwareConfig::default()``).

    Complexity: O(workers) per ``choose``.

    Examples
    --------
    >>> from radixmeta.policies import create
    >>> create("cache_aware")
    CacheAware(cache_threshold=0.3, balance_abs_threshold=64.0, balance_rel_threshold=1.5)
    >>> create("cache_aware", preset="rust", cache_threshold=0.4)
    CacheAware(cache_threshold=0.4, balance_abs_threshold=32.0, balance_rel_threshold=1.1)
    """

    __slots__ = ("_extra", "balance_abs_threshold", "balance_rel_threshold", "cache_threshold")

    def __init__(
        self,
        cache_threshold: float | None = None,
        balance_abs_threshold: float | None = None,
        balance_rel_threshold: float | None = None,
        *,
        preset: str = "cli",
    ) -> None:
        rate, spread, ratio = CACHE_AWARE_PRESETS[
            check_choice("preset", preset, tuple(CACHE_AWARE_PRESETS))
        ]
        if cache_threshold is not None:
            rate = check_number("cache_threshold", cache_threshold, high=1.0)
        if balance_abs_threshold is not None:
            spread = check_number("balance_abs_threshold", balance_abs_threshold)
        if balance_rel_threshold is not None:
            ratio = check_number("balance_rel_threshold", balance_rel_threshold)
        self.cache_threshold = rate
        self.balance_abs_threshold = spread
        self.balance_rel_threshold = ratio
        self._extra = ReportedExtra()

    def __repr__(self) -> str:
        return (
            f"CacheAware(cache_threshold={self.cache_threshold}, "
            f"balance_abs_threshold={self.balance_abs_threshold}, "
            f"balance_rel_threshold={self.balance_rel_threshold})"
        )

    def choose(self, request: Request, view: View) -> Choice:
        """Return the worker the rule picks; reason ``"balance"``, ``"affinity"`` or ``"miss"``."""
        extra = self._extra(view.reported)
        loads = view.requests if extra is None else fresh_loads(view, False, extra)
        low, low_at, high, _, _ = extremes(loads)
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            detail = (("min_load", float(low)), ("max_load", float(high)))
            return new_choice(Choice, (view.workers[low_at], "balance", detail))
        size = len(request.tokens)
        lengths = view.lengths
        _, _, top, top_at, ties = extremes(lengths)
        rate = top / size if size else 0.0
        if rate > self.cache_threshold:
            # One longest match needs no tie-break scan.
            i = top_at if ties == 1 else _best_match(lengths, loads)
            return new_choice(Choice, (view.workers[i], "affinity", (("match_rate", rate),)))
        detail = (("match_rate", rate), ("load", float(low)))
        return new_choice(Choice, (view.workers[low_at], "miss", detail))

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """Every worker in the order of the rule's branch for this view.

        Imbalanced pool, or a match rate at most ``cache_threshold``: by load, least
        first (ties in view order). Otherwise by match length, longest first, then by
        load. O(workers log workers).
        """
        extra = self._extra(view.reported)
        loads = view.requests if extra is None else fresh_loads(view, False, extra)
        low, _, high, _, _ = extremes(loads)
        if high - low > self.balance_abs_threshold and high > self.balance_rel_threshold * low:
            return _by_load(view, loads)
        size = len(request.tokens)
        top = max(view.lengths)
        rate = top / size if size else 0.0
        if rate > self.cache_threshold:
            return _by_match(view, loads)
        return _by_load(view, loads)
