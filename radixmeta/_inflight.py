"""Which prefixes the requests in flight on each worker start with, for the router's estimate.

A request in flight on a worker locks its prompt's pages there, or computes them
again before a later request of the same prefix runs (first come, first
served), so a prefix an in-flight request starts with is not evicted before that
later request is admitted (:mod:`radixmeta.policies.expected`). The tree's holds
know this too, but a match cannot tell a held prefix from a reported one, so the
router keeps its own count: per worker, the keys of each in-flight request's
whole prompt and of the prefix it was matched with at dispatch (the prefix it
shares with earlier requests, such as a group's system prompt). A later request
finds its matched prefix among them when it ends where an in-flight prompt ends
(the next turn of a conversation that resends it) or where an in-flight
request's own match ended (a sibling of a prefix group).

A key is ``(worker index, namespace, length, the tokens of its last page)``:
two prefixes of one length that end in the same page share a key, as
``MetaMatch.prefix_key`` does; for an estimate that rare collision only keeps
a prefix. O(page) per key, O(1) per count.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["InFlightPrefixes"]

Key = tuple[int, Hashable, int, bytes]


class InFlightPrefixes:
    """Counts of the prefixes that in-flight requests start with, per worker."""

    __slots__ = ("_counts", "page_size")

    def __init__(self, page_size: int) -> None:
        self.page_size = page_size
        self._counts: dict[Key, int] = {}

    def key(
        self, index: int, tokens: npt.NDArray[np.uint32], length: int, namespace: Hashable
    ) -> Key | None:
        """The key of ``tokens[:length]`` (whole pages) on worker ``index``; None if empty."""
        length -= length % self.page_size
        if length <= 0:
            return None
        return (index, namespace, length, tokens[length - self.page_size : length].tobytes())

    def enter(self, keys: tuple[Key | None, ...]) -> None:
        """A request with these keys is in flight."""
        counts = self._counts
        for key in keys:
            if key is not None:
                counts[key] = counts.get(key, 0) + 1

    def leave(self, keys: tuple[Key | None, ...]) -> None:
        """It is not any more (finished, expired, or its worker removed)."""
        counts = self._counts
        for key in keys:
            if key is not None:
                left = counts[key] - 1
                if left:
                    counts[key] = left
                else:
                    del counts[key]

    def __contains__(self, key: object) -> bool:
        return key in self._counts

    def __len__(self) -> int:
        return len(self._counts)
