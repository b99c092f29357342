"""The opset-23 ONNX RotaryEmbedding op re-targeted to otfuse's RotaryEmbedding: hand-built graphs
for each input form and attribute, each diffed against ONNX Runtime running the original op, and
mutations that must not fuse. With the Attention op (folded, and the exported fixture):
tests/fusions/attention/test_onnx_op.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import assert_same_outputs as _diff
from fusing import attrs, fuse_model, fused_nodes
from graphs import GraphBuilder

INT64 = onnx.TensorProto.INT64


def _tables(b: GraphBuilder, half: int, position_ids: bool, max_pos: int, dtype=np.float32):
    """(cos, sin, ids): constant [max_pos, half] caches and a position_ids input, or [B, S, half]
    tables as graph inputs. Random values: any mix-up of lanes or tables shows in the diff."""
    if not position_ids:
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        return (b.input("cos", elem, ["batch", "seq", half]), b.input("sin", elem, ["batch", "seq", half]), None)
    rng = np.random.default_rng(1)
    cos = b.const(rng.standard_normal((max_pos, half)).astype(dtype), "cos_cache")
    sin = b.const(rng.standard_normal((max_pos, half)).astype(dtype), "sin_cache")
    return cos, sin, b.input("position_ids", INT64, ["batch", "seq"])


def rope_op_model(*, rank=4, heads=4, head_dim=16, rotary_dim=0, interleaved=0, position_ids=True,
                  max_pos=64, dtype=np.float32, num_heads_attr=None, also_used=False) -> onnx.ModelProto:
    b = GraphBuilder(opset=23)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    shape = ["batch", heads, "seq", head_dim] if rank == 4 else ["batch", "seq", heads * head_dim]
    x = b.input("x", elem, shape)
    cos, sin, ids = _tables(b, (rotary_dim or head_dim) // 2, position_ids, max_pos, dtype)
    extra = {"rotary_embedding_dim": rotary_dim} if rotary_dim else {}
    heads_attr = num_heads_attr if num_heads_attr is not None else (heads if rank == 3 else None)
    if heads_attr is not None:
        extra["num_heads"] = heads_attr
    y = b.node("RotaryEmbedding", [x, cos, sin] + ([ids] if ids else []), interleaved=interleaved, **extra)
    b.output(y, elem, None)
    return b.model()


def _positions(batch=2, seq=5, max_pos=64):
    """Positions that are not arange (an offset and a shuffle), so Gather mistakes show."""
    rng = np.random.default_rng(3)
    return np.stack([np.arange(7, 7 + seq), rng.permutation(max_pos)[:seq]])[:batch].astype(np.int64)


def _rope_inputs(model, batch=2, seq=5):
    from otfuse.run.feeds import make_feeds

    feeds = make_feeds(model, dims={"batch": batch, "seq": seq})
    if "position_ids" in feeds:
        feeds["position_ids"] = _positions(batch, seq)
    return feeds


ROPE_CASES = {
    "bnsd_position_ids": {},
    "bnsd_no_position_ids": {"position_ids": False},
    "bnsd_interleaved": {"interleaved": 1},
    "bnsd_partial": {"rotary_dim": 8},
    "bnsd_partial_interleaved": {"rotary_dim": 6, "interleaved": 1},
    "3d_position_ids": {"rank": 3},
    "3d_no_position_ids_interleaved_partial": {"rank": 3, "position_ids": False, "interleaved": 1, "rotary_dim": 8},
    "fp16": {"dtype": np.float16},
}


@pytest.mark.parametrize("case", sorted(ROPE_CASES))
def test_rotary_op_matches_ort(tmp_path, case):
    kwargs = ROPE_CASES[case]
    model = rope_op_model(**kwargs)
    fused, report = fuse_model(tmp_path, model)
    assert report.fusions == {"RotaryEmbedding": 1}, report.fusions
    (node,) = fused_nodes(fused)
    width = kwargs.get("rotary_dim", 0)
    assert attrs(node) == {"mode": b"interleaved" if kwargs.get("interleaved") else b"half", "rotary_dim": width}
    assert "RotaryEmbedding" not in [n.op_type for n in fused.graph.node if n.domain != "otfuse"]
    _diff(tmp_path, inputs=_rope_inputs(model))


@pytest.mark.parametrize("kwargs,reason", [
    ({"rank": 3, "num_heads_attr": 0}, "num_heads"),
    ({"rank": 3, "num_heads_attr": 5}, "num_heads"),
    ({"rotary_dim": 7, "head_dim": 16}, "rotary_embedding_dim"),
    ({"rotary_dim": 18, "head_dim": 16}, "rotary_embedding_dim"),
])
def test_rotary_op_refused(tmp_path, kwargs, reason):
    fused, report = fuse_model(tmp_path, rope_op_model(**kwargs))
    assert fused is None or "RotaryEmbedding" not in report.fusions
    assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


def test_rotary_op_table_width_must_match(tmp_path):
    """cos_cache with r lanes instead of r/2 (a full-width table): not the spec's form."""
    model = rope_op_model()
    cache = next(t for t in model.graph.initializer if t.name.startswith("cos_cache"))
    wide = onnx.numpy_helper.from_array(np.tile(onnx.numpy_helper.to_array(cache), (1, 2)), cache.name)
    cache.CopyFrom(wide)
    fused, report = fuse_model(tmp_path, model)
    assert fused is None
    assert any("lanes" in miss["reason"] for miss in report.near_misses), report.near_misses
