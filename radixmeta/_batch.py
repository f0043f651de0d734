"""Shared-prefix groups of a dispatch batch, for the Router's A.4 batch path.

The native trie (``prefix_partners`` of the active backend) gives, per request,
the first earlier request of the batch that shares the most whole pages with it
and how many. Linking each request to that partner when they share "a long
prefix" makes a forest whose trees are the groups: every member shares at least
the smallest link of its tree with every other (``lcp(a, c) >= min(lcp(a, b),
lcp(b, c))``), which is the length a group reports.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import numpy.typing as npt

from radixmeta._impl import backend

__all__ = ["prefix_groups"]


def prefix_groups(
    keys: Sequence[npt.NDArray[np.uint32]],
    namespaces: Sequence[Hashable],
    tagged: Sequence[bool],
    page_size: int,
    ratio: float,
) -> list[tuple[list[int], int]]:
    """Group the requests of a batch that share a long prefix with each other.

    Two requests are linked when they share at least one page and at least
    ``ratio`` of the shorter one's whole pages (in the same namespace); a
    request with extra tags is a group of its own (its pages are not its
    tokens alone).

    Parameters
    ----------
    keys : sequence of uint32 arrays
        The requests' tokens, in batch order.
    namespaces : sequence of hashable
        Each request's namespace.
    tagged : sequence of bool
        Whether each request has extra tags.
    page_size : int
    ratio : float
        The share of the shorter prompt two requests must have in common.

    Returns
    -------
    list of (list of int, int)
        Per group, in order of its first member: the members' indices in
        batch order, and the tokens they all share (0 for a group of one).
    """
    count = len(keys)
    root = list(range(count))  # each request's group: the index of its first member
    shared_of = [0] * count  # per first member: the smallest link of its group
    parts: list[Sequence[int]]
    if namespaces.count(None) == count and True not in tagged:
        parts = [range(count)]  # the common batch: one namespace, no tags
    else:
        by_namespace: dict[Hashable, list[int]] = {}
        for i in range(count):
            if not tagged[i]:
                by_namespace.setdefault(namespaces[i], []).append(i)
        parts = list(by_namespace.values())
    for members in parts:
        if len(members) < 2:
            continue
        sub = keys if len(members) == count else [keys[i] for i in members]
        partner, shared = backend.prefix_partners(sub, page_size)
        whole = np.fromiter(map(len, sub), np.int64, len(sub))
        whole -= whole % page_size
        shorter = np.minimum(whole, whole[np.maximum(partner, 0)])
        linked = np.flatnonzero((partner >= 0) & (shared >= np.maximum(page_size, ratio * shorter)))
        # A partner is earlier than its request, so its group is known by then.
        for k, j, length in zip(
            linked.tolist(), partner[linked].tolist(), shared[linked].tolist(), strict=True
        ):
            first = root[members[j]]
            root[members[k]] = first
            known = shared_of[first]
            shared_of[first] = length if known == 0 or length < known else known
    groups: dict[int, list[int]] = {}
    for i, first in enumerate(root):
        if first == i:
            groups[i] = [i]
        else:
            groups[first].append(i)
    return [(members, shared_of[first]) for first, members in groups.items()]
