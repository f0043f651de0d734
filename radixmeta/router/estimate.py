"""The router's estimate of what a worker will still hold when a request runs there.

A match says what a worker holds now; the requests queued ahead of a new one
write their prompts into the same pool first. The rule is
:func:`radixmeta.policies.expected.expected_lengths`; what the router adds is
which prefixes are *protected*: a prefix that a request in flight on the worker
also starts with is locked by that request while it runs, and recent after it.

The router can tell two ways. The tree's holds cover each in-flight request's
key from the root, so a match that is longer with the holds than with what the
worker reported (``match(optimistic=False)``) ends in a prefix some in-flight
request holds whole. A prefix that is both reported and held (a group's shared
system prompt) looks the same either way, so the router also counts, per worker,
the prefixes each in-flight request starts with that later requests match
whole: its own prompt (the next turn of a conversation that resends it) and the
prefix it was matched with at dispatch (a sibling of a prefix group)
(:class:`InFlightPrefixes`).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from radixmeta.policies.expected import expected_lengths

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from radixmeta._workers import WorkerId
    from radixmeta.meta import MetaTree
    from radixmeta.policies.base import View
    from radixmeta.router.decision import Decision

__all__ = ["Estimate", "InFlightPrefixes"]

Key = tuple[int, Hashable, int, bytes]


class InFlightPrefixes:
    """Counts of the prefixes that in-flight requests start with, per worker.

    A key is ``(worker index, namespace, length, the tokens of its last page)``:
    two prefixes of one length that end in the same page share a key, as
    ``MetaMatch.prefix_key`` does; for an estimate that rare collision only keeps
    a prefix. O(page) per key, O(1) per count.
    """

    __slots__ = ("_counts", "page_size")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._counts: dict[Key, int] = {}

    def key(
        self, index: int, tokens: npt.NDArray[np.uint32], length: int, namespace: Hashable
    ) -> Key | None:
        """The key of ``tokens[:length]`` (whole pages) on worker ``index``; None if empty."""
        length -= length % self.page_size
        if length <= 0:
            return None
        return (index, namespace, length, tokens[length - self.page_size : length].tobytes())

    def enter(self, keys: tuple[Key | None, ...]) -> None:
        """A request with these keys is in flight."""
        counts = self._counts
        for key in keys:
            if key is not None:
                counts[key] = counts.get(key, 0) + 1

    def leave(self, keys: tuple[Key | None, ...]) -> None:
        """It is not any more (finished, expired, or its worker removed)."""
        counts = self._counts
        for key in keys:
            if key is not None:
                left = counts[key] - 1
                if left:
                    counts[key] = left
                else:
                    del counts[key]

    def __contains__(self, key: object) -> bool:
        return key in self._counts

    def __len__(self) -> int:
        return len(self._counts)


class Estimate:
    """``View.expected`` for the router's views, and the in-flight prefixes it needs.

    Parameters
    ----------
    tree : MetaTree
        The router's tree (its reported-only matches tell held prefixes).
    exact : bool
        Exact mode: the tree has holds. In approximate mode only the counts tell.
    """

    __slots__ = ("exact", "inflight", "page_size", "tree")

    def __init__(self, tree: MetaTree, exact: bool) -> None:
        self.tree = tree
        self.exact = exact
        self.page_size = tree.page_size
        self.inflight = InFlightPrefixes(tree.page_size)

    def protection(
        self,
        key: npt.NDArray[np.uint32],
        namespace: Hashable,
        extras: object,
        lengths: list[int],
        up: tuple[WorkerId, ...],
    ) -> Callable[[int], bool]:
        """``protected(p)``: whether a request in flight on the ``p``-th worker of ``up``
        starts with the ``lengths[p]`` tokens of ``key`` matched there (module
        docstring). The reported-only match is made at most once, and only when a
        prefix would be cut (the rule asks only then)."""
        inflight, tree, exact = self.inflight, self.tree, self.exact
        reported: list[list[int]] = []

        def protected(p: int) -> bool:
            index = up[p].index
            if exact:
                if not reported:
                    if extras is None and namespace is None:
                        m = tree.match(key, optimistic=False)
                    else:
                        m = tree.match(key, extras=extras, namespace=namespace, optimistic=False)
                    reported.append(m.length_list)
                if reported[0][index] < lengths[p]:
                    return True
            return inflight.key(index, key, lengths[p], namespace) in inflight

        return protected

    def expected(self, view: View, key: Any, namespace: Hashable, extras: object) -> list[int]:
        """A view's expected lengths: its lengths less what its queues are expected to
        evict first. O(workers), plus one match when a prefix would be cut."""
        lengths = view.lengths
        protected = self.protection(key, namespace, extras, lengths, view.workers)
        return expected_lengths(
            lengths, view.capacities, view.prefill_tokens, self.page_size, protected
        )

    def enter(self, decision: Decision, raw: int) -> None:
        """Count a committed request's prefixes in flight on its worker: its whole prompt,
        and the ``raw`` tokens it matched there."""
        request = decision._request
        tokens, namespace, i = request.tokens, request.namespace, decision.worker.index
        inflight = self.inflight
        keys = (
            inflight.key(i, tokens, len(tokens), namespace),
            inflight.key(i, tokens, raw, namespace),
        )
        inflight.enter(keys)
        decision._keys = keys

    def leave(self, decision: Decision) -> None:
        """A request is no longer in flight."""
        keys = decision._keys
        if keys:
            self.inflight.leave(keys)
            decision._keys = ()
