"""The contract between the :class:`~radixmeta.Router` and its affinity policies.

The router matches a request against its MetaTree, builds a read-only
:class:`View` of the live workers (match lengths, loads, capacities, what the
engines report), and asks the policy to ``choose`` one. The policy never sees
the tree, so any policy can be tested with a hand-built view, and the router
applies whatever it decides (optimistic insert, load accounting).

Everything in a view is aligned by position: ``view.workers[i]`` has
``view.lengths[i]``, ``view.requests[i]`` and so on. The arrays are plain
Python lists because a view is built per request and read a few times: for
8 workers a list is cheaper to build and to index than a numpy array.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

from radixmeta._batch import PrefixGroups

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    from radixmeta._workers import WorkerId

__all__ = [
    "Choice",
    "EngineLoad",
    "Policy",
    "BatchPolicy",
    "PrefixGroups",
    "Request",
    "View",
    "extra_requests",
    "worker_of",
]


# Request and View are made per dispatch, so they are slotted but not frozen: a
# frozen dataclass's __init__ sets each field through object.__setattr__, which
# tripled their cost. Treat both as read-only (neither was hashable anyway: a
# Request holds an array, a View lists).
@dataclass(slots=True)
class Request:
    """One request as the router dispatches it (read-only by convention).

    Attributes
    ----------
    request_id : str
        Unique among the requests in flight (the router generates one when the
        caller gives none).
    tokens : numpy.ndarray of uint32
        The prompt, converted by the router's input rule.
    namespace : hashable or None
        The page namespace (LoRA adapter, cache salt), as ``MetaTree`` takes it.
    extras : object
        Per-page extra tags (multimodal identity), as ``MetaTree.match`` takes them.
    group : hashable or None
        A caller's grouping hint (a session, a tenant); policies may ignore it.
    expected_output : int or None
        Expected output tokens, when the caller knows them (decode load).

    Notes
    -----
    Equality is identity: comparing token arrays element-wise is never what ``==``
    on two requests should silently do.
    """

    request_id: str
    tokens: npt.NDArray[np.uint32]
    namespace: Hashable = None
    extras: object = None
    group: Hashable = None
    expected_output: int | None = None


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine reported about itself through ``Router.report_load``.

    The first three fields are the engine's; the router adds the last two when
    the report arrives, so that a policy can tell how the report stands against
    the router's own counts: the router's count is exact for its own requests and
    current, the report also sees requests the router does not (another router's,
    those the router believes finished) but only as of ``at``. What the engine
    reported beyond ``router_requests`` is load the router's counts miss
    (:func:`~radixmeta.policies.base.extra_requests`).

    Attributes
    ----------
    queue_length : int or None
        Requests waiting in the engine's queue.
    kv_usage : float or None
        Fraction of the engine's KV cache in use, in ``[0, 1]``.
    running : int or None
        Requests in the engine's running batch.
    at : float or None
        The router's clock when the report arrived (``None``: not through a router).
    router_requests : int or None
        The router's own count of the worker's requests in flight at that moment.
    """

    queue_length: int | None = None
    kv_usage: float | None = None
    running: int | None = None
    at: float | None = None
    router_requests: int | None = None


def extra_requests(reported: EngineLoad | None) -> int:
    """Requests the engine reported beyond the router's own at that moment (``>= 0``).

    ``queue_length + running - router_requests`` (an unknown field counts 0),
    floored at 0: a report taken before the router's latest requests reached the
    engine says less than the router knows, and the router's count stands.
    A policy adds this to the router's current count: the freshest estimate of the
    worker's requests is the router's own, plus what only the engine could see.
    """
    if reported is None:
        return 0
    engine = (reported.queue_length or 0) + (reported.running or 0)
    extra = engine - (reported.router_requests or 0)
    return extra if extra > 0 else 0


@dataclass(slots=True)
class View:
    """The live, up workers and everything a policy may read about them, aligned.

    Read-only: the router builds one per request (per request of a batch), and a
    policy must not change it or its lists.

    Attributes
    ----------
    workers : tuple of WorkerId
        The workers a policy may choose from (never a down worker; never empty).
    lengths : list of int
        Per worker, tokens of the request's prefix held on the device (tier 0),
        from the event-fed tree and the router's optimistic marks.
    host_lengths : list of int
        Per worker, the longest prefix held on the device or the host.
    requests : list of int
        Per worker, requests dispatched and not finished.
    prefill_tokens : list of int
        Per worker, uncached prompt tokens of requests not yet past prefill.
    decode_tokens : list of int
        Per worker, tokens of requests in decode (prompt plus expected output).
    capacities : list of int or None
        Per worker, its KV capacity in tokens when known.
    reported : list of EngineLoad or None
        Per worker, its latest ``report_load``, if any.
    page_size : int
        The tree's page size; every length is a multiple of it.
    prefix_key : int or None
        A stable key of the request's longest matched prefix over all workers
        (the same prefix gives the same key), ``None`` when nothing matched.
        Stateful policies key their own state by it.
    expected : list of int or None
        Per worker, the part of ``lengths`` the router expects to be still cached
        when the request runs there: what the requests queued ahead will not have
        evicted first (:func:`radixmeta.policies.expected.expected_lengths`);
        ``None`` when the router estimates no eviction (no worker has a known
        capacity), the same list as ``lengths`` when nothing is cut.
    """

    workers: tuple[WorkerId, ...]
    lengths: list[int]
    host_lengths: list[int]
    requests: list[int]
    prefill_tokens: list[int]
    decode_tokens: list[int]
    capacities: list[int | None]
    reported: list[EngineLoad | None]
    page_size: int
    prefix_key: int | None = None
    expected: list[int] | None = None


class Choice(NamedTuple):
    """A decision with its explanation; ``choose`` may return this instead of a worker.

    Attributes
    ----------
    worker : WorkerId
        One of the view's workers.
    reason : str
        A short, stable label (``"affinity"``, ``"balance"``, ``"explore"``), counted
        by ``Router.metrics()``.
    detail : tuple of (str, float)
        The numbers the rule used, formatted only when a decision is read.
    """

    worker: WorkerId
    reason: str
    detail: tuple[tuple[str, float], ...] = ()


def worker_of(choice: WorkerId | Choice) -> WorkerId:
    """The worker of what ``choose`` returned."""
    return choice.worker if isinstance(choice, Choice) else choice


@runtime_checkable
class Policy(Protocol):
    """An affinity policy: ``choose(request, view)`` returns one of ``view.workers``.

    Optional hooks, called by the router when a policy defines them:

    - ``on_dispatch(request, worker, matched)`` once the decision is taken, just
      before the router applies it: if it raises, the router applies nothing (the
      dispatch changes nothing; a batch's requests already told are told
      ``on_finish``);
    - ``on_finish(request, worker)`` when the request finishes, expires or is
      dropped with its worker, just before the router releases it: if it raises,
      ``finish`` keeps the request in flight, while ``expire`` and
      ``remove_worker`` release it all the same and then raise
      :class:`~radixmeta.errors.HookError`;
    - ``rank(request, view) -> list[WorkerId]``: every worker of ``view``, best
      first by the policy's own scores, the first being what ``choose`` would pick
      for the same view in the policy's current state; it must not change that
      state (a policy that draws at random draws from a copy of its generator).
      ``Router.dispatch(..., ranked=True)`` calls it just before ``choose`` and
      keeps the order as ``Decision.ranking``, the chosen worker first (the
      fallbacks a caller tries when that worker turns the request away). Without
      it, the router ranks the others by the tokens of the prompt they hold, then
      by their requests in flight. Every built-in policy has one.
    """

    def choose(self, request: Request, view: View) -> WorkerId | Choice:
        """Pick one of ``view.workers`` for ``request``."""
        ...


@runtime_checkable
class BatchPolicy(Policy, Protocol):
    """A policy that decides a whole batch at once (the A.4 batch path).

    ``views[i]`` is request ``i``'s view before any decision of the batch;
    ``groups`` lists, per shared-prefix group the router found, the indices of its
    requests (every index in exactly one group) and the length they share: each
    group unpacks as ``(members, shared)``. The result is one worker (or choice) per
    request, in input order.

    A policy that sets ``flat_groups = True`` (a class attribute; every built-in
    does) is handed the router's :class:`~radixmeta._batch.PrefixGroups` itself:
    its groups are plain ``(members, shared)`` tuples, and its lists
    ``groups.partner``, ``groups.common`` and ``groups.own`` give, by batch index,
    each request's partner (the earlier request of the batch it shares the most
    whole pages with, ``-1`` for none), the tokens it shares with it, and its
    tokens shared with no earlier member of its group. It is read-only, as the
    views are (``list(groups)`` is a list of the policy's own to reorder).

    Deprecated: a policy that does not set it is handed, for this release, a list
    of its own of :class:`~radixmeta._batch.PrefixGroup`, each group also listing
    per member its ``partners``, ``common`` and ``own``, and a
    :class:`DeprecationWarning` names its ``choose_batch`` (once per method under
    Python's default filters). In the next release every policy gets the
    PrefixGroups. To migrate, set ``flat_groups = True`` and read
    ``groups.partner[k]`` where ``group.partners[j]`` was read, ``k`` being
    ``members[j]`` (``common`` and ``own`` alike); a policy that only unpacks
    ``(members, shared)`` just sets it. ``flat_groups`` is not a member of the
    protocol: ``isinstance(policy, BatchPolicy)`` does not look for it.
    """

    def choose_batch(
        self,
        requests: Sequence[Request],
        views: Sequence[View],
        groups: Sequence[tuple[Sequence[int], int]],
    ) -> list[WorkerId | Choice]:
        """Pick a worker for every request of a batch."""
        ...
