"""The Router: a MetaTree, the workers and their loads, a policy, and the replayer.

The SGLang paper's appendix A.4, as a library object. ``dispatch`` matches a
request against the meta-tree (every worker's cached prefix in one walk), hands
a policy a read-only :class:`~radixmeta.policies.base.View` of the up workers,
and applies what it chose: the request's pages are marked for that worker at
once, continuing from the match's walk, and its load is counted until
``finish``. ``dispatch_batch`` decides a batch together, keeping requests that
share a long prefix with each other on one worker unless load forbids it.

Two modes:

* **exact**: the tree is what the workers report, fed by their events through
  the router's :class:`~radixmeta.events.Replayer` (``replay``, ``idle``,
  ``subscribe``). A dispatch's marks are *holds* (``MetaTree.hold``): counted
  by every match, never part of the reported view, released at ``finish``.
* **approximate**: no events; each worker's ``capacity`` bounds the router's
  own model of its cache (the MetaTree's approximate workers), and a dispatch's
  marks are inserts, evicted least recently used first.

Every public method takes one lock, so ``dispatch`` and ``finish`` may be called
from several threads; the replayer applies events without it (each MetaTree call
is atomic, and a mark checks its match's walk node by node before it trusts it).

The package, one job per module:

* :mod:`~radixmeta.router.router`: the :class:`Router` class (the public calls,
  the lock, each call's steps);
* :mod:`~radixmeta.router.registry`: the workers, which are up, their loads and
  the views policies read (:class:`WorkerLoad`);
* :mod:`~radixmeta.router.decision`: :class:`Decision`, also the record of a
  request in flight;
* :mod:`~radixmeta.router.batch`: the batch path (``dispatch_batch``);
* :mod:`~radixmeta.router.feed`: the replayer, its sources, the subscriptions and
  the background thread;
* :mod:`~radixmeta.router.metrics` and :mod:`~radixmeta.router.exposition`:
  ``metrics()`` and its Prometheus text.
"""

from __future__ import annotations

from radixmeta.router.decision import Decision
from radixmeta.router.registry import WorkerLoad
from radixmeta.router.router import Router

__all__ = ["Decision", "Router", "WorkerLoad"]
