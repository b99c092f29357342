"""RoPE family on hand-built graphs: every spelling fuses with the right attributes and the fused
model matches the original; mutations are refused or fused with attributes that keep it exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from fusions.rope.graphs import rope_model, rope_sections_model


def fuse_rope(tmp_path, model, name="m"):
    return fuse_model(tmp_path, model, name, only=["rope"])


POSITIVE = {
    "half_slices": (dict(), "half", 0),
    "half_split": (dict(split=True), "half", 0),
    "half_partial": (dict(rotary_dim=8), "half", 8),
    "half_bsnd": (dict(layout="BSND"), "half", 0),
    "interleaved": (dict(mode="interleaved"), "interleaved", 0),
    "interleaved_partial_bsnd": (dict(mode="interleaved", rotary_dim=8, layout="BSND"), "interleaved", 8),
    "fp16": (dict(dtype=np.float16), "half", 0),
}


@pytest.mark.parametrize("variant", POSITIVE)
def test_rope_spellings_fuse_into_one_qk_node(tmp_path, variant):
    kwargs, mode, rotary_dim = POSITIVE[variant]
    fused, report = fuse_rope(tmp_path, rope_model(**kwargs))
    assert report.fusions == {"RotaryEmbeddingQK": 1}
    (node,) = fused_nodes(fused)
    assert attrs(node)["mode"].decode() == mode and attrs(node)["rotary_dim"] == rotary_dim
    assert list(node.output) == ["q_rot", "k_rot"]
    # the builder's Identity standing for q's producer is dropped by the no_ops canonicaliser
    assert [n.op_type for n in fused.graph.node] == ["Slice", "RotaryEmbeddingQK"]
    assert_same_outputs(tmp_path)


def test_single_rotation_stays_single(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(pair=False))
    assert report.fusions == {"RotaryEmbedding": 1}
    assert_same_outputs(tmp_path)


# -- mutations --------------------------------------------------------------------------------------
def test_neg_on_the_wrong_half_is_not_fused(tmp_path):
    fused, _ = fuse_rope(tmp_path, rope_model(neg_first_half=True))
    assert fused is None


def test_split_point_off_the_middle_is_not_fused(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(split_at=6))
    assert fused is None
    assert any("expected [0:8]" in miss["reason"] for miss in report.near_misses)


def test_split_op_off_the_middle_is_not_fused(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(split=True, split_at=6))
    assert fused is None


def test_cos_and_sin_swapped_is_fused_with_the_tensors_swapped(tmp_path):
    # x*sin + rotate(x)*cos is still y = c*x + s*Mx with c=sin, s=cos: fused exactly, proven by diff.
    fused, report = fuse_rope(tmp_path, rope_model(cos_sin_swapped=True))
    (node,) = fused_nodes(fused)
    assert list(node.input[2:]) == ["sin", "cos"]
    assert_same_outputs(tmp_path)


def test_q_and_k_with_different_positions_are_not_paired(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_model(k_positions_differ=True))
    assert report.fusions == {"RotaryEmbedding": 2}
    cos_inputs = sorted(node.input[1] for node in fused_nodes(fused))
    assert cos_inputs == ["cos", "cos_k"]
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("interior", ["Neg", "Concat"])
def test_rotated_value_used_elsewhere_blocks_that_fusion(tmp_path, interior):
    fused, report = fuse_rope(tmp_path, rope_model(extra_consumer=interior))
    assert report.fusions == {"RotaryEmbedding": 1}  # only the untouched k rotation
    assert any("also used by" in miss["reason"] for miss in report.near_misses)
    assert_same_outputs(tmp_path)


def test_cos_wider_than_the_rotation_is_not_fused(tmp_path):
    model = rope_model(rotary_dim=8)
    for value in model.graph.input:
        if value.name in ("cos", "sin"):
            value.type.tensor_type.shape.dim[-1].dim_value = 16  # lanes the rotation does not have
    model = onnx.shape_inference.infer_shapes(model)
    fused, report = fuse_model(tmp_path, model)
    assert fused is None


# -- multi-axis (sections) ----------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,widths", [
    (dict(), [4, 6, 6]),
    (dict(split=True), [4, 6, 6]),
    (dict(sections=(8, 8)), [8, 8]),
    (dict(sections=(4, 4, 4, 4)), [4, 4, 4, 4]),
])
def test_multi_axis_rope_fuses_into_one_node_with_sections(tmp_path, kwargs, widths):
    fused, report = fuse_rope(tmp_path, rope_sections_model(**kwargs))
    assert report.fusions == {"RotaryEmbedding": 1}
    (node,) = fused_nodes(fused)
    assert attrs(node)["sections"] == widths
    assert_same_outputs(tmp_path)


def test_sections_with_an_odd_width_are_not_fused_as_sections(tmp_path):
    fused, report = fuse_rope(tmp_path, rope_sections_model(sections=(5, 5, 6)))
    assert all("sections" not in attrs(n) or not attrs(n)["sections"] for n in fused_nodes(fused))
    assert any("not even widths" in miss["reason"] for miss in report.near_misses)
    assert_same_outputs(tmp_path)


# -- interleaved on explicit lane pairs (Meta's view_as_complex, rope_pairs.py) -----------------------
def pairs_model(lanes="gather", swap_one=False, sign_flip=False, halves=False, extra_consumer=False,
                operands_swapped=False, wide_cos=False, dtype=np.float32, tables_as_inputs=False):
    """y = Reshape(stack(x0*c - x1*s, x1*c + x0*s)) of x [B, 5, 4, 16] viewed as [.., 8, 2];
    x0/x1 picked by Gather (drops the pair axis), Slice or Split (keep it)."""
    from onnx import helper, numpy_helper
    seq, heads, dim = 5, 4, 16
    half = dim // 2
    rng = np.random.default_rng(3)
    kept = not lanes.startswith("gather")
    angle = rng.uniform(-3, 3, size=(seq, half)).astype(np.float32)
    cos = np.cos(angle).reshape([1, seq, 1, half] + ([1] if kept else []))
    sin = np.sin(angle).reshape(cos.shape)
    cos, sin = cos.astype(dtype), sin.astype(dtype)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    if wide_cos:  # a table along the pair axis too: it would widen the kept lanes
        cos, sin = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1)
    pair_shape = [0, 0, 0, 2, half] if halves else [0, 0, 0, half, 2]
    axis = 3 if halves else 4
    ints = {"pair_shape": pair_shape, "flat_shape": [0, 0, 0, dim], "i0": 0, "i1": 1, "i2": 2, "in2": -2,
            "in1": -1, "s0": [0], "s1": [1], "s2": [2 ** 63 - 1 if lanes == "slice_open" else 2], "ax": [axis],
            "ones": [1, 1]}
    tables = [] if tables_as_inputs else [numpy_helper.from_array(cos, "cos"), numpy_helper.from_array(sin, "sin")]
    inits = [*tables,
             *(numpy_helper.from_array(np.array(v, np.int64), k) for k, v in ints.items())]
    nodes = [helper.make_node("Reshape", ["x", "pair_shape"], ["pairs"])]
    if lanes.startswith("gather"):
        index0, index1 = {"gather": ("i0", "i1"), "gather_neg": ("in2", "in1"), "gather_2": ("i2", "i1")}[lanes]
        nodes += [helper.make_node("Gather", ["pairs", index0], ["x0"], axis=-1 if lanes == "gather_neg" else axis),
                  helper.make_node("Gather", ["pairs", index1], ["x1"], axis=axis)]
    elif lanes.startswith("slice"):
        nodes += [helper.make_node("Slice", ["pairs", "s0", "s1", "ax"], ["x0"]),
                  helper.make_node("Slice", ["pairs", "s1", "s2", "ax"], ["x1"])]
    else:
        nodes += [helper.make_node("Split", ["pairs", "ones"], ["x0", "x1"], axis=axis)]
    a, b = ("x1", "x0") if swap_one else ("x0", "x1")
    mul = (lambda out, v, t: helper.make_node("Mul", [t, v], [out])) if operands_swapped else \
        (lambda out, v, t: helper.make_node("Mul", [v, t], [out]))
    nodes += [mul("ac", a, "cos"), mul("bs", b, "sin"), mul("x1c", "x1", "cos"), mul("x0s", "x0", "sin"),
              helper.make_node("Add" if sign_flip else "Sub", ["ac", "bs"], ["real"]),
              helper.make_node("Add", ["x1c", "x0s"], ["imag"])]
    if kept:
        nodes.append(helper.make_node("Concat", ["real", "imag"], ["stack"], axis=axis))
    else:
        nodes += [helper.make_node("Unsqueeze", ["real", "ax"], ["real_u"]),
                  helper.make_node("Unsqueeze", ["imag", "ax"], ["imag_u"]),
                  helper.make_node("Concat", ["real_u", "imag_u"], ["stack"], axis=axis)]
    nodes.append(helper.make_node("Reshape", ["stack", "flat_shape"], ["y"]))
    x_shape = ["batch", seq, heads, dim]
    outputs = [helper.make_tensor_value_info("y", elem, x_shape)]
    if extra_consumer:
        nodes.append(helper.make_node("Neg", ["real"], ["real_elsewhere"]))
        outputs.append(helper.make_tensor_value_info("real_elsewhere", elem, None))
    inputs = [helper.make_tensor_value_info("x", elem, x_shape)]
    if tables_as_inputs:  # computed at run time: the widening nodes are not folded
        inputs += [helper.make_tensor_value_info(name, elem, list(cos.shape)) for name in ("cos", "sin")]
    graph = helper.make_graph(nodes, "pairs", inputs,
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("lanes", ["gather", "gather_neg", "slice", "slice_open", "split"])
@pytest.mark.parametrize("operands_swapped", [False, True])
def test_lane_pair_rotation_fuses_as_interleaved(tmp_path, lanes, operands_swapped):
    fused, report = fuse_rope(tmp_path, pairs_model(lanes=lanes, operands_swapped=operands_swapped))
    assert report.fusions == {"RotaryEmbedding": 1}
    (node,) = fused_nodes(fused)
    assert attrs(node)["mode"] == b"interleaved" and attrs(node)["rotary_dim"] == 0
    assert not [n for n in fused.graph.node if n.op_type in ("Sub", "Mul")]
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("lanes", ["gather", "slice"])
@pytest.mark.parametrize("kwargs", [{"dtype": np.float16}, {"tables_as_inputs": True}])
def test_lane_pair_rotation_fp16_and_run_time_tables(tmp_path, lanes, kwargs):
    _, report = fuse_rope(tmp_path, pairs_model(lanes=lanes, **kwargs))
    assert report.fusions == {"RotaryEmbedding": 1}
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("lanes", ["gather", "slice"])
def test_lanes_swapped_in_one_product_is_not_fused(tmp_path, lanes):
    # x1*c - x0*s: not the interleaved rotation (nor any other mode)
    fused, _ = fuse_rope(tmp_path, pairs_model(lanes=lanes, swap_one=True))
    assert fused is None


def test_lane_index_out_of_the_pair_is_not_fused(tmp_path):
    model = pairs_model(lanes="gather_2")  # Gather index 2 of a size-2 axis
    fused, report = fuse_rope(tmp_path, model)
    assert fused is None
    assert any("picks lane [2], expected 0" in m["reason"] for m in report.near_misses)


@pytest.mark.parametrize("lanes", ["gather", "split"])
def test_sign_flipped_is_not_fused(tmp_path, lanes):
    fused, _ = fuse_rope(tmp_path, pairs_model(lanes=lanes, sign_flip=True))
    assert fused is None


def test_halves_view_is_not_matched_as_interleaved(tmp_path):
    # Reshape to [.., 2, D/2] and lanes picked on axis -2: the two halves (rotate_half), not pairs
    fused, report = fuse_rope(tmp_path, pairs_model(halves=True))
    assert fused is None
    assert any("not the pair axis" in m["reason"] or "not [..., D/2, 2]" in m["reason"] for m in report.near_misses)


def test_table_along_the_pair_axis_is_not_fused(tmp_path):
    fused, _ = fuse_rope(tmp_path, pairs_model(lanes="slice", wide_cos=True))
    assert fused is None


def test_rotated_lane_used_elsewhere_is_not_fused_and_stays_correct(tmp_path):
    fused, report = fuse_rope(tmp_path, pairs_model(extra_consumer=True))
    assert fused is None
    assert any("also used by" in m["reason"] for m in report.near_misses)


@pytest.mark.parametrize("name", ["meta_rope_complex", "meta_rope_pairs"])
def test_meta_reference_rotary_fixture_fuses_every_rotation(tmp_path, name):
    from fixtures import fixture_path

    import otfuse
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out, only=["rope"])
    assert report.fusions == {"RotaryEmbeddingQK": 1}
    fused = onnx.load(out)
    (node,) = fused_nodes(fused)
    assert attrs(node)["mode"] == b"interleaved"
    assert not [n for n in fused.graph.node if n.op_type == "Sub"], "a rotation was left unfused"
    assert otfuse.diff(fixture_path(name), out, dims={"batch": 2}).ok


@pytest.mark.parametrize("name", ["meta_rope_complex", "meta_rope_pairs"])
def test_meta_reference_rotary_fixture_folds_into_rope_attention(tmp_path, name):
    from fixtures import fixture_path

    import otfuse
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out)
    assert report.fusions == {"RopeAttention": 1}
    (node,) = fused_nodes(onnx.load(out))
    assert attrs(node)["rotary_mode"] == b"interleaved" or attrs(node)["rotary_mode"] == "interleaved"
    assert otfuse.diff(fixture_path(name), out, dims={"batch": 2}).ok
