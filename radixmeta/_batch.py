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
    shared_of = [0] * count  # per first member: the tokens its group shares
    if namespaces.count(None) == count and True not in tagged:
        if count < 2:
            return [([i], 0) for i in range(count)]
        first, shared = backend.prefix_groups(keys, page_size, ratio)  # the common batch
        root, shared_of = first.tolist(), shared.tolist()
    else:
        by_namespace: dict[Hashable, list[int]] = {}
        for i in range(count):
            if not tagged[i]:
                by_namespace.setdefault(namespaces[i], []).append(i)
        for members in by_namespace.values():
            if len(members) < 2:
                continue
            first, shared = backend.prefix_groups([keys[i] for i in members], page_size, ratio)
            for k, (f, length) in enumerate(zip(first.tolist(), shared.tolist(), strict=True)):
                root[members[k]] = members[f]
                shared_of[members[k]] = length
    groups: dict[int, list[int]] = {}
    for i, f in enumerate(root):
        if f == i:
            groups[i] = [i]
        else:
            groups[f].append(i)
    return [(members, shared_of[f]) for f, members in groups.items()]
