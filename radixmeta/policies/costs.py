"""Prefill and decode time models: how long an engine takes, in seconds.

The policies that reason in time (:mod:`~radixmeta.policies.preble` and
:mod:`~radixmeta.policies.default`) and the simulator take their times from here,
so a simulated fleet and the policy routing it agree on what a prefill costs.

A **prefill model** is any callable ``(extend, context) -> seconds``: the time to
compute the KV of ``extend`` new tokens at the end of a sequence of ``context``
tokens in all (the cached prefix plus the new part, so ``context >= extend``).
A **decode model** is a callable ``(batch_size, context) -> seconds``: the time of
one decode step of a batch whose sequences hold ``context`` tokens in all.

The built-in models are the regressions that Preble (Srivatsa et al., ICLR 2025,
``WukLab/preble``, ``benchmarks/exp_configs/model_equations.py``) fitted on SGLang
with FlashInfer kernels, named by model and by the GPU they were fitted on. Every
model returns 0.0 when there is nothing to compute (``extend == 0``, an empty
batch); the fits themselves are only meaningful for one token or more.

Examples
--------
>>> from radixmeta.policies import costs
>>> round(costs.mistral_7b_a6000_prefill(512, 512) * 1e3, 1)   # milliseconds
66.7
>>> costs.prefill_model("llama3_70b_h100_tp2") is costs.llama3_70b_h100_tp2_prefill
True
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

from radixmeta.errors import InputTypeError, InvalidInputError, PolicyError

__all__ = [
    "DECODE_MODELS",
    "DEFAULT_PREFILL",
    "DecodeTime",
    "MISTRAL_7B_A6000_KV_TOKENS",
    "PREFILL_MODELS",
    "PrefillTime",
    "TPOT_SEED",
    "decode_model",
    "llama3_70b_a100_tp2_prefill",
    "model_name",
    "llama3_70b_h100_tp2_prefill",
    "mistral_7b_a6000_decode",
    "mistral_7b_a6000_prefill",
    "prefill_model",
]

PrefillTime = Callable[[int, int], float]
"""``(extend, context) -> seconds``: prefill ``extend`` tokens of a ``context``-token sequence."""

DecodeTime = Callable[[int, int], float]
"""``(batch_size, context) -> seconds``: one decode step of a batch holding ``context`` tokens."""

#: Seconds per output token that Preble's scheduler assumes until it has measured
#: one (its deque of measured TPOTs starts with this value).
TPOT_SEED = 0.15

#: KV capacity in tokens of one Mistral-7B worker on a 48 GB A6000 at
#: ``mem_fraction_static 0.8`` (Preble's ``max_tokens_gpu`` and simulator capacity).
MISTRAL_7B_A6000_KV_TOKENS = 198_516

# Mistral-7B on an A6000, in milliseconds, by part of the forward pass.
_GAIN = 1 / 0.9 / 1e3  # every Mistral-7B A6000 time is divided by 0.9, then ms -> s
_FLOOR_MS = 22.0  # the linear layers' time for a batch below 192 tokens


def _mistral_linear_ms(batched: int) -> float:
    """Linear layers for ``batched`` tokens in one forward pass."""
    if batched >= 384:
        return 0.10842571 * batched + 4.209777054806409
    if batched >= 192:
        # The fitted parabola falls under the small-batch floor above 314 tokens
        # and under zero near 354; held at the floor so no time is negative.
        return max(-118.0 + 1.25 * batched - 2.56e-3 * batched * batched, _FLOOR_MS)
    return _FLOOR_MS


def _mistral_attention_ms(requests: int, context: int, unique: int) -> float:
    """Attention over ``context`` tokens of ``requests`` sequences, ``unique`` of them distinct."""
    if context <= 1024:
        return 0.32
    ms = 1.86e-4 * context + 0.159
    if unique <= 1024 * requests and requests * unique <= 32 * 256 * 2048:
        ms /= 2  # short, mostly shared sequences: the kernel's cheap path
    return ms


def mistral_7b_a6000_prefill(extend: int, context: int) -> float:
    """Prefill time of Mistral-7B on one A6000 (SGLang, FlashInfer), in seconds.

    The default prefill model. Linear layers by batched tokens, attention by context
    length, and a quadratic term for long extends in long contexts, all divided by
    0.9 (Preble's fit, used by its global scheduler as ``T_prefill``).

    Parameters
    ----------
    extend : int
        Tokens to compute (the uncached part of the prompt), ``>= 0``.
    context : int
        Tokens of the whole sequence, cached prefix included, ``>= extend``.

    Returns
    -------
    float
        Seconds; 0.0 when ``extend == 0``.

    Raises
    ------
    InvalidInputError
        ``extend < 0`` or ``context < extend``.

    Notes
    -----
    In milliseconds before the division by 0.9: linear ``0.10842571 n + 4.2098`` for
    ``n >= 384`` tokens, ``-118 + 1.25 n - 2.56e-3 n^2`` for ``192 <= n < 384``, 22
    below; attention 0.32 for a context up to 1024, else ``1.86e-4 ctx + 0.159``,
    halved when ``extend <= 1024``; plus ``1.13e-3 e + 1.75e-3 ctx + 2.19e-6 e ctx``
    when ``e * ctx > 1024**2``. One change to the fit: its middle parabola, which
    drops below the 22 ms floor above 314 tokens and below zero near 354, is held at
    the floor. The linear part is therefore not monotone: 34.6 ms at 244 tokens,
    22 ms from 314 to 383 tokens, 45.8 ms at 384 (so ``T(250, 250)`` is 38.7 ms and
    ``T(350, 350)`` 24.8 ms).

    Examples
    --------
    >>> [round(mistral_7b_a6000_prefill(n, n) * 1e3, 1) for n in (64, 1024, 4096)]
    [24.8, 128.4, 553.1]
    >>> round(mistral_7b_a6000_prefill(512, 4096) * 1e3, 1)   # a 512-token tail on a 3.5k hit
    80.6
    """
    _check_extend(extend, context)
    if extend == 0:
        return 0.0
    ms = _mistral_linear_ms(extend) + _mistral_attention_ms(1, context, extend)
    if extend * context > 1024 * 1024:
        ms += 1.13e-3 * extend + 1.75e-3 * context + 2.19e-6 * extend * context
    return ms * _GAIN


def mistral_7b_a6000_decode(batch_size: int, context: int) -> float:
    """One decode step of Mistral-7B on one A6000 (SGLang, FlashInfer), in seconds.

    The same linear and attention parts as :func:`mistral_7b_a6000_prefill`, for a
    batch of ``batch_size`` sequences that each add one token, divided by 0.9 (Preble's
    simulator). Sequences are taken as unshared: ``context`` counts distinct tokens.

    Parameters
    ----------
    batch_size : int
        Sequences in the batch, ``>= 0``.
    context : int
        Tokens those sequences hold in all, ``>= 0``.

    Returns
    -------
    float
        Seconds; 0.0 for an empty batch.

    Examples
    --------
    >>> round(mistral_7b_a6000_decode(1, 512) * 1e3, 1)
    24.8
    >>> round(mistral_7b_a6000_decode(32, 32 * 2048) * 1e3, 1)
    38.2
    """
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        msg = f"batch_size must be an int, got {type(batch_size).__name__}"
        raise InputTypeError(msg)
    if isinstance(context, bool) or not isinstance(context, int):
        msg = f"context must be an int, got {type(context).__name__}"
        raise InputTypeError(msg)
    if batch_size < 0 or context < 0:
        msg = f"batch_size and context must be >= 0, got {batch_size} and {context}"
        raise InvalidInputError(msg)
    if batch_size == 0:
        return 0.0
    linear = _mistral_linear_ms(batch_size)
    return (linear + _mistral_attention_ms(batch_size, context, context)) * _GAIN


def llama3_70b_a100_tp2_prefill(extend: int, context: int) -> float:
    """Prefill time of Llama-3-70B on two A100s (tensor parallel), in seconds.

    ``(28.9314 + 0.182233 e + 4.00365e-3 ctx + 2.55050e-6 e ctx) / 1e3`` per request.
    Preble's scheduler imports this fit under a name that says H100; its numbers are
    those of the A100 TP2 fit, so it is named after that GPU here.

    Parameters
    ----------
    extend, context : int
        As in :func:`mistral_7b_a6000_prefill`.

    Examples
    --------
    >>> [round(llama3_70b_a100_tp2_prefill(n, n) * 1e3) for n in (512, 2048, 8192)]
    [125, 421, 1726]
    """
    _check_extend(extend, context)
    if extend == 0:
        return 0.0
    return (
        28.931389307785594
        + 1.82233431e-01 * extend
        + 4.00365142e-03 * context
        + 2.55050069e-06 * extend * context
    ) / 1e3


def llama3_70b_h100_tp2_prefill(extend: int, context: int) -> float:
    """Prefill time of Llama-3-70B on two H100s (tensor parallel), in seconds.

    ``(18.6673 + 0.0798791 e + 2.68532e-3 ctx + 7.44345e-7 e ctx) / 1e3`` per request
    (Preble's simulator fit).

    Parameters
    ----------
    extend, context : int
        As in :func:`mistral_7b_a6000_prefill`.

    Examples
    --------
    >>> round(llama3_70b_h100_tp2_prefill(2048, 2048) * 1e3, 1)
    190.9
    """
    _check_extend(extend, context)
    if extend == 0:
        return 0.0
    return (
        18.667307208113755
        + 7.98791064e-02 * extend
        + 2.68531603e-03 * context
        + 7.44344923e-07 * extend * context
    ) / 1e3


PREFILL_MODELS: Mapping[str, PrefillTime] = MappingProxyType(
    {
        "mistral_7b_a6000": mistral_7b_a6000_prefill,
        "llama3_70b_a100_tp2": llama3_70b_a100_tp2_prefill,
        "llama3_70b_h100_tp2": llama3_70b_h100_tp2_prefill,
    }
)
"""The built-in prefill models by name (read-only)."""

DECODE_MODELS: Mapping[str, DecodeTime] = MappingProxyType(
    {"mistral_7b_a6000": mistral_7b_a6000_decode}
)
"""The built-in decode-step models by name (read-only)."""

#: The name of the prefill model used when none is given.
DEFAULT_PREFILL = "mistral_7b_a6000"


def prefill_model(model: str | PrefillTime = DEFAULT_PREFILL) -> PrefillTime:
    """Return a prefill model: a built-in by name, or ``model`` itself if it is callable.

    Parameters
    ----------
    model : str or callable
        A key of :data:`PREFILL_MODELS`, or any ``(extend, context) -> seconds``.

    Raises
    ------
    PolicyError
        An unknown name (the message lists the known ones).
    InputTypeError
        Neither a str nor a callable.
    """
    return _lookup("prefill", model, PREFILL_MODELS)


def decode_model(model: str | DecodeTime = DEFAULT_PREFILL) -> DecodeTime:
    """Return a decode-step model: a built-in by name, or ``model`` itself if it is callable.

    Parameters
    ----------
    model : str or callable
        A key of :data:`DECODE_MODELS`, or any ``(batch_size, context) -> seconds``.

    Raises
    ------
    PolicyError
        An unknown name (the message lists the known ones).
    InputTypeError
        Neither a str nor a callable.
    """
    return _lookup("decode", model, DECODE_MODELS)


_Model = Callable[[int, int], float]


def _lookup(kind: str, model: str | _Model, table: Mapping[str, _Model]) -> _Model:
    if isinstance(model, str):
        try:
            return table[model]
        except KeyError:
            msg = f"unknown {kind} model {model!r}; known: {', '.join(sorted(table))}"
            raise PolicyError(msg) from None
    if callable(model):
        return model
    msg = f"{kind} model must be a name or a callable, got {type(model).__name__}"
    raise InputTypeError(msg)


def model_name(model: str | Callable[..., float]) -> str:
    """The name a model goes by in a policy's repr: its key, or the callable's ``__name__``."""
    return model if isinstance(model, str) else getattr(model, "__name__", type(model).__name__)


def _check_extend(extend: int, context: int) -> None:
    if extend < 0 or context < extend:
        msg = f"need 0 <= extend <= context, got extend={extend}, context={context}"
        raise InvalidInputError(msg)
