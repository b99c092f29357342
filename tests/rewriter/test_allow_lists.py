"""Rules that re-target an existing op refuse every attribute, input, output and op version they
do not model (issue 11, item 1: ONNX Attention's window attributes were once dropped, changing
every output). Positive cases and the Attention op's are in tests/fusions/{rope,attention}/test_onnx_op.py."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import fuse_model
from graphs import F32, GraphBuilder
from onnx import helper
from fusions.rope.test_onnx_op import rope_op_model

from otfuse.fusions.norm.rules import LAYER_NORMALIZATION_OP
from otfuse.rewriter.allow_list import OpAllowList, require_allowed
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.rule import Refuse

HIDDEN = 8


def norm_op_model(op_type="LayerNormalization", opset=23, outputs=("y",), **attributes) -> onnx.ModelProto:
    b = GraphBuilder(opset=opset)
    x = b.input("x", F32, ["batch", "seq", HIDDEN])
    inputs = [x, b.const(np.linspace(0.5, 1.5, HIDDEN).astype(np.float32), "scale")]
    if op_type == "LayerNormalization":
        inputs.append(b.const(np.full(HIDDEN, 0.1, np.float32), "bias"))
    b.nodes.append(helper.make_node(op_type, inputs, list(outputs), name="norm", **attributes))
    b.output("y", F32, ["batch", "seq", HIDDEN])
    for name in outputs[1:]:
        if name:
            b.output(name, F32, ["batch", "seq", 1])
    return b.model()


@pytest.mark.parametrize("op_type", ["LayerNormalization", "RMSNormalization"])
def test_standard_norms_fuse_with_every_modelled_attribute(tmp_path, op_type):
    fused, report = fuse_model(tmp_path, norm_op_model(op_type, axis=-1, epsilon=1e-4, stash_type=1))
    assert fused is not None, report.near_misses


@pytest.mark.parametrize("op_type, kwargs, reason", [
    ("LayerNormalization", {"stash_type": 0}, "stash_type"),
    ("RMSNormalization", {"stash_type": 0}, "stash_type"),
    ("LayerNormalization", {"outputs": ("y", "mean")}, "Mean"),
    ("LayerNormalization", {"outputs": ("y", "", "inv_std")}, "InvStdDev"),
    ("LayerNormalization", {"frobnicate": 2}, "attribute 'frobnicate'"),
    ("RMSNormalization", {"frobnicate": 2}, "attribute 'frobnicate'"),
])
def test_standard_norms_refuse_what_they_do_not_model(tmp_path, op_type, kwargs, reason):
    fused, report = fuse_model(tmp_path, norm_op_model(op_type, **kwargs))
    assert fused is None, report.fusions
    assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


def test_rotary_op_refuses_an_unknown_attribute(tmp_path):
    model = rope_op_model()
    node = next(n for n in model.graph.node if n.op_type == "RotaryEmbedding")
    node.attribute.append(helper.make_attribute("scaling", 2.0))
    fused, report = fuse_model(tmp_path, model)
    assert fused is None
    assert any("attribute 'scaling'" in miss["reason"] for miss in report.near_misses), report.near_misses


def _index(model: onnx.ModelProto) -> tuple[GraphIndex, onnx.NodeProto]:
    return GraphIndex(model), next(n for n in model.graph.node if n.op_type == "LayerNormalization")


def test_an_op_version_not_modelled_is_refused():
    graph, node = _index(norm_op_model(opset=18))
    narrower = OpAllowList("LayerNormalization", versions=frozenset({99}), attributes={}, inputs=3, outputs=1)
    with pytest.raises(Refuse, match="LayerNormalization-17: only versions"):
        require_allowed(graph, node, narrower)


def test_an_opset_newer_than_onnx_knows_is_refused():
    model = norm_op_model(opset=18)
    model.opset_import[0].version = onnx.defs.onnx_opset_version() + 1
    graph, node = _index(model)
    with pytest.raises(Refuse, match="newer than the ONNX"):
        require_allowed(graph, node, LAYER_NORMALIZATION_OP)


def test_ort_builtin_layer_norm_before_opset_17_is_version_0():
    graph, node = _index(norm_op_model(opset=16))
    assert require_allowed(graph, node, LAYER_NORMALIZATION_OP) == 0
