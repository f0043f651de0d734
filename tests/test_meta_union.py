"""The union property: a MetaTree fed what N worker caches do holds exactly their union.

N ``RadixCache`` instances with small capacities (so that they evict all the time) get
random traffic: matches and inserts of keys from one overlapping pool, and explicit
evictions. Every change of a cache's cached pages is mirrored into one meta-tree, either
as token paths (``insert(key, w, start=already_cached)`` for an insert, ``remove(page, w,
start=...)`` for each page that went) or as the engine's KV events (``apply_stored``
chained onto the cached prefix, ``apply_removed`` of the evicted pages' hashes). Then,
for every cache, the tree's view of that worker is the cache's page set, and for random
queries ``tree.match(q).length_of(w_i) == caches[i].match_prefix(q).length``.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import REFERENCE_META
from hypothesis import given
from hypothesis import strategies as st

from radixmeta import MetaTree, RadixCache
from radixmeta.testing_meta import block_hash_of, meta_key_pools

Tokens = tuple[int, ...]

# radixmeta.MetaTree (on the active backend) and the reference core, if that is another one.
TREES: dict[str, type] = {"MetaTree": MetaTree}
if not issubclass(MetaTree, REFERENCE_META):
    TREES["reference"] = REFERENCE_META

# (stem index, pages dropped from its end, a tail token or none)
KEYS = st.tuples(
    st.integers(0, 9), st.sampled_from([0, 0, 1, 2, 3]), st.sampled_from([(), (), (2,)])
)


def cached_pages(cache: RadixCache) -> set[Tokens]:
    """Every cached page of a cache: each page-aligned prefix of each leaf."""
    p = cache.page_size
    out: set[Tokens] = set()
    for key, _ in cache.items():
        toks = tuple(int(t) for t in key)
        out.update(toks[:end] for end in range(p, len(toks) + 1, p))
    return out


def tree_pages(tree: Any, worker: Any) -> set[Tokens]:
    """The pages the tree says ``worker`` holds."""
    p = tree.page_size
    out: set[Tokens] = set()
    for key, start, *_ in tree.dump(worker):
        toks = tuple(int(t) for t in key)
        out.update(toks[:end] for end in range(start + p, len(toks) + 1, p))
    return out


@pytest.mark.parametrize("tree_cls", list(TREES.values()), ids=list(TREES))
@given(
    data=st.data(),
    page_size=st.sampled_from([1, 2, 4]),
    n_caches=st.integers(2, 5),
    mirror=st.sampled_from(["paths", "events"]),
)
def test_tree_is_the_union_of_the_caches(
    tree_cls: type, data: st.DataObject, page_size: int, n_caches: int, mirror: str
) -> None:
    p = page_size
    stems = data.draw(meta_key_pools(p, min_stems=2, max_stems=6), label="stems")
    longest = max(len(s) for s in stems) + p
    # Room for the longest key (else RadixCache refuses it) and at most two more pages,
    # so that inserts evict all the time.
    capacities = st.lists(
        st.integers(longest, longest + 2 * p), min_size=n_caches, max_size=n_caches
    )
    caches = [RadixCache(p, capacity=c) for c in data.draw(capacities, label="capacities")]
    tree = tree_cls(p)
    workers = [tree.add_worker(f"cache-{i}") for i in range(n_caches)]

    def key(spec: tuple[int, int, Tokens]) -> list[int]:
        index, drop, tail = spec
        stem = stems[index % len(stems)]
        return stem[: max(0, len(stem) - drop * p)] + list(tail)

    def check_matches(query: list[int]) -> None:
        m = tree.match(query)
        for cache, w in zip(caches, workers, strict=True):
            assert m.length_of(w) == cache.match_prefix(query).length, (query, w)

    steps = st.lists(
        st.tuples(
            st.integers(0, n_caches - 1),
            st.sampled_from(["insert", "insert", "insert", "match", "evict"]),
            KEYS,
            st.integers(1, 3 * p),
            KEYS,
        ),
        min_size=10,
        max_size=50,
    )
    for i, kind, spec, evict_tokens, query in data.draw(steps, label="steps"):
        cache, w, k = caches[i], workers[i], key(spec)
        before = cached_pages(cache)
        if kind == "match":
            cache.match_prefix(k)  # refreshes the cache's LRU and may split; no page changes
            cached = None
        elif kind == "insert":
            cached = cache.insert(k)  # the length already cached; evicts first if needed
        else:
            cache.evict(evict_tokens)
            cached = None
        after = cached_pages(cache)
        gone = before - after
        # Mirror: first what the cache evicted, then what it added.
        if mirror == "paths":
            for page in sorted(gone, key=len, reverse=True):
                assert tree.remove(page, w, start=len(page) - p) == 1
        else:
            assert tree.apply_removed(w, [block_hash_of(page) for page in gone]) == len(gone)
        if cached is not None:
            n = len(k) // p * p
            if mirror == "paths":
                assert tree.insert(k, w, start=cached) == (n - cached) // p
            else:
                parent = block_hash_of(k[:cached]) if cached else None
                hashes = [block_hash_of(k[:end]) for end in range(cached + p, n + 1, p)]
                assert tree.apply_stored(w, parent, hashes, k[cached:n]) == len(hashes)
        assert tree_pages(tree, w) == after
        assert tree.held_tokens(w) == len(after) * p
        check_matches(key(query))
    tree.check()
    for cache, w in zip(caches, workers, strict=True):
        assert tree_pages(tree, w) == cached_pages(cache)
    for stem in stems:
        for end in range(0, len(stem) + 1, p):
            check_matches([*stem[:end], 2])
