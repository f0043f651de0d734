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

A snapshot that the publisher's replay socket serves (the transport
documentation has its frames) is made of batches of this format too, decoded
with ``seq`` set to the snapshot's seq: their records rebuild the worker from
empty (:class:`~radixmeta.publishing.LogPublisher` sends them).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Annotated, Any

import msgspec
import numpy as np

from radixmeta._records import Cleared, Record, Removed, Stored
from radixmeta.errors import DecodeError, InputTypeError, InvalidInputError
from radixmeta.wire._limits import as_message, check_structure
from radixmeta.wire._messages import malformed_message, placed_message

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


# The decoder's structs: msgspec checks the shape and the ranges in C, so a record
# costs two zero-copy array views and a Struct. A namespace is one of four msgpack
# types, which msgspec cannot type as one union: it is taken raw and read when set.
_Tier = Annotated[int, msgspec.Meta(ge=0, le=1)]
_U64 = Annotated[int, msgspec.Meta(ge=0)]  # msgpack itself ends at 2**64 - 1
_Start = Annotated[int, msgspec.Meta(ge=0)]
_NIL = b"\xc0"


class _PathForm(msgspec.Struct, array_like=True, gc=False):
    tier: _Tier
    namespace: msgspec.Raw
    key: bytes
    start: _Start


class _StoredPath(_PathForm, tag=_STORED_PATH):
    pass


class _StoredBlocks(msgspec.Struct, array_like=True, tag=_STORED_BLOCKS, gc=False):
    tier: _Tier
    namespace: msgspec.Raw
    hashes: bytes
    parent: _U64 | None
    tokens: bytes
    extras: bytes | None


class _RemovedPath(_PathForm, tag=_REMOVED_PATH):
    pass


class _RemovedBlocks(msgspec.Struct, array_like=True, tag=_REMOVED_BLOCKS, gc=False):
    tier: _Tier
    namespace: msgspec.Raw
    hashes: bytes


class _Cleared(msgspec.Struct, array_like=True, tag=_CLEARED, gc=False):
    pass


class _Batch(msgspec.Struct, array_like=True, gc=False):
    magic: str
    version: int
    timestamp: float
    worker: str
    dp_rank: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)]
    records: list[_StoredPath | _StoredBlocks | _RemovedPath | _RemovedBlocks | _Cleared]


class _Header(msgspec.Struct, array_like=True, gc=False):
    magic: str
    version: int


_batch_decoder = msgspec.msgpack.Decoder(_Batch)
_header_decoder = msgspec.msgpack.Decoder(_Header)
_U4, _U8 = np.dtype("<u4"), np.dtype("<u8")


def _view(data: bytes, dtype: np.dtype[Any], where: str) -> np.ndarray:
    if len(data) % dtype.itemsize:
        what = f"must be bin of whole {dtype.str} values, got {len(data)} bytes"
        raise _bad(where, what)
    out = np.frombuffer(data, dtype=dtype)  # read-only: it views the message's bytes
    return out if dtype.isnative else out.astype(dtype.newbyteorder("="))


def _not_msgpack(where: str, exc: msgspec.DecodeError) -> DecodeError:
    # What check_structure leaves to msgspec: a map key that cannot be a dict key (an
    # array or a map) or a bad msgpack timestamp.
    return _bad(where, malformed_message(exc, 0))


def _ns(raw: msgspec.Raw, where: str) -> Any:
    if bytes(raw) == _NIL:
        return None
    try:
        value = _decoder.decode(raw)
    except msgspec.DecodeError as exc:
        raise DecodeError(placed_message(exc, where, " of the namespace")) from None
    try:
        return _namespace(value, where)
    except InputTypeError as exc:
        raise DecodeError(str(exc)) from None


def _record(item: Any, worker: str, rank: int, seq: int, index: int) -> Record:
    where = f"batch[5][{index}]"
    if type(item) is _Cleared:
        return Cleared(worker, rank, seq, index)
    ns = _ns(item.namespace, f"{where}[2]")
    if type(item) is _StoredBlocks:
        return Stored(
            worker,
            rank,
            seq,
            index,
            tier=item.tier,
            namespace=ns,
            block_hashes=_view(item.hashes, _U8, f"{where}[3]"),
            parent_hash=item.parent,
            token_ids=_view(item.tokens, _U4, f"{where}[5]"),
            extras=None if item.extras is None else _view(item.extras, _U8, f"{where}[6]"),
        )
    if type(item) is _RemovedBlocks:
        hashes = _view(item.hashes, _U8, f"{where}[3]")
        return Removed(worker, rank, seq, index, tier=item.tier, namespace=ns, block_hashes=hashes)
    key = _view(item.key, _U4, f"{where}[3]")
    if item.start > len(key):
        what = f"start {item.start} is beyond the key's {len(key)} tokens"
        raise _bad(where + "[4]", what)
    cls = Stored if type(item) is _StoredPath else Removed
    return cls(worker, rank, seq, index, tier=item.tier, namespace=ns, key=key, start=item.start)


def _path(exc: msgspec.ValidationError) -> str:
    """msgspec's ``... - at `$[5][0][1]``` as ``batch[5][0][1]: ...``."""
    text = str(exc)
    message, _, at = text.rpartition(" - at `$")
    if not message:
        return f"{_BATCH}: {text}"
    return f"{_BATCH}{at.rstrip('`')}: {message}"


def decode_batch(data: bytes | bytearray | memoryview, *, seq: int = 0) -> NativeBatch:
    """The batch in ``data``; its records are named ``(seq, index)``.

    Raises
    ------
    DecodeError
        ``data`` is not a version-1 radixmeta batch; nothing of it is returned.
        Any byte string either decodes or raises this, with the limits of
        :mod:`radixmeta.wire` (nesting, lengths) checked before it is decoded.
    InputTypeError
        ``data`` is not bytes, a bytearray or a contiguous memoryview.
    """
    data = as_message(data)
    check_structure(data, _BATCH)
    try:
        batch = _batch_decoder.decode(data)
    except msgspec.ValidationError as exc:
        _check_header(data)  # a foreign message or version is the error to report
        raise DecodeError(_path(exc)) from None
    except msgspec.DecodeError as exc:
        raise _not_msgpack(_BATCH, exc) from None
    if batch.magic != MAGIC or batch.version != VERSION:
        _check_header(data)
    worker, rank = batch.worker, batch.dp_rank
    records = [_record(item, worker, rank, seq, i) for i, item in enumerate(batch.records)]
    return NativeBatch(batch.timestamp, worker, rank, records)


def _check_header(data: bytes | bytearray | memoryview) -> None:
    header = f"expected [{MAGIC!r}, {VERSION}, timestamp, worker, dp_rank, records]"
    try:
        top = _header_decoder.decode(data)
    except msgspec.DecodeError:
        raise _bad(_BATCH, f"not a radixmeta batch ({header})") from None
    if top.magic != MAGIC:
        raise _bad(_BATCH, f"not a radixmeta batch ({header})")
    if top.version != VERSION:
        what = f"version {top.version!r} is not supported ({header})"
        raise _bad(_BATCH + "[1]", what)
