"""A scheduler-shaped driver of one tree cache, through SGLang 0.5.23's own functions.

:class:`Scheduler` holds what one SGLang scheduler holds around its tree (a
waiting queue, running requests, SGLang's real CPU pools and allocator) and
moves requests the way SGLang's scheduler does, calling SGLang's own code for
each step: ``SchedulePolicy.calc_priority`` (the waiting-queue matches and
touches), ``Req.init_next_round_input`` (the admission match), ``lock``,
``alloc_for_extend`` and ``alloc_for_decode_default`` (which evict through the
allocator when it is short), ``checkpoint_kv_cache`` after a chunk,
``release_kv_cache`` at finish and abort, ``release_req`` for a retraction,
``evict_from_tree_cache``, and a flush.

Only the model is missing: a forward pass is "the request computed the KV of
these positions". Every slot a request computes is labelled with who computed
it, ``(rid, attempt, position)``, so two schedulers with different trees can be
compared by *what* KV they reuse and free, not by slot numbers. Each call
returns an observation (prefix lengths and the labels behind matched slots,
the labels behind every freed slot, the sizes); side-by-side tests require the
same observation from every tree.
"""

from __future__ import annotations

import warnings
from array import array
from collections import Counter
from typing import Any

import _sglang as H

_S: dict[str, Any] = {}


def load() -> dict[str, Any]:
    """SGLang's scheduling and allocation functions (after ``_sglang.load``)."""
    if _S:
        return _S
    s = H.load()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sglang.srt.managers.schedule_batch import FINISH_ABORT, release_req
        from sglang.srt.managers.schedule_policy import SchedulePolicy
        from sglang.srt.mem_cache.allocation import alloc_for_decode_default, alloc_for_extend
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator

    class LabelledPool(TokenToKVPoolAllocator):  # type: ignore[misc]
        """SGLang's token allocator, reporting every slot it takes back."""

        def free(self, free_index: Any) -> None:
            if self.free_group is None and free_index.numel():
                self.freed_pages.extend(free_index.tolist())
            super().free(free_index)

    class LabelledPagedPool(PagedTokenToKVPoolAllocator):  # type: ignore[misc]
        """SGLang's paged allocator, reporting every page it takes back."""

        def _release_page_ids(self, *page_ids: Any) -> None:
            for ids in page_ids:
                self.freed_pages.extend(ids.tolist())
            super()._release_page_ids(*page_ids)

    _S.update(s)
    _S.update(
        FINISH_ABORT=FINISH_ABORT,
        release_req=release_req,
        SchedulePolicy=SchedulePolicy,
        alloc_for_extend=alloc_for_extend,
        alloc_for_decode_default=alloc_for_decode_default,
        LabelledPool=LabelledPool,
        LabelledPagedPool=LabelledPagedPool,
    )
    return _S


class _Batch:
    """The fields of SGLang's ``ScheduleBatch`` that its allocation functions read."""

    def __init__(self, sched: Scheduler, reqs: list[Any], *, extend: bool) -> None:
        torch = sched.s["torch"]
        self.reqs = reqs
        self.tree_cache = sched.cache
        self.req_to_token_pool = sched.rtp
        self.token_to_kv_pool_allocator = sched.alloc
        self.device = "cpu"
        self.hisparse_coordinator = None
        self.model_config = _NoEncoder
        if extend:
            self.prefix_lens = [r.prefix_len for r in reqs]
            self.extend_lens = [r.extend_len for r in reqs]
            self.extend_num_tokens = sum(self.extend_lens)
            lens = [r.extend_end for r in reqs]
        else:
            lens = [r.kv.kv_committed_len for r in reqs]
            rows = [r.kv.req_pool_idx for r in reqs]
            self.req_pool_indices = torch.tensor(rows, dtype=torch.int64)
            self.req_pool_indices_cpu = self.req_pool_indices
        self.seq_lens = torch.tensor(lens, dtype=torch.int64)
        self.seq_lens_cpu = self.seq_lens

    def maybe_evict_swa(self) -> None:  # no sliding window here
        pass

    def is_dllm(self) -> bool:
        return False


class _NoEncoder:
    is_encoder_decoder = False


class Scheduler:
    """One scheduler's waiting queue, running requests, pools and tree cache."""

    def __init__(
        self,
        kind: str,
        *,
        page_size: int,
        eviction: str,
        size: int,
        max_reqs: int = 12,
        context: int = 512,
        chunk: int = 48,
    ) -> None:
        s = self.s = load()
        torch = s["torch"]
        self.kind = kind
        self.page_size = page_size
        self.chunk = chunk  # chunked prefill: at most this many tokens a round
        self.rtp = s["ReqToTokenPool"](
            size=max_reqs, max_context_len=context, device="cpu", enable_memory_saver=False
        )
        kv = s["MHATokenToKVPool"](
            size=size,
            page_size=page_size,
            dtype=torch.float16,
            head_num=1,
            head_dim=1,
            layer_num=1,
            device="cpu",
            enable_memory_saver=False,
        )
        common = {"size": size, "dtype": torch.float16, "device": "cpu", "kvcache": kv}
        # need_sort: freed pages are merged in sorted order, so trees that free the
        # same KV in another order still hand out the same slots afterwards.
        if page_size == 1:
            self.alloc = s["LabelledPool"](need_sort=True, **common)
        else:
            self.alloc = s["LabelledPagedPool"](page_size=page_size, need_sort=True, **common)
        self.alloc.freed_pages = []
        params = s["CacheInitParams"](
            disable=False,
            req_to_token_pool=self.rtp,
            token_to_kv_pool_allocator=self.alloc,
            page_size=page_size,
            eviction_policy=eviction,
            enable_kv_cache_events=False,
        )
        if kind == "unified":
            params.tree_components = (s["ComponentType"].FULL,)
            params.tree_core_backend = "rust"
            self.cache = s["UnifiedRadixCache"](params)
            assert type(self.cache.tree_core).__name__.startswith("Rust"), self.cache.tree_core
        elif kind == "classic":
            self.cache = s["RadixCache"](params)
        else:
            from radixmeta.integrations.sglang import create_cache

            self.cache = create_cache(H.context(params))
        self.full = self.alloc.available_size()
        self.policies = {
            name: s["SchedulePolicy"](
                name,
                self.cache,
                enable_hierarchical_cache=False,
                enable_priority_scheduling=False,
                schedule_low_priority_values_first=False,
            )
            for name in ("fcfs", "lpm")
        }
        self.waiting: list[Any] = []
        self.running: dict[str, Any] = {}  # rid -> Req, in admission order
        self.chunked: Any = None  # the request whose prefill is split over rounds
        self.labels: dict[int, tuple[Any, ...]] = {}  # slot -> who computed its KV

    # -- requests ------------------------------------------------------------------------
    def arrive(self, rid: str, prompt: list[int], outputs: list[int], priority: int) -> Any:
        s = self.s
        req = s["Req"](
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", prompt),
            sampling_params=s["SamplingParams"](max_new_tokens=len(outputs)),
            priority=priority,
        )
        req.planned_outputs = list(outputs)
        self.waiting.append(req)
        return self.observe()

    def calc_priority(self, policy: str) -> Any:
        """SGLang's waiting-queue pass: its matches, touches and order."""
        self.policies[policy].calc_priority(self.waiting)
        order = [(r.rid, r.prefix_len) for r in self.waiting]
        return order, self.observe()

    def admit(self) -> Any:
        """The head of the waiting queue (or the chunked request) runs its next chunk.

        As SGLang's ``PrefillAdder``: match, lock, then allocate if the free
        slots plus the evictable ones cover the chunk; otherwise it waits.
        """
        req = self.chunked
        new = req is None
        if new:
            if not self.waiting or not self.rtp.available_size():
                return None, self.observe()
            req = self.waiting[0]
            req.init_next_round_input(self.cache)
            req.lock = self.cache.lock(req.last_node)
        total = len(req.full_untruncated_fill_ids)
        req.extend_end = min(total, req.prefix_len + self.chunk)
        need = req.extend_end - req.prefix_len + 2 * self.page_size
        if need > self.alloc.available_size() + self.cache.evictable_size():
            if new:  # not admitted: it keeps waiting, its lock goes
                self.cache.unlock(req.lock)
                req.lock = None
            return None, self.observe()
        if new:
            self.waiting.pop(0)
        start = req.prefix_len
        self.s["alloc_for_extend"](_Batch(self, [req], extend=True))
        # What the tree gave this request: who computed the KV of its matched prefix.
        matched = self._row_labels(req, 0, start) if new else None
        self._compute(req, start, req.extend_end)  # the forward pass
        if req.extend_end < total:  # a chunk: SGLang checkpoints it
            self.chunked = req
            self.s["checkpoint_kv_cache"](req, self.cache)
            protected = self._row_labels(req, 0, req.kv.cache_protected_len)
        else:
            self.chunked = None
            req.prefix_len = req.extend_end
            self.running[req.rid] = req
            protected = None
        return (req.rid, start, matched, protected), self.observe()

    def decode(self) -> Any:
        """One decode step of every running request (the allocator evicting if short)."""
        reqs = [r for r in self.running.values() if len(r.output_ids) < len(r.planned_outputs)]
        if not reqs or len(reqs) * self.page_size > (
            self.alloc.available_size() + self.cache.evictable_size()
        ):
            return None, self.observe()
        self.s["alloc_for_decode_default"](_Batch(self, reqs, extend=False), 1)
        for r in reqs:
            position = r.kv.kv_committed_len - 1
            self._compute(r, position, position + 1)
            r.output_ids.append(r.planned_outputs[len(r.output_ids)])
        return [r.rid for r in reqs], self.observe()

    def finish(self, rid: str) -> Any:
        req = self.running.pop(rid)
        req.finished_reason = self.s["FINISH_LENGTH"](length=len(req.output_ids))
        self.s["release_kv_cache"](req, self.cache, checkpoint=True)
        return self.observe()

    def abort(self, rid: str) -> Any:
        """An abort of a running request: its KV is released without a checkpoint."""
        req = self.running.pop(rid)
        req.finished_reason = self.s["FINISH_ABORT"]("aborted")
        self.s["release_kv_cache"](req, self.cache, checkpoint=False)
        return self.observe()

    def retract(self, rid: str) -> Any:
        """SGLang's decode retraction: release, evict for the rest, back to waiting.

        The request keeps its outputs: it prefills prompt and outputs again.
        """
        req = self.running.pop(rid)
        self.s["release_req"](
            req=req,
            remaing_req_count=len(self.running),
            req_to_token_pool=self.rtp,
            token_to_kv_pool_allocator=self.alloc,
            tree_cache=self.cache,
            hisparse_coordinator=None,
        )
        self.waiting.insert(0, req)
        return self.observe()

    def evict(self, tokens: int) -> Any:
        self.s["evict_from_tree_cache"](self.cache, tokens)
        return self.observe()

    def flush(self) -> Any:
        """SGLang's flush_cache, allowed only when nothing runs: tree, rows and slots."""
        assert not self.running and self.chunked is None
        self.cache.reset()
        self.rtp.clear()
        self.alloc.clear()
        self.alloc.freed_pages = []
        self.labels.clear()
        for req in self.waiting:  # their earlier matches name nodes of the old tree
            req.last_node = None
            req.prefix_len = 0
        return self.observe()

    # -- observations ----------------------------------------------------------------------
    def _compute(self, req: Any, start: int, end: int) -> None:
        """The forward pass: label the slots of positions [start, end) as req's KV."""
        row = self.rtp.req_to_token[req.kv.req_pool_idx, start:end].tolist()
        attempt = req.retraction_count
        for position, slot in enumerate(row, start):
            self.labels[slot] = (req.rid, attempt, position)

    def _row_labels(self, req: Any, start: int, end: int) -> list[Any]:
        row = self.rtp.req_to_token[req.kv.req_pool_idx, start:end].tolist()
        return [self.labels.get(slot) for slot in row]

    def take_freed(self) -> list[Any]:
        """Who computed the KV in each slot (page) handed back since the last call."""
        ps = self.page_size
        freed = []
        for page in self.alloc.freed_pages:
            slots = [page] if ps == 1 else range(page * ps, page * ps + ps)
            freed.append(tuple(self.labels.pop(slot, None) for slot in slots))
        self.alloc.freed_pages = []
        return sorted(freed, key=repr)

    def observe(self) -> tuple[Any, ...]:
        return (
            self.take_freed(),
            int(self.cache.evictable_size()),
            int(self.cache.protected_size()),
            int(self.alloc.available_size()),
        )

    def leaked(self) -> Counter[str]:
        """After everything finished and the tree was emptied: slots not back (should be none)."""
        return Counter({"slots": self.full - int(self.alloc.available_size())})
