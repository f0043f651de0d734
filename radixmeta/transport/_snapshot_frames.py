"""radixmeta's snapshot request on the replay socket: its frames, built and checked here.

A radixmeta publisher's ROUTER answers vLLM's replay request and, besides it, a snapshot
request. The two cannot be confused: vLLM's request is exactly 3 frames at the ROUTER with
an 8-byte seq, and vLLM answers nothing else; a snapshot request is 4 frames starting with a
tag that no 8-byte seq can be. A vLLM or SGLang publisher sent one by mistake drops it as
"Invalid replay request" (so the client times out), and a vLLM client never sends one.

Request, as the ROUTER receives it (the DEALER sends the last three)::

    [client_id, b"", b"radixmeta-snapshot", b"\\x01"]

Reply, one message (ZeroMQ delivers a multipart message whole or not at all, so a
snapshot is never cut short and needs no end marker)::

    snapshot: [client_id, b"", b"radixmeta-snapshot", b"\\x01", seq (8 bytes), payload, ...]
    none:     [client_id, b"", b"radixmeta-snapshot", b"\\x01"]

``seq`` (unsigned, big-endian) is the batch the payloads are consistent with; there are zero
or more payloads, none of them empty. "None" means the publisher has no snapshot to give.
The DEALER receives each reply without ``client_id``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from radixmeta.errors import InputTypeError
from radixmeta.transport._frames import SEQ_SIZE, check_payload, check_seq, decode_seq, encode_seq
from radixmeta.transport.base import Snapshot

__all__ = [
    "SNAPSHOT_TAG",
    "SNAPSHOT_VERSION",
    "SnapshotReplyKind",
    "check_snapshot",
    "no_snapshot_reply",
    "parse_snapshot_reply",
    "parse_snapshot_request",
    "snapshot_reply",
    "snapshot_request",
]

#: The frame that makes a message a snapshot request or reply (18 bytes: never a seq).
SNAPSHOT_TAG = b"radixmeta-snapshot"
#: The version of these frames; a request of another version is not answered.
SNAPSHOT_VERSION = b"\x01"

SnapshotReplyKind = Literal["snapshot", "unavailable", "malformed"]

_HEAD = (SNAPSHOT_TAG, SNAPSHOT_VERSION)


def snapshot_request() -> tuple[bytes, bytes, bytes]:
    """Return the frames a DEALER sends to ask for a snapshot."""
    return (b"", *_HEAD)


def parse_snapshot_request(frames: Sequence[bytes]) -> bytes | None:
    """Return the client id of a snapshot request as the ROUTER got it, or ``None``.

    Exactly ``[client_id, b"", tag, version 1]``; anything else (another version, an extra
    frame) is not a snapshot request.
    """
    if len(frames) != 4 or len(frames[1]) != 0 or tuple(map(bytes, frames[2:])) != _HEAD:
        return None
    return bytes(frames[0])


def check_snapshot(value: object) -> Snapshot:
    """Return what a ``snapshot`` callable returned as a checked :class:`Snapshot`.

    Raises
    ------
    InputTypeError
        ``value`` is not a ``(seq, payloads)`` pair, or a payload is not bytes-like.
    InvalidInputError
        ``seq`` is outside ``[0, 2**64)``, or a payload is empty.
    """
    if not isinstance(value, tuple) or len(value) != 2:
        msg = f"a snapshot is a Snapshot(seq, payloads), got {type(value).__name__}"
        raise InputTypeError(msg)
    seq, payloads = value
    if isinstance(payloads, (bytes, bytearray, memoryview, str)) or not isinstance(
        payloads, Sequence
    ):
        msg = f"a snapshot's payloads are a sequence of bytes, got {type(payloads).__name__}"
        raise InputTypeError(msg)
    return Snapshot(check_seq(seq, "snapshot seq"), tuple(check_payload(p) for p in payloads))


def snapshot_reply(client_id: bytes, snapshot: Snapshot) -> tuple[bytes, ...]:
    """Return the ROUTER frames that send ``snapshot`` (checked) to ``client_id``."""
    return (client_id, b"", *_HEAD, encode_seq(snapshot.seq), *snapshot.payloads)


def no_snapshot_reply(client_id: bytes) -> tuple[bytes, ...]:
    """Return the ROUTER frames that tell ``client_id`` there is no snapshot to give."""
    return (client_id, b"", *_HEAD)


def parse_snapshot_reply(frames: Sequence[bytes]) -> tuple[SnapshotReplyKind, Snapshot | None]:
    """Classify one reply message as a DEALER received it.

    Returns ``("snapshot", Snapshot)``, ``("unavailable", None)`` for the "none" reply, or
    ``("malformed", None)`` for anything else: a missing delimiter, another tag or version,
    a seq that is not 8 bytes, an empty payload.
    """
    if len(frames) < 3 or len(frames[0]) != 0 or tuple(map(bytes, frames[1:3])) != _HEAD:
        return "malformed", None
    if len(frames) == 3:
        return "unavailable", None
    seq, *payloads = frames[3:]
    if len(seq) != SEQ_SIZE or not all(payloads):
        return "malformed", None
    return "snapshot", Snapshot(decode_seq(seq), tuple(bytes(p) for p in payloads))
