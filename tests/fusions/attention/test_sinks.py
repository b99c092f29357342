"""gpt-oss's attention sinks (models/fixtures/arch5/gpt_oss_fx): the softmax runs over
Concat(scores, one learned logit per head) and the sink's column is sliced off before the MatMul
with V, so every row's denominator has an extra exp(sink_h). No Attention input expresses it
(docs/ops.md), so nothing is fused as Attention and the report names each such Softmax with that
reason (never a silent miss); the rest of the model (norms, rotations, the experts' activation)
still fuses and matches the original.

Mutations: the same Softmax without the sliced-off column, or without scores from a MatMul, is no
sinks site."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusing import fuse_in_memory
from graphs import F32, GraphBuilder

import otfuse
from bench.coverage import materialise

ARCH5 = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "arch5"
VARIANTS = json.loads((ARCH5 / "manifest.json").read_text())["models"]
SINKS = "attention with sinks"
FAMILIES = ["attention"]


@pytest.mark.parametrize("variant", ["dynamo_pos_dyn", "ts17_pos_dyn"])
def test_gpt_oss_sinks_are_reported_and_not_fused(tmp_path, variant):
    entry = VARIANTS[f"gpt_oss_fx/{variant}"]
    src = materialise(ARCH5 / entry["file"], tmp_path)
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(src, out)
    assert "Attention" not in report.fusions and "RopeAttention" not in report.fusions, report.fusions
    sinks = [m for m in report.near_misses if m["family"] == "attention" and SINKS in m["reason"]]
    assert len(sinks) == entry["expected"]["attention"] == 2, report.near_misses
    assert all(m["location"].startswith("Softmax ") for m in sinks)
    assert "no sink input" in sinks[0]["reason"]
    assert report.fusions.get("RotaryEmbeddingQK") == entry["expected"]["rope"]
    norms = report.fusions.get("RMSNorm", 0) + report.fusions.get("AddRMSNorm", 0)
    assert norms == entry["expected"]["norm"], report.fusions
    assert otfuse.diff(src, out, dims={"batch": 2, "seq": 7}).ok


def sinks_model(*, slice_sink=True, scores_from_matmul=True, heads=2, head_dim=8) -> onnx.ModelProto:
    """q, k, v [B, N, S, D]: s = q·kᵀ * scale (+ mask), Concat(s, Expand(sinks)) - max, Softmax,
    [..., :-1], · v. Mutations: the sink column kept (and V padded with a zero key), or scores that
    are a graph input."""
    b = GraphBuilder()
    shape = ["batch", heads, "seq", head_dim]
    q, k, v = (b.input(n, F32, shape) for n in ("q", "k", "v"))
    if scores_from_matmul:
        kt = b.node("Transpose", [k], perm=[0, 1, 3, 2])
        scores = b.node("Mul", [b.node("MatMul", [q, kt]), b.const(np.float32(head_dim ** -0.5))])
    else:
        scores = b.input("s", F32, ["batch", heads, "seq", "seq"])
    sinks = b.const(np.linspace(-1, 1, heads, dtype=np.float32).reshape(1, heads, 1, 1))
    rows = b.node("Concat", [b.node("Shape", [q], end=3), b.const(np.array([1], dtype=np.int64))], axis=0)
    combined = b.node("Concat", [scores, b.node("Expand", [sinks, rows])], axis=-1)
    shifted = b.node("Sub", [combined, b.node("ReduceMax", [combined, b.const(np.array([-1], np.int64))],
                                              keepdims=1)])
    probs = b.node("Softmax", [shifted], axis=-1)
    if slice_sink:
        i64 = lambda x: b.const(np.array([x], dtype=np.int64))  # noqa: E731
        probs = b.node("Slice", [probs, i64(0), i64(-1), i64(-1), i64(1)])
    else:
        pad = b.const(np.zeros((1, 1, 1, head_dim), np.float32))
        zero_row = b.node("Expand", [pad, b.node("Concat", [b.node("Shape", [v], end=2),
                                                          b.const(np.array([1, head_dim], np.int64))], axis=0)])
        v = b.node("Concat", [v, zero_row], axis=2)
    out = b.node("MatMul", [probs, v])
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, shape)
    return b.model()


def _sink_sites(report) -> list[dict]:
    return [m for m in report.near_misses if m["family"] == "attention" and SINKS in m["reason"]]


def test_hand_built_sinks_are_reported():
    fused, report = fuse_in_memory(sinks_model(), FAMILIES)
    assert report.fusions == {}
    assert len(_sink_sites(report)) == 1, report.near_misses


def test_sink_column_kept_is_no_sinks_site():
    # The sink as a key with a zero value: the same numbers, but no Slice drops a column.
    fused, report = fuse_in_memory(sinks_model(slice_sink=False), FAMILIES)
    assert not _sink_sites(report), report.near_misses


def test_scores_not_from_a_matmul_are_no_sinks_site():
    fused, report = fuse_in_memory(sinks_model(scores_from_matmul=False), FAMILIES)
    assert not _sink_sites(report), report.near_misses
