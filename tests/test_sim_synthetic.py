"""The synthetic Mooncake-format traces: valid lines, the features they promise, seeded."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from radixmeta.errors import InvalidInputError
from radixmeta.sim import workloads
from radixmeta.sim.synthetic import TRACE_SHAPES, synthetic_records, trace_shape, write_trace


def small(name: str, **changes: object) -> list[dict[str, object]]:
    return synthetic_records(trace_shape(name, sessions=60, **changes), seed=5)


@pytest.mark.parametrize("name", list(TRACE_SHAPES))
def test_every_line_is_a_valid_trace_line_in_time_order(name: str) -> None:
    lines = small(name)
    assert len(lines) >= 60
    stamps = [x["timestamp"] for x in lines]
    assert stamps == sorted(stamps)
    for x in lines:
        assert len(x["hash_ids"]) == -(-x["input_length"] // 512)  # type: ignore[operator]
        assert 1 <= x["output_length"] <= 4096  # type: ignore[operator]
    tick = TRACE_SHAPES[name].tick
    if tick:
        assert all(s % round(tick * 1000) == 0 for s in stamps)


def test_the_same_seed_gives_the_same_trace_and_another_seed_another() -> None:
    shape = trace_shape("agents", sessions=40)
    assert synthetic_records(shape, seed=2) == synthetic_records(shape, seed=2)
    assert synthetic_records(shape, seed=2) != synthetic_records(shape, seed=3)


def test_turns_resend_the_conversation_but_its_last_block() -> None:
    lines = small("chat", document_share=0.0)
    chains = [list(x["hash_ids"]) for x in lines]  # type: ignore[call-overload]
    partial = [x["input_length"] % 512 != 0 for x in lines]  # type: ignore[operator]
    resent = kept_partial = 0
    for j, later in enumerate(chains):
        for i in range(j):
            head = chains[i][:-1]
            if len(head) >= 2 and later[: len(head)] == head and len(later) > len(head):
                resent += 1  # a later turn starts with an earlier prompt less its last block
                if partial[i] and later[len(head)] == chains[i][-1]:
                    kept_partial += 1
    assert resent >= 30
    assert kept_partial == 0  # a partial last block is named anew once the next turn fills it


def test_sessions_share_system_prompts_by_popularity() -> None:
    lines = small("agents")
    firsts = Counter(x["hash_ids"][0] for x in lines)  # type: ignore[index]
    top = firsts.most_common(1)[0][1]
    assert 1 < len(firsts) <= TRACE_SHAPES["agents"].system_prompts
    assert top > len(lines) / len(firsts)  # a popular one above the mean


def test_bursts_arrive_together_and_documents_make_long_prompts() -> None:
    lines = small("bursty")
    counts = Counter(x["timestamp"] for x in lines)
    assert max(counts.values()) >= 3
    docs = small("documents")
    assert max(x["input_length"] for x in docs) >= TRACE_SHAPES["documents"].document_tokens[0]  # type: ignore[operator]
    shares = Counter(tuple(x["hash_ids"][:8]) for x in docs if len(x["hash_ids"]) > 8)  # type: ignore[arg-type,index]
    assert max(shares.values()) > 1  # a document several sessions ask about


def test_the_workload_is_the_written_file_replayed(tmp_path: Path) -> None:
    shape = trace_shape("chat", sessions=30)
    path = write_trace(tmp_path / "chat.jsonl", shape, seed=9)
    from_file = workloads.trace(path)
    built = workloads.synthetic("chat", sessions=30, seed=9)
    assert [r.tokens.tolist() for r in built] == [r.tokens.tolist() for r in from_file]
    assert np.array_equal(built.arrivals, from_file.arrivals)
    assert built.metadata["params"]["name"] == "chat" and built.metadata["seed"] == 9
    assert 0.0 < built.optimal_hit_rate() < 1.0
    assert len(workloads.load("synthetic", shape="chat", sessions=30, seed=9, limit=10)) == 10


def test_bad_shapes_are_clear_errors() -> None:
    with pytest.raises(InvalidInputError, match="unknown trace shape 'nope'"):
        trace_shape("nope")
    with pytest.raises(InvalidInputError, match="no field 'colour'"):
        trace_shape("chat", colour=1)
    with pytest.raises(InvalidInputError, match="burst_share must be in"):
        trace_shape("chat", burst_share=2.0)
    with pytest.raises(InvalidInputError, match="time_scale"):
        workloads.synthetic("chat", time_scale=-1)


def test_simulate_runs_a_synthetic_workload(capsys: pytest.CaptureFixture[str]) -> None:
    from radixmeta.cli import main

    assert main(["simulate", "--workload", "synthetic", "--shape", "agents", "--sessions",
                 "15", "--policies", "default", "--workers", "2", "--seed", "2"]) == 0
    assert "synthetic" in capsys.readouterr().out
    assert main(["simulate", "--workload", "synthetic", "--shape", "nope"]) == 2
