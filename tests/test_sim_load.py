"""Offered load (``--load``), ``--rate`` on traces, and the simulator's command-line errors.

A small trace in the Mooncake format is generated here (shared system blocks,
multi-turn sessions that resend their history, bursts of same-instant arrivals,
a few prompts over the context): tests never need the real trace.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixmeta.cli import main
from radixmeta.errors import InvalidInputError, WorkloadError
from radixmeta.sim import workloads
from radixmeta.sim.engine import SimConfig, Simulation
from radixmeta.sim.load import check_load, offered_work, scale_to_load, scale_to_rate
from radixmeta.sim.metrics import summarise


def mooncake_trace(path: Path, sessions: int = 24, seed: int = 0) -> Path:
    """Lines like the Mooncake conversation trace, 512 tokens a hash id."""
    rng = np.random.default_rng(seed)
    next_id = 1  # 0 is the system prompt every request starts with
    lines: list[dict[str, Any]] = []
    for s in range(sessions):
        history = [0]
        start = int(rng.integers(0, 20_000))
        for turn in range(int(rng.integers(1, 5))):
            new = int(rng.integers(1, 12 if s % 11 else 80))  # session 0 and 11: huge
            history += list(range(next_id, next_id + new))
            next_id += new
            length = 512 * (len(history) - 1) + int(rng.integers(1, 513))
            at = start + turn * 15_000
            lines.append(
                {
                    "timestamp": at - at % 1000,  # whole seconds: bursts at one instant
                    "input_length": length,
                    "output_length": int(rng.integers(1, 400)),
                    "hash_ids": list(history),
                }
            )
            history += [next_id]  # the reply becomes part of the next turn's prompt
            next_id += 1
    lines.sort(key=lambda x: x["timestamp"])
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


@pytest.fixture
def trace_file(tmp_path: Path) -> Path:
    return mooncake_trace(tmp_path / "conversation_trace.jsonl")


def as_arrays(w: workloads.Workload) -> tuple[list[Any], list[float], list[int]]:
    return [r.tokens for r in w], list(w.arrivals), [int(x) for x in w.output_lens]


def test_the_generated_trace_has_the_shape_of_the_real_one(trace_file: Path) -> None:
    w = workloads.trace(trace_file)
    starts = {int(r.tokens[0]) for r in w}
    assert starts == {0}  # every prompt starts with the shared block
    _, counts = np.unique(w.arrivals, return_counts=True)
    assert counts.max() >= 2  # requests that arrive together
    assert (w.prompt_lens > 32_768).any()  # some over Mistral-7B's context
    assert 0.2 < w.optimal_hit_rate() < 0.9


def test_load_calibration_is_deterministic_and_proportional(trace_file: Path) -> None:
    w = workloads.trace(trace_file)
    tokens, arrivals, outputs = as_arrays(w)
    cfg = SimConfig(workers=4)
    half, info = scale_to_load(tokens, arrivals, outputs, cfg, 0.5)
    again, _ = scale_to_load(tokens, arrivals, outputs, cfg, 0.5)
    full, _ = scale_to_load(tokens, arrivals, outputs, cfg, 1.0)
    assert half == again  # deterministic
    assert half[-1] == pytest.approx(2 * full[-1])  # half the load: twice the span
    # Requests that arrived together still do.
    same = [i for i in range(1, len(arrivals)) if arrivals[i] == arrivals[i - 1]]
    assert same and all(half[i] == half[i - 1] for i in same)
    # The formula: total work over (load x workers x span) is the time factor.
    span = arrivals[-1] - arrivals[0]
    work = offered_work(tokens, outputs, cfg)
    assert info["factor"] == pytest.approx(work.sum() / (0.5 * 4 * span))
    # Rejected requests (over the 32k context) are no work.
    too_long = np.asarray([len(t) for t in tokens]) + np.asarray(outputs) >= 32_768
    assert too_long.any() and (work[too_long] == 0).all() and (work[~too_long] > 0).all()
    # The policy is not an input; the fleet is.
    assert scale_to_load(tokens, arrivals, outputs, SimConfig(workers=4, policy="random"), 0.5)[
        0
    ] == half
    assert scale_to_load(tokens, arrivals, outputs, SimConfig(workers=8), 0.5)[0] != half


def test_a_batch_gets_poisson_arrivals_at_the_rate_the_load_asks() -> None:
    w = workloads.gsp(num_groups=8, prompts_per_group=8, system_prompt_len=256, question_len=32,
                      output_len=32, seed=1)  # fmt: skip
    tokens, arrivals, outputs = as_arrays(w)
    assert set(arrivals) == {0.0}
    cfg = SimConfig(workers=2, capacity=None)
    times, info = scale_to_load(tokens, arrivals, outputs, cfg, 0.8)
    work = offered_work(tokens, outputs, cfg).sum()
    assert info["rate"] == pytest.approx(0.8 * 2 * len(w) / work)
    assert times[0] == 0.0 and all(b >= a for a, b in itertools.pairwise(times))


def test_queues_stay_short_at_half_load_and_grow_near_full(trace_file: Path) -> None:
    w = workloads.trace(trace_file)
    tokens, arrivals, outputs = as_arrays(w)
    waits = {}
    for load in (0.5, 0.95):
        cfg = SimConfig(workers=2, policy="cache_aware")
        times, _ = scale_to_load(tokens, arrivals, outputs, cfg, load)
        s = summarise(Simulation(tokens, times, outputs, cfg).run())
        waits[load] = s["queue_wait"]["p90"]
        assert s["completed"] + s["rejected"] == len(w)
    assert waits[0.5] < waits[0.95]


def test_rate_stretches_a_trace_and_keeps_its_bursts(trace_file: Path) -> None:
    w = workloads.trace(trace_file)
    arrivals = list(w.arrivals)
    times, _ = scale_to_rate(arrivals, 2.0)
    assert len(w) / times[-1] == pytest.approx(2.0)
    assert all((a == b) == (c == d) for a, b, c, d in
               zip(arrivals, arrivals[1:], times, times[1:], strict=False))  # fmt: skip
    assert scale_to_rate(arrivals, math.inf)[0] == [0.0] * len(w)
    with pytest.raises(InvalidInputError, match="all at once"):
        scale_to_rate([0.0, 0.0], 3.0)


def test_the_cli_runs_a_trace_at_a_rate_and_at_loads(trace_file: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    rc = main(["simulate", "--workload", "trace", "--trace-file", str(trace_file), "--rate", "5",
               "--workers", "2", "--policies", "round_robin", "--out", str(out)])  # fmt: skip
    assert rc == 0
    rc = main(["simulate", "--workload", "trace", "--trace-file", str(trace_file),
               "--load", "0.5,0.9", "--workers", "2", "--policies", "default,round_robin",
               "--capacity", "model,0.5x", "--out", str(out)])  # fmt: skip
    assert rc == 0
    doc = json.loads((out / "results.json").read_text())
    runs = doc["runs"]
    assert len(runs) == 2 * 2 * 2
    assert {r["load"] for r in runs} == {0.5, 0.9}
    assert {r["capacity"] for r in runs} == {198_516, 99_258}
    assert all(r["rejected"] > 0 for r in runs)  # the huge sessions exceed 32k


def test_limit_reads_only_what_it_needs(tmp_path: Path) -> None:
    path = mooncake_trace(tmp_path / "t.jsonl", sessions=4)
    with path.open("a") as f:
        f.write("this line is not JSON\n")  # past the limit: never read
    rc = main(["simulate", "--workload", "trace", "--trace-file", str(path), "--limit", "3",
               "--policies", "round_robin"])  # fmt: skip
    assert rc == 0
    assert main(["simulate", "--workload", "trace", "--trace-file", str(path)]) == 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--limit", "0"], "--limit must be >= 1"),
        (["--limit", "-3"], "--limit must be >= 1"),
        (["--max-running", "0"], "max_running and max_prefill_tokens must be >= 1"),
        (["--latency", "nan"], "latency must be a finite number"),
        (["--latency", "-1"], "latency must be a finite number"),
        (["--rate", "nan"], "--rate must be a finite number"),
        (["--rate", "inf"], "--rate must be a finite number"),
        (["--rate", "-2"], "--rate must be a finite number"),
        (["--load", "nan"], "--load takes finite numbers > 0"),
        (["--load", "inf"], "--load takes finite numbers > 0"),
        (["--load", "0"], "--load takes finite numbers > 0"),
        (["--load", ","], "--load takes numbers > 0"),
        (["--capacity", "0x"], "a multiple of the model's pool is a number > 0"),
        (["--report-interval", "0"], "report_interval must be > 0"),
        (["--dispatch-time", "nan"], "dispatch_time must be a finite number"),
    ],
)
def test_bad_options_are_clear_errors_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", "--policies", "round_robin", *argv]) == 2
    assert message in capsys.readouterr().err


def test_an_empty_workload_and_an_absurd_output_are_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    assert main(["simulate", "--workload", "trace", "--trace-file", str(empty)]) == 2
    assert "has no requests" in capsys.readouterr().err
    absurd = tmp_path / "absurd.jsonl"
    line = {"timestamp": 0, "input_length": 10, "output_length": 2**31 + 1, "hash_ids": [1]}
    absurd.write_text(json.dumps(line) + "\n")
    with pytest.raises(WorkloadError, match=r"absurd.jsonl:1: output_length must be <= 2\*\*31"):
        workloads.trace(absurd)
    assert check_load("0.8") == 0.8
