"""Plain-Python event log: the reference of the native ring (``event_ring.hpp``).

The reference cache tells it what it stores, removes and clears as it happens;
records are built on reading, by the same function as the native log's, so both
give equal records for equal calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

import numpy as np

from radixmeta import _hashing
from radixmeta._keys import check_int
from radixmeta._log_settings import checked_hashes, discard_past, log_settings, truncated
from radixmeta._records import CLEARED, REMOVED, STORED, Record, make_record
from radixmeta.errors import InvalidInputError

_Entry = tuple[int, int, Hashable, tuple[int, ...], int]  # seq, kind, namespace, path, start


class EventLogCore:
    """Reference implementation of the worker's event log (see ``radixmeta.EventLog``)."""

    def __init__(
        self,
        capacity: int = 65536,
        *,
        max_tokens: int = 2**22,
        form: str = "path",
        hash: Any = None,
        worker: str = "",
        dp_rank: int = 0,
    ) -> None:
        (
            self._capacity,
            self._max_tokens,
            self.form,
            self._hash_name,
            self._scheme,
            self.worker,
            self.dp_rank,
        ) = log_settings(capacity, max_tokens, form, hash, worker, dp_rank)
        self._entries: deque[_Entry] = deque()
        self._held_tokens = 0
        self._next_seq = 0
        self._page = 0
        self._attached = False

    def __reduce__(self) -> Any:
        msg = f"cannot pickle or copy {type(self).__name__!r} object"
        raise TypeError(msg)

    @property
    def capacity(self) -> int:
        """Records the ring holds; older ones are dropped."""
        return self._capacity

    @property
    def max_tokens(self) -> int:
        """Tokens the records' paths may hold in all; older records are dropped past it."""
        return self._max_tokens

    @property
    def held_tokens(self) -> int:
        """Tokens the held records' paths take."""
        return self._held_tokens

    @property
    def hash(self) -> Any:
        """The block-hash scheme (``"chain"``, ``"sglang"`` or the callable), None in path form."""
        return self._hash_name

    @property
    def next_seq(self) -> int:
        """The sequence number the next record will take."""
        return self._next_seq

    @property
    def oldest_seq(self) -> int:
        """The oldest sequence number still held (``next_seq`` when empty)."""
        return self._entries[0][0] if self._entries else self._next_seq

    @property
    def attached(self) -> bool:
        """Whether a cache writes to this log."""
        return self._attached

    def __len__(self) -> int:
        return len(self._entries)

    def _attach(self, page_size: int) -> None:
        if self._attached:
            msg = "this event log is already attached to a cache"
            raise InvalidInputError(msg)
        self._attached = True
        self._page = page_size

    def _record(self, kind: int, namespace: Hashable, path: tuple[int, ...], start: int) -> None:
        self._entries.append((self._next_seq, kind, namespace, path, start))
        self._next_seq += 1
        self._held_tokens += len(path)
        # Bounded by records and by tokens, as the native ring; the newest always stays.
        while len(self._entries) > self._capacity or (
            len(self._entries) > 1 and self._held_tokens > self._max_tokens
        ):
            self._held_tokens -= len(self._entries.popleft()[3])

    def read(self, after: int | None = None, *, max_records: int | None = None) -> list[Record]:
        """The records that follow sequence number ``after`` (all held, if None), in order."""
        first = self.oldest_seq
        if after is not None:
            after = check_int("after", after, -1)
            if after + 1 < first:
                raise truncated(after, first, self.capacity)
            first = after + 1
        picked = [entry for entry in self._entries if entry[0] >= first]
        if max_records is not None:
            picked = picked[: check_int("max_records", max_records, 0)]
        return [self._build(*entry) for entry in picked]

    def discard(self, through_seq: int) -> int:
        """Drop every held record with ``seq <= through_seq``; returns how many went."""
        through = check_int("through_seq", through_seq, -1)
        if through >= self._next_seq:
            raise discard_past(through, self._next_seq)
        dropped = 0
        while self._entries and self._entries[0][0] <= through:
            self._held_tokens -= len(self._entries.popleft()[3])
            dropped += 1
        return dropped

    def _build(
        self, seq: int, kind: int, namespace: Hashable, path: tuple[int, ...], start: int
    ) -> Record:
        tokens = np.array(path, dtype=np.uint32)
        hashes = None
        if self.form == "blocks" and kind != CLEARED:
            if self._scheme is None:
                hashed = _hashing.chain_hashes(tokens, self._page)
            else:
                hashed = self._scheme(tokens, self._page, namespace)
            hashes = checked_hashes(hashed, len(path) // self._page)
        return make_record(
            kind,
            self.worker,
            self.dp_rank,
            seq,
            namespace,
            tokens,
            start,
            self._page,
            hashes,
        )

    def __repr__(self) -> str:
        return (
            f"EventLog(worker={self.worker!r}, dp_rank={self.dp_rank}, form={self.form!r}, "
            f"records={len(self)}, next_seq={self.next_seq})"
        )


__all__ = ["CLEARED", "REMOVED", "STORED", "EventLogCore"]
