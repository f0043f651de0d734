"""Small policies for the Router tests (the built-in ones live on another branch).

Each is a plain object with ``choose(request, view)``, as ``radixmeta.policies.base``
asks; none looks at anything but its view, so every test states exactly what it routes by.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from radixmeta import Router, WorkerId
from radixmeta.policies.base import Choice, Request, View


def load_fleet(router: Router, workers: Sequence[WorkerId], case: dict[str, Any]) -> None:
    """Put a generated case's fleet state on ``router``: its requests in flight (some past
    prefill), pages held, round robin over ``workers``, and engine reports."""
    for k, (key, decoding) in enumerate(case["in_flight"]):
        d = router.dispatch(np.array(key, dtype=np.uint32), expected_output=k)
        if decoding:
            router.prefill_done(d.request_id)
    for k, key in enumerate(case["held"]):
        router.tree.insert(np.array(key, dtype=np.uint32), workers[k % len(workers)])
    for k, (queue, usage) in enumerate(case["reports"]):
        router.report_load(workers[k % len(workers)], queue_length=queue, kv_usage=usage)


class First:
    """Always the first worker of the view."""

    def choose(self, request: Request, view: View) -> WorkerId:
        return view.workers[0]


class LeastLoaded:
    """Fewest requests in flight, lowest position on ties; says why."""

    def choose(self, request: Request, view: View) -> Choice:
        low = min(view.requests)
        k = view.requests.index(low)
        return Choice(view.workers[k], "least_loaded", (("requests", low),))


class Longest:
    """The longest match; least loaded among equals (so ties spread)."""

    def choose(self, request: Request, view: View) -> Choice:
        best = max(range(len(view.workers)), key=lambda k: (view.lengths[k], -view.requests[k]))
        return Choice(view.workers[best], "affinity", (("matched", view.lengths[best]),))


class Named:
    """A fixed worker by name when it is in the view, else the first (a scripted router)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def choose(self, request: Request, view: View) -> WorkerId:
        for w in view.workers:
            if w.name == self.name:
                return w
        return view.workers[0]


class Recorder:
    """Wraps a policy; keeps every (request, view) it was asked about and the hooks' calls."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.seen: list[tuple[Request, View]] = []
        self.dispatched: list[tuple[str, WorkerId, int]] = []
        self.finished: list[tuple[str, WorkerId]] = []

    def choose(self, request: Request, view: View) -> Any:
        self.seen.append((request, view))
        return self.inner.choose(request, view)

    def on_dispatch(self, request: Request, worker: WorkerId, matched: int) -> None:
        self.dispatched.append((request.request_id, worker, matched))

    def on_finish(self, request: Request, worker: WorkerId) -> None:
        self.finished.append((request.request_id, worker))


class Returns:
    """Returns whatever it was given (a bad policy, for the errors)."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def choose(self, request: Request, view: View) -> Any:
        return self.value


class BatchFirst:
    """A batch policy: each group to the worker at the group's index modulo the workers."""

    flat_groups = True  # it only unpacks (members, shared)

    def __init__(self) -> None:
        self.calls: list[tuple[int, list[tuple[list[int], int]]]] = []

    def choose(self, request: Request, view: View) -> WorkerId:
        return view.workers[0]

    def choose_batch(
        self,
        requests: Sequence[Request],
        views: Sequence[View],
        groups: Sequence[tuple[Sequence[int], int]],
    ) -> list[WorkerId | Choice]:
        self.calls.append((len(requests), [(list(m), s) for m, s in groups]))
        out: list[WorkerId | Choice] = [views[0].workers[0]] * len(requests)
        for g, (members, shared) in enumerate(groups):
            for k in members:
                workers = views[k].workers
                out[k] = Choice(workers[g % len(workers)], "group", (("shared", shared),))
        return out
