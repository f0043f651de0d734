"""One simulated worker: a real RadixCache in a KV pool, a queue and a running batch.

The worker is an SGLang-shaped engine reduced to what decides cache hits, memory
and time. One pool of ``capacity`` tokens holds both the prefix cache (the
worker's :class:`~radixmeta.RadixCache`) and the KV of the running requests, as
SGLang's token-to-KV pool does:

- **Admission** (SGLang's ``PrefillAdder``). Requests wait first come, first
  served. A step is either a prefill of the requests admitted from the head of
  the queue or one decode step of every running request, prefill first. The head
  is admitted only if its uncached prompt plus its decode reserve (its output
  still to come, clipped at ``CLIP_MAX_NEW_TOKENS``) is less than the free plus
  evictable memory left after the reserves already promised: those of the
  running requests, each ``min(output to come, CLIP) x new_token_ratio``, and
  those of the requests admitted before it in this step, in full. A head that
  does not fit blocks the queue (FCFS) and counts one ``admission_refused``.
  An admitted request's matched prefix is locked and its uncached tokens are
  taken from the pool, evicting least recently used unlocked pages.
- **Prefill.** At its end the prompt is inserted into the cache: its pages move
  from the request to the tree, locked until it finishes (SGLang's
  ``cache_unfinished_req``); a prefix another request of the same step already
  inserted is freed as a duplicate.
- **Decode.** Each step takes one token a running request. When free plus
  evictable memory cannot give them, requests are **retracted** (SGLang's
  ``retract_decode``): the one with the fewest output tokens, then the longest
  prompt (the most recently admitted) first, until the rest fit. A retracted
  request's prompt stays in the cache (unlocked, so evictable), its output KV is
  freed, and it is requeued at the head of the queue; when it runs again its
  prefill recomputes the uncached prompt and its output so far. After a
  retraction ``new_token_ratio`` rises to
  ``min(1, (decoded + RETRACT_DECODE_STEPS x running) / (max_new + 1))`` over
  the requests still running; after a step without one it decays by
  ``(init - min) / NEW_TOKEN_RATIO_DECAY_STEPS`` down to ``min``; an idle worker
  resets it to ``init``.
- **Finish.** The lock is released; the prompt stays cached, evictable. The
  output's KV is freed, not cached: in the simulator output tokens have no ids a
  later prompt could share (a trace's next turn names the previous answer by new
  block ids), so caching them would only hold memory that can never hit. SGLang's
  ``cache_finished_req`` caches them; the memory effect of that (recently
  finished outputs competing for the LRU) is left out.
- **Rejection.** A request whose prompt plus output reaches the model's context
  length, or the pool itself, is rejected on arrival, as SGLang's tokenizer
  manager rejects ``input + max_new_tokens >= context_len``; it never runs.

With ``capacity=None`` the pool is unbounded: nothing is refused, retracted or
evicted, and only ``max_running`` and ``max_prefill_tokens`` bound a batch.

Times come from the cost models of :mod:`radixmeta.policies.costs` (any
callables of the same shape). The simulator keeps per-request state in flat
lists indexed by request (see :class:`~radixmeta.sim.engine.Simulation`); a
worker holds request indices and reads those lists.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixmeta.cache import RadixCache
from radixmeta.log import EventLog

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "CLIP_MAX_NEW_TOKENS",
    "INIT_NEW_TOKEN_RATIO",
    "MIN_NEW_TOKEN_RATIO_FACTOR",
    "NEW_TOKEN_RATIO_DECAY_STEPS",
    "RETRACT_DECODE_STEPS",
    "BatchLimits",
    "KVInvariantError",
    "SimWorker",
    "batch_prefill_time",
]

# SGLang's scheduler constants (python/sglang/srt/environ.py, their defaults).
#: ``SGLANG_INIT_NEW_TOKEN_RATIO``: the share of a running request's output still
#: to come that admission reserves, at start and after an idle spell.
INIT_NEW_TOKEN_RATIO = 0.7
#: ``SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR``: the ratio's floor is ``init x`` this.
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14
#: ``SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS``: decode steps from ``init`` to the floor.
NEW_TOKEN_RATIO_DECAY_STEPS = 600
#: ``SGLANG_RETRACT_DECODE_STEPS``: decode steps per running request the ratio
#: counts on after a retraction.
RETRACT_DECODE_STEPS = 20
#: ``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``: a reserve counts at most this many
#: output tokens of one request.
CLIP_MAX_NEW_TOKENS = 4096

_MIN_NEW_TOKEN_RATIO = INIT_NEW_TOKEN_RATIO * MIN_NEW_TOKEN_RATIO_FACTOR
_RATIO_DECAY = (INIT_NEW_TOKEN_RATIO - _MIN_NEW_TOKEN_RATIO) / NEW_TOKEN_RATIO_DECAY_STEPS


class KVInvariantError(AssertionError):
    """A simulated worker's KV accounting broke an invariant (only raised with ``check``)."""


@dataclass(frozen=True, slots=True)
class BatchLimits:
    """What bounds a worker's running batch and one prefill step.

    Attributes
    ----------
    max_running : int
        Requests in the running batch (admitted and not finished), SGLang's
        ``--max-running-requests``.
    max_prefill_tokens : int
        Uncached tokens one prefill step computes (SGLang's
        ``--max-prefill-tokens``); a request larger than this alone still runs,
        alone, as SGLang admits one oversized request.
    in_batch_defer : int
        A request sharing this many more tokens with a request of the same
        prefill step than with the cache waits for the next step (SGLang's
        in-batch prefix caching threshold, 32); 0 turns it off.
    """

    max_running: int = 256
    max_prefill_tokens: int = 16_384
    in_batch_defer: int = 32


def batch_prefill_time(
    prefill: Callable[[int, int], float], extends: list[int], contexts: list[int]
) -> float:
    """Seconds of one prefill step of several requests, from a per-sequence model.

    The new tokens of a batch go through the linear layers together, so they are
    charged once as one sequence of ``sum(extends)`` tokens; attending to a cached
    prefix is per sequence, so each request adds what its context costs beyond its
    own new tokens: ``T(E, E) + sum(T(e, c) - T(e, e))``. For one request this is
    ``T(e, c)`` exactly.
    """
    total = sum(extends)
    if total == 0:
        return 0.0
    seconds = prefill(total, total)
    for e, c in zip(extends, contexts, strict=True):
        if c > e and e > 0:
            seconds += prefill(e, c) - prefill(e, e)
    return seconds


class SimWorker:
    """A simulated worker (see the module docstring).

    Parameters
    ----------
    name : str
        The worker's name; its EventLog's records carry it.
    page_size : int
        The cache's page size.
    capacity : int or None
        The KV pool in tokens (prefix cache and running requests); ``None`` is
        unbounded.
    prefill, decode : callable
        Cost models: ``(extend, context) -> s`` and ``(batch_size, context) -> s``.
    limits : BatchLimits
        Batch bounds.
    log_form : {"path", "blocks"}
        The EventLog's record form.
    context_len : int or None
        The model's context length; ``None``: no limit but the pool.
    check : bool
        Check the KV invariants after every step (:meth:`check`); for tests.
    fuse : bool
        Let :meth:`plan_decode` run consecutive decode steps as one event when
        nothing can happen between them (the results are the same).
    records : bool
        Keep an :class:`~radixmeta.EventLog` of the cache (``log``) for
        :meth:`new_records`; off when nobody reads it (approximate routing),
        ``log`` is then ``None``.

    Notes
    -----
    The cache keeps no KV slot values (``store_values=False``): the simulator
    never reads them, and without them a cached token takes 4 bytes instead
    of 12 and an insert copies a third of the bytes.
    """

    __slots__ = (
        "name",
        "cache",
        "log",
        "prefill",
        "decode",
        "limits",
        "capacity",
        "context_len",
        "waiting",
        "running",
        "busy",
        "prefill_busy",
        "decode_busy",
        "steps",
        "insert_refused",
        "admission_refused",
        "retracted",
        "requeued",
        "rejected",
        "new_token_ratio",
        "kv_peak_tokens",
        "private",
        "_check",
        "_cursor",
        "_locks",
        "_held",
        "_seq",
        "_context",
        "_retracted_once",
        "_reserve",
        "_plan",
        "_plan_refusing",
        "_plan_durations",
        "_fuse",
        "_tokens",
        "_outputs",
        "_remaining",
    )

    def __init__(
        self,
        name: str,
        page_size: int,
        capacity: int | None,
        prefill: Callable[[int, int], float],
        decode: Callable[[int, int], float],
        limits: BatchLimits,
        log_form: str = "path",
        *,
        context_len: int | None = None,
        check: bool = False,
        fuse: bool = True,
        records: bool = True,
    ) -> None:
        self.name = name
        # Records are read after every step and discarded once the router has applied
        # them (applied()), so the ring holds what is in flight to the router only.
        self.log: EventLog | None = (
            EventLog(capacity=1 << 16, max_tokens=1 << 26, form=log_form, worker=name)
            if records
            else None
        )
        # The tree itself is unbounded: the pool's bound is kept here, over the tree
        # and the requests' own pages together, and eviction is asked for explicitly.
        self.cache = RadixCache(page_size, event_log=self.log, store_values=False)
        self.prefill = prefill
        self.decode = decode
        self.limits = limits
        self.capacity = capacity
        self.context_len = context_len
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # decoding, in admission order
        self.busy = False
        self.prefill_busy = 0.0  # simulated seconds spent in prefill steps
        self.decode_busy = 0.0
        self.steps = 0
        self.insert_refused = 0  # prompts the cache refused: 0, the pool took their pages
        self.admission_refused = 0  # steps where the head of the queue did not fit
        self.retracted = 0  # retractions (a request may be retracted more than once)
        self.requeued = 0  # distinct requests put back on the queue by a retraction
        self.rejected = 0  # requests longer than the context or the pool
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO
        self.kv_peak_tokens = 0  # the most tokens requests held at once (locked or own)
        self.private = 0  # tokens requests hold outside the tree
        self._check = check
        self._cursor: int | None = None  # the last log seq handed out
        self._locks: dict[int, Any] = {}  # request -> the cache node it holds
        self._held: dict[int, int] = {}  # request -> its tokens outside the tree
        self._seq: dict[int, int] = {}  # request -> tokens of KV it has (tree and own)
        self._context = 0  # tokens the running batch holds (for the decode model)
        self._retracted_once: set[int] = set()
        self._reserve = 0  # sum over running of min(output to come, CLIP_MAX_NEW_TOKENS)
        self._plan: list[float] = []  # end times of the decode steps run as one event
        self._plan_refusing = False  # the plan's boundaries each refuse the queue's head
        self._plan_durations: list[float] = []
        self._fuse = fuse
        self._tokens: list[npt.NDArray[np.uint32]] = []
        self._outputs: list[int] = []
        self._remaining: list[int] = []

    def bind(
        self,
        tokens: list[npt.NDArray[np.uint32]],
        outputs: list[int],
        remaining: list[int],
    ) -> None:
        """Give the worker the run's per-request lists: prompts, output lengths, tokens to come.

        ``remaining[r]`` counts request ``r``'s output tokens still to come; the
        worker decrements it as tokens are produced.
        """
        self._tokens, self._outputs, self._remaining = tokens, outputs, remaining

    # -- memory ------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Tokens of the pool in use: the whole tree (evictable pages too) and the requests' own."""
        return self.cache.total_size + self.private

    @property
    def in_use(self) -> int:
        """Tokens held by requests: their locked prefixes and their own pages.

        What SGLang reports as ``token_usage`` (times the pool) and vLLM as
        ``kv_cache_usage``: evictable cached pages count as free in both.
        """
        return self.cache.protected_size + self.private

    @property
    def kv_usage(self) -> float | None:
        """:attr:`in_use` over the pool, or ``None`` for an unbounded pool."""
        return None if self.capacity is None else self.in_use / self.capacity

    def accepts(self, r: int) -> bool:
        """Whether request ``r`` is served at all (else it is rejected on arrival).

        Rejected when ``prompt + output >= min(context_len, capacity)``: SGLang's
        tokenizer manager rejects ``input + max_new_tokens >= context_len``, and a
        request that could not fit the pool alone could never be admitted.
        """
        limit = self.context_len
        if self.capacity is not None and (limit is None or self.capacity < limit):
            limit = self.capacity
        if limit is None:
            return True
        return len(self._tokens[r]) + self._outputs[r] < limit

    def _make_room(self, tokens: int) -> None:
        """Evict unlocked pages (LRU) until the pool has ``tokens`` free, if it can."""
        if self.capacity is None:
            return
        short = self.used + tokens - self.capacity
        if short > 0:
            self.cache.evict(short)

    def _note_peak(self) -> None:
        held = self.cache.protected_size + self.private
        if held > self.kv_peak_tokens:
            self.kv_peak_tokens = held

    # -- steps -------------------------------------------------------------------------
    def admit(self, hits: list[int]) -> tuple[list[int], float] | None:
        """Admit requests from the queue for one prefill step.

        Matches each against the cache and locks its node; ``hits[r]`` receives
        request ``r``'s matched tokens at its first admission. Returns the
        admitted requests and the step's duration, or ``None`` when nothing can
        be admitted.

        In-batch prefix caching, as SGLang's scheduler does it: a request that
        shares at least ``limits.in_batch_defer`` more tokens with a request
        already admitted to this step than with the cache waits for the next
        step, where the cache holds that prefix, instead of computing it twice.
        """
        limits = self.limits
        room = limits.max_running - len(self.running)
        if not self.waiting or room <= 0:
            return None
        cache = self.cache
        tokens, outputs, remaining = self._tokens, self._outputs, self._remaining
        bounded = self.capacity is not None
        budget_left = 0.0
        if bounded:
            assert self.capacity is not None
            # free + evictable - the running requests' reserve; evictable is read
            # again after each lock, since a lock makes its prefix unevictable.
            budget_left = self.capacity - self.used - self._reserve * self.new_token_ratio
        admitted: list[int] = []
        extends: list[int] = []
        contexts: list[int] = []
        deferred: list[int] = []
        budget = limits.max_prefill_tokens
        defer = limits.in_batch_defer
        batch: RadixCache | None = None  # this step's prompts, built for a second candidate
        examined = 0
        while self.waiting and len(admitted) < room and examined < limits.max_running:
            r = self.waiting[0]
            prompt = tokens[r]
            generated = outputs[r] - remaining[r]  # > 0 for a retracted request
            match = cache.match_prefix(prompt, values=False)
            extend = len(prompt) - match.length + generated
            if admitted and extend > budget:
                break  # the next step takes it
            if defer and admitted:
                if batch is None:
                    batch = RadixCache(cache.page_size, store_values=False)
                    for q in admitted:
                        batch.insert(tokens[q])
                shared = batch.match_prefix(prompt, values=False).length
                if shared - match.length >= defer:
                    self.waiting.popleft()
                    examined += 1
                    deferred.append(r)
                    continue
            cache.lock(match.node)
            if bounded:
                need = extend + min(remaining[r], CLIP_MAX_NEW_TOKENS)
                if need >= budget_left + cache.evictable_size:
                    cache.unlock(match.node)
                    self.admission_refused += 1
                    break  # the head waits: first come, first served
                budget_left -= need
            self.waiting.popleft()
            examined += 1
            self._locks[r] = match.node
            self._held[r] = extend
            self.private += extend
            if generated == 0:
                hits[r] = match.length
            if batch is not None:
                batch.insert(prompt)
            admitted.append(r)
            # An engine computes at least the last token (its logits give the first
            # output), so a fully cached prompt still costs a one-token prefill.
            extends.append(max(extend, 1))
            contexts.append(len(prompt) + generated)
            budget -= extend
        self.waiting.extendleft(reversed(deferred))  # back at the head, in their order
        if not admitted:
            return None
        if bounded:
            assert self.capacity is not None
            over = self.used - self.capacity
            if over > 0:  # the admitted requests' own pages, from evictable memory
                cache.evict(over)
            self._note_peak()
        duration = batch_prefill_time(self.prefill, extends, contexts)
        self.prefill_busy += duration
        self.steps += 1
        if self._check:
            self.check()
        return admitted, duration

    def finish_prefill(self, admitted: list[int]) -> list[int]:
        """Insert each admitted prompt and move its lock to the inserted node.

        The prefill produced each request's next token; requests with more to
        come join the running batch, the others are finished and returned.
        """
        cache = self.cache
        tokens, outputs, remaining = self._tokens, self._outputs, self._remaining
        page = cache.page_size
        for r in admitted:
            prompt = tokens[r]
            length = len(prompt)
            aligned = length - length % page
            cache.insert(prompt)  # never refused: the pool took these pages at admission
            node = cache.match_prefix(prompt, values=False).node
            cache.lock(node)
            cache.unlock(self._locks[r])
            self._locks[r] = node
            generated = outputs[r] - remaining[r]
            own = length - aligned + generated  # the prompt's tail and the output so far
            self.private += own - self._held[r]
            self._held[r] = own
            seq = length + generated
            self._seq[r] = seq
            self._context += seq
        done: list[int] = []
        for r in admitted:
            remaining[r] -= 1
            if remaining[r] > 0:
                self.running.append(r)
                self._reserve += min(remaining[r], CLIP_MAX_NEW_TOKENS)
            else:
                done.append(r)
                self.release(r)
        if self._check:
            self.check()
        return done

    def decode_step(self) -> tuple[float, list[int]]:
        """One decode step of the running batch: its duration and the requests retracted.

        Each running request takes one token of the pool; when free and evictable
        memory cannot give them all, requests are retracted first (module
        docstring) and put back at the head of the queue.
        """
        retracted: list[int] = []
        if self.capacity is not None:
            need = len(self.running)
            self._make_room(need)
            if self.capacity - self.used < need:
                retracted = self._retract()
                self._make_room(len(self.running))
            else:
                self.new_token_ratio = max(
                    self.new_token_ratio - _RATIO_DECAY, _MIN_NEW_TOKEN_RATIO
                )
        running = self.running
        duration = self.decode(len(running), self._context)
        self.decode_busy += duration
        self.steps += 1
        n = len(running)
        self._context += n
        self.private += n
        held, seq = self._held, self._seq
        for r in running:
            held[r] += 1
            seq[r] += 1
        if self.capacity is not None:
            self._note_peak()
        if self._check:
            self.check()
        return duration, retracted

    def _retract(self) -> list[int]:
        """SGLang's ``retract_decode``: free running requests until the rest can decode."""
        assert self.capacity is not None
        outputs, remaining, tokens = self._outputs, self._remaining, self._tokens
        # Victims last: the fewest output tokens, then the longest prompt.
        order = sorted(
            self.running,
            key=lambda r: (outputs[r] - remaining[r], -len(tokens[r])),
            reverse=True,
        )
        victims: list[int] = []
        while len(order) > 1 and (
            not victims
            or self.capacity - self.used + self.cache.evictable_size < len(order)
        ):
            r = order.pop()
            victims.append(r)
            self._reserve -= min(remaining[r], CLIP_MAX_NEW_TOKENS)
            self.release(r)
            self.retracted += 1
            if r not in self._retracted_once:
                self._retracted_once.add(r)
                self.requeued += 1
        keep = set(order)
        self.running = [r for r in self.running if r in keep]
        # Back at the head of the queue, earliest admitted first.
        position = {r: i for i, r in enumerate(self.running + victims)}
        self.waiting.extendleft(sorted(victims, key=position.__getitem__, reverse=True))
        decoded = sum(outputs[r] - remaining[r] for r in self.running)
        max_new = sum(outputs[r] for r in self.running)
        self.new_token_ratio = min(
            1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / (max_new + 1)
        )
        return victims

    def advance(self) -> list[int]:
        """After a decode step: every running request has one more token; returns the finished."""
        remaining = self._remaining
        finished: list[int] = []
        still: list[int] = []
        clipped = 0  # requests whose reserve shrinks with this token
        for r in self.running:
            left = remaining[r] - 1
            remaining[r] = left
            if left < CLIP_MAX_NEW_TOKENS:
                clipped += 1
            (still if left > 0 else finished).append(r)
        self._reserve -= clipped
        self.running = still
        for r in finished:
            self.release(r)
        if self._check:
            self.check()
        return finished

    def release(self, r: int) -> None:
        """Request ``r`` stops holding memory (finished or retracted): unlock, free its pages."""
        self.cache.unlock(self._locks.pop(r))
        self.private -= self._held.pop(r)
        self._context -= self._seq.pop(r, 0)

    def idle(self) -> None:
        """Nothing to run: SGLang resets ``new_token_ratio`` when its scheduler idles."""
        self.new_token_ratio = INIT_NEW_TOKEN_RATIO

    # -- decode steps run as one event ---------------------------------------------------
    def plan_decode(self, now: float) -> list[float] | None:
        """Plan the decode steps that can run back to back; returns their end times.

        Consecutive decode steps are one event when nothing could be decided
        between them: no request of the batch finishes before the last, the pool
        has room for every step without evicting (so the cache and the event log
        do not change), and the head of the queue stays refused at every step
        boundary (its need is fixed; the budget it is checked against moves by
        known amounts: ``n`` tokens and one ratio decay a step). The caller
        commits the plan at its end (:meth:`commit_decode`), or cuts it short when
        a request joins an empty queue (:meth:`cut_plan`). Returns ``None`` when
        the next step needs eviction or retraction, or fusing is off: take
        :meth:`decode_step` then.
        """
        running = self.running
        n = len(running)
        if not self._fuse or not n:
            return None
        remaining = self._remaining
        steps = min(map(remaining.__getitem__, running))
        capacity = self.capacity
        if capacity is not None:
            steps = min(steps, (capacity - self.used) // n)
            if steps < 1:
                return None
        refusing = bool(self.waiting) and self.limits.max_running > n
        if refusing:
            if capacity is None:
                return None  # an unbounded pool admits the head: no fusing
            steps = self._refused_steps(steps)
        ends: list[float] = []
        durations: list[float] = []
        at = now
        context = self._context
        decode = self.decode
        for _ in range(steps):
            duration = decode(n, context)
            durations.append(duration)
            at += duration
            context += n
            ends.append(at)
        self._plan = ends
        self._plan_durations = durations
        self._plan_refusing = refusing
        return ends

    def _refused_steps(self, steps: int) -> int:
        """How many planned steps pass before the queue's head would be admitted."""
        assert self.capacity is not None
        cache = self.cache
        r = self.waiting[0]
        prompt = self._tokens[r]
        remaining = self._remaining
        match = cache.match_prefix(prompt, values=False)
        generated = self._outputs[r] - remaining[r]
        need = len(prompt) - match.length + generated + min(remaining[r], CLIP_MAX_NEW_TOKENS)
        cache.lock(match.node)  # as admit checks it: its own prefix is not evictable
        evictable = cache.evictable_size
        cache.unlock(match.node)
        n = len(self.running)
        room = self.capacity - self.used + evictable
        # Each step: n more tokens in use, the reserve down by one for every request
        # whose output to come is under the clip, the ratio down by one decay.
        over = [remaining[q] for q in self.running if remaining[q] > CLIP_MAX_NEW_TOKENS]
        reserve = self._reserve
        ratio = self.new_token_ratio
        for i in range(1, steps):
            reserve -= n - sum(1 for left in over if left - i >= CLIP_MAX_NEW_TOKENS)
            ratio = max(ratio - _RATIO_DECAY, _MIN_NEW_TOKEN_RATIO)
            if need < room - n * i - reserve * ratio:
                return i
        return steps

    def cut_plan(self, now: float) -> float | None:
        """A request joined an empty queue at ``now``: end the plan with the step in flight.

        Returns the new end time, or ``None`` when the plan ends with that step anyway.
        """
        ends = self._plan
        keep = bisect_right(ends, now) + 1  # the steps ended by now (ends increase), and one
        if keep >= len(ends):
            return None
        del ends[keep:]
        return ends[-1]

    def commit_decode(self) -> list[int]:
        """Apply the planned decode steps; returns the requests that finished."""
        ends = self._plan
        k = len(ends)
        running = self.running
        n = len(running)
        remaining = self._remaining
        busy = self.decode_busy
        for duration in self._plan_durations[:k]:  # added one by one, as step by step
            busy += duration
        self.decode_busy = busy
        self.steps += k
        self._context += n * k
        self.private += n * k
        held, seq = self._held, self._seq
        finished: list[int] = []
        still: list[int] = []
        clip = CLIP_MAX_NEW_TOKENS
        shrink = 0
        for r in running:
            held[r] += k
            seq[r] += k
            before = remaining[r]
            left = before - k
            remaining[r] = left
            # min(before, clip) - min(left, clip), without two calls for the usual case
            if before <= clip:
                shrink += k
            elif left < clip:
                shrink += clip - left
            if left > 0:
                still.append(r)
            else:
                finished.append(r)
        self._reserve -= shrink
        if self.capacity is not None:
            if self._plan_refusing:
                self.admission_refused += k - 1  # the head, refused at each boundary
            self.new_token_ratio = max(
                self.new_token_ratio - k * _RATIO_DECAY, _MIN_NEW_TOKEN_RATIO
            )
            self._note_peak()
        self.running = still
        self._plan = []
        for r in finished:
            self.release(r)
        if self._check:
            self.check()
        return finished

    def snapshot(self, at: float) -> tuple[int, int, float | None]:
        """Queue length, running count and KV usage as of just before ``at``.

        During a plan the steps that ended before ``at`` have happened and the
        one in flight holds its tokens, as with one event per step.
        """
        waiting, running = len(self.waiting), len(self.running)
        if self.capacity is None:
            return waiting, running, None
        in_use = self.in_use
        if self._plan:
            done = bisect_left(self._plan, at)  # the steps that ended before at
            in_use += running * (done + 1)
        return waiting, running, in_use / self.capacity

    # -- invariants ----------------------------------------------------------------------
    def check(self) -> None:
        """Check the KV accounting; raises :class:`KVInvariantError`.

        The pool in use never exceeds the capacity; every admitted request's
        prefix node is present and locked; the requests' own pages add up; the
        tree passes its own O(n) check. Complexity: O(n) in the tree's nodes.
        """
        cache = self.cache
        cache.check()
        if self.capacity is not None and self.used > self.capacity:
            msg = f"{self.name}: {self.used} tokens in use in a pool of {self.capacity}"
            raise KVInvariantError(msg)
        if self.private != sum(self._held.values()) or min(self._held.values(), default=0) < 0:
            msg = f"{self.name}: own pages {self.private} != {sum(self._held.values())}"
            raise KVInvariantError(msg)
        for r in self.running:
            if r not in self._locks:
                msg = f"{self.name}: running request {r} holds no pages"
                raise KVInvariantError(msg)
        for r, node in self._locks.items():
            # A stale node raises here; the root (nothing matched) holds no lock.
            if node.length and cache.lock_count(node) < 1:
                msg = f"{self.name}: request {r}'s prefix is not locked"
                raise KVInvariantError(msg)
        if self.insert_refused:
            msg = f"{self.name}: {self.insert_refused} prompt(s) refused by the cache"
            raise KVInvariantError(msg)

    def check_drained(self) -> None:
        """At the end of a run: nothing queued or running, no lock, no page left held."""
        self.check()
        if self.waiting or self.running or self._locks or self.private or self._context:
            msg = (
                f"{self.name}: not drained: {len(self.waiting)} waiting, {len(self.running)} "
                f"running, {len(self._locks)} locks, {self.private} own pages, "
                f"context {self._context}"
            )
            raise KVInvariantError(msg)
        if self.cache.protected_size:
            msg = f"{self.name}: {self.cache.protected_size} tokens still locked"
            raise KVInvariantError(msg)

    # -- events --------------------------------------------------------------------------
    def new_records(self) -> list[Any]:
        """The log's records since the last call (none without a log)."""
        log = self.log
        if log is None or log.next_seq == (0 if self._cursor is None else self._cursor + 1):
            return []  # nothing new: skip building an empty read
        records = log.read(after=self._cursor)
        if records:
            self._cursor = records[-1].seq
        return records

    def applied(self, seq: int) -> None:
        """The router has applied this worker's records up to ``seq``: the log drops them.

        The router is the log's only reader, and it was handed the records
        themselves; a log that kept them would grow for the whole run, and
        every record written would reach further into cold memory.
        Complexity: O(records dropped).
        """
        if self.log is not None:
            self.log.discard(seq)
