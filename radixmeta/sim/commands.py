"""``radixmeta simulate`` and ``radixmeta reproduce a4|traces``: the simulator on the command line.

The parser lives in :mod:`radixmeta.cli`; these functions take its parsed
arguments, run the sweep with a progress bar, print the comparison table and
write what ``--out`` and ``--trace-out`` ask for.
"""

from __future__ import annotations

import argparse
import decimal
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from radixmeta.errors import DataNotFoundError, InvalidInputError
from radixmeta.policies import names as policy_names
from radixmeta.sim import report
from radixmeta.sim.engine import CONSISTENCIES, SimConfig
from radixmeta.sim.results import ResultsFile, RunRecord
from radixmeta.sim.sweep import grid, run_cells
from radixmeta.sim.worker import BatchLimits

__all__ = [
    "Claim",
    "a4_claims",
    "add_simulate_arguments",
    "add_traces_arguments",
    "load_workload",
    "parse_capacity",
    "reproduce_a4",
    "reproduce_traces",
    "simulate",
]


# The trees count tokens in int64; a bound far below that keeps sums of pools exact.
_MAX_CAPACITY = 2**53


def parse_capacity(text: str, model_tokens: int | None = None) -> int | str | None:
    """A ``--capacity`` value: tokens, unbounded, or the cost model's pool or a multiple of it.

    ``"8k"`` -> 8000, ``"1m"`` -> 1000000, ``"5000"`` -> 5000, ``"inf"`` -> None
    (unbounded: no memory bound at all), ``"model"`` -> ``model_tokens`` (or
    ``"model"`` when not given), ``"0.5x"`` -> half of ``model_tokens``.
    """
    t = text.strip().lower()
    if t in ("inf", "none", "unbounded"):
        return None
    if t == "model":
        return "model" if model_tokens is None else model_tokens
    if t.endswith("x"):
        try:
            times = float(t[:-1])
        except ValueError:
            times = math.nan
        if not (math.isfinite(times) and times > 0):
            msg = f"capacity {text!r}: a multiple of the model's pool is a number > 0, like 0.5x"
            raise InvalidInputError(msg)
        if model_tokens is None:
            msg = f"capacity {text!r} is a multiple of a cost model's pool: name a cost model"
            raise InvalidInputError(msg)
        return max(1, round(model_tokens * times))
    scale = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    number = t[:-1] if scale != 1 else t
    # Decimal, not float: 1234567.8k is 1,234,567,800 tokens exactly, where a float
    # product lands a fraction off and would be refused as not whole.
    try:
        value = decimal.Decimal(number) * scale
    except decimal.InvalidOperation:
        value = decimal.Decimal("nan")
    if not value.is_finite():
        msg = f"capacity {text!r} is not a number of tokens (like 8000, 8k, 1.5m or inf)"
        raise InvalidInputError(msg) from None
    if value > _MAX_CAPACITY:
        msg = f"capacity {text!r} is past any pool ({_MAX_CAPACITY:,} tokens); use inf"
        raise InvalidInputError(msg)
    if value < 1 or value != int(value):
        msg = f"capacity {text!r} must be a whole number of tokens >= 1, or inf"
        raise InvalidInputError(msg)
    return int(value)


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def _policies(text: str) -> list[str]:
    wanted = _list(text)
    if wanted == ["all"]:
        return list(policy_names())
    known = set(policy_names())
    unknown = [p for p in wanted if p not in known]
    if unknown:
        msg = (
            f"unknown policy {unknown[0]!r}: expected 'all' or some of {', '.join(policy_names())}"
        )
        raise InvalidInputError(msg)
    return wanted


def _workers(text: str) -> list[int]:
    try:
        out = [int(x) for x in _list(text)]
    except ValueError:
        msg = f"--workers takes positive integers separated by commas, got {text!r}"
        raise InvalidInputError(msg) from None
    if not out or min(out) < 1:
        msg = f"--workers takes positive integers separated by commas, got {text!r}"
        raise InvalidInputError(msg)
    return out


def _consistencies(text: str) -> list[str]:
    out = _list(text)
    bad = [c for c in out if c not in CONSISTENCIES]
    if bad or not out:
        msg = f"--consistency takes some of {', '.join(CONSISTENCIES)}, got {text!r}"
        raise InvalidInputError(msg)
    return out


def _check_rate(rate: float | None) -> float | None:
    """``--rate``: ``None`` (the workload's own), 0 (all at once), or a finite rate > 0."""
    if rate is None:
        return None
    if not math.isfinite(rate) or rate < 0:
        msg = f"--rate must be a finite number of requests a second >= 0 (0: at once), got {rate}"
        raise InvalidInputError(msg)
    return math.inf if rate == 0 else rate


def load_workload(args: argparse.Namespace) -> Any:
    """The workload the arguments name, only its first ``--limit`` requests.

    Every builder builds only what those need (a trace reads no further; see each
    builder's ``limit``); ``--rate`` stretches a trace to that mean rate (keeping
    its bursts and the requests that arrive together).

    Raises
    ------
    InvalidInputError
        ``--limit`` below 1, a NaN, infinite or negative ``--rate``, or a workload
        without requests.
    """
    from radixmeta.sim import workloads
    from radixmeta.sim.load import scale_to_rate

    if args.limit is not None and args.limit < 1:
        msg = f"--limit must be >= 1 request, got {args.limit}"
        raise InvalidInputError(msg)
    rate = _check_rate(args.rate)
    params: dict[str, Any] = {}
    name = args.workload
    if name == "mmlu":
        if not args.mmlu_dir:
            msg = (
                "--workload mmlu needs --mmlu-dir DIR (a folder of MMLU CSVs, Hugging Face layout)"
            )
            raise InvalidInputError(msg)
        params.update(mmlu_dir=args.mmlu_dir, order=args.order, tokenizer=args.tokenizer)
    elif name == "trace":
        if not args.trace_file:
            msg = "--workload trace needs --trace-file FILE (JSON lines with hash_ids)"
            raise InvalidInputError(msg)
        params.update(
            path=args.trace_file,
            block_size=args.block_size,
            time_scale=args.time_scale,
            limit=args.limit,  # reads no further
        )
    elif name == "sharegpt":
        params.update(path=args.sharegpt_file, tokenizer=args.tokenizer)
    elif name == "synthetic":
        params.update(shape=args.shape, sessions=args.sessions, time_scale=args.time_scale)
    timed = name in ("trace", "synthetic")  # a trace's own times; --rate stretches them
    if rate is not None and not timed:
        params["rate"] = rate
    if name != "trace":
        params["seed"] = args.seed
        params["limit"] = args.limit  # every builder builds only the first N requests
    workload = workloads.load(name, **params)
    if len(workload) == 0:
        msg = f"the {name} workload has no requests: nothing to simulate"
        raise InvalidInputError(msg)
    if rate is not None and timed:
        times, factor = scale_to_rate(list(workload.arrivals), rate)
        requests = [
            workloads.Request(r.request_id, r.tokens, t, r.output_len, r.group)
            for r, t in zip(workload, times, strict=True)
        ]
        workload = workloads.Workload(
            workload.name, requests, {**workload.metadata, "rate": rate, "time_factor": factor}
        )
    return workload


def _base_config(args: argparse.Namespace) -> SimConfig:
    return SimConfig(
        latency=args.latency,
        page_size=args.page_size,
        prefill=args.prefill_model,
        decode=args.decode_model,
        limits=BatchLimits(args.max_running, args.max_prefill_tokens),
        seed=args.seed,
        # reproduce a4 keeps the defaults of these three
        report_interval=getattr(args, "report_interval", 0.1),
        dispatch_time=getattr(args, "dispatch_time", 0.0),
        replay_time=getattr(args, "replay_time", 0.0),
    )


def _capacities(text: str, base: SimConfig) -> list[int | None]:
    """``--capacity``: each value in tokens, ``model`` and ``Nx`` read off the cost model."""
    model = base.cost_model
    tokens = None if model is None else model.kv_tokens
    out: list[int | None] = []
    for item in _list(text):
        value = parse_capacity(item, tokens)
        if isinstance(value, str):
            msg = (
                f"--capacity {item}: the prefill and decode models are not a cost model "
                "(radixmeta.policies.costs.COST_MODELS): give tokens or inf"
            )
            raise InvalidInputError(msg)
        out.append(value)
    if not out:
        msg = f"--capacity takes tokens (8k, 1.5m), inf, model or multiples like 0.5x, not {text!r}"
        raise InvalidInputError(msg)
    return out


def _loads(text: str | None) -> list[float | None]:
    from radixmeta.sim.load import check_load

    if text is None:
        return [None]
    try:
        values: list[float | None] = [check_load(x) for x in _list(text)]
    except InvalidInputError:
        msg = f"--load takes finite numbers > 0 separated by commas (0.5,0.8,0.95), got {text!r}"
        raise InvalidInputError(msg) from None
    if not values:
        msg = f"--load takes numbers > 0 separated by commas, got {text!r}"
        raise InvalidInputError(msg)
    return values


def _progress(console: Console) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def _run(
    workload: Any,
    cells: list[SimConfig],
    jobs: int,
    console: Console,
    label: str,
    results: ResultsFile | None = None,
    first: int = 0,
    arrivals: list[float] | None = None,
    extra: Mapping[str, Any] | None = None,
) -> list[RunRecord]:
    """Run ``cells``; each run's summary goes to ``results`` (as run ``first + i``) as it ends.

    ``arrivals`` replaces the workload's own (a ``--load`` re-timing) and ``extra``
    is added to every summary before it is kept or written. Only a
    :class:`RunRecord` of each run is kept; the whole SimRun too for a cell made
    with ``trace=True`` (the run a Chrome trace is written from).
    """
    tokens = [r.tokens for r in workload]
    arrivals = list(workload.arrivals) if arrivals is None else arrivals
    outputs = list(workload.output_lens)
    optimal = workload.optimal_hit_rate(cells[0].page_size)
    records: dict[int, RunRecord] = {}
    with _progress(console) as bar:
        overall = bar.add_task(f"{label}: runs", total=len(cells))
        requests = bar.add_task("requests of the current run", total=len(workload))

        def run_done(i: int, run: Any, summary: dict[str, Any]) -> None:
            if extra:
                summary.update(extra)
            records[i] = RunRecord.of(run, summary, keep_run=run.config.trace)
            if results is not None:
                results.add(first + i, summary)
            bar.advance(overall)
            bar.reset(requests)

        run_cells(
            tokens,
            arrivals,
            outputs,
            cells,
            optimal=optimal,
            jobs=jobs,
            on_run=run_done,
            on_progress=lambda k: bar.advance(requests, k),
            keep_runs=False,
        )
    return [records[i] for i in sorted(records)]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def _run_loads(
    workload: Any,
    cells: list[SimConfig],
    loads: list[float | None],
    jobs: int,
    console: Console,
    results: ResultsFile | None = None,
) -> list[RunRecord]:
    """Run every cell at every ``--load``, each (fleet, capacity) re-timed for it.

    Records come back load by load and, within a load, grouped by (fleet,
    capacity); a cell that traces does so at the first load only.
    """
    if loads == [None]:
        return _run(workload, cells, jobs, console, "simulate", results)
    from radixmeta.sim.load import scale_to_load

    tokens = [r.tokens for r in workload]
    outputs = list(workload.output_lens)
    records: list[RunRecord] = []
    for k, load in enumerate(loads):
        assert load is not None
        groups: dict[tuple[int, Any], list[SimConfig]] = {}
        for cell in cells:
            if k and cell.trace:
                cell = replace(cell, trace=False)
            groups.setdefault((cell.workers, cell.capacity), []).append(cell)
        for group in groups.values():
            arrivals, info = scale_to_load(tokens, list(workload.arrivals), outputs, group[0], load)
            label = f"load {load:g}"
            records.extend(
                _run(
                    workload,
                    group,
                    jobs,
                    console,
                    label,
                    results,
                    len(records),
                    arrivals=arrivals,
                    extra={"load": load, "load_calibration": info},
                )
            )
    return records


def _describe(workload: Any) -> dict[str, Any]:
    return {
        "name": workload.name,
        "requests": len(workload),
        "prompt_tokens": int(sum(workload.prompt_lens)),
        "metadata": dict(workload.metadata),
    }


def _print_table(
    args: argparse.Namespace, summaries: Sequence[Mapping[str, Any]], title: str, console: Console
) -> None:
    report.print_table(
        summaries, title, console, columns=args.columns, wide=args.wide, fmt=args.format
    )


def _check_output_options(args: argparse.Namespace) -> None:
    """Refuse a bad --columns before any run, not after a long sweep."""
    if args.columns is not None:
        report.resolve_columns(args.columns)


def simulate(args: argparse.Namespace) -> int:
    """``radixmeta simulate``."""
    console = Console()
    started = time.perf_counter()
    _check_output_options(args)
    base = _base_config(args)
    loads = _loads(args.load)
    cells = grid(
        base,
        workers=_workers(args.workers),
        policies=_policies(args.policies),
        capacities=_capacities(args.capacity, base),
        consistencies=_consistencies(args.consistency),
    )
    workload = load_workload(args)
    traced = None
    if args.trace_out:
        # The trace of the first run of the largest fleet; only that run records spans.
        traced = max(range(len(cells)), key=lambda i: (cells[i].workers, -i))
        cells[traced] = replace(cells[traced], trace=True)
    desc = _describe(workload)
    runs_total = len(cells) * len(loads)
    console.print(
        f"[bold]{workload.name}[/]: {desc['requests']:,} requests, {desc['prompt_tokens']:,} "
        f"prompt tokens; {runs_total} run(s)",
        soft_wrap=True,
    )
    out = Path(args.out) if args.out else None
    results = ResultsFile(out / "results.json", desc, runs_total) if out else None
    records = _run_loads(workload, cells, loads, args.jobs, console, results)
    summaries = [r.summary for r in records]
    if results is not None:
        results.write(complete=True)
    optimal = summaries[0]["optimal_hit_rate"]
    title = f"{workload.name}, page size {base.page_size}, H* = {_pct(optimal)}"
    _print_table(args, summaries, title, console)
    if out is not None:
        from radixmeta.sim.plots import write_plots

        plots = write_plots(out, records)
        note = f", {len(plots)} plot(s)" if plots else " (no plots: pip install 'radixmeta[plots]')"
        console.print(f"wrote {out / 'results.json'}{note}", soft_wrap=True)
    if traced is not None:
        from radixmeta.sim.chrome_trace import write_trace

        run = next(r.run for r in records if r.run is not None)  # the one cell that traced
        write_trace(Path(args.trace_out), run, workload.name)
        note = "(open it in https://ui.perfetto.dev)"
        console.print(f"wrote {args.trace_out} {note}", soft_wrap=True)
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


# -- the A.4 reproduction ------------------------------------------------------------------

# What the SGLang paper's appendix A.4 and the reference computation claim (policies.md 3).
A4_OPTIMAL = 0.863
A4_ROUND_ROBIN = 0.846


@dataclass(frozen=True)
class Claim:
    """One row of the A.4 reproduction: what is claimed, the target, what was measured.

    ``met`` is None for a figure that is reported, not judged (H*).
    """

    claim: str
    target: str
    measured: str
    met: bool | None


def _pick(
    summaries: Sequence[Mapping[str, Any]], policy: str, workers: int, **kw: Any
) -> Mapping[str, Any]:
    for s in summaries:
        if (
            s["policy"] == policy
            and s["workers_count"] == workers
            and all(s[k] == v for k, v in kw.items())
        ):
            return s
    msg = f"no run of {policy} with {workers} workers {kw}"
    raise LookupError(msg)


def a4_claims(
    unbounded: Sequence[Mapping[str, Any]],
    small: Sequence[Mapping[str, Any]],
    poisson: Sequence[Mapping[str, Any]],
    rate: float,
) -> list[Claim]:
    """The A.4 claims judged on the reproduction's three sweeps.

    Parameters
    ----------
    unbounded : sequence of dict
        Summaries of ``default``, ``round_robin`` and ``longest_prefix`` on 4
        workers (and the one-worker base) with unbounded caches, ``idle``.
    small : sequence of dict
        The same at 8k tokens per worker.
    poisson : sequence of dict
        ``default`` on 4 workers under Poisson arrivals at ``rate``, ``immediate``
        and ``idle``.
    rate : float
        The Poisson rate (requests per second), for the claim's text.
    """
    optimal = unbounded[0]["optimal_hit_rate"]
    d4, rr4, lp4 = (_pick(unbounded, p, 4) for p in ("default", "round_robin", "longest_prefix"))
    d8, lp8 = (_pick(small, p, 4) for p in ("default", "longest_prefix"))
    imm = _pick(poisson, "default", 4, consistency="immediate")
    idle = _pick(poisson, "default", 4, consistency="idle")
    scale = d4.get("scaling") or 0.0
    scale8 = d8.get("scaling") or 0.0
    share = idle["timing"]["router_share_of_prefill"]
    return [
        Claim("H* of the workload", _pct(A4_OPTIMAL), _pct(optimal), None),
        Claim(
            "default hit rate, 4 workers, within 0.5 pt of H*",
            f">= {optimal - 0.005:.2%}",
            f"{d4['hit_rate']:.2%}",
            d4["hit_rate"] >= optimal - 0.005,
        ),
        Claim(
            "round robin hit rate, 4 workers (paper: 84.6%)",
            "83.6-85.6%",
            _pct(rr4["hit_rate"]),
            abs(rr4["hit_rate"] - A4_ROUND_ROBIN) <= 0.01,
        ),
        Claim("default throughput, 4 workers over 1", ">= 3.8x", f"{scale:.2f}x", scale >= 3.8),
        Claim(
            "default prefill imbalance",
            "<= 1.1",
            f"{d4['imbalance']:.2f}",
            d4["imbalance"] <= 1.1,
        ),
        Claim(
            "longest_prefix imbalance (pure affinity)",
            "> default's",
            f"{lp4['imbalance']:.2f}",
            lp4["imbalance"] > d4["imbalance"],
        ),
        # One claim in two rows, so the row that fails says which half: at 8k per
        # worker, default keeps within 1 point of longest_prefix with imbalance <= 1.1.
        Claim(
            "8k/worker: default within 1 pt of longest_prefix",
            f">= {lp8['hit_rate'] - 0.01:.2%}",
            f"{d8['hit_rate']:.2%}",
            d8["hit_rate"] >= lp8["hit_rate"] - 0.01,
        ),
        Claim(
            "8k/worker: and default's prefill imbalance",
            "<= 1.1",
            f"{d8['imbalance']:.2f}",
            d8["imbalance"] <= 1.1,
        ),
        Claim("8k/worker: default still scales, 4 over 1", "> 3x", f"{scale8:.2f}x", scale8 > 3),
        Claim(
            f"Poisson {rate:.0f}/s: idle within 1 pt of immediate",
            f">= {imm['hit_rate'] - 0.01:.2%}",
            f"{idle['hit_rate']:.2%}",
            idle["hit_rate"] >= imm["hit_rate"] - 0.01,
        ),
        Claim("router time / simulated prefill time", "< 1%", f"{share:.3%}", share < 0.01),
    ]


def _claims_table(claims: Sequence[Claim], fmt: str) -> list[str]:
    """The claims as a plain or Markdown table, every cell whole."""
    header = ("claim", "target", "measured", "met")
    rows = [
        (c.claim, c.target, c.measured, {True: "yes", False: "NO", None: "-"}[c.met])
        for c in claims
    ]
    if fmt == "markdown":
        return [
            "| " + " | ".join(header) + " |",
            "|:---|---:|---:|:---|",
            *("| " + " | ".join(r) + " |" for r in rows),
        ]
    widths = [max(len(x[i]) for x in (header, *rows)) for i in range(4)]

    def line(cells: Sequence[str]) -> str:
        a, b, c, d = cells
        return f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c:>{widths[2]}}  {d}".rstrip()

    return [line(header), "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def reproduce_a4(args: argparse.Namespace) -> int:
    """``radixmeta reproduce a4``: the paper's claims beside what the simulator measures.

    Returns 0 once it has run, whatever it measured; with ``--check``, 1 when a
    claim is not met. Bad input raises (the console script's exit code 2).
    """
    console = Console()
    started = time.perf_counter()
    _check_output_options(args)
    args.workload = "mmlu"
    args.rate = None
    workload = load_workload(args)
    desc = _describe(workload)
    console.print(
        f"[bold]A.4 reproduction[/]: MMLU, {desc['requests']:,} questions arriving as one batch, "
        f"{desc['prompt_tokens']:,} prompt tokens, page size {args.page_size}",
        soft_wrap=True,
    )
    base = _base_config(args)
    parts = {
        "unbounded caches": grid(
            base,
            workers=[1, 4],
            policies=["default", "round_robin", "longest_prefix"],
            capacities=[None],
            consistencies=["idle"],
        ),
        "8k tokens per worker": grid(
            base,
            workers=[1, 4],
            policies=["default", "longest_prefix", "round_robin"],
            capacities=[8_000],
            consistencies=["idle"],
        ),
    }
    poisson_cells = grid(
        base,
        workers=[4],
        policies=["default"],
        capacities=[None],
        consistencies=["immediate", "idle"],
    )
    total = sum(len(c) for c in parts.values()) + len(poisson_cells)
    out = Path(args.out) if args.out else None
    results = ResultsFile(out / "a4.json", desc, total) if out else None
    batch: list[RunRecord] = []
    for label, cells in parts.items():
        batch.extend(_run(workload, cells, args.jobs, console, label, results, len(batch)))
    unbounded = [r.summary for r in batch if r.summary["capacity"] is None]
    small = [r.summary for r in batch if r.summary["capacity"] == 8_000]

    # Poisson arrivals at 80 % of the 4-worker fleet's capacity.
    rate = 0.8 * _pick(unbounded, "default", 4)["throughput_rps"]
    args.rate = rate
    poisson_load = load_workload(args)
    poisson = _run(
        poisson_load,
        poisson_cells,
        args.jobs,
        console,
        f"Poisson at {rate:.0f} req/s",
        results,
        len(batch),
    )
    claims = a4_claims(unbounded, small, [r.summary for r in poisson], rate)
    # Two tables: the Poisson runs share a cell (4 workers, unbounded, idle) with the
    # batch's, and are told apart by their arrivals only.
    _print_table(args, [r.summary for r in batch], "the runs on one batch", console)
    console.out("", highlight=False)
    _print_table(
        args, [r.summary for r in poisson], f"the runs under Poisson at {rate:.0f}/s", console
    )
    console.out("", highlight=False)
    console.out("SGLang A.4: claim against measurement", highlight=False)
    for line in _claims_table(claims, "markdown" if args.format == "markdown" else "plain"):
        console.out(line, highlight=False)
    if results is not None and out is not None:
        results.extra["claims"] = [
            {"claim": c.claim, "target": c.target, "measured": c.measured, "met": c.met}
            for c in claims
        ]
        results.write(complete=True)
        from radixmeta.sim.plots import write_plots

        plots = write_plots(out, batch, tag="batch")
        plots += write_plots(out, poisson, tag=f"poisson{rate:.0f}")
        console.print(f"wrote {out / 'a4.json'} and {len(plots)} plot(s)", soft_wrap=True)
    unmet = [c for c in claims if c.met is False]
    console.print(f"done in {time.perf_counter() - started:.1f} s; {len(unmet)} claim(s) not met")
    return 1 if args.check and unmet else 0


def add_simulate_arguments(parser: argparse.ArgumentParser, *, reproduce: bool = False) -> None:
    """The options ``simulate`` (and, without the sweep axes, ``reproduce``) take."""
    if not reproduce:
        parser.add_argument(
            "--workload",
            choices=("gsp", "mmlu", "sharegpt", "trace", "synthetic"),
            default="gsp",
            help="what to simulate (default: gsp, generated shared-prefix groups, no data needed)",
        )
        parser.add_argument(
            "--workers", default="4", help="worker counts, e.g. 1,2,4,8 (default 4)"
        )
        parser.add_argument("--policies", default="all", help="policy names or 'all' (default all)")
        parser.add_argument(
            "--capacity",
            default="model",
            help=(
                "KV pool per worker (prefix cache and running requests): tokens like 8k, "
                "inf (no memory bound), model (the cost model's pool, the default) or a "
                "multiple of it like 0.5x,4x"
            ),
        )
        parser.add_argument(
            "--load",
            default=None,
            help=(
                "re-time the arrivals so the offered work is these shares of the fleet's "
                "capacity, e.g. 0.5,0.8,0.95 (see docs/simulator.md)"
            ),
        )
        parser.add_argument(
            "--report-interval",
            type=float,
            default=0.1,
            help="simulated seconds between the workers' load reports (default 0.1)",
        )
        parser.add_argument(
            "--dispatch-time",
            type=float,
            default=0.0,
            help="simulated router seconds per dispatched request (default 0)",
        )
        parser.add_argument(
            "--replay-time",
            type=float,
            default=0.0,
            help="simulated router seconds per replayed record (default 0)",
        )
        parser.add_argument(
            "--consistency",
            default="idle",
            help=f"how records reach the router: some of {', '.join(CONSISTENCIES)} (default idle)",
        )
        parser.add_argument(
            "--rate",
            type=float,
            default=None,
            help=(
                "Poisson arrivals per second (0: all at once; a trace is stretched to this "
                "mean rate, bursts kept); default: the workload's own"
            ),
        )
        parser.add_argument("--trace-file", help="--workload trace: the JSON-lines trace")
        parser.add_argument(
            "--block-size", type=int, default=512, help="--workload trace: tokens per hash id"
        )
        parser.add_argument(
            "--time-scale", type=float, default=1.0, help="--workload trace: stretch time"
        )
        parser.add_argument("--sharegpt-file", help="--workload sharegpt: a ShareGPT JSON file")
        parser.add_argument(
            "--shape",
            default="chat",
            help="--workload synthetic: chat, agents, documents or bursty (default chat)",
        )
        parser.add_argument(
            "--sessions", type=int, default=None, help="--workload synthetic: conversations"
        )
        parser.add_argument(
            "--trace-out", help="write a Chrome trace (Perfetto) of the largest fleet"
        )
    parser.add_argument("--mmlu-dir", help="a folder of MMLU CSVs (Hugging Face layout)")
    parser.add_argument(
        "--order",
        choices=("shuffle", "subject"),
        default="shuffle",
        help="MMLU question order (default shuffle)",
    )
    parser.add_argument(
        "--tokenizer",
        default="auto",
        help="auto (cl100k_base when bpe-openai is installed), cl100k or fallback",
    )
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument(
        "--latency", type=float, default=0.05, help="seconds, for --consistency delayed"
    )
    parser.add_argument("--prefill-model", default="mistral_7b_a6000")
    parser.add_argument("--decode-model", default="mistral_7b_a6000")
    parser.add_argument("--max-running", type=int, default=256)
    parser.add_argument("--max-prefill-tokens", type=int, default=16_384)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--jobs", type=int, default=1, help="processes for the runs (0: one per CPU)"
    )
    parser.add_argument(
        "--out",
        help="write results.json (strict JSON, rewritten as each run ends) and PNG plots here",
    )
    parser.add_argument(
        "--columns",
        metavar="A,B,...",
        help="the table's columns, by key (see the docs' Output section), or 'all'",
    )
    parser.add_argument(
        "--wide", action="store_true", help="every column (the default when stdout is piped)"
    )
    parser.add_argument(
        "--format",
        choices=report.FORMATS,
        default="auto",
        help="auto: 80 columns on a terminal, every column elsewhere; plain or markdown: "
        "one row per run, every value whole (default auto)",
    )
    if reproduce:
        parser.add_argument(
            "--check",
            action="store_true",
            help="exit 1 when a claim is not met (default: 0 whenever it ran)",
        )


# -- reproduce traces ----------------------------------------------------------------------

TRACE_TIMINGS = "own,spread,0.5,0.8,0.95"


def add_traces_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``radixmeta reproduce traces``."""
    parser.add_argument(
        "--trace-file",
        action="append",
        default=[],
        metavar="FILE",
        help="a trace in the Mooncake format (JSON lines with hash_ids); repeatable",
    )
    parser.add_argument(
        "--synthetic",
        default=None,
        metavar="SHAPE:SEED,...",
        help="synthetic traces (radixmeta.sim.synthetic), e.g. chat:1,agents:2; 'all': "
        "every shape with seed 1",
    )
    parser.add_argument(
        "--extra",
        default=None,
        metavar="gsp,mmlu,sharegpt",
        help="also these workloads (mmlu needs --mmlu-dir); they run at the loads only",
    )
    parser.add_argument("--mmlu-dir", help="a folder of MMLU CSVs (Hugging Face layout)")
    parser.add_argument("--sharegpt-file", help="a ShareGPT JSON file (default: the package's)")
    parser.add_argument("--workers", default="4,8,16", help="fleet sizes (default 4,8,16)")
    parser.add_argument(
        "--loads",
        default=TRACE_TIMINGS,
        help="timings: own (the workload's times), spread (same-instant arrivals 1 ms "
        f"apart) and offered loads (default {TRACE_TIMINGS})",
    )
    parser.add_argument(
        "--capacity", default="0.5x,1x,4x", help="pools as multiples of the cost model's"
    )
    parser.add_argument("--consistency", default="idle,none", help="default idle,none")
    parser.add_argument("--policies", default="all", help="default and its rivals (default all)")
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests")
    parser.add_argument("--block-size", type=int, default=512, help="tokens per hash id")
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--prefill-model", default="mistral_7b_a6000")
    parser.add_argument("--decode-model", default="mistral_7b_a6000")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--jobs", type=int, default=1, help="processes for the runs (0: one per CPU)"
    )
    parser.add_argument("--out", help="write traces.json (every cell, strict JSON) here")
    parser.add_argument(
        "--format",
        choices=("plain", "markdown"),
        default="plain",
        help="the tables as aligned text (within 80 columns) or Markdown (default plain)",
    )
    parser.add_argument(
        "--rivals-from",
        metavar="TRACES_JSON",
        help="take every policy but default from an earlier traces.json where it has the "
        "cell (after a change to default only: its rivals' runs are the same)",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 unless default meets every target"
    )


def _timings(text: str) -> list[str]:
    from radixmeta.sim.load import check_load

    out = []
    for item in _list(text):
        if item in ("own", "spread"):
            out.append(item)
            continue
        try:
            out.append(f"{check_load(item):g}")
        except InvalidInputError:
            msg = f"--loads takes own, spread and loads > 0 (0.5,0.8), got {item!r}"
            raise InvalidInputError(msg) from None
    if not out:
        msg = f"--loads takes own, spread and loads like 0.8, got {text!r}"
        raise InvalidInputError(msg)
    return out


def _trace_builders(args: argparse.Namespace) -> list[tuple[str, Callable[[], Any]]]:
    """(label, builder) for every workload the arguments name, every argument checked.

    Nothing is read or built here: a bad argument is refused before any work, so
    a typo costs no time spent building a workload first.
    """
    from radixmeta.sim import workloads
    from radixmeta.sim.synthetic import TRACE_SHAPES, trace_shape

    if args.limit is not None and args.limit < 1:
        msg = f"--limit must be >= 1 request, got {args.limit}"
        raise InvalidInputError(msg)
    if args.block_size < 1:
        msg = f"--block-size must be >= 1 token, got {args.block_size}"
        raise InvalidInputError(msg)
    limit = args.limit
    out: list[tuple[str, Callable[[], Any]]] = []
    for path in args.trace_file:
        if not Path(path).is_file():
            msg = f"--trace-file {path}: no such file"
            raise DataNotFoundError(msg)
        out.append((
            Path(path).stem,
            partial(workloads.trace, path, block_size=args.block_size, limit=limit),
        ))
    if args.synthetic:
        items = (
            [f"{name}:1" for name in TRACE_SHAPES]
            if args.synthetic.strip() == "all"
            else _list(args.synthetic)
        )
        for item in items:
            shape, _, seed = item.partition(":")
            try:
                number = int(seed) if seed else 1
            except ValueError:
                msg = f"--synthetic takes SHAPE:SEED items, got {item!r}"
                raise InvalidInputError(msg) from None
            if number < 0:
                msg = f"--synthetic takes SHAPE:SEED items with a seed >= 0, got {item!r}"
                raise InvalidInputError(msg)
            trace_shape(shape)  # an unknown shape is refused here
            out.append((
                f"{shape}/{number}",
                partial(workloads.synthetic, shape, seed=number, limit=limit),
            ))
    for name in _list(args.extra or ""):
        builder: Callable[[], Any]
        if name == "mmlu":
            if not args.mmlu_dir:
                msg = "--extra mmlu needs --mmlu-dir DIR"
                raise InvalidInputError(msg)
            if not Path(args.mmlu_dir).is_dir():
                msg = f"--mmlu-dir {args.mmlu_dir}: no such folder"
                raise DataNotFoundError(msg)
            builder = partial(workloads.mmlu, args.mmlu_dir, seed=args.seed, limit=limit)
        elif name == "gsp":
            builder = partial(workloads.gsp, seed=args.seed, limit=limit)
        elif name == "sharegpt":
            if args.sharegpt_file and not Path(args.sharegpt_file).is_file():
                msg = f"--sharegpt-file {args.sharegpt_file}: no such file"
                raise DataNotFoundError(msg)
            builder = partial(
                workloads.sharegpt, path=args.sharegpt_file, seed=args.seed, limit=limit
            )
        else:
            msg = f"--extra takes some of gsp, mmlu, sharegpt, got {name!r}"
            raise InvalidInputError(msg)
        out.append((name, builder))
    if not out:
        msg = "reproduce traces needs a workload: --trace-file, --synthetic or --extra"
        raise InvalidInputError(msg)
    return out


def _trace_workloads(builders: Sequence[tuple[str, Callable[[], Any]]]) -> list[tuple[str, Any]]:
    """(label, workload) of every builder, each refused when it has no requests."""
    out = [(label, build()) for label, build in builders]
    for label, w in out:
        if len(w) == 0:
            msg = f"the {label} workload has no requests: nothing to simulate"
            raise InvalidInputError(msg)
    return out


def reproduce_traces(args: argparse.Namespace) -> int:
    """``radixmeta reproduce traces``: default against every rival, cell by cell."""
    from radixmeta.sim import traces

    started = time.perf_counter()
    timings = _timings(args.loads)
    fleets = _workers(args.workers)
    capacities = _list(args.capacity)
    consistencies = _consistencies(args.consistency)
    chosen = _policies(args.policies)
    base = SimConfig(
        page_size=args.page_size,
        prefill=args.prefill_model,
        decode=args.decode_model,
        seed=args.seed,
    )
    if base.cost_model is None:
        msg = "reproduce traces needs a cost model of radixmeta.policies.costs.COST_MODELS"
        raise InvalidInputError(msg)
    for text in capacities:  # refused before anything runs
        traces._capacity_tokens(text, base.cost_model.kv_tokens)
    if "default" not in chosen:
        msg = "the grid compares default with its rivals: --policies must include default"
        raise InvalidInputError(msg)
    if args.jobs < 0:
        msg = f"--jobs must be >= 0 (0: one per CPU), got {args.jobs}"
        raise InvalidInputError(msg)
    if args.page_size < 1:
        msg = f"--page-size must be >= 1 token, got {args.page_size}"
        raise InvalidInputError(msg)
    builders = _trace_builders(args)
    settings = {
        "limit": args.limit,
        "block_size": args.block_size,
        "page_size": args.page_size,
        "prefill_model": args.prefill_model,
        "decode_model": args.decode_model,
        "seed": args.seed,
    }
    if args.rivals_from:  # its file and settings now; its workloads' digests once built
        traces.load_rivals(args.rivals_from, (), settings)
    loaded = _trace_workloads(builders)
    described = [{"label": label, "digest": w.digest(), **_describe(w)} for label, w in loaded]
    rivals = (
        None
        if not args.rivals_from
        else traces.load_rivals(args.rivals_from, described, settings)
    )
    for item in described:
        print(
            f"{item['label']}: {item['requests']:,} requests, "
            f"{item['prompt_tokens']:,} prompt tokens",
            flush=True,
        )
    done: list[Any] = []

    def on_result(result: Any) -> None:
        done.append(result)
        print("\n".join(traces.cell_rows(result, args.format)), flush=True)
        if args.out:
            traces.write_results(Path(args.out) / "traces.json", described, done, settings)

    results = traces.run_grid(
        loaded,
        timings=timings,
        workers=fleets,
        capacities=capacities,
        consistencies=consistencies,
        policies=chosen,
        base=base,
        jobs=args.jobs,
        on_result=on_result,
        rivals=rivals,
    )
    print("\nTargets, per cell, for default against the best of the policies run:")
    print("\n".join(f"  {name:5} {what}" for name, what in traces.TARGETS))
    print("\n".join(traces.met_rows(results, args.format)))
    if args.out:
        path = traces.write_results(
            Path(args.out) / "traces.json", described, results, settings
        )
        print(f"wrote {path}")
    print(f"done in {time.perf_counter() - started:.1f} s")
    unmet = any(r.skipped is None and False in r.verdict.values() for r in results)
    return 1 if args.check and unmet else 0
