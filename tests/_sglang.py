"""Helpers for the tests that drive SGLang's own pools and caches (skipped without SGLang).

:func:`load` imports what the tests need from an installed SGLang 0.5.23 (with
the benchmark's ``torchvision`` stand-in, as on a CPU-only box). :class:`Engine`
is one scheduler's worth of state around one tree cache (SGLang's real CPU
``ReqToTokenPool``, ``MHATokenToKVPool`` and token allocator), driven the way
SGLang's scheduler drives it: match, lock, allocate (the allocator evicting
when short), checkpoint while running, release. Several engines run the same
operations side by side, and every observable is compared.
"""

from __future__ import annotations

import importlib.util
import sys
import warnings
from array import array
from pathlib import Path
from typing import Any

SKIP_REASON = (
    "sglang is not installed in this interpreter: the SGLang backend tests run in the "
    "SGLang virtualenv (bench/README.md 'SGLang peer'; the last stage of .ci/run)"
)
HAVE_SGLANG = importlib.util.find_spec("sglang") is not None
BENCH = Path(__file__).resolve().parent.parent / "bench"

_S: dict[str, Any] = {}


def load() -> dict[str, Any]:
    """Import SGLang's pieces once (several seconds); the caller skips when it is absent."""
    if _S:
        return _S
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    import _torchvision_shim

    _torchvision_shim.install()
    with warnings.catch_warnings():
        # SGLang warns at import about accelerators a CPU box lacks.
        warnings.simplefilter("ignore")
        import torch
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req
        from sglang.srt.mem_cache import registry
        from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams, MatchPrefixParams
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.common import (
            checkpoint_kv_cache,
            evict_from_tree_cache,
            release_kv_cache,
        )
        from sglang.srt.mem_cache.events import KvEventLoraNames
        from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
        from sglang.srt.sampling.sampling_params import SamplingParams
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    class RecordingPool(TokenToKVPoolAllocator):  # type: ignore[misc]
        """SGLang's token allocator, remembering every slot given back."""

        def free(self, free_index: Any) -> None:
            self.freed.extend(free_index.tolist())
            super().free(free_index)

    class RecordingPagedPool(PagedTokenToKVPoolAllocator):  # type: ignore[misc]
        """SGLang's paged allocator, remembering every page given back (as its slots)."""

        def free_page_ids(self, page_ids: Any) -> None:
            self.freed.extend(page_ids.tolist())
            super().free_page_ids(page_ids)

        def free(self, free_index: Any) -> None:
            self.freed.extend(torch.unique(free_index // self.page_size).tolist())
            super().free(free_index)

    _S.update(
        torch=torch,
        FINISH_LENGTH=FINISH_LENGTH,
        Req=Req,
        registry=registry,
        EvictParams=EvictParams,
        MatchPrefixParams=MatchPrefixParams,
        CacheInitParams=CacheInitParams,
        checkpoint_kv_cache=checkpoint_kv_cache,
        evict_from_tree_cache=evict_from_tree_cache,
        release_kv_cache=release_kv_cache,
        KvEventLoraNames=KvEventLoraNames,
        MHATokenToKVPool=MHATokenToKVPool,
        ReqToTokenPool=ReqToTokenPool,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
        ComponentType=ComponentType,
        UnifiedRadixCache=UnifiedRadixCache,
        SamplingParams=SamplingParams,
        ServerArgs=ServerArgs,
        set_global_server_args_for_scheduler=set_global_server_args_for_scheduler,
        RecordingPool=RecordingPool,
        RecordingPagedPool=RecordingPagedPool,
    )
    return _S


def set_server_args(page_size: int, **extra: Any) -> None:
    s = load()
    s["set_global_server_args_for_scheduler"](
        s["ServerArgs"](model_path="dummy", page_size=page_size, **extra)
    )


KINDS = ("radixmeta", "classic", "unified")


class Engine:
    """One scheduler's pools and tree cache; its methods are the scheduler's calls."""

    def __init__(
        self,
        kind: str,
        *,
        page_size: int = 1,
        size: int = 512,
        max_reqs: int = 16,
        context: int = 512,
        events: bool = True,
        eviction: str = "lru",
        is_eagle: bool = False,
        dynamo: bool = False,
        lora_names: Any = None,
    ) -> None:
        s = self.s = load()
        torch = s["torch"]
        self.kind = kind
        self.page_size = page_size
        self.size = size
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
        # need_sort: freed slots are merged in sorted order, so engines that free
        # the same slots in a different order allocate the same ones afterwards.
        if page_size == 1:
            alloc = s["RecordingPool"](
                size=size, dtype=torch.float16, device="cpu", kvcache=kv, need_sort=True
            )
        else:
            alloc = s["RecordingPagedPool"](
                size=size,
                page_size=page_size,
                dtype=torch.float16,
                device="cpu",
                kvcache=kv,
                need_sort=True,
            )
        alloc.freed = []
        self.alloc = alloc
        params = s["CacheInitParams"](
            disable=False,
            req_to_token_pool=self.rtp,
            token_to_kv_pool_allocator=alloc,
            page_size=page_size,
            is_eagle=is_eagle,
            eviction_policy=eviction,
            enable_kv_cache_events=events,
            dynamo_kv_event_format=dynamo,
            kv_event_lora_names=lora_names if lora_names is not None else s["KvEventLoraNames"](),
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

            self.cache = create_cache(_context(params))
        self.full = alloc.available_size()
        self.reqs: dict[str, Any] = {}

    # -- the scheduler's calls ---------------------------------------------------------------
    def admit(
        self,
        rid: str,
        prompt: list[int],
        outputs: list[int],
        *,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        lora_id: str | None = None,
    ) -> int | None:
        """Match, lock, allocate the request's KV (evicting when short). None: no room."""
        s = self.s
        req = s["Req"](
            rid=rid,
            origin_input_text="",
            origin_input_ids=array("q", prompt),
            sampling_params=s["SamplingParams"](max_new_tokens=max(1, len(outputs))),
            extra_key=extra_key,
            cache_salt=cache_salt,
            lora_id=lora_id,
        )
        req.planned_outputs = list(outputs)
        self.rtp.alloc([req])
        req.init_next_round_input(self.cache)
        req.lock = self.cache.lock(req.last_node)
        total = len(prompt) + len(outputs)
        need = total - req.prefix_len
        ps = self.page_size
        need_aligned = -(-need // ps) * ps
        s["evict_from_tree_cache"](self.cache, need_aligned)
        slots = self.alloc.alloc(need_aligned)
        if slots is None:  # not enough even after eviction: the request waits
            self.cache.unlock(req.lock)
            self.rtp.free(req)
            return None
        prefix = self.cache.prefix_device_indices(req)
        assert prefix.dtype == s["torch"].int64 and len(prefix) == req.prefix_len
        row = req.kv.req_pool_idx
        self.rtp.write((row, slice(0, req.prefix_len)), prefix)
        self.rtp.write((row, slice(req.prefix_len, total)), slots[:need])
        req.kv.kv_committed_len = len(prompt)
        req.kv.kv_allocated_len = len(prompt)
        req.extend_end = len(prompt)
        self.reqs[rid] = req
        return int(req.prefix_len)

    def checkpoint(self, rid: str) -> int:
        """A checkpoint while running (a chunked prefill's end): the prompt goes in the tree."""
        req = self.reqs[rid]
        self.s["checkpoint_kv_cache"](req, self.cache)
        return int(req.kv.cache_protected_len)

    def finish(self, rid: str) -> None:
        """Decode the planned outputs, finish and release (checkpointing the whole row)."""
        req = self.reqs.pop(rid)
        for t in req.planned_outputs:
            req.output_ids.append(t)
        n = len(req.origin_input_ids) + len(req.output_ids)
        req.kv.kv_committed_len = n
        req.kv.kv_allocated_len = n
        req.finished_reason = self.s["FINISH_LENGTH"](length=len(req.output_ids))
        self.s["release_kv_cache"](req, self.cache, checkpoint=True)

    def evict(self, tokens: int) -> int:
        return int(self.cache.evict(self.s["EvictParams"](num_tokens=tokens)).num_tokens_evicted)

    def match(self, tokens: list[int], **key: Any) -> int:
        s = self.s
        m = self.cache.match_prefix(
            s["MatchPrefixParams"](key=s["RadixKey"](array("q", tokens), **key))
        )
        return int(m.device_prefix_len)

    # -- observations ----------------------------------------------------------------------
    def take_freed(self) -> list[int]:
        freed, self.alloc.freed = sorted(self.alloc.freed), []
        return freed

    def events(self) -> list[Any]:
        """The drained events, coalesced: SGLang's two trees do not always merge alike.

        (The unified tree sometimes sends one removal per node where the classic
        tree, and radixmeta, send one for the call; consumers see the same
        blocks in the same order either way.)
        """
        out: list[Any] = []
        for e in map(_event, self.cache.take_events()):
            tail = out[-1] if out else None
            if tail and tail[0] == e[0] == "BlockRemoved" and tail[2] == e[2]:
                out[-1] = (tail[0], tail[1] + e[1], tail[2])
            elif (
                tail
                and tail[0] == e[0] == "BlockStored"
                and tail[4:] == e[4:]
                and e[2] == tail[1][-1]
            ):
                out[-1] = (tail[0], tail[1] + e[1], tail[2], tail[3] + e[3], *tail[4:])
            else:
                out.append(e)
        return out

    def sizes(self) -> tuple[int, int, int]:
        return (
            int(self.cache.evictable_size()),
            int(self.cache.protected_size()),
            int(self.alloc.available_size()),
        )


def _event(e: Any) -> tuple[Any, ...]:
    name = type(e).__name__
    if name == "BlockStored":
        return (
            name,
            tuple(e.block_hashes),
            e.parent_block_hash,
            tuple(tuple(t) if isinstance(t, tuple) else t for t in e.token_ids),
            e.block_size,
            e.cache_salt,
            e.lora_name,
            str(e.medium),
        )
    if name == "BlockRemoved":
        return (name, tuple(e.block_hashes), str(e.medium))
    return (name,)


def _context(params: Any, **overrides: Any) -> Any:
    """A TreeCacheBuildContext for ``params`` (no model, no TP group)."""
    s = load()
    fields = {
        "server_args": s["ServerArgs"](model_path="dummy", page_size=params.page_size),
        "params": params,
        "is_hybrid_swa": False,
        "is_hybrid_ssm": False,
        "enable_hierarchical_cache": False,
        "disable_radix_cache": False,
        "tp_worker": None,
        "model_config": None,
        "tp_size": 1,
        "tp_rank": 0,
        "tp_group": None,
    }
    fields.update(overrides)
    return s["registry"].TreeCacheBuildContext(**fields)


context = _context
