"""NVIDIA Dynamo's KV-router cost: blocks to prefill (weighted) plus blocks in decode.

Source: ``ai-dynamo/dynamo``, its KV router's ``scheduler.rs`` and ``sequence.rs``
(the form documented from about v0.4 to v1.0, with defaults
``overlap_score_weight = 1.0`` and ``router_temperature = 0``). Dynamo counts in KV
blocks; here a block is a page of the MetaTree (``view.page_size`` tokens).
"""

from __future__ import annotations

import math
from random import Random as _Rng

from radixmeta._workers import WorkerId
from radixmeta.policies._params import check_number, check_seed
from radixmeta.policies._ranking import first_then, generator_copy
from radixmeta.policies.base import Choice, Request, View

__all__ = ["DynamoCost"]


class DynamoCost:
    """Lowest ``overlap_score_weight * prefill_blocks + decode_blocks`` wins.

    Per worker ``i``, with ``B = view.page_size`` and ``L`` the prompt length:

    - ``prefill_blocks = (L - lengths[i] + prefill_tokens[i]) / B``: the request's
      uncached tokens plus the uncached prompt tokens already waiting on ``i``;
    - ``decode_blocks = decode_tokens[i] / B + ceil(L / B)``: the blocks of the
      requests decoding on ``i`` plus the request's own. Dynamo counts only the
      request's blocks not already active on ``i``; the view does not say which
      those are, so all are counted, which adds the same amount on every worker;
    - ``cost = overlap_score_weight * prefill_blocks + decode_blocks``.

    With ``temperature == 0`` the lowest cost wins, a tie drawn at random (Dynamo
    breaks ties by the smaller tree, then at random; the view has no tree sizes).
    With ``temperature > 0`` the worker is drawn with probability proportional to
    ``exp(-((cost - min) / (max - min)) / temperature)`` (uniform when all costs are
    equal), Dynamo's ``softmax_sample``. Draws come from the policy's own seeded
    generator.

    Parameters
    ----------
    overlap_score_weight : float, default 1.0
        Weight of the prefill blocks against the decode blocks, ``>= 0``.
    temperature : float, default 0.0
        Softmax temperature over range-normalised costs, ``>= 0``; 0 is arg-min.
    seed : int, default 0
        Seed of the policy's generator.

    Complexity: O(workers) per ``choose``.

    Examples
    --------
    >>> from radixmeta.policies import create
    >>> create("dynamo_cost", temperature=0.5, seed=3)
    DynamoCost(overlap_score_weight=1.0, temperature=0.5, seed=3)
    """

    __slots__ = ("_rng", "_seed", "overlap_score_weight", "temperature")

    def __init__(
        self, overlap_score_weight: float = 1.0, temperature: float = 0.0, seed: int = 0
    ) -> None:
        self.overlap_score_weight = check_number("overlap_score_weight", overlap_score_weight)
        self.temperature = check_number("temperature", temperature)
        self._seed = check_seed(seed)
        self._rng = _Rng(self._seed)

    def __repr__(self) -> str:
        return (
            f"DynamoCost(overlap_score_weight={self.overlap_score_weight}, "
            f"temperature={self.temperature}, seed={self._seed})"
        )

    def costs(self, request: Request, view: View) -> list[float]:
        """The cost of every worker of ``view``, aligned with ``view.workers``."""
        block = view.page_size
        size = len(request.tokens)
        own = -(-size // block)
        weight = self.overlap_score_weight
        return [
            weight * ((size - matched + waiting) / block) + (decoding / block + own)
            for matched, waiting, decoding in zip(
                view.lengths, view.prefill_tokens, view.decode_tokens, strict=True
            )
        ]

    def choose(self, request: Request, view: View) -> Choice:
        """Return the cheapest worker, or one drawn by the softmax (reason ``"cost"``)."""
        costs = self.costs(request, view)
        low = min(costs)
        if self.temperature == 0.0:
            ties = [i for i, cost in enumerate(costs) if cost == low]
            i = ties[0] if len(ties) == 1 else ties[self._rng.randrange(len(ties))]
        else:
            i = self._sample(costs, low, self._rng)
        block = view.page_size
        size = len(request.tokens)
        detail = (
            ("cost", costs[i]),
            ("prefill_blocks", (size - view.lengths[i] + view.prefill_tokens[i]) / block),
            ("decode_blocks", view.decode_tokens[i] / block + -(-size // block)),
        )
        return Choice(view.workers[i], "cost", detail)

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """The worker ``choose`` will take, then the others by cost, cheapest first.

        ``choose``'s draw (a tie, or the softmax) is made from a copy of the policy's
        generator, which is only read (never swapped or advanced), so the ``choose``
        that follows draws the same worker and ranking changes nothing; the others
        are in cost order, ties in view order. O(workers log workers).
        """
        costs = self.costs(request, view)
        low = min(costs)
        rng = generator_copy(self._rng)  # the policy's own generator is only read
        if self.temperature == 0.0:
            ties = [i for i, cost in enumerate(costs) if cost == low]
            first = ties[0] if len(ties) == 1 else ties[rng.randrange(len(ties))]
        else:
            first = self._sample(costs, low, rng)
        return first_then(view.workers, first, costs.__getitem__)

    def _sample(self, costs: list[float], low: float, rng: _Rng) -> int:
        """A position drawn by the softmax over range-normalised costs, from ``rng``."""
        spread = max(costs) - low
        if spread == 0.0:
            return rng.randrange(len(costs))
        t = self.temperature
        weights = [math.exp(-((cost - low) / spread) / t) for cost in costs]
        point = rng.random() * sum(weights)
        for i, weight in enumerate(weights):
            point -= weight
            if point < 0.0:
                return i
        return len(costs) - 1
