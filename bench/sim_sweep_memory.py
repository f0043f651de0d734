#!/usr/bin/env python3
"""Peak memory and wall time of a ``radixmeta simulate`` sweep, run as a user runs it.

The issue's target: a 57-run sweep without ``--trace-out`` in at most 2.5 GB peak
memory, results streamed per run. Each mode is one child process,
``python -m radixmeta simulate --workload trace ...`` started in ``--root`` (a
radixmeta checkout: this one by default, or an older one to compare), and its
peak resident set is the kernel's ``ru_maxrss`` for that child (``os.wait4``),
the figure ``/usr/bin/time -v`` prints. With the default grid (workers 1,4,8;
all nine policies; 200k, 1m and unbounded tokens per worker) the sweep is 57 runs:
9 x 2 x 3 multi-worker runs and one one-worker run per capacity.

Modes: ``plain`` (the table only), ``out`` (``--out DIR``: results.json and the
plots), ``trace`` (``--out DIR --trace-out FILE``), and ``largest`` (the one run
of the grid that holds the most KV, alone: the floor no streaming can go under).
Prints a table and, with ``--json FILE``, writes every figure with the commands.
The machine is shared: wall times move with its load, peak memory does not.

Usage::

    python bench/sim_sweep_memory.py --trace-file ../shared/data/mooncake/conversation_trace.jsonl \
        [--modes plain out] [--root /path/to/other/checkout] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET_GB = 2.5
MODES = ("plain", "out", "trace", "largest")


def _git(root: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], capture_output=True, text=True, cwd=root, check=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def command(args: argparse.Namespace, mode: str, scratch: Path) -> list[str]:
    """The ``radixmeta simulate`` command line of one mode."""
    argv = [sys.executable, "-m", "radixmeta", "simulate", "--workload", "trace"]
    argv += ["--trace-file", str(Path(args.trace_file).resolve())]
    if args.limit is not None:
        argv += ["--limit", str(args.limit)]
    if mode == "largest":
        # The cell with the most KV held at once: the largest fleet, unbounded caches,
        # and a cache-blind policy (round robin copies every prefix to every worker).
        workers = max(int(w) for w in args.workers.split(","))
        return [*argv, "--workers", str(workers), "--policies", "round_robin", "--capacity", "inf"]
    argv += ["--workers", args.workers, "--policies", args.policies, "--capacity", args.capacity]
    if mode in ("out", "trace"):
        argv += ["--out", str(scratch / f"{mode}-out")]
    if mode == "trace":
        argv += ["--trace-out", str(scratch / "trace.json")]
    return argv


def measure(argv: list[str], root: Path) -> dict[str, Any]:
    """Run ``argv`` in ``root``: its wall time, peak RSS, exit code and the runs it made.

    Called in a fresh interpreter per mode (``--one``) that starts no other child, so
    RUSAGE_CHILDREN's ``ru_maxrss`` (the largest peak of any reaped child) is this
    child's own peak, in kB.
    """
    import resource

    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1"}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    runs = next(
        (line.split(";")[-1].split()[0] for line in done.stdout.splitlines() if "run(s)" in line),
        None,
    )
    return {
        "command": " ".join(["python", *argv[1:]]),
        "returncode": done.returncode,
        "runs": int(runs) if runs and runs.isdigit() else None,
        "wall_s": wall,
        "peak_rss_gb": peak_kb / 1e6,
        "stderr_tail": done.stderr.strip().splitlines()[-3:] if done.returncode else [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trace-file", required=True, help="a Mooncake-format trace")
    parser.add_argument("--workers", default="1,4,8")
    parser.add_argument("--policies", default="all")
    parser.add_argument("--capacity", default="200k,1m,inf")
    parser.add_argument("--limit", type=int, default=None, help="only the first N requests")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=["plain", "out", "largest"])
    parser.add_argument("--root", default=str(HERE.parent), help="the radixmeta checkout to run")
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # internal: one mode
    args = parser.parse_args()
    root = Path(args.root).resolve()
    if not Path(args.trace_file).is_file():
        parser.error(f"no trace at {args.trace_file} (see ../shared/data/README.md)")
    if args.one:
        # A fresh interpreter per mode, so RUSAGE_CHILDREN holds exactly one child's peak.
        with tempfile.TemporaryDirectory(prefix="sim-sweep-memory-") as scratch:
            result = measure(command(args, args.one, Path(scratch)), root)
        print(json.dumps(result))
        return
    rows = []
    for mode in args.modes:
        argv = [sys.executable, __file__, *sys.argv[1:], "--one", mode]
        done = subprocess.run(argv, capture_output=True, text=True, check=True)
        rows.append({"mode": mode, **json.loads(done.stdout.splitlines()[-1])})
    commit = _git(root, "rev-parse", "--short", "HEAD") or "(not a git checkout)"
    print(f"radixmeta at {root} ({commit}); target <= {TARGET_GB} GB peak without --trace-out")
    print(f"{'mode':<9}{'runs':>6}{'wall s':>9}{'peak RSS GB':>13}{'exit':>6}  target")
    for r in rows:
        peak = r["peak_rss_gb"]
        verdict = (
            "-"
            if r["mode"] in ("trace", "largest")
            else ("meets" if peak is not None and peak <= TARGET_GB else "misses")
        )
        runs = "-" if r["runs"] is None else str(r["runs"])
        figures = f"{r['wall_s']:>9.1f}{peak:>13.2f}{r['returncode']:>6}"
        print(f"{r['mode']:<9}{runs:>6}{figures}  {verdict}")
    for r in rows:
        print(f"  {r['mode']}: {r['command']}")
        for line in r["stderr_tail"]:
            print(f"    {line}")
    if args.json:
        doc = {
            "target_gb": TARGET_GB,
            "root": str(root),
            "commit": commit,
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "rows": rows,
        }
        Path(args.json).write_text(json.dumps(doc, indent=2, allow_nan=False) + "\n")


if __name__ == "__main__":
    main()
