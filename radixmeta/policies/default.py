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
from collections import Counter
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


class _Piece:
    """Members of one prefix group placed together by ``choose_batch``."""

    __slots__ = ("group", "held", "members", "shared", "tail_work", "tails")

    def __init__(
        self, group: int, members: list[int], tails: list[float], shared: int, held: list[int]
    ) -> None:
        self.group = group  # the batch group it is (part of)
        self.members = members
        self.tails = tails
        self.shared = shared
        self.held = held
        self.tail_work = sum(tails)

    @property
    def work(self) -> float:
        """Its tokens to compute on a worker that holds none of it."""
        return self.shared + self.tail_work

    def cut(self, limit: float, size: float) -> list[_Piece]:
        """Itself if its work is at most ``limit`` (or it has one member), else runs of
        its members in order, each of work at most ``size`` (at least one member)."""
        if self.work <= limit or len(self.members) == 1:
            return [self]
        parts: list[_Piece] = []
        start, work = 0, float(self.shared)
        for k, tail in enumerate(self.tails):
            if k > start and work + tail > size:
                parts.append(self._part(start, k))
                start, work = k, float(self.shared)
            work += tail
        parts.append(self._part(start, len(self.tails)))
        return parts

    def _part(self, start: int, stop: int) -> _Piece:
        return _Piece(
            self.group, self.members[start:stop], self.tails[start:stop], self.shared, self.held
        )

    def prefix_on(self, worker: int) -> float:
        """The group prefix's tokens that ``worker`` would compute."""
        return float(self.shared - min(self.held[worker], self.shared))

    def cost_on(self, worker: int) -> float:
        """Its tokens to compute on ``worker``."""
        return self.prefix_on(worker) + self.tail_work


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
    the batch's shared-prefix groups are packed onto the workers by the tokens they
    bring, largest first, each to the worker it leaves least loaded; only a group
    bigger than a worker's fair share is cut beforehand, and members then move off
    the busiest worker while that lowers its load. Groups stay whole unless load
    forbids it; the prefix of a group that is split is computed once per worker
    it lands on (the replication of a group that would overload one worker).

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
        starts with the prefill tokens already queued on it. Whole groups are
        packed largest first, each on the worker it leaves least loaded; then, while
        it lowers the busiest worker's load, members of one of the busiest worker's
        groups (split already, or bigger than half a share) move to the least loaded
        worker, which computes the group's prefix once more. Each decision's reason
        is ``"batch"``, with its piece's ``group_tokens`` and the worker's
        ``worker_tokens`` once the batch is placed. O(requests + (groups + moves) x
        workers + moves x pieces), at most ``4 x workers + groups`` moves.
        """
        if not requests:
            return []
        workers = views[0].workers
        n = len(workers)
        load = [float(q) for q in views[0].prefill_tokens]
        # A piece: members, their own tokens (past the shared prefix), the prefix, and
        # what each worker holds of the group's first request.
        pieces: list[_Piece] = []
        for g, group in enumerate(groups):
            indices, shared = group
            members = list(indices)
            # The router's groups say what each member adds to its group's trie (its
            # own tokens past what an earlier member shares with it); a user's groups
            # may not, and then everything past the group's prefix counts.
            own = getattr(group, "own", None)
            if own is not None and len(own) == len(members):
                tails = [float(t) for t in own]
            else:
                tails = [float(len(requests[i].tokens) - shared) for i in members]
            pieces.append(_Piece(g, members, tails, shared, views[members[0]].lengths))
        # A group bigger than a worker's fair share cannot stay on one worker: it is
        # cut, before any packing, into pieces of at most a quarter share, but never
        # so small that its prefix (computed once per piece) is more than a quarter
        # of a piece. Evenly sized pieces also spread evenly the error of the token
        # counts (a cache that evicts computes more than them).
        fair = (sum(load) + sum(piece.work for piece in pieces)) / n
        pieces = [
            part
            for piece in pieces
            for part in piece.cut(fair, max(fair / 4.0, 4.0 * piece.shared))
        ]
        where = [0] * len(pieces)
        # (group, worker) of every piece placed: a second piece of a group on the
        # same worker shares the first one's prefix there.
        placed: set[tuple[int, int]] = set()
        for p in sorted(range(len(pieces)), key=lambda p: -pieces[p].work):
            piece = pieces[p]
            best, best_after = 0, math.inf
            for w in range(n):
                prefix = 0.0 if (piece.group, w) in placed else piece.prefix_on(w)
                after = load[w] + prefix + piece.tail_work
                if after < best_after:
                    best, best_after = w, after
            where[p] = best
            load[best] = best_after
            placed.add((piece.group, best))
        # Groups in several pieces already: moving more of them costs less in hits
        # than splitting one more group, which only a group above half a share risks.
        split = {g for g, count in Counter(piece.group for piece in pieces).items() if count > 1}
        for _ in range(4 * n + len(pieces)):
            if not self._move_part(pieces, where, load, placed, split, fair / 2.0):
                break
        out: list[Choice | None] = [None] * len(requests)
        for p, piece in enumerate(pieces):
            w = where[p]
            detail = (("group_tokens", piece.cost_on(w)), ("worker_tokens", load[w]))
            choice = new_choice(Choice, (workers[w], "batch", detail))
            for i in piece.members:
                out[i] = choice
        return [c for c in out if c is not None]

    @staticmethod
    def _move_part(
        pieces: list[_Piece],
        where: list[int],
        load: list[float],
        placed: set[tuple[int, int]],
        split: set[int],
        whole_limit: float,
    ) -> bool:
        """Move members of one of the busiest worker's groups to the least loaded worker,
        if that lowers the busiest load; returns whether it did. Only a group split
        already or bigger than ``whole_limit`` tokens gives members."""
        high = load.index(max(load))
        low = load.index(min(load))
        if high == low:
            return False
        # Of the busiest worker's pieces, the move that leaves the lower busiest load
        # (the prefix is free where its group already is); ties to the larger piece.
        best: tuple[float, float, int, int, float, float] | None = None
        for p, w in enumerate(where):
            piece = pieces[p]
            if w != high or len(piece.members) < 2:
                continue
            if piece.group not in split and piece.work <= whole_limit:
                continue  # a group that fits stays whole
            prefix = 0.0 if (piece.group, low) in placed else piece.prefix_on(low)
            # Even the two loads out: the moved members' own tokens leave ``high``,
            # and ``low`` gets them plus the prefix it lacks.
            target = (load[high] - load[low] - prefix) / 2.0
            moved, work, tails = 0, 0.0, piece.tails
            while moved < len(tails) - 1:
                tail = tails[len(tails) - 1 - moved]
                if work + tail > target and moved:
                    break
                moved += 1
                work += tail
            after = max(load[high] - work, load[low] + prefix + work)
            key = (after, -piece.tail_work)
            if after < load[high] and (best is None or key < best[:2]):
                best = (after, -piece.tail_work, p, moved, work, prefix)
        if best is None:
            return False
        _, _, p, moved, work, prefix = best
        piece = pieces[p]
        tails = piece.tails
        cut = len(piece.members) - moved
        part = _Piece(piece.group, piece.members[cut:], tails[cut:], piece.shared, piece.held)
        del piece.members[cut:], tails[cut:]
        piece.tail_work -= work
        pieces.append(part)
        where.append(low)
        placed.add((piece.group, low))
        split.add(piece.group)
        load[high] -= work
        load[low] += prefix + work
        return True

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
