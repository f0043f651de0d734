"""Preble's E2 (exploit or explore) scheduler, with post-assignment rebalancing.

Source: Srivatsa et al., "Preble: Efficient Distributed Prompt Scheduling for LLM
Serving", ICLR 2025 (arXiv 2407.00023); code ``WukLab/preble``,
``preble/global_scheduler_with_time.py`` (``GlobalSchedulerWithTime`` with eviction
and rebalancing on, the configuration of its end-to-end runs).

Preble keeps its own global radix tree of routed prompts; here the router's
MetaTree plays that part and the policy keeps only what the tree does not: per
prefix group (keyed by ``view.prefix_key``), the workers it is *allocated* to and
its requests in the time window, and per worker the windowed load and a predicted
LRU of what it holds. What differs from Preble's code, because a policy sees a
view and not a tree, is listed on :doc:`/routing`.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Sequence

from radixmeta._workers import WorkerId
from radixmeta.errors import InputTypeError
from radixmeta.policies._params import check_number
from radixmeta.policies._ranking import in_order
from radixmeta.policies.base import Choice, Request, View
from radixmeta.policies.costs import (
    DEFAULT_PREFILL,
    TPOT_SEED,
    PrefillTime,
    model_name,
    prefill_model,
)

__all__ = ["PrebleE2"]

_PENDING_LIMIT = 4096  # decisions kept between choose and on_dispatch
_Slot = int  # a worker inside the policy's state: its index and generation in one int


def _slot(worker: WorkerId) -> _Slot:
    """The int that stands for ``worker`` in the policy's tables.

    ``WorkerId`` is a dataclass whose hash and equality run in Python; an int keeps
    the per-request dictionary work cheap. Index and generation name a worker
    uniquely in its tree (a reused index has a new generation).
    """
    return worker.index | (worker.generation << 32)


_CHUNK = 512  # tokens per prefill chunk, for the queue part of the TTFT estimate


class _Group:
    """A prefix group (Preble's "important node"): its allocation and windowed requests.

    ``refs`` counts the window's events that name the group (it is dropped at 0, as
    Preble resets a node's allocation when the node leaves the window); ``count``,
    ``hit``, ``prompt``, ``cost`` and ``events`` cover only the requests that
    exploited it, the ones Preble's histogram counts for this node.
    """

    __slots__ = (
        "allocation",
        "bucket",
        "cost",
        "count",
        "events",
        "hit",
        "key",
        "now_n",
        "now_sum",
        "prev_n",
        "prev_sum",
        "prompt",
        "recompute",
        "refs",
    )

    def __init__(self, key: Hashable, allocation: list[_Slot], recompute: float) -> None:
        self.key = key
        self.allocation = allocation
        self.recompute = recompute  # prefill time of the whole prefix, seconds
        self.refs = 0
        self.count = 0
        self.hit = 0
        self.prompt = 0
        self.cost: dict[_Slot, float] = {}
        self.events: deque[_Event] = deque()
        # Estimated TTFTs of the newer and the older half-window bucket.
        self.bucket = -1
        self.now_sum = 0.0
        self.now_n = 0
        self.prev_sum = 0.0
        self.prev_n = 0

    def roll(self, bucket: int) -> None:
        """Move the half-window buckets forward to ``bucket``."""
        if bucket == self.bucket:
            return
        if bucket == self.bucket + 1:
            self.prev_sum, self.prev_n = self.now_sum, self.now_n
        else:
            self.prev_sum, self.prev_n = 0.0, 0
        self.now_sum, self.now_n = 0.0, 0
        self.bucket = bucket

    def miss_rate(self) -> float:
        """Windowed fraction of the prompt tokens of its requests that missed."""
        return 1.0 - self.hit / self.prompt if self.prompt else 1.0


class _Event:
    """One dispatched request in the window: when, where, what it cost, its group."""

    __slots__ = ("cost", "counted", "group", "hit", "prompt", "time", "worker")

    def __init__(
        self,
        when: float,
        worker: _Slot,
        cost: float,
        group: _Group | None,
        counted: bool,
        hit: int,
        prompt: int,
    ) -> None:
        self.time = when
        self.worker = worker
        self.cost = cost
        self.group = group
        self.counted = counted
        self.hit = hit
        self.prompt = prompt


class PrebleE2:
    """Exploit a long cached prefix, else explore by windowed load; rebalance after each assignment.

    For a prompt of ``L`` tokens whose longest match in the fleet is ``matched``
    (``missing = L - matched``):

    - **Exploit** when ``missing < matched``: the workers the prefix group is
      allocated to (at first, the workers holding the match); one of them, or the
      cheapest by the cost below when the group is replicated. Reason ``"exploit"``.
    - **Explore** otherwise: the worker with the lowest
      ``cost = load + eviction + prefill``, reason ``"explore"``, where ``load`` is
      the prefill time of the missed tokens plus the decode time
      (``output tokens * tpot``) of the requests sent to it in the last ``window``
      seconds; ``eviction`` the prefill time, weighted by miss rate and windowed
      requests, of the groups its predicted LRU would evict to fit the request (0
      when its capacity is unknown); ``prefill`` the request's own prefill time of
      the tokens it misses there (the paper's third term; Preble's code sets it to
      0).

    After each assignment (``on_dispatch``), once ``rebalance_after`` requests per
    worker were routed: workers sorted by the windowed load of groups with at least
    ``min_group_requests`` requests; while the heaviest carries at least
    ``high_load_threshold`` times the lightest, either **replicate** (the heavy
    worker has one such group and it is overloaded: its estimated TTFT in the newer
    half-window is ``overload_factor`` times the older half's; the light worker is
    added to its allocation) or **migrate** (the heavy worker's groups, cheapest
    first, are allocated to the light one while ``heavy - c >= light + c``), then the
    next pair inwards.

    Parameters
    ----------
    prefill : str or callable, default "mistral_7b_a6000"
        The prefill model (see :mod:`radixmeta.policies.costs`).
    window : float, default 180.0
        The load window in seconds (Preble's 3 minutes).
    tpot : float, default 0.15
        Seconds per output token (the seed of Preble's measured TPOT).
    default_output : int, default 45
        Output tokens assumed when ``request.expected_output`` is None (Preble's default).
    rebalance : bool, default True
        Run the post-assignment rebalancing.
    rebalance_after : int, default 50
        Requests routed per worker before rebalancing starts.
    high_load_threshold : float, default 1.5
        Load ratio of the heaviest to the lightest worker that triggers rebalancing.
    overload_factor : float, default 2.0
        Rise of a group's estimated TTFT between half-windows that makes it overloaded.
    min_group_requests : int, default 2
        Windowed requests a group needs to count in the rebalancing load.
    eviction : bool, default True
        Include the predicted eviction cost (Preble's ``enable_eviction``).
    clock : callable, default time.monotonic
        Seconds now; a simulator passes its simulated clock.

    Complexity: O(workers) per ``choose`` plus, per worker over its capacity, the
    predicted victims; ``on_dispatch`` O(1) amortised plus, while imbalanced, O(groups
    in the window).

    Examples
    --------
    >>> from radixmeta.policies import create
    >>> create("preble_e2", window=60.0)
    PrebleE2(prefill='mistral_7b_a6000', window=60.0, tpot=0.15, rebalance=True)
    """

    def __init__(
        self,
        prefill: str | PrefillTime = DEFAULT_PREFILL,
        window: float = 180.0,
        tpot: float = TPOT_SEED,
        default_output: int = 45,
        rebalance: bool = True,
        rebalance_after: int = 50,
        high_load_threshold: float = 1.5,
        overload_factor: float = 2.0,
        min_group_requests: int = 2,
        eviction: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._prefill = prefill_model(prefill)
        self._model_name = model_name(prefill)
        self.window = check_number("window", window, low_open=True)
        self.tpot = check_number("tpot", tpot)
        self.default_output = int(check_number("default_output", default_output, integer=True))
        self.rebalance = _check_bool("rebalance", rebalance)
        self.rebalance_after = int(check_number("rebalance_after", rebalance_after, integer=True))
        self.high_load_threshold = check_number("high_load_threshold", high_load_threshold, low=1.0)
        self.overload_factor = check_number("overload_factor", overload_factor, low=1.0)
        self.min_group_requests = int(
            check_number("min_group_requests", min_group_requests, low=1.0, integer=True)
        )
        self.eviction = _check_bool("eviction", eviction)
        if not callable(clock):
            msg = f"clock must be callable, got {type(clock).__name__}"
            raise InputTypeError(msg)
        self._clock = clock
        self._token_time = self._prefill(_CHUNK, _CHUNK) / _CHUNK
        self._half = self.window / 2
        self._groups: dict[Hashable, _Group] = {}
        self._active: dict[Hashable, _Group] = {}  # groups with >= min_group_requests
        self._events: deque[_Event] = deque()
        self._load: dict[_Slot, float] = {}
        self._active_load: dict[_Slot, float] = {}
        self._pending: dict[str, tuple[View, bool, int]] = {}
        self._lru: dict[_Slot, OrderedDict[Hashable, int]] = {}
        self._held: dict[_Slot, int] = {}
        self._routed = 0

    def __repr__(self) -> str:
        return (
            f"PrebleE2(prefill={self._model_name!r}, window={self.window}, tpot={self.tpot}, "
            f"rebalance={self.rebalance})"
        )

    # -- the decision --------------------------------------------------------------------

    def choose(self, request: Request, view: View) -> Choice:
        """Exploit or explore; reason ``"exploit"`` or ``"explore"``."""
        self._expire(self._clock())
        size = len(request.tokens)
        lengths = view.lengths
        workers = view.workers
        matched = max(lengths)
        missing = size - matched
        exploit = missing < matched
        times: dict[int, float] = {}
        candidates: Sequence[int]
        if exploit:
            candidates = self._candidates(view, matched)
            if len(candidates) == 1:
                self._remember(request.request_id, view, exploit, candidates[0])
                brief = (("matched", float(matched)), ("missing", float(missing)))
                return Choice(workers[candidates[0]], "exploit", brief)
        else:
            candidates = range(len(workers))
        best = -1
        best_cost = 0.0
        parts = (0.0, 0.0, 0.0)
        for i in candidates:
            load, evict, own = self._cost(i, view, size, times)
            cost = load + evict + own
            if best < 0 or cost < best_cost:
                best, best_cost, parts = i, cost, (load, evict, own)
        self._remember(request.request_id, view, exploit, best)
        detail = (
            ("matched", float(matched)),
            ("missing", float(missing)),
            ("cost", best_cost),
            ("load", parts[0]),
            ("eviction", parts[1]),
            ("prefill", parts[2]),
        )
        return Choice(workers[best], "exploit" if exploit else "explore", detail)

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """The workers ``choose`` may take, by its cost, then every other worker by the same cost.

        Exploiting, the candidates are the group's allocation (or the workers holding
        the match); exploring, every worker. Ties keep view order, as ``choose``
        keeps the first of equal costs. A pure read: the events older than the window,
        which ``choose`` drops first, are left in place and only discounted
        (:class:`_Lapsed`), so ranking changes nothing and ``choose`` still finds
        them to drop. O(workers log workers) plus the predicted victims, plus
        O(events past the window).
        """
        lapsed = _Lapsed(self, self._clock())
        size = len(request.tokens)
        lengths = view.lengths
        workers = view.workers
        matched = max(lengths)
        times: dict[int, float] = {}
        costs = []
        for i in range(len(workers)):
            load, evict, own = self._cost(i, view, size, times, lapsed)
            costs.append(load + evict + own)
        if size - matched < matched:
            candidates = self._candidates(view, matched, lapsed)
        else:
            candidates = list(range(len(workers)))
        inside = set(candidates)
        outside = [i for i in range(len(workers)) if i not in inside]
        return [
            *in_order(workers, candidates, costs.__getitem__),
            *in_order(workers, outside, costs.__getitem__),
        ]

    def _candidates(
        self, view: View, matched: int, lapsed: _Lapsed | None = None
    ) -> list[int]:
        """Positions of the workers an exploiting request may go to."""
        workers = view.workers
        key = view.prefix_key
        group = self._groups.get(key) if key is not None else None
        if group is not None and lapsed is not None and lapsed.dropped(group):
            group = None
        if group is not None:
            allocation = group.allocation
            allocated = [i for i, w in enumerate(workers) if _slot(w) in allocation]
            if allocated:
                return allocated
        lengths = view.lengths
        return [i for i in range(len(workers)) if lengths[i] == matched]

    def _cost(
        self,
        i: int,
        view: View,
        size: int,
        times: dict[int, float],
        lapsed: _Lapsed | None = None,
    ) -> tuple[float, float, float]:
        """(windowed load, predicted eviction cost, own prefill) of worker ``i``, seconds;
        with ``lapsed``, as they will be once its events are dropped."""
        worker = _slot(view.workers[i])
        held_here = view.lengths[i]
        own = times.get(held_here)
        if own is None:
            own = times[held_here] = self._prefill(size - held_here, size)
        load = self._load.get(worker, 0.0) if lapsed is None else lapsed.load(worker)
        evict = 0.0
        capacity = view.capacities[i]
        if self.eviction and capacity is not None:
            lru = self._lru.get(worker)
            if lru:
                over = self._held.get(worker, 0) + size - held_here - capacity
                if over > 0:
                    evict = self._eviction_cost(lru, over, view.prefix_key, lapsed)
        return load, evict, own

    def _eviction_cost(
        self,
        lru: OrderedDict[Hashable, int],
        over: int,
        own: Hashable,
        lapsed: _Lapsed | None = None,
    ) -> float:
        """Cost of the least recently used entries that free ``over`` tokens."""
        cost = 0.0
        freed = 0
        groups = self._groups
        for key, tokens in lru.items():
            if key == own:
                continue
            group = groups.get(key)
            if group is not None:
                if lapsed is None:
                    if group.count:
                        cost += group.miss_rate() * group.count * group.recompute
                else:
                    cost += lapsed.group_cost(group)
            freed += tokens
            if freed >= over:
                break
        return cost

    def _remember(self, request_id: str, view: View, exploit: bool, index: int) -> None:
        pending = self._pending
        if len(pending) >= _PENDING_LIMIT and request_id not in pending:
            del pending[next(iter(pending))]  # a decision the router never applied
        pending[request_id] = (view, exploit, index)

    # -- after the decision --------------------------------------------------------------

    def on_dispatch(self, request: Request, worker: WorkerId, matched: int) -> None:
        """Account the request on ``worker`` (``matched`` tokens of it held there), then rebalance.

        A request that ``choose`` did not decide (or whose decision was forgotten) is
        accounted on the worker only.
        """
        now = self._clock()
        self._expire(now)
        slot = _slot(worker)
        size = len(request.tokens)
        own = self._prefill(size - matched, size)
        output = request.expected_output
        cost = own + (self.default_output if output is None else output) * self.tpot
        self._load[slot] = self._load.get(slot, 0.0) + cost
        self._routed += 1
        remembered = self._pending.pop(request.request_id, None)
        if remembered is None:
            self._events.append(_Event(now, slot, cost, None, False, matched, size))
            return
        view, exploit, i = remembered
        workers = view.workers
        if workers[i] is not worker and workers[i] != worker:
            # The router applied another decision than this policy's: account it
            # where it went, as an exploring request (it joins no group's count).
            slots = [_slot(w) for w in workers]
            if slot not in slots:
                self._events.append(_Event(now, slot, cost, None, False, matched, size))
                return
            i = slots.index(slot)
            exploit = False
        group = self._allocate(view, slot)
        event = _Event(now, slot, cost, group, exploit, matched, size)
        self._events.append(event)
        if group is not None and exploit:
            self._count(group, event)
            group.roll(int(now // self._half))
            group.now_sum += self._token_time * view.prefill_tokens[i] + own
            group.now_n += 1
        if self.eviction:
            self._predict_cache(view.capacities[i], view.prefix_key, request, slot, size - matched)
        if self.rebalance:
            self._rebalance(workers, now)

    def _allocate(self, view: View, worker: _Slot) -> _Group | None:
        """Add ``worker`` to the allocation of the request's prefix group, made if new."""
        key = view.prefix_key
        if key is None:
            return None
        group = self._groups.get(key)
        if group is None:
            top = max(view.lengths)
            holders = [
                _slot(w)
                for w, length in zip(view.workers, view.lengths, strict=True)
                if length == top
            ]
            group = _Group(key, holders, self._prefill(top, top))
            self._groups[key] = group
        if worker not in group.allocation:
            group.allocation.append(worker)
        group.refs += 1
        return group

    def _count(self, group: _Group, event: _Event) -> None:
        """Count an exploiting request in its group's windowed statistics."""
        group.events.append(event)
        worker = event.worker
        group.cost[worker] = group.cost.get(worker, 0.0) + event.cost
        group.hit += event.hit
        group.prompt += event.prompt
        group.count += 1
        if group.count == self.min_group_requests:
            self._activate(group, 1.0)
        elif group.count > self.min_group_requests:
            self._active_load[worker] = self._active_load.get(worker, 0.0) + event.cost

    def _activate(self, group: _Group, sign: float) -> None:
        """Add (``sign`` 1) or take (-1) a group's costs in the rebalancing load."""
        active = self._active_load
        for worker, cost in group.cost.items():
            active[worker] = active.get(worker, 0.0) + sign * cost
        if sign > 0:
            self._active[group.key] = group
        else:
            self._active.pop(group.key, None)

    def _predict_cache(
        self, capacity: int | None, key: Hashable, request: Request, worker: _Slot, new: int
    ) -> None:
        """Preble's predicted LRU of a worker's cache, one entry per group (or lone request)."""
        if capacity is None:
            return
        lru = self._lru.setdefault(worker, OrderedDict())
        entry: Hashable = key if key is not None else ("request", request.request_id)
        lru[entry] = lru.get(entry, 0) + new
        lru.move_to_end(entry)
        held = self._held.get(worker, 0) + new
        while held > capacity and len(lru) > 1:
            _, tokens = lru.popitem(last=False)
            held -= tokens
        self._held[worker] = held

    # -- rebalancing ---------------------------------------------------------------------

    def _rebalance(self, workers: tuple[WorkerId, ...], now: float) -> None:
        """Preble's post-assignment rebalancing over the live ``workers``."""
        if len(workers) < 2 or self._routed < self.rebalance_after * len(workers):
            return
        active = self._active_load
        order = sorted((_slot(w) for w in workers), key=lambda w: active.get(w, 0.0))
        bucket = int(now // self._half)
        lo, hi = 0, len(order) - 1
        while lo < hi:
            light, heavy = order[lo], order[hi]
            low, high = active.get(light, 0.0), active.get(heavy, 0.0)
            if high <= 0.0 or high < self.high_load_threshold * low:
                return
            on_heavy = [g for g in self._active.values() if g.cost.get(heavy, 0.0) > 0.0]
            if len(on_heavy) == 1 and self._overloaded(on_heavy[0], bucket):
                if light not in on_heavy[0].allocation:
                    on_heavy[0].allocation.append(light)
            else:
                on_heavy.sort(key=lambda g: g.cost[heavy])
                for group in on_heavy:
                    cost = group.cost[heavy]
                    if high - cost < low + cost:
                        break
                    self._migrate(group, heavy, light)
                    high -= cost
                    low += cost
                    if high < self.high_load_threshold * low:
                        break
            lo += 1
            hi -= 1

    def _overloaded(self, group: _Group, bucket: int) -> bool:
        """The group's mean estimated TTFT rose ``overload_factor`` times between half-windows."""
        group.roll(bucket)
        if not group.prev_n or not group.now_n:
            return False
        return group.now_sum / group.now_n >= self.overload_factor * group.prev_sum / group.prev_n

    def _migrate(self, group: _Group, heavy: _Slot, light: _Slot) -> None:
        """Allocate ``group`` to ``light`` alone, moving its windowed cost on ``heavy`` there."""
        cost = group.cost.pop(heavy)
        group.cost[light] = group.cost.get(light, 0.0) + cost
        for event in group.events:
            if event.worker == heavy:
                event.worker = light
        group.allocation = [light]
        for table in (self._load, self._active_load):
            table[heavy] = table.get(heavy, 0.0) - cost
            table[light] = table.get(light, 0.0) + cost

    # -- the window ----------------------------------------------------------------------

    def _check(self) -> None:
        """Recompute every running sum from the window's events; raise if one drifted.

        O(events x groups + workers); for tests.
        """
        problems: list[str] = []
        bad = problems.append
        events = list(self._events)
        if any(a.time > b.time for a, b in itertools.pairwise(events)):
            bad("window events out of time order")
        load: dict[_Slot, float] = {}
        for event in events:
            load[event.worker] = load.get(event.worker, 0.0) + event.cost
        for worker in set(load) | set(self._load):
            if not _close(load.get(worker, 0.0), self._load.get(worker, 0.0)):
                bad(f"windowed load of worker {worker} drifted")
        for key, group in self._groups.items():
            if group.key != key:
                bad(f"group {key!r} filed under another key")
            mine = [e for e in events if e.group is group]
            counted = [e for e in mine if e.counted]
            if group.refs != len(mine) or group.refs == 0:
                bad(f"group {key!r}: refs {group.refs}, events {len(mine)}")
            if list(group.events) != counted or group.count != len(counted):
                bad(f"group {key!r}: counted events differ")
            if group.hit != sum(e.hit for e in counted):
                bad(f"group {key!r}: hit tokens differ")
            if group.prompt != sum(e.prompt for e in counted):
                bad(f"group {key!r}: prompt tokens differ")
            for worker in set(group.cost) | {e.worker for e in counted}:
                spent = sum(e.cost for e in counted if e.worker == worker)
                if not _close(group.cost.get(worker, 0.0), spent):
                    bad(f"group {key!r}: cost on worker {worker} drifted")
        for event in events:
            if event.group is not None and self._groups.get(event.group.key) is not event.group:
                bad("an event names a dropped group")
        active = {k: g for k, g in self._groups.items() if g.count >= self.min_group_requests}
        if active != self._active:
            bad("the active groups differ")
        active_load: dict[_Slot, float] = {}
        for group in active.values():
            for worker, cost in group.cost.items():
                active_load[worker] = active_load.get(worker, 0.0) + cost
        for worker in set(active_load) | set(self._active_load):
            if not _close(active_load.get(worker, 0.0), self._active_load.get(worker, 0.0)):
                bad(f"rebalancing load of worker {worker} drifted")
        for worker, lru in self._lru.items():
            if sum(lru.values()) != self._held.get(worker, 0):
                bad(f"predicted cache of worker {worker} miscounted")
        if problems:
            msg = "; ".join(problems)
            raise AssertionError(msg)

    def _expire(self, now: float) -> None:
        """Drop the requests older than the window from every sum.

        What the drop takes is :class:`_Lapsed`'s to compute (``rank`` reads the same
        value without applying it); this applies it.
        """
        lapsed = _Lapsed(self, now)
        events = self._events
        threshold = self.min_group_requests
        active = self._active_load
        for _ in range(lapsed.events):
            event = events.popleft()
            group = event.group
            if group is None or not event.counted:
                continue
            # The rebalancing load follows the group's count event by event: a group
            # that falls below the threshold leaves it whole.
            worker = event.worker
            group.events.popleft()
            if group.count == threshold:
                self._activate(group, -1.0)
            elif group.count > threshold:
                active[worker] = active.get(worker, 0.0) - event.cost
            group.cost[worker] = group.cost.get(worker, 0.0) - event.cost
            group.count -= 1
        for group, refs, _count, hit, prompt in lapsed.groups.values():
            group.hit -= hit
            group.prompt -= prompt
            group.refs -= refs
            if group.refs == 0:
                del self._groups[group.key]
        if lapsed.empty:
            self._load.clear()  # no rounding residue survives an empty window
            active.clear()
        else:
            self._load.update(lapsed.loads)


class _Lapsed:
    """The drop of the events older than the window at ``now``, as a value.

    :meth:`PrebleE2._expire` applies it; ``rank``, which must not change the
    policy's state, reads it instead (``choose`` drops those events first, so
    ``rank`` sees what ``choose`` will). It holds how many events lapse (the oldest
    ``events`` of the window), each worker's windowed load after them (the same
    floating-point sums, in the same order, as dropping them one by one), and per
    group what it loses. O(events past the window); nothing when none is (the
    common case: one comparison).

    Attributes
    ----------
    events : int
        The events that lapse, oldest first.
    empty : bool
        Whether the window is empty after the drop (its sums are then cleared).
    loads : dict
        Per worker with a lapsed event, its windowed load after the drop.
    groups : dict
        Per group (by ``id``): ``(group, refs, count, hit, prompt)`` it loses.
    """

    __slots__ = ("empty", "events", "groups", "loads", "_policy")

    def __init__(self, policy: PrebleE2, now: float) -> None:
        self._policy = policy
        self.loads: dict[_Slot, float] = {}
        self.groups: dict[int, tuple[_Group, int, int, int, int]] = {}
        events = policy._events
        horizon = now - policy.window
        loads = self.loads
        groups = self.groups
        k = 0
        for event in events:
            if not event.time < horizon:
                break
            k += 1
            worker = event.worker
            loads[worker] = loads.get(worker, policy._load.get(worker, 0.0)) - event.cost
            group = event.group
            if group is None:
                continue
            _, refs, count, hit, prompt = groups.get(id(group), (group, 0, 0, 0, 0))
            if event.counted:
                count, hit, prompt = count + 1, hit + event.hit, prompt + event.prompt
            groups[id(group)] = (group, refs + 1, count, hit, prompt)
        self.events = k
        self.empty = k == len(events)

    def load(self, worker: _Slot) -> float:
        """The worker's windowed load once the lapsed events are dropped."""
        if self.empty:
            return 0.0  # _expire clears an empty window's sums
        lapsed = self.loads.get(worker)
        return self._policy._load.get(worker, 0.0) if lapsed is None else lapsed

    def dropped(self, group: _Group) -> bool:
        """Whether the drop takes the group's last event (``_expire`` deletes it)."""
        lost = self.groups.get(id(group))
        return lost is not None and lost[1] >= group.refs

    def group_cost(self, group: _Group) -> float:
        """``miss_rate * count * recompute`` of a group after the drop (0 once dropped)."""
        lost = self.groups.get(id(group))
        if lost is None:
            count, hit, prompt = group.count, group.hit, group.prompt
        elif lost[1] >= group.refs:
            return 0.0
        else:
            count = group.count - lost[2]
            hit, prompt = group.hit - lost[3], group.prompt - lost[4]
        if not count:
            return 0.0
        miss = 1.0 - hit / prompt if prompt else 1.0
        return miss * count * group.recompute


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _check_bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        msg = f"{name} must be a bool, got {type(value).__name__}"
        raise InputTypeError(msg)
    return value
