"""Sana's block through the TorchScript exporter (models/fixtures/dit/sana_block_torchscript.onnx,
models/dit_blocks.py): its linear attention's `unflatten(1, (heads, -1))` slices the shape at
`Mod(4, 3)`. With that integer Mod folded by the dimension engine (rewriter/dims/values.py) the
shapes after it are known, and the block's norms, the GLUMBConv's SiLU and its SiLU gate fuse as in
the dynamo export; before, each was refused for unknown shapes. The two ReLU kernel maps of the
linear attention are no site of any family."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

import otfuse

DIT = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "dit"
SANA = DIT / "sana_block_torchscript.onnx"


def test_sana_block_fuses_with_shapes_through_mod(tmp_path):
    out = tmp_path / "sana_fused.onnx"
    report = otfuse.fuse(SANA, out)
    assert report.fusions == {"AddLayerNorm": 1, "LayerNorm": 1, "Attention": 1, "SiLU": 1, "SwiGLU": 1}
    assert report.near_misses == []
    expected = json.loads((DIT / "manifest.json").read_text())["fixtures"]["sana_block_torchscript"]["expected"]
    assert report.fusions["AddLayerNorm"] + report.fusions["LayerNorm"] == expected["norm"]
    assert [n.op_type for n in onnx.load(out).graph.node].count("Relu") == 2
    for batch in (1, 3):
        result = otfuse.diff(SANA, out, dims={"batch": batch})
        assert result.ok, [row.to_dict() for row in result.outputs]
