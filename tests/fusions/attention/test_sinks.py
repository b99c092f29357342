"""gpt-oss's attention sinks (models/fixtures/arch5/gpt_oss_fx): the softmax runs over
Concat(scores + mask, one learned logit per head) minus its row max, and the sink's column is
sliced off before the MatMul with V. Fused as ``RopeAttention`` with the op's ``sinks`` input
(docs/ops.md, "Attention sinks"), the mask claimed as causal (+ the sliding layer's window) +
key_padding_mask, no attn_bias; the fused model matches the original with left padding (the padded
query rows see no key: both give 0, all the weight on the sink), holes and 3s in the mask.

Proven (chain_checks.sinks): the Concat joins the key axis, the sink logits are a constant one per
head (through Expand), one column wide, the Slice drops exactly that column, the ReduceMax reduces
the keys, and nothing else reads the interior values. Mutations: the sink column kept (with a zero
value row), the Concat on the query axis, the Slice off by one, a sink per query row, a second
reader of the probabilities, sink logits computed from an input: none fused as Attention."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import attrs, fuse_in_memory, fused_nodes
from graphs import F32, GraphBuilder
from onnx import numpy_helper

import otfuse
import otfuse.ops
from bench.coverage import fused_sites, materialise

ARCH5 = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "arch5"
VARIANTS = json.loads((ARCH5 / "manifest.json").read_text())["models"]
SINKS = "attention with sinks"
FAMILIES = ["attention"]
VOCAB = 32


def _padded_feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Row 0 left-padded by 3 (its first query rows see no key), row 1 with a hole and a 3."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, seq), np.int64)
    mask[0, :3] = 0
    mask[1, 4] = 0
    mask[1, 5] = 3
    return {"input_ids": rng.integers(0, VOCAB, (batch, seq)).astype(np.int64), "attention_mask": mask,
            "position_ids": np.broadcast_to(np.arange(seq, dtype=np.int64), (batch, seq)).copy()}


def _sink_constants(model: onnx.ModelProto) -> list[np.ndarray]:
    """The [1, N, 1, 1] float initializers the export's sink Expands read, per layer in order."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type == "Expand" and node.input[0] in inits and inits[node.input[0]].dtype == np.float32 \
                and inits[node.input[0]].shape == (1, 2, 1, 1):
            found.append(inits[node.input[0]].reshape(-1))
    return found


@pytest.mark.parametrize("variant", ["dynamo_pos_dyn", "ts17_pos_dyn"])
def test_gpt_oss_attention_fuses_with_sinks(tmp_path, variant):
    entry = VARIANTS[f"gpt_oss_fx/{variant}"]
    src = materialise(ARCH5 / entry["file"], tmp_path)
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(src, out)
    assert report.fusions.get("RopeAttention") == entry["expected"]["attention"] == 2, report.fusions
    assert not [m for m in report.near_misses if m["family"] == "attention"], report.near_misses
    assert fused_sites(report.fusions)["norm"] == entry["expected"]["norm"], report.fusions  # *NormLinear included

    model = onnx.load(out)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    nodes = [n for n in fused_nodes(model) if n.op_type == "RopeAttention"]
    # layer_types = [sliding, full]: the sliding layer claims the config's window (4), the full none
    assert [attrs(n).get("window", 0) for n in nodes] == [4, 0]
    want_sinks = _sink_constants(onnx.load(src))
    assert len(want_sinks) == 2
    for node, want in zip(nodes, want_sinks):
        a = attrs(node)
        assert a["causal"] == 1 and a.get("empty_rows", b"zero") == b"zero"
        given = dict(zip([i.name for i in otfuse.ops.RopeAttention.inputs], node.input))
        assert not given.get("attn_bias") and given["key_padding_mask"] == "attention_mask"
        np.testing.assert_array_equal(inits[given["sinks"]], want)
        assert inits[given["sinks"]].dtype == np.float32 and inits[given["sinks"]].shape == (2,)
    # no Softmax over the keys (nor its max) is left: the two left are the MoE routers' (axis 1)
    assert not [n for n in model.graph.node if n.op_type == "ReduceMax" or
                (n.op_type == "Softmax" and attrs(n).get("axis") != 1)]

    for inputs, dims in ((_padded_feeds(2, 9), None), (None, {"batch": 2, "seq": 7}), (None, {"batch": 1, "seq": 20})):
        result = otfuse.diff(src, out, inputs=inputs, dims=dims)
        assert result.ok, [row.to_dict() for row in result.outputs]


def test_gpt_oss_left_padded_rows_are_zero_in_both(tmp_path):
    # The padded query rows see no key: finfo.min + s rounds to finfo.min, exp(min - sink) = 0, so
    # the graph puts all their weight on the sink (value 0), as the op's contract says.
    src = materialise(ARCH5 / VARIANTS["gpt_oss_fx/dynamo_pos_dyn"]["file"], tmp_path)
    out = tmp_path / "fused.onnx"
    otfuse.fuse(src, out)
    feeds = _padded_feeds(2, 9, seed=3)
    result = otfuse.diff(src, out, inputs=feeds)
    assert result.ok and result.outputs[0].max_abs < 1e-4, [row.to_dict() for row in result.outputs]


def sinks_model(*, slice_sink=True, scores_from_matmul=True, heads=2, head_dim=8, concat_axis=-1,
                slice_bounds=(0, -1), per_row=False, second_reader=False, sinks_from_input=False, cache=False,
                mask=False, max_shift=True, causal_fill=None, dtype=np.float32) -> onnx.ModelProto:
    """q, k, v [B, N, S, D]: s = q·kᵀ * scale (+ mask), Concat(s, Expand(sinks)) - max, Softmax,
    [..., :-1], · v (gpt-oss's eager attention as dynamo writes it). ``cache``: k and v appended to
    past_k / past_v. Mutations: see the module's doc."""
    b = GraphBuilder()
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    seq = 5 if per_row else "seq"
    shape = ["batch", heads, seq, head_dim]
    q, k, v = (b.input(n, elem, shape) for n in ("q", "k", "v"))
    if cache:
        past = ["batch", heads, "past", head_dim]
        k = b.node("Concat", [b.input("past_k", elem, past), k], axis=2)
        v = b.node("Concat", [b.input("past_v", elem, past), v], axis=2)
    if scores_from_matmul:
        kt = b.node("Transpose", [k], perm=[0, 1, 3, 2])
        scores = b.node("Mul", [b.node("MatMul", [q, kt]), b.const(dtype(head_dim ** -0.5))])
    else:
        scores = b.input("s", F32, ["batch", heads, seq, seq])
    if mask:
        scores = b.node("Add", [scores, b.input("mask", F32, ["batch", 1, seq, "total" if cache else seq])])
    if causal_fill is not None:  # HF's Where(kv_idx <= q_idx, 0, fill) over Range indices
        n = b.node("Squeeze", [b.node("Shape", [q], start=2, end=3), b.const(np.array([0], np.int64))])
        idx = b.node("Range", [b.const(np.int64(0)), n, b.const(np.int64(1))])
        visible = b.node("LessOrEqual", [b.node("Unsqueeze", [idx, b.const(np.array([0], np.int64))]),
                                         b.node("Unsqueeze", [idx, b.const(np.array([1], np.int64))])])
        scores = b.node("Add", [scores, b.node("Where", [visible, b.const(dtype(0)), b.const(dtype(causal_fill))])])
    logits = np.linspace(-1, 1, heads, dtype=dtype).reshape(1, heads, 1, 1)
    if per_row:
        logits = np.linspace(-1, 1, heads * 5, dtype=dtype).reshape(1, heads, 5, 1)
    sinks = b.input("sinks", F32, [1, heads, 1, 1]) if sinks_from_input else b.const(logits)
    if concat_axis == 2:  # a sink row over the keys: [B, N, 1, Skv]
        rows = b.node("Concat", [b.node("Shape", [q], end=2), b.const(np.array([1], dtype=np.int64)),
                                 b.node("Shape", [k], start=2, end=3)], axis=0)
    else:
        rows = b.node("Concat", [b.node("Shape", [q], end=3), b.const(np.array([1], dtype=np.int64))], axis=0)
    combined = b.node("Concat", [scores, b.node("Expand", [sinks, rows])], axis=concat_axis)
    if max_shift:
        combined = b.node("Sub", [combined, b.node("ReduceMax", [combined, b.const(np.array([-1], np.int64))],
                                                   keepdims=1)])
    probs = b.node("Softmax", [combined], axis=-1)
    if second_reader:
        b.output(probs, F32, None)
    if slice_sink:
        i64 = lambda x: b.const(np.array([x], dtype=np.int64))  # noqa: E731
        start, end = slice_bounds
        probs = b.node("Slice", [probs, i64(start), i64(end), i64(concat_axis), i64(1)])
    else:
        pad = b.const(np.zeros((1, 1, 1, head_dim), dtype))
        zero_row = b.node("Expand", [pad, b.node("Concat", [b.node("Shape", [v], end=2),
                                                          b.const(np.array([1, head_dim], np.int64))], axis=0)])
        v = b.node("Concat", [v, zero_row], axis=2)
    out = b.node("MatMul", [probs, v])
    b.nodes[-1].output[0] = "y"
    b.output("y", elem, shape)
    return b.model()


def _sink_sites(report) -> list[dict]:
    return [m for m in report.near_misses if m["family"] == "attention" and SINKS in m["reason"]]


def _attention_nodes(model) -> list[onnx.NodeProto]:
    return [n for n in fused_nodes(model) if n.op_type in ("Attention", "RopeAttention")]


def _sinks_of(model, node) -> np.ndarray:
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    return inits[node.input[8]]


@pytest.mark.parametrize("max_shift", [True, False])
def test_hand_built_sinks_fuse(max_shift):
    fused, report = fuse_in_memory(sinks_model(max_shift=max_shift), FAMILIES)
    assert report.fusions == {"Attention": 1}, report.near_misses
    (node,) = _attention_nodes(fused)
    np.testing.assert_array_equal(_sinks_of(fused, node), np.linspace(-1, 1, 2, dtype=np.float32))
    assert not _sink_sites(report)


@pytest.mark.parametrize("cache", [False, True])
def test_hand_built_sinks_match_the_graph(tmp_path, cache):
    # A KV cache (the fixture has none) and an additive float mask (kept as attn_bias, which the op
    # adds before the sink joins, as the graph does), with -inf entries hiding whole rows.
    model = sinks_model(cache=cache, mask=True)
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    assert report.fusions.get("Attention") == 1, report.near_misses
    (node,) = _attention_nodes(onnx.load(out))
    if cache:
        assert node.input[5] and node.input[6]  # past_key, past_value
    rng = np.random.default_rng(1)
    b, s, p = 2, 6, 3 if cache else 0
    feeds = {n: rng.standard_normal((b, 2, s, 8), dtype=np.float32) for n in ("q", "k", "v")}
    mask = np.where(rng.random((b, 1, s, s + p)) < 0.3, -np.inf, 0).astype(np.float32)
    mask[0, 0, :2] = -np.inf  # rows that see no key: the sink takes all their weight
    feeds["mask"] = mask
    if cache:
        feeds["past_k"], feeds["past_v"] = (rng.standard_normal((b, 2, p, 8), dtype=np.float32) for _ in "kv")
    result = otfuse.diff(src, out, inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("fill", [float(np.finfo(np.float32).min), -1e4])
def test_a_causal_mask_is_claimed_with_sinks_only_when_its_fill_absorbs_the_scores(tmp_path, fill):
    # finfo.min: s + fill rounds to fill, exp(fill - sink) is 0: causal, no bias, empty_rows zero.
    # -1e4: a hidden key would keep exp(s - 1e4 - sink) in a row that sees no other key, so the mask
    # stays the exact attn_bias (the op adds it before the sink joins), reported.
    model = sinks_model(causal_fill=fill)
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    assert report.fusions.get("Attention") == 1, report.near_misses
    (node,) = _attention_nodes(onnx.load(out))
    a = attrs(node)
    kept = [m for m in report.near_misses if m["family"] == "attention"]
    if fill < -1e30:
        assert a.get("causal") == 1 and not node.input[3] and not kept, (a, kept)
        assert a.get("empty_rows", b"zero") == b"zero"
    else:
        assert not a.get("causal") and node.input[3], a
        assert len(kept) == 1 and "absorbs the scores" in kept[0]["reason"], kept
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 6}).ok


@pytest.mark.parametrize("fill", [-np.inf, -65504.0])
def test_float16_sinks(tmp_path, fill):
    # float16: the logits are exact in float32; -inf masks are claimed, float16's -65504 (not an
    # absorbing fill) stays the bias. Within the float16 tolerance of the graph.
    model = sinks_model(causal_fill=fill, dtype=np.float16)
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    assert report.fusions.get("Attention") == 1, report.near_misses
    (node,) = _attention_nodes(onnx.load(out))
    assert bool(node.input[3]) == (fill == -65504.0)
    np.testing.assert_array_equal(_sinks_of(onnx.load(out), node), np.linspace(-1, 1, 2, dtype=np.float16))
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 6}).ok


def _refused(model, reason: str | None = None):
    fused, report = fuse_in_memory(model, FAMILIES)
    assert "Attention" not in report.fusions, report.fusions
    if reason is not None:
        reasons = [m["reason"] for m in report.near_misses if m["family"] == "attention"]
        assert any(reason in r for r in reasons), reasons
    return report


def test_sink_column_kept_is_not_fused():
    # The sink as a key with a zero value: the same numbers, but no Slice drops a column.
    _refused(sinks_model(slice_sink=False))


def test_concat_on_the_query_axis_is_refused():
    _refused(sinks_model(concat_axis=2), "joins axis 2")


@pytest.mark.parametrize("bounds", [(1, 2**62), (0, -2), (-1, 2**62)])
def test_slice_off_by_one_is_refused(bounds):
    # (1, end): drops the first key and keeps the sink; (0, -2): also drops the last key.
    _refused(sinks_model(slice_bounds=bounds), "does not drop exactly the sink column")


def test_a_sink_per_query_row_is_refused():
    _refused(sinks_model(per_row=True), "not one value per head")


def test_a_second_reader_of_the_probabilities_is_refused():
    _refused(sinks_model(second_reader=True))


def test_sink_logits_from_an_input_are_refused():
    _refused(sinks_model(sinks_from_input=True), "computed from the graph's inputs")


def test_scores_not_from_a_matmul_are_no_sinks_site():
    fused, report = fuse_in_memory(sinks_model(scores_from_matmul=False), FAMILIES)
    assert not report.fusions and not _sink_sites(report), report.near_misses
