"""Deterministic workloads for the side-by-side cache benchmark (``bench/compare.py``).

Every builder takes a ``seed`` (default 0) and returns the same arrays on every
machine: they depend only on numpy's ``PCG64`` generator. Token sequences are
1-D ``numpy.int64`` arrays.

``two_level``
    The shared-prefix workload of the reference measurements: 100 random system
    prompts of 512 tokens, each followed by one of 10 few-shot blocks of 128
    tokens, each followed by 10 unique suffixes of 64-256 tokens. That is
    10,000 sequences, about 8.0 M tokens, of which about 1.78 M are distinct
    (the size of the cached tree). The insertion order is a seeded shuffle, so
    requests for different system prompts arrive interleaved.

``partial_queries``
    For each sequence (in a seeded order), a random-length prefix of it followed
    by 32 *novel* tokens drawn from ``[vocab, 2 * vocab)``, ids that never occur
    in the inserted data. The cached match therefore ends exactly at the prefix
    length (rounded down to a page), usually inside an edge, so the match
    splits a node.

``deep_tree``
    About 100,000 nodes, with one 2,048-token prompt fully cached along a deep
    path. See :func:`deep_tree` for the construction and how the node count is
    reached.

``describe``
    Total and distinct token counts and the exact node count of the radix tree a
    set of sequences produces (computed from the sorted sequences, no tree).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["deep_tree", "describe", "partial_queries", "slot_values", "two_level"]

_DTYPE = np.int64


def _rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.PCG64(seed))


def two_level(
    seed: int = 0,
    n_system: int = 100,
    n_fewshot: int = 10,
    n_suffix: int = 10,
    system_len: int = 512,
    fewshot_len: int = 128,
    suffix_min: int = 64,
    suffix_max: int = 256,
    vocab: int = 32000,
    *,
    return_groups: bool = False,
) -> Any:
    """Return ``n_system * n_fewshot * n_suffix`` sequences sharing two prefix levels.

    Sequence ``(s, f, u)`` is ``system[s] + fewshot[s][f] + suffix[s][f][u]``.
    Few-shot blocks are drawn independently for every system prompt (they sit in
    different subtrees anyway), suffix lengths are uniform in
    ``[suffix_min, suffix_max]``. The returned list is in a seeded random order.

    With the defaults: 10,000 sequences, ~8.0 M tokens, ~1.78 M distinct.

    With ``return_groups=True`` returns ``(sequences, system_ids)``, the index of
    each sequence's system prompt, so that a same-shaped fraction of the
    workload (all sequences of the first k system prompts) can be selected.
    """
    rng = _rng(seed)
    systems = rng.integers(0, vocab, size=(n_system, system_len), dtype=_DTYPE)
    fewshots = rng.integers(0, vocab, size=(n_system, n_fewshot, fewshot_len), dtype=_DTYPE)
    n = n_system * n_fewshot * n_suffix
    lengths = rng.integers(suffix_min, suffix_max + 1, size=n)
    suffix_tokens = rng.integers(0, vocab, size=int(lengths.sum()), dtype=_DTYPE)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    sequences: list[np.ndarray] = []
    i = 0
    for s in range(n_system):
        for f in range(n_fewshot):
            head = np.concatenate((systems[s], fewshots[s, f]))
            for _ in range(n_suffix):
                sequences.append(np.concatenate((head, suffix_tokens[starts[i] : ends[i]])))
                i += 1
    order = rng.permutation(n)
    shuffled = [sequences[k] for k in order]
    if return_groups:
        return shuffled, order // (n_fewshot * n_suffix)
    return shuffled


def partial_queries(
    sequences: Sequence[np.ndarray],
    seed: int = 0,
    novel_tokens: int = 32,
    vocab: int = 32000,
) -> list[np.ndarray]:
    """One query per sequence: a random prefix of it plus ``novel_tokens`` unseen ids.

    The prefix length is uniform in ``[1, len(seq) - 1]``; the novel ids come from
    ``[vocab, 2 * vocab)`` so they can never extend the match. The queries are
    returned in a seeded random order (independent of the insertion order).
    """
    rng = _rng(seed + 1_000_003)
    n = len(sequences)
    order = rng.permutation(n)
    fractions = rng.random(n)
    novel = rng.integers(vocab, 2 * vocab, size=(n, novel_tokens), dtype=_DTYPE)
    out: list[np.ndarray] = []
    for j, k in enumerate(order):
        seq = sequences[k]
        cut = 1 + int(fractions[j] * (len(seq) - 1))
        out.append(np.concatenate((seq[:cut], novel[j])))
    return out


def slot_values(sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
    """KV slot values for inserting ``sequences``: disjoint consecutive int64 ranges."""
    lengths = np.fromiter((len(s) for s in sequences), dtype=np.int64, count=len(sequences))
    ends = np.cumsum(lengths)
    return [
        np.arange(e - n, e, dtype=np.int64)
        for e, n in zip(ends.tolist(), lengths.tolist(), strict=True)
    ]


def deep_tree(
    seed: int = 0,
    nodes: int = 100_000,
    prompt_len: int = 2048,
    *,
    stride: int = 16,
    unit: int = 16,
    tail_max: int = 256,
    root_every: int = 50,
    max_len: int = 4096,
    vocab: int = 32000,
    return_info: bool = False,
    grow_on_prompt: bool = True,
) -> Any:
    """Return ``(sequences, prompt)``: a ~``nodes``-node tree holding ``prompt`` on a deep path.

    Construction (all lengths and branch points are multiples of ``unit`` = 16,
    so the tree is the same at page size 1 and 16):

    1. ``prompt`` (``prompt_len`` random tokens) is inserted first.
    2. Along the prompt, one sequence branches off every ``stride`` tokens:
       ``prompt[:b] + tail`` for ``b = stride, 2*stride, ...``. This cuts the
       prompt's path into ``prompt_len / stride`` nodes (128 with the defaults),
       so matching it walks a long chain of nodes, each with a sibling.
    3. The rest of the tree grows at random, one sequence at a time: with
       probability ``1/root_every`` a fresh random sequence (64-1024 tokens),
       otherwise ``parent[:b] + tail`` for a uniformly chosen earlier sequence,
       a uniform branch point ``b`` (a multiple of 16 in ``[16, len(parent)]``)
       and a random tail of 16-``tail_max`` tokens. Any earlier sequence can be a
       parent, including the prompt and its branches, so more branches land
       along the prompt path and below it as the tree grows.

    How the node count is reached: every insertion adds exactly one leaf, plus
    one node when its branch point is not yet a node boundary (the split of an
    edge). The builder tracks the set of boundaries exactly (each prefix
    ``seq[:x]`` is identified by the earliest sequence that owns it) and makes the
    first token of every tail differ from the tokens that already continue at its
    branch point, so the count is exact, not an estimate. It stops as soon as the
    count reaches ``nodes``; ``describe(sequences)["nodes"]`` confirms it. With
    the defaults that takes 68,389 sequences, 23.2 M tokens (9.9 M distinct),
    and the prompt's path is 128 nodes deep. (Many random branch points land on
    an existing boundary, which is why there are fewer than two nodes per
    sequence.)

    With ``grow_on_prompt=False`` step 3 never branches off the prompt or its
    branches (fresh roots still appear), so the prompt's path stays exactly
    ``prompt_len / stride`` nodes deep: a chat-like depth when ``stride`` is a
    few hundred tokens, against the worst case of the default.

    With ``return_info=True`` returns ``(sequences, prompt, info)`` where
    ``info`` has the node count, the number of nodes on the prompt's path and
    the token totals.
    """
    if prompt_len % unit or stride % unit or prompt_len > max_len:
        msg = "prompt_len and stride must be multiples of unit, prompt_len <= max_len"
        raise ValueError(msg)
    rng = _rng(seed)
    seqs: list[np.ndarray] = []
    parent: list[int] = []
    branch: list[int] = []
    # boundary (owner sequence, offset) -> first tokens continuing after it.
    # (-1, 0) is the root.
    boundaries: dict[tuple[int, int], set[int]] = {(-1, 0): set()}
    count = 0

    def owner_of(i: int, x: int) -> tuple[int, int]:
        # The earliest sequence whose tokens [0, x) are those of sequence i.
        while parent[i] >= 0 and x <= branch[i]:
            i = parent[i]
        return (i, x)

    def fresh_tail(length: int, avoid: set[int]) -> np.ndarray:
        tail = rng.integers(0, vocab, size=length, dtype=_DTYPE)
        while int(tail[0]) in avoid:
            tail[0] = rng.integers(0, vocab)
        return tail

    def add(p: int, b: int, tail_len: int) -> None:
        nonlocal count
        key = (-1, 0) if p < 0 else owner_of(p, b)
        conts = boundaries.get(key)
        if conts is None:  # the branch point falls inside an edge: it gets split
            owner, off = key
            conts = boundaries[key] = {int(seqs[owner][off])}
            count += 1
        tail = fresh_tail(tail_len, conts)
        conts.add(int(tail[0]))
        seq = tail if p < 0 else np.concatenate((seqs[p][:b], tail))
        seqs.append(seq)
        parent.append(p)
        branch.append(b)
        boundaries[(len(seqs) - 1, len(seq))] = set()
        count += 1

    add(-1, 0, prompt_len)
    for b in range(stride, prompt_len, stride):
        add(0, b, unit * int(rng.integers(1, tail_max // unit + 1)))
    first_free = len(seqs)
    while count < nodes:
        no_parent = not grow_on_prompt and len(seqs) == first_free
        if no_parent or rng.integers(0, root_every) == 0:
            add(-1, 0, unit * int(rng.integers(4, 65)))
            continue
        # Sequences 0..first_free-1 are the prompt and its branches; without
        # grow_on_prompt the random growth leaves that subtree alone, so the
        # prompt's path keeps exactly prompt_len / stride nodes.
        p = int(rng.integers(0 if grow_on_prompt else first_free, len(seqs)))
        tail_len = unit * int(rng.integers(1, tail_max // unit + 1))
        top = min(len(seqs[p]), max_len - tail_len)
        b = unit * int(rng.integers(1, top // unit + 1))
        add(p, b, tail_len)

    prompt = seqs[0]
    if not return_info:
        return seqs, prompt
    path_nodes = sum(1 for (o, x) in boundaries if o == 0 and 0 < x <= prompt_len)
    info = {
        "nodes": count,
        "prompt_path_nodes": path_nodes,
        "sequences": len(seqs),
        "total_tokens": int(sum(len(s) for s in seqs)),
    }
    return seqs, prompt, info


def describe(sequences: Sequence[np.ndarray], page_size: int = 1) -> dict[str, int]:
    """Token and node counts of the radix tree built by inserting ``sequences``.

    ``total_tokens`` counts every token passed to insert; ``distinct_tokens`` is
    what the tree stores (the union of all page-aligned prefixes) and ``nodes``
    its exact node count (root excluded), both at ``page_size``. Computed by
    sorting the page-aligned sequences and summing adjacent common prefixes.
    """
    p = page_size
    keys = []
    total = 0
    for s in sequences:
        total += len(s)
        n = len(s) - len(s) % p
        if n:
            # Big-endian fixed-width bytes sort exactly like the token sequences.
            keys.append(np.ascontiguousarray(s[:n], dtype=">u4").tobytes())
    keys = sorted(set(keys))
    distinct = 0
    node_count = 0
    stack = [0]  # depths (in tokens) of the nodes on the current path
    prev = b""
    for k in keys:
        m = min(len(prev), len(k)) // 4
        a = np.frombuffer(prev, dtype=">u4", count=m)
        c = np.frombuffer(k, dtype=">u4", count=m)
        diff = np.flatnonzero(a != c)
        lcp = int(diff[0]) if len(diff) else m
        lcp -= lcp % p
        length = len(k) // 4
        distinct += length - lcp
        while stack[-1] > lcp:
            stack.pop()
        if stack[-1] < lcp:  # a branching point inside an earlier edge
            stack.append(lcp)
            node_count += 1
        stack.append(length)  # this sequence's end (length > lcp: keys are unique)
        node_count += 1
        prev = k
    return {
        "sequences": len(sequences),
        "total_tokens": total,
        "distinct_tokens": distinct,
        "nodes": node_count,
        "page_size": p,
    }
