"""Attention sinks in the CPU kernel (`sinks`, docs/ops.md "Attention sinks"): head h's logit joins
every row's softmax denominator as a key of value 0. The online softmax starts each row at
max = sink_h, sum = 1; checked against otfuse.verify.reference on every path (packed, direct /
decoding), every ISA variant, with causal / window / padding / KV cache / softcap / ALiBi / bias /
RoPE, and the rows that see no key (0 with a finite sink, whatever empty_rows says)."""

from __future__ import annotations

import numpy as np
import pytest

from kernels.attention.test_alibi import padding, with_past
from kernels.attention.test_cpu import BF16, DTYPES, F16, F32, _under_each_isa, check, qkv, run_op, seeded


def gpt_oss_sinks(n: int, rng) -> np.ndarray:
    """Per-head logits of gpt-oss's size (a few units, both signs)."""
    return (rng.standard_normal(n) * 3).astype(np.float32)


@pytest.mark.parametrize("mask", ["none", "causal", "window", "padding"])
@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sinks_match_reference(library, monkeypatch, dtype, path, mask):
    # Small tiles: rows cross several key tiles (the running max moves past the sink or not).
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "5x16")
    rng = seeded("sinks", dtype.name, path, mask)
    for sq, skv in [(37, 37), (11, 53), (1, 70)]:
        inputs = qkv(rng, 2, 4, 2, sq, skv, 32, dtype)
        if skv > sq:
            inputs = with_past(inputs, skv - sq)
        inputs["sinks"] = gpt_oss_sinks(4, rng)
        attrs = {"num_heads": 4, "kv_num_heads": 2}
        if mask in ("causal", "window"):
            attrs["causal"] = 1
        if mask == "window":
            attrs["window"] = 7
        if mask == "padding":
            inputs["key_padding_mask"] = padding(rng, 2, skv)
        check(library, inputs, attrs, outputs=("Y", "present_key", "present_value"))


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
@pytest.mark.parametrize("sq", [1, 40])
def test_sinks_on_every_isa_variant(library, monkeypatch, dtype, sq):
    # Default (AVX-512 where it runs at full rate), AVX2 and the baseline, each against the reference.
    rng = seeded("sinks-isa", dtype.name, sq)
    inputs = qkv(rng, 1, 8, 2, sq, 150, 64, dtype)
    if sq < 150:
        inputs = with_past(inputs, 150 - sq)
    inputs["sinks"] = gpt_oss_sinks(8, rng)
    inputs["key_padding_mask"] = padding(rng, 1, 150)
    _under_each_isa(library, monkeypatch, inputs, {"num_heads": 8, "kv_num_heads": 2, "causal": 1, "window": 128})


@pytest.mark.parametrize("empty_rows", ["zero", "uniform"])
def test_a_row_that_sees_no_key_is_zero_with_a_finite_sink(library, empty_rows):
    # Left padding hides every key from the first query rows: the sink takes all their weight and
    # its value is 0. A head whose sink is -inf has no sink: its rows follow empty_rows.
    rng = seeded("sinks-empty", empty_rows)
    inputs = qkv(rng, 2, 2, 1, 9, 9, 16, F32)
    mask = np.ones((2, 9), np.int64)
    mask[0, :4] = 0
    inputs["key_padding_mask"] = mask
    inputs["sinks"] = np.array([0.5, -np.inf], np.float32)
    (y,) = check(library, inputs, {"num_heads": 2, "kv_num_heads": 1, "causal": 1, "empty_rows": empty_rows})
    assert np.all(y[0, 0, :4] == 0)  # head 0 (sink 0.5), rows 0-3 of batch 0 see no key
    if empty_rows == "uniform":  # head 1 (no sink): the mean of V over all keys
        np.testing.assert_allclose(y[0, 1, :4], np.broadcast_to(inputs["V"][0, 0].mean(0), (4, 16)), rtol=1e-5)
    else:
        assert np.all(y[0, 1, :4] == 0)


def test_sink_of_minus_inf_is_no_sink(library):
    rng = seeded("sinks-minus-inf")
    inputs = qkv(rng, 1, 3, 3, 20, 20, 16, F32)
    (without,) = check(library, inputs, {"num_heads": 3, "causal": 1})
    inputs["sinks"] = np.full(3, -np.inf, np.float32)
    (with_inf,) = check(library, inputs, {"num_heads": 3, "causal": 1})
    np.testing.assert_array_equal(without, with_inf)


def test_a_large_sink_takes_the_weight(library):
    # sink_h = 80 against scores of a few units: exp(s - 80) ~ 1e-35, Y ~ 0 (no overflow, no NaN).
    rng = seeded("sinks-large")
    inputs = qkv(rng, 1, 2, 2, 4, 30, 16, F32)
    inputs["sinks"] = np.array([80.0, -80.0], np.float32)
    (y,) = check(library, inputs, {"num_heads": 2})
    assert np.abs(y[0, 0]).max() < 1e-20 and np.abs(y[0, 1]).max() > 1e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sinks_with_softcap_alibi_bias_and_rope(library, dtype):
    rng = seeded("sinks-all", dtype.name)
    sq = skv = 40
    inputs = qkv(rng, 1, 2, 2, sq, skv, 32, dtype)
    inputs["cos"] = np.cos(rng.standard_normal((1, 1, sq, 32), dtype=np.float32))
    inputs["sin"] = np.sin(rng.standard_normal((1, 1, sq, 32), dtype=np.float32))
    inputs["attn_bias"] = rng.standard_normal((1, 2, sq, skv), dtype=np.float32)
    inputs["alibi_slopes"] = np.array([0.5, -0.125], np.float32)
    inputs["sinks"] = np.array([1.5, -2.0], np.float32)
    check(library, inputs, {"num_heads": 2, "causal": 1, "window": 9, "softcap": 4.0}, op="RopeAttention")


def test_no_keys_at_all_is_zero(library):
    rng = seeded("sinks-skv0")
    inputs = qkv(rng, 1, 2, 2, 3, 0, 16, F32)
    inputs["sinks"] = np.array([0.0, 1.0], np.float32)
    (y,) = check(library, inputs, {"num_heads": 2})
    assert np.all(y == 0)


@pytest.mark.parametrize("bad", ["shape", "type", "nan", "plus_inf"])
def test_bad_sinks_fail_with_one_message(library, bad):
    rng = seeded("sinks-bad", bad)
    inputs = qkv(rng, 1, 4, 4, 3, 3, 16, F32)
    inputs["sinks"] = {"shape": np.zeros(8, np.float32), "type": np.zeros(4, np.float16),
                       "nan": np.array([0, np.nan, 0, 0], np.float32),
                       "plus_inf": np.array([0, 0, np.inf, 0], np.float32)}[bad]
    with pytest.raises(Exception, match="sinks"):
        run_op(library, "Attention", inputs, {"num_heads": 4})


def test_bf16_dtype_is_covered():
    assert BF16 in DTYPES


@pytest.mark.parametrize("mask", ["none", "window", "padding"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_sinks_count_once_when_decoding_splits_the_keys(library, monkeypatch, dtype, mask):
    # Decoding over a long past splits the keys of each row block across tasks and merges their
    # partial results (test_cpu.test_decode_key_splits): the sink is one key of the row, so it
    # belongs to one split only, not to each. Padding hides every key of batch 1's first split.
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "4x16")
    rng = seeded("sinks-splits", dtype.name, mask)
    b, n, nkv, d, skv = 2, 4, 2, 24, 300
    for sq in (1, 3):
        inputs = with_past(qkv(rng, b, n, nkv, sq, skv, d, dtype), skv - sq)
        inputs["sinks"] = gpt_oss_sinks(n, rng)
        attrs = {"num_heads": n, "kv_num_heads": nkv, "causal": 1}
        if mask == "window":
            attrs["window"] = 200
        elif mask == "padding":
            key_mask = np.ones((b, skv), np.int64)
            key_mask[1, :100] = 0
            inputs["key_padding_mask"] = key_mask
        check(library, inputs, attrs)
