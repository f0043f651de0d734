"""``radixmeta simulate`` and ``radixmeta reproduce a4``: the simulator from the command line.

The parser lives in :mod:`radixmeta.cli`; these functions take its parsed
arguments, run the sweep with a progress bar, print the comparison table and
write what ``--out`` and ``--trace-out`` ask for.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from radixmeta.errors import InvalidInputError
from radixmeta.policies import names as policy_names
from radixmeta.sim import report
from radixmeta.sim.engine import CONSISTENCIES, SimConfig
from radixmeta.sim.sweep import grid, run_cells
from radixmeta.sim.worker import BatchLimits

__all__ = ["add_simulate_arguments", "load_workload", "parse_capacity", "reproduce_a4", "simulate"]


def parse_capacity(text: str) -> int | None:
    """``"8k"`` -> 8000, ``"1m"`` -> 1000000, ``"inf"`` -> None (unbounded), ``"5000"`` -> 5000."""
    t = text.strip().lower()
    if t in ("inf", "none", "unbounded"):
        return None
    scale = {"k": 1_000, "m": 1_000_000}.get(t[-1:], 1)
    number = t[:-1] if scale != 1 else t
    try:
        value = float(number) * scale
    except ValueError:
        msg = f"capacity {text!r} is not a number of tokens (like 8000, 8k, 1.5m or inf)"
        raise InvalidInputError(msg) from None
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


def load_workload(args: argparse.Namespace) -> Any:
    """The workload the arguments name, cut to ``--limit`` requests."""
    from radixmeta.sim import workloads

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
        params.update(path=args.trace_file, block_size=args.block_size, time_scale=args.time_scale)
    elif name == "sharegpt":
        params.update(path=args.sharegpt_file, tokenizer=args.tokenizer)
    if args.rate is not None:
        params["rate"] = math.inf if args.rate <= 0 else args.rate
    if name != "trace":
        params["seed"] = args.seed
    workload = workloads.load(name, **params)
    if args.limit is not None and args.limit < len(workload):
        workload = workloads.Workload(
            workload.name, list(workload)[: args.limit], {**workload.metadata, "limit": args.limit}
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
        trace=bool(getattr(args, "trace_out", None) or args.out),
    )


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
    workload: Any, cells: list[SimConfig], jobs: int, console: Console, label: str
) -> tuple[list[dict[str, Any]], list[Any]]:
    tokens = [r.tokens for r in workload]
    arrivals = list(workload.arrivals)
    outputs = list(workload.output_lens)
    optimal = workload.optimal_hit_rate(cells[0].page_size)
    with _progress(console) as bar:
        overall = bar.add_task(f"{label}: runs", total=len(cells))
        requests = bar.add_task("requests of the current run", total=len(workload))

        def cell_done(i: int, summary: dict[str, Any]) -> None:
            bar.advance(overall)
            bar.reset(requests)

        return run_cells(
            tokens,
            arrivals,
            outputs,
            cells,
            optimal=optimal,
            jobs=jobs,
            on_cell=cell_done,
            on_progress=lambda k: bar.advance(requests, k),
        )


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
    workload = load_workload(args)
    base = _base_config(args)
    cells = grid(
        base,
        workers=_workers(args.workers),
        policies=_policies(args.policies),
        capacities=[parse_capacity(c) for c in _list(args.capacity)],
        consistencies=_consistencies(args.consistency),
    )
    desc = _describe(workload)
    console.print(
        f"[bold]{workload.name}[/]: {desc['requests']:,} requests, {desc['prompt_tokens']:,} "
        f"prompt tokens; {len(cells)} run(s)",
        soft_wrap=True,
    )
    summaries, runs = _run(workload, cells, args.jobs, console, "simulate")
    title = (
        f"{workload.name}, page size {base.page_size}, H* = {summaries[0]['optimal_hit_rate']:.1%}"
    )
    _print_table(args, summaries, title, console)
    _write_outputs(args, desc, summaries, runs, console)
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    return 0


def _write_outputs(
    args: argparse.Namespace,
    desc: dict[str, Any],
    summaries: list[dict[str, Any]],
    runs: list[Any],
    console: Console,
) -> None:
    if args.out:
        out = Path(args.out)
        report.write_json(out / "results.json", desc, summaries)
        plots = report.write_plots(out, summaries, runs)
        note = f", {len(plots)} plot(s)" if plots else " (no plots: pip install 'radixmeta[plots]')"
        console.print(f"wrote {out / 'results.json'}{note}")
    if args.trace_out:
        # The trace of the first run of the largest fleet: one file, one fleet.
        top = max(runs, key=lambda r: r.config.workers)
        report.write_trace(Path(args.trace_out), top)
        console.print(f"wrote {args.trace_out} (open it in https://ui.perfetto.dev)")


# -- the A.4 reproduction ------------------------------------------------------------------

# What the SGLang paper's appendix A.4 and the reference computation claim (policies.md 3).
A4_OPTIMAL = 0.863
A4_ROUND_ROBIN = 0.846


def reproduce_a4(args: argparse.Namespace) -> int:
    """``radixmeta reproduce a4``: the paper's claims beside what the simulator measures."""
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
    rows: list[tuple[str, str, str, bool | None]] = []
    everything: list[dict[str, Any]] = []
    runs_all: list[Any] = []

    def sweep(cells: list[SimConfig], label: str) -> list[dict[str, Any]]:
        summaries, runs = _run(workload, cells, args.jobs, console, label)
        everything.extend(summaries)
        runs_all.extend(runs)
        return summaries

    def pick(
        summaries: list[dict[str, Any]], policy: str, workers: int, **kw: Any
    ) -> dict[str, Any]:
        for s in summaries:
            if (
                s["policy"] == policy
                and s["workers_count"] == workers
                and all(s[k] == v for k, v in kw.items())
            ):
                return s
        msg = f"no run of {policy} with {workers} workers {kw}"
        raise LookupError(msg)

    # 1. Unbounded caches.
    unbounded = sweep(
        grid(
            base,
            workers=[1, 4],
            policies=["default", "round_robin", "longest_prefix"],
            capacities=[None],
            consistencies=["idle"],
        ),
        "unbounded caches",
    )
    optimal = unbounded[0]["optimal_hit_rate"]
    d4 = pick(unbounded, "default", 4)
    rr4 = pick(unbounded, "round_robin", 4)
    lp4 = pick(unbounded, "longest_prefix", 4)
    rows.append(("H* of the workload", f"{A4_OPTIMAL:.1%}", f"{optimal:.1%}", None))
    rows.append(
        (
            "default hit rate, 4 workers, within 0.5 pt of H*",
            f">= {optimal - 0.005:.1%}",
            f"{d4['hit_rate']:.1%}",
            d4["hit_rate"] >= optimal - 0.005,
        )
    )
    rows.append(
        (
            "round robin hit rate, 4 workers, within 1 pt of 84.6 %",
            "83.6 % to 85.6 %",
            f"{rr4['hit_rate']:.1%}",
            abs(rr4["hit_rate"] - A4_ROUND_ROBIN) <= 0.01,
        )
    )
    scale = d4.get("scaling") or 0.0
    rows.append(("default throughput, 4 workers over 1", ">= 3.8x", f"{scale:.2f}x", scale >= 3.8))
    rows.append(
        ("default prefill imbalance", "<= 1.1", f"{d4['imbalance']:.2f}", d4["imbalance"] <= 1.1)
    )
    rows.append(
        (
            "longest_prefix prefill imbalance (shows pure affinity's)",
            "> default's",
            f"{lp4['imbalance']:.2f}",
            lp4["imbalance"] > d4["imbalance"],
        )
    )

    # 2. 8k tokens per worker.
    small = sweep(
        grid(
            base,
            workers=[1, 4],
            policies=["default", "longest_prefix", "round_robin"],
            capacities=[8_000],
            consistencies=["idle"],
        ),
        "8k tokens per worker",
    )
    d8, lp8, rr8 = (pick(small, p, 4) for p in ("default", "longest_prefix", "round_robin"))
    rows.append(
        (
            "8k/worker: default hit rate >= longest_prefix's - 1 pt",
            f">= {lp8['hit_rate'] - 0.01:.1%}",
            f"{d8['hit_rate']:.1%}",
            d8["hit_rate"] >= lp8["hit_rate"] - 0.01,
        )
    )
    rows.append(
        (
            "8k/worker: default hit rate >= 2x round robin's",
            f">= {2 * rr8['hit_rate']:.1%}",
            f"{d8['hit_rate']:.1%}",
            d8["hit_rate"] >= 2 * rr8["hit_rate"],
        )
    )
    scale8 = d8.get("scaling") or 0.0
    rows.append(
        ("8k/worker: default still scales (4 over 1)", "> 3x", f"{scale8:.2f}x", scale8 > 3)
    )

    # 3. Poisson arrivals at 80 % of the 4-worker fleet's capacity.
    rate = 0.8 * d4["throughput_rps"]
    args.rate = rate
    poisson_load = load_workload(args)
    summaries, runs = _run(
        poisson_load,
        grid(
            base,
            workers=[4],
            policies=["default"],
            capacities=[None],
            consistencies=["immediate", "idle"],
        ),
        args.jobs,
        console,
        f"Poisson at {rate:.0f} req/s",
    )
    everything.extend(summaries)
    runs_all.extend(runs)
    imm = pick(summaries, "default", 4, consistency="immediate")
    idle = pick(summaries, "default", 4, consistency="idle")
    rows.append(
        (
            f"Poisson {rate:.0f}/s: idle costs <= 1 pt of hit rate vs immediate",
            f">= {imm['hit_rate'] - 0.01:.1%}",
            f"{idle['hit_rate']:.1%}",
            idle["hit_rate"] >= imm["hit_rate"] - 0.01,
        )
    )
    share = idle["timing"]["router_share_of_prefill"]
    rows.append(("router overhead / simulated prefill time", "< 1 %", f"{share:.3%}", share < 0.01))

    _print_table(args, everything, "every run of the reproduction", console)
    table = Table(title="SGLang A.4: claim against measurement", header_style="bold")
    for col in ("claim", "target", "measured", "met"):
        table.add_column(col)
    for claim, target, measured, ok in rows:
        table.add_row(claim, target, measured, {True: "yes", False: "[red]NO[/]", None: "-"}[ok])
    console.print(table)
    if args.out:
        out = Path(args.out)
        desc["claims"] = [
            {"claim": c, "target": t, "measured": m, "met": ok} for c, t, m, ok in rows
        ]
        report.write_json(out / "a4.json", desc, everything)
        plots = report.write_plots(out, everything, runs_all)
        console.print(f"wrote {out / 'a4.json'} and {len(plots)} plot(s)")
    console.print(f"done in {time.perf_counter() - started:.1f} s")
    return 0 if all(ok is not False for *_, ok in rows) else 1


def add_simulate_arguments(parser: argparse.ArgumentParser, *, reproduce: bool = False) -> None:
    """The options ``simulate`` (and, without the sweep axes, ``reproduce``) take."""
    if not reproduce:
        parser.add_argument(
            "--workload",
            choices=("gsp", "mmlu", "sharegpt", "trace"),
            default="gsp",
            help="what to simulate (default: gsp, generated shared-prefix groups, no data needed)",
        )
        parser.add_argument(
            "--workers", default="4", help="worker counts, e.g. 1,2,4,8 (default 4)"
        )
        parser.add_argument("--policies", default="all", help="policy names or 'all' (default all)")
        parser.add_argument(
            "--capacity",
            default="inf",
            help="tokens per worker cache, e.g. 8k,32k,inf (default inf)",
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
            help="Poisson arrivals per second (0: all at once); default: the workload's own",
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
        help="write JSON and PNG plots under this folder",
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
