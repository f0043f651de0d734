"""The old path of EventLog, now :mod:`radixmeta.events.log`.

Kept so that ``from radixmeta.log import ...`` goes on working: the names here are the
very objects of the events package (no warning; nobody is asked to move yet).
"""

from __future__ import annotations

from radixmeta.events.log import EventLog

__all__ = [
    "EventLog",
]
