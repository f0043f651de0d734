"""Offered load: re-time a workload's arrivals so its work is a set share of a fleet's.

``--load 0.8`` compares policies at 80 % utilisation whatever the workload. The
calibration is a property of the workload and the fleet, never of the policy
under test, and it is deterministic:

- Each request's **work** is the busy time an ideal fleet spends on it: the
  prefill of the tokens no earlier prompt shares (the hit every prompt gets from
  one unbounded cache of all prompts in arrival order: the requests' shares of
  H*), plus ``output - 1`` decode steps at the batch a full pool runs, each
  costing a ``1/B`` share of a step of ``B`` sequences:
  ``w_i = prefill(p_i - h_i, p_i) + (o_i - 1) decode(B, B s) / B``, where
  ``s = mean(p) + mean(o) / 2`` is the mean KV of a running request and
  ``B = min(max_running, capacity // s)`` (``max_running`` when unbounded).
  Rejected requests (longer than the context or the pool) are no work.
- The fleet serves ``W`` worker-seconds a second. A workload whose arrivals span
  ``T`` seconds offers ``sum(w) / (W T)``; to offer ``load`` its arrival times are
  multiplied by ``f = sum(w) / (load W T)``, which keeps requests that arrive
  together together and the shape of its bursts. A workload that arrives all at
  once (``T = 0``) gets Poisson arrivals at ``load W n / sum(w)`` per second
  instead, seeded.

``load = 1`` is what an ideal router keeps exactly busy: H* hits, perfect
balance, full batches. A real policy hits less and balances worse, so its
utilisation at a given ``load`` is higher; at 0.5 a reasonable policy keeps its
queues short, at 0.95 they grow long.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from radixmeta.errors import InvalidInputError
from radixmeta.policies import costs

if TYPE_CHECKING:
    import numpy.typing as npt

    from radixmeta.sim.engine import SimConfig

__all__ = ["check_load", "offered_work", "scale_arrivals", "scale_to_load", "scale_to_rate"]


def check_load(load: object) -> float:
    """``load`` as a float in ``(0, inf)``; NaN, inf, zero and negatives are refused."""
    try:
        value = float(load)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        msg = f"load must be a number > 0, got {load!r}"
        raise InvalidInputError(msg) from None
    if not (math.isfinite(value) and value > 0):
        msg = f"load must be a finite number > 0 (0.8: 80 % of the fleet), got {load!r}"
        raise InvalidInputError(msg)
    return value


def offered_work(
    tokens: Sequence[npt.NDArray[np.uint32]], outputs: Sequence[int], config: SimConfig
) -> npt.NDArray[np.float64]:
    """Each request's work in seconds of one worker (module docstring). O(total tokens).

    Each prompt's hit comes from a one-worker :class:`~radixmeta.MetaTree` of every
    prompt before it (its full pages less the pages it newly marks): token ids
    only, a third of the memory of a :class:`~radixmeta.RadixCache`, which keeps a
    KV slot beside each.
    """
    from radixmeta.meta import MetaTree

    prefill = costs.prefill_model(config.prefill)
    decode = costs.decode_model(config.decode)
    capacity = config.resolved("capacity")
    context = config.resolved("context_len")
    limit = min(x for x in (capacity, context, math.inf) if x is not None)
    prompts = np.fromiter((len(t) for t in tokens), np.int64, len(tokens))
    outs = np.maximum(np.asarray(outputs, dtype=np.int64), 1)
    served = prompts + outs < limit
    work = np.zeros(len(tokens), dtype=np.float64)
    if not served.any():
        return work
    mean_seq = float(prompts[served].mean() + outs[served].mean() / 2)
    batch = config.limits.max_running
    if capacity is not None:
        batch = max(1, min(batch, int(capacity // max(mean_seq, 1.0))))
    per_token = decode(batch, int(batch * mean_seq)) / batch
    page = config.page_size
    tree = MetaTree(page)
    only = tree.add_worker("offered")
    for i, prompt in enumerate(tokens):
        hit = (len(prompt) // page - tree.insert(prompt, only)) * page
        if served[i]:
            length = int(prompts[i])
            work[i] = prefill(max(length - hit, 1), length) + (int(outs[i]) - 1) * per_token
    return work


def scale_arrivals(arrivals: Sequence[float], factor: float) -> list[float]:
    """Arrival times stretched by ``factor`` from the first: equal times stay equal."""
    if not arrivals:
        return []
    first = float(arrivals[0])
    return [(float(a) - first) * factor for a in arrivals]


def scale_to_rate(arrivals: Sequence[float], rate: float) -> tuple[list[float], float]:
    """Stretch a timed workload to a mean of ``rate`` requests a second; returns it and the factor.

    The shape is kept (bursts, requests that arrive together); ``rate = inf``
    sends everything at once.
    """
    n = len(arrivals)
    span = float(arrivals[-1]) - float(arrivals[0]) if n else 0.0
    if math.isinf(rate):
        return [0.0] * n, 0.0
    if span <= 0:
        msg = "--rate on a workload that arrives all at once has no shape to stretch"
        raise InvalidInputError(msg)
    factor = n / (rate * span)
    return scale_arrivals(arrivals, factor), factor


def scale_to_load(
    tokens: Sequence[npt.NDArray[np.uint32]],
    arrivals: Sequence[float],
    outputs: Sequence[int],
    config: SimConfig,
    load: float,
) -> tuple[list[float], dict[str, Any]]:
    """The arrivals that offer ``load`` of ``config``'s fleet, and how they were made.

    Returns the new arrival times and ``{"load", "work", "factor" or "rate"}``:
    the total work (worker-seconds), and the factor the times were multiplied by
    (or the Poisson rate given to a workload that arrived all at once).

    Examples
    --------
    >>> from radixmeta.sim.workloads import gsp
    >>> from radixmeta.sim.engine import SimConfig
    >>> w = gsp(num_groups=4, prompts_per_group=4, rate=10.0, seed=0)
    >>> cfg = SimConfig(workers=2)
    >>> half, info = scale_to_load([r.tokens for r in w], w.arrivals, w.output_lens, cfg, 0.5)
    >>> full, _ = scale_to_load([r.tokens for r in w], w.arrivals, w.output_lens, cfg, 1.0)
    >>> round(half[-1] / full[-1], 6)   # half the load: twice the span
    2.0
    """
    value = check_load(load)
    work = offered_work(tokens, outputs, config)
    total = float(work.sum())
    n = len(arrivals)
    if n == 0 or total <= 0:
        msg = "--load needs a workload with work to do (every request was rejected or empty)"
        raise InvalidInputError(msg)
    span = float(arrivals[-1]) - float(arrivals[0])
    capacity = value * config.workers  # worker-seconds a second the load asks for
    if span > 0:
        factor = total / (capacity * span)
        return scale_arrivals(arrivals, factor), {"load": value, "work": total, "factor": factor}
    rate = capacity * n / total
    rng = np.random.Generator(np.random.PCG64(config.seed))
    gaps = rng.exponential(1.0 / rate, size=n - 1)
    times = np.concatenate(([0.0], np.cumsum(gaps))).tolist()
    return times, {"load": value, "work": total, "rate": rate}
