"""Shared-prefix groups of a dispatch batch, for the Router's A.4 batch path.

The native trie (``prefix_partners`` of the active backend) gives, per request,
the first earlier request of the batch that shares the most whole pages with it
and how many. Linking each request to that partner when they share "a long
prefix" makes a forest whose trees are the groups: every member shares at least
the smallest link of its tree with every other (``lcp(a, c) >= min(lcp(a, b),
lcp(b, c))``), which is the length a group reports.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Sequence
from itertools import repeat
from typing import Any, ClassVar, overload

import numpy as np
import numpy.typing as npt

from radixmeta._impl import backend
from radixmeta.errors import InvalidInputError

__all__ = ["PrefixGroup", "PrefixGroups", "prefix_groups"]

#: Per group: its members in batch order and the tokens they all share.
Run = tuple[list[int], int]


class PrefixGroup(tuple[list[int], int]):
    """One group of a batch: ``(members, shared)``, which is how it unpacks, and more.

    The per-member attributes are read, when asked, from the batch's flat lists
    (:class:`PrefixGroups`): a group is a bare tuple (no instance dict; its batch
    is a class attribute of the batch's own subclass, see :class:`PrefixGroups`),
    so a batch of 100,000 groups of one makes 100,000 tuples and nothing more.

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

    __slots__ = ()
    _of: ClassVar[_Flat]  # set on each batch's subclass

    def __new__(
        cls,
        members: list[int],
        shared: int,
        partners: list[int],
        common: list[int],
        own: list[int],
    ) -> PrefixGroup:
        # A group on its own: flat lists as long as its largest member needs.
        if not len(members) == len(partners) == len(common) == len(own):
            msg = "a group needs one partner, share and own count per member"
            raise InvalidInputError(msg)
        for k in members:  # batch indices: they index the flat lists below
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                msg = f"a group's members are batch indices (ints >= 0), got {k!r}"
                raise InvalidInputError(msg)
        size = max(members, default=-1) + 1
        partner, shares, owns = [-1] * size, [0] * size, [0] * size
        for k, p, c, o in zip(members, partners, common, own, strict=True):
            partner[k], shares[k], owns[k] = p, c, o
        return PrefixGroups([(members, shared)], partner, shares, owns)[0]

    def __reduce__(self) -> tuple[type[PrefixGroup], tuple[Any, ...]]:
        # What copy and pickle rebuild (a batch's subclass is not importable).
        return (PrefixGroup, (self[0], self[1], self.partners, self.common, self.own))

    @property
    def partners(self) -> list[int]:
        """Per member, its partner's batch index (-1 for none)."""
        partner = self._of.partner
        return [partner[k] for k in self[0]]

    @property
    def common(self) -> list[int]:
        """Per member, the tokens it shares with its partner."""
        common = self._of.common
        return [common[k] for k in self[0]]

    @property
    def own(self) -> list[int]:
        """Per member, the tokens it does not share with an earlier member of the group."""
        own = self._of.own
        return [own[k] for k in self[0]]


class _Flat:
    """A batch's flat per-request lists, as its groups' class holds them.

    Not the PrefixGroups itself: a class is in a reference cycle (its own ``__mro__``),
    so whatever it holds lives until the cyclic collector runs; holding the batch's
    groups there kept their runs (two objects per group) alive for the collector to
    walk and free after every large batch, where plain reference counting frees them
    as soon as the batch is done.
    """

    __slots__ = ("common", "own", "partner")

    def __init__(self, partner: list[int], common: list[int], own: list[int]) -> None:
        self.partner, self.common, self.own = partner, common, own


class PrefixGroups(Sequence[PrefixGroup]):
    """A batch's groups (a sequence of :class:`PrefixGroup`, in order of their first
    member), over flat per-request lists that the batch path reads in one pass.

    Attributes
    ----------
    runs : list of (list of int, int)
        Per group, its members and shared tokens (what each PrefixGroup holds).
    partner, common, own : list of int
        By batch index: each request's partner (-1 for none), the tokens it shares
        with it, and its own tokens (see :class:`PrefixGroup`).

    Notes
    -----
    Groups are made when read: O(1) each (a tuple, made in C when the groups are
    iterated), O(members) for one of a group's per-member attributes. They are
    instances of a subclass of PrefixGroup made for this batch, the first time
    its groups are read, whose class attribute names the batch: a tuple subclass
    can have no slots but empty ones, and an instance dict per group was most of a large batch's
    group cost (0.07 of 0.1 s for 100,000 groups of one).
    """

    __slots__ = ("_type", "common", "own", "partner", "runs")

    def __init__(
        self, runs: list[Run], partner: list[int], common: list[int], own: list[int]
    ) -> None:
        self.runs, self.partner, self.common, self.own = runs, partner, common, own
        self._type: type[PrefixGroup] | None = None

    def _group_type(self) -> type[PrefixGroup]:
        """This batch's PrefixGroup subclass (made once: a class costs ~10 us)."""
        kind = self._type
        if kind is None:
            flat = _Flat(self.partner, self.common, self.own)
            attrs = {"__slots__": (), "_of": flat, "__module__": __name__,
                     "__qualname__": PrefixGroup.__qualname__}
            kind = self._type = type(PrefixGroup.__name__, (PrefixGroup,), attrs)
        return kind

    def __len__(self) -> int:
        return len(self.runs)

    @overload
    def __getitem__(self, g: int) -> PrefixGroup: ...
    @overload
    def __getitem__(self, g: slice) -> list[PrefixGroup]: ...
    def __getitem__(self, g: int | slice) -> PrefixGroup | list[PrefixGroup]:
        if isinstance(g, slice):
            return list(map(_new_tuple, repeat(self._group_type()), self.runs[g]))
        return _new_tuple(self._group_type(), self.runs[g])

    def __iter__(self) -> Iterator[PrefixGroup]:
        return map(_new_tuple, repeat(self._group_type()), self.runs)

    def __eq__(self, other: object) -> bool:
        # Equal to a list or tuple of the same (members, shared) pairs, as the list
        # of groups it replaces was.
        if isinstance(other, PrefixGroups):
            return self.runs == other.runs
        if isinstance(other, (list, tuple)):
            return len(other) == len(self.runs) and all(
                run == group for run, group in zip(self.runs, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # as a list's: it is compared by value

    def __repr__(self) -> str:
        return f"PrefixGroups({self.runs!r})"


#: tuple.__new__, called by map in C: a group without a Python call of its own.
_new_tuple: Callable[[type[PrefixGroup], Run], PrefixGroup] = tuple.__new__


def prefix_groups(
    keys: Sequence[npt.NDArray[np.uint32]],
    namespaces: Sequence[Hashable] | None,
    tagged: Sequence[bool] | None,
    page_size: int,
    ratio: float,
) -> PrefixGroups:
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
    PrefixGroups
        Per group, in order of its first member: the members' indices in
        batch order, and the tokens they all share (0 for a group of one),
        with each member's partner, share and own tokens (also as flat lists
        by batch index).

    Complexity: O(total tokens) in the native trie, then O(requests).
    """
    count = len(keys)
    if namespaces is not None and namespaces.count(None) == count:
        namespaces = None
    if tagged is not None and True not in tagged:
        tagged = None
    if namespaces is None and tagged is None:
        # The common case: the runs and the flat lists come out of the native trie.
        return PrefixGroups(*backend.prefix_group_runs(keys, page_size, ratio))
    root, shared_of, partner, common = _links_by_namespace(
        keys, namespaces, tagged, page_size, ratio
    )
    runs: dict[int, list[int]] = {}
    for i, f in enumerate(root):
        if f == i:
            runs[i] = [i]
        else:
            runs[f].append(i)
    # A later member's best earlier partner is in its group (that is its link).
    own = [
        len(keys[i]) - (shared_of[i] if f == i else c)
        for i, (f, c) in enumerate(zip(root, common, strict=True))
    ]
    return PrefixGroups(
        [(members, shared_of[f]) for f, members in runs.items()], partner, common, own
    )


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
