"""The frames of vLLM's KV-event protocol, built and checked without any socket.

Live (PUB -> SUB), 3 frames::

    [topic, seq (8 bytes, big-endian, unsigned), payload]

Replay request, as the ROUTER receives it from a DEALER (the DEALER sends the last two)::

    [client_id, b"", start_seq (8 bytes)]

Replay reply, per buffered batch with ``seq >= start_seq``, then an end marker whose
payload frame is empty (``END_SEQ`` is -1 as 8 signed bytes)::

    new (vLLM >= 0.26, SGLang >= 0.5.22): [client_id, b"", topic, seq, payload]
                                          [client_id, b"", b"", END_SEQ, b""]
    old (vLLM <= 0.25, SGLang <= 0.5.20): [client_id, b"", seq, payload]
                                          [client_id, b"", END_SEQ, b""]

The DEALER receives each reply without ``client_id``. The end marker is recognised by its
empty payload frame, as llm-d does, which is why a publisher refuses empty payloads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.transport.base import Batch, ReplayLayout

__all__ = [
    "END_SEQ",
    "MAX_SEQ",
    "SEQ_SIZE",
    "ReplyKind",
    "check_payload",
    "check_seq",
    "check_timeout",
    "check_topic",
    "decode_seq",
    "encode_seq",
    "end_marker",
    "live_frames",
    "parse_live",
    "parse_replay_reply",
    "parse_replay_request",
    "replay_reply",
    "replay_request",
]

SEQ_SIZE = 8
MAX_SEQ = 2**64 - 1
END_SEQ = b"\xff" * SEQ_SIZE

ReplyKind = Literal["batch", "end", "malformed"]


def encode_seq(seq: int) -> bytes:
    """Return ``seq`` as the 8-byte big-endian frame."""
    return seq.to_bytes(SEQ_SIZE, "big")


def decode_seq(frame: bytes) -> int:
    """Return the unsigned seq of an 8-byte big-endian frame."""
    return int.from_bytes(frame, "big")


def live_frames(topic: bytes, seq: int, payload: bytes) -> tuple[bytes, bytes, bytes]:
    """Return the 3 frames of a live message."""
    return (topic, encode_seq(seq), payload)


def parse_live(frames: Sequence[bytes]) -> Batch | None:
    """Return the batch of a live message, or ``None`` if its framing is wrong.

    Exactly 3 frames with an 8-byte seq; anything else (a 2-frame message, a 7-byte seq)
    is malformed. The caller counts it and moves on: a bad frame never raises.
    """
    if len(frames) != 3 or len(frames[1]) != SEQ_SIZE:
        return None
    return Batch(bytes(frames[0]), decode_seq(frames[1]), bytes(frames[2]))


def replay_request(start_seq: int) -> tuple[bytes, bytes]:
    """Return the frames a DEALER sends to ask for every batch from ``start_seq`` on."""
    return (b"", encode_seq(start_seq))


def parse_replay_request(frames: Sequence[bytes]) -> tuple[bytes, int] | None:
    """Return ``(client_id, start_seq)`` of a request as the ROUTER got it, or ``None``.

    vLLM answers only requests of exactly 3 frames; so does this. It also requires the
    seq frame to be 8 bytes (vLLM would read any length as a number), since every client
    in the wild sends 8 and anything else is a framing bug worth not answering.
    """
    if len(frames) != 3 or len(frames[2]) != SEQ_SIZE:
        return None
    return bytes(frames[0]), decode_seq(frames[2])


def replay_reply(
    client_id: bytes, batch: Batch, layout: ReplayLayout
) -> tuple[bytes, ...]:
    """Return the ROUTER frames that replay one batch to ``client_id``."""
    seq = encode_seq(batch.seq)
    if layout == "new":
        return (client_id, b"", batch.topic, seq, batch.payload)
    return (client_id, b"", seq, batch.payload)


def end_marker(client_id: bytes, layout: ReplayLayout) -> tuple[bytes, ...]:
    """Return the ROUTER frames that end a replay reply."""
    if layout == "new":
        return (client_id, b"", b"", END_SEQ, b"")
    return (client_id, b"", END_SEQ, b"")


def parse_replay_reply(
    frames: Sequence[bytes],
) -> tuple[ReplyKind, ReplayLayout | None, Batch | None]:
    """Classify one reply message as a DEALER received it.

    Returns ``(kind, layout, batch)``: ``("batch", layout, batch)`` for a replayed batch
    (``topic`` is ``b""`` in the old layout, which carries none), ``("end", layout, None)``
    for the end marker, ``("malformed", None, None)`` otherwise.
    """
    if not frames or len(frames[0]) != 0:
        return "malformed", None, None
    body = frames[1:]
    if len(body) == 3:
        topic, seq, payload = body
        if len(payload) == 0:
            return "end", "new", None
        if len(seq) == SEQ_SIZE:
            return "batch", "new", Batch(bytes(topic), decode_seq(seq), bytes(payload))
    elif len(body) == 2:
        seq, payload = body
        if len(payload) == 0:
            return "end", "old", None
        if len(seq) == SEQ_SIZE:
            return "batch", "old", Batch(b"", decode_seq(seq), bytes(payload))
    return "malformed", None, None


def check_payload(payload: bytes) -> bytes:
    """Return ``payload`` as immutable bytes, or raise for what no batch may be.

    A ``bytearray`` or ``memoryview`` is copied: the buffer keeps the payload for replay,
    and a later change by the caller must not rewrite history. Empty payloads are refused:
    an empty payload frame is the replay end marker.
    """
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        msg = f"payload must be bytes, got {type(payload).__name__}"
        raise InputTypeError(msg)
    data = bytes(payload)
    if not data:
        msg = "payload must not be empty: an empty payload frame is the replay end marker"
        raise InvalidInputError(msg)
    return data


def check_seq(seq: int, name: str = "start_seq") -> int:
    """Return ``seq`` if it is an int in ``[0, 2**64)``, else raise."""
    if isinstance(seq, bool) or not isinstance(seq, int):
        msg = f"{name} must be an int, got {type(seq).__name__}"
        raise InputTypeError(msg)
    if not 0 <= seq <= MAX_SEQ:
        msg = f"{name} = {seq} is outside [0, 2**64)"
        raise InvalidInputError(msg)
    return seq


def check_timeout(timeout: float | None) -> float | None:
    """Return ``timeout`` (seconds, ``None`` for no limit) if it is a number >= 0."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        msg = f"timeout must be a number of seconds or None, got {type(timeout).__name__}"
        raise InputTypeError(msg)
    if not timeout >= 0:  # also refuses NaN
        msg = f"timeout must be >= 0, got {timeout!r}"
        raise InvalidInputError(msg)
    return float(timeout)


def check_topic(topic: bytes) -> bytes:
    """Return ``topic`` as bytes; a ``str`` is refused rather than guessed at."""
    if not isinstance(topic, (bytes, bytearray, memoryview)):
        msg = f"topic must be bytes, got {type(topic).__name__}"
        raise InputTypeError(msg)
    return bytes(topic)
