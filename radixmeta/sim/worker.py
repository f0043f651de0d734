"""One simulated worker: a real RadixCache with its EventLog, a queue and a running batch.

The worker is an SGLang-shaped engine reduced to what decides cache hits and
time: requests wait first come, first served; a step is either a prefill of
the requests admitted from the head of the queue (bounded by the running
batch's request count and by the tokens one prefill step may compute) or one
decode step of every running request, and prefill goes first, as SGLang's
scheduler does. Times come from the cost models of
:mod:`radixmeta.policies.costs` (any callables of the same shape).

A request is matched against the worker's own cache when it is admitted, and
the matched node is locked so capacity eviction cannot take it while the
request runs. At the end of its prefill its whole prompt is inserted (which
evicts least recently used, unlocked pages under the cache's capacity), the
lock moves to the inserted node, and the request decodes; at its last token
the lock is released. A fully cached prompt is timed as a one-token prefill (the
last token is always computed: its logits are the first output), while its hit
counts every matched token.

The simulator keeps per-request state in flat lists indexed by request (see
:class:`~radixmeta.sim.engine.Simulation`); a worker holds request indices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from radixmeta.cache import RadixCache
from radixmeta.errors import CacheFullError
from radixmeta.log import EventLog

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["BatchLimits", "SimWorker", "batch_prefill_time"]


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
        The cache's capacity in tokens; ``None`` is unbounded.
    prefill, decode : callable
        Cost models: ``(extend, context) -> s`` and ``(batch_size, context) -> s``.
    limits : BatchLimits
        Batch bounds.
    log_form : {"path", "blocks"}
        The EventLog's record form.
    """

    __slots__ = (
        "name",
        "cache",
        "log",
        "prefill",
        "decode",
        "limits",
        "waiting",
        "running",
        "busy",
        "prefill_busy",
        "decode_busy",
        "steps",
        "insert_refused",
        "_cursor",
        "_locks",
        "_context",
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
    ) -> None:
        self.name = name
        # Records are read after every step, so the ring only holds one step's.
        self.log = EventLog(capacity=1 << 16, max_tokens=1 << 26, form=log_form, worker=name)
        self.cache = RadixCache(page_size, capacity=capacity, event_log=self.log)
        self.prefill = prefill
        self.decode = decode
        self.limits = limits
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # decoding, in admission order
        self.busy = False
        self.prefill_busy = 0.0  # simulated seconds spent in prefill steps
        self.decode_busy = 0.0
        self.steps = 0
        self.insert_refused = 0  # prompts that did not fit beside the locked pages
        self._cursor: int | None = None  # the last log seq handed out
        self._locks: dict[int, Any] = {}  # request -> the cache node it holds
        self._context = 0  # tokens the running batch holds (for the decode model)

    # -- steps ---------------------------------------------------------------------------
    def admit(
        self, tokens: list[npt.NDArray[np.uint32]], hits: list[int]
    ) -> tuple[list[int], float] | None:
        """Admit requests from the queue for one prefill step.

        Matches each against the cache and locks its node; ``hits[r]`` receives
        request ``r``'s matched tokens. Returns the admitted requests and the
        step's duration, or ``None`` when nothing can be admitted.

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
        admitted: list[int] = []
        extends: list[int] = []
        contexts: list[int] = []
        deferred: list[int] = []
        budget = limits.max_prefill_tokens
        defer = limits.in_batch_defer
        batch = RadixCache(cache.page_size) if defer else None  # this step's prompts
        examined = 0
        while self.waiting and len(admitted) < room and examined < limits.max_running:
            r = self.waiting[0]
            prompt = tokens[r]
            match = cache.match_prefix(prompt, values=False)
            extend = len(prompt) - match.length
            if admitted and extend > budget:
                break  # the next step takes it
            self.waiting.popleft()
            examined += 1
            if batch is not None and admitted:
                shared = batch.match_prefix(prompt, values=False).length
                if shared - match.length >= defer:
                    deferred.append(r)
                    continue
            cache.lock(match.node)
            self._locks[r] = match.node
            hits[r] = match.length
            admitted.append(r)
            if batch is not None:
                batch.insert(prompt)
            # An engine computes at least the last token (its logits give the first
            # output), so a fully cached prompt still costs a one-token prefill.
            extends.append(max(extend, 1))
            contexts.append(len(prompt))
            budget -= extend
        self.waiting.extendleft(reversed(deferred))  # back at the head, in their order
        if not admitted:
            return None
        duration = batch_prefill_time(self.prefill, extends, contexts)
        self.prefill_busy += duration
        self.steps += 1
        return admitted, duration

    def finish_prefill(
        self, admitted: list[int], tokens: list[npt.NDArray[np.uint32]], remaining: list[int]
    ) -> list[int]:
        """Insert each admitted prompt and move its lock to the inserted node.

        The prefill produced each request's first token; requests with more to
        come join the running batch, the others are finished and returned.
        """
        cache = self.cache
        for r in admitted:
            prompt = tokens[r]
            try:
                cache.insert(prompt)
            except CacheFullError:
                self.insert_refused += 1  # the locked pages leave no room: not cached
            else:
                node = cache.match_prefix(prompt, values=False).node
                cache.lock(node)
                cache.unlock(self._locks[r])
                self._locks[r] = node
            self._context += len(prompt)
        done: list[int] = []
        for r in admitted:
            remaining[r] -= 1
            if remaining[r] > 0:
                self.running.append(r)
            else:
                done.append(r)
                self.release(r, len(tokens[r]))
        return done

    def decode_step(self) -> float:
        """The duration of one decode step of the running batch."""
        duration = self.decode(len(self.running), self._context)
        self.decode_busy += duration
        self.steps += 1
        self._context += len(self.running)
        return duration

    def advance(
        self, remaining: list[int], prompt_lens: list[int], outputs: list[int]
    ) -> list[int]:
        """After a decode step: every running request has one more token; returns the finished.

        ``remaining[r]`` counts request ``r``'s output tokens still to come; a
        finished request's pages are unlocked.
        """
        finished: list[int] = []
        still: list[int] = []
        for r in self.running:
            remaining[r] -= 1
            (still if remaining[r] > 0 else finished).append(r)
        self.running = still
        for r in finished:
            self.release(r, prompt_lens[r] + outputs[r] - 1)
        return finished

    def release(self, r: int, held: int) -> None:
        """Request ``r`` finished, holding ``held`` tokens: unlock its pages."""
        self.cache.unlock(self._locks.pop(r))
        self._context -= held

    # -- events --------------------------------------------------------------------------
    def new_records(self) -> list[Any]:
        """The log's records since the last call."""
        records = self.log.read(after=self._cursor)
        if records:
            self._cursor = records[-1].seq
        return records
