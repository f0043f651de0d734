"""Shared-prefix groups of a dispatch batch, for the Router's A.4 batch path.

The native trie (``prefix_partners`` of the active backend) gives, per request,
the first earlier request of the batch that shares the most whole pages with it
and how many. Linking each request to that partner when they share "a long
prefix" makes a forest whose trees are the groups: every member shares at least
the smallest link of its tree with every other (``lcp(a, c) >= min(lcp(a, b),
lcp(b, c))``), which is the length a group reports.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np
import numpy.typing as npt

from radixmeta._impl import backend

__all__ = ["PrefixGroup", "prefix_groups"]


class PrefixGroup(tuple[list[int], int]):
    """One group of a batch: ``(members, shared)``, which is how it unpacks, and more.

    Attributes
    ----------
    partners : list of int
        Per member, the batch index of the earlier request of the batch (in its
        namespace) it shares the most whole pages with, ``-1`` for none. For every
        member but the first that is a member of the group (its link); the
        first member's, if any, shares too little to join it.
    common : list of int
        Per member, the tokens it shares with that partner (0 for none).
    own : list of int
        Per member, the tokens it does not share with an earlier member of its
        group (for the first member: past the group's shared prefix), so
        ``shared + sum(own)`` is what the whole group computes on one worker.
    """

    partners: list[int]
    common: list[int]
    own: list[int]

    def __new__(
        cls,
        members: list[int],
        shared: int,
        partners: list[int],
        common: list[int],
        own: list[int],
    ) -> PrefixGroup:
        group = super().__new__(cls, (members, shared))
        group.partners, group.common, group.own = partners, common, own
        return group

    def __getnewargs__(self) -> tuple[list[int], int, list[int], list[int], list[int]]:
        # What copy and pickle pass back to __new__ (a tuple's own would be one argument).
        return (self[0], self[1], self.partners, self.common, self.own)


def prefix_groups(
    keys: Sequence[npt.NDArray[np.uint32]],
    namespaces: Sequence[Hashable] | None,
    tagged: Sequence[bool] | None,
    page_size: int,
    ratio: float,
) -> list[PrefixGroup]:
    """Group the requests of a batch that share a long prefix with each other.

    Two requests are linked when they share at least one page and at least
    ``ratio`` of the shorter one's whole pages (in the same namespace); a
    request with extra tags is a group of its own (its pages are not its
    tokens alone).

    Parameters
    ----------
    keys : sequence of uint32 arrays
        The requests' tokens, in batch order.
    namespaces : sequence of hashable, or None
        Each request's namespace; None when no request has one.
    tagged : sequence of bool, or None
        Whether each request has extra tags; None when none has.
    page_size : int
    ratio : float
        The share of the shorter prompt two requests must have in common.

    Returns
    -------
    list of PrefixGroup
        Per group, in order of its first member: the members' indices in
        batch order, and the tokens they all share (0 for a group of one),
        with each member's partner, share and own tokens.

    Complexity: O(total tokens) in the native trie, then O(requests).
    """
    count = len(keys)
    if namespaces is not None and namespaces.count(None) == count:
        namespaces = None
    if tagged is not None and True not in tagged:
        tagged = None
    if namespaces is None and tagged is None:
        if count < 2:
            return [_group([i], 0, [-1], [0], [len(keys[i])]) for i in range(count)]
        # The common case: the groups come out of the native trie as lists.
        runs = backend.prefix_group_runs(keys, page_size, ratio)
        return [_group(m, shared, p, c, own) for m, shared, p, c, own in runs]
    root, shared_of, partner, common = _links_by_namespace(
        keys, namespaces, tagged, page_size, ratio
    )
    groups: dict[int, list[int]] = {}
    for i, f in enumerate(root):
        if f == i:
            groups[i] = [i]
        else:
            groups[f].append(i)
    out = []
    for f, members in groups.items():
        if len(members) == 1:  # most groups of a batch without sharing: no loops
            out.append(_group(members, 0, [partner[f]], [common[f]], [len(keys[f])]))
            continue
        # A later member's best earlier partner is in its group (that is its link).
        shares = [common[i] for i in members]
        own = [len(keys[i]) - c for i, c in zip(members, shares, strict=True)]
        own[0] = len(keys[f]) - shared_of[f]
        out.append(_group(members, shared_of[f], [partner[i] for i in members], shares, own))
    return out


def _group(
    members: list[int], shared: int, partners: list[int], common: list[int], own: list[int]
) -> PrefixGroup:
    """A PrefixGroup without its ``__new__``'s Python call (a batch makes one per group)."""
    group = _new_tuple(PrefixGroup, (members, shared))
    group.partners, group.common, group.own = partners, common, own
    return group


_new_tuple: Callable[[type[PrefixGroup], tuple[list[int], int]], PrefixGroup] = tuple.__new__


def _links_by_namespace(
    keys: Sequence[npt.NDArray[np.uint32]],
    namespaces: Sequence[Hashable] | None,
    tagged: Sequence[bool] | None,
    page_size: int,
    ratio: float,
) -> tuple[list[int], list[int], list[int], list[int]]:
    """``prefix_links`` per namespace, leaving requests with extra tags on their own."""
    count = len(keys)
    root = list(range(count))  # each request's group: the index of its first member
    shared_of = [0] * count  # per first member: the tokens its group shares
    partner = [-1] * count  # per request: the earlier request it shares the most with
    common = [0] * count  # and how many tokens
    by_namespace: dict[Hashable, list[int]] = {}
    for i in range(count):
        if tagged is None or not tagged[i]:
            ns = None if namespaces is None else namespaces[i]
            by_namespace.setdefault(ns, []).append(i)
    for members in by_namespace.values():
        if len(members) < 2:
            continue
        subset = [keys[i] for i in members]
        first, shared, found, lengths = backend.prefix_links(subset, page_size, ratio)
        for k, (f, length, j, c) in enumerate(
            zip(first.tolist(), shared.tolist(), found.tolist(), lengths.tolist(), strict=True)
        ):
            i = members[k]
            root[i] = members[f]
            shared_of[i] = length
            partner[i] = members[j] if j >= 0 else -1
            common[i] = c
    return root, shared_of, partner, common
