"""radixmeta's own policy: the least estimated time to first token, counting the work it adds.

The aim is both halves of the SGLang A.4 claim at once: the hit rate of a single
tree (each shared prefix computed once) while the fleet is not loaded, and linear
scaling when it is (a prefix group too hot for one worker spreads over several).
The design and its reasoning are in :doc:`/routing`; in short, per worker:

- ``own``: the prefill time of this request's uncached tokens there (host-held
  tokens count as ``host_weight`` of a hit);
- ``wait``: the time to prefill the uncached tokens already queued there, at the
  worker's own rate: the prefill seconds per uncached token of the requests in
  flight there (a 512-token chunk's rate while it has none);
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

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Sequence
from typing import cast

from radixmeta._workers import WorkerId
from radixmeta.policies._in_order import decide_in_order, links
from radixmeta.policies._params import ReportedExtra, check_number, new_choice
from radixmeta.policies.base import Choice, EngineLoad, Request, View
from radixmeta.policies.costs import (
    DECODE_MODELS,
    DEFAULT_PREFILL,
    DecodeTime,
    PrefillTime,
    decode_model,
    model_name,
    prefill_model,
)

__all__ = [
    "CHUNK_TOKENS",
    "CLIP_OUTPUT_TOKENS",
    "IN_ORDER_BUDGET",
    "IN_ORDER_COST",
    "DefaultPolicy",
]

#: Tokens per prefill chunk, the unit of the queue estimate (Preble's workers run
#: chunked prefill with a 512-token budget).
CHUNK_TOKENS = 512
#: Output tokens a request's KV reserve counts at most (SGLang's
#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``), as its admission does.
CLIP_OUTPUT_TOKENS = 4096
#: Seconds a batch may take to be decided request by request (``choose_batch``'s
#: in-order path): about one decode step of an engine, the time a batch waits for
#: the router without the wait showing against the engines' own.
IN_ORDER_BUDGET = 0.010
#: What deciding one request of a batch in order costs, in seconds: a fixed part and
#: a part per worker, an upper envelope of what ``bench/bench_batch_order.py``
#: measures. A batch of ``r`` requests on ``n`` workers is decided in order while
#: ``r * (IN_ORDER_COST[0] + n * IN_ORDER_COST[1]) <= IN_ORDER_BUDGET``.
IN_ORDER_COST = (30e-6, 1e-6)
_TIMES_KEPT = 1 << 16
_ORDERS_KEPT = 64
#: choose_batch's shortcuts for the common shapes of a large batch (groups of one
#: request, pieces that cost the same on every worker), which decide exactly as the
#: general code does; the tests turn them off to compare the two on random batches.
_FAST_PATHS = True
#: choose's lean scan for views with nothing on a host tier and room on every worker,
#: which decides exactly as the general scan does; the tests turn it off to compare.
_LEAN_SCAN = True


#: The floors of a piece of one member (read only: shared by every such piece).
_ALONE = [0]


class _Member:
    """What ``choose_batch`` knows of one request of a batch group."""

    __slots__ = ("common", "held", "index", "length", "partner")

    def __init__(self, index: int, length: int, partner: int, common: int, held: list[int]):
        self.index = index  # in the batch
        self.length = length
        self.partner = partner  # the earlier member it shares the most with (-1: none)
        self.common = common  # tokens shared with it
        self.held = held  # per worker, what the worker already holds of it


class _Piece:
    """Members of one prefix group placed together by ``choose_batch``.

    A member computes its prompt past the longest of: what the worker holds of
    it, and what it shares with an earlier member of the same piece (its
    partner's share when the partner is in the piece, else the group's shared
    prefix, which every member has in common with the piece's first one). The
    first member computes the shared prefix too unless another piece of the
    group is on that worker already.
    """

    __slots__ = ("_floors", "_row", "cold", "group", "members", "shared")

    def __init__(self, group: int, members: list[_Member], shared: int) -> None:
        self.group = group  # the batch group it is (part of)
        self.members = members
        self.shared = shared
        # Per member, the tokens it shares with earlier members of the piece.
        inside = {m.index for m in members}
        floors = [m.common if m.partner in inside else shared for m in members]
        floors[0] = 0
        self._floors = floors
        cold = 0
        for member, floor in zip(members, floors, strict=True):
            if member.length > floor:
                cold += member.length - floor
        self.cold = float(cold)
        self._row: list[float] | None = None

    @classmethod
    def single(
        cls,
        group: int,
        index: int,
        length: int,
        held: list[int],
        shared: int,
        even: dict[float, list[float]],
    ) -> _Piece:
        """The piece of a group of one request, what ``_Piece(group, [_Member(index,
        length, -1, 0, held)], shared)`` is, made without its loops (a batch of
        distinct prompts is one such group per request). ``even``: the rows of the
        pieces that cost the same on every worker by that cost, shared (rows are
        read only, and a batch of distinct prompts of one length has one)."""
        piece = cls.__new__(cls)
        piece.group, piece.shared = group, shared
        piece.members = [_Member(index, length, -1, 0, held)]
        piece._floors = _ALONE  # the first member shares nothing inside the piece
        cold = piece.cold = float(length) if length > 0 else 0.0
        piece._row = None
        if length <= 0 or max(held) <= 0:  # costs() would make [cold] * workers
            row = even.get(cold)
            if row is None:
                row = even[cold] = [cold] * len(held)
            piece._row = row
        return piece

    def costs(self) -> list[float]:
        """Per worker, its tokens to compute there (the group's prefix not there yet).

        Only members some worker holds more of than they share in the piece cost
        anything per worker; the others' part is the same everywhere.
        """
        if self._row is not None:
            return self._row
        members = self.members
        if len(members) == 1:  # floor 0: the held part of the prompt is saved
            cold, held, length = self.cold, members[0].held, members[0].length
            if length > 0 and max(held) > 0:
                row = [cold - (h if h < length else length) if h > 0 else cold for h in held]
            else:
                row = [cold] * len(held)
            self._row = row
            return row
        row = [self.cold] * len(members[0].held)
        for member, floor in zip(members, self._floors, strict=True):
            held = member.held
            length = member.length
            if length <= floor or max(held) <= floor:
                continue
            for w, h in enumerate(held):
                if h > floor:
                    row[w] -= (h if h < length else length) - floor
        self._row = row
        return row

    def cost(self, worker: int, prefix_there: bool) -> float:
        """Its tokens to compute on ``worker`` (-1: one holding nothing), with the group's
        prefix there already (another piece of it) or not."""
        if worker < 0:
            return self.cold
        total = self.costs()[worker]
        if prefix_there:  # the first member's floor rises from 0 to the shared prefix
            first = self.members[0]
            held = first.held[worker]
            before = max(0, first.length - held)
            after = max(0, first.length - max(self.shared, held))
            total -= before - after
        return total

    def split(self, cut: int) -> tuple[_Piece, _Piece]:
        """Its first ``cut`` members and the rest, as two pieces."""
        return (
            _Piece(self.group, self.members[:cut], self.shared),
            _Piece(self.group, self.members[cut:], self.shared),
        )

    def cut(self, limit: float, size: float) -> list[_Piece]:
        """Itself if its work is at most ``limit`` (or it has one member), else runs of
        its members in order, each of cold work at most ``size`` (at least one member);
        a run's work counts only the sharing inside it."""
        if self.cold <= limit or len(self.members) == 1:
            return [self]
        parts: list[_Piece] = []
        start, work = 0, 0
        inside: set[int] = set()
        for k, member in enumerate(self.members):
            floor = member.common if member.partner in inside else self.shared
            own = member.length - (0 if k == start else floor)
            if k > start and work + own > size:
                parts.append(_Piece(self.group, self.members[start:k], self.shared))
                start, work = k, 0
                inside = set()
                own = member.length
            work += max(0, own)
            inside.add(member.index)
        parts.append(_Piece(self.group, self.members[start:], self.shared))
        return parts


class DefaultPolicy:
    """The least estimated time to first token, plus the prefill work the choice adds.

    Per worker ``i``, with ``T`` the prefill model and ``L`` the prompt length:

    - ``own_i = T(L - host_i, L) + (1 - host_weight) * (T(L - lengths_i, L) - T(L - host_i, L))``
      (the whole miss when nothing is on the host);
    - ``wait_i = prefill_tokens_i * rate_i``, with ``rate_i`` the sum of
      ``T(L - matched, L)`` over the requests in flight on ``i`` over the sum of
      their ``L - matched`` (``T(512, 512) / 512`` while none is);
    - ``slow_i = 1 + requests_i / 512``;
    - ``score_i = slow_i * (wait_i + (1 + work_weight) * own_i)``.

    ``slow_i * (wait_i + own_i)`` estimates the request's time to first token on
    ``i``; the extra ``work_weight * own_i`` charges the choice for the time its
    prefill takes from the requests that will queue behind it, which keeps a short
    queue on the prefix holder from losing to an idle worker that would recompute
    the prefix. The queue is priced at its worker's own rate because prefill cost
    grows faster than linearly with the context: a worker serving long-context
    sessions is busier than its queued tokens at a short chunk's rate say. Workers
    whose KV capacity (when known) cannot take the request on top of the tokens in
    flight are only chosen if none can. Ties go to the fewest
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
    decode : str or callable, optional
        The decode-step model, ``(batch_size, context) -> seconds``, for the time a
        worker whose KV pool is full takes to free room (a name of
        :data:`~radixmeta.policies.costs.DECODE_MODELS`). Default: the decode fit
        of the same name as ``prefill`` when there is one; without a decode model
        memory waits are not estimated.

    Notes
    -----
    Complexity: O(workers) per ``choose``, with at most two prefill-model calls
    per distinct match length; O(1) per ``on_dispatch`` (one prefill-model call at
    most) and ``on_finish``.

    Batches: a batch (``Router.dispatch_batch``) small enough to be decided request
    by request within :data:`IN_ORDER_BUDGET` is, by ``choose`` itself, each request
    seeing the earlier ones' loads and pages: the decisions a run of single
    dispatches would make. A larger batch is decided whole by :meth:`choose_batch`:
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

    #: choose_batch takes the router's PrefixGroups (BatchPolicy's docstring).
    flat_groups = True

    __slots__ = (
        "_capacities",
        "_decode",
        "_decode_name",
        "_extra",
        "_flights",
        "_least_capacity",
        "_model_name",
        "_orders",
        "_outputs",
        "_prefill",
        "_priced",
        "_rate",
        "_times",
        "_token_time",
        "_turn",
        "_written",
        "host_weight",
        "work_weight",
    )

    def __init__(
        self,
        prefill: str | PrefillTime = DEFAULT_PREFILL,
        work_weight: float = 1.0,
        host_weight: float = 0.75,
        decode: str | DecodeTime | None = None,
    ) -> None:
        self._prefill = prefill_model(prefill)
        self._model_name = model_name(prefill)
        self._decode_name: str | None = None if decode is None else model_name(decode)
        if decode is None and isinstance(prefill, str) and prefill in DECODE_MODELS:
            decode = prefill
        self._decode: DecodeTime | None = None if decode is None else decode_model(decode)
        # Expected outputs seen, and their sum: the mean a running request decodes.
        self._outputs = [0, 0]
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
        self._extra = ReportedExtra()
        # Per worker in flight, [prefill seconds, uncached tokens, requests] of its requests, and
        # per request what it added: the queue's rate is the worker's own mix.
        # Both keyed by WorkerId.index: hashing the frozen WorkerId costs more than the
        # scan (a removed worker's requests are told on_finish, which empties its entry).
        self._priced: dict[int, list[float]] = {}
        self._flights: dict[str, tuple[WorkerId, float, int]] = {}
        # The ratio of the sums, per worker with a positive one: choose reads only this.
        self._rate: dict[int, float] = {}
        # Per worker (by index), the uncached tokens dispatched there so far: where the
        # fleet's prefixes live, for the workers that would start a request at once (_idle).
        self._written: dict[int, float] = {}

    def __repr__(self) -> str:
        decode = "" if self._decode_name is None else f", decode={self._decode_name!r}"
        return (
            f"DefaultPolicy(prefill={self._model_name!r}, work_weight={self.work_weight}, "
            f"host_weight={self.host_weight}{decode})"
        )

    def choose_batch(
        self,
        requests: Sequence[Request],
        views: Sequence[View],
        groups: Sequence[tuple[Sequence[int], int]],
    ) -> list[Choice]:
        """Decide a batch in order, or by packing its prefix groups on the workers.

        In order, while ``len(requests) * (IN_ORDER_COST[0] + workers *
        IN_ORDER_COST[1]) <= IN_ORDER_BUDGET`` and the groups name each request's
        partner (the router's do): each request by :meth:`choose`, its view adding
        the batch's earlier decisions' requests and uncached tokens to their
        workers' loads, and the whole pages it shares with the earlier requests
        sent to a worker to what that worker holds of it
        (:func:`~radixmeta.policies._in_order.decide_in_order`). Those are the
        decisions ``Router.dispatch`` would make for the requests one after the
        other (where the router estimates evictions, a page shared with a request
        just ahead in the batch counts as cached); the reasons are ``choose``'s.
        O(requests x workers), plus the shared pages' segments.

        Otherwise the batch is packed:
        Work is counted in prompt tokens to compute: each member's prompt past what
        the worker already holds of it and what it shares with earlier members
        placed with it (a group's shared prefix is computed once per worker), and a
        worker starts with the prefill tokens already queued on it, priced at its own
        rate as ``choose`` prices them: ``queued_w * rate_w / rate`` tokens at a
        512-token chunk's rate ``rate`` (:meth:`_queue_tokens`). Groups are
        packed largest first, each on the worker it leaves least loaded, whole, or
        (for a group bigger than a worker's share) cut into pieces, whichever
        packing leaves the lower busiest load. Then, while it lowers the busiest
        worker's load, members of one of its groups (split already, or bigger than
        half a share) move to the least loaded worker. Each decision's reason is
        ``"batch"``, with its piece's ``group_tokens`` and the worker's
        ``worker_tokens`` once the batch is placed. O((requests + groups) x workers)
        per packing, except that a piece costing the same on every worker (no worker
        holds any of it: a fresh prompt) is placed from a heap, which picks as the
        scan does, built only for a run of two or more such pieces of one cost:
        O(workers) to build it, then O(log workers) a piece of the run; a piece of a
        cost of its own is scanned, O(workers) (fresh prompts of distinct lengths
        cost what the scan costs); plus the moves, at
        most ``4 x workers + pieces`` of them, each scanning the pieces.
        """
        if not requests:
            return []
        first = views[0]
        n = len(first.workers)
        fixed, per_worker = IN_ORDER_COST
        if len(requests) * (fixed + n * per_worker) <= IN_ORDER_BUDGET:
            turn, outputs = self._turn, self._outputs[:]
            flights = self._flights.copy()
            priced = {w: entry[:] for w, entry in self._priced.items()}
            rate = self._rate.copy()
            written = self._written.copy()
            try:
                # Each decision is priced as on_dispatch would price it, so the next
                # request sees the rates single dispatches would show it; the router
                # tells on_dispatch of the whole batch afterwards, so the rates go back.
                decided = decide_in_order(self.choose, requests, views, groups, self.on_dispatch)
            except BaseException:
                # A batch that raises changes nothing: choose moved the rotation and
                # counted outputs for the requests before the one that raised.
                self._turn, self._outputs[:] = turn, outputs
                raise
            finally:
                self._flights, self._priced, self._rate = flights, priced, rate
                self._written = written
            if decided is not None:
                return cast(list[Choice], decided)
        return self._packed(requests, views, groups)

    def _packed(
        self,
        requests: Sequence[Request],
        views: Sequence[View],
        groups: Sequence[tuple[Sequence[int], int]],
    ) -> list[Choice]:
        """``choose_batch``'s packing path (its docstring)."""
        first = views[0]
        workers = first.workers
        n = len(workers)
        queued = [float(q) for q in first.prefill_tokens]
        # What the engines reported, as choose reads it: requests the router cannot see
        # queue at the mean uncached tokens of those it can and slow each prefill; the
        # requests waiting there are delayed by each token placed on the worker (the
        # batch's own later members the packing counts itself).
        extra = self._extra(first.reported)
        in_flight = [float(q + d) for q, d in zip(first.prefill_tokens, first.decode_tokens,
                                                   strict=True)]
        loads = list(first.requests)
        if extra is not None:
            total = sum(first.requests)
            unit = sum(first.prefill_tokens) / total if total else 0.0
            for w in range(n):
                queued[w] += extra[w] * unit
                loads[w] += extra[w]
        # The queues at their workers' own rates, as choose prices them (_queue_tokens);
        # the memory wait below needs the tokens themselves, as choose's does.
        tokens = queued
        queued = self._queue_tokens(workers, queued)
        speed = [1.0 + load / CHUNK_TOKENS for load in loads]
        seen = self._outputs
        for r in requests:
            if r.expected_output is not None:
                seen[0] += 1
                seen[1] += r.expected_output
        if self._decode is not None:
            # A worker whose pool is full first waits for room: for the tokens queued
            # there and a mean member of this batch, as prefill tokens of the same time.
            share = sum(len(r.tokens) for r in requests) / len(requests)
            token_time = self._token_time
            for w in range(n):
                capacity = first.capacities[w]
                if capacity is not None:
                    queued[w] += self._memory_wait(
                        tokens[w] + share, None, capacity, first.reported[w],
                        first.decode_tokens[w], loads[w],
                    ) / token_time
        behind = _behind(first.reported, first.requests)
        weight = [1.0 if behind is None else 1.0 + self.work_weight * behind] * n
        turn = self._turn % n
        self._turn = turn + 1
        order = (*range(turn, n), *range(turn))
        whole: list[_Piece] = []
        fast = _FAST_PATHS
        single = _Piece.single
        even: dict[float, list[float]] = {}  # the rows of pieces that cost the same everywhere
        # The router's groups name each request's partner in its group; a caller's own
        # may not, and then every member shares only its group's prefix.
        linked = links(len(requests), groups)
        if linked is None:
            linked = [-1] * len(requests), [0] * len(requests)
        partner, common = linked
        for g, (indices, shared) in enumerate(groups):
            if fast and len(indices) == 1:  # a group of one: no partner inside it
                i = indices[0]
                view = views[i]
                length = len(requests[i].tokens)
                held = view.lengths if view.expected is None else view.expected  # _held
                shared = length if length < shared else shared  # min(shared, length)
                whole.append(single(g, i, length, held, shared, even))
                continue
            if not indices:
                continue
            members = [
                _Member(i, len(requests[i].tokens), partner[i], common[i], _held(views[i]))
                for i in indices
            ]
            whole.append(_Piece(g, members, min(shared, min(m.length for m in members))))
        fair = (sum(queued) + sum(piece.cold for piece in whole)) / n
        # A group bigger than a worker's share cannot stay on one worker: cut into
        # pieces of at most a quarter share, but never so small that its prefix is
        # more than a quarter of a piece; evenly sized pieces also spread evenly the
        # error of the token counts (a cache that evicts computes more than them).
        cut = whole
        if any(piece.cold > fair and len(piece.members) > 1 for piece in whole):  # see cut
            cut = [
                part
                for piece in whole
                for part in piece.cut(fair, max(fair / 4.0, 4.0 * piece.shared))
            ]
        # Bounded pools: a group's prefix is computed again whenever the worker's other
        # requests push it out between two of its members (_Pools).
        capacities = first.capacities
        pools = None
        if None not in capacities and any(len(p.members) > 1 for p in whole):
            pools = _Pools(cast(list[int], capacities), queued)
        best = None
        for pieces in ([whole] if len(cut) == len(whole) else [whole, cut]):
            packing = _pack(list(pieces), queued, order, speed, weight, in_flight, pools, fast)
            if best is None or max(packing[2]) < max(best[2]):
                best = packing
        assert best is not None
        pieces, where, load, placed = best
        # Groups in several pieces already: moving more of them costs less in hits
        # than splitting one more group, which only a group above half a share risks.
        # (As many pieces as groups: the whole groups, none split.)
        split: set[int] = set()
        if len(pieces) > len(whole):
            split = {g for g, count in Counter(p.group for p in pieces).items() if count > 1}
        for _ in range(4 * n + len(pieces)):
            if not _move_part(pieces, where, load, placed, split, fair / 2.0, pools):
                break
        out: list[Choice | None] = [None] * len(requests)
        # Pieces of one cost on one worker have equal choices: one object for all of
        # them (a batch of distinct prompts of one length has a choice per worker, not
        # one per request: fewer objects to make and for the collector to walk after).
        made: list[dict[float, Choice]] = [{} for _ in range(n)]  # per worker, by cost
        for piece, w in zip(pieces, where, strict=True):
            choice = made[w].get(piece.cold)
            if choice is None:
                detail = (("group_tokens", piece.cold), ("worker_tokens", load[w]))
                choice = made[w][piece.cold] = new_choice(Choice, (workers[w], "batch", detail))
            for member in piece.members:
                out[member.index] = choice
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
        output = request.expected_output
        if output is not None:
            seen = self._outputs
            seen[0] += 1
            seen[1] += output
        workers = view.workers
        lengths = view.lengths
        host = view.host_lengths
        queued = view.prefill_tokens
        decoding = view.decode_tokens
        requests = view.requests
        capacities = view.capacities
        n = len(workers)
        turn = self._turn % n
        self._turn = turn + 1
        # The workers after ``turn`` in the rotation, kept per worker count up to a
        # size where a table of n x n entries is still small.
        if n <= _ORDERS_KEPT:
            orders = self._orders.get(n)
            if orders is None:
                orders = self._orders[n] = [(*range(s + 1, n), *range(s)) for s in range(n)]
            rest = orders[turn]
        else:
            rest = (*range(turn + 1, n), *range(turn))
        rates = self._rates(workers)
        times = self._times
        if len(times) > _TIMES_KEPT:
            times.clear()

        # What the engines reported, and what the router expects to stay cached: the
        # loaded scan reads them (load.py's rules); without them, the plain scans.
        reported = view.reported
        extra = self._extra(reported)
        behind = _behind(reported, requests)
        # Lists are compared by value: which list object a view carries means nothing
        # (``is`` only skips the comparison when it is the same list).
        expected = view.expected
        if expected is None:
            expected = lengths
        loaded = (
            extra is not None
            or behind is not None
            or (expected is not lengths and expected != lengths)
        )
        # The lean scan, for what nearly every request is without reports: nothing on a
        # host tier (host lengths equal to the device's) and every worker with room.
        if loaded or not _LEAN_SCAN or (host is not lengths and host != lengths):
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
            # The first of the rotation is the best so far whatever its score (a NaN
            # from a user's model then stays, as in the general scan).
            best = turn
            matched = lengths[best]
            best_own = times.get(base | matched)
            if best_own is None:
                best_own = times[base | matched] = prefill(size - matched, size)
            best_score = (1.0 + requests[best] / CHUNK_TOKENS) * (
                rates[best] * queued[best] + weight * best_own
            )
            for i in rest:
                matched = lengths[i]
                own = times.get(base | matched)
                if own is None:
                    own = times[base | matched] = prefill(size - matched, size)
                score = (1.0 + requests[i] / CHUNK_TOKENS) * (rates[i] * queued[i] + weight * own)
                if score < best_score or (
                    score == best_score
                    and queued[i] + decoding[i] < queued[best] + decoding[best]
                ):
                    best, best_score, best_own = i, score, own
        elif loaded:
            best, best_own, best_wait = self._loaded(
                (turn, *rest), size, expected, host, queued, decoding, requests, capacities,
                extra, behind, reported, output, rates,
            )
        else:
            best, best_own = self._general(
                (turn, *rest), size, lengths, host, queued, decoding, requests, capacities,
                rates,
            )

        if self._written and queued[best] == 0 and (not loaded or best_wait == 0.0):
            best = self._idle(
                workers, best, (turn, *rest), size, expected if loaded else lengths, lengths, host,
                queued, decoding, requests, capacities, extra, reported, output, loaded,
            )
        top = max(host)
        chosen = host[best]
        if top == 0:
            reason = "balance"
        elif chosen == top:
            reason = "affinity"
        else:
            reason = "spill"
        if loaded:
            ttft = best_wait + (1.0 + requests[best] / CHUNK_TOKENS) * best_own
        else:
            slow = 1.0 + requests[best] / CHUNK_TOKENS
            ttft = slow * (rates[best] * queued[best] + best_own)
        detail = (
            ("ttft", ttft),
            ("prefill", best_own),
            ("matched", float(lengths[best])),
            ("host_matched", float(chosen)),
            ("best_matched", float(top)),
        )
        return new_choice(Choice, (workers[best], reason, detail))

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """Every worker by ``choose``'s score, the one ``choose`` would take first.

        The same scans as ``choose`` (the loaded one when engines reported or the
        router expects evictions, else the general one, which orders alike what
        the lean scan would), over the same rotation, repeated on the workers
        not ranked yet: each turn takes the best of the rest, ties broken as
        ``choose`` breaks them. Nothing changes (the rotation moves on in
        ``choose`` only). O(workers^2), for a caller that asks for fallbacks.
        """
        workers = view.workers
        n = len(workers)
        turn = self._turn % n
        order = [*range(turn, n), *range(turn)]
        size = len(request.tokens)
        output = request.expected_output
        seen = self._outputs
        if output is not None:  # choose counts the request's output before it scans
            seen[0] += 1
            seen[1] += output
        try:
            reported = view.reported
            extra = self._extra(reported)
            behind = _behind(reported, view.requests)
            lengths = view.lengths
            expected = lengths if view.expected is None else view.expected
            loaded = (
                extra is not None
                or behind is not None
                or (expected is not lengths and expected != lengths)
            )
            rates = self._rates(workers)
            ranked: list[int] = []
            while order:
                wait = 0.0
                if loaded:
                    best, _, wait = self._loaded(
                        tuple(order), size, expected, view.host_lengths, view.prefill_tokens,
                        view.decode_tokens, view.requests, view.capacities, extra, behind,
                        reported, output, rates,
                    )
                else:
                    best = self._general(
                        tuple(order), size, view.lengths, view.host_lengths,
                        view.prefill_tokens, view.decode_tokens, view.requests,
                        view.capacities, rates,
                    )[0]
                if self._written and view.prefill_tokens[best] == 0 and wait == 0.0:
                    best = self._idle(
                        workers, best, tuple(order), size, expected if loaded else lengths, lengths,
                        view.host_lengths, view.prefill_tokens, view.decode_tokens,
                        view.requests, view.capacities, extra, reported, output, loaded,
                    )
                ranked.append(best)
                order.remove(best)
        finally:
            if output is not None:
                seen[0] -= 1
                seen[1] -= output
        return [workers[i] for i in ranked]

    def on_dispatch(self, request: Request, worker: WorkerId, matched: int) -> None:
        """Count the request's prefill, ``T(L - matched, L)`` seconds for its ``L - matched``
        uncached tokens, in its worker's rate until it finishes. O(1)."""
        size = len(request.tokens)
        times = self._times
        key = size << 32 | matched
        seconds = times.get(key)
        if seconds is None:
            seconds = times[key] = self._prefill(size - matched, size)
        rid = request.request_id
        flights = self._flights
        if rid in flights:  # told twice: the later decision is the one in flight
            self.on_finish(request, worker)
        slot = worker.index
        entry = self._priced.get(slot)
        if entry is None:
            entry = self._priced[slot] = [0.0, 0.0, 0.0]
        tokens = size - matched
        total = entry[0] = entry[0] + seconds
        count = entry[1] = entry[1] + tokens
        entry[2] += 1.0
        flights[rid] = (worker, seconds, tokens)
        written = self._written
        written[slot] = written.get(slot, 0.0) + tokens
        if total > 0.0 and count > 0.0:
            self._rate[slot] = total / count
        else:
            self._rate.pop(slot, None)

    def on_finish(self, request: Request, worker: WorkerId) -> None:
        """Take the request's prefill out of its worker's rate (a request never told is
        ignored). O(1)."""
        flight = self._flights.pop(request.request_id, None)
        if flight is None:
            return
        where, seconds, tokens = flight
        slot = where.index
        entry = self._priced.get(slot)
        if entry is None:
            return
        entry[2] -= 1.0
        if entry[2] <= 0.0:
            # The worker is idle: drop it rather than keep a sum's rounding residue.
            del self._priced[slot]
            self._rate.pop(slot, None)
        else:
            total = entry[0] = entry[0] - seconds
            count = entry[1] = entry[1] - tokens
            # While a sum is not positive (fully cached requests) a chunk's rate stands.
            if total > 0.0 and count > 0.0:
                self._rate[slot] = total / count
            else:
                self._rate.pop(slot, None)

    def _rates(self, workers: Sequence[WorkerId]) -> list[float]:
        """Per worker, the seconds a queued uncached token is priced at: its requests' in
        flight mean, or a 512-token chunk's rate while it has none."""
        token_time = self._token_time
        rate = self._rate
        if not rate:
            return [token_time] * len(workers)
        get = rate.get
        return [get(w.index, token_time) for w in workers]

    def _idle(
        self,
        workers: Sequence[WorkerId],
        best: int,
        order: tuple[int, ...],
        size: int,
        found: list[int],
        lengths: list[int],
        host: list[int],
        queued: list[int],
        decoding: list[int],
        requests: list[int],
        capacities: list[int | None],
        extra: list[int] | None,
        reported: list[EngineLoad | None],
        output: int | None,
        loaded: bool,
    ) -> int:
        """Among the workers that would start the request at once as ``best`` would (no
        wait: nothing queued, no reported extra, no wait for memory; the same match on
        the device, the host and as expected; room for it), the one with the fewest
        uncached tokens dispatched so far (``best`` on a tie, then the rotation's order).

        Their scores differ only by ``slow``, the requests in flight there: what rides
        along the request's own prefill. But the request may start a prefix that later
        requests share (a system prompt, a session's first turn), and those go where it
        goes; where the fleet's traffic already lives is the prefill each worker was
        given, which the requests in flight show only for as long as they run. O(workers),
        plus a decode-model call per such worker when memory waits are priced.
        """
        if not self._fits(best, size, found[best], queued, decoding, capacities, reported,
                          loaded):
            return best
        written = self._written
        least = written.get(workers[best].index, 0.0)
        matched, device, held = found[best], lengths[best], host[best]
        priced = loaded and self._decode is not None
        pick = best
        for j in order:
            if (
                queued[j] != 0
                or found[j] != matched
                or lengths[j] != device
                or host[j] != held
                or (extra is not None and extra[j] != 0)
            ):
                continue
            tokens = written.get(workers[j].index, 0.0)
            if tokens >= least:
                continue
            if not self._fits(j, size, matched, queued, decoding, capacities, reported, loaded):
                continue
            capacity = capacities[j]
            if priced and capacity is not None:
                load = requests[j] + (extra[j] if extra is not None else 0)
                if self._memory_wait(size - matched, output, capacity, reported[j],
                                     decoding[j], load) > 0.0:
                    continue
            pick, least = j, tokens
        return pick

    def _fits(
        self,
        i: int,
        size: int,
        matched: int,
        queued: list[int],
        decoding: list[int],
        capacities: list[int | None],
        reported: list[EngineLoad | None],
        loaded: bool,
    ) -> bool:
        """Whether worker ``i``'s KV takes the request, as the scan (loaded or general)
        that chose counts it."""
        capacity = capacities[i]
        if capacity is None:
            return True
        report = reported[i]
        if loaded and report is not None and report.kv_usage is not None:
            taken = float(queued[i])
            if not (self._decode is not None and self._outputs[1] > 0):
                taken += report.kv_usage * capacity
        else:
            taken = float(queued[i] + decoding[i])
        return taken + size - matched <= capacity

    def _queue_tokens(self, workers: Sequence[WorkerId], queued: list[float]) -> list[float]:
        """The packing's queued tokens, priced as ``choose`` prices them: a worker's
        queue counts ``queued_w * rate_w / rate`` tokens at a 512-token chunk's rate
        ``rate`` (the unit the packing counts a batch's pieces in), ``rate_w`` the
        worker's own (:meth:`_rates`). A worker with no rate of its own counts its
        tokens as they are. O(1) per worker; ``queued`` itself when no worker has one."""
        rate = self._rate
        if not rate:
            return queued
        token_time = self._token_time
        get = rate.get
        out = queued[:]
        for w, worker in enumerate(workers):
            own = get(worker.index)
            if own is not None:
                out[w] = queued[w] * (own / token_time)
        return out

    def _loaded(
        self,
        order: tuple[int, ...],
        size: int,
        expected: list[int],
        host: list[int],
        queued: list[int],
        decoding: list[int],
        requests: list[int],
        capacities: list[int | None],
        extra: list[int] | None,
        behind: float | None,
        reported: list[EngineLoad | None],
        output: int | None,
        rates: list[float],
    ) -> tuple[int, float, float]:
        """``choose``'s scan with what the engines reported and the router expects:
        (best index, its own prefill time, its wait in seconds).

        Per worker: the expected match sets its own prefill; requests its engine
        reported beyond the router's own add to its in-flight count and, at the
        fleet's mean queued tokens a request, to its queue; the requests waiting
        there (reported) are the requests behind that its prefill delays.
        """
        prefill = self._prefill
        work_weight = self.work_weight
        host_weight = self.host_weight
        times = self._times
        base = size << 32
        in_flight_requests = sum(requests)
        # The next request at least (a burst's), or the requests the fleet's load says.
        weight = 1.0 + work_weight * (1.0 if behind is None or behind < 1.0 else behind)
        # A request the router cannot see weighs the mean uncached tokens of those it can.
        unit = sum(queued) / in_flight_requests if in_flight_requests else float(size)
        # _memory_wait returns 0 without a decode model or a mean output to free room at.
        wait_priced = self._decode is not None and self._outputs[1] > 0
        best = -1
        best_fits = False
        best_score = math.inf
        best_tokens = 0
        best_own = 0.0
        best_wait = 0.0
        for i in order:
            matched = expected[i]
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
            load = requests[i]
            tokens = float(queued[i])
            if extra is not None:
                load += extra[i]
                tokens += extra[i] * unit
            slow = 1.0 + load / CHUNK_TOKENS
            wait = slow * rates[i] * tokens
            capacity = capacities[i]
            if capacity is not None and self._decode is not None:
                wait += self._memory_wait(
                    tokens + size - matched, output, capacity, reported[i], decoding[i], load
                )
            score = wait + slow * weight * own
            in_flight = queued[i] + decoding[i]
            if capacity is None:
                fits = True
            else:
                # Where the engine reports its KV use, the router's decode tokens are
                # not read: they count a prefix that running requests share once per
                # request, so on shared prefixes they rule out workers whose pools are
                # half empty. Where the wait for room is priced above (_memory_wait),
                # the pool fits unless the queue alone fills it; where it cannot be (no
                # decode model, or no output known yet), the reported use counts here.
                report = reported[i]
                taken: float
                if report is not None and report.kv_usage is not None:
                    taken = queued[i]
                    if not wait_priced:
                        taken += report.kv_usage * capacity
                else:
                    taken = in_flight
                fits = taken + size - matched <= capacity
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
                best_wait = wait
        return best, best_own, best_wait

    def _memory_wait(
        self,
        need: float,
        output: int | None,
        capacity: int,
        report: EngineLoad | None,
        decoding: int,
        requests: int,
    ) -> float:
        """Seconds a worker's full KV pool takes to free room for ``need`` tokens (and the
        request's output reserve): its running requests free the pool as they finish.

        The pool in use is the engine's reported share (else the router's decode tokens);
        what does not fit, ``short``, is freed at the rate the running requests finish:
        they hold ``used`` tokens and have half a mean output of decode steps left, each
        step ``decode(running, used)``: ``short * mean_output * step / (2 * used)``.
        """
        seen, total = self._outputs
        mean = total / seen if seen else 0.0
        if mean <= 0.0:
            return 0.0
        reserve = min(output if output is not None else mean, CLIP_OUTPUT_TOKENS)
        if report is not None and report.kv_usage is not None:
            used = report.kv_usage * capacity
        else:
            used = float(decoding)
        short = need + reserve - (capacity - used)
        # Under one token in use is an empty pool (the decode step reads int(used)), and
        # dividing by such a share (a reported kv_usage of 1e-308) overflowed to inf,
        # whose sums became NaN loads in the packing.
        if short <= 0.0 or used < 1.0:
            return 0.0
        running = report.running if report is not None and report.running else requests
        if running <= 0:
            return 0.0
        assert self._decode is not None
        step = self._decode(running, int(used))
        return short * mean * step / (2.0 * used)

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
        rates: list[float],
    ) -> tuple[int, float]:
        """``choose``'s scan with host-held pages and capacities: (best index, its own time)."""
        prefill = self._prefill
        weight = 1.0 + self.work_weight
        host_weight = self.host_weight
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
            score = (1.0 + requests[i] / CHUNK_TOKENS) * (rates[i] * queued[i] + weight * own)
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


def _behind(reported: list[EngineLoad | None], requests: list[int]) -> float | None:
    """How many requests a second of prefill added to the fleet now delays, from the reports.

    Two measures over the workers that reported, the larger: the mean number of requests
    waiting in their queues (the reported queue plus what the router dispatched there
    since), which a first-come-first-served engine starts after it; and, from the mean
    use ``u`` of their KV pools, ``u / (1 - u)``, the mean number in a queue that busy
    (M/G/1): work added to a saturated fleet delays the requests it admits later, not
    only those waiting now (a queue that has just drained says nothing about the next
    burst). The second is at most the mean requests in flight plus one. It is the
    fleet's measure, not one worker's: a worker the router keeps balanced with the others
    is as busy as they are, so the time a recompute takes anywhere is worth the same.
    ``None`` when no engine reported.
    """
    waiting = 0.0
    usage = 0.0
    queues = pools = 0
    for i, report in enumerate(reported):
        if report is None:
            continue
        if report.queue_length is not None:
            since = requests[i] - (report.router_requests or 0)
            waiting += report.queue_length + (since if since > 0 else 0)
            queues += 1
        if report.kv_usage is not None:
            usage += report.kv_usage
            pools += 1
    if not queues and not pools:
        return None
    behind = waiting / queues if queues else 0.0
    if pools:
        most = sum(requests) / len(requests) + 1.0
        mean = usage / pools
        busy = most if mean >= 1.0 else min(mean / (1.0 - mean), most)
        if busy > behind:
            behind = busy
    return behind


def _held(view: View) -> list[int]:
    """What a batch member finds on each worker: the router's expectation, if it made one."""
    return view.lengths if view.expected is None else view.expected


def _run_goes_on(
    ordered: list[int],
    at: int,
    rows: list[list[float]],
    saving: list[float],
    pieces: list[_Piece],
    on_some: set[int],
) -> bool:
    """Whether the piece after ``ordered[at]`` is of the same run: it costs the same on
    every worker as that one, at the same cost, and its group is placed nowhere yet (nor
    is it the same group). A heap is built only for a run of two pieces or more: for a
    piece alone it costs more than the scan it replaces."""
    if at + 1 >= len(ordered):
        return False
    p, q = ordered[at], ordered[at + 1]
    group = pieces[q].group
    return (
        saving[q] == 0
        and rows[q][0] == rows[p][0]
        and group != pieces[p].group
        and group not in on_some
    )


def _pack(
    pieces: list[_Piece],
    queued: list[float],
    order: tuple[int, ...],
    speed: list[float],
    weight: list[float],
    in_flight: list[float],
    pools: _Pools | None = None,
    fast: bool = False,
) -> tuple[list[_Piece], list[int], list[float], set[tuple[int, int]]]:
    """Place the pieces, each on the worker it leaves least loaded (a second piece of a
    group on a worker shares the first one's prefix there): those some worker holds
    more of first, by what that saves, then the rest largest first.

    A worker's load is its tokens to prefill; it is compared as ``speed * (load +
    weight * cost)``: slowed by the requests in flight there, and the piece's cost
    weighed by the requests already waiting there that it delays (1 without
    reports, which is plain least-loaded packing). Workers are scanned from
    ``order``'s first (the policy's rotation), ties going to the fewest tokens in
    flight. With ``pools`` (bounded caches) a piece's cost on a worker is what the
    worker's load grows by, its prefix recomputed as ``_Pools`` counts it. Returns
    the pieces, each one's worker and the workers' loads.

    ``fast``: a run of two or more pieces in a row that cost the same on every worker,
    at one cost (no worker holds any of them, their groups are placed nowhere yet, no
    pools), is placed from a heap of the workers keyed by ``(score, tokens in flight,
    place in order)``, the order in which the scan picks, so it picks the same worker:
    O(workers) to build the heap at the run's first piece, then O(log workers) a
    piece; a piece that starts no such run is placed by the scan, O(workers), without
    a heap (pieces of distinct costs cost what the scan costs, no more); with pools, a
    worker with no piece yet is priced by ``_Pools.alone``. O(pieces x workers)
    otherwise; O(pieces log pieces) to order them. Also returns the ``(group, worker)``
    pairs placed."""
    load = queued[:]
    in_flight = in_flight[:]
    where = [0] * len(pieces)
    placed: set[tuple[int, int]] = set()
    on_some: set[int] = set()  # the groups of placed pieces
    # A piece's row made already (most pieces of a large batch share one) read as is.
    rows = [piece._row or piece.costs() for piece in pieces]
    # The pieces some worker holds more of go first, the most it saves first: a piece
    # that costs the same everywhere then fills in around them (largest first), and
    # does not take the worker a later piece would find its prefix on. Computed once
    # per row object (rows are read only; pieces of one cost share theirs).
    spans: dict[int, float] = {}
    saving = []
    for row in rows:
        span = spans.get(id(row))
        if span is None:
            span = spans[id(row)] = max(row) - min(row)
        saving.append(span)
    # A heap compares as the scan only over numbers that compare (no NaN anywhere).
    by_heap = fast and pools is None and all(
        map(math.isfinite, itertools.chain(load, in_flight, speed, weight))
    )
    heap: list[tuple[float, float, int, int]] = []
    heap_cost = math.nan  # the cost the heap's scores are of (none yet)
    ranks = [(-save, -piece.cold) for save, piece in zip(saving, pieces, strict=True)]
    ordered = sorted(range(len(pieces)), key=ranks.__getitem__)
    for at, p in enumerate(ordered):
        piece = pieces[p]
        row = rows[p]
        group = piece.group
        if (
            by_heap
            and saving[p] == 0
            and group not in on_some
            and (row[0] == heap_cost or _run_goes_on(ordered, at, rows, saving, pieces, on_some))
        ):
            cost = row[0]
            if cost != heap_cost:  # the scores of another cost: build it again
                heap = [
                    (speed[w] * (load[w] + weight[w] * cost), in_flight[w], rank, w)
                    for rank, w in enumerate(order)
                ]
                heapq.heapify(heap)
                heap_cost = cost
            rank, best = heap[0][2], heap[0][3]
            load[best] += cost
            in_flight[best] += cost
            score = speed[best] * (load[best] + weight[best] * cost)
            heapq.heapreplace(heap, (score, in_flight[best], rank, best))
        else:
            heap_cost = math.nan  # loads change outside the heap: it is stale
            best, best_score, best_cost, best_tokens = -1, math.inf, 0.0, math.inf
            for w in order:
                cost = piece.cost(w, True) if (group, w) in placed else row[w]
                if pools is not None:
                    # A worker with nothing of the batch yet: most of a wide fleet.
                    after = pools.alone(w, piece) if fast and not pools.on[w] else None
                    if after is None:
                        after = pools.load(w, [*pools.on[w], piece])
                    cost = after - load[w]
                score = speed[w] * (load[w] + weight[w] * cost)
                if best < 0 or score < best_score or (
                    score == best_score and in_flight[w] < best_tokens
                ):
                    best, best_score, best_cost, best_tokens = w, score, cost, in_flight[w]
            load[best] += best_cost
            in_flight[best] += best_cost
            if pools is not None:
                pools.on[best].append(piece)
        where[p] = best
        placed.add((group, best))
        on_some.add(group)
    if pools is not None:
        pools.on = [[] for _ in pools.on]  # the next packing starts afresh
    return pieces, where, load, placed


class _Pools:
    """Batch packing with bounded KV pools: what a worker computes for the pieces on it.

    A worker's requests come in a shuffled order, so its pool is an LRU cache under
    independent references, which Che's approximation describes (Che, Tung and
    Wang, IEEE JSAC 2002): a page stays cached while it was used within the last
    ``T`` requests, ``T`` being where what those requests keep fills the pool,
    ``sum_g S_g (1 - exp(-q_g T)) + T t = C``: a group ``g`` of ``n_g`` members
    among the worker's ``N`` is used with probability ``q_g = n_g / N`` per request
    and keeps its ``S_g``-token prefix; ``t`` is the mean of what each request
    writes of its own. Each later member of a group then recomputes its prefix with
    the chance ``exp(-q_g T)``. Pieces of one group on one worker share its prefix.
    O(pieces on the worker) a call, times the bisection's 40 rounds.
    """

    __slots__ = ("capacities", "on", "queued")

    def __init__(self, capacities: list[int], queued: list[float]) -> None:
        self.capacities = capacities
        self.queued = queued
        self.on: list[list[_Piece]] = [[] for _ in capacities]

    def alone(self, worker: int, piece: _Piece) -> float | None:
        """``load(worker, [piece])`` when the piece's prefix fits the pool (nothing is
        recomputed then), in O(1) and with the same arithmetic; None when it does not."""
        prefix = float(piece.shared)
        if (prefix if prefix > 0 else 0) > float(self.capacities[worker]):
            return None
        return self.queued[worker] + (0.0 + piece.cost(worker, False))  # as load sums it

    def load(self, worker: int, pieces: list[_Piece]) -> float:
        """The worker's tokens to compute with ``pieces`` on it, prefixes recomputed."""
        groups: dict[int, list[float]] = {}  # group -> [members, shared prefix]
        total = 0.0
        for piece in pieces:
            there = piece.group in groups
            total += piece.cost(worker, there)
            entry = groups.setdefault(piece.group, [0.0, float(piece.shared)])
            entry[0] += len(piece.members)
        base = self.queued[worker] + total
        shared = [(members, prefix) for members, prefix in groups.values() if prefix > 0]
        capacity = float(self.capacities[worker])
        if sum(prefix for _, prefix in shared) <= capacity:
            return base  # every prefix fits beside the rest: computed once each
        count = sum(entry[0] for entry in groups.values())
        own = max(0.0, total - sum(prefix for _, prefix in shared)) / count
        rates = [(members / count, prefix) for members, prefix in shared]

        def kept(horizon: float) -> float:
            return sum(prefix * (1.0 - math.exp(-q * horizon)) for q, prefix in rates) + (
                horizon * own
            )

        low, high = 0.0, capacity / own if own > 0 else capacity * count
        while kept(high) < capacity:  # no writes of their own: the prefixes alone
            high *= 2.0
        for _ in range(40):
            mid = (low + high) / 2.0
            if kept(mid) < capacity:
                low = mid
            else:
                high = mid
        horizon = low
        extra = sum(
            prefix * (q * count - 1.0) * math.exp(-q * horizon)
            for q, prefix in rates
            if q * count > 1.0
        )
        return base + extra


def _move_part(
    pieces: list[_Piece],
    where: list[int],
    load: list[float],
    placed: set[tuple[int, int]],
    split: set[int],
    whole_limit: float,
    pools: _Pools | None = None,
) -> bool:
    """Move the last members of one of the busiest worker's pieces to the least loaded
    worker, if that lowers the busiest load; returns whether it did. Only a group
    split already or of more than ``whole_limit`` tokens gives members. With ``pools``
    the two workers' loads are counted again as ``_Pools`` counts them."""
    high = load.index(max(load))
    low = load.index(min(load))
    if high == low:
        return False
    best: tuple[float, float, int, _Piece, _Piece, float, float] | None = None
    for p, w in enumerate(where):
        piece = pieces[p]
        if w != high or len(piece.members) < 2:
            continue
        if piece.group not in split and piece.cold <= whole_limit:
            continue  # a group that fits stays whole
        there = (piece.group, low) in placed
        # Where to cut: even the two loads out by the members' cold tokens, then
        # price both parts exactly (a member whose partner stays behind computes more).
        now = piece.cost(high, False)
        target = (load[high] - load[low]) / 2.0
        cut, moved = len(piece.members), 0.0
        while cut > 1:
            member = piece.members[cut - 1]
            own = member.length - member.common
            if moved + own > target and cut < len(piece.members):
                break
            cut -= 1
            moved += own
        stay, go = piece.split(cut)
        if pools is not None:
            on_high = [x if q != p else stay for q, x in enumerate(pieces) if where[q] == high]
            on_low = [x for q, x in enumerate(pieces) if where[q] == low]
            new_high = pools.load(high, on_high)
            new_low = pools.load(low, [*on_low, go])
        else:
            new_high = load[high] - now + stay.cost(high, False)
            new_low = load[low] + go.cost(low, there)
        after = max(new_high, new_low)
        if after < load[high] and (best is None or (after, -piece.cold) < best[:2]):
            best = (after, -piece.cold, p, stay, go, new_high, new_low)
    if best is None:
        return False
    _, _, p, stay, go, new_high, new_low = best
    pieces[p] = stay
    pieces.append(go)
    where.append(low)
    placed.add((go.group, low))
    split.add(go.group)
    load[high], load[low] = new_high, new_low
    return True

