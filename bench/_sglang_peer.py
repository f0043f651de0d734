"""SGLang 0.5.23's radix caches as benchmark peers, plus the timing driver shared with radixmeta.

Two parts:

* **The timing driver** (:func:`time_suite`, :func:`time_deep_match`). It runs
  the same phases, in the same order, with the same checks, for every
  implementation, through a small adapter object (see :class:`Adapter`). Each
  adapter runs whole loops itself (bound methods in locals), so no per-call
  indirection from the driver is timed. ``bench/compare.py`` uses the driver
  for radixmeta too, so both sides are measured by one piece of code.
* **SGLang adapters** for the classic pure-Python ``RadixCache`` and for
  ``UnifiedRadixCache`` with its Rust ``TreeCore`` (0.5.23's default) or its
  Python ``TreeCore``. Build them with :func:`sglang_adapters`; it raises
  ``ModuleNotFoundError`` (with the install pointer) when sglang is not
  importable, and callers skip.

How SGLang is driven (0.5.23 API):

* keys are ``RadixKey(array('q', tokens))``: the ``array`` objects are built
  before timing, the ``RadixKey`` and ``*Params`` wrappers inside the timed loop
  (they are part of calling the API);
* values are int64 ``torch`` tensors made with ``torch.from_numpy`` before
  timing. Slots of an already-cached prefix: the classic tree (like radixmeta)
  leaves freeing them to the caller, which the benchmark skips; the unified
  tree frees them itself through ``FreeDeviceKV`` actions, which reach the
  counting allocator inside the timed insert (part of its contract);
* the allocator is a counting stand-in: ``free``/``free_segment`` only add up
  calls and slots. The stock CPU allocator concatenates its whole free list on
  every free, which would dominate the timings;
* lock pairs: classic ``inc_lock_ref``/``dec_lock_ref`` on the node; unified
  ``lock(node_id)`` then ``unlock(receipt)``;
* ``match_prefix`` in 0.5.22+ returns only the matched length (no slot
  indices), while radixmeta's returns the slot values. For a like-for-like
  number the suite also times "match + ``path_device_indices``" on SGLang.

Nothing here is copied from SGLang; it only imports the installed package.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = [
    "Adapter",
    "ClassicRadixCache",
    "UnifiedCache",
    "EXPECTED_SGLANG_VERSION",
    "SGLANG_RECIPE_HINT",
    "expected_lengths",
    "load_sglang",
    "sglang_adapters",
    "time_deep_match",
    "time_suite",
]

EXPECTED_SGLANG_VERSION = "0.5.23"
SGLANG_RECIPE_HINT = (
    "sglang is not importable in this interpreter. The SGLang peer runs in a "
    "separate venv: see bench/README.md, section 'SGLang peer' (CPU torch 2.13, "
    "sglang==0.5.23 --no-deps plus a short list of extras). Run compare.py "
    "with --no-sglang to skip it."
)
EVICT_CHUNK = 4096


# --------------------------------------------------------------------------------------
# Shared timing driver
# --------------------------------------------------------------------------------------


class Adapter(Protocol):
    """What the driver needs from one implementation. Loops live in the adapter."""

    label: str

    def prepare(
        self, sequences: Sequence[np.ndarray], values: Sequence[np.ndarray]
    ) -> tuple[list[Any], list[Any]]:
        """Convert the workload to this implementation's (keys, values); untimed."""

    def prepare_keys(self, sequences: Sequence[np.ndarray]) -> list[Any]: ...
    def new_cache(self, page_size: int) -> Any: ...
    def insert_all(self, cache: Any, prepared: tuple[list[Any], list[Any]]) -> None: ...
    def match_all(self, cache: Any, keys: list[Any]) -> tuple[list[Any], int]:
        """Match every key; return the matched nodes and the sum of matched lengths."""

    def lock_pairs(self, cache: Any, nodes: list[Any]) -> None: ...
    def evict_all(self, cache: Any, chunk: int) -> tuple[int, int]:
        """Evict ``chunk`` tokens per call until nothing is evictable: (calls, tokens)."""

    def evictable(self, cache: Any) -> int: ...
    def node_count(self, cache: Any) -> int | None: ...
    def match_one(self, cache: Any, key: Any) -> int: ...

    # Optional: ``match_all_indices(cache, keys) -> int`` (match plus gathering the
    # slot indices, summed lengths) and ``evicted_nodes() -> int`` (nodes removed by
    # the last ``evict_all``; otherwise the node count before evicting is used).


def _timed(fn: Callable[..., Any], *args: Any) -> tuple[float, Any]:
    """Run ``fn(*args)`` once with the garbage collector off; return (seconds, result)."""
    gc.collect()
    gc.disable()
    try:
        t0 = time.perf_counter_ns()
        out = fn(*args)
        t1 = time.perf_counter_ns()
    finally:
        gc.enable()
    return (t1 - t0) / 1e9, out


def _rate(seconds: list[float], ops: int) -> dict[str, Any]:
    med = statistics.median(seconds)
    return {
        "ops": ops,
        "seconds": [round(s, 6) for s in seconds],
        "median_s": med,
        "ops_per_s": ops / med if med > 0 else float("inf"),
        "us_per_op": med / ops * 1e6 if ops else 0.0,
    }


def expected_lengths(
    sequences: Sequence[np.ndarray], partial: Sequence[np.ndarray], page_size: int, novel: int = 32
) -> tuple[int, int]:
    """Sum of matched lengths the full-hit and the partial phases must report."""
    p = page_size
    full = sum(len(s) - len(s) % p for s in sequences)
    part = sum((len(q) - novel) - (len(q) - novel) % p for q in partial)
    return full, part


def time_suite(
    adapter: Any,
    sequences: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    partial: Sequence[np.ndarray],
    page_size: int,
    repeats: int = 3,
    *,
    cached_tokens: int | None = None,
    novel: int = 32,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Time insert / full match / partial match / lock pairs / evict-until-empty.

    Every repeat builds a fresh cache (matches split nodes, so a tree is used
    once). Each phase's time is the median over ``repeats``. The matched lengths
    are checked against the workload (``expected_lengths``), and the evicted
    token count against ``cached_tokens`` when given; a mismatch raises.
    """
    prepared = adapter.prepare(sequences, values)
    keys = prepared[0]
    pkeys = adapter.prepare_keys(partial)
    want_full, want_part = expected_lengths(sequences, partial, page_size, novel)
    has_indices = hasattr(adapter, "match_all_indices")
    n, q = len(sequences), len(partial)
    t: dict[str, list[float]] = {
        k: []
        for k in (
            "insert",
            "match_full",
            "match_full_indices",
            "match_partial",
            "lock_pair",
            "evict",
        )
    }
    evict_calls = evict_tokens = 0
    evicted_nodes: int | None = None
    for r in range(repeats):
        cache = adapter.new_cache(page_size)
        s, _ = _timed(adapter.insert_all, cache, prepared)
        t["insert"].append(s)
        s, (nodes, got) = _timed(adapter.match_all, cache, keys)
        t["match_full"].append(s)
        if got != want_full:
            msg = f"{adapter.label}: full-hit matches returned {got} tokens, expected {want_full}"
            raise AssertionError(msg)
        if has_indices:
            s, got_i = _timed(adapter.match_all_indices, cache, keys)
            t["match_full_indices"].append(s)
            if got_i != want_full:
                msg = f"{adapter.label}: match+indices gathered {got_i} slots, expected {want_full}"
                raise AssertionError(msg)
        s, (_, got) = _timed(adapter.match_all, cache, pkeys)
        t["match_partial"].append(s)
        if got != want_part:
            msg = f"{adapter.label}: partial matches returned {got} tokens, expected {want_part}"
            raise AssertionError(msg)
        s, _ = _timed(adapter.lock_pairs, cache, nodes)
        t["lock_pair"].append(s)
        nodes = None  # drop the handles before evicting
        nodes_before_evict = adapter.node_count(cache)
        cached = adapter.evictable(cache)
        if cached_tokens is not None and cached != cached_tokens:
            msg = (
                f"{adapter.label}: {cached} evictable tokens before evict, expected {cached_tokens}"
            )
            raise AssertionError(msg)
        s, (calls, tokens) = _timed(adapter.evict_all, cache, EVICT_CHUNK)
        t["evict"].append(s)
        if tokens != cached or adapter.evictable(cache) != 0:
            msg = f"{adapter.label}: evicted {tokens} of {cached} tokens"
            raise AssertionError(msg)
        evict_calls, evict_tokens = calls, tokens
        counter = getattr(adapter, "evicted_nodes", None)
        evicted_nodes = counter() if counter is not None else nodes_before_evict
        cache = None
        if log:
            log(f"  {adapter.label} p={page_size} repeat {r + 1}/{repeats} done")
    out: dict[str, Any] = {
        "label": adapter.label,
        "page_size": page_size,
        "repeats": repeats,
        "insert": _rate(t["insert"], n),
        "match_full": _rate(t["match_full"], n),
        "match_partial": _rate(t["match_partial"], q),
        "lock_pair": _rate(t["lock_pair"], n),
    }
    if has_indices:
        out["match_full_indices"] = _rate(t["match_full_indices"], n)
    ev = _rate(t["evict"], evict_calls)
    med = ev["median_s"]
    ev["tokens"] = evict_tokens
    ev["tokens_per_s"] = evict_tokens / med if med > 0 else float("inf")
    ev["nodes"] = evicted_nodes
    ev["ns_per_node"] = med / evicted_nodes * 1e9 if evicted_nodes else None
    out["evict"] = ev
    return out


def time_deep_match(
    adapter: Any,
    sequences: Sequence[np.ndarray],
    prompt: np.ndarray,
    page_size: int,
    calls: int = 1000,
    *,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Build the deep tree once, then time ``calls`` matches of the fully cached prompt.

    Each call is timed on its own (``perf_counter_ns``, GC off); reports the
    median, 10th and 90th percentile in microseconds, plus the build rate.
    """
    values = _slot_ranges(sequences)
    prepared = adapter.prepare(sequences, values)
    del values
    key = adapter.prepare_keys([prompt])[0]
    cache = adapter.new_cache(page_size)
    build_s, _ = _timed(adapter.insert_all, cache, prepared)
    del prepared
    want = len(prompt) - len(prompt) % page_size
    got = adapter.match_one(cache, key)
    if got != want:
        msg = f"{adapter.label}: deep prompt matched {got} tokens, expected {want}"
        raise AssertionError(msg)
    us = _call_times(adapter.match_one, cache, key, calls)
    gathering = getattr(adapter, "match_one_indices", None)
    if gathering is not None and gathering(cache, key) != want:
        msg = f"{adapter.label}: deep prompt gathered a wrong number of slots"
        raise AssertionError(msg)
    out = {
        "label": adapter.label,
        "page_size": page_size,
        "sequences": len(sequences),
        "nodes": adapter.node_count(cache),
        "prompt_tokens": int(want),
        "calls": calls,
        "median_us": float(np.median(us)),
        "p10_us": float(np.percentile(us, 10)),
        "p90_us": float(np.percentile(us, 90)),
        "build_s": build_s,
        "build_seqs_per_s": len(sequences) / build_s if build_s > 0 else float("inf"),
    }
    if gathering is not None:  # the same match, and the matched slots gathered
        out["indices_median_us"] = float(np.median(_call_times(gathering, cache, key, calls)))
    del cache
    gc.collect()
    if log:
        log(f"  {adapter.label} deep p={page_size}: {out['median_us']:.1f} us/match")
    return out


def _call_times(fn: Callable[[Any, Any], Any], cache: Any, key: Any, calls: int) -> np.ndarray:
    """Microseconds of each of ``calls`` calls ``fn(cache, key)``, timed one by one, GC off."""
    clock = time.perf_counter_ns
    samples = np.empty(calls, dtype=np.int64)
    gc.collect()
    gc.disable()
    try:
        for i in range(calls):
            t0 = clock()
            fn(cache, key)
            samples[i] = clock() - t0
    finally:
        gc.enable()
    return samples / 1e3


def _slot_ranges(sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
    lengths = [len(s) for s in sequences]
    ends = np.cumsum(lengths).tolist()
    return [np.arange(e - n, e, dtype=np.int64) for e, n in zip(ends, lengths, strict=True)]


# --------------------------------------------------------------------------------------
# SGLang
# --------------------------------------------------------------------------------------

_SGL: dict[str, Any] = {}


def load_sglang() -> dict[str, Any]:
    """Import the pieces of SGLang the peers need (once); raise ModuleNotFoundError if absent.

    Installs the torchvision placeholder shim first (a no-op when a working
    torchvision exists). The import takes several seconds and ~0.5 GB.
    """
    if _SGL:
        return _SGL
    here = os.path.dirname(os.path.abspath(__file__))
    if here not in sys.path:
        sys.path.insert(0, here)
    try:
        import sglang
    except ImportError as exc:
        raise ModuleNotFoundError(SGLANG_RECIPE_HINT) from exc
    import _torchvision_shim

    _torchvision_shim.install()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch
        from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator
        from sglang.srt.mem_cache.base_prefix_cache import (
            EvictParams,
            InsertParams,
            MatchPrefixParams,
        )
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey
        from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
        from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    version = getattr(sglang, "__version__", "unknown")
    if version != EXPECTED_SGLANG_VERSION:
        warnings.warn(
            f"benchmark written for sglang {EXPECTED_SGLANG_VERSION}, found {version}; "
            "its cache API changes between minor versions",
            stacklevel=2,
        )

    class CountingAllocator(TokenToKVPoolAllocator):  # type: ignore[misc]
        """Stands in for the KV allocator: frees are only counted (no pool, no tensors)."""

        def __init__(self, page_size: int) -> None:  # no super(): no pool to build
            self.size = 1 << 20
            self.page_size = page_size
            self.dtype = torch.float16
            self.device = "cpu"
            self._kvcache = None
            self.need_sort = False
            self.free_group = None
            self.free_pages = None
            self.release_pages = None
            self.free_calls = 0
            self.freed_slots = 0

        def free(self, free_index: Any) -> None:
            self.free_calls += 1
            self.freed_slots += int(free_index.numel())

        def free_segment(self, free_index: Any, *, start_pos: int = 0) -> None:
            self.free_calls += 1
            self.freed_slots += int(free_index.numel())

    _SGL.update(
        version=version,
        torch_version=torch.__version__,
        torch=torch,
        RadixCache=RadixCache,
        RadixKey=RadixKey,
        UnifiedRadixCache=UnifiedRadixCache,
        CacheInitParams=CacheInitParams,
        InsertParams=InsertParams,
        MatchPrefixParams=MatchPrefixParams,
        EvictParams=EvictParams,
        ComponentType=ComponentType,
        CountingAllocator=CountingAllocator,
    )
    return _SGL


class _SGLangBase:
    """Loops shared by both SGLang trees (they take the same Params objects)."""

    label = "sglang"

    def __init__(self) -> None:
        self.s = load_sglang()

    # -- data conversion (untimed) -----------------------------------------------------
    def prepare(self, sequences: Sequence[np.ndarray], values: Sequence[np.ndarray]) -> Any:
        torch = self.s["torch"]
        keys = self.prepare_keys(sequences)
        vals = [torch.from_numpy(np.ascontiguousarray(v, dtype=np.int64)) for v in values]
        return keys, vals

    def prepare_keys(self, sequences: Sequence[np.ndarray]) -> list[Any]:
        from array import array

        out = []
        for seq in sequences:
            a = array("q")
            a.frombytes(np.ascontiguousarray(seq, dtype=np.int64).tobytes())
            out.append(a)
        return out

    def _params(self, page_size: int, **extra: Any) -> Any:
        s = self.s
        return s["CacheInitParams"](
            disable=False,
            req_to_token_pool=None,
            token_to_kv_pool_allocator=s["CountingAllocator"](page_size),
            page_size=page_size,
            eviction_policy="lru",
            enable_kv_cache_events=False,
            **extra,
        )

    # -- timed loops -------------------------------------------------------------------
    def insert_all(self, cache: Any, prepared: Any) -> None:
        keys, vals = prepared
        insert = cache.insert
        IP, RK = self.s["InsertParams"], self.s["RadixKey"]
        for k, v in zip(keys, vals, strict=True):
            insert(IP(key=RK(k), value=v))

    def match_all(self, cache: Any, keys: list[Any]) -> tuple[list[Any], int]:
        match = cache.match_prefix
        MP, RK = self.s["MatchPrefixParams"], self.s["RadixKey"]
        nodes: list[Any] = []
        append = nodes.append
        total = 0
        for k in keys:
            m = match(MP(key=RK(k)))
            append(m.last_device_node)
            total += m.device_prefix_len
        return nodes, total

    def match_all_indices(self, cache: Any, keys: list[Any]) -> int:
        """Match, then gather the slot indices of the matched path (radixmeta returns them)."""
        match = cache.match_prefix
        gather = cache.path_device_indices
        MP, RK = self.s["MatchPrefixParams"], self.s["RadixKey"]
        total = 0
        for k in keys:
            total += len(gather(match(MP(key=RK(k))).last_device_node))
        return total

    def match_one(self, cache: Any, key: Any) -> int:
        params = self.s["MatchPrefixParams"](key=self.s["RadixKey"](key))
        return int(cache.match_prefix(params).device_prefix_len)

    def match_one_indices(self, cache: Any, key: Any) -> int:
        params = self.s["MatchPrefixParams"](key=self.s["RadixKey"](key))
        return len(cache.path_device_indices(cache.match_prefix(params).last_device_node))

    def evict_all(self, cache: Any, chunk: int) -> tuple[int, int]:
        alloc = cache.token_to_kv_pool_allocator
        alloc.free_calls = 0
        evict = cache.evict
        size = cache.evictable_size
        params = self.s["EvictParams"](num_tokens=chunk)
        calls = tokens = 0
        while size() > 0:
            got = evict(params).num_tokens_evicted
            calls += 1
            tokens += got
            if got == 0:
                break
        # Both trees free each evicted node's slots with one free_segment() call.
        self._evicted_nodes = alloc.free_calls
        return calls, tokens

    def evicted_nodes(self) -> int:
        return int(self._evicted_nodes)

    def evictable(self, cache: Any) -> int:
        return int(cache.evictable_size())


class ClassicRadixCache(_SGLangBase):
    """SGLang's classic pure-Python ``RadixCache`` (lru, no KV events by default)."""

    def __init__(self, kv_events: bool = False) -> None:
        super().__init__()
        self.kv_events = kv_events
        self.label = "sglang-classic" + ("+events" if kv_events else "")

    def new_cache(self, page_size: int) -> Any:
        params = self._params(page_size)
        params.enable_kv_cache_events = self.kv_events
        return self.s["RadixCache"](params)

    def lock_pairs(self, cache: Any, nodes: list[Any]) -> None:
        inc, dec = cache.inc_lock_ref, cache.dec_lock_ref
        for node in nodes:
            inc(node)
            dec(node)

    def insert_all(self, cache: Any, prepared: Any) -> None:
        if not self.kv_events:
            super().insert_all(cache, prepared)
            return
        # With events on, drain the queue after every call, as the scheduler does
        # once per step (an undrained queue makes every later call slower).
        keys, vals = prepared
        insert, take = cache.insert, cache.take_events
        IP, RK = self.s["InsertParams"], self.s["RadixKey"]
        for k, v in zip(keys, vals, strict=True):
            insert(IP(key=RK(k), value=v))
            take()

    def evict_all(self, cache: Any, chunk: int) -> tuple[int, int]:
        if not self.kv_events:
            return super().evict_all(cache, chunk)
        alloc = cache.token_to_kv_pool_allocator
        alloc.free_calls = 0
        evict, size, take = cache.evict, cache.evictable_size, cache.take_events
        params = self.s["EvictParams"](num_tokens=chunk)
        calls = tokens = 0
        while size() > 0:
            got = evict(params).num_tokens_evicted
            take()
            calls += 1
            tokens += got
            if got == 0:
                break
        self._evicted_nodes = alloc.free_calls
        return calls, tokens

    def node_count(self, cache: Any) -> int:
        count = 0
        stack = list(cache.root_node.children.values())
        while stack:
            node = stack.pop()
            if node.value is not None:
                count += 1
            stack.extend(node.children.values())
        return count


class UnifiedCache(_SGLangBase):
    """SGLang's ``UnifiedRadixCache`` (FULL component only) on the Rust or Python TreeCore."""

    def __init__(self, core: str = "rust") -> None:
        super().__init__()
        if core not in ("rust", "python"):
            msg = f"core must be 'rust' or 'python', got {core!r}"
            raise ValueError(msg)
        self.core = core
        self.label = f"sglang-unified-{core}"

    def new_cache(self, page_size: int) -> Any:
        params = self._params(
            page_size,
            tree_components=(self.s["ComponentType"].FULL,),
            tree_core_backend=self.core,
        )
        cache = self.s["UnifiedRadixCache"](params)
        actual = type(cache.tree_core).__name__
        if (self.core == "rust") != actual.startswith("Rust"):
            msg = f"asked for the {self.core} TreeCore, got {actual} (fallback?)"
            raise RuntimeError(msg)
        return cache

    def lock_pairs(self, cache: Any, nodes: list[Any]) -> None:
        lock, unlock = cache.lock, cache.unlock
        for node in nodes:
            unlock(lock(node))

    def node_count(self, cache: Any) -> int | None:
        return None  # not exposed cheaply; evicted_nodes() gives the count after evict


def sglang_adapters(*, unified_python: bool = False, kv_events: bool = False) -> list[_SGLangBase]:
    """The SGLang peers to run: classic ``RadixCache`` and Rust-core ``UnifiedRadixCache``.

    ``unified_python`` adds the unified cache on its Python TreeCore (slower; the
    0.5.19/0.5.20 default); ``kv_events`` adds the classic tree with KV events on.
    Raises ``ModuleNotFoundError`` when sglang is not importable.
    """
    load_sglang()
    out: list[_SGLangBase] = [ClassicRadixCache(), UnifiedCache("rust")]
    if unified_python:
        out.append(UnifiedCache("python"))
    if kv_events:
        out.append(ClassicRadixCache(kv_events=True))
    return out
