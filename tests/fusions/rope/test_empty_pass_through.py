"""TorchScript's Phi-3 (data/export_phi3_ts.py): `cat([rope(x[..., :r]), x[..., r:]])` with r = D, so
the pass-through part is empty (the full Slice x[..., :D] is canonicalised away). The rotation and its
Concat with the empty part are one full-rotary RotaryEmbedding (rope/rotations.py, "empty tail"), which
folds into the attention (RopeAttention). A pass-through part that is not empty, or a rotated q also
read elsewhere, must not fold and must be reported."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import otfuse
from graphs import read_elsewhere

PHI3 = Path(__file__).with_name("data") / "phi3_ts17.onnx"
DIMS = {"batch": 2, "seq": 7}


def _fuse(tmp_path, model):
    src, out = tmp_path / "m.onnx", tmp_path / "m_fused.onnx"
    onnx.save(model, src)
    return src, out, otfuse.fuse(src, out, only=["rope", "attention"])


def _q_concat(model):
    """The Concat joining q's rotation and its (empty) pass-through Slice."""
    producers = {o: n for n in model.graph.node for o in n.output}
    for node in model.graph.node:
        if node.op_type == "Concat" and len(node.input) == 2:
            first, second = (producers.get(i) for i in node.input)
            if first is not None and first.op_type == "Add" and second is not None and second.op_type == "Slice":
                return node, second
    raise AssertionError("no rotation Concat found")


def test_phi3_torchscript_rotation_folds_into_the_attention(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(PHI3))
    assert report.fusions == {"RopeAttention": 1}, (report.fusions, report.near_misses)
    assert not report.near_misses, report.near_misses
    result = otfuse.diff(src, out, dims=DIMS)
    assert result.ok, [row.to_dict() for row in result.outputs]


def _non_empty_pass_through(model):
    _, pass_slice = _q_concat(model)
    model.graph.initializer.append(numpy_helper.from_array(np.array([4], np.int64), "start_4"))
    pass_slice.input[1] = "start_4"  # x[..., 4:]: 4 lanes of x appended


def _rotation_read_elsewhere(model):
    concat, _ = _q_concat(model)
    read_elsewhere(model, concat.input[0], op="Neg")


@pytest.mark.parametrize("mutate", [_non_empty_pass_through, _rotation_read_elsewhere])
def test_mutations_do_not_fold_and_are_reported(tmp_path, mutate):
    model = onnx.load(PHI3)
    mutate(model)
    _, _, report = _fuse(tmp_path, model)
    assert "RopeAttention" not in report.fusions, report.fusions
    rope_misses = [m for m in report.near_misses if m["pattern"].startswith("RotaryEmbedding(half, empty")]
    assert rope_misses and rope_misses[0]["fused_as"] == "RotaryEmbedding", report.near_misses
