"""The prefill and decode time models of radixmeta.policies.costs against Preble's numbers."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixmeta.errors import InputTypeError, InvalidInputError, PolicyError
from radixmeta.policies import costs
from radixmeta.policies.costs import (
    llama3_70b_a100_tp2_prefill,
    llama3_70b_h100_tp2_prefill,
    mistral_7b_a6000_decode,
    mistral_7b_a6000_prefill,
)

MS = 1e-3


@pytest.mark.parametrize(
    ("extend", "context", "ms"),
    [  # the evaluated points of the reference (policies.md 1.4), to 0.1 ms (1024: 128)
        (64, 64, 24.8),
        (512, 512, 66.7),
        (512, 4096, 80.6),
        (1024, 1024, 128.4),
        (2048, 2048, 268.8),
        (4096, 4096, 553.1),
        (8192, 8192, 1183.0),
        (16384, 16384, 2687.7),
    ],
)
def test_mistral_7b_a6000_prefill_anchors(extend: int, context: int, ms: float) -> None:
    assert mistral_7b_a6000_prefill(extend, context) == pytest.approx(ms * MS, abs=0.05 * MS)


def test_mistral_7b_a6000_prefill_pieces() -> None:
    # below 192 tokens and a context up to 1024: (22 + 0.32) / 0.9 ms
    assert mistral_7b_a6000_prefill(100, 1024) == pytest.approx(22.32 / 0.9 * MS)
    # the middle parabola at 200 tokens, in a context above 1024 (attention halved)
    parabola = -118 + 1.25 * 200 - 2.56e-3 * 200**2
    attention = (1.86e-4 * 2048 + 0.159) / 2
    assert mistral_7b_a6000_prefill(200, 2048) == pytest.approx((parabola + attention) / 0.9 * MS)
    # an extend above 1024 does not halve attention; the quadratic term applies
    e, c = 2048, 4096
    ms = 0.10842571 * e + 4.209777054806409 + 1.86e-4 * c + 0.159
    ms += 1.13e-3 * e + 1.75e-3 * c + 2.19e-6 * e * c
    assert mistral_7b_a6000_prefill(e, c) == pytest.approx(ms / 0.9 * MS)


def test_the_middle_piece_is_held_at_the_floor() -> None:
    floor = mistral_7b_a6000_prefill(100, 100)
    assert mistral_7b_a6000_prefill(244, 244) > floor  # the parabola's top
    for n in (320, 354, 370, 383):  # where the fit falls below the floor and below zero
        assert mistral_7b_a6000_prefill(n, n) == pytest.approx(floor)


@pytest.mark.parametrize(("n", "ms"), [(512, 125.0), (2048, 421.0), (8192, 1725.7)])
def test_llama3_70b_a100_tp2_anchors(n: int, ms: float) -> None:
    assert llama3_70b_a100_tp2_prefill(n, n) == pytest.approx(ms * MS, abs=0.05 * MS)


def test_llama3_70b_h100_tp2_formula() -> None:
    e, s = 700, 3000
    ms = 18.667307208113755 + 7.98791064e-02 * e + 2.68531603e-03 * s + 7.44344923e-07 * e * s
    assert llama3_70b_h100_tp2_prefill(e, s) == pytest.approx(ms * MS)
    assert llama3_70b_h100_tp2_prefill(e, s) < llama3_70b_a100_tp2_prefill(e, s)


def test_mistral_7b_a6000_decode() -> None:
    assert mistral_7b_a6000_decode(1, 512) == pytest.approx(22.32 / 0.9 * MS)
    assert mistral_7b_a6000_decode(0, 0) == 0.0
    # 32 sequences of 1000 tokens: the linear floor, attention halved (short sequences)
    expected = 22 + (1.86e-4 * 32000 + 0.159) / 2
    assert mistral_7b_a6000_decode(32, 32000) == pytest.approx(expected / 0.9 * MS)
    # of 2048 tokens: more than 1024 per sequence, not halved
    expected = 22 + 1.86e-4 * 65536 + 0.159
    assert mistral_7b_a6000_decode(32, 65536) == pytest.approx(expected / 0.9 * MS)
    # a batch of 400 long sequences: the linear piece and unhalved attention
    expected = 0.10842571 * 400 + 4.209777054806409 + 1.86e-4 * 400 * 3000 + 0.159
    assert mistral_7b_a6000_decode(400, 400 * 3000) == pytest.approx(expected / 0.9 * MS)


PREFILLS = [
    mistral_7b_a6000_prefill,
    llama3_70b_a100_tp2_prefill,
    llama3_70b_h100_tp2_prefill,
    costs.llama3_1_8b_h100_prefill,
    costs.qwen3_32b_h100_prefill,
]


@pytest.mark.parametrize("model", PREFILLS)
def test_nothing_to_compute_takes_no_time(model: costs.PrefillTime) -> None:
    assert model(0, 0) == 0.0
    assert model(0, 5000) == 0.0


@pytest.mark.parametrize("model", PREFILLS)
@pytest.mark.parametrize(("extend", "context"), [(-1, 10), (11, 10)])
def test_bad_lengths(model: costs.PrefillTime, extend: int, context: int) -> None:
    with pytest.raises(InvalidInputError, match=r"need 0 <= extend <= context, got extend="):
        model(extend, context)


def test_bad_decode_arguments() -> None:
    with pytest.raises(InvalidInputError, match="batch_size and context must be >= 0"):
        mistral_7b_a6000_decode(-1, 0)
    with pytest.raises(InputTypeError, match="batch_size must be an int, got float"):
        mistral_7b_a6000_decode(1.0, 0)  # type: ignore[arg-type]


@given(st.integers(0, 20_000), st.integers(0, 20_000))
def test_times_are_finite_and_not_negative(a: int, b: int) -> None:
    extend, context = min(a, b), max(a, b)
    for model in PREFILLS:
        assert 0.0 <= model(extend, context) < 60.0
    assert 0.0 <= mistral_7b_a6000_decode(a, b) < 60.0


@given(st.integers(384, 20_000), st.integers(0, 5_000))
def test_longer_extends_take_longer_above_the_middle_piece(extend: int, more: int) -> None:
    context = 20_000 + more
    assert mistral_7b_a6000_prefill(extend, context) <= mistral_7b_a6000_prefill(
        min(extend + more, context), context
    )


def test_lookup_by_name() -> None:
    assert sorted(costs.PREFILL_MODELS) == [
        "llama3_1_8b_h100",
        "llama3_70b_a100_tp2",
        "llama3_70b_h100_tp2",
        "mistral_7b_a6000",
        "qwen3_32b_h100",
    ]
    assert costs.prefill_model() is mistral_7b_a6000_prefill
    assert costs.prefill_model(costs.DEFAULT_PREFILL) is mistral_7b_a6000_prefill
    assert costs.decode_model("mistral_7b_a6000") is mistral_7b_a6000_decode

    def own(extend: int, context: int) -> float:
        return 0.0

    assert costs.prefill_model(own) is own
    assert costs.model_name(own) == "own" and costs.model_name("x") == "x"
    with pytest.raises(PolicyError, match=r"unknown prefill model 'a100'; known: llama3_1_8b"):
        costs.prefill_model("a100")
    with pytest.raises(PolicyError, match=r"unknown decode model 'llama3_70b_a100_tp2'"):
        costs.decode_model("llama3_70b_a100_tp2")
    with pytest.raises(InputTypeError, match="decode model must be a name or a callable, got int"):
        costs.decode_model(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        costs.PREFILL_MODELS["mine"] = own  # type: ignore[index]  # read-only


def test_constants() -> None:
    assert costs.TPOT_SEED == 0.15
    assert costs.MISTRAL_7B_A6000_KV_TOKENS == 198_516


# -- cost models: architecture, KV pool, roofline ---------------------------------------


def test_parameter_counts_match_the_published_ones() -> None:
    # The counts the model cards publish, from config.json facts alone.
    assert costs.MISTRAL_7B.params == 7_241_732_096
    assert costs.LLAMA3_1_8B.params == 8_030_261_248
    assert costs.QWEN3_32B.params == 32_762_123_264
    assert costs.LLAMA3_1_8B.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert costs.QWEN3_32B.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2


def test_kv_capacity_is_memory_less_weights_over_kv_bytes() -> None:
    mistral = costs.kv_capacity(costs.MISTRAL_7B, costs.A6000, 0.8)
    by_hand = (49_140 * 2**20 * 0.8 - 7_241_732_096 * 2) // 131_072
    assert mistral == by_hand == 203_995
    # The formula lands 2.8 % above Preble's measured pool (CUDA context, activations).
    assert mistral / costs.MISTRAL_7B_A6000_KV_TOKENS == pytest.approx(1.028, abs=0.001)
    assert costs.kv_capacity(costs.LLAMA3_1_8B, costs.H100, 0.874, tp=2) > 2 * 447_728
    with pytest.raises(InvalidInputError, match="does not fit"):
        costs.kv_capacity(costs.QWEN3_32B, costs.A6000, 0.8)
    with pytest.raises(InvalidInputError, match="mem_fraction"):
        costs.kv_capacity(costs.MISTRAL_7B, costs.A6000, 1.5)
    with pytest.raises(InvalidInputError, match="tp must be"):
        costs.kv_capacity(costs.MISTRAL_7B, costs.A6000, 0.8, tp=0)


def test_cost_models_bundle_times_context_and_pool() -> None:
    assert sorted(costs.COST_MODELS) == ["llama3_1_8b_h100", "mistral_7b_a6000", "qwen3_32b_h100"]
    mistral = costs.cost_model("mistral_7b_a6000")
    assert mistral.kv_tokens == costs.MISTRAL_7B_A6000_KV_TOKENS  # measured wins
    assert mistral.formula_kv_tokens == 203_995
    assert mistral.context_len == 32_768
    assert mistral.prefill is mistral_7b_a6000_prefill and mistral.decode is mistral_7b_a6000_decode
    llama = costs.cost_model("llama3_1_8b_h100")
    assert (llama.context_len, llama.kv_tokens) == (131_072, 447_728)
    assert costs.cost_model("qwen3_32b_h100").kv_tokens == 35_175
    for name, model in costs.COST_MODELS.items():
        assert costs.prefill_model(name) is model.prefill
        assert costs.decode_model(name) is model.decode
    with pytest.raises(PolicyError, match="unknown cost model 'gpt'; known: llama3_1_8b_h100"):
        costs.cost_model("gpt")


@pytest.mark.parametrize(
    ("extend", "context"), [(64, 64), (1024, 1024), (4096, 4096), (16384, 16384)]
)
def test_the_roofline_reproduces_prebles_mistral_fit(extend: int, context: int) -> None:
    # The calibration the H100 rooflines rest on (Roofline's docstring).
    roofline = costs.Roofline(costs.MISTRAL_7B, costs.A6000)
    assert roofline.prefill(extend, context) == pytest.approx(
        mistral_7b_a6000_prefill(extend, context), rel=0.03
    )
    assert roofline.decode(32, 32 * 2048) == pytest.approx(
        mistral_7b_a6000_decode(32, 32 * 2048), rel=0.04
    )


def test_the_roofline_by_hand() -> None:
    # Llama-3.1-8B, 1 sequence of 1000 tokens on an H100: memory-bound, the weights
    # and the KV read once at 0.76 of 3.35 TB/s.
    expected = (8_030_261_248 * 2 + 131_072 * 1000) / (3.35e12 * 0.76)
    assert costs.llama3_1_8b_h100_decode(1, 1000) == pytest.approx(expected)
    # 8k new tokens: compute-bound, linear + head + causal attention at 0.72 of 989.4 TFLOP/s.
    m = costs.LLAMA3_1_8B
    flops = (
        2 * m.layers * m.layer_params * 8192
        + 2 * m.vocab * m.hidden
        + 4 * 32 * 32 * 128 * (8192 * 8192 - 8192 * 8191 / 2)
    )
    assert costs.llama3_1_8b_h100_prefill(8192, 8192) == pytest.approx(flops / (989.4e12 * 0.72))
    assert costs.llama3_1_8b_h100_prefill(0, 100) == 0.0
    assert costs.qwen3_32b_h100_decode(0, 0) == 0.0
    with pytest.raises(InvalidInputError, match="need 0 <= extend <= context"):
        costs.qwen3_32b_h100_prefill(5, 4)
    with pytest.raises(InputTypeError, match="batch_size must be an int"):
        costs.llama3_1_8b_h100_decode(1.5, 4)  # type: ignore[arg-type]
