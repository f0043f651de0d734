"""The policy as a Ray router instance runs it: Ray's queue lengths in, no herding.

Ray Serve makes a router per handle, per proxy and per event loop that calls a handle,
so several instances route the same replicas, each counting only its own requests.
:class:`ServeView` wraps the configured policy and hands it a view in which:

- each replica's requests in flight are at least the queue length Ray Serve last saw
  there (every caller's requests, through ``Router.report_load``); the requests this
  instance does not count itself add the mean uncached prompt of its own dispatches to
  the replica's queued prefill tokens, so a cost-based policy sees them too;
- the replicas are rotated by an offset drawn once per instance, so the tie-breaking
  rotation of fresh instances (which all see an idle fleet) starts at different
  replicas instead of sending every first request to the same one.

Everything else (match lengths, the lengths the router expects to stay cached,
capacities, hooks) is handed through unchanged; ``rank`` ranks the same view.
"""

from __future__ import annotations

import random
from typing import Any

from radixmeta._workers import WorkerId
from radixmeta.policies.base import Choice, Request, View
from radixmeta.router.ranking import by_held

__all__ = ["ServeView"]


class ServeView:
    """Wrap ``policy`` so that it sees Ray Serve's queue lengths, rotated per instance.

    Parameters
    ----------
    policy : policy object
        What the router would use (with ``choose(request, view)``).
    seed : int, optional
        The rotation's seed (random by default).
    """

    def __init__(self, policy: Any, seed: int | None = None) -> None:
        self.policy = policy
        self.offset = random.Random(seed).randrange(1 << 30)
        self._dispatched = 0
        self._uncached = 0

    def choose(self, request: Request, view: View) -> WorkerId | Choice:
        return self.policy.choose(request, self._seen(request, view))  # type: ignore[no-any-return]

    def rank(self, request: Request, view: View) -> list[WorkerId]:
        """The wrapped policy's ``rank`` of the same view ``choose`` sees; without one, the
        router's rule (:func:`~radixmeta.router.ranking.by_held`) on that view."""
        seen = self._seen(request, view)
        hook = getattr(self.policy, "rank", None)
        if callable(hook):
            return hook(request, seen)  # type: ignore[no-any-return]
        return by_held(seen)

    def _seen(self, request: Request, view: View) -> View:
        """``view`` with Ray Serve's queue lengths folded in, rotated by this instance's offset."""
        n = len(view.workers)
        shift = self.offset % n
        order = [*range(shift, n), *range(shift)]
        mean = self._uncached // self._dispatched if self._dispatched else len(request.tokens)
        requests = list(view.requests)
        prefill = list(view.prefill_tokens)
        for i, reported in enumerate(view.reported):
            queue = None if reported is None else reported.queue_length
            if queue is not None and queue > requests[i]:
                prefill[i] += (queue - requests[i]) * mean
                requests[i] = queue
        # Lists the router passes as one object stay one (a policy may test identity:
        # host lengths that are the device's, expected lengths with nothing cut).
        lengths = [view.lengths[i] for i in order]
        host = view.host_lengths
        host = lengths if host is view.lengths else [host[i] for i in order]
        expected = view.expected
        if expected is not None:
            expected = lengths if expected is view.lengths else [expected[i] for i in order]
        return View(
            tuple(view.workers[i] for i in order),
            lengths,
            host,
            [requests[i] for i in order],
            [prefill[i] for i in order],
            [view.decode_tokens[i] for i in order],
            [view.capacities[i] for i in order],
            [view.reported[i] for i in order],
            view.page_size,
            view.prefix_key,
            expected,
        )

    def on_dispatch(self, request: Request, worker: WorkerId, matched: int) -> None:
        self._dispatched += 1
        self._uncached += len(request.tokens) - matched
        hook = getattr(self.policy, "on_dispatch", None)
        if hook is not None:
            hook(request, worker, matched)

    def __getattr__(self, name: str) -> Any:
        # The router looks up the optional hooks (on_finish, choose_batch) by name.
        if name == "policy":  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self.policy, name)

    def __repr__(self) -> str:
        return f"ServeView({self.policy!r})"
