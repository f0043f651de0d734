"""The Router: a MetaTree, the workers and their loads, a policy, and the replayer."""

from __future__ import annotations

from radixmeta.router.router import Decision, Router, WorkerLoad

__all__ = ["Decision", "Router", "WorkerLoad"]
