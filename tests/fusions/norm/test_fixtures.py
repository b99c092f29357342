"""Norm family on real exports: every norm site fused, residual Adds absorbed where they feed a
norm, and the fused model matches the original in ORT within the fp32 (or fp16) tolerance."""

from __future__ import annotations

import onnx
import pytest
from fixtures import fixture_entries, fixture_path

import otfuse

ENTRIES = fixture_entries()


def _fuse(tmp_path, name):
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out, only=["norm"])
    return out, report


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_every_norm_site_is_fused_and_outputs_match(tmp_path, name):
    expected = ENTRIES[name]["expected"]
    if expected["rmsnorm"] + expected["layernorm"] == 0:  # rope3d*: no norms, nothing may fuse
        _, report = _fuse(tmp_path, name)
        assert not report.fusions and report.notes, report
        return
    out, report = _fuse(tmp_path, name)
    rms = report.fusions.get("RMSNorm", 0) + report.fusions.get("AddRMSNorm", 0)
    ln = report.fusions.get("LayerNorm", 0) + report.fusions.get("AddLayerNorm", 0)
    assert (rms, ln) == (expected["rmsnorm"], expected["layernorm"]), report.fusions
    fused = onnx.load(out)
    assert not [n for n in fused.graph.node if n.op_type in ("ReduceMean", "LayerNormalization",
                                                              "RMSNormalization")]
    dims = {"batch": 2, "seq": 7, **({"past_seq": 3} if ENTRIES[name]["kv_cache"] else {})}
    result = otfuse.diff(fixture_path(name), out, dims=dims)
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "llama_fp16"])
def test_decoder_residual_adds_feed_add_rms_norm(tmp_path, name):
    # 2 layers: every norm but the first (which reads the embeddings) normalises a residual sum.
    _, report = _fuse(tmp_path, name)
    assert report.fusions["AddRMSNorm"] == 4 and report.fusions["RMSNorm"] == 1


def test_per_fusion_diff_lines_up_every_fused_tensor(tmp_path):
    out, report = _fuse(tmp_path, "llama")
    result = otfuse.diff(fixture_path("llama"), out, dims={"batch": 1, "seq": 5}, per_fusion=True)
    assert result.ok and result.first_divergence is None
    # one row per fused output tensor: 5 normalised outputs + 4 residual sums
    assert len(result.fusions) == 9


def test_fused_model_runs_with_plain_onnxruntime_and_the_library(tmp_path):
    import numpy as np
    import onnxruntime as ort

    out, _ = _fuse(tmp_path, "bert")
    options = ort.SessionOptions()
    options.register_custom_ops_library(otfuse.library_path())
    session = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"])
    feeds = {i.name: np.ones((1, 4), dtype=np.int64) for i in session.get_inputs()}
    (logits, *_) = session.run(None, feeds)
    assert np.isfinite(logits).all()
