"""The old path of FleetSubscription, now :mod:`radixmeta.events.subscription`.

Kept so that ``from radixmeta.subscription import ...`` goes on working: the names here are the
very objects of the events package (no warning; nobody is asked to move yet).
"""

from __future__ import annotations

from radixmeta.events.subscription import CODECS, FleetSubscription, WorkerEndpoint

__all__ = [
    "CODECS",
    "FleetSubscription",
    "WorkerEndpoint",
]
