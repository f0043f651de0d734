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


PREFILLS = [mistral_7b_a6000_prefill, llama3_70b_a100_tp2_prefill, llama3_70b_h100_tp2_prefill]


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
        "llama3_70b_a100_tp2",
        "llama3_70b_h100_tp2",
        "mistral_7b_a6000",
    ]
    assert costs.prefill_model() is mistral_7b_a6000_prefill
    assert costs.prefill_model(costs.DEFAULT_PREFILL) is mistral_7b_a6000_prefill
    assert costs.decode_model("mistral_7b_a6000") is mistral_7b_a6000_decode

    def own(extend: int, context: int) -> float:
        return 0.0

    assert costs.prefill_model(own) is own
    assert costs.model_name(own) == "own" and costs.model_name("x") == "x"
    with pytest.raises(PolicyError, match=r"unknown prefill model 'a100'; known: llama3_70b_a100"):
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
