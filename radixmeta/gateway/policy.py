"""The gateway's wrapper around the router's policy: a retry never goes back to its engine.

When an engine fails before the first byte the gateway sends the request once more; the
retry's dispatch must choose among the other engines. :class:`Avoiding` shows the policy a
view without the engines a request is told to avoid (by its id), and otherwise hands the
call straight through, hooks included.
"""

from __future__ import annotations

from typing import Any

from radixmeta._workers import WorkerId
from radixmeta.errors import NoWorkerError
from radixmeta.policies.base import Choice, Request, View

__all__ = ["Avoiding"]


class Avoiding:
    """Wrap ``policy`` so that requests listed in :attr:`avoid` skip some engines.

    Parameters
    ----------
    policy : policy object
        What the router would use (with ``choose(request, view)``).

    Attributes
    ----------
    avoid : dict of str to frozenset of str
        Request id -> worker names its dispatch must not choose; the gateway sets an
        entry before a retry's dispatch and removes it after.
    """

    def __init__(self, policy: Any) -> None:
        self.policy = policy
        self.avoid: dict[str, frozenset[str]] = {}

    def choose(self, request: Request, view: View) -> WorkerId | Choice:
        names = self.avoid.get(request.request_id) if self.avoid else None
        if names is None:
            return self.policy.choose(request, view)  # type: ignore[no-any-return]
        keep = [i for i, w in enumerate(view.workers) if w.name not in names]
        if not keep:
            msg = f"no engine is up besides {', '.join(sorted(names))}"
            raise NoWorkerError(msg)
        if len(keep) == len(view.workers):
            return self.policy.choose(request, view)  # type: ignore[no-any-return]
        sub = View(
            tuple(view.workers[i] for i in keep),
            [view.lengths[i] for i in keep],
            [view.host_lengths[i] for i in keep],
            [view.requests[i] for i in keep],
            [view.prefill_tokens[i] for i in keep],
            [view.decode_tokens[i] for i in keep],
            [view.capacities[i] for i in keep],
            [view.reported[i] for i in keep],
            view.page_size,
            view.prefix_key,
        )
        return self.policy.choose(request, sub)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        # The router looks up the policy's optional hooks (on_dispatch, on_finish,
        # choose_batch) by name: those of the wrapped policy.
        if name == "policy":  # not set yet (copy, pickle)
            raise AttributeError(name)
        return getattr(self.policy, name)

    def __repr__(self) -> str:
        return f"Avoiding({self.policy!r})"
