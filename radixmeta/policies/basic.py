"""Cache-blind policies: round robin, random, least loaded, power of two choices.

They ignore the match lengths of the view, so they are the baselines every
prefix-aware policy is compared with: with ample cache they are close to the best
(every worker ends up holding every hot prefix), under cache pressure they lose
(see the reference numbers in :doc:`/routing`). Each ``choose`` is O(workers).
"""

from __future__ import annotations

from random import Random as _Rng

from radixmeta._workers import WorkerId
from radixmeta.policies._params import (
    LOAD_MEASURES,
    ReportedExtra,
    check_choice,
    check_seed,
    extremes,
    fresh_loads,
    new_choice,
)
from radixmeta.policies._ranking import generator_copy
from radixmeta.policies.base import Choice, Request, View

__all__ = ["LeastLoaded", "PowerOfTwo", "Random", "RoundRobin"]


class RoundRobin:
    """Each request to the next worker in turn.

    The SGLang data-parallel controller's default, and the baseline of the Preble
    and SGLang router evaluations. The turn is a counter taken modulo the number of
    workers in the view, so a worker joining or leaving shifts the rotation but
    never skips a live worker for long.

    Complexity: O(1) per ``choose``.

    Examples
    --------
    >>> from radixmeta.policies import create
    >>> create("round_robin")
    RoundRobin()
    """

    __slots__ = ("_turn",)

    def __init__(self) -> None:
        self._turn = 0

    def __repr__(self) -> str:
        return "RoundRobin()"

    def choose(self, request: Request, view: View) -> Choice:
        """Return the worker whose turn it is (reason ``"round_robin"``)."""
        workers = view.workers
        worker = workers[self._turn % len(workers)]
        self._turn += 1
        return Choice(worker, "round_robin")

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """Every worker in the order of the coming turns, the one whose turn it is first.

        O(workers); changes nothing (the turn moves on in ``choose`` only).
        """
        workers = view.workers
        turn = self._turn % len(workers)
        return [*workers[turn:], *workers[:turn]]


class Random:
    """Each request to a worker drawn uniformly, from the policy's own seeded generator.

    sgl-router's ``random`` policy. The same seed and the same views give the same
    choices; the policy never reads the global ``random`` state.

    Parameters
    ----------
    seed : int, default 0
        Seed of the policy's generator.

    Complexity: O(1) per ``choose``.
    """

    __slots__ = ("_rng", "_seed")

    def __init__(self, seed: int = 0) -> None:
        self._seed = check_seed(seed)
        self._rng = _Rng(self._seed)

    def __repr__(self) -> str:
        return f"Random(seed={self._seed})"

    def choose(self, request: Request, view: View) -> Choice:
        """Return a uniformly drawn worker (reason ``"random"``)."""
        workers = view.workers
        return Choice(workers[self._rng.randrange(len(workers))], "random")

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """The worker ``choose`` will draw, then the others in an order drawn after it.

        Drawn from a copy of the policy's generator, so ``choose`` then draws the same
        worker. O(workers).
        """
        workers = view.workers
        rng = generator_copy(self._rng)
        first = rng.randrange(len(workers))
        rest = [i for i in range(len(workers)) if i != first]
        rng.shuffle(rest)
        return [workers[first], *(workers[i] for i in rest)]


class LeastLoaded:
    """Each request to the worker with the least load in flight.

    "Shortest queue", the load-only baseline (llm-d's load scorer, sgl-router's
    ``least_load``). The load is the router's own accounting in the view, either
    requests dispatched and not finished or tokens (uncached prefill tokens plus
    decode tokens), plus the requests a worker's engine reported beyond the
    router's own when it last reported (``view.reported``; another router's, or
    ones the router thinks finished), which the router's counts cannot see; in
    tokens each weighs the fleet's mean tokens per request in flight. Ties go to
    the first worker of the view; at low concurrency, when every load is 0, that
    is always the same worker (sgl-router issue #32983).

    Parameters
    ----------
    load : {"requests", "tokens"}, default "requests"
        The load measure.

    Complexity: O(workers) per ``choose``.
    """

    __slots__ = ("_by_tokens", "_extra", "_load")

    def __init__(self, load: str = "requests") -> None:
        self._load = check_choice("load", load, LOAD_MEASURES)
        self._by_tokens = load == "tokens"
        self._extra = ReportedExtra()

    def __repr__(self) -> str:
        return f"LeastLoaded(load={self._load!r})"

    def choose(self, request: Request, view: View) -> Choice:
        """Return the least loaded worker (reason ``"balance"``, detail: its load)."""
        loads = fresh_loads(view, self._by_tokens, self._extra(view.reported))
        low, i, _, _, _ = extremes(loads)
        return new_choice(Choice, (view.workers[i], "balance", (("load", float(low)),)))

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """Every worker by the load ``choose`` reads, least first; ties in view order.

        O(workers log workers).
        """
        loads = fresh_loads(view, self._by_tokens, self._extra(view.reported))
        workers = view.workers
        return [workers[i] for i in sorted(range(len(workers)), key=loads.__getitem__)]


class PowerOfTwo:
    """Draw two distinct workers at random, take the less loaded (Mitzenmacher's two choices).

    sgl-router's ``power_of_two`` compares the token loads the engines report
    (polled every ``load_check_interval_secs``) and falls back to request counts;
    here both measures come from the router's accounting in the view, which is
    current, plus what a worker's engine reported beyond the router's own requests
    (as :class:`LeastLoaded` counts it). A tie goes to the first of the two drawn.
    With one worker, it is chosen without a draw.

    Parameters
    ----------
    seed : int, default 0
        Seed of the policy's generator.
    load : {"requests", "tokens"}, default "tokens"
        The load measure.

    Complexity: O(1) per ``choose``.
    """

    __slots__ = ("_by_tokens", "_extra", "_load", "_rng", "_seed")

    def __init__(self, seed: int = 0, load: str = "tokens") -> None:
        self._seed = check_seed(seed)
        self._load = check_choice("load", load, LOAD_MEASURES)
        self._by_tokens = load == "tokens"
        self._rng = _Rng(self._seed)
        self._extra = ReportedExtra()

    def __repr__(self) -> str:
        return f"PowerOfTwo(seed={self._seed}, load={self._load!r})"

    def choose(self, request: Request, view: View) -> Choice:
        """Return the less loaded of two drawn workers (reason ``"balance"``)."""
        workers = view.workers
        n = len(workers)
        if n == 1:
            return Choice(workers[0], "balance")
        first = self._rng.randrange(n)
        second = self._rng.randrange(n - 1)
        if second >= first:
            second += 1
        extra = self._extra(view.reported)
        if extra is not None:
            loads = fresh_loads(view, self._by_tokens, extra)
            a, b = loads[first], loads[second]
        elif self._by_tokens:
            a = view.prefill_tokens[first] + view.decode_tokens[first]
            b = view.prefill_tokens[second] + view.decode_tokens[second]
        else:
            a = view.requests[first]
            b = view.requests[second]
        if b < a:
            return Choice(workers[second], "balance", (("load", float(b)), ("other", float(a))))
        return Choice(workers[first], "balance", (("load", float(a)), ("other", float(b))))

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """The two workers ``choose`` will draw (the one it takes first), then the rest by load.

        The draw is made from a copy of the policy's generator, so ``choose`` then
        draws the same two. The rest are ordered by the same load measure, least
        first, ties in view order. O(workers log workers).
        """
        workers = view.workers
        n = len(workers)
        if n == 1:
            return [workers[0]]
        rng = generator_copy(self._rng)
        first = rng.randrange(n)
        second = rng.randrange(n - 1)
        if second >= first:
            second += 1
        loads = fresh_loads(view, self._by_tokens, self._extra(view.reported))
        if loads[second] < loads[first]:
            first, second = second, first
        rest = [i for i in range(n) if i != first and i != second]
        rest.sort(key=loads.__getitem__)
        return [workers[first], workers[second], *(workers[i] for i in rest)]
