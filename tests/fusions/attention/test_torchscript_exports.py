"""The Hugging Face decoders as the TorchScript exporter writes them (llama_torchscript,
mistral_torchscript) fuse like their dynamo exports: every norm with its residual Add, every
attention with its rotation, repeat_kv read as GQA, the mask as causal / window / padding
(tests/fusions/attention/test_masks.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from fixtures import fixture_entries, fixture_path
from onnx import helper

import otfuse

ENTRIES = fixture_entries()


@pytest.mark.parametrize("name", ["llama_torchscript", "mistral_torchscript"])
def test_torchscript_decoders_fuse_like_the_dynamo_ones(tmp_path, name):
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out)
    assert report.fusions == TORCHSCRIPT_FUSIONS[name], report.fusions
    assert report.fusions["RopeAttention"] == ENTRIES[name]["expected"]["attention"]
    model = onnx.load(out)
    attention = [n for n in model.graph.node if n.op_type == "RopeAttention"]
    for node in attention:
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert (attrs["num_heads"], attrs["kv_num_heads"]) == (4, 2), "repeat_kv read as GQA, no copy"
    assert not {"Softmax", "Expand", "Neg", "ReduceMean"} & {n.op_type for n in model.graph.node}
    result = otfuse.diff(fixture_path(name), out, dims={"batch": 2, "seq": 9})
    assert result.ok, [row.to_dict() for row in result.outputs]


def _with_extra_reader(name: str, cast_name: str) -> onnx.ModelProto:
    """The fixture with the residual sum's Cast to float32 (at ``cast_name``) also read by a graph
    output (cast back to the model's type, so the diff uses the model's tolerance)."""
    model = onnx.load(fixture_path(name))
    cast = next(n for n in model.graph.node if n.name == cast_name)
    elem = model.graph.output[0].type.tensor_type.elem_type
    model.graph.node.append(helper.make_node("Cast", [cast.output[0]], ["sum_out"], name="extra_reader", to=elem))
    model.graph.output.append(helper.make_tensor_value_info("sum_out", elem, ["batch", "seq", 64]))
    return model


@pytest.mark.parametrize("name,cast,fused", [
    # float32: the Cast is the sum itself; its other reader reads the fused node's sum (an Identity).
    ("llama_torchscript", "/model/model/layers.0/post_attention_layernorm/Cast", {"AddRMSNorm": 4, "RMSNorm": 1}),
    # float16: the Cast makes a float32 copy the fused node does not output, so that norm is not
    # fused with its Add (nor at all: its Cast is read outside the match).
    ("llama_fp16", "node__to_copy_6", {"AddRMSNorm": 3, "RMSNorm": 1}),  # Cast(add_5): layer 0's sum
])
def test_residual_sum_cast_read_elsewhere(tmp_path, name, cast, fused):
    src, out = tmp_path / "src.onnx", tmp_path / "out.onnx"
    onnx.save(_with_extra_reader(name, cast), src)
    report = otfuse.fuse(src, out, only=["norm"])
    assert report.fusions == fused, report.fusions
    result = otfuse.diff(src, out, dims={"batch": 2, "seq": 9})
    assert result.ok, [row.to_dict() for row in result.outputs]


# What today's rewriter fuses in the TorchScript fixtures (the default families: every norm feeds
# projections, so norm_linear holds all five): with onnxruntime's symbolic shape inference (and so
# sympy) gone, otfuse's own dimension engine alone must give it.
_DECODER = {"AddRMSNormLinear": 4, "RMSNormLinear": 1, "RopeAttention": 2, "SwiGLU": 2}
TORCHSCRIPT_FUSIONS = {
    "llama_torchscript": _DECODER,
    "mistral_torchscript": _DECODER,
    "llama_fp16_eager_torchscript": _DECODER,
    "rope3d_torchscript": {"RopeAttention": 1},
}

_WITHOUT_SYMPY = """
import json, sys
sys.modules["sympy"] = None  # `import sympy` fails, as on a machine without it
import otfuse
out = {}
for name, path in json.loads(sys.argv[1]).items():
    out[name] = otfuse.fuse(path, None).fusions
assert "sympy" not in sys.modules or sys.modules["sympy"] is None
print(json.dumps(out))
"""


def test_torchscript_exports_fuse_without_sympy():
    root = Path(__file__).resolve().parents[3]  # the checkout, whose otfuse/ the test imports
    paths = {name: str(fixture_path(name)) for name in TORCHSCRIPT_FUSIONS}
    done = subprocess.run([sys.executable, "-c", _WITHOUT_SYMPY, json.dumps(paths)], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == TORCHSCRIPT_FUSIONS
