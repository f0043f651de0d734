"""The trace workload: block-hash traces, one JSON object a line (the Mooncake form)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import msgspec
import numpy as np

from radixmeta._keys import check_int
from radixmeta.errors import DataNotFoundError, InvalidInputError, WorkloadError
from radixmeta.sim._workload import Request, Workload, frozen_tokens

__all__ = ["TraceRecord", "from_records", "trace"]


class TraceRecord(msgspec.Struct):
    """One line of a trace. Other fields on the line are ignored."""

    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int]


_DECODER = msgspec.json.Decoder(TraceRecord)

#: An ``output_length`` above this is a broken line, not a long request.
MAX_OUTPUT_LENGTH = 2**31


def _check(record: TraceRecord, block_size: int) -> str | None:
    """What is wrong with a decoded line, or None."""
    if not math.isfinite(record.timestamp):
        return f"timestamp must be finite, got {record.timestamp}"
    if record.output_length < 0:
        return f"output_length must be >= 0, got {record.output_length}"
    if record.output_length > MAX_OUTPUT_LENGTH:
        # Above any context length; a length merely above the model's context is
        # the engine's to reject, request by request, in the simulation.
        return f"output_length must be <= 2**31, got {record.output_length}"
    blocks = len(record.hash_ids)
    if record.input_length < 1 or blocks == 0:
        return f"input_length must be >= 1 with at least one hash id, got {record.input_length}"
    need = -(-record.input_length // block_size)
    if need != blocks:
        return (
            f"input_length {record.input_length} needs {need} block(s) of {block_size} tokens, "
            f"got {blocks} hash_ids"
        )
    for position, value in enumerate(record.hash_ids):
        if value < 0:
            return f"hash_ids[{position}] must be >= 0, got {value}"
    return None


def trace(
    path: str | os.PathLike[str],
    *,
    block_size: int = 512,
    time_scale: float = 1.0,
    limit: int | None = None,
) -> Workload:
    """Replay a block-hash trace: lines of ``timestamp``, lengths and ``hash_ids``.

    Each non-blank line is a JSON object with ``timestamp`` (milliseconds),
    ``input_length``, ``output_length`` and ``hash_ids``: one id per block of
    ``block_size`` prompt tokens, equal ids meaning equal blocks. The last block may
    be partial: ``input_length`` must need exactly ``len(hash_ids)`` blocks. Other
    fields are ignored, so the Mooncake traces load as they are.

    Prompts are made of synthetic token ids: the ``d``-th distinct hash id (in order of
    first appearance in the file) becomes a block whose tokens are all ``d``; a
    partial last block is the first tokens of it. Equal ids thus give equal blocks,
    different ids differ at their first token, and the tree of the prompts is the tree
    of the hash chains. Memory is 4 bytes per prompt token.

    Parameters
    ----------
    path : path
        The trace file (UTF-8 JSON lines).
    block_size : int, default 512
        Tokens per hash id (Mooncake's traces use 512).
    time_scale : float, default 1.0
        A request arrives at ``(timestamp - first timestamp) / 1000 * time_scale``
        seconds: ``1`` replays the trace at its own pace, ``0.5`` twice as fast,
        ``0`` all at once.
    limit : int, optional
        Read only the first ``limit`` records.

    Returns
    -------
    Workload
        Named ``"trace"``, requests sorted by timestamp (ties in file order);
        ``group`` is None.

    Raises
    ------
    DataNotFoundError
        The file does not exist.
    WorkloadError
        ``path:line: ...`` for the first bad line (not JSON, a missing or mistyped
        field, lengths that disagree with ``hash_ids``). A bad line is never skipped:
        a user's trace should replay exactly or not at all.

    Examples
    --------
    >>> import json, tempfile
    >>> lines = [{"timestamp": 0, "input_length": 5, "output_length": 2, "hash_ids": [7, 8]},
    ...          {"timestamp": 250, "input_length": 6, "output_length": 2, "hash_ids": [7, 9]}]
    >>> with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
    ...     f.write("\\n".join(json.dumps(x) for x in lines)) and None
    >>> w = trace(f.name, block_size=4)
    >>> [r.tokens.tolist() for r in w], w.arrivals.tolist()
    ([[0, 0, 0, 0, 1], [0, 0, 0, 0, 2, 2]], [0.0, 0.25])
    >>> import os; os.unlink(f.name)
    """
    file = Path(path)
    size = check_int("block_size", block_size, 1)
    scale = float(time_scale)
    if not (math.isfinite(scale) and scale >= 0):
        msg = f"time_scale must be finite and >= 0, got {time_scale!r}"
        raise InvalidInputError(msg)
    most = None if limit is None else check_int("limit", limit, 0)
    try:
        handle = file.open("rb")
    except FileNotFoundError:
        msg = f"trace file {file} does not exist"
        raise DataNotFoundError(msg) from None
    except OSError as exc:
        msg = f"trace file {file} cannot be read: {exc.strerror or exc}"
        raise DataNotFoundError(msg) from None

    records: list[TraceRecord] = []
    with handle:
        for number, raw in enumerate(handle, start=1):
            if most is not None and len(records) >= most:
                break
            if not raw.strip():
                continue
            try:
                record = _DECODER.decode(raw)
            except msgspec.DecodeError as exc:
                msg = f"{file}:{number}: {exc}"
                raise WorkloadError(msg) from None
            problem = _check(record, size)
            if problem is not None:
                msg = f"{file}:{number}: {problem}"
                raise WorkloadError(msg)
            records.append(record)
    params: dict[str, object] = {"block_size": size, "time_scale": scale, "limit": most}
    return from_records(records, block_size=size, time_scale=scale, source=str(file), params=params)


def from_records(
    lines: list[TraceRecord],
    *,
    block_size: int,
    time_scale: float = 1.0,
    source: str,
    params: dict[str, object],
    name: str = "trace",
    seed: int | None = None,
) -> Workload:
    """The workload of trace lines already checked (``trace``'s rules for tokens and times)."""
    size = block_size
    scale = time_scale
    dense: dict[int, int] = {}
    records: list[tuple[float, int, list[int], int]] = []  # timestamp, length, blocks, output
    for record in lines:
        blocks = [dense.setdefault(h, len(dense)) for h in record.hash_ids]
        records.append((record.timestamp, record.input_length, blocks, record.output_length))
    if len(dense) > 2**32:
        msg = f"{source}: more than 2**32 distinct hash ids cannot be told apart by token ids"
        raise WorkloadError(msg)

    order = sorted(range(len(records)), key=lambda k: records[k][0])  # stable
    first = records[order[0]][0] if records else 0.0
    lengths = np.array([records[k][1] for k in order], dtype=np.int64)
    starts = np.concatenate(([0], np.cumsum(lengths)))
    buffer = np.empty(int(starts[-1]), dtype=np.uint32)
    requests = []
    for position, k in enumerate(order):
        timestamp, length, blocks, output = records[k]
        at = int(starts[position])
        buffer[at : at + length] = np.repeat(np.asarray(blocks, dtype=np.uint32), size)[:length]
        requests.append((position, at, length, (timestamp - first) / 1000.0 * scale, output))
    frozen_tokens(buffer)
    built = [
        Request(position, buffer[at : at + length], arrival, output)
        for position, at, length, arrival, output in requests
    ]
    metadata = {
        "source": source,
        "tokenizer": None,
        "seed": seed,
        "params": params,
        "distinct_blocks": len(dense),
    }
    return Workload(name, built, metadata)
