"""``limit``: every workload builds only its first N requests, and they are the full build's.

For each builder and several seeds, the first N requests of ``limit=N`` equal
the first N of the whole workload byte for byte (tokens, arrival, output length,
group), and the lazy build does less of the work that grows with the workload:
fewer prompts tokenized (MMLU, ShareGPT), fewer prompt tokens assembled (GSP),
fewer lines read (traces). Everything here is generated; no shared data needed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from radixmeta.cli import main
from radixmeta.sim import workloads
from radixmeta.sim.synthetic import trace_shape, write_trace
from radixmeta.sim.tokenize import FallbackTokenizer
from radixmeta.sim.workloads import Workload, gsp, mmlu, sharegpt

SEEDS = (0, 1, 7)


def rows(w: Workload, n: int | None = None) -> list[tuple[bytes, float, int, str | None]]:
    """What the simulator reads of the first ``n`` requests, comparable with ``==``."""
    return [(r.tokens.tobytes(), r.arrival, r.output_len, r.group) for r in list(w)[:n]]


def assert_prefix(lazy: Workload, full: Workload, n: int) -> None:
    assert len(lazy) == min(n, len(full))
    assert rows(lazy) == rows(full, n)
    assert [r.request_id for r in lazy] == list(range(len(lazy)))
    assert all(not r.tokens.flags.writeable for r in lazy)


class CountingTokenizer(FallbackTokenizer):
    """The fallback tokenizer, counting the texts it encodes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def encode(self, text: str) -> Any:
        self.calls += 1
        return super().encode(text)


# -- gsp -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "params",
    [{}, {"range_ratio": 0.5, "rate": 4.0}, {"shuffle": False}],
    ids=["fixed", "ranged-poisson", "unshuffled"],
)
def test_gsp_first_n_are_the_full_builds(seed: int, params: dict[str, Any]) -> None:
    shape = {"num_groups": 5, "prompts_per_group": 7, "system_prompt_len": 40,
             "question_len": 9, "output_len": 6, **params}
    full = gsp(seed=seed, **shape)
    for n in (0, 1, 4, 34, 35, 50):
        lazy = gsp(seed=seed, limit=n, **shape)
        assert_prefix(lazy, full, n)
        # Only the kept prompts are assembled: their one buffer holds nothing else.
        if len(lazy):
            assert lazy[0].tokens.base.size == lazy.total_prompt_tokens
    assert gsp(seed=seed, limit=3, **shape).metadata["params"]["limit"] == 3


# -- mmlu ------------------------------------------------------------------------------


def write_subjects(folder: Path, subjects: dict[str, int]) -> Path:
    """A folder in the Hugging Face layout: two dev rows and ``count`` questions a subject."""
    header = "question,choice0,choice1,choice2,choice3,answer\n"
    for subject, count in subjects.items():
        dev = [f"{subject} example {i},a,b,c,d,{i % 4}\n" for i in range(2)]
        test = [f"{subject} question {i} {'x ' * i},p,q,r,s,{i % 4}\n" for i in range(count)]
        for split, lines in (("dev", dev), ("test", test)):
            (folder / split).mkdir(parents=True, exist_ok=True)
            (folder / split / f"{subject}_{split}.csv").write_text(header + "".join(lines))
    return folder


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("order", ["shuffle", "subject"])
def test_mmlu_first_n_are_the_full_builds(tmp_path: Path, seed: int, order: str) -> None:
    folder = write_subjects(tmp_path / "mmlu", {"algebra": 9, "botany": 4, "chemistry": 12})
    params: dict[str, Any] = {"order": order, "seed": seed, "rate": 20.0, "cache": False}
    counting = CountingTokenizer()
    full = mmlu(folder, tokenizer=counting, **params)
    tokenized_all = counting.calls
    for n in (1, 5, 24, 25, 40):
        counting.calls = 0
        lazy = mmlu(folder, tokenizer=counting, limit=n, **params)
        assert_prefix(lazy, full, n)
        if n < len(full):
            assert counting.calls == n < tokenized_all  # only the kept prompts
    assert mmlu(folder, tokenizer="fallback", limit=0, **params).metadata["params"]["limit"] == 0


def test_mmlu_limit_reads_a_cached_subject_and_never_caches_a_part(tmp_path: Path) -> None:
    folder = write_subjects(tmp_path / "mmlu", {"algebra": 6, "botany": 5})
    cache = tmp_path / "cache"
    part = mmlu(folder, tokenizer="fallback", cache=cache, limit=3)
    assert not list(cache.glob("*.npz"))  # a part of a subject is not an entry
    full = mmlu(folder, tokenizer="fallback", cache=cache)
    assert len(list(cache.glob("*.npz"))) == 2
    counting = CountingTokenizer()
    again = mmlu(folder, tokenizer=counting, cache=cache, limit=3)
    assert rows(again) == rows(part) == rows(full, 3)


# -- sharegpt ---------------------------------------------------------------------------


def conversations(count: int) -> list[dict[str, Any]]:
    """Conversations of one to four turns, message lengths varying with the position."""
    out = []
    for i in range(count):
        messages = []
        for turn in range(1 + i % 4):
            messages.append({"from": "human", "value": f"q{i}.{turn} " + "word " * (i + turn)})
            messages.append({"from": "gpt", "value": f"a{i}.{turn} " + "reply " * (turn + 2)})
        out.append({"id": f"c{i}", "conversations": messages})
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(
    "timing",
    [{"rate": 2.0, "think_time": 3.0}, {"rate": math.inf, "think_time": 0.0}],
    ids=["poisson", "at-once"],
)
def test_sharegpt_first_n_are_the_full_builds(
    tmp_path: Path, seed: int, timing: dict[str, float]
) -> None:
    path = tmp_path / "sg.json"
    path.write_text(json.dumps(conversations(14)))
    params: dict[str, Any] = {"path": path, "sessions": 12, "seed": seed, **timing}
    counting = CountingTokenizer()
    full = sharegpt(tokenizer=counting, **params)
    tokenized_all = counting.calls
    for n in (0, 1, 6, len(full) - 1, len(full), len(full) + 4):
        counting.calls = 0
        lazy = sharegpt(tokenizer=counting, limit=n, **params)
        assert_prefix(lazy, full, n)
        if n < len(full) // 2:
            assert counting.calls < tokenized_all


# -- traces ----------------------------------------------------------------------------


def test_trace_and_synthetic_first_n_are_the_full_builds(tmp_path: Path) -> None:
    for seed in SEEDS:
        shape = trace_shape("chat", sessions=15)
        path = write_trace(tmp_path / f"t{seed}.jsonl", shape, seed=seed)
        full = workloads.trace(path, block_size=shape.block_size)
        synthetic = workloads.synthetic("agents", seed=seed, sessions=10)
        for n in (1, 9, len(full)):
            lazy = workloads.trace(path, block_size=shape.block_size, limit=n)
            assert_prefix(lazy, full, n)
            assert_prefix(workloads.synthetic("agents", seed=seed, sessions=10, limit=n),
                          synthetic, n)


# -- the console script ------------------------------------------------------------------


def test_simulate_limit_builds_only_the_first_requests(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    built: list[int | None] = []
    real = workloads.gsp

    def spy(**params: Any) -> Workload:
        built.append(params.get("limit"))
        return real(**params)

    monkeypatch.setitem(workloads.WORKLOADS, "gsp", spy)  # type: ignore[index]
    assert main([
        "simulate", "--workload", "gsp", "--limit", "12", "--workers", "2",
        "--policies", "round_robin", "--capacity", "inf",
    ]) == 0
    assert built == [12]
    assert "12 requests" in capsys.readouterr().out


def test_the_lazy_buffer_is_smaller_than_the_whole() -> None:
    whole = gsp(num_groups=8, prompts_per_group=32, system_prompt_len=256, seed=2)
    part = gsp(num_groups=8, prompts_per_group=32, system_prompt_len=256, seed=2, limit=10)
    assert isinstance(part[0].tokens.base, np.ndarray)
    assert part[0].tokens.base.size * 20 < whole[0].tokens.base.size
