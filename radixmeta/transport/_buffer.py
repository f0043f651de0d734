"""The publisher-side replay buffer: the last ``capacity`` payloads, numbered from 0.

A fixed ring indexed by ``seq % capacity``, so appending and reading one batch are O(1)
and a replay from any seq is O(batches returned); a deque would make a read from the
middle O(n). One lock makes it safe to append from the publishing thread while a replay
thread reads.
"""

from __future__ import annotations

import threading

from radixmeta.errors import InvalidInputError

__all__ = ["ReplayBuffer"]


class ReplayBuffer:
    """Bounded, thread-safe store of ``(seq, payload)``; the oldest falls off when full.

    Parameters
    ----------
    capacity : int
        How many batches are kept, ``>= 1``.
    """

    __slots__ = ("_capacity", "_lock", "_next", "_slots")

    def __init__(self, capacity: int) -> None:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            msg = f"buffer_steps must be an int >= 1, got {capacity!r}"
            raise InvalidInputError(msg)
        self._capacity = capacity
        self._slots: list[bytes] = [b""] * capacity
        self._next = 0
        self._lock = threading.Lock()

    @property
    def capacity(self) -> int:
        """How many batches the buffer keeps."""
        return self._capacity

    @property
    def next_seq(self) -> int:
        """The seq the next :meth:`append` returns (the number of batches ever appended)."""
        return self._next

    @property
    def oldest_seq(self) -> int:
        """The oldest seq still held; equals :attr:`next_seq` while the buffer is empty."""
        return max(0, self._next - self._capacity)

    def append(self, payload: bytes) -> int:
        """Store ``payload`` under the next seq and return that seq. O(1)."""
        with self._lock:
            seq = self._next
            self._slots[seq % self._capacity] = payload
            self._next = seq + 1
            return seq

    def read(self, start_seq: int, limit: int | None = None) -> list[tuple[int, bytes]]:
        """Return the held batches with ``seq >= start_seq``, oldest first.

        A ``start_seq`` older than the buffer starts at the oldest batch held, so the first
        seq returned is later than asked: the caller sees the gap. O(batches returned).

        Parameters
        ----------
        start_seq : int
            The first seq wanted.
        limit : int, optional
            Return at most this many.
        """
        with self._lock:
            first = max(start_seq, self._next - self._capacity, 0)
            stop = self._next if limit is None else min(self._next, first + limit)
            cap, slots = self._capacity, self._slots
            return [(seq, slots[seq % cap]) for seq in range(first, stop)]

    def __len__(self) -> int:
        return self._next - self.oldest_seq
