"""From an OpenAI request body to the tokens and namespace the router matches.

Routing by tokens needs the engine's tokenization: :class:`HFTokenizer` loads the engine's
Hugging Face tokenizer (``tokenizers``, from a ``tokenizer.json`` or the local Hugging Face
cache) and applies chat templates through ``transformers`` when it is installed. Without
one, :class:`ByteTokenizer` routes on the prompt's UTF-8 bytes: similar prompts still share
prefixes, but the lengths are not the engine's, so matching against an engine's KV events
is approximate (say so at start). Token ids in the request are used as they are.

Page namespaces follow what the engines put in their events (see
:func:`radixmeta.ingest.namespace_of`): ``lora:<adapter>`` and ``salt:<cache_salt>``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from radixmeta.errors import InputTypeError, InvalidInputError

__all__ = [
    "ByteTokenizer",
    "HFTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "namespace_of",
    "prompt_of",
    "render_chat",
]

Tokens = npt.NDArray[np.uint32]


class Tokenizer(Protocol):
    """What the gateway needs of a tokenizer."""

    name: str
    exact: bool  # the engine's own tokenization (else an approximation)

    def encode(self, text: str) -> Tokens:
        """A completion prompt's tokens, as the engine makes them."""

    def chat(self, messages: list[dict[str, Any]]) -> Tokens:
        """A chat's tokens after the chat template, as the engine makes them."""


def _text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping) and part.get("type") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    msg = f"{where}: a text part needs a string 'text'"
                    raise InvalidInputError(msg)
                parts.append(text)
            elif not isinstance(part, Mapping):
                msg = f"{where}: a content part must be an object, got {type(part).__name__}"
                raise InvalidInputError(msg)
        return "".join(parts)
    msg = f"{where}: content must be a string or a list of parts, got {type(content).__name__}"
    raise InvalidInputError(msg)


def render_chat(messages: list[dict[str, Any]]) -> str:
    """A chat as one prompt, by a plain template (used when no engine template is known).

    Each message becomes ``<|role|>\\ncontent\\n`` and the prompt ends with
    ``<|assistant|>\\n``; radixmeta's stand-in engine renders chats the same way.

    >>> render_chat([{"role": "user", "content": "hi"}])
    '<|user|>\\nhi\\n<|assistant|>\\n'
    """
    out = []
    for i, m in enumerate(messages):
        out.append(f"<|{m['role']}|>\n{_text_of(m.get('content'), f'messages[{i}]')}\n")
    out.append("<|assistant|>\n")
    return "".join(out)


class ByteTokenizer:
    """Route on UTF-8 bytes: one token per byte (approximate against real engines)."""

    name = "bytes"
    exact = False

    def encode(self, text: str) -> Tokens:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint32)

    def chat(self, messages: list[dict[str, Any]]) -> Tokens:
        return self.encode(render_chat(messages))


def _cached_tokenizer_file(name: str) -> Path | None:
    """``tokenizer.json`` of model ``name`` in the local Hugging Face cache, if there."""
    hub = os.environ.get("HF_HUB_CACHE")
    if hub is None:
        home = os.environ.get("HF_HOME", os.path.join(Path.home(), ".cache", "huggingface"))
        hub = os.path.join(home, "hub")
    snapshots = Path(hub) / f"models--{name.replace('/', '--')}" / "snapshots"
    if not snapshots.is_dir():
        return None
    found = sorted(snapshots.glob("*/tokenizer.json"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


class HFTokenizer:
    """A Hugging Face tokenizer: ``tokenizers`` for prompts, ``transformers`` for chats.

    Parameters
    ----------
    source : str
        A ``tokenizer.json`` file, a directory that holds one, or a model name found in
        the local Hugging Face cache (nothing is downloaded).

    Raises
    ------
    InvalidInputError
        No tokenizer found there.
    """

    exact = True

    def __init__(self, source: str) -> None:
        from tokenizers import Tokenizer as _Tokenizer

        path = Path(source)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            cached = _cached_tokenizer_file(source)
            if cached is None:
                msg = (
                    f"no tokenizer at {source!r}: give a tokenizer.json, a directory with "
                    "one, or a model name in the local Hugging Face cache"
                )
                raise InvalidInputError(msg)
            file = cached
        self.name = source
        self.file = file
        self._tokenizer = _Tokenizer.from_file(str(file))
        self._template = self._load_template(file.parent)
        self.templated = self._template is not None

    @staticmethod
    def _load_template(directory: Path) -> Any:
        """The model's chat template through ``transformers``, when it is installed."""
        config = directory / "tokenizer_config.json"
        if not config.is_file():
            return None
        try:
            if not json.loads(config.read_text()).get("chat_template"):
                return None
            from transformers import AutoTokenizer
        except (ImportError, ValueError):
            return None
        return AutoTokenizer.from_pretrained(str(directory), local_files_only=True)

    def encode(self, text: str) -> Tokens:
        return np.array(self._tokenizer.encode(text).ids, dtype=np.uint32)

    def chat(self, messages: list[dict[str, Any]]) -> Tokens:
        if self._template is not None:
            ids = self._template.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True
            )
            if isinstance(ids, Mapping):  # newer transformers return a BatchEncoding
                ids = ids["input_ids"]
            return np.array(list(ids), dtype=np.uint32)
        ids = self._tokenizer.encode(render_chat(messages), add_special_tokens=False).ids
        return np.array(ids, dtype=np.uint32)


def load_tokenizer(source: str | None) -> Tokenizer:
    """:class:`HFTokenizer` of ``source``, or :class:`ByteTokenizer` for None."""
    if source is None:
        return ByteTokenizer()
    return HFTokenizer(source)


def _token_ids(value: Any, where: str) -> Tokens | None:
    """``value`` as token ids when it is a list of ints, else None."""
    if isinstance(value, list) and value and all(type(t) is int for t in value):
        if any(t < 0 or t >= 2**32 for t in value):
            msg = f"{where}: token ids must be in [0, 2**32)"
            raise InvalidInputError(msg)
        return np.array(value, dtype=np.uint32)
    return None


def _messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        msg = "'messages' must be a non-empty list of {role, content} objects"
        raise InvalidInputError(msg)
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            msg = f"messages[{i}] must be an object with a string 'role'"
            raise InvalidInputError(msg)
        _text_of(m.get("content"), f"messages[{i}]")
    return messages


def prompt_of(body: Any, kind: str, tokenizer: Tokenizer) -> tuple[Tokens, bool]:
    """The tokens the router matches for one request, and whether they are the engine's.

    Parameters
    ----------
    body : object
        The decoded JSON body.
    kind : {"completions", "chat"}
    tokenizer : Tokenizer

    Returns
    -------
    (tokens, exact)
        ``exact`` is True for token ids given in the request, or an exact tokenizer.
        A batch of prompts is routed by its first.

    Raises
    ------
    InputTypeError, InvalidInputError
        The body is not an object, or its prompt or messages are malformed (a 400).
    """
    if not isinstance(body, Mapping):
        msg = f"the request body must be a JSON object, got {type(body).__name__}"
        raise InputTypeError(msg)
    given = _token_ids(body.get("input_ids"), "input_ids")  # SGLang's native field
    if given is not None:
        return given, True
    if kind == "chat":
        return tokenizer.chat(_messages(body)), tokenizer.exact
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch: its first prompt
    given = _token_ids(prompt, "prompt")
    if given is not None:
        return given, True
    if isinstance(prompt, str):
        return tokenizer.encode(prompt), tokenizer.exact
    msg = "'prompt' must be a string, a list of token ids, or a list of those"
    raise InvalidInputError(msg)


def namespace_of(body: Mapping[str, Any], lora_models: Collection[str] = ()) -> str | None:
    """The page namespace of a request, as the engines' events key its pages.

    The adapter is SGLang's ``lora_path`` (or ``lora``), else the ``model`` when it names a
    LoRA adapter an engine serves (vLLM routes adapters by model name); the salt is
    ``cache_salt``.

    >>> namespace_of({"model": "m", "cache_salt": "tenant-1"})
    'salt:tenant-1'
    >>> namespace_of({"model": "sql-lora"}, ["sql-lora"])
    'lora:sql-lora'
    """
    lora = body.get("lora_path", body.get("lora"))
    if lora is None and body.get("model") in lora_models:
        lora = body.get("model")
    parts = []
    if lora is not None:
        if not isinstance(lora, str):
            msg = f"lora_path must be a string, got {type(lora).__name__}"
            raise InvalidInputError(msg)
        parts.append(f"lora:{lora}")
    salt = body.get("cache_salt")
    if salt is not None:
        if not isinstance(salt, str):
            msg = f"cache_salt must be a string, got {type(salt).__name__}"
            raise InvalidInputError(msg)
        parts.append(f"salt:{salt}")
    return "|".join(parts) if parts else None
