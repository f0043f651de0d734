"""The old path of LogPublisher, now :mod:`radixmeta.events.publishing`.

Kept so that ``from radixmeta.publishing import ...`` goes on working: the names here are the
very objects of the events package (no warning; nobody is asked to move yet).
"""

from __future__ import annotations

from radixmeta.events.publishing import LogPublisher

__all__ = [
    "LogPublisher",
]
