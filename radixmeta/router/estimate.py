"""The router's estimate of what a worker will still hold when a request runs there.

A match says what a worker holds now; the requests queued ahead of a new one
write their prompts into the same pool first. The rule is
:func:`radixmeta.policies.expected.expected_lengths`; what the router adds is
which prefixes are *protected*: a prefix that a request in flight on the worker
also starts with is locked by that request while it runs, and recent after it.

The router tells which by a tree of its own (:class:`InFlight`): a
:class:`~radixmeta.MetaTree` that holds, for each request in flight, its prompt
on its worker, from its dispatch to its end, and nothing else. A prefix is
protected on a worker exactly when that tree's match gives the worker at least
its length. It is asked at most once a dispatch (one match gives every worker),
and only when some prefix would be cut, the only time the rule asks.

Only in exact mode. There the tree is the workers' caches as their events
report them, so the prompts queued ahead are not written yet and the rule cuts
what their writes will evict. In approximate mode the tree is the router's own
model: a request's prompt is written there at its dispatch, and the worker's
capacity trims it at once, so a later request's match already shows what the
writes queued ahead evict (a replica serves its queue in order, and writes in
that order too). Cutting it again counted each write twice: at 8 stand-in
replicas under eviction the estimate expected 58 % where the model, and the
replicas, held 68 % (``bench/ray_standin_drift.py``). The estimate of an
approximate router is its match (``modelled``), and it holds nothing in flight.

This replaced two partial tests: the router's own tree's holds (exact mode
only, and blind to a prefix both reported and held) and counts of two prefixes
per request (its whole prompt and its match at dispatch). In approximate mode
only the counts told, so a prefix that an in-flight request was writing, and
that a later request matched only part of (a sibling's question, the start of
a long turn), was not protected: the estimate cut what was about to be cached
and hot, and the policy sent its followers elsewhere (the Ray bench's
eviction cell at 8 replicas).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from radixmeta.meta import MetaTree
from radixmeta.policies.expected import expected_lengths

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from radixmeta._workers import WorkerId
    from radixmeta.policies.base import View
    from radixmeta.router.decision import Decision

__all__ = ["Estimate", "InFlight"]


class InFlight:
    """The prompts of the requests in flight, per worker: a tree of holds.

    One shadow worker per router worker (by index and generation, made on a
    worker's first request; a reused index with a new generation replaces it).
    ``enter`` holds a prompt for its worker (O(pages + nodes on the path)),
    ``leave`` releases it (O(nodes on the path)), ``lengths`` matches a key
    (O(nodes on the path x workers / 64)). The tree holds only what is in flight,
    so it stays as small as the requests in flight.

    Parameters
    ----------
    page_size : int
        The router's page size.
    """

    __slots__ = ("_shadow", "tree")

    def __init__(self, page_size: int) -> None:
        self.tree = MetaTree(page_size)
        # Router worker index -> (its generation, its worker in self.tree).
        self._shadow: dict[int, tuple[int, WorkerId]] = {}

    def _worker(self, worker: WorkerId) -> WorkerId:
        shadow = self._shadow.get(worker.index)
        if shadow is not None:
            if shadow[0] == worker.generation:
                return shadow[1]
            self.tree.remove_worker(shadow[1])  # the index was reused: its holds are gone
        made = self.tree.add_worker(f"{worker.index}.{worker.generation}")
        self._shadow[worker.index] = (worker.generation, made)
        return made

    def enter(
        self, worker: WorkerId, tokens: npt.NDArray[np.uint32], namespace: Hashable, extras: object
    ) -> int:
        """Hold ``tokens`` for ``worker`` while its request is in flight; the hold's id."""
        shadow = self._worker(worker)
        if extras is None and namespace is None:
            return self.tree.hold(tokens, shadow)
        return self.tree.hold(tokens, shadow, extras=extras, namespace=namespace)

    def leave(self, hold: int) -> None:
        """The request of ``hold`` ended."""
        self.tree.release(hold)

    def lengths(
        self, key: npt.NDArray[np.uint32], namespace: Hashable, extras: object
    ) -> Callable[[WorkerId], int]:
        """``length(worker)``: the longest prefix of ``key`` that a request in flight on
        ``worker`` starts with (0 for a worker with none)."""
        tree = self.tree
        if extras is None and namespace is None:
            every = tree.match(key).length_list
        else:
            every = tree.match(key, extras=extras, namespace=namespace).length_list
        shadow = self._shadow

        def length(worker: WorkerId) -> int:
            entry = shadow.get(worker.index)
            if entry is None or entry[0] != worker.generation:
                return 0
            return every[entry[1].index]

        return length

    def __len__(self) -> int:
        """Requests in flight held here."""
        return self.tree.hold_count


class Estimate:
    """``View.expected`` for the router's views, and the in-flight prompts it needs.

    Parameters
    ----------
    page_size : int
        The router's page size.
    modelled : bool, default False
        The router's tree is its own model of the caches (approximate mode): it
        holds each prompt from its dispatch, trimmed by the capacity, so the
        expected lengths are the match itself (module docstring), and no prompt
        in flight is held.
    """

    __slots__ = ("inflight", "modelled", "page_size")

    def __init__(self, page_size: int, *, modelled: bool = False) -> None:
        self.page_size = page_size
        self.modelled = modelled
        self.inflight = InFlight(page_size)

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
        docstring). The in-flight match is made at most once, and only when a prefix
        would be cut (the rule asks only then)."""
        inflight = self.inflight
        found: list[Callable[[WorkerId], int]] = []

        def protected(p: int) -> bool:
            if not found:
                found.append(inflight.lengths(key, namespace, extras))
            return found[0](up[p]) >= lengths[p]

        return protected

    def expected(self, view: View, key: Any, namespace: Hashable, extras: object) -> list[int]:
        """A view's expected lengths: its lengths less what its queues are expected to
        evict first (the lengths themselves when ``modelled``). O(workers), plus one
        match when a prefix would be cut."""
        lengths = view.lengths
        if self.modelled:
            return lengths
        protected = self.protection(key, namespace, extras, lengths, view.workers)
        return expected_lengths(
            lengths, view.capacities, view.prefill_tokens, self.page_size, protected
        )

    def enter(self, decision: Decision) -> None:
        """Hold a committed request's prompt on its worker until it ends (the prompt
        covers every prefix of it that a later request may match); nothing when
        ``modelled``."""
        if self.modelled:
            return
        request = decision._request
        decision._inflight = self.inflight.enter(
            decision.worker, request.tokens, request.namespace, request.extras
        )

    def leave(self, decision: Decision) -> None:
        """A request is no longer in flight."""
        hold = decision._inflight
        if hold is not None:
            self.inflight.leave(hold)
            decision._inflight = None
