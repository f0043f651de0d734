"""The console table of simulated runs: every value whole, never cut to fit.

Two views of the same summaries (:func:`radixmeta.sim.metrics.summarise`):

- :func:`table_lines`, one row per run with the chosen columns (all by default),
  as plain aligned text or as a Markdown table. Nothing is shortened: a column is
  as wide as its widest cell. This is what ``radixmeta simulate`` prints when
  stdout is not a terminal, and with ``--wide``, ``--columns`` or ``--format``.
- :func:`fitted_lines`, the terminal view, at most ``width`` (80) characters a
  line: runs grouped under a caption naming their cell (workers, capacity,
  consistency, load), a column whose value is the same in every run printed once
  under the table, and the remaining columns in :data:`DEFAULT_COLUMNS`' order of
  priority as long as they fit; the ones left out are named, so a user knows
  ``--wide`` or ``--columns`` shows them.

A value a summary lacks (a key an older or a newer simulator does not write) or
that is undefined (a percentile of no completed request) prints as ``-``, never
as a made-up 0. Capacities print as they are written on the command line
(:func:`format_capacity`: ``8k``, ``1.5m``, ``inf``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixmeta.errors import InvalidInputError

__all__ = [
    "AXES",
    "COLUMNS",
    "DEFAULT_COLUMNS",
    "FORMATS",
    "Column",
    "cell_key",
    "cell_label",
    "fitted_lines",
    "format_capacity",
    "print_table",
    "resolve_columns",
    "table_lines",
]

#: Table formats: ``auto`` is the fitted view on a terminal and ``plain`` elsewhere.
FORMATS = ("auto", "plain", "markdown")

_GAP = "  "


def format_capacity(capacity: int | None) -> str:
    """A per-worker capacity as the command line writes it.

    ``None`` (unbounded) is ``inf``; whole millions and thousands take ``m`` and ``k``
    with up to two and one decimals (``1m``, ``1.5m``, ``1.25m``, ``200k``, ``8.5k``);
    anything else is the plain number (``8192``). The result always parses back to
    the same number with :func:`radixmeta.sim.commands.parse_capacity`, so it has no
    thousands separator (``--capacity`` lists are comma-separated).

    >>> [format_capacity(c) for c in (None, 1_000_000, 1_500_000, 200_000, 8_192)]
    ['inf', '1m', '1.5m', '200k', '8192']
    """
    if capacity is None:
        return "inf"
    # Integer arithmetic, not ``f"{x:g}"``: ``g`` keeps six significant digits, so
    # 170,270,100 would print as 170270k and parse back 100 tokens short.
    if capacity >= 1_000_000 and capacity % 10_000 == 0:
        return _scaled(capacity, 1_000_000, 2) + "m"
    if capacity >= 1_000 and capacity % 100 == 0:
        return _scaled(capacity, 1_000, 1) + "k"
    return str(capacity)


def _scaled(value: int, unit: int, decimals: int) -> str:
    """``value / unit`` written exactly with at most ``decimals`` decimals, no trailing 0."""
    whole, rest = divmod(value, unit)
    fraction = str(rest * 10**decimals // unit).rjust(decimals, "0").rstrip("0")
    return f"{whole}.{fraction}" if fraction else str(whole)


def _get(summary: Mapping[str, Any], *path: str) -> Any:
    """The value at ``path`` in nested dicts, or None where a key is absent."""
    value: Any = summary
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def _missing(x: Any) -> bool:
    return x is None or (isinstance(x, float) and not math.isfinite(x))


def _pct(x: Any) -> str:
    return "-" if _missing(x) else f"{x:.1%}"


def _sig3(x: float) -> str:
    """Three significant digits, trailing zeros kept (``13.0``, ``0.412``); commas past 100."""
    if x == 0:
        return "0"
    if abs(x) >= 100:
        return f"{x:,.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    if abs(x) >= 1:
        return f"{x:.2f}"
    return f"{x:.3g}"


def _seconds(x: Any) -> str:
    return "-" if _missing(x) else f"{_sig3(x)} s"


def _rate(x: Any) -> str:
    return "-" if _missing(x) else _sig3(x)


def _count(x: Any) -> str:
    return "-" if _missing(x) else f"{int(x):,}"


def _ratio(x: Any) -> str:
    return "-" if _missing(x) else f"{x:.2f}"


def _times(x: Any) -> str:
    return "-" if _missing(x) else f"{x:.2f}x"


def _micros(x: Any) -> str:
    return "-" if _missing(x) else f"{x:.1f}"


def _load(x: Any) -> str:
    return "-" if _missing(x) else f"{x:g}"


def _points(x: Any) -> str:
    return "-" if _missing(x) else f"{x * 100:+.1f} pt"


def _text(x: Any) -> str:
    return "-" if x is None else str(x)


@dataclass(frozen=True)
class Column:
    """One column of the table.

    Attributes
    ----------
    key : str
        Its name for ``--columns``.
    header : str
        What the table's header shows.
    path : tuple of str
        Where the value is in a summary (nested keys).
    render : callable
        The value to the cell's text (``-`` for an absent or undefined value).
    meaning : str
        One line for the docs and ``--help``.
    left : bool
        Left-aligned (names); numbers are right-aligned.
    """

    key: str
    header: str
    path: tuple[str, ...]
    render: Callable[[Any], str]
    meaning: str
    left: bool = False

    def cell(self, summary: Mapping[str, Any]) -> str:
        """This column's text for one run."""
        return self.render(_get(summary, *self.path))


def _col(
    key: str, header: str, path: str, render: Callable[[Any], str], meaning: str, **kw: Any
) -> Column:
    return Column(key, header, tuple(path.split(".")), render, meaning, **kw)


#: Every column, in the order of the wide table.
COLUMNS: tuple[Column, ...] = (
    _col("policy", "policy", "policy", _text, "the router's policy", left=True),
    _col("workers", "workers", "workers_count", _count, "data-parallel workers"),
    _col("capacity", "capacity", "capacity", format_capacity, "tokens per worker (inf: unbounded)"),
    _col(
        "consistency",
        "consistency",
        "consistency",
        _text,
        "how records reach the router",
        left=True,
    ),
    _col("load", "load", "load", _load, "offered work over the fleet's capacity (--load)"),
    _col("requests", "requests", "requests", _count, "requests in the workload"),
    _col("completed", "completed", "completed", _count, "requests that finished"),
    _col("hit_rate", "hit", "hit_rate", _pct, "prompt tokens the workers' caches matched"),
    _col("optimal", "H*", "optimal_hit_rate", _pct, "the workload's optimal hit rate"),
    _col("estimated", "est.", "estimated_hit_rate", _pct, "the hit rate the router expected"),
    _col(
        "est_error",
        "est. err",
        "estimate_error",
        _points,
        "the router's estimate less the hit rate, in points",
    ),
    _col("rps", "req/s", "throughput_rps", _rate, "completed requests per second"),
    _col("tps", "tok/s", "throughput_tps", _rate, "prompt and output tokens per second"),
    _col("ttft_mean", "TTFT mean", "ttft.mean", _seconds, "time to first token, mean"),
    _col("ttft_p50", "TTFT p50", "ttft.p50", _seconds, "time to first token, median"),
    _col("ttft_p90", "TTFT p90", "ttft.p90", _seconds, "time to first token, 90th percentile"),
    _col("ttft_p99", "TTFT p99", "ttft.p99", _seconds, "time to first token, 99th percentile"),
    _col("latency_p50", "e2e p50", "latency.p50", _seconds, "arrival to last token, median"),
    _col("latency_p99", "e2e p99", "latency.p99", _seconds, "arrival to last token, p99"),
    _col("queue_p50", "queue p50", "queue_wait.p50", _seconds, "arrival to admission, median"),
    _col("queue_p90", "queue p90", "queue_wait.p90", _seconds, "arrival to admission, p90"),
    _col("queue_p99", "queue p99", "queue_wait.p99", _seconds, "arrival to admission, p99"),
    _col("imbalance", "imbal.", "imbalance", _ratio, "max over mean of workers' prefill time"),
    _col("scaling", "scaling", "scaling", _times, "throughput over one worker's"),
    _col("rejected", "rejected", "rejected", _count, "requests refused (longer than the context)"),
    _col("retracted", "retracted", "retracted", _count, "running requests retracted for memory"),
    _col("requeued", "requeued", "requeued", _count, "retracted requests queued again"),
    _col(
        "admission_refused",
        "adm. refused",
        "admission_refused",
        _count,
        "admissions refused for lack of KV memory",
    ),
    _col(
        "insert_refused",
        "ins. refused",
        "insert_refused",
        _count,
        "prompts not cached: no room beside locked pages",
    ),
    _col("kv_peak", "KV peak", "kv_peak", _pct, "largest share of a worker's KV pool in use"),
    _col("lag_mean", "lag mean", "event_lag.mean", _seconds, "record to replay, mean"),
    _col("lag_p99", "lag p99", "event_lag.p99", _seconds, "record to replay, p99"),
    _col("lag_max", "lag max", "event_lag.max", _seconds, "record to replay, max"),
    _col(
        "router_us",
        "router us",
        "timing.router_us_per_request",
        _micros,
        "real microseconds of routing per request",
    ),
)

_BY_KEY = {c.key: c for c in COLUMNS}

#: The axes of a sweep: a run's cell is its value of each.
AXES = ("workers", "capacity", "consistency", "load")

#: The terminal view's columns, most needed first: what a user comparing policies
#: reads (hit rate, TTFT, throughput, balance, queueing), then what explains them
#: (requests refused, retracted, not cached), then the rest.
DEFAULT_COLUMNS = (
    "policy",
    "hit_rate",
    "ttft_p50",
    "ttft_p99",
    "rps",
    "imbalance",
    "queue_p99",
    "rejected",
    "retracted",
    "insert_refused",
    "estimated",
    "admission_refused",
    "requeued",
    "kv_peak",
    "lag_p99",
    "scaling",
    "completed",
)


def resolve_columns(text: str | Sequence[str] | None) -> list[Column]:
    """Columns by key (``"policy,hit_rate"`` or a list); None or ``all`` is every column.

    Raises
    ------
    InvalidInputError
        On an unknown key, naming it and the known ones.
    """
    if text is None:
        return list(COLUMNS)
    keys = [k.strip() for k in text.split(",")] if isinstance(text, str) else list(text)
    keys = [k for k in keys if k]
    if keys == ["all"]:
        return list(COLUMNS)
    unknown = [k for k in keys if k not in _BY_KEY]
    if unknown or not keys:
        what = f"unknown column {unknown[0]!r}" if unknown else "no column named"
        msg = f"{what}: --columns takes 'all' or some of {', '.join(_BY_KEY)}"
        raise InvalidInputError(msg)
    return [_BY_KEY[k] for k in keys]


def cell_key(summary: Mapping[str, Any]) -> tuple[Any, ...]:
    """The run's cell: its workers, capacity, consistency and load (None if absent)."""
    return tuple(_get(summary, *_BY_KEY[a].path) for a in AXES)


def cell_label(summary: Mapping[str, Any]) -> str:
    """The cell in words: ``8 workers, 1m tokens each, idle`` (``, load 0.8`` where set).

    An unbounded capacity reads ``unbounded`` (``4 workers, unbounded, idle``).
    """
    workers, capacity, consistency, load = cell_key(summary)
    room = "unbounded" if capacity is None else f"{format_capacity(capacity)} tokens each"
    text = f"{workers} worker{'s' if workers != 1 else ''}, {room}, {consistency}"
    if load is not None:
        text += f", load {load:g}"
    return text


def _align(cells: Sequence[str], widths: Sequence[int], columns: Sequence[Column]) -> str:
    return _GAP.join(
        c.ljust(w) if col.left else c.rjust(w)
        for c, w, col in zip(cells, widths, columns, strict=True)
    ).rstrip()


def _plain(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max([len(col.header), *(len(r[i]) for r in rows)]) for i, col in enumerate(columns)]
    header = _align([c.header for c in columns], widths, columns)
    rule = _GAP.join("-" * w for w in widths)
    return [header, rule, *(_align(r, widths, columns) for r in rows)]


def _markdown(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> list[str]:
    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join(":---" if c.left else "---:" for c in columns) + "|"
    return [line([c.header for c in columns]), rule, *(line(r) for r in rows)]


def table_lines(
    summaries: Sequence[Mapping[str, Any]],
    columns: str | Sequence[str] | None = None,
    fmt: str = "plain",
) -> list[str]:
    """One row per run with every value whole: plain aligned text or Markdown.

    Parameters
    ----------
    summaries : sequence of dict
        Run summaries.
    columns : str or sequence of str, optional
        Column keys (:data:`COLUMNS`); default every column.
    fmt : {"plain", "markdown"}
        Plain text (columns two spaces apart, a rule under the header) or a
        Markdown pipe table.

    Returns
    -------
    list of str
        The lines, without newlines. Complexity: O(runs x columns).
    """
    if fmt not in ("plain", "markdown"):
        msg = f"table format must be 'plain' or 'markdown', got {fmt!r}"
        raise InvalidInputError(msg)
    chosen = resolve_columns(columns)
    rows = [[c.cell(s) for c in chosen] for s in summaries]
    return _markdown(chosen, rows) if fmt == "markdown" else _plain(chosen, rows)


def _width(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> int:
    widths = [max([len(c.header), *(len(r[i]) for r in rows)]) for i, c in enumerate(columns)]
    return sum(widths) + len(_GAP) * (len(widths) - 1)


def fitted_lines(summaries: Sequence[Mapping[str, Any]], width: int = 80) -> list[str]:
    """The terminal view: at most ``width`` characters a line where the values allow it.

    Runs are grouped by cell under a caption (:func:`cell_label`). Of
    :data:`DEFAULT_COLUMNS`, a column no run has a value for is left out, a
    column whose text is the same in every run (of two or more) is printed once
    below the table (``in every run: rejected 0``);
    the others are taken in order while they fit, and those that do not are named
    in a last line. ``policy`` is always shown, so a policy name longer than
    ``width`` is the only way past it.

    Complexity: O(runs x columns).
    """
    candidates = [_BY_KEY[k] for k in DEFAULT_COLUMNS]
    texts = {c.key: [c.cell(s) for s in summaries] for c in candidates}
    # A column no run has a value for (a key this simulator does not write) says nothing.
    candidates = [c for c in candidates if c.key == "policy" or set(texts[c.key]) != {"-"}]
    constant = [
        c
        for c in candidates
        if c.key != "policy" and len(summaries) > 1 and len(set(texts[c.key])) == 1
    ]
    varying = [c for c in candidates if c not in constant]
    shown: list[Column] = []
    left_out: list[Column] = []
    for c in varying:
        trial = [*shown, c]
        rows = [[texts[x.key][i] for x in trial] for i in range(len(summaries))]
        if c.key == "policy" or _width(trial, rows) <= width:
            shown = trial
        else:
            left_out.append(c)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, s in enumerate(summaries):
        groups.setdefault(cell_key(s), []).append(i)
    rows = [[texts[c.key][i] for c in shown] for i in range(len(summaries))]
    widths = [max([len(c.header), *(len(r[j]) for r in rows)]) for j, c in enumerate(shown)]
    lines = [
        _align([c.header for c in shown], widths, shown),
        _GAP.join("-" * w for w in widths),
    ]
    for members in groups.values():
        lines.append(cell_label(summaries[members[0]]) + ":")
        lines.extend(_align(rows[i], widths, shown) for i in members)
    if constant:
        lines.extend(
            _wrap("in every run: ", [f"{c.header} {texts[c.key][0]}" for c in constant], width)
        )
    if left_out:
        names = [c.key for c in left_out]
        lines.extend(_wrap("not shown (--wide or --columns): ", names, width))
    return lines


def _wrap(lead: str, items: Sequence[str], width: int) -> list[str]:
    """``lead`` then the items, comma-separated, broken between items to fit ``width``."""
    lines: list[str] = []
    line = lead
    for k, item in enumerate(items):
        piece = item + ("," if k < len(items) - 1 else "")
        if line.strip() and len(line) + len(piece) > width and line != lead:
            lines.append(line.rstrip())
            line = "  "
        line += piece + " "
    lines.append(line.rstrip())
    return lines


def print_table(
    summaries: Sequence[Mapping[str, Any]],
    title: str = "",
    console: Any = None,
    *,
    columns: str | Sequence[str] | None = None,
    wide: bool = False,
    fmt: str = "auto",
) -> None:
    """Print the runs' table to ``console`` (a rich Console; stdout by default).

    ``fmt="auto"`` prints :func:`fitted_lines` (80 columns) on a terminal unless
    ``columns`` or ``wide`` ask for more, and :func:`table_lines` with every
    column (or ``columns``) elsewhere; ``"plain"`` and ``"markdown"`` always
    print :func:`table_lines`. Lines are written as they are: never wrapped,
    never cut.
    """
    from rich.console import Console

    if fmt not in FORMATS:
        msg = f"--format takes one of {', '.join(FORMATS)}, got {fmt!r}"
        raise InvalidInputError(msg)
    console = console or Console()
    if fmt == "auto" and console.is_terminal and columns is None and not wide:
        lines = fitted_lines(summaries, min(80, console.width))
    else:
        lines = table_lines(summaries, columns, "markdown" if fmt == "markdown" else "plain")
    if title:
        console.out(title, highlight=False)
    for line in lines:
        console.out(line, highlight=False)
