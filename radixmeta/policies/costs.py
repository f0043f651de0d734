"""Prefill and decode time models: how long an engine takes, in seconds.

The policies that reason in time (:mod:`~radixmeta.policies.preble` and
:mod:`~radixmeta.policies.default`) and the simulator take their times from here,
so a simulated fleet and the policy routing it agree on what a prefill costs.

A **prefill model** is any callable ``(extend, context) -> seconds``: the time to
compute the KV of ``extend`` new tokens at the end of a sequence of ``context``
tokens in all (the cached prefix plus the new part, so ``context >= extend``).
A **decode model** is a callable ``(batch_size, context) -> seconds``: the time of
one decode step of a batch whose sequences hold ``context`` tokens in all.

The Mistral-7B and Llama-3-70B models are the regressions that Preble (Srivatsa et
al., ICLR 2025, ``WukLab/preble``, ``benchmarks/exp_configs/model_equations.py``)
fitted on SGLang with FlashInfer kernels, named by model and by the GPU they were
fitted on. The H100 models of current open models (Llama-3.1-8B, Qwen3-32B) are a
roofline (:class:`Roofline`), since no published fit exists for them: the larger of
compute time and memory time, with two efficiencies calibrated on Preble's
Mistral-7B fit. Every model returns 0.0 when there is nothing to compute
(``extend == 0``, an empty batch); the fits themselves are only meaningful for one
token or more.

A **cost model** (:class:`CostModel`, :data:`COST_MODELS`) bundles a prefill and a
decode model with what the simulator needs besides time: the model's context
length and a worker's KV capacity in tokens, derived from the model's
architecture and the GPU's memory (:func:`kv_capacity`).

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
from dataclasses import dataclass
from types import MappingProxyType

from radixmeta.errors import InputTypeError, InvalidInputError, PolicyError

__all__ = [
    "A6000",
    "COST_MODELS",
    "CostModel",
    "DECODE_MODELS",
    "GPUSpec",
    "H100",
    "LLAMA3_1_8B",
    "MISTRAL_7B",
    "ModelSpec",
    "QWEN3_32B",
    "Roofline",
    "cost_model",
    "kv_capacity",
    "llama3_1_8b_h100_decode",
    "llama3_1_8b_h100_prefill",
    "qwen3_32b_h100_decode",
    "qwen3_32b_h100_prefill",
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
    _check_decode(batch_size, context)
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


# -- hardware and architecture: what a KV pool and a roofline are computed from ------------


@dataclass(frozen=True)
class ModelSpec:
    """The facts of a decoder-only transformer that decide its memory and its FLOPs.

    The numbers are those of the model's Hugging Face ``config.json``; the
    parameter count is computed from them (it matches the published counts to the
    digits shown in the docs). Weights and KV are taken in ``dtype_bytes`` per
    value (2: bfloat16).

    Attributes
    ----------
    name : str
        The Hugging Face id it describes.
    layers, hidden, heads, kv_heads, head_dim, intermediate, vocab : int
        ``num_hidden_layers``, ``hidden_size``, ``num_attention_heads``,
        ``num_key_value_heads``, ``head_dim``, ``intermediate_size`` (a gated MLP of
        three matrices) and ``vocab_size``.
    context_len : int
        ``max_position_embeddings``: the longest sequence (prompt and output) it runs.
    tied_embeddings : bool
        Whether the output head shares the embedding matrix.
    qk_norm : bool
        Whether each layer normalises queries and keys per head (Qwen3).
    dtype_bytes : int
        Bytes per weight and per KV value.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    context_len: int
    tied_embeddings: bool = False
    qk_norm: bool = False
    dtype_bytes: int = 2

    @property
    def layer_params(self) -> int:
        """Weights of one layer: the four attention projections, the MLP, the norms."""
        q = self.hidden * self.heads * self.head_dim
        kv = 2 * self.hidden * self.kv_heads * self.head_dim
        o = self.heads * self.head_dim * self.hidden
        norms = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        return q + kv + o + 3 * self.hidden * self.intermediate + norms

    @property
    def params(self) -> int:
        """All weights: embedding, layers, final norm and (untied) output head."""
        embedding = self.vocab * self.hidden
        head = 0 if self.tied_embeddings else embedding
        return embedding + self.layers * self.layer_params + self.hidden + head

    @property
    def weight_bytes(self) -> int:
        """Bytes of the weights in ``dtype_bytes``."""
        return self.params * self.dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """``2 (K and V) x layers x kv_heads x head_dim x dtype_bytes``."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes


@dataclass(frozen=True)
class GPUSpec:
    """One GPU as the datasheet and ``nvidia-smi`` give it.

    Attributes
    ----------
    name : str
    memory_bytes : int
        Device memory as ``nvidia-smi`` reports it (MiB times 2**20).
    bf16_flops : float
        Dense (no sparsity) bfloat16 tensor throughput, FLOP/s.
    bandwidth : float
        Memory bandwidth, bytes/s.
    """

    name: str
    memory_bytes: int
    bf16_flops: float
    bandwidth: float


_MIB = 1 << 20

#: NVIDIA RTX A6000: 48 GB GDDR6 (``nvidia-smi``: 49,140 MiB), 154.8 TFLOP/s dense
#: bf16, 768 GB/s.
A6000 = GPUSpec("RTX A6000", 49_140 * _MIB, 154.8e12, 768e9)
#: NVIDIA H100 SXM5 80 GB: HBM3 (``nvidia-smi``: 81,559 MiB), 989.4 TFLOP/s dense
#: bf16, 3.35 TB/s.
H100 = GPUSpec("H100 SXM5 80GB", 81_559 * _MIB, 989.4e12, 3.35e12)

#: ``mistralai/Mistral-7B-v0.1``: 7,241,732,096 parameters, context 32,768.
MISTRAL_7B = ModelSpec("mistralai/Mistral-7B-v0.1", 32, 4096, 32, 8, 128, 14336, 32000, 32768)
#: ``meta-llama/Llama-3.1-8B``: 8,030,261,248 parameters, context 131,072.
LLAMA3_1_8B = ModelSpec("meta-llama/Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, 131072)
#: ``Qwen/Qwen3-32B``: 32,762,123,264 parameters, context 40,960.
QWEN3_32B = ModelSpec(
    "Qwen/Qwen3-32B", 64, 5120, 64, 8, 128, 25600, 151936, 40960, qk_norm=True
)


def kv_capacity(model: ModelSpec, gpu: GPUSpec, mem_fraction: float, tp: int = 1) -> int:
    """KV tokens one engine holds: ``(GPU memory x mem_fraction x tp - weights) / KV bytes``.

    SGLang sizes its pool this way: of ``mem_fraction_static`` of the device
    memory, what the weights leave is KV. With tensor parallelism each of ``tp``
    GPUs holds ``1/tp`` of the weights and of every token's KV, so the pool in
    tokens is that of one GPU of ``tp`` times the memory. The CUDA context and
    activation buffers, which SGLang measures at start, are not in the formula:
    it lands a few percent above a measured pool (2.8 % for Mistral-7B on an A6000,
    :data:`MISTRAL_7B_A6000_KV_TOKENS`).

    Raises
    ------
    InvalidInputError
        ``mem_fraction`` outside ``(0, 1]``, ``tp < 1``, or weights that do not fit.

    Examples
    --------
    >>> kv_capacity(MISTRAL_7B, A6000, 0.8)
    203995
    >>> kv_capacity(LLAMA3_1_8B, H100, 0.874)
    447728
    """
    if not 0.0 < mem_fraction <= 1.0:
        msg = f"mem_fraction must be in (0, 1], got {mem_fraction!r}"
        raise InvalidInputError(msg)
    if tp < 1:
        msg = f"tp must be >= 1, got {tp!r}"
        raise InvalidInputError(msg)
    free = gpu.memory_bytes * tp * mem_fraction - model.weight_bytes
    if free <= model.kv_bytes_per_token:
        msg = f"{model.name} does not fit on {tp} x {gpu.name} at mem_fraction {mem_fraction}"
        raise InvalidInputError(msg)
    return int(free // model.kv_bytes_per_token)


class Roofline:
    """Prefill and decode times of a model on a GPU from its FLOPs and its bytes.

    A forward pass takes the larger of its compute time (FLOPs over the GPU's
    dense bf16 throughput times ``compute_efficiency``) and its memory time (bytes
    read over the bandwidth times ``memory_efficiency``):

    - prefill of ``e`` new tokens at the end of ``c``: ``2 P e`` FLOPs in the
      linear layers (``P``: the layers' weights) plus ``4 L H D (e c - e (e - 1) / 2)``
      in causal attention (``L`` layers, ``H`` heads of ``D``); bytes: the weights
      and the context's KV;
    - a decode step of ``b`` sequences holding ``c`` tokens: ``2 (P + head) b + 4 L H D c``
      FLOPs; bytes: the weights and all ``c`` tokens' KV.

    The default efficiencies, 0.72 and 0.76, are those with which this roofline of
    Mistral-7B on an A6000 reproduces Preble's measured fit of it
    (:func:`mistral_7b_a6000_prefill`) within 3 % for whole prompts of 64 to
    16,384 tokens (9 % under for a 512-token tail on a 4k cached prefix), and its
    decode fit within 4 % from 1 sequence to 256 of 2k; where the fit takes its
    cheap attention path for short, mostly shared sequences the roofline is up to
    42 % above it. It is a model, not a measurement: no kernel launch overhead, no
    scheduler time, no tensor-parallel communication.

    Parameters
    ----------
    model : ModelSpec
    gpu : GPUSpec
    compute_efficiency, memory_efficiency : float, default 0.72, 0.76

    Examples
    --------
    >>> r = Roofline(LLAMA3_1_8B, H100)
    >>> round(r.prefill(8192, 8192) * 1e3, 1), round(r.decode(1, 1000) * 1e3, 2)
    (185.2, 6.36)
    """

    __slots__ = ("_attn", "_bytes", "_compute", "_head", "_kv", "_linear", "_memory", "model")

    def __init__(
        self,
        model: ModelSpec,
        gpu: GPUSpec,
        compute_efficiency: float = 0.72,
        memory_efficiency: float = 0.76,
    ) -> None:
        self.model = model
        self._compute = gpu.bf16_flops * compute_efficiency
        self._memory = gpu.bandwidth * memory_efficiency
        self._linear = 2.0 * model.layers * model.layer_params
        self._head = 2.0 * model.vocab * model.hidden
        self._attn = 4.0 * model.layers * model.heads * model.head_dim
        self._bytes = float(model.weight_bytes)
        self._kv = float(model.kv_bytes_per_token)

    def prefill(self, extend: int, context: int) -> float:
        """Seconds to prefill ``extend`` tokens of a ``context``-token sequence."""
        _check_extend(extend, context)
        if extend == 0:
            return 0.0
        pairs = extend * context - extend * (extend - 1) / 2
        flops = self._linear * extend + self._head + self._attn * pairs
        return max(flops / self._compute, (self._bytes + self._kv * context) / self._memory)

    def decode(self, batch_size: int, context: int) -> float:
        """Seconds of one decode step of ``batch_size`` sequences holding ``context`` tokens."""
        _check_decode(batch_size, context)
        if batch_size == 0:
            return 0.0
        flops = (self._linear + self._head) * batch_size + self._attn * context
        return max(flops / self._compute, (self._bytes + self._kv * context) / self._memory)


_LLAMA3_1_8B_H100 = Roofline(LLAMA3_1_8B, H100)
_QWEN3_32B_H100 = Roofline(QWEN3_32B, H100)


def llama3_1_8b_h100_prefill(extend: int, context: int) -> float:
    """Prefill time of Llama-3.1-8B on one H100 80 GB, in seconds: a roofline (:class:`Roofline`).

    Examples
    --------
    >>> [round(llama3_1_8b_h100_prefill(n, n) * 1e3, 1) for n in (512, 4096, 32768)]
    [10.1, 86.4, 1037.2]
    """
    return _LLAMA3_1_8B_H100.prefill(extend, context)


def llama3_1_8b_h100_decode(batch_size: int, context: int) -> float:
    """One decode step of Llama-3.1-8B on one H100 80 GB, in seconds: a roofline.

    Examples
    --------
    >>> round(llama3_1_8b_h100_decode(64, 64 * 4096) * 1e3, 1)
    19.8
    """
    return _LLAMA3_1_8B_H100.decode(batch_size, context)


def qwen3_32b_h100_prefill(extend: int, context: int) -> float:
    """Prefill time of Qwen3-32B on one H100 80 GB, in seconds: a roofline (:class:`Roofline`).

    Examples
    --------
    >>> round(qwen3_32b_h100_prefill(4096, 4096) * 1e3, 1)
    383.6
    """
    return _QWEN3_32B_H100.prefill(extend, context)


def qwen3_32b_h100_decode(batch_size: int, context: int) -> float:
    """One decode step of Qwen3-32B on one H100 80 GB, in seconds: a roofline.

    Examples
    --------
    >>> round(qwen3_32b_h100_decode(16, 16 * 2048) * 1e3, 1)
    29.1
    """
    return _QWEN3_32B_H100.decode(batch_size, context)


PREFILL_MODELS: Mapping[str, PrefillTime] = MappingProxyType(
    {
        "mistral_7b_a6000": mistral_7b_a6000_prefill,
        "llama3_70b_a100_tp2": llama3_70b_a100_tp2_prefill,
        "llama3_70b_h100_tp2": llama3_70b_h100_tp2_prefill,
        "llama3_1_8b_h100": llama3_1_8b_h100_prefill,
        "qwen3_32b_h100": qwen3_32b_h100_prefill,
    }
)
"""The built-in prefill models by name (read-only)."""

DECODE_MODELS: Mapping[str, DecodeTime] = MappingProxyType(
    {
        "mistral_7b_a6000": mistral_7b_a6000_decode,
        "llama3_1_8b_h100": llama3_1_8b_h100_decode,
        "qwen3_32b_h100": qwen3_32b_h100_decode,
    }
)
"""The built-in decode-step models by name (read-only)."""

#: The name of the prefill model used when none is given.
DEFAULT_PREFILL = "mistral_7b_a6000"


@dataclass(frozen=True)
class CostModel:
    """A model served on a GPU: its times, its context length and a worker's KV pool.

    Attributes
    ----------
    name : str
        The key in :data:`COST_MODELS` (and in :data:`PREFILL_MODELS` and
        :data:`DECODE_MODELS`).
    model : ModelSpec
    gpu : GPUSpec
    mem_fraction : float
        SGLang's ``mem_fraction_static`` the pool is sized with.
    tp : int
        Tensor-parallel GPUs per worker.
    source : str
        Where the times come from.
    measured_kv_tokens : int or None
        A pool size measured on a real engine, used instead of the formula.
    """

    name: str
    model: ModelSpec
    gpu: GPUSpec
    mem_fraction: float
    tp: int = 1
    source: str = ""
    measured_kv_tokens: int | None = None

    @property
    def prefill(self) -> PrefillTime:
        """The prefill model."""
        return PREFILL_MODELS[self.name]

    @property
    def decode(self) -> DecodeTime:
        """The decode-step model."""
        return DECODE_MODELS[self.name]

    @property
    def context_len(self) -> int:
        """The longest sequence, prompt and output, the model runs."""
        return self.model.context_len

    @property
    def formula_kv_tokens(self) -> int:
        """:func:`kv_capacity` of the model on the GPU."""
        return kv_capacity(self.model, self.gpu, self.mem_fraction, self.tp)

    @property
    def kv_tokens(self) -> int:
        """A worker's KV pool in tokens: the measured figure if there is one, else the formula."""
        if self.measured_kv_tokens is not None:
            return self.measured_kv_tokens
        return self.formula_kv_tokens


COST_MODELS: Mapping[str, CostModel] = MappingProxyType(
    {
        "mistral_7b_a6000": CostModel(
            "mistral_7b_a6000",
            MISTRAL_7B,
            A6000,
            0.8,
            source="Preble's SGLang/FlashInfer fit",
            measured_kv_tokens=MISTRAL_7B_A6000_KV_TOKENS,
        ),
        # SGLang's default mem_fraction_static on an 80 GB GPU at TP 1:
        # (81,559 MiB - (9.5 + 1/2) GiB reserved) / 81,559 MiB = 0.874.
        "llama3_1_8b_h100": CostModel(
            "llama3_1_8b_h100", LLAMA3_1_8B, H100, 0.874, source="roofline"
        ),
        "qwen3_32b_h100": CostModel("qwen3_32b_h100", QWEN3_32B, H100, 0.874, source="roofline"),
    }
)
"""The cost models by name (read-only): time models, context length and KV pool together."""


def cost_model(name: str) -> CostModel:
    """The cost model called ``name``.

    Raises
    ------
    PolicyError
        An unknown name (the message lists the known ones).

    Examples
    --------
    >>> m = cost_model("llama3_1_8b_h100")
    >>> m.context_len, m.kv_tokens, m.model.kv_bytes_per_token
    (131072, 447728, 131072)
    """
    try:
        return COST_MODELS[name]
    except (KeyError, TypeError):
        msg = f"unknown cost model {name!r}; known: {', '.join(sorted(COST_MODELS))}"
        raise PolicyError(msg) from None


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


def _check_decode(batch_size: int, context: int) -> None:
    # The simulator calls a decode model once per step: the usual call (two plain,
    # non-negative ints) is told apart with two type() tests, not four isinstance().
    if type(batch_size) is int and type(context) is int and batch_size >= 0 and context >= 0:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        msg = f"batch_size must be an int, got {type(batch_size).__name__}"
        raise InputTypeError(msg)
    if isinstance(context, bool) or not isinstance(context, int):
        msg = f"context must be an int, got {type(context).__name__}"
        raise InputTypeError(msg)
    if batch_size < 0 or context < 0:
        msg = f"batch_size and context must be >= 0, got {batch_size} and {context}"
        raise InvalidInputError(msg)
