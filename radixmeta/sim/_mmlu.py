"""The MMLU workload: k-shot prompts per subject, as SGLang's MMLU benchmark builds them."""

from __future__ import annotations

import csv
import hashlib
import io
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from radixmeta._keys import check_int
from radixmeta.errors import DataNotFoundError, InvalidInputError, WorkloadError
from radixmeta.sim import _diskcache
from radixmeta.sim._workload import (
    Request,
    Workload,
    check_rate,
    frozen_tokens,
    make_rng,
    poisson_arrivals,
)
from radixmeta.sim.tokenize import Tokenizer, get_tokenizer

__all__ = ["HEADER", "TEMPLATE", "build_prompts", "mmlu", "read_rows", "subjects_in"]

#: The Hugging Face ``cais/mmlu`` CSV header.
HEADER = ("question", "choice0", "choice1", "choice2", "choice3", "answer")
#: Names the prompt template below in the disk cache's keys: change it with the template.
TEMPLATE = "sglang-mmlu-v1"
_LETTERS = "ABCD"
_SPLITS = ("test", "val", "dev")
_ORDERS = ("shuffle", "subject")


@dataclass(frozen=True, slots=True)
class Row:
    """One multiple-choice question: its text, four choices and the answer letter."""

    question: str
    choices: tuple[str, str, str, str]
    answer: str


def _example(row: Row, with_answer: bool) -> str:
    text = row.question + "".join(
        f"\n{letter}. {choice}" for letter, choice in zip(_LETTERS, row.choices, strict=True)
    )
    text += "\nAnswer:"
    return text + f" {row.answer}\n\n" if with_answer else text


def few_shot_block(subject: str, dev: list[Row], shots: int) -> str:
    """The header line, a blank line and the first ``shots`` dev examples with answers."""
    header = (
        "The following are multiple choice questions (with answers) about "
        f"{subject.replace('_', ' ')}.\n\n"
    )
    return header + "".join(_example(row, True) for row in dev[:shots])


def build_prompts(
    subject: str,
    dev: list[Row],
    questions: list[Row],
    *,
    shots: int = 5,
    max_prefix_tokens: int | None = None,
    tokenizer: Tokenizer | None = None,
) -> list[str]:
    """The prompt text of each question: the few-shot block, then the question up to ``Answer:``.

    With ``max_prefix_tokens``, shots are dropped from the end until the few-shot
    block has at most that many tokens (SGLang's benchmark caps it at 1536).
    """
    k = min(shots, len(dev))
    block = few_shot_block(subject, dev, k)
    if max_prefix_tokens is not None:
        if tokenizer is None:
            msg = "max_prefix_tokens needs a tokenizer"
            raise InvalidInputError(msg)
        while k > 0 and tokenizer.encode(block).shape[0] > max_prefix_tokens:
            k -= 1
            block = few_shot_block(subject, dev, k)
    return [block + _example(row, False) for row in questions]


def read_rows(path: Path, data: bytes) -> list[Row]:
    """Parse one subject's CSV (the bytes of ``path``), with or without the HF header.

    Accepted: the Hugging Face layout (header ``question,choice0..choice3,answer``,
    answers 0 to 3) and the original header-less layout (answers A to D).

    Raises
    ------
    WorkloadError
        ``path:line: ...`` for a row that is not six fields or has a bad answer, and
        for a file that is not UTF-8 or not CSV.
    """
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        msg = f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        raise WorkloadError(msg) from None
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: list[Row] = []
    start = 1  # a quoted field may span lines: name the line the record starts on
    try:
        for record in reader:
            line = start
            start = reader.line_num + 1
            if not record or (len(record) == 1 and not record[0].strip()):
                continue
            if line == 1 and tuple(field.strip().lower() for field in record) == HEADER:
                continue
            if len(record) != len(HEADER):
                msg = (
                    f"{path}:{line}: expected 6 fields (question, 4 choices, answer), "
                    f"got {len(record)}"
                )
                raise WorkloadError(msg)
            answer = record[5].strip().upper()
            if answer in ("0", "1", "2", "3"):
                answer = _LETTERS[int(answer)]
            elif answer not in ("A", "B", "C", "D"):
                msg = f"{path}:{line}: answer must be 0 to 3 or A to D, got {record[5]!r}"
                raise WorkloadError(msg)
            rows.append(Row(record[0], (record[1], record[2], record[3], record[4]), answer))
    except csv.Error as exc:
        msg = f"{path}:{reader.line_num}: not valid CSV ({exc})"
        raise WorkloadError(msg) from None
    return rows


def subjects_in(folder: Path, split: str) -> list[str]:
    """The subjects that have a ``<split>/<subject>_<split>.csv`` file, sorted."""
    suffix = f"_{split}.csv"
    return sorted(p.name[: -len(suffix)] for p in (folder / split).glob(f"*{suffix}"))


def _read_file(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        msg = f"{what} {path} does not exist"
        raise DataNotFoundError(msg) from None
    except OSError as exc:
        msg = f"{what} {path} cannot be read: {exc.strerror or exc}"
        raise DataNotFoundError(msg) from None


class _Subject:
    """One subject's files, read once: its cache key, and its rows parsed only when needed."""

    def __init__(
        self,
        folder: Path,
        subject: str,
        split: str,
        shots: int,
        max_prefix_tokens: int | None,
        tokenizer: Tokenizer,
        cache_dir: Path | None,
    ) -> None:
        self.name = subject
        self.dev_path = folder / "dev" / f"{subject}_dev.csv"
        self.split_path = folder / split / f"{subject}_{split}.csv"
        self.dev_bytes = _read_file(self.dev_path, f"the few-shot file of subject {subject!r},")
        self.split_bytes = _read_file(self.split_path, f"the {split} file of subject {subject!r},")
        self.shots, self.max_prefix_tokens = shots, max_prefix_tokens
        self.tokenizer, self.cache_dir = tokenizer, cache_dir
        key_parts = [
            b"radixmeta-mmlu-cache-1",
            TEMPLATE.encode(),
            tokenizer.name.encode(),
            f"{subject}|{split}|{shots}|{max_prefix_tokens}".encode(),
            hashlib.sha256(self.dev_bytes).digest(),
            hashlib.sha256(self.split_bytes).digest(),
        ]
        self.key = hashlib.sha256(b"\x00".join(key_parts)).hexdigest()
        self.cached = None if cache_dir is None else _diskcache.load_prompts(cache_dir, self.key)
        self._questions: list[Row] | None = None

    def questions(self) -> list[Row]:
        if self._questions is None:
            self._questions = read_rows(self.split_path, self.split_bytes)
        return self._questions

    def count(self) -> int:
        """Questions in the subject (its cached prompts, else its parsed rows)."""
        if self.cached is not None:
            return len(self.cached[1]) - 1
        return len(self.questions())

    def tokens(
        self, wanted: list[int] | None = None
    ) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
        """The prompts of questions ``wanted`` (default all) as one buffer and offsets.

        All of them are kept in the disk cache; a subset is tokenized alone (it is
        what ``limit`` saves) and not cached, since an entry is a whole subject.
        """
        if self.cached is not None:
            tokens, offsets = self.cached
            if wanted is None:
                return tokens, offsets
            pieces = [tokens[offsets[q] : offsets[q + 1]] for q in wanted]
            return _joined(pieces)
        questions = self.questions()
        chosen = questions if wanted is None else [questions[q] for q in wanted]
        prompts = build_prompts(
            self.name,
            read_rows(self.dev_path, self.dev_bytes),
            chosen,
            shots=self.shots,
            max_prefix_tokens=self.max_prefix_tokens,
            tokenizer=self.tokenizer,
        )
        tokens, offsets = _joined([self.tokenizer.encode(text) for text in prompts])
        if self.cache_dir is not None and wanted is None:
            _diskcache.store_prompts(self.cache_dir, self.key, tokens, offsets)
        return tokens, offsets


def _joined(
    encoded: list[npt.NDArray[Any]],
) -> tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64]]:
    offsets = np.zeros(len(encoded) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([e.shape[0] for e in encoded])
    tokens = (
        np.concatenate(encoded).astype(np.uint32, copy=False)
        if encoded
        else np.zeros(0, dtype=np.uint32)
    )
    return tokens, offsets


def mmlu(
    mmlu_dir: str | os.PathLike[str],
    *,
    subjects: list[str] | tuple[str, ...] | None = None,
    shots: int = 5,
    max_prefix_tokens: int | None = None,
    split: str = "test",
    tokenizer: str | Tokenizer = "auto",
    rate: float = math.inf,
    order: str = "shuffle",
    output_len: int = 1,
    seed: int = 0,
    cache: bool | str | os.PathLike[str] = True,
    limit: int | None = None,
) -> Workload:
    """MMLU k-shot prompts: each subject's questions share its few-shot block.

    The prompt, as in SGLang's MMLU benchmark: ``The following are multiple choice
    questions (with answers) about {subject, underscores as spaces}.``, a blank line,
    the subject's first ``shots`` dev examples each as ``{question}\\nA. {c0}\\nB.
    {c1}\\nC. {c2}\\nD. {c3}\\nAnswer: {letter}\\n\\n``, then the question in the same
    form ending in ``Answer:``. The whole prompt text is tokenized at once.

    Parameters
    ----------
    mmlu_dir : path
        A folder with ``dev/<subject>_dev.csv`` and ``<split>/<subject>_<split>.csv``
        files in the Hugging Face ``cais/mmlu`` CSV layout (header-less original
        files with letter answers are read too).
    subjects : list of str, optional
        The subjects to use; default all that have a ``<split>`` file.
    shots : int, default 5
        Dev examples per prompt (fewer when a dev file has fewer rows).
    max_prefix_tokens : int, optional
        Drop shots until the few-shot block fits in this many tokens; SGLang's
        benchmark uses 1536. Default: no cap.
    split : {"test", "val", "dev"}, default "test"
        Which questions to ask (14,042 in ``test``).
    tokenizer : {"auto", "cl100k_base", "fallback"} or Tokenizer, default "auto"
        See :mod:`radixmeta.sim.tokenize`; the one used is in ``metadata["tokenizer"]``.
    rate : float, default inf
        Poisson arrivals, requests per second; ``inf`` sends all at time 0 (the
        SGLang A.4 batch).
    order : {"shuffle", "subject"}, default "shuffle"
        A seeded shuffle of all questions, or subject after subject (subjects
        sorted by name, questions in file order).
    output_len : int, default 1
        Tokens to generate per question (the benchmark asks for one letter).
    seed : int, default 0
    cache : bool or path, default True
        Keep tokenized prompts on disk: ``True`` uses ``$RADIXMETA_CACHE_DIR``, else
        ``$XDG_CACHE_HOME/radixmeta``, else ``~/.cache/radixmeta``; a path uses that
        folder; ``False`` never reads or writes one. Entries are keyed by the files'
        contents, the template, the tokenizer and the parameters; safe to delete.
    limit : int, optional
        Only the first ``limit`` requests: exactly the first ``limit`` of the whole
        workload. The shuffle is one permutation of every question (a global draw),
        so every subject's CSV is read to count its questions, but only the kept
        questions' prompts are rendered and tokenized (the cost that dominates).
        A subject already in the disk cache is read from it whole. A subset is not
        written to the disk cache.

    Returns
    -------
    Workload
        Named ``"mmlu"``; ``group`` is the subject.

    Raises
    ------
    DataNotFoundError
        A missing folder, subject or file.
    WorkloadError
        A malformed CSV row (``path:line: ...``).
    OptionalDependencyError
        ``tokenizer="cl100k_base"`` without ``bpe-openai``.
    """
    folder = Path(mmlu_dir)
    if not folder.is_dir():
        msg = f"MMLU folder {folder} does not exist (expected dev/ and test/ CSV folders in it)"
        raise DataNotFoundError(msg)
    if split not in _SPLITS:
        msg = f"split must be one of {', '.join(_SPLITS)}, got {split!r}"
        raise InvalidInputError(msg)
    if order not in _ORDERS:
        msg = f"order must be 'shuffle' or 'subject', got {order!r}"
        raise InvalidInputError(msg)
    k = check_int("shots", shots, 0)
    cap = None
    if max_prefix_tokens is not None:
        cap = check_int("max_prefix_tokens", max_prefix_tokens, 1)
    out_len = check_int("output_len", output_len, 0)
    most = None if limit is None else check_int("limit", limit, 0)
    arrival_rate = check_rate(rate)
    rng = make_rng(seed)
    tok = get_tokenizer(tokenizer)
    cache_dir = _diskcache.resolve_cache_dir(cache)

    available = subjects_in(folder, split)
    if subjects is None:
        chosen = available
        if not chosen:
            msg = f"MMLU folder {folder} has no {split}/<subject>_{split}.csv files"
            raise DataNotFoundError(msg)
    else:
        if isinstance(subjects, str):
            msg = "subjects must be a list of subject names, not one string"
            raise InvalidInputError(msg)
        chosen = sorted(set(subjects))
        missing = [s for s in chosen if s not in available]
        if missing:
            msg = (
                f"MMLU folder {folder} has no {split} file for subject(s) {', '.join(missing)} "
                f"(looked for {split}/<subject>_{split}.csv)"
            )
            raise DataNotFoundError(msg)

    # Subjects sorted (the "subject" order); each read once, tokenized only when kept.
    sources = [_Subject(folder, s, split, k, cap, tok, cache_dir) for s in chosen]
    pairs = [(si, q) for si, source in enumerate(sources) for q in range(source.count())]
    # The shuffle and the arrivals are drawn over every question, so the first
    # ``limit`` requests are those of the whole workload; only their prompts are built.
    positions = rng.permutation(len(pairs)) if order == "shuffle" else np.arange(len(pairs))
    arrivals = poisson_arrivals(len(pairs), arrival_rate, rng)
    kept = positions.tolist() if most is None else positions[:most].tolist()
    wanted: list[list[int] | None] = [None] * len(sources)
    if most is not None:
        wanted = [[] for _ in sources]
        for index in sorted(kept):
            si, q = pairs[index]
            wanted[si].append(q)
    built: list[tuple[npt.NDArray[np.uint32], npt.NDArray[np.int64], dict[int, int] | None]] = []
    for source, subset in zip(sources, wanted, strict=True):
        if subset is not None and not subset:
            built.append((np.zeros(0, dtype=np.uint32), np.zeros(1, dtype=np.int64), {}))
            continue
        tokens, offsets = source.tokens(subset)
        frozen_tokens(tokens)
        local = None if subset is None else {q: i for i, q in enumerate(subset)}
        built.append((tokens, offsets, local))
    requests = []
    for position, index in enumerate(kept):
        si, q = pairs[index]
        tokens, offsets, local = built[si]
        row = q if local is None else local[q]
        requests.append(
            Request(
                request_id=position,
                tokens=tokens[offsets[row] : offsets[row + 1]],
                arrival=float(arrivals[position]),
                output_len=out_len,
                group=sources[si].name,
            )
        )
    metadata = {
        "source": str(folder),
        "tokenizer": tok.name,
        "seed": int(seed),
        "template": TEMPLATE,
        "params": {
            "subjects": list(chosen),
            "shots": k,
            "max_prefix_tokens": cap,
            "split": split,
            "rate": arrival_rate,
            "order": order,
            "output_len": out_len,
            "limit": most,
        },
        "cache_dir": None if cache_dir is None else str(cache_dir),
    }
    return Workload("mmlu", requests, metadata)
