"""radixmeta's own policy: the least estimated time to first token, counting the work it adds.

The aim is both halves of the SGLang A.4 claim at once: the hit rate of a single
tree (each shared prefix computed once) while the fleet is not loaded, and linear
scaling when it is (a prefix group too hot for one worker spreads over several).
The design and its reasoning are in :doc:`/routing`; in short, per worker:

- ``own``: the prefill time of this request's uncached tokens there (host-held
  tokens count as ``host_weight`` of a hit);
- ``wait``: the time to prefill the uncached tokens already queued there, at the
  model's rate for a 512-token chunk;
- ``slow = 1 + requests / 512``: each in-flight request adds a token to every
  prefill chunk of the worker;
- ``score = slow * (wait + (1 + work_weight) * own)``.

The lowest score wins among the workers whose KV would hold the request; ties go
to the fewest tokens in flight, then rotate. The worker holding a group's prefix
wins while its queue is short; once its queue costs more than recomputing the
prefix elsewhere (twice over with the default ``work_weight``), requests spill to
another worker, which then holds the prefix too: replication, driven by load.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

from radixmeta.policies._params import check_number, new_choice
from radixmeta.policies.base import Choice, Request, View
from radixmeta.policies.costs import DEFAULT_PREFILL, PrefillTime, model_name, prefill_model

__all__ = ["CHUNK_TOKENS", "DefaultPolicy"]

#: Tokens per prefill chunk, the unit of the queue estimate (Preble's workers run
#: chunked prefill with a 512-token budget).
CHUNK_TOKENS = 512
_TIMES_KEPT = 1 << 16


class DefaultPolicy:
    """The least estimated time to first token, plus the prefill work the choice adds.

    Per worker ``i``, with ``T`` the prefill model and ``L`` the prompt length:

    - ``own_i = T(L - host_i, L) + (1 - host_weight) * (T(L - lengths_i, L) - T(L - host_i, L))``
      (the whole miss when nothing is on the host);
    - ``wait_i = prefill_tokens_i * T(512, 512) / 512``;
    - ``slow_i = 1 + requests_i / 512``;
    - ``score_i = slow_i * (wait_i + (1 + work_weight) * own_i)``.

    ``slow_i * (wait_i + own_i)`` estimates the request's time to first token on
    ``i``; the extra ``work_weight * own_i`` charges the choice for the time its
    prefill takes from the requests that will queue behind it, which keeps a short
    queue on the prefix holder from losing to an idle worker that would recompute
    the prefix. Workers whose KV capacity (when known) cannot take the request on
    top of the tokens in flight are only chosen if none can. Ties go to the fewest
    tokens in flight, then to the next worker in a rotation, so new prefix groups
    spread over idle workers instead of piling on the first.

    Parameters
    ----------
    prefill : str or callable, default "mistral_7b_a6000"
        The prefill model, a name of :data:`~radixmeta.policies.costs.PREFILL_MODELS`
        or any ``(extend, context) -> seconds``.
    work_weight : float, default 1.0
        How much a request's own prefill counts beyond its own wait, ``>= 0``. With 0
        the policy is pure least-TTFT (Mooncake's rule without KV transfer), which
        replicates a prefix as soon as a second worker would answer sooner.
    host_weight : float, default 0.75
        The fraction of a device hit that a host-held token is worth, in ``[0, 1]``
        (Dynamo's default ``host_cache_hit_weight``).

    Notes
    -----
    Complexity: O(workers) per ``choose``, with at most two prefill-model calls
    per distinct match length.

    Batches: a batch (``Router.dispatch_batch``) is decided whole by :meth:`choose_batch`:
    the batch's shared-prefix groups are packed onto the workers by the prefill
    work they bring, largest first, each to the worker it leaves least loaded, and
    a group larger than half a worker's fair share is cut into pieces of at most a
    quarter of it (its prefix is then computed once per piece: the replication of
    a group that would overload one worker; quarters leave the packing enough
    small pieces to even the workers out).

    Examples
    --------
    >>> from radixmeta.policies import create
    >>> create("default")
    DefaultPolicy(prefill='mistral_7b_a6000', work_weight=1.0, host_weight=0.75)
    """

    __slots__ = (
        "_capacities",
        "_least_capacity",
        "_model_name",
        "_orders",
        "_prefill",
        "_times",
        "_token_time",
        "_turn",
        "host_weight",
        "work_weight",
    )

    def __init__(
        self,
        prefill: str | PrefillTime = DEFAULT_PREFILL,
        work_weight: float = 1.0,
        host_weight: float = 0.75,
    ) -> None:
        self._prefill = prefill_model(prefill)
        self._model_name = model_name(prefill)
        self.work_weight = check_number("work_weight", work_weight)
        self.host_weight = check_number("host_weight", host_weight, high=1.0)
        self._token_time = self._prefill(CHUNK_TOKENS, CHUNK_TOKENS) / CHUNK_TOKENS
        self._turn = 0
        # Per worker count, the scan order of each turn of the rotation.
        self._orders: dict[int, list[tuple[int, ...]]] = {}
        # Prefill times by (prompt length << 32 | cached length): a prompt's length
        # and its match repeat across requests, and a model call costs more than a
        # dict lookup. Cleared when it grows past _TIMES_KEPT.
        self._times: dict[int, float] = {}
        # The least capacity of the last capacities list seen (None: some unknown).
        self._capacities: object = None
        self._least_capacity: int | None = None

    def __repr__(self) -> str:
        return (
            f"DefaultPolicy(prefill={self._model_name!r}, work_weight={self.work_weight}, "
            f"host_weight={self.host_weight})"
        )

    def choose_batch(
        self,
        requests: Sequence[Request],
        views: Sequence[View],
        groups: Sequence[tuple[Sequence[int], int]],
    ) -> list[Choice]:
        """Decide a batch by packing its prefix groups on the workers (class docstring).

        Work is counted in prompt tokens to compute: a group's shared prefix, less
        what the worker already holds of it, plus every member's own part. A worker
        starts with the prefill tokens already queued on it. Each decision's reason
        is ``"batch"``, with the piece's ``group_tokens`` and the worker's
        ``worker_tokens`` after it. O(requests + groups x workers).
        """
        if not requests:
            return []
        workers = views[0].workers
        n = len(workers)
        load = [float(q) for q in views[0].prefill_tokens]
        pieces: list[tuple[float, list[int], int]] = []
        total = sum(load)
        for indices, shared in groups:
            tails = [len(requests[i].tokens) - shared for i in indices]
            total += shared + sum(tails)
            pieces.append((shared + sum(tails), list(indices), shared))
        fair = total / n
        cap = max(fair / 4.0, 1.0)
        cut: list[tuple[float, list[int], int]] = []
        for work, indices, shared in pieces:
            if work <= fair / 2.0 or len(indices) == 1:
                cut.append((work, indices, shared))
                continue
            run: list[int] = []
            size = float(shared)
            for i in indices:
                own = len(requests[i].tokens) - shared
                if run and size + own > cap:
                    cut.append((size, run, shared))
                    run, size = [], float(shared)
                run.append(i)
                size += own
            cut.append((size, run, shared))
        cut.sort(key=lambda piece: -piece[0])
        out: list[Choice | None] = [None] * len(requests)
        for work, indices, shared in cut:
            held = views[indices[0]].lengths
            best, best_after = 0, math.inf
            for w in range(n):
                after = load[w] + work - min(held[w], shared)
                if after < best_after:
                    best, best_after = w, after
            load[best] = best_after
            detail = (("group_tokens", work), ("worker_tokens", best_after))
            choice = Choice(workers[best], "batch", detail)
            for i in indices:
                out[i] = choice
        return [c for c in out if c is not None]

    def choose(self, request: Request, view: View) -> Choice:
        """Return the lowest-score worker; reason ``"affinity"``, ``"spill"`` or ``"balance"``.

        ``"affinity"``: the worker holds the longest match in the fleet (device or
        host); ``"spill"``: another worker holds a longer one, so the prefix is
        replicated; ``"balance"``: no worker holds any of the prompt. The detail has
        the estimated ``ttft`` and ``prefill`` (seconds), and the ``matched``,
        ``host_matched`` and fleet-wide ``best_matched`` lengths (tokens).
        """
        size = len(request.tokens)
        workers = view.workers
        lengths = view.lengths
        host = view.host_lengths
        queued = view.prefill_tokens
        decoding = view.decode_tokens
        requests = view.requests
        capacities = view.capacities
        n = len(workers)
        order = self._orders.get(n)
        if order is None:
            order = self._orders[n] = [(*range(s, n), *range(s)) for s in range(n)]
        turn = self._turn % n
        self._turn = turn + 1
        scan = order[turn]
        token_time = self._token_time
        times = self._times
        if len(times) > _TIMES_KEPT:
            times.clear()

        # The lean scan, for what nearly every request is: nothing on a host tier (the
        # router then passes one list for both) and every worker with room for it.
        if host is not lengths:
            lean = False
        else:
            if capacities is not self._capacities:  # the router's list changes on refresh
                self._capacities = capacities
                self._least_capacity = (
                    None if None in capacities else min(cast(list[int], capacities))
                )
            least = self._least_capacity
            if least is None:
                lean = capacities.count(None) == n
            else:
                lean = least >= size + max(queued) + max(decoding)
        if lean:
            prefill = self._prefill
            weight = 1.0 + self.work_weight
            base = size << 32
            best = scan[0]
            best_score = math.inf
            best_own = 0.0
            for i in scan:
                matched = lengths[i]
                own = times.get(base | matched)
                if own is None:
                    own = times[base | matched] = prefill(size - matched, size)
                score = (1.0 + requests[i] / CHUNK_TOKENS) * (token_time * queued[i] + weight * own)
                if score < best_score or (
                    score == best_score
                    and queued[i] + decoding[i] < queued[best] + decoding[best]
                ):
                    best, best_score, best_own = i, score, own
            if best_score == math.inf:  # no finite score (a user's model): the first
                best_own = times[base | lengths[best]]
        else:
            best, best_own = self._general(
                scan, size, lengths, host, queued, decoding, requests, capacities
            )

        top = max(host)
        chosen = host[best]
        if top == 0:
            reason = "balance"
        elif chosen == top:
            reason = "affinity"
        else:
            reason = "spill"
        slow = 1.0 + requests[best] / CHUNK_TOKENS
        detail = (
            ("ttft", slow * (token_time * queued[best] + best_own)),
            ("prefill", best_own),
            ("matched", float(lengths[best])),
            ("host_matched", float(chosen)),
            ("best_matched", float(top)),
        )
        return new_choice(Choice, (workers[best], reason, detail))

    def _general(
        self,
        order: tuple[int, ...],
        size: int,
        lengths: list[int],
        host: list[int],
        queued: list[int],
        decoding: list[int],
        requests: list[int],
        capacities: list[int | None],
    ) -> tuple[int, float]:
        """``choose``'s scan with host-held pages and capacities: (best index, its own time)."""
        prefill = self._prefill
        weight = 1.0 + self.work_weight
        host_weight = self.host_weight
        token_time = self._token_time
        times = self._times
        base = size << 32
        best = -1
        best_fits = False
        best_score = math.inf
        best_tokens = 0
        best_own = 0.0
        for i in order:
            matched = lengths[i]
            miss = times.get(base | matched)
            if miss is None:
                miss = times[base | matched] = prefill(size - matched, size)
            held = host[i]
            if held > matched:
                rest = times.get(base | held)
                if rest is None:
                    rest = times[base | held] = prefill(size - held, size)
                own = rest + (1.0 - host_weight) * (miss - rest)
            else:
                own = miss
            in_flight = queued[i] + decoding[i]
            capacity = capacities[i]
            fits = capacity is None or in_flight + size - matched <= capacity
            score = (1.0 + requests[i] / CHUNK_TOKENS) * (token_time * queued[i] + weight * own)
            if (
                best < 0
                or (fits and not best_fits)
                or (
                    fits == best_fits
                    and (score < best_score or (score == best_score and in_flight < best_tokens))
                )
            ):
                best = i
                best_fits = fits
                best_score = score
                best_tokens = in_flight
                best_own = own
        return best, best_own
