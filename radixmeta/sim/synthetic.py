"""Seeded traces in the Mooncake format, with the shape of production traffic.

A held-out check for routing policies needs traces nobody tuned on. This
generator writes them in the format of the Mooncake FAST'25 traces (one JSON
object a line: ``timestamp`` in ms, ``input_length``, ``output_length``,
``hash_ids``, one id per 512-token block), from a :class:`TraceShape` and a seed:

- **Shared system prompts.** Each session starts with one of ``system_prompts``
  system prompts, drawn with Zipf popularity (exponent ``system_skew``), each
  ``system_tokens`` long (log-uniform between the bounds).
- **Multi-turn sessions.** A session has a geometric number of turns (mean
  ``turns``, at most ``max_turns``); each turn resends the whole conversation: the
  previous prompt, its answer, and a new user message (``user_tokens``, log-normal).
  Turns come ``think`` seconds apart on average (exponential), open loop, as the
  ``sharegpt`` workload's do.
- **Long prompts.** A share ``document_share`` of sessions opens with a document
  (``document_tokens``, log-uniform), which sessions reuse with probability
  ``document_reuse`` (several questions about one document share it).
- **Bursts.** Sessions start as a Poisson process over ``duration`` seconds; a
  share ``burst_share`` of them start in bursts of ``burst_size`` on average at one
  instant (an agent's fan-out, a batch job), and timestamps are cut to ``tick``
  seconds, so requests arrive together as in the Mooncake trace (``0``: to the ms).
- **Answers.** ``answer_tokens`` (log-normal median, at most 4,096) is the
  output length; the answer becomes part of the next turn's prompt.

Blocks are named as an engine hashes them: the id of a block is the id of the
prompt's content up to its end, so two prompts share a block exactly when they
agree on every token up to it. A prompt's last block is usually partial; the
next turn, whose content runs past it, names that block anew once it is full
(what the Mooncake conversation trace shows: a turn shares the previous turn's
prompt but its last block). Everything is drawn from one
``numpy.random.Generator(PCG64(seed))``; the same shape and seed give the same
lines on every machine (for one numpy version).

The shapes in :data:`TRACE_SHAPES` are not fitted to any trace: they are
plausible production mixes (a chat assistant, tool-using agents, long-document
questions, a bursty front end) for checking that a rule generalises.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

import numpy as np

from radixmeta.errors import InvalidInputError

__all__ = ["TRACE_SHAPES", "TraceShape", "synthetic_records", "trace_shape", "write_trace"]

_MAX_ANSWER = 4096


@dataclass(frozen=True)
class TraceShape:
    """The traffic a synthetic trace is drawn from (module docstring).

    Attributes
    ----------
    name : str
        The shape's name, recorded in the workload's metadata.
    sessions : int
        Conversations in the trace.
    duration : float
        Seconds over which the sessions start.
    system_prompts : int
        Distinct system prompts.
    system_skew : float
        Zipf exponent of their popularity (0: uniform).
    system_tokens : tuple of int
        Bounds of a system prompt's length (log-uniform).
    turns : float
        Mean turns per session (geometric, at least 1).
    max_turns : int
        Turns per session at most.
    user_tokens : int
        Median tokens of a user message (log-normal, sigma 1).
    answer_tokens : int
        Median tokens of an answer, the output length (log-normal, sigma 0.8).
    think : float
        Mean seconds between a session's turns (exponential).
    document_share : float
        Share of sessions that open with a document.
    document_tokens : tuple of int
        Bounds of a document's length (log-uniform).
    document_reuse : float
        Chance that a document session asks about a document an earlier one had.
    burst_share : float
        Share of sessions that start in a burst.
    burst_size : float
        Mean sessions of a burst (geometric, at least 2).
    tick : float
        Timestamps are cut to this many seconds (0: milliseconds).
    max_tokens : int
        A session ends before a turn whose prompt would pass this many tokens.
    block_size : int
        Tokens per hash id.
    """

    name: str
    sessions: int
    duration: float
    system_prompts: int
    system_skew: float
    system_tokens: tuple[int, int]
    turns: float
    max_turns: int
    user_tokens: int
    answer_tokens: int
    think: float
    document_share: float
    document_tokens: tuple[int, int]
    document_reuse: float
    burst_share: float
    burst_size: float
    tick: float
    max_tokens: int = 131_072
    block_size: int = 512

    def __post_init__(self) -> None:
        problems = []
        if self.sessions < 1 or self.system_prompts < 1 or self.max_turns < 1:
            problems.append("sessions, system_prompts and max_turns must be >= 1")
        if not (self.duration >= 0 and self.think >= 0 and self.tick >= 0):
            problems.append("duration, think and tick must be >= 0")
        if self.turns < 1 or (self.burst_size < 2 and self.burst_share > 0):
            problems.append("turns must be >= 1 and burst_size >= 2")
        for what in ("document_share", "document_reuse", "burst_share"):
            if not 0.0 <= getattr(self, what) <= 1.0:
                problems.append(f"{what} must be in [0, 1]")
        for what in ("system_tokens", "document_tokens"):
            low, high = getattr(self, what)
            if not 1 <= low <= high:
                problems.append(f"{what} must be two lengths 1 <= low <= high")
        if self.user_tokens < 1 or self.answer_tokens < 1 or self.block_size < 1:
            problems.append("user_tokens, answer_tokens and block_size must be >= 1")
        if problems:
            msg = f"trace shape {self.name!r}: " + "; ".join(problems)
            raise InvalidInputError(msg)


#: Named shapes for held-out checks (not fitted to any trace).
TRACE_SHAPES: MappingProxyType[str, TraceShape] = MappingProxyType(
    {
        # A chat assistant: one dominant system prompt, a few turns, some pasted files.
        "chat": TraceShape(
            name="chat", sessions=1500, duration=1800.0, system_prompts=3, system_skew=1.5,
            system_tokens=(800, 3000), turns=4.0, max_turns=20, user_tokens=150,
            answer_tokens=300, think=40.0, document_share=0.08, document_tokens=(6000, 40_000),
            document_reuse=0.1, burst_share=0.1, burst_size=3.0, tick=1.0,
        ),
        # Tool-using agents: many system prompts with long tool specs, fast loops of
        # long tool outputs and short answers, fan-outs in bursts.
        "agents": TraceShape(
            name="agents", sessions=500, duration=1200.0, system_prompts=12, system_skew=1.1,
            system_tokens=(2000, 9000), turns=7.0, max_turns=30, user_tokens=700,
            answer_tokens=120, think=6.0, document_share=0.02, document_tokens=(4000, 20_000),
            document_reuse=0.0, burst_share=0.35, burst_size=4.0, tick=0.5,
        ),
        # Questions over long documents: few turns, long prompts, documents shared.
        "documents": TraceShape(
            name="documents", sessions=900, duration=2400.0, system_prompts=2,
            system_skew=1.0, system_tokens=(300, 1200), turns=1.8, max_turns=8,
            user_tokens=80, answer_tokens=450, think=90.0, document_share=0.7,
            document_tokens=(8000, 100_000), document_reuse=0.35, burst_share=0.05,
            burst_size=2.5, tick=2.0,
        ),
        # A bursty front end: chat-like sessions arriving in waves, to the millisecond.
        "bursty": TraceShape(
            name="bursty", sessions=1400, duration=1500.0, system_prompts=5, system_skew=0.8,
            system_tokens=(400, 4000), turns=3.0, max_turns=12, user_tokens=250,
            answer_tokens=250, think=20.0, document_share=0.1, document_tokens=(5000, 30_000),
            document_reuse=0.2, burst_share=0.6, burst_size=8.0, tick=0.0,
        ),
    }
)


def trace_shape(shape: str | TraceShape, **changes: Any) -> TraceShape:
    """A shape by name (or as given), with some fields changed.

    Raises
    ------
    InvalidInputError
        An unknown name, an unknown field, or a value out of range.
    """
    if isinstance(shape, str):
        try:
            shape = TRACE_SHAPES[shape]
        except KeyError:
            msg = f"unknown trace shape {shape!r}: expected one of {', '.join(TRACE_SHAPES)}"
            raise InvalidInputError(msg) from None
    unknown = sorted(set(changes) - set(asdict(shape)))
    if unknown:
        msg = f"a trace shape has no field {unknown[0]!r}"
        raise InvalidInputError(msg)
    return replace(shape, **changes) if changes else shape


def _log_uniform(rng: np.random.Generator, bounds: tuple[int, int]) -> int:
    low, high = bounds
    return round(math.exp(rng.uniform(math.log(low), math.log(high))))


def _log_normal(rng: np.random.Generator, median: int, sigma: float) -> int:
    return max(1, round(median * math.exp(rng.normal(0.0, sigma))))


def synthetic_records(shape: str | TraceShape = "chat", *, seed: int = 0) -> list[dict[str, Any]]:
    """The trace's lines as dicts, in timestamp order (ties: session, then turn).

    Parameters
    ----------
    shape : str or TraceShape
        A name of :data:`TRACE_SHAPES`, or a shape.
    seed : int
        Seeds everything the trace draws.

    Examples
    --------
    >>> lines = synthetic_records(trace_shape("chat", sessions=20), seed=1)
    >>> lines[0].keys() == {"timestamp", "input_length", "output_length", "hash_ids"}
    True
    >>> all(len(x["hash_ids"]) == -(-x["input_length"] // 512) for x in lines)
    True
    """
    shape = trace_shape(shape)
    rng = np.random.Generator(np.random.PCG64(seed))
    size = shape.block_size
    ids: dict[tuple[Any, ...], int] = {}

    def block_ids(segments: list[tuple[tuple[Any, ...], int]], length: int) -> list[int]:
        """The id of every block of a prompt: that of its content up to the block's end.

        ``segments`` is the prompt as (content key, tokens) pieces; content shared
        between prompts (a system prompt, a document) has a key of its own, the rest
        a key of the session's, so equal keys at a position mean equal tokens.
        """
        out = []
        ends = [*range(size, length, size), length]
        start = 0
        where = 0  # the segment the next end falls in
        prefix: tuple[Any, ...] = ()
        for end in ends:
            while start + segments[where][1] < end:
                prefix = (*prefix, segments[where][0])
                start += segments[where][1]
                where += 1
            key = (*prefix, segments[where][0], end - start)
            out.append(ids.setdefault(key, len(ids)))
        return out

    ranks = np.arange(1, shape.system_prompts + 1, dtype=np.float64)
    popularity = ranks ** (-shape.system_skew)
    popularity /= popularity.sum()
    systems = [_log_uniform(rng, shape.system_tokens) for _ in range(shape.system_prompts)]
    documents: list[int] = []

    # Session starts: Poisson over the duration, some of them in bursts at one instant.
    starts: list[float] = []
    rate = shape.sessions / shape.duration if shape.duration > 0 else math.inf
    at = 0.0
    while len(starts) < shape.sessions:
        if math.isfinite(rate):
            at += float(rng.exponential(1.0 / rate))
        count = 1
        if rng.random() < shape.burst_share:
            count = 2 + int(rng.geometric(1.0 / (shape.burst_size - 1.0))) - 1
        starts.extend([at] * min(count, shape.sessions - len(starts)))

    lines: list[tuple[int, int, int, dict[str, Any]]] = []
    for session, start in enumerate(starts):
        system = int(rng.choice(shape.system_prompts, p=popularity))
        segments: list[tuple[tuple[Any, ...], int]] = [(("system", system), systems[system])]
        if rng.random() < shape.document_share:
            if documents and rng.random() < shape.document_reuse:
                doc = int(rng.integers(len(documents)))
            else:
                doc = len(documents)
                documents.append(_log_uniform(rng, shape.document_tokens))
            segments.append((("document", system, doc), documents[doc]))
        turns = min(shape.max_turns, int(rng.geometric(1.0 / shape.turns)))
        arrival = start
        for turn in range(turns):
            segments.append((("user", session, turn), _log_normal(rng, shape.user_tokens, 1.0)))
            length = sum(tokens for _, tokens in segments)
            if length > shape.max_tokens:
                break
            answer = min(_MAX_ANSWER, _log_normal(rng, shape.answer_tokens, 0.8))
            stamp = arrival if shape.tick <= 0 else math.floor(arrival / shape.tick) * shape.tick
            millis = round(stamp * 1000.0)
            line = {
                "timestamp": millis,
                "input_length": length,
                "output_length": answer,
                "hash_ids": block_ids(segments, length),
            }
            lines.append((millis, session, turn, line))
            segments.append((("answer", session, turn), answer))
            arrival += float(rng.exponential(shape.think)) if shape.think > 0 else 0.0
    lines.sort(key=lambda item: item[:3])
    return [line for *_, line in lines]


def write_trace(
    path: str | os.PathLike[str], shape: str | TraceShape = "chat", *, seed: int = 0
) -> Path:
    """Write a synthetic trace as JSON lines (the Mooncake format); returns the path."""
    file = Path(path)
    records = synthetic_records(shape, seed=seed)
    with file.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record, separators=(",", ":")))
            out.write("\n")
    return file
