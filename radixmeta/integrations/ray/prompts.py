"""What a Ray Serve request routes on: the OpenAI body among a pending request's arguments.

Ray Serve hands a request router the call's positional and keyword arguments. A
deployment served behind an ingress (Ray Serve LLM's ``OpenAiIngress`` calling its
``LLMServer`` replicas) gets a request object with a ``prompt`` or ``messages``
attribute (a pydantic model); a deployment called with a plain JSON body gets a
mapping. Either is read here into the body that the gateway's token rule
(:func:`radixmeta.gateway.tokenize.prompt_of`) takes, so a Ray router and
``radixmeta serve`` tokenize the same request alike. This module does not import Ray.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from radixmeta.gateway.tokenize import Tokenizer, namespace_of, prompt_of

__all__ = ["body_of", "prompt_of_request"]

#: The fields a router reads of a request object (the rest of a large pydantic
#: model is never copied): the prompt, and what names its page namespace.
_FIELDS = ("prompt", "messages", "input_ids", "model", "lora_path", "lora", "cache_salt")


def _as_body(value: Any) -> Mapping[str, Any] | None:
    """``value`` as an OpenAI body, when it is one (a mapping or a request object)."""
    if isinstance(value, Mapping):
        if "prompt" in value or "messages" in value or "input_ids" in value:
            return value
        return None
    if any(getattr(value, name, None) is not None for name in ("prompt", "messages")):
        found = {name: getattr(value, name, None) for name in _FIELDS}
        return {name: field for name, field in found.items() if field is not None}
    return None


def body_of(args: Sequence[Any], kwargs: Mapping[Any, Any]) -> Mapping[str, Any] | None:
    """The first argument of a call that is an OpenAI body, or None.

    Parameters
    ----------
    args, kwargs
        A ``PendingRequest``'s ``args`` and ``kwargs``.

    Returns
    -------
    mapping or None
        A mapping with ``prompt``, ``messages`` or ``input_ids`` as given; for a
        request object, a new mapping of its routing fields.

    Examples
    --------
    >>> body_of([{"prompt": "hello"}], {})
    {'prompt': 'hello'}
    >>> body_of([], {"request": {"messages": []}})
    {'messages': []}
    >>> body_of(["no body here"], {}) is None
    True
    """
    for value in (*args, *kwargs.values()):
        body = _as_body(value)
        if body is not None:
            return body
    return None


def prompt_of_request(
    body: Mapping[str, Any], tokenizer: Tokenizer, lora_models: Collection[str] = ()
) -> tuple[npt.NDArray[np.uint32], str | None]:
    """The tokens and page namespace the router matches for one body.

    A chat (``messages``) goes through the tokenizer's chat rule, anything else
    through the completion rule; token ids in the body are used as they are.

    Raises
    ------
    InputTypeError, InvalidInputError
        The prompt or messages are malformed (the router routes such a request by
        load and counts it).

    Examples
    --------
    >>> from radixmeta.gateway.tokenize import ByteTokenizer
    >>> tokens, namespace = prompt_of_request(
    ...     {"prompt": "hi", "cache_salt": "t1"}, ByteTokenizer())
    >>> tokens.tolist(), namespace
    ([104, 105], 'salt:t1')
    """
    kind = "chat" if "messages" in body and "prompt" not in body else "completions"
    tokens, _ = prompt_of(body, kind, tokenizer)
    return tokens, namespace_of(body, lora_models)
