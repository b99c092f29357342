"""RoPE family on real exports: every rotation site (q and k of every layer) fused and paired,
and the fused models match the originals in ORT."""

from __future__ import annotations

import onnx
import pytest
from fixtures import fixture_entries, fixture_path

import otfuse

ENTRIES = fixture_entries()
ROTARY = sorted(name for name, entry in ENTRIES.items()
                if entry["expected"].get("rotary_applications") and entry["opset"] < 23)


@pytest.mark.parametrize("name", ROTARY)
def test_every_rotation_is_fused_in_qk_pairs_and_outputs_match(tmp_path, name):
    expected = ENTRIES[name]["expected"]
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out, only=["rope"])
    assert report.fusions == {"RotaryEmbeddingQK": expected["rotary_applications"] // 2}
    fused = onnx.load(out)
    assert not [n for n in fused.graph.node if n.op_type == "Neg"], "a rotation was left unfused"
    dims = {"batch": 2} if name.startswith("rope3d") else {"batch": 2, "seq": 7}
    if ENTRIES[name]["kv_cache"]:
        dims["past_seq"] = 3
    result = otfuse.diff(fixture_path(name), out, dims=dims)
    assert result.ok, [row.to_dict() for row in result.outputs]


def test_rotation_modes_follow_the_architecture(tmp_path):
    modes = {}
    for name in ("llama", "gpt_neox", "gptj", "phi", "rope3d"):
        out = tmp_path / f"{name}.onnx"
        otfuse.fuse(fixture_path(name), out, only=["rope"])
        node = next(n for n in onnx.load(out).graph.node if n.op_type == "RotaryEmbeddingQK")
        a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
        modes[name] = (a["mode"].decode(), a["rotary_dim"], list(a.get("sections", [])))
    assert modes == {
        "llama": ("half", 0, []),
        "gpt_neox": ("half", 4, []),
        "gptj": ("interleaved", 8, []),
        "phi": ("half", 8, []),
        "rope3d": ("half", 0, [4, 6, 6]),
    }


def test_norm_and_rope_together_on_llama(tmp_path):
    out = tmp_path / "llama_fused.onnx"
    report = otfuse.fuse(fixture_path("llama"), out, only=["norm", "rope"])
    assert report.fusions == {"AddRMSNorm": 4, "RMSNorm": 1, "RotaryEmbeddingQK": 2}
    assert otfuse.diff(fixture_path("llama"), out, dims={"batch": 2, "seq": 9}).ok
