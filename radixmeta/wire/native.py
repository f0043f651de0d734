"""radixmeta's own records on the wire: a versioned msgpack format (msgspec).

A radixmeta-based engine publishes its :class:`~radixmeta.EventLog` with this
codec over the same transport as vLLM and SGLang (a ZeroMQ PUB and a replay
ROUTER, :mod:`radixmeta.transport`): the transport's frame numbers the batch,
and a record is named by ``(seq, index)``, its position in the batch.

Format, version 1 (every array is a msgpack array; integers are msgpack ints;
token and hash arrays are msgpack ``bin`` of little-endian ``uint32`` and
``uint64``, so a decoder reads them without a Python object per token)::

    batch   = ["radixmeta", 1, timestamp: float, worker: str, dp_rank: int, [record, ...]]
    record  = [0, tier, namespace, key: bin u32, start]                 # Stored, path form
            | [1, tier, namespace, hashes: bin u64, parent: int | nil,
               token_ids: bin u32, extras: bin u64 | nil]               # Stored, block form
            | [2, tier, namespace, key: bin u32, start]                 # Removed, path form
            | [3, tier, namespace, hashes: bin u64]                     # Removed, block form
            | [4]                                                       # Cleared
    namespace = nil | str | int | bin

A decoder of version 1 ignores elements after the ones listed (so a later
version may append fields), and refuses a batch of another magic or version.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from radixmeta._records import Cleared, Record, Removed, Stored
from radixmeta.errors import DecodeError, InputTypeError, InvalidInputError

__all__ = ["MAGIC", "VERSION", "NativeBatch", "decode_batch", "encode_batch"]

MAGIC = "radixmeta"
VERSION = 1
_STORED_PATH, _STORED_BLOCKS, _REMOVED_PATH, _REMOVED_BLOCKS, _CLEARED = range(5)
_BATCH = "batch"

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()


class NativeBatch(msgspec.Struct, frozen=True, gc=False):
    """A decoded batch: who sent it, when, and its records (named ``(seq, index)``)."""

    timestamp: float
    worker: str
    dp_rank: int
    records: list[Record]


def _namespace(value: Any, where: str) -> Any:
    if value is None or (isinstance(value, (str, int, bytes)) and not isinstance(value, bool)):
        return value
    msg = f"{where}: a namespace must be None, str, int or bytes, got {type(value).__name__}"
    raise InputTypeError(msg)


def _encode_record(r: Record) -> list[Any]:
    if isinstance(r, Cleared):
        return [_CLEARED]
    where = f"record seq={r.seq} index={r.index}"
    ns = _namespace(r.namespace, where)
    if r.form == "path":
        if r.key is None:
            msg = f"{where}: a path-form record needs its key"
            raise InvalidInputError(msg)
        kind = _STORED_PATH if isinstance(r, Stored) else _REMOVED_PATH
        return [kind, r.tier, ns, np.ascontiguousarray(r.key, "<u4").tobytes(), r.start]
    hashes = np.ascontiguousarray(r.block_hashes, "<u8").tobytes()
    if isinstance(r, Removed):
        return [_REMOVED_BLOCKS, r.tier, ns, hashes]
    extras = None if r.extras is None else np.ascontiguousarray(r.extras, "<u8").tobytes()
    tokens = np.ascontiguousarray(r.token_ids, "<u4").tobytes()
    return [_STORED_BLOCKS, r.tier, ns, hashes, r.parent_hash, tokens, extras]


def encode_batch(
    records: Sequence[Record], *, worker: str, dp_rank: int = 0, timestamp: float | None = None
) -> bytes:
    """The bytes of one batch of ``records`` from worker ``(worker, dp_rank)``.

    Records keep neither their worker nor their sequence numbers on the wire:
    the batch names the worker and the transport's frame numbers the batch.
    """
    if not isinstance(worker, str):
        msg = f"worker must be a str, got {type(worker).__name__}"
        raise InputTypeError(msg)
    ts = time.time() if timestamp is None else float(timestamp)
    body = [_encode_record(r) for r in records]
    return _encoder.encode([MAGIC, VERSION, ts, worker, int(dp_rank), body])


def _bad(where: str, what: str) -> DecodeError:
    msg = f"{where}: {what}"
    return DecodeError(msg)


def _array(data: Any, dtype: str, where: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    if not isinstance(data, bytes) or len(data) % width:
        raise _bad(where, f"must be bin of whole {dtype} values, got {type(data).__name__}")
    out = np.frombuffer(data, dtype=dtype).astype(dtype[1:], copy=False)
    out.flags.writeable = False
    return out


def _int(value: Any, where: str, low: int = 0, high: int = 2**64 - 1) -> int:
    if type(value) is not int or not low <= value <= high:
        raise _bad(where, f"must be an integer in [{low}, {high}], got {value!r}")
    return value


def _decode_record(item: Any, worker: str, rank: int, seq: int, index: int) -> Record:
    where = f"batch[5][{index}]"
    if not isinstance(item, list) or not item:
        raise _bad(where, f"a record must be a non-empty array, got {type(item).__name__}")
    kind = _int(item[0], f"{where}[0]", 0, 4)
    sizes = {_STORED_PATH: 5, _STORED_BLOCKS: 7, _REMOVED_PATH: 5, _REMOVED_BLOCKS: 4, _CLEARED: 1}
    if len(item) < sizes[kind]:
        raise _bad(where, f"a record of kind {kind} has {sizes[kind]} elements, got {len(item)}")
    if kind == _CLEARED:
        return Cleared(worker, rank, seq, index)
    tier = _int(item[1], f"{where}[1]", 0, 1)
    try:
        ns = _namespace(item[2], f"{where}[2]")
    except InputTypeError as exc:
        raise DecodeError(str(exc)) from None
    if kind in (_STORED_PATH, _REMOVED_PATH):
        key = _array(item[3], "<u4", f"{where}[3]")
        start = _int(item[4], f"{where}[4]", 0, len(key))
        cls = Stored if kind == _STORED_PATH else Removed
        return cls(worker, rank, seq, index, tier=tier, namespace=ns, key=key, start=start)
    hashes = _array(item[3], "<u8", f"{where}[3]")
    if kind == _REMOVED_BLOCKS:
        return Removed(worker, rank, seq, index, tier=tier, namespace=ns, block_hashes=hashes)
    parent = None if item[4] is None else _int(item[4], f"{where}[4]")
    tokens = _array(item[5], "<u4", f"{where}[5]")
    extras = None if item[6] is None else _array(item[6], "<u8", f"{where}[6]")
    return Stored(
        worker,
        rank,
        seq,
        index,
        tier=tier,
        namespace=ns,
        block_hashes=hashes,
        parent_hash=parent,
        token_ids=tokens,
        extras=extras,
    )


def decode_batch(data: bytes, *, seq: int = 0) -> NativeBatch:
    """The batch in ``data``; its records are named ``(seq, index)``.

    Raises
    ------
    DecodeError
        ``data`` is not a version-1 radixmeta batch; nothing of it is returned.
    """
    try:
        top = _decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise _bad(_BATCH, f"not msgpack ({exc})") from None
    header = f"expected [{MAGIC!r}, {VERSION}, timestamp, worker, dp_rank, records]"
    if not isinstance(top, list) or len(top) < 6 or top[0] != MAGIC:
        raise _bad(_BATCH, f"not a radixmeta batch ({header})")
    where = [f"{_BATCH}[{i}]" for i in range(6)]
    if top[1] != VERSION:
        raise _bad(where[1], f"version {top[1]!r} is not supported ({header})")
    timestamp, worker, rank, body = top[2], top[3], top[4], top[5]
    if not isinstance(timestamp, (int, float)) or isinstance(timestamp, bool):
        raise _bad(where[2], f"the timestamp must be a number, got {type(timestamp).__name__}")
    if not isinstance(worker, str):
        raise _bad(where[3], f"the worker must be a str, got {type(worker).__name__}")
    rank = _int(rank, where[4], 0, 2**31 - 1)
    if not isinstance(body, list):
        raise _bad(where[5], f"the records must be an array, got {type(body).__name__}")
    records = [_decode_record(item, worker, rank, seq, i) for i, item in enumerate(body)]
    return NativeBatch(float(timestamp), worker, rank, records)
