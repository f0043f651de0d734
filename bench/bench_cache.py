"""pytest-benchmark suite for RadixCache's hot paths (not part of the test suite).

Run: ``python -m pytest bench/bench_cache.py --benchmark-only`` (add
``--benchmark-json=out.json`` to keep the numbers). Each benchmark runs on the
native core and on the pure-Python reference, so the table pytest-benchmark
prints compares the two in one run on the same data; ``bench/compare.py`` adds
SGLang and prints ratios.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))

import workloads

from radixmeta import _core, _reference

IMPLEMENTATIONS = {"native": _core.CacheCore, "reference": _reference.CacheCore}
# The reference is ~100x slower: it gets a slice of the workload so the suite
# finishes; benchmarks report per-call times, which stay comparable.
SEQUENCES = {"native": 2000, "reference": 200}


@pytest.fixture(scope="module")
def two_level() -> list[np.ndarray]:
    return workloads.two_level(seed=0)


DEEP_SHAPES = {
    # 8 nodes on the prompt's path: a chat-like depth (system prompt, turns).
    "chat": {"stride": 256, "grow_on_prompt": False},
    # 128 nodes on the path, more branching in below: the worst case.
    "worst": {"stride": 16, "grow_on_prompt": True},
}


@pytest.fixture(scope="module", params=list(DEEP_SHAPES))
def deep(request: Any) -> tuple[str, list[np.ndarray], np.ndarray]:
    seqs, prompt = workloads.deep_tree(seed=0, **DEEP_SHAPES[request.param])
    return request.param, seqs, prompt


def _filled(impl: str, page_size: int, seqs: list[np.ndarray]) -> Any:
    cache = IMPLEMENTATIONS[impl](page_size)
    for seq in seqs:
        cache.insert(seq)
    return cache


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_insert(benchmark: Any, impl: str, page_size: int, two_level: list[np.ndarray]) -> None:
    seqs = two_level[: SEQUENCES[impl]]
    values = workloads.slot_values(seqs)

    def run() -> None:
        cache = IMPLEMENTATIONS[impl](page_size)
        for seq, val in zip(seqs, values, strict=True):
            cache.insert(seq, val)

    benchmark.pedantic(run, rounds=3, iterations=1)
    benchmark.extra_info["per_call"] = f"divide by {len(seqs)} sequences"


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_match_full_hit(
    benchmark: Any, impl: str, page_size: int, two_level: list[np.ndarray]
) -> None:
    seqs = two_level[: SEQUENCES[impl]]
    cache = _filled(impl, page_size, seqs)
    query = seqs[len(seqs) // 2]
    result = benchmark(cache.match_prefix, query)
    assert result.length == len(query) - len(query) % page_size


@pytest.mark.parametrize("dtype", ["uint32", "int64"])
@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_match_deep_tree_2048(
    benchmark: Any, impl: str, dtype: str, deep: tuple[str, list[np.ndarray], np.ndarray]
) -> None:
    """Workload (b): one fully cached 2,048-token numpy prompt in a 100k-node tree."""
    shape, seqs, prompt = deep
    if impl == "reference":
        seqs = seqs[:2000]  # the prompt and its branches come first
    cache = _filled(impl, 1, seqs)
    key = prompt.astype(dtype)
    result = benchmark(cache.match_prefix, key)
    assert result.length == 2048
    benchmark.extra_info["shape"] = shape


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_lock_unlock_pair(benchmark: Any, impl: str, two_level: list[np.ndarray]) -> None:
    seqs = two_level[: SEQUENCES[impl]]
    cache = _filled(impl, 1, seqs)
    node = cache.match_prefix(seqs[0]).node

    def pair() -> None:
        cache.lock(node)
        cache.unlock(node)

    benchmark(pair)


@pytest.mark.parametrize("impl", list(IMPLEMENTATIONS))
def test_evict_all_in_4096_token_calls(
    benchmark: Any, impl: str, two_level: list[np.ndarray]
) -> None:
    seqs = two_level[: SEQUENCES[impl]]

    def setup() -> tuple[tuple[Any], dict[str, Any]]:
        return (_filled(impl, 1, seqs),), {}

    def drain(cache: Any) -> None:
        evict: Callable[[int], Any] = cache.evict
        while cache.evictable_size:
            evict(4096)

    benchmark.pedantic(drain, setup=setup, rounds=3, iterations=1)


KEY_FORMS: dict[str, Callable[[np.ndarray], Any]] = {
    "int32-array": lambda k: k.astype(np.int32),
    "uint32-array": lambda k: k.astype(np.uint32),
    "int64-array": lambda k: k.astype(np.int64),
    "list": lambda k: [int(t) for t in k],  # what SGLang's schedulers hold
    "tuple": lambda k: tuple(int(t) for t in k),
}


@pytest.mark.parametrize("values", [True, False], ids=["values", "length-only"])
@pytest.mark.parametrize("form", list(KEY_FORMS))
def test_match_4096_tokens_by_key_form(benchmark: Any, form: str, values: bool) -> None:
    """A full-hit match of one 4,096-token key given in each accepted form (native core).

    The spread between the rows is what the caller's choice of key type costs:
    compare the list rows with the int32-array rows of the same run.
    """
    key = np.random.default_rng(0).integers(0, 150_000, 4096)
    cache = _core.CacheCore()
    cache.insert(key)
    query = KEY_FORMS[form](key)
    result = benchmark(cache.match_prefix, query, values=values)
    assert result.length == 4096
