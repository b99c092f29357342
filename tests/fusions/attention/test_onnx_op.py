"""The opset-23 ONNX Attention op re-targeted to otfuse's Attention (and RopeAttention, with the
RotaryEmbedding op folded in): the exported fixture, and hand-built graphs for each input form and
attribute, each diffed against ONNX Runtime running the original op; mutations that must not fuse
(or not fold). The RotaryEmbedding op alone: tests/fusions/rope/test_onnx_op.py."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fixtures import fixture_path
from fusing import assert_same_outputs as _diff
from fusing import attrs, fuse_model, fused_nodes
from graphs import F16, F32, GraphBuilder

import otfuse

INT64 = onnx.TensorProto.INT64
BOOL = onnx.TensorProto.BOOL


def fused_graph_producer(model, value: str) -> str:
    return next(n.op_type for n in model.graph.node if value in n.output)


# -- Attention ---------------------------------------------------------------------------------------
def _rotate(b: GraphBuilder, x: str, caches, ids: str, rope: dict, heads: int, rank: int) -> str:
    extra = {"rotary_embedding_dim": rope["rotary_dim"]} if rope.get("rotary_dim") else {}
    if rank == 3:
        extra["num_heads"] = heads
    return b.node("RotaryEmbedding", [x, *caches, ids], interleaved=rope.get("interleaved", 0), **extra)


def _projections(b: GraphBuilder, elem, dtype, rank, heads, kv_heads, head_dim):
    hidden = b.input("hidden", elem, ["batch", "seq", 32])
    rng = np.random.default_rng(2)
    out = []
    for n in (heads, kv_heads, kv_heads):
        x = b.node("MatMul", [hidden, b.const((rng.standard_normal((32, n * head_dim)) * 0.3).astype(dtype))])
        if rank == 4:
            x = b.node("Transpose", [b.node("Reshape", [x, b.const(np.array([0, 0, n, head_dim]))])], perm=[0, 2, 1, 3])
        out.append(x)
    return out


def _repeat(b: GraphBuilder, x: str, rep: int, heads: int, head_dim: int) -> str:
    """HF's repeat_kv: Unsqueeze(2) -> Expand(x rep) -> Reshape to the query heads."""
    expanded = b.node("Expand", [b.node("Unsqueeze", [x, b.const(np.array([2]))]),
                                 b.const(np.array([1, 1, rep, 1, 1]))])
    return b.node("Reshape", [expanded, b.const(np.array([0, heads, -1, head_dim]))])


def attention_op_model(*, heads=4, kv_heads=2, head_dim=8, rank=4, past=False, present=None, mask=None,
                       is_causal=0, softcap=0.0, scale=None, qk_mode=None, qk_output=False, nonpad=False,
                       q_len="seq", kv_len="seq", softmax_precision=None, dtype=np.float32, repeat_kv=False,
                       rope=None, rope_output_used=False, out_perm=None, y_used=False,
                       opset=23, extra_attrs=None) -> onnx.ModelProto:
    """One ONNX Attention on graph inputs (q, k, v, attn_mask, past_key, past_value), optionally
    with the q/k rotated by ONNX RotaryEmbedding ops (``rope``: interleaved, rotary_dim) and K/V
    repeated by repeat_kv; every attribute and optional input as given."""
    b = GraphBuilder(opset=opset)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    present = past if present is None else present

    def qkv(name, n, length):
        return b.input(name, elem, ["batch", n, length, head_dim] if rank == 4 else ["batch", length, n * head_dim])

    if rope is None:
        q, k, v = qkv("q", heads, q_len), qkv("k", kv_heads, kv_len), qkv("v", kv_heads, kv_len)
    else:  # projections of one hidden state, as in a model: the pairing pass looks for that
        q, k, v = _projections(b, elem, dtype, rank, heads, kv_heads, head_dim)
        rng = np.random.default_rng(1)
        half = (rope.get("rotary_dim") or head_dim) // 2
        caches = [b.const(rng.standard_normal((64, half)).astype(dtype), name) for name in ("cos_cache", "sin_cache")]
        ids = b.input("position_ids", INT64, ["batch", "seq"])
        q, k = _rotate(b, q, caches, ids, rope, heads, rank), _rotate(b, k, caches, ids, rope, kv_heads, rank)
        if rope_output_used:
            b.output(k, elem, None)
    if repeat_kv:
        k, v = (_repeat(b, x, heads // kv_heads, heads, head_dim) for x in (k, v))
    total = f"past_seq + {kv_len}" if past else kv_len
    inputs = [q, k, v, ""]
    if mask:
        inputs[3] = b.input("attn_mask", BOOL if mask == "bool" else elem, ["batch", 1, q_len, total])
    if past:
        inputs += [b.input(f"past_{n}", elem, ["batch", kv_heads, "past_seq", head_dim]) for n in ("key", "value")]
    if nonpad:
        inputs += ["", ""][len(inputs) - 4:] + [b.input("nonpad_kv_seqlen", INT64, ["batch"])]
    while not inputs[-1]:
        inputs.pop()
    attributes = {"is_causal": is_causal, "softcap": softcap}
    if rank == 3:
        attributes.update(q_num_heads=heads, kv_num_heads=kv_heads)
    for name, value in (("scale", scale), ("qk_matmul_output_mode", qk_mode), ("softmax_precision", softmax_precision)):
        if value is not None:
            attributes[name] = value
    attributes.update(extra_attrs or {})
    outputs = ["y"] + (["present_key", "present_value"] if present else []) + (["qk"] if qk_output else [])
    if qk_output and not present:
        outputs = ["y", "", "", "qk"]
    b.nodes.append(onnx.helper.make_node("Attention", inputs, outputs, name="attention", **attributes))
    shapes = {"y": ["batch", heads, q_len, head_dim] if rank == 4 else ["batch", q_len, heads * head_dim],
              "present_key": ["batch", kv_heads, total, head_dim], "present_value": ["batch", kv_heads, total, head_dim],
              "qk": ["batch", heads, q_len, total]}
    if out_perm is not None:  # the head transpose after the op; y stays an output only if y_used
        b.nodes.append(onnx.helper.make_node("Transpose", ["y"], ["y_t"], perm=out_perm))
        b.output("y_t", elem, None)
        outputs = [name for name in outputs if name != "y" or y_used]
    for name in outputs:
        if name:
            b.output(name, elem, shapes[name])
    return b.model()


def _attention_inputs(model, dims, mask_kind=None, seed=5):
    """Generated inputs; a bool mask random with one fully masked row, a float mask random with
    a -inf key and a fully -inf row; position ids continuing after the past."""
    from otfuse.run.feeds import make_feeds

    feeds = make_feeds(model, dims=dims)
    rng = np.random.default_rng(seed)
    if "attn_mask" in feeds:
        shape = feeds["attn_mask"].shape
        if mask_kind == "bool":
            mask = rng.random(shape) > 0.3
            mask[0, 0, 0, :] = False
        else:
            mask = rng.standard_normal(shape).astype(feeds["attn_mask"].dtype)
            mask[..., 0] = -np.inf
            mask[0, 0, 0, :] = -np.inf
        feeds["attn_mask"] = mask
    if "position_ids" in feeds:
        batch, seq = feeds["position_ids"].shape
        start = dims.get("past_seq", 0)
        feeds["position_ids"] = np.broadcast_to(np.arange(start, start + seq), (batch, seq)).astype(np.int64).copy()
    return feeds


ATTENTION_CASES = {
    "bnsd_gqa": ({}, {}),
    "bnsd_mha_no_scale_attr": ({"kv_heads": 4}, {}),
    "3d_inputs": ({"rank": 3}, {"layout": b"BSND", "output_layout": b"BSND"}),
    "3d_inputs_causal_bool_mask": ({"rank": 3, "is_causal": 1, "mask": "bool"}, {"causal": 1}),
    "past_cache": ({"past": True}, {}),
    "past_cache_causal": ({"past": True, "is_causal": 1}, {"causal": 1}),
    "past_cache_causal_float_mask": ({"past": True, "is_causal": 1, "mask": "float"}, {"causal": 1}),
    "present_without_past": ({"present": True}, {}),
    "causal_cross_lengths_equal": ({"is_causal": 1}, {"causal": 1}),
    "softcap": ({"softcap": 3.0, "is_causal": 1}, {"softcap": 3.0}),
    "scale": ({"scale": 0.3}, {}),
    "bool_mask": ({"mask": "bool"}, {}),
    "float_mask": ({"mask": "float"}, {}),
    "repeat_kv": ({"repeat_kv": True, "is_causal": 1}, {"kv_num_heads": 2}),
    "softmax_precision_float": ({"softmax_precision": onnx.TensorProto.FLOAT}, {}),
    "fp16": ({"dtype": np.float16, "is_causal": 1, "mask": "bool"}, {}),
    "output_transpose": ({"out_perm": [0, 2, 1, 3], "past": True}, {"output_layout": b"BSND"}),
    "output_transpose_y_used": ({"out_perm": [0, 2, 1, 3], "y_used": True}, {"output_layout": b"BNSD"}),
    "output_other_perm": ({"out_perm": [0, 1, 3, 2]}, {"output_layout": b"BNSD"}),
    # Attention-25's sliding window: keys p - left <= j <= p, i.e. otfuse's window = left + 1.
    "window_causal": ({"opset": 25, "is_causal": 1, "extra_attrs": {"left_window_size": 2}},
                      {"causal": 1, "window": 3}),
    "window_right_zero": ({"opset": 25, "extra_attrs": {"left_window_size": 1, "right_window_size": 0}},
                          {"causal": 1, "window": 2}),
    "window_past_cache": ({"opset": 25, "past": True, "is_causal": 1,
                           "extra_attrs": {"left_window_size": 3, "right_window_size": 5}}, {"causal": 1, "window": 4}),
    "window_default": ({"opset": 25, "extra_attrs": {"left_window_size": -1, "right_window_size": -1}}, {}),
    "window_and_bool_mask": ({"opset": 25, "is_causal": 1, "mask": "bool", "extra_attrs": {"left_window_size": 2}},
                             {"causal": 1, "window": 3}),
}


def _skip_unless_ort_runs(model: onnx.ModelProto) -> None:
    """The comparison needs ORT to run the original: an older ORT (the package accepts 1.30) lacks
    Attention's opset-25 window attributes."""
    try:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as error:
        pytest.skip(f"onnxruntime {ort.__version__} does not run the original: {str(error).splitlines()[0][-160:]}")


@pytest.mark.parametrize("case", sorted(ATTENTION_CASES))
def test_attention_op_matches_ort(tmp_path, case):
    kwargs, expected = ATTENTION_CASES[case]
    model = attention_op_model(**kwargs)
    _skip_unless_ort_runs(model)
    fused, report = fuse_model(tmp_path, model)
    assert report.fusions == {"Attention": 1}, (report.fusions, report.near_misses)
    (node,) = fused_nodes(fused)
    got = attrs(node)
    assert got["num_heads"] == 4 and got["kv_num_heads"] == expected.get("kv_num_heads", kwargs.get("kv_heads", 2))
    for name, value in expected.items():
        assert got[name] == value, (name, got)
    if "scale" in kwargs:
        assert got["scale"] == pytest.approx(kwargs["scale"])
    assert "Attention" not in [n.op_type for n in fused.graph.node if n.domain != "otfuse"]
    for seq, past in [(5, 3), (1, 4), (6, 0)]:
        dims = {"batch": 2, "seq": seq, "past_seq": past}
        if not kwargs.get("past"):
            dims.pop("past_seq")
        _diff(tmp_path, inputs=_attention_inputs(model, dims, kwargs.get("mask")))


def test_bool_mask_becomes_an_additive_minus_inf_bias(tmp_path):
    fused, _ = fuse_model(tmp_path, attention_op_model(mask="bool"))
    where = next(n for n in fused.graph.node if n.op_type == "Where")
    (node,) = fused_nodes(fused)
    assert node.input[3] == where.output[0] and where.input[0] == "attn_mask"
    values = {t.name: onnx.numpy_helper.to_array(t) for t in fused.graph.initializer}
    assert values[where.input[1]] == 0 and values[where.input[2]] == -np.inf


@pytest.mark.parametrize("kwargs,reason", [
    ({"qk_mode": 1}, "qk_matmul_output"),
    ({"qk_output": True}, "qk_matmul_output"),
    ({"nonpad": True, "opset": 24}, "nonpad_kv_seqlen"),
    ({"is_causal": 1, "q_len": "q_seq", "kv_len": "kv_seq"}, "is_causal"),
    ({"is_causal": 1, "past": True, "q_len": "q_seq", "kv_len": "kv_seq"}, "is_causal"),
    ({"softmax_precision": onnx.TensorProto.FLOAT16}, "softmax_precision"),
    ({"scale": 0.0}, "scale"),
    ({"rank": 3, "kv_heads": 3}, "heads"),
    # What the rule does not model is refused, never dropped (a dropped window changed every output).
    ({"opset": 25, "extra_attrs": {"left_window_size": 2, "right_window_size": 1}}, "non-causal window"),
    ({"opset": 25, "extra_attrs": {"left_window_size": 2}}, "non-causal window"),
    ({"extra_attrs": {"frobnicate": 1}}, "attribute 'frobnicate'"),
    ({"qk_mode": 3}, "qk_matmul_output_mode"),
])
def test_attention_op_refused(tmp_path, kwargs, reason):
    fused, report = fuse_model(tmp_path, attention_op_model(**kwargs), only=["attention"])
    assert fused is None, report.fusions
    assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


def test_causal_with_a_past_is_bottom_right_only_when_lengths_agree():
    """What the refusal above rests on: ORT (and the ONNX spec) align is_causal to the past
    length, which is otfuse's bottom-right alignment exactly when Sq equals the new keys' S."""
    import onnxruntime as ort

    rng = np.random.default_rng(0)
    model = attention_op_model(kv_heads=4, past=True, is_causal=1, q_len="q_seq", kv_len="kv_seq")
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for sq, s, p in [(2, 2, 3), (2, 3, 3), (3, 1, 2)]:
        feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
                 {"q": (1, 4, sq, 8), "k": (1, 4, s, 8), "v": (1, 4, s, 8),
                  "past_key": (1, 4, p, 8), "past_value": (1, 4, p, 8)}.items()}
        y = session.run(["y"], feeds)[0]
        keys = np.concatenate([feeds["past_key"], feeds["k"]], 2)
        values = np.concatenate([feeds["past_value"], feeds["v"]], 2)
        scores = feeds["q"] @ keys.transpose(0, 1, 3, 2) / np.sqrt(8)
        i, j = np.arange(sq)[:, None], np.arange(p + s)[None]
        for offset, name in ((p, "past"), (p + s - sq, "bottom right")):
            masked = np.where(j <= i + offset, scores, -np.inf)
            probs = np.exp(masked - masked.max(-1, keepdims=True))
            expected = probs / probs.sum(-1, keepdims=True) @ values
            assert np.allclose(y, expected, atol=1e-5) == (name == "past" or sq == s), (sq, s, p, name)


def test_repeat_kv_with_a_cache_is_not_absorbed(tmp_path):
    """ONNX concatenates the past with the repeated keys: the past then has every query head, so
    the repeat stays and the attention reads the repeated tensors (kv_num_heads = num_heads)."""
    model = attention_op_model(heads=4, kv_heads=4, repeat_kv=False, past=True)
    fused, report = fuse_model(tmp_path, model)
    assert report.fusions == {"Attention": 1}
    _diff(tmp_path, dims={"batch": 2, "seq": 3, "past_seq": 2})


# -- the rotation folded into the attention ------------------------------------------------------------
FOLD_CASES = {
    "half": ({}, {"rotary_mode": b"half", "rotary_dim": 0}),
    "interleaved": ({"rope": {"interleaved": 1}}, {"rotary_mode": b"interleaved", "rotary_dim": 0}),
    "partial": ({"rope": {"rotary_dim": 4}}, {"rotary_mode": b"half", "rotary_dim": 4}),
    "past_causal_mask": ({"past": True, "is_causal": 1, "mask": "bool"}, {"causal": 1}),
    "repeat_kv": ({"repeat_kv": True, "is_causal": 1}, {"kv_num_heads": 2}),
}


@pytest.mark.parametrize("case", sorted(FOLD_CASES))
def test_rotation_folded_into_attention(tmp_path, case):
    kwargs, expected = FOLD_CASES[case]
    model = attention_op_model(**{"rope": {}, **kwargs})
    fused, report = fuse_model(tmp_path, model)
    assert report.fusions == {"RopeAttention": 1}, (report.fusions, report.near_misses)
    (node,) = fused_nodes(fused)
    got = attrs(node)
    for name, value in expected.items():
        assert got[name] == value, (name, got)
    assert [fused_graph_producer(fused, name) for name in node.input[:2]] == ["Transpose", "Transpose"]
    for seq, past in [(5, 3), (1, 4)]:
        dims = {"batch": 2, "seq": seq, **({"past_seq": past} if kwargs.get("past") else {})}
        _diff(tmp_path, inputs=_attention_inputs(model, dims, kwargs.get("mask")))


def test_rotation_used_elsewhere_is_not_folded_but_exact(tmp_path):
    model = attention_op_model(rope={}, rope_output_used=True, is_causal=1)
    fused, report = fuse_model(tmp_path, model)
    assert report.fusions == {"Attention": 1, "RotaryEmbeddingQK": 1}, report.fusions
    (miss,) = [m for m in report.near_misses if m["family"] == "attention"]
    assert "also used" in miss["reason"] or "graph output" in miss["reason"], miss
    assert (miss["pattern"], miss["fused_as"]) == ("RopeAttention(fold)", "RotaryEmbeddingQK + Attention"), miss
    _diff(tmp_path, inputs=_attention_inputs(model, {"batch": 2, "seq": 5}))


def test_3d_attention_keeps_its_rotation_separate(tmp_path):
    """A 3-D Q is [B, S, N*D]: the rotations (viewed per head) pair, the attention stays BSND."""
    model = attention_op_model(rank=3, rope={}, is_causal=1)
    fused, report = fuse_model(tmp_path, model)
    assert report.fusions == {"Attention": 1, "RotaryEmbeddingQK": 1}, report.fusions
    _diff(tmp_path, inputs=_attention_inputs(model, {"batch": 2, "seq": 5}))


# -- the exported fixture ------------------------------------------------------------------------------
def test_opset23_fixture_fuses_like_llama(tmp_path):
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(fixture_path("llama_opset23"), out)
    reference = otfuse.fuse(fixture_path("llama"), tmp_path / "llama_fused.onnx")
    assert report.fusions["RopeAttention"] == reference.fusions["RopeAttention"] == 2
    assert "RotaryEmbeddingQK" not in report.fusions and "Attention" not in report.fusions
    ops = {n.op_type for n in onnx.load(out).graph.node if n.domain != "otfuse"}
    assert not ops & {"Attention", "RotaryEmbedding", "RMSNormalization", "LessOrEqual", "GatherND"}, ops
    for node in fused_nodes(onnx.load(out)):
        if node.op_type == "RopeAttention":
            got = attrs(node)
            assert (got["causal"], got["kv_num_heads"], got["num_heads"], got["empty_rows"]) == (1, 2, 4, b"zero")
            assert node.input[6] == "attention_mask"
    for batch, seq in [(1, 1), (2, 7), (3, 40)]:
        result = otfuse.diff(fixture_path("llama_opset23"), out, dims={"batch": batch, "seq": seq})
        assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("padding", [3, 8])
def test_opset23_fixture_left_padding(tmp_path, padding):
    """Padded query rows see no key: zero in ONNX's Attention (bool mask) and in the fused node."""
    out = tmp_path / "fused.onnx"
    otfuse.fuse(fixture_path("llama_opset23"), out)
    batch, seq = 2, 9
    feeds = {
        "input_ids": np.random.default_rng(0).integers(0, 200, (batch, seq)).astype(np.int64),
        "attention_mask": np.array([[0] * padding + [1] * (seq - padding), [1] * seq], dtype=np.int64),
        "position_ids": np.broadcast_to(np.arange(seq), (batch, seq)).astype(np.int64).copy(),
    }
    result = otfuse.diff(fixture_path("llama_opset23"), out, inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]
