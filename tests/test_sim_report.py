"""The console table of ``radixmeta simulate``: every value whole, 80 columns on a terminal.

Summaries are built by hand with every key the simulator writes (and those the KV
model adds: ``rejected``, ``retracted``, ``requeued``, ``admission_refused``,
``queue_wait``, ``kv_peak``, ``event_lag.p99``), so each column is checked against
the value it must show; the console script is run piped and on a real pseudo
terminal.
"""

from __future__ import annotations

import io
import json
import math
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from radixmeta.errors import InvalidInputError
from radixmeta.sim import report
from radixmeta.sim.commands import parse_capacity

ROOT = Path(__file__).resolve().parent.parent
ELLIPSES = ("…", "...")


def summary(policy: str = "default", **over: Any) -> dict[str, Any]:
    """A run summary with every key the table reads, values distinct enough to find."""
    s: dict[str, Any] = {
        "policy": policy,
        "workers_count": 8,
        "capacity": 1_000_000,
        "consistency": "idle",
        "page_size": 1,
        "requests": 12_031,
        "completed": 11_200,
        "hit_rate": 0.3141,
        "optimal_hit_rate": 0.3736,
        "estimated_hit_rate": 0.5871,
        "throughput_rps": 3.412,
        "throughput_tps": 42_117.0,
        "ttft": {"p50": 5.25, "p90": 88.5, "p99": 395.0},
        "latency": {"p50": 61.0, "p90": 300.0, "p99": 572.0},
        "queue_wait": {"p50": 0.125, "p90": 12.5, "p99": 250.0},
        "imbalance": 1.214,
        "scaling": 7.5,
        "rejected": 831,
        "retracted": 1_207,
        "requeued": 1_190,
        "admission_refused": 20_455,
        "insert_refused": 7_916,
        "kv_peak": 0.987,
        "event_lag": {"mean": 0.0125, "p99": 0.25, "max": 1.5},
        "timing": {"router_us_per_request": 53.7, "router_share_of_prefill": 0.001},
        "workers": [],
    }
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(s.get(key), dict):
            s[key] = {**s[key], **value}
        else:
            s[key] = value
    return s


def sweep() -> list[dict[str, Any]]:
    """Nine policies on two fleets and three capacities, like the issue's sweep."""
    policies = [
        "cache_aware",
        "default",
        "dynamo_cost",
        "least_loaded",
        "longest_prefix",
        "power_of_two",
        "preble_e2",
        "random",
        "round_robin",
    ]
    out = []
    for k, (workers, capacity) in enumerate(
        [(w, c) for w in (4, 8) for c in (200_000, 1_000_000, None)]
    ):
        for j, p in enumerate(policies):
            n = k * len(policies) + j
            out.append(
                summary(
                    p,
                    workers_count=workers,
                    capacity=capacity,
                    hit_rate=0.05 + n / 100,
                    ttft={"p50": 1.5 + n, "p99": 100.0 + 7 * n},
                    throughput_rps=2.0 + n / 10,
                    imbalance=1.0 + n / 50,
                    queue_wait={"p99": 30.0 + n},
                    rejected=100 + n,
                    retracted=n * 13,
                    insert_refused=1_000 + n * 101,
                    estimated_hit_rate=0.5 + n / 200,
                )
            )
    return out


def cells(line: str) -> list[str]:
    """The cells of a plain table's row (two or more spaces apart)."""
    return re.split(r"\s{2,}", line.strip())


# -- capacities ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("capacity", "text"),
    [
        (None, "inf"),
        (1_000_000, "1m"),
        (1_500_000, "1.5m"),
        (1_250_000, "1.25m"),
        (200_000, "200k"),
        (8_000, "8k"),
        (8_500, "8.5k"),
        (1_234_000, "1234k"),
        (8_192, "8192"),
        (999, "999"),
        # Past six significant digits, where "%g" rounded (found by the property below).
        (170_270_100, "170270.1k"),
        (123_456_780_000, "123456.78m"),
    ],
)
def test_capacities_print_as_the_command_line_writes_them(capacity: int | None, text: str) -> None:
    assert report.format_capacity(capacity) == text
    assert parse_capacity(text) == capacity


@given(
    st.one_of(
        st.none(),
        st.integers(1, 10**12),
        # Multiples of 100 and 10,000, the values written with k and m.
        st.integers(1, 10**10).map(lambda n: n * 100),
        st.integers(1, 10**8).map(lambda n: n * 10_000),
    )
)
def test_a_printed_capacity_parses_back(capacity: int | None) -> None:
    assert parse_capacity(report.format_capacity(capacity)) == capacity


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("abc", "not a number of tokens"),
        ("nan", "not a number of tokens"),
        ("", "not a number of tokens"),
        ("0", "whole number of tokens >= 1"),
        ("-3k", "whole number of tokens >= 1"),
        ("0.5", "whole number of tokens >= 1"),
        ("1.2345k", "whole number of tokens >= 1"),
        ("1e400", "past any pool"),
    ],
)
def test_a_bad_capacity_is_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(InvalidInputError, match=message):
        parse_capacity(text)


def test_capacities_print_short_in_the_table_and_the_captions() -> None:
    runs = [summary(capacity=1_000_000), summary("round_robin", capacity=1_500_000)]
    text = "\n".join(report.table_lines(runs, "policy,capacity"))
    assert " 1m" in text and "1.5m" in text and "1000k" not in text
    assert report.cell_label(runs[0]) == "8 workers, 1m tokens each, idle"
    assert (
        report.cell_label(summary(capacity=None, load=0.8))
        == "8 workers, unbounded, idle, load 0.8"
    )


# -- the whole table (piped) -----------------------------------------------------------------
def test_the_plain_table_shows_every_column_and_every_value_whole() -> None:
    runs = sweep()
    lines = report.table_lines(runs)
    header, rule, *rows = lines
    assert len(rows) == len(runs)
    assert cells(header) == [c.header for c in report.COLUMNS]
    assert len(cells(rule)) == len(report.COLUMNS)
    for line, s in zip(rows, runs, strict=True):
        assert not any(e in line for e in ELLIPSES)
        assert cells(line) == [c.cell(s) for c in report.COLUMNS]
    # The counters and the queueing are there, at their exact values.
    first = dict(zip(cells(header), cells(rows[0]), strict=True))
    assert first["rejected"] == "100" and first["ins. refused"] == "1,000"
    assert first["retracted"] == "0" and first["queue p99"] == "30.0 s"
    assert first["adm. refused"] == "20,455" and first["KV peak"] == "98.7%"
    assert first["lag p99"] == "0.25 s" and first["capacity"] == "200k"


def test_absent_and_undefined_values_print_as_a_dash_never_a_zero() -> None:
    s = summary(ttft={"p50": math.nan, "p90": math.nan, "p99": math.inf}, scaling=None)
    for key in ("rejected", "retracted", "requeued", "admission_refused", "kv_peak", "queue_wait"):
        del s[key]
    del s["event_lag"]["p99"]
    row = dict(
        zip(cells(report.table_lines([s])[0]), cells(report.table_lines([s])[2]), strict=True)
    )
    for header in (
        "TTFT p50",
        "TTFT p99",
        "scaling",
        "rejected",
        "retracted",
        "requeued",
        "adm. refused",
        "KV peak",
        "queue p50",
        "queue p99",
        "lag p99",
        "load",
    ):
        assert row[header] == "-", header
    assert row["ins. refused"] == "7,916"


def test_the_markdown_table_has_one_cell_per_column_in_every_row() -> None:
    runs = sweep()[:3]
    header, rule, *rows = report.table_lines(runs, "policy,capacity,hit_rate,ttft_p99", "markdown")
    assert header == "| policy | capacity | hit | TTFT p99 |"
    assert rule == "|:---|---:|---:|---:|"
    assert rows[0] == "| cache_aware | 200k | 5.0% | 100 s |"
    assert all(r.count("|") == 5 for r in rows)


def test_unknown_columns_and_formats_are_refused() -> None:
    with pytest.raises(InvalidInputError, match=r"unknown column 'hits'.*hit_rate"):
        report.resolve_columns("policy,hits")
    with pytest.raises(InvalidInputError, match="no column named"):
        report.resolve_columns(" , ")
    with pytest.raises(InvalidInputError, match="'plain' or 'markdown'"):
        report.table_lines([summary()], fmt="html")
    with pytest.raises(InvalidInputError, match="--format takes one of auto, plain, markdown"):
        report.print_table([summary()], fmt="csv", console=Console(file=io.StringIO()))


# -- the terminal view -----------------------------------------------------------------------
def test_the_terminal_view_fits_80_columns_and_cuts_no_value() -> None:
    runs = sweep()
    lines = report.fitted_lines(runs, 80)
    assert max(len(line) for line in lines) <= 80
    assert not any(e in line for line in lines for e in ELLIPSES)
    header = cells(lines[0])
    assert header[:6] == ["policy", "hit", "TTFT p50", "TTFT p99", "req/s", "imbal."]
    by_header = {c.header: c for c in report.COLUMNS}
    shown = [by_header[h] for h in header]
    # Every run appears under its cell's caption with each shown value whole.
    captions = [line for line in lines if line.endswith(":")]
    assert captions == [
        f"{w} workers, {room}, idle:"
        for w in (4, 8)
        for room in ("200k tokens each", "1m tokens each", "unbounded")
    ]
    rows = [line for line in lines[2:] if cells(line)[0] in {s["policy"] for s in runs}]
    assert len(rows) == len(runs)
    for line, s in zip(rows, runs, strict=True):
        assert cells(line) == [c.cell(s) for c in shown]
    # What is the same everywhere is said once; what does not fit is named.
    tail = " ".join(line for line in lines if not line.endswith(":"))
    assert "in every run: " in tail and "completed 11,200" in tail
    assert "not shown (--wide or --columns): " in tail
    for c in report.DEFAULT_COLUMNS:
        col = next(x for x in report.COLUMNS if x.key == c)
        assert col in shown or c in tail or col.header in tail, c


def test_the_terminal_view_shows_the_counters_when_they_differ() -> None:
    runs = [summary("default", retracted=0), summary("round_robin", retracted=12)]
    lines = report.fitted_lines(runs, 80)
    header = cells(lines[0])
    assert "retracted" in header and "rejected" not in header  # equal in both: below
    below = " ".join(lines[lines.index("round_robin         12") + 1 :])
    assert below.startswith("in every run: ") and "rejected 831," in below
    assert max(len(line) for line in lines) <= 80


def test_a_narrower_terminal_gets_fewer_columns_not_cut_ones() -> None:
    runs = sweep()
    lines = report.fitted_lines(runs, 50)
    assert max(len(line) for line in lines) <= 50
    assert cells(lines[0])[:2] == ["policy", "hit"]


def test_print_table_chooses_the_view_by_where_it_prints() -> None:
    runs = sweep()
    terminal = io.StringIO()
    report.print_table(runs, "t", Console(file=terminal, force_terminal=True, width=200))
    assert max(len(line) for line in terminal.getvalue().splitlines()) <= 80
    piped = io.StringIO()
    report.print_table(runs, "t", Console(file=piped, width=80))
    assert cells(piped.getvalue().splitlines()[1]) == [c.header for c in report.COLUMNS]
    wide = io.StringIO()
    report.print_table(runs, "", Console(file=wide, force_terminal=True, width=80), wide=True)
    assert cells(wide.getvalue().splitlines()[0]) == [c.header for c in report.COLUMNS]
    chosen = io.StringIO()
    report.print_table(
        runs, "", Console(file=chosen, force_terminal=True), columns="policy,kv_peak"
    )
    assert cells(chosen.getvalue().splitlines()[0]) == ["policy", "KV peak"]


# -- the console script ----------------------------------------------------------------------
SIMULATE = [
    sys.executable, "-m", "radixmeta", "simulate", "--limit", "48", "--workers", "2",
    "--policies", "default,round_robin,longest_prefix", "--capacity", "4k,1m",
]  # fmt: skip


@pytest.mark.timeout(120)
def test_simulate_piped_prints_every_column_of_every_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*SIMULATE, "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=100,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "80"},
    )
    assert proc.returncode == 0, proc.stderr
    assert not any(e in proc.stdout for e in ELLIPSES)
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    lines = proc.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    assert cells(lines[start]) == [c.header for c in report.COLUMNS]
    rows = lines[start + 2 : start + 2 + len(runs)]
    for line, s in zip(rows, runs, strict=True):
        assert cells(line) == [c.cell(s) for c in report.COLUMNS]
    assert {cells(r)[2] for r in rows} == {"4k", "1m"}


def _run_on_a_terminal(argv: list[str], timeout: float = 100) -> tuple[int, str]:
    """Run ``argv`` with stdout and stderr on a new pseudo terminal; its exit code and output."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, stdout=slave, stderr=slave, cwd=ROOT, env={**os.environ, "COLUMNS": "200"}
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    data = os.read(master, 65536)
                except OSError:  # the child closed the terminal
                    break
                if not data:
                    break
                chunks.append(data)
            elif proc.poll() is not None:
                break
        rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
        os.close(master)
    text = b"".join(chunks).decode(errors="replace")
    return rc, re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text).replace("\r", "")


@pytest.mark.timeout(120)
def test_simulate_on_a_terminal_prints_80_columns() -> None:
    rc, text = _run_on_a_terminal(SIMULATE)
    assert rc == 0, text
    start = text.index("policy ")
    table = text[start:].splitlines()
    body = table[: next(i for i, line in enumerate(table) if line.startswith("done in"))]
    assert max(len(line) for line in body) <= 80
    assert not any(e in text for e in ELLIPSES)
    assert cells(body[0])[:2] == ["policy", "hit"]
    assert "2 workers, 4k tokens each, idle:" in body and "2 workers, 1m tokens each, idle:" in body


def test_the_docs_explain_every_column() -> None:
    text = (ROOT / "docs" / "simulator.md").read_text()
    section = text[text.index("## Output") : text.index("## Workloads")]
    missing = [c.key for c in report.COLUMNS if f"`{c.key}`" not in section]
    assert not missing
