"""The Ascend (CANN) kernels of the attention family (Attention, RopeAttention), and the rotary and
attention kernels together on the exported fixtures, end to end inside ONNX Runtime sessions,
against otfuse's CPU test double of the CANN runtime (tests/fake_cann) — no NPU, no CANN. The
rotary kernels alone: tests/kernels/rope/test_ascend.py.

As in tests/kernels/norm/test_ascend.py, the session config ``otfuse.ascend_ep.fake_mode=1`` makes the library
register its Ascend kernels under the CPU EP in place of the CPU kernels of the same op and element
type; the double implements the documented aclnn calls (aclnnRotaryPositionEmbedding,
aclnnApplyRotaryPosEmbV2, aclnnFusedInferAttentionScoreV3, aclnnInplaceCopy, ...) on host memory,
checks their arguments as the docs say CANN does, and logs every call. Each op is diffed against
the CPU kernel; the log shows how the node was mapped onto the aclnn arguments.

float32 attention: by default no Ascend float32 Attention/RopeAttention kernel exists (FIA takes
FLOAT16/BFLOAT16 only), so ORT runs the CPU kernel; ``otfuse.ascend_ep.fp32_attention=float16``
(or ``bfloat16``) opts in to FIA with casts around it.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import kernels.attention.test_cpu as A
import kernels.rope.test_cpu as R
from fixtures import fixture_entries, fixture_path
from kernels.ascend_sessions import (APPLY, BF16, COPY, F16, F32, FIA, FP32_KEY, HALF, RPE, close, one_clean_call,
                                     rope, seeded, session)

import otfuse
from otfuse.verify.diff import compare_arrays, tolerance_for
from otfuse.run.feeds import make_feeds
from otfuse.run.session import run


# ============================================================================ attention


def attention(library, op, inputs, attrs, ascend, outputs=("Y",), fp32=None):
    model = A.build_model(op, inputs, attrs, outputs)
    feeds = {}
    for name, array in inputs.items():
        if array is None:
            continue
        feeds[f"{name}_f32" if array.dtype == BF16 else name] = array.astype(F32) if array.dtype == BF16 else array
    results = session(model, library, ascend, fp32).run(None, feeds)
    dtype = inputs["Q"].dtype
    return [r.astype(BF16) if dtype == BF16 else r for r in results]


def attention_vs_cpu(library, inputs, attrs, op="Attention", outputs=("Y",), fp32=None, tol=None):
    got = attention(library, op, inputs, attrs, True, outputs, fp32)
    want = attention(library, op, inputs, attrs, False, outputs)
    for name, g, w in zip(outputs, got, want):
        if name == "Y":
            close(g, w, tol)
        else:  # present_*: exact copies (rotated keys: RotaryEmbedding's values)
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))
    return got


def fia_call(fake) -> dict:
    (call,) = one_clean_call(fake, FIA)
    return call


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("s", [1, 7, 40])
@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_attention_matches_cpu(library, fake, dtype, layout, s, causal):
    inputs = A.qkv(seeded("attn", dtype.name, layout, s, causal), 2, 4, 4, s, s, 32, dtype, layout)
    attention_vs_cpu(library, inputs, {"num_heads": 4, "causal": causal, "layout": layout})
    call = fia_call(fake)
    assert call["inputLayout"] == layout and call["numHeads"] == 4 and call["numKeyValueHeads"] == 0
    assert call["scaleValue"] == pytest.approx(1 / np.sqrt(32))
    assert call["query"] == {"shape": list(inputs["Q"].shape), "dtype": dtype.name}  # read in place
    assert call["key"] == [{"shape": list(inputs["K"].shape), "dtype": dtype.name}]
    if causal and s > 1:  # rightDownCausal with the compressed mask
        assert call["sparseMode"] == 3 and call["attenMask"] == {"shape": [2048, 2048], "dtype": "bool"}
    else:  # decoding one row sees every key: no mask at all
        assert call["sparseMode"] == 0 and call["attenMask"] is None
    assert call["innerPrecise"] == 0


@pytest.mark.parametrize("layout, output_layout, s, want", [
    ("BNSD", "BSND", 6, ("BNSD_BSND", 0)),  # FIA writes Y transposed itself
    ("BNSD", "BSND", 1, ("BNSD", 0)),  # one query row: the two layouts are the same memory
    ("BSND", "BNSD", 6, ("BSND", 1)),  # no BSND_BNSD: scratch, then one copy into Y
    ("BSND", "BNSD", 1, ("BSND", 0)),
])
def test_output_layouts(library, fake, layout, output_layout, s, want):
    inputs = A.qkv(seeded("outl", layout, s), 2, 4, 4, s, s, 16, F16, layout)
    attention_vs_cpu(library, inputs, {"num_heads": 4, "layout": layout, "output_layout": output_layout})
    call = fia_call(fake)
    assert (call["inputLayout"], len(fake.calls(COPY + "GetWorkspaceSize"))) == want


def test_bsh_rank3_inputs(library, fake):
    rng = seeded("bsh")
    inputs = {"Q": A.rand(rng, (2, 5, 4 * 16), F16), "K": A.rand(rng, (2, 5, 2 * 16), F16),
              "V": A.rand(rng, (2, 5, 2 * 16), F16)}
    attention_vs_cpu(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "layout": "BSND"})
    call = fia_call(fake)
    assert call["query"]["shape"] == [2, 5, 4, 16] and call["attentionOut"]["shape"] == [2, 5, 4, 16]


@pytest.mark.parametrize("kv_heads", [1, 2, 8])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_grouped_query_heads(library, fake, dtype, kv_heads):
    inputs = A.qkv(seeded("gqa", dtype.name, kv_heads), 1, 8, kv_heads, 9, 9, 16, dtype)
    attention_vs_cpu(library, inputs, {"num_heads": 8, "kv_num_heads": kv_heads, "causal": 1})
    assert fia_call(fake)["numKeyValueHeads"] == (0 if kv_heads == 8 else kv_heads)


@pytest.mark.parametrize("past, new", [(5, 1), (4, 3), (0, 4)])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_kv_cache_present_is_the_key_list(library, fake, dtype, past, new):
    rng = seeded("cache", dtype.name, past, new)
    inputs = A.qkv(rng, 2, 4, 2, new, new, 16, dtype)
    inputs["past_key"] = A.rand(rng, (2, 2, past, 16), dtype)
    inputs["past_value"] = A.rand(rng, (2, 2, past, 16), dtype)
    attention_vs_cpu(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "causal": 1},
                     outputs=("Y", "present_key", "present_value"))
    call = fia_call(fake)
    assert call["key"] == call["value"] == [{"shape": [2, 2, past + new, 16], "dtype": dtype.name}]
    # past then new rows copied into present_*, then FIA reads them
    copies = fake.calls(COPY + "GetWorkspaceSize")
    assert [c["selfRef"]["shape"][2] for c in copies] == ([past, past] if past else []) + [new, new]


def test_cache_with_bsnd_layout_transposes_into_present(library, fake):
    rng = seeded("cache-bsnd")
    inputs = A.qkv(rng, 1, 4, 2, 3, 3, 16, BF16, "BSND")
    inputs["past_key"], inputs["past_value"] = A.rand(rng, (1, 2, 5, 16), BF16), A.rand(rng, (1, 2, 5, 16), BF16)
    attention_vs_cpu(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "causal": 1, "layout": "BSND"},
                     outputs=("Y", "present_key", "present_value"))
    assert fia_call(fake)["inputLayout"] == "BNSD_BSND"  # present_* are BNSD, Q copied into BNSD scratch


@pytest.mark.parametrize("sq, skv, window", [(9, 9, 3), (4, 12, 5), (1, 12, 4), (1, 3, 4)])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_sliding_window(library, fake, dtype, sq, skv, window):
    rng = seeded("window", dtype.name, sq, skv, window)
    inputs = A.qkv(rng, 2, 2, 2, sq, skv - (skv - sq), 16, dtype)
    if skv > sq:  # a cache so that Skv > Sq
        inputs["past_key"] = A.rand(rng, (2, 2, skv - sq, 16), dtype)
        inputs["past_value"] = A.rand(rng, (2, 2, skv - sq, 16), dtype)
    attention_vs_cpu(library, inputs, {"num_heads": 2, "causal": 1, "window": window})
    call = fia_call(fake)
    if sq > 1:  # band over the compressed mask
        assert (call["sparseMode"], call["preTokens"], call["nextTokens"]) == (4, window - 1, 0)
    elif skv > window:  # Q_S = 1 ignores sparseMode: a full [B, 1, 1, Skv] mask
        assert call["sparseMode"] == 0 and call["attenMask"] == {"shape": [2, 1, 1, skv], "dtype": "bool"}
    else:  # the window covers the whole cache
        assert call["attenMask"] is None
    assert call["innerPrecise"] == 2


def test_more_queries_than_keys_causal(library, fake):
    inputs = A.qkv(seeded("sq>skv"), 1, 2, 2, 6, 4, 16, F16)
    got = attention_vs_cpu(library, inputs, {"num_heads": 2, "causal": 1})
    assert not got[0][0, :, :2].any()  # the first Sq - Skv rows see nothing: 0
    call = fia_call(fake)
    assert call["sparseMode"] == 3 and call["innerPrecise"] == 2


BIAS_SHAPES = {"alibi": (2, 4, 1, 6), "hf_mask": (2, 1, 6, 6), "per_head": (1, 4, 6, 6), "full": (2, 4, 6, 6),
               "rank2": (6, 6)}


@pytest.mark.parametrize("bias_dtype", ["same", "float32"])
@pytest.mark.parametrize("shape", BIAS_SHAPES, ids=BIAS_SHAPES.keys())
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_attn_bias_becomes_pse_shift(library, fake, dtype, shape, bias_dtype):
    rng = seeded("bias", dtype.name, shape, bias_dtype)
    inputs = A.qkv(rng, 2, 4, 4, 6, 6, 16, dtype)
    inputs["attn_bias"] = A.rand(rng, BIAS_SHAPES[shape], dtype if bias_dtype == "same" else F32)
    attention_vs_cpu(library, inputs, {"num_heads": 4})
    call = fia_call(fake)
    b = 2 if BIAS_SHAPES[shape][0] == 2 and len(BIAS_SHAPES[shape]) == 4 else 1
    assert call["pseShift"] == {"shape": [b, 4, 6, 6], "dtype": dtype.name}
    assert call["innerPrecise"] == 2 and call["attenMask"] is None
    expanded = BIAS_SHAPES[shape] != (b, 4, 6, 6) or bias_dtype != "same"
    assert len(fake.calls(COPY + "GetWorkspaceSize")) == (1 if expanded else 0)


@pytest.mark.parametrize("positions", ["index", "mask_cumsum"])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_alibi_slopes_become_a_host_built_pse_shift(library, fake, dtype, positions):
    # FIA V3 has no generated ALiBi: the bias is built on the host (docs/ops.md) and cast to FIA's
    # type by one copy; a KV cache puts the query rows at P + i, the mask has a hole and a 3.
    rng = seeded("alibi", dtype.name, positions)
    inputs = A.qkv(rng, 2, 4, 4, 3, 9, 16, dtype)
    inputs["past_key"], inputs["past_value"] = inputs["K"][:, :, :6], inputs["V"][:, :, :6]
    inputs["K"], inputs["V"] = inputs["K"][:, :, 6:], inputs["V"][:, :, 6:]
    inputs["alibi_slopes"] = np.array([0.5, 0.25, 0.125, 0.0625], F32)
    if positions == "mask_cumsum":
        inputs["key_padding_mask"] = np.array([[0, 0, 1, 1, 1, 1, 1, 1, 1], [1, 0, 1, 3, 1, 1, 1, 1, 1]], np.int64)
    attention_vs_cpu(library, inputs, {"num_heads": 4, "causal": 1, "alibi_positions": positions})
    call = fia_call(fake)
    b = 2 if positions == "mask_cumsum" else 1
    assert call["pseShift"] == {"shape": [b, 4, 3, 9], "dtype": dtype.name}


def test_alibi_slopes_with_attn_bias_are_refused(library, fake):
    rng = seeded("alibi+bias")
    inputs = A.qkv(rng, 1, 2, 2, 3, 3, 16, F16)
    inputs["alibi_slopes"] = np.array([0.5, 0.25], F32)
    inputs["attn_bias"] = np.zeros((1, 1, 3, 3), F16)
    with pytest.raises(Exception, match="one pseShift"):
        attention(library, "Attention", inputs, {"num_heads": 2}, True)


@pytest.mark.parametrize("op", ["Attention", "RopeAttention"])
def test_sinks_are_refused_with_the_reason(library, fake, op):
    # FIA V3 has no sink input, V4/V5's learnableSinkOptional is not mapped (docs/ops.md): the
    # node is refused before FIA is called, saying why.
    rng = seeded("sinks", op)
    inputs = A.qkv(rng, 1, 2, 2, 3, 3, 16, F16)
    if op == "RopeAttention":
        inputs["cos"] = np.ones((1, 1, 3, 16), F16)
        inputs["sin"] = np.zeros((1, 1, 3, 16), F16)
    inputs["sinks"] = np.array([0.5, -1.0], F32)
    with pytest.raises(Exception, match="attention sinks are not mapped"):
        attention(library, op, inputs, {"num_heads": 2}, True)
    assert not fake.calls(FIA)


def test_fully_masked_rows_are_zero(library, fake):
    rng = seeded("fully masked")
    inputs = A.qkv(rng, 1, 2, 2, 4, 4, 16, F16)
    bias = np.zeros((1, 1, 4, 4), F16)
    bias[0, 0, 1, :] = -np.inf  # row 1 sees no key
    inputs["attn_bias"] = bias
    got = attention_vs_cpu(library, inputs, {"num_heads": 2})
    assert not got[0][0, :, 1].any() and not np.isnan(got[0]).any()
    assert fia_call(fake)["innerPrecise"] == 2  # invalid-row correction


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("mask_dtype", [np.bool_, np.int64, np.int32], ids=["bool", "int64", "int32"])
def test_key_padding_mask_builds_a_full_mask(library, fake, mask_dtype, causal):
    rng = seeded("padding", causal, np.dtype(mask_dtype).name)
    inputs = A.qkv(rng, 2, 2, 2, 5, 5, 16, F16)
    mask = np.ones((2, 5), mask_dtype)
    mask[0, :2] = 0  # left padding of batch row 0
    inputs["key_padding_mask"] = mask
    attention_vs_cpu(library, inputs, {"num_heads": 2, "causal": causal})
    call = fia_call(fake)
    assert call["sparseMode"] == 0 and call["attenMask"] == {"shape": [2, 1, 5, 5], "dtype": "bool"}
    assert call["innerPrecise"] == 2
    assert len(fake.calls("aclnnLogicalNotGetWorkspaceSize")) == 1


@pytest.mark.parametrize("case", ["left_padding", "left_padding_bsnd", "causal_sq_gt_skv", "window", "bias",
                                  "bias_one_head"])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_uniform_empty_rows_get_the_mean_of_v(library, fake, dtype, case):
    # FIA writes 0 into rows that see no key; with empty_rows = "uniform" the kernel finds them on
    # the host (key_padding_mask / attn_bias read back after a stream sync), takes the mean of V
    # from a second FIA call with a zero query per kv head, and copies it into those rows
    base = {"bias": "left_padding", "bias_one_head": "causal_sq_gt_skv", "left_padding_bsnd": "left_padding"}
    layout = "BSND" if case.endswith("bsnd") else "BNSD"
    inputs, attrs, empty = A.empty_rows_case(seeded("uniform", dtype.name, case), base.get(case, case), dtype, layout)
    attrs["layout"] = layout
    if case == "bias":  # the padding as a -inf bias [B, 1, 1, Skv] instead of key_padding_mask
        mask = inputs.pop("key_padding_mask")
        inputs["attn_bias"] = np.where(mask != 0, 0, -np.inf).astype(dtype)[:, None, None, :]
    elif case == "bias_one_head":  # and one head of one row masked by a float32 -inf bias
        bias = np.zeros((2, 4, 21, 13), F32)
        bias[1, 2, 10] = -np.inf
        inputs["attn_bias"] = bias
    attrs = {"num_heads": 4, "kv_num_heads": 2, "empty_rows": "uniform", **attrs}
    (y,) = attention_vs_cpu(library, inputs, attrs)
    (main, mean) = one_clean_call(fake, FIA, 2)
    assert main["innerPrecise"] == 2
    mean_shape = [2, 1, 2, 16] if layout == "BSND" else [2, 2, 1, 16]
    assert mean["query"]["shape"] == mean_shape and mean["numHeads"] == 2 and mean["numKeyValueHeads"] == 0
    assert mean["attenMask"] is None and mean["pseShift"] is None and mean["attentionOut"]["shape"] == mean_shape
    assert mean["inputLayout"] == layout and mean["key"] == main["key"] and mean["value"] == main["value"]
    v = inputs["V"].astype(F32)
    if layout == "BSND":  # check in BNSD
        y, v = y.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
    for b, i in zip(*np.nonzero(empty)):
        close(y[b, :, i], np.repeat(v[b].mean(1), 2, axis=0).astype(dtype))
    if case == "bias_one_head":
        close(y[1, 2, 10], v[1, 1].mean(0).astype(dtype))
    read_back = [c for c in fake.calls("aclrtMemcpy") if c["kind"] == 2]
    assert len(read_back) == ("key_padding_mask" in inputs) + ("attn_bias" in inputs)
    assert len(fake.calls("aclrtSynchronizeStream")) >= len(read_back)
    fills = [c for c in fake.calls(COPY + "GetWorkspaceSize") if c["src"]["shape"][1:] == [1, 1, 16]]
    # one broadcast copy per batch row's run of empty positions, one per head for the lone row
    assert len(fills) == {"causal_sq_gt_skv": 2, "bias_one_head": 3}.get(case, 1)


@pytest.mark.parametrize("op", ["Attention", "RopeAttention"])
def test_uniform_empty_rows_float32_opt_in(library, fake, op):
    # the mean comes out of FIA in float16 and is cast into the float32 Y by the fill copy
    rng = seeded("uniform f32", op)
    inputs, attrs, _ = A.empty_rows_case(rng, "left_padding", F32)
    if op == "RopeAttention":
        inputs["cos"], inputs["sin"] = R.cos_sin(rng, (1, 1, 37, 16), F32)
    tol = tolerance_for(np.dtype(F16))[0] * 2
    attention_vs_cpu(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "empty_rows": "uniform", **attrs}, op=op,
                     fp32="float16", tol=tol)
    one_clean_call(fake, FIA, 2)
    (fill,) = [c for c in fake.calls(COPY + "GetWorkspaceSize") if c["src"]["shape"][1:] == [1, 1, 16]]
    assert (fill["selfRef"]["dtype"], fill["src"]["dtype"], fill["selfRef"]["shape"]) == ("float32", "float16",
                                                                                          [2, 2, 19, 16])


def test_uniform_without_empty_rows_reads_back_but_keeps_fia_output(library, fake):
    rng = seeded("uniform none empty")
    inputs = A.qkv(rng, 2, 4, 2, 6, 6, 16, F16)
    mask = np.ones((2, 6), np.int64)
    mask[1, :2] = 0  # left padding, but causal row 2.. sees keys; rows 0, 1 of batch 1 are empty
    inputs["key_padding_mask"] = mask
    attention_vs_cpu(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "empty_rows": "uniform"})
    one_clean_call(fake, FIA, 1)  # not causal: every row sees keys 2..5, no mean needed
    assert [c["kind"] for c in fake.calls("aclrtMemcpy") if c["kind"] == 2] == [2]


@pytest.mark.parametrize("op", ["Attention", "RopeAttention"])
def test_uniform_empty_rows_without_empty_rows_runs_on_fia(library, fake, op):
    # causal (+ window) with Sq <= Skv and no mask or bias: every row sees its own position
    rng = seeded("uniform fia", op)
    inputs = A.qkv(rng, 2, 4, 2, 6, 6, 16, F16)
    inputs["past_key"], inputs["past_value"] = A.rand(rng, (2, 2, 3, 16), F16), A.rand(rng, (2, 2, 3, 16), F16)
    if op == "RopeAttention":
        inputs["cos"], inputs["sin"] = R.cos_sin(rng, (1, 1, 6, 16), F16)
    for window in (0, 4):
        fake.clear()
        attention_vs_cpu(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "causal": 1, "window": window,
                                           "empty_rows": "uniform"}, op=op)
        assert fia_call(fake)["sparseMode"] == (4 if window else 3)
    fake.clear()
    no_keys = {"Q": inputs["Q"], "K": np.zeros((2, 2, 0, 16), F16), "V": np.zeros((2, 2, 0, 16), F16)}
    (y,) = attention_vs_cpu(library, no_keys, {"num_heads": 4, "kv_num_heads": 2, "empty_rows": "uniform"})
    assert not y.any() and not fake.calls(FIA + "GetWorkspaceSize")  # Skv = 0: 0 in both modes


def test_alibi_rounded_to_float16_is_refused(library, fake):
    # alibi_round = 1 is not built by the host pseShift: refused, not computed as the exact form.
    rng = seeded("alibi_round")
    inputs = A.qkv(rng, 1, 2, 2, 3, 3, 16, F16)
    inputs["alibi_slopes"] = np.array([0.5, 0.25], F32)
    inputs["key_padding_mask"] = np.ones((1, 3), np.int64)
    with pytest.raises(Exception, match="alibi_round = 1"):
        attention(library, "Attention", inputs,
                  {"num_heads": 2, "alibi_positions": "mask_cumsum", "alibi_round": 1}, True)

def test_empty_rows_value_is_checked(library, fake):
    with pytest.raises(Exception, match=r"Attention \(node 'fused_attention_0'\): attribute 'empty_rows' must be "
                                        r"\"zero\" or \"uniform\", got \"mean\""):
        _attention_session(library, {"num_heads": 2, "empty_rows": "mean"})


def test_no_keys_at_all_gives_zeros(library, fake):
    rng = seeded("nokeys")
    inputs = {"Q": A.rand(rng, (1, 2, 3, 16), F16), "K": np.zeros((1, 2, 0, 16), F16),
              "V": np.zeros((1, 2, 0, 16), F16)}
    (y,) = attention_vs_cpu(library, inputs, {"num_heads": 2})
    assert not y.any()
    assert not fake.calls(FIA + "GetWorkspaceSize") and fake.calls("aclrtMemsetAsync")


def test_explicit_scale(library, fake):
    inputs = A.qkv(seeded("scale"), 1, 2, 2, 4, 4, 16, BF16)
    attention_vs_cpu(library, inputs, {"num_heads": 2, "scale": 0.3})
    assert fia_call(fake)["scaleValue"] == pytest.approx(0.3)


def test_compressed_mask_is_uploaded_once_per_device(library, fake):
    # ORT unloads the library with the last session that registered it, so keep both alive
    inputs = A.qkv(seeded("mask once"), 1, 2, 2, 4, 4, 16, F16)
    model = A.build_model("Attention", inputs, {"num_heads": 2, "causal": 1})
    sessions = [session(model, library, True) for _ in range(2)]
    for s in sessions:
        s.run(None, inputs)
    assert len(fake.calls(FIA)) == 2
    assert len(fake.calls("aclrtMemcpy")) <= 1  # 0 when an earlier test's session still holds it
    (upload,) = fake.calls("aclrtMemcpy") or [{"count": 2048 * 2048, "kind": 1}]
    assert (upload["count"], upload["kind"]) == (2048 * 2048, 1)


# ----------------------------------------------------------------------------- RopeAttention


@pytest.mark.parametrize("case", ["llama", "gptj", "neox_partial", "sections", "cache"])
@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_rope_attention_rotates_then_attends(library, fake, dtype, case):
    rng = seeded("ropeattn", dtype.name, case)
    attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": 1}
    layout = "BSND" if case == "gptj" else "BNSD"
    inputs = A.qkv(rng, 2, 4, 2, 6, 6, 16, dtype, layout)
    r = 16
    if case == "gptj":
        attrs.update(layout="BSND", rotary_mode="interleaved", rotary_dim=8)
        r = 8
    elif case == "neox_partial":
        attrs.update(rotary_dim=4)
        r = 4
    elif case == "sections":
        attrs.update(rotary_sections=[4, 6, 6])
    cos_shape = (2, 6, 1, r) if layout == "BSND" else (1, 1, 6, r)
    inputs["cos"], inputs["sin"] = R.cos_sin(rng, cos_shape, dtype)
    outputs = ("Y",)
    if case == "cache":
        inputs["past_key"], inputs["past_value"] = A.rand(rng, (2, 2, 3, 16), dtype), A.rand(rng, (2, 2, 3, 16), dtype)
        outputs = ("Y", "present_key", "present_value")
    attention_vs_cpu(library, inputs, attrs, op="RopeAttention", outputs=outputs)
    fia_call(fake)
    sections = 3 if case == "sections" else 1
    assert len(fake.calls(RPE + "GetWorkspaceSize")) == 2 * sections  # Q and the new keys
    assert all(c["mode"] == (1 if case == "gptj" else 0) for c in fake.calls(RPE + "GetWorkspaceSize"))


# ----------------------------------------------------------------------------- float32 policy


def test_float32_attention_keeps_the_cpu_kernel_by_default(library, fake):
    inputs = A.qkv(seeded("f32 default"), 1, 2, 2, 4, 4, 16, F32)
    attention_vs_cpu(library, inputs, {"num_heads": 2}, tol=0)
    assert not fake.calls(FIA + "GetWorkspaceSize")


@pytest.mark.parametrize("cast", ["float16", "bfloat16"])
@pytest.mark.parametrize("op", ["Attention", "RopeAttention"])
def test_float32_attention_opt_in_casts_around_fia(library, fake, op, cast):
    rng = seeded("f32 opt-in", op, cast)
    inputs = A.qkv(rng, 1, 4, 2, 5, 5, 16, F32)
    inputs["attn_bias"] = A.rand(rng, (1, 1, 5, 5), F32)
    if op == "RopeAttention":
        inputs["cos"], inputs["sin"] = R.cos_sin(rng, (1, 1, 5, 16), F32)
    tol = tolerance_for(np.dtype(F16) if cast == "float16" else np.dtype(BF16))
    attention_vs_cpu(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, op=op, fp32=cast, tol=tol[0] * 2)
    call = fia_call(fake)
    assert call["query"]["dtype"] == call["pseShift"]["dtype"] == call["attentionOut"]["dtype"] == cast
    # Y cast back to float32 by the last copy
    last = fake.calls(COPY + "GetWorkspaceSize")[-1]
    assert (last["selfRef"]["dtype"], last["src"]["dtype"]) == ("float32", cast)


def test_float32_policy_value_is_checked(library):
    so = ort.SessionOptions()
    so.add_session_config_entry(FP32_KEY, "float64")
    with pytest.raises(Exception, match="otfuse.ascend_ep.fp32_attention must be cpu, float16 or bfloat16, got 'float64'"):
        so.register_custom_ops_library(library)


# ----------------------------------------------------------------------------- exported fixtures

ROPE_ATTENTION_FIXTURES = sorted(n for n, e in fixture_entries().items()
                                 if e.get("expected", {}).get("attention") or e.get("expected", {}).get("rotary_sites"))
FUSED_OPS = ("RotaryEmbedding", "RotaryEmbeddingQK", "Attention", "RopeAttention")


@pytest.mark.parametrize("name", ROPE_ATTENTION_FIXTURES)
def test_fixture_rope_and_attention_on_ascend_path_match_cpu(tmp_path, library, fake, name):
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out)
    fused_ops = {op: report.fusions.get(op, 0) for op in FUSED_OPS}
    if not any(fused_ops.values()):
        pytest.skip(f"no rotary/attention node fused in {name} (e.g. opset-23 Attention is not matched yet)")
    fused = onnx.load(out)
    if any(a.name == "softcap" and a.f > 0 for n in fused.graph.node for a in n.attribute):
        # Gemma2: FIA has no soft-capping, so the node is refused (docs/ops.md); the rotations alone run.
        with pytest.raises(Exception, match=r"no logit soft-capping \(softcap > 0\)"):
            session(fused, library, ascend=True, fp32="float16")
        if not fixture_entries()[name]["expected"]["rotary_sites"]:
            return
        report = otfuse.fuse(fixture_path(name), out, only=["rope"])
        fused_ops = {op: report.fusions.get(op, 0) for op in FUSED_OPS}
        fused = onnx.load(out)
    feeds = make_feeds(fused, dims={"batch": 2, "seq": 7, "past": 3}, seed=0)
    names = [o.name for o in fused.graph.output]
    float32 = fixture_entries()[name]["dtype"] == "float32"
    cpu = run(session(fused, library, ascend=False), feeds, names)
    fake.clear()
    ascend = run(session(fused, library, ascend=True, fp32="float16" if float32 else None), feeds, names)
    for output in names:
        # float32 attention through FIA in float16: the float16 tolerance (docs/ops.md, float32 policy)
        rtol, atol = tolerance_for(np.dtype(F16) if float32 else cpu[output].dtype)
        row = compare_arrays(output, cpu[output], ascend[output], rtol, atol)
        assert row.ok, row.to_dict()
    attention_nodes = fused_ops["Attention"] + fused_ops["RopeAttention"]
    assert len(fake.calls(FIA)) == attention_nodes
    rotations = len(fake.calls(RPE)) + len(fake.calls(APPLY))
    assert rotations >= fused_ops["RotaryEmbedding"] + fused_ops["RotaryEmbeddingQK"] + 2 * fused_ops["RopeAttention"]
    assert len(fake.calls("aclCreateTensor")) == len(fake.calls("aclDestroyTensor"))


# ----------------------------------------------------------------------------- refusals and errors


def _attention_session(library, attrs, op="Attention"):
    inputs = A.qkv(seeded("refuse"), 1, 2, 2, 4, 4, 16, F16)
    return session(A.build_model(op, inputs, attrs), library, True), inputs


def test_softcap_is_refused_at_session_creation(library, fake):
    with pytest.raises(Exception, match=r"Attention \(node 'fused_attention_0'\): aclnnFusedInferAttentionScoreV3 has "
                                        r"no logit soft-capping \(softcap > 0\) \(run this node on CPU"):
        _attention_session(library, {"num_heads": 2, "softcap": 30.0})


def test_too_many_heads_per_kv_head_is_refused(library, fake):
    with pytest.raises(Exception, match="at most 64 query heads per kv head, num_heads / kv_num_heads = 128"):
        _attention_session(library, {"num_heads": 128, "kv_num_heads": 1})


def test_too_many_heads_is_refused(library, fake):
    with pytest.raises(Exception, match="takes at most 256 query heads, num_heads = 512"):
        _attention_session(library, {"num_heads": 512})


@pytest.mark.parametrize("case, reason", [
    ("dv", "needs key and value of one shape, but V's head size Dv = 8 differs from D = 16"),
    ("d_unaligned", r"needs D 16-byte aligned \(a multiple of 8 in float16/bfloat16\) when Sq > 1, D = 12"),
    ("d_large", "takes head sizes up to 512, D = 520"),
])
def test_shapes_fia_cannot_take_are_refused(library, fake, case, reason):
    rng = seeded("shape refusal", case)
    d, dv = {"dv": (16, 8), "d_unaligned": (12, 12), "d_large": (520, 520)}[case]
    inputs = A.qkv(rng, 1, 2, 2, 3, 3, d, F16, dv=dv)
    attention(library, "Attention", inputs, {"num_heads": 2}, False)  # the CPU kernel takes it
    with pytest.raises(Exception, match=reason + r" \(run this node on CPU\)"):
        attention(library, "Attention", inputs, {"num_heads": 2}, True)
    assert not fake.calls(FIA + "GetWorkspaceSize")


@pytest.mark.parametrize("op", ["Attention", "RotaryEmbedding"])
def test_products_without_the_operators_are_refused(library, fake, op):
    fake.soc("Ascend310P3")
    rng = seeded("product", op)
    if op == "Attention":
        inputs = A.qkv(rng, 1, 2, 2, 3, 3, 16, F16)
        with pytest.raises(Exception, match=r"aclnnFusedInferAttentionScoreV3 is not available on Atlas inference products"):
            attention(library, op, inputs, {"num_heads": 2}, True)
    else:
        inputs = [R.random(rng, (1, 2, 3, 16), F16), *R.cos_sin(rng, (1, 1, 3, 16), F16)]
        with pytest.raises(Exception, match=r"aclnnRotaryPositionEmbedding is not available on Atlas inference products"):
            rope(library, op, inputs, {}, True)


@pytest.mark.parametrize("api", [FIA, RPE])
@pytest.mark.parametrize("phase", ["GetWorkspaceSize", ""])
def test_aclnn_status_becomes_an_ort_error(library, fake, api, phase):
    fake.fail(api + phase, 561002, "tiling failed (injected)")
    rng = seeded("status")
    inputs = A.qkv(rng, 1, 2, 2, 4, 4, 16, F16)
    inputs["cos"], inputs["sin"] = R.cos_sin(rng, (1, 1, 4, 16), F16)
    with pytest.raises(Exception) as info:
        attention(library, "RopeAttention", inputs, {"num_heads": 2}, True)
    assert (f"RopeAttention (node 'fused_attention_0'): {api}{phase} returned 561002 "
            "(ACLNN_ERR_INNER_TILING_ERROR): tiling failed (injected)") in str(info.value)
    assert len(fake.calls("aclCreateTensor")) == len(fake.calls("aclDestroyTensor"))
    assert len(fake.calls("aclCreateTensorList")) == len(fake.calls("aclDestroyTensorList"))


def test_tensor_list_failure_is_reported(library, fake):
    fake.fail("aclCreateTensorList", 1, "no list (injected)")
    inputs = A.qkv(seeded("list"), 1, 2, 2, 4, 4, 16, F16)
    with pytest.raises(Exception, match=r"aclCreateTensorList failed for key: no list \(injected\)"):
        attention(library, "Attention", inputs, {"num_heads": 2}, True)


def test_contract_checks_still_apply(library, fake):
    inputs = A.qkv(seeded("contract"), 1, 2, 2, 4, 4, 16, F16)
    inputs["attn_bias"] = np.zeros((3, 4), F16)
    with pytest.raises(Exception, match=r"attn_bias has shape \[3, 4\], not broadcastable to \[B, N, Sq, Skv\]"):
        attention(library, "Attention", inputs, {"num_heads": 2}, True)


# ----------------------------------------------------------------------------- verify-ops


def _numpy_runner(op, inputs, attrs):
    """Stands in for torch_npu: the numpy reference of each op (otfuse.verify.reference)."""
    from otfuse.verify import reference

    attrs = dict(attrs)
    if op in ("RotaryEmbedding", "RotaryEmbeddingQK"):
        fn = reference.rotary_embedding if op == "RotaryEmbedding" else reference.rotary_embedding_qk
        out = fn(*inputs, **attrs)
        return [out] if op == "RotaryEmbedding" else list(out)
    fn = reference.rope_attention if op == "RopeAttention" else reference.attention
    return list(fn(*inputs, **attrs))


@pytest.mark.parametrize("name", ["llama_kv", "gptj", "llama_fp16"])
def test_verify_ops_covers_rotary_and_attention(tmp_path, name):
    from otfuse.verify import ops_on_npu as verify

    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out, only=["rope", "attention"])
    checks = verify.verify_ops(out, dims={"batch": 2, "seq": 3, "past": 2}, runner=_numpy_runner)
    ops = {c.case.op for c in checks}
    assert ops & {"RopeAttention", "Attention"}, ops
    for check in checks:
        assert check.ok, (check.case.op, check.error, [o.to_dict() for o in check.outputs])
    if name == "llama_kv":
        (case,) = [c.case for c in checks if c.case.op == "RopeAttention"]
        assert case.inputs[7].shape == (2, 2, 2, 16)  # past_key from the model's own shapes


def test_create_session_passes_the_float32_attention_policy(monkeypatch):
    from otfuse.run import ascend as ascend_ep

    seen = []

    class Recorder:
        def __init__(self, path, sess_options=None, providers=None):
            seen.append(sess_options.get_session_config_entry(FP32_KEY))

    monkeypatch.setattr(otfuse.run.session, "InferenceSession", Recorder)
    monkeypatch.setattr(ascend_ep, "cann_unavailable_reason", lambda: "")
    ascend_ep.create_session("m.onnx", fp32_attention="bfloat16")
    assert seen == ["bfloat16"]
    with pytest.raises(otfuse.errors.OtfuseError, match="fp32_attention must be one of cpu, float16, bfloat16"):
        ascend_ep.create_session("m.onnx", fp32_attention="half")
