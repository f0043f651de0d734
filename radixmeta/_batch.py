"""Shared-prefix groups of a dispatch batch, for the Router's A.4 batch path.

The native trie (``prefix_partners`` of the active backend) gives, per request,
the first earlier request of the batch that shares the most whole pages with it
and how many. Linking each request to that partner when they share "a long
prefix" makes a forest whose trees are the groups: every member shares at least
the smallest link of its tree with every other (``lcp(a, c) >= min(lcp(a, b),
lcp(b, c))``), which is the length a group reports.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from radixmeta._impl import backend
from radixmeta.errors import InvalidInputError

__all__ = ["PrefixGroup", "PrefixGroups", "legacy_groups", "prefix_groups", "warn_legacy_groups"]

#: Per group: its members in batch order and the tokens they all share.
Run = tuple[list[int], int]

#: What the DeprecationWarning of :func:`warn_legacy_groups` says, after the method's name.
LEGACY_GROUPS_DEPRECATION = (
    " is handed the batch's groups as a list of PrefixGroup, whose partners, common and "
    "own attributes are deprecated and go in the next release. Set flat_groups = True on "
    "the policy to be handed the batch's PrefixGroups instead: the groups as plain "
    "(members, shared) pairs, read-only (list(groups) to reorder them), and each "
    "request's partner, share and own tokens as the lists groups.partner, groups.common "
    "and groups.own, by batch index."
)


class PrefixGroups(Sequence[Run]):
    """A batch's shared-prefix groups, and per request its link to the rest of the batch.

    A sequence of plain ``(members, shared)`` tuples, one per group in order of its
    first member: the members' batch indices in batch order and the tokens they all
    share (0 for a group of one). Every request of the batch is in exactly one group.
    This is what ``Router.dispatch_batch`` hands a policy's ``choose_batch`` as
    ``groups`` when the policy sets ``flat_groups = True`` (see
    :class:`~radixmeta.policies.base.BatchPolicy`). Read-only, as a view is.

    Attributes
    ----------
    runs : list of (list of int, int)
        The groups themselves (what indexing and iteration give).
    partner : list of int
        By batch index: the earlier request of the batch (in its namespace) that the
        request shares the most whole pages with, ``-1`` for none (the batch's first
        request, a request with extra tags). For every member of a group but the
        first, that partner is in its group (its link); the first member's, if any,
        shares too little to join it.
    common : list of int
        By batch index: the tokens the request shares with its partner (0 for none).
    own : list of int
        By batch index: the tokens the request shares with no earlier member of its
        group (for a group's first member: past the group's shared prefix), so
        ``shared + sum(own[k] for k in members)`` is what a whole group computes on
        one worker.

    Notes
    -----
    Nothing is made per group or per request: the runs and the three lists are the
    ones the native trie hands out (``prefix_group_runs``). Equal to a list or tuple
    of the same ``(members, shared)`` pairs.
    """

    __slots__ = ("common", "own", "partner", "runs")

    def __init__(
        self, runs: list[Run], partner: list[int], common: list[int], own: list[int]
    ) -> None:
        self.runs, self.partner, self.common, self.own = runs, partner, common, own

    def __len__(self) -> int:
        return len(self.runs)

    @overload
    def __getitem__(self, g: int) -> Run: ...
    @overload
    def __getitem__(self, g: slice) -> list[Run]: ...
    def __getitem__(self, g: int | slice) -> Run | list[Run]:
        return self.runs[g]

    def __iter__(self) -> Iterator[Run]:
        return iter(self.runs)

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


class PrefixGroup(tuple[list[int], int]):
    """Deprecated: one group of a batch with its members' links, as policies got it before.

    ``(members, shared)``, which is how it unpacks, with three per-member lists as
    attributes. ``Router.dispatch_batch`` hands a list of these to a ``choose_batch``
    whose policy does not set ``flat_groups = True``, for one release (with a
    :class:`DeprecationWarning`); then every policy gets :class:`PrefixGroups`,
    whose flat lists by batch index say the same: ``partners[j]`` is
    ``groups.partner[members[j]]``, and so for ``common`` and ``own``. Making one
    yourself warns too.

    Attributes
    ----------
    partners : list of int
        Per member, its partner's batch index (``PrefixGroups.partner``), -1 for none.
    common : list of int
        Per member, the tokens it shares with that partner (``PrefixGroups.common``).
    own : list of int
        Per member, its tokens shared with no earlier member (``PrefixGroups.own``).

    Raises
    ------
    InvalidInputError
        The three lists are not one entry per member, or a member is not a batch
        index (an int >= 0).
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
        if not len(members) == len(partners) == len(common) == len(own):
            msg = "a group needs one partner, share and own count per member"
            raise InvalidInputError(msg)
        for k in members:
            if isinstance(k, bool) or not isinstance(k, int) or k < 0:
                msg = f"a group's members are batch indices (ints >= 0), got {k!r}"
                raise InvalidInputError(msg)
        warnings.warn(
            "PrefixGroup is deprecated and goes in the next release: a batch's groups are "
            "plain (members, shared) pairs and its links the flat lists of PrefixGroups",
            DeprecationWarning,
            stacklevel=2,
        )
        return _group(members, shared, partners, common, own)

    def __reduce__(self) -> tuple[Callable[..., PrefixGroup], tuple[Any, ...]]:
        # What copy and pickle rebuild (tuple's own reduction would call __new__ with
        # the pair alone), without the constructor's warning.
        return (_group, (self[0], self[1], self.partners, self.common, self.own))


def _group(
    members: list[int], shared: int, partners: list[int], common: list[int], own: list[int]
) -> PrefixGroup:
    """A PrefixGroup of checked parts (no warning: the router's and copy's)."""
    group = tuple.__new__(PrefixGroup, (members, shared))
    group.partners, group.common, group.own = partners, common, own
    return group


def legacy_groups(groups: PrefixGroups) -> list[PrefixGroup]:
    """The batch's groups as a list of the deprecated :class:`PrefixGroup` (a list of
    the policy's own, which it may reorder, as before). O(requests)."""
    partner, common, own = groups.partner, groups.common, groups.own
    return [
        _group(
            members,
            shared,
            [partner[k] for k in members],
            [common[k] for k in members],
            [own[k] for k in members],
        )
        for members, shared in groups.runs
    ]


#: The "once per location" registry of warn_legacy_groups (the filters' own rules apply).
_LEGACY_WARNED: dict[Any, Any] = {}


def warn_legacy_groups(choose_batch: Callable[..., Any]) -> None:
    """Warn (:class:`DeprecationWarning`) that ``choose_batch`` is handed
    :func:`legacy_groups`, from its own definition: so once per policy class under
    the default filters, and named where the code to change is."""
    name = getattr(choose_batch, "__qualname__", type(choose_batch).__qualname__)
    module = getattr(choose_batch, "__module__", None) or "<unknown>"
    code = getattr(choose_batch, "__code__", None)
    filename, line = (code.co_filename, code.co_firstlineno) if code is not None else (module, 0)
    warnings.warn_explicit(
        f"{name}{LEGACY_GROUPS_DEPRECATION}",
        DeprecationWarning,
        filename,
        line,
        module=module,
        registry=_LEGACY_WARNED,
    )


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
