"""``fuse_in_memory`` (tests/fusing.py) runs what ``otfuse.fuse`` runs: on the exported fixtures,
each family set gives the same graph, fusions and near misses in memory as through files."""

from __future__ import annotations

import onnx
import pytest
from fixtures import fixture_path
from fusing import fuse_in_memory

import otfuse

CASES = [("llama", ["norm"]), ("llama", ["norm", "norm_linear"]), ("llama", ["rope"]), ("llama", ["rope", "attention"]),
         ("llama_torchscript", ["rope", "attention"]), ("gpt2", ["norm", "norm_linear", "attention"])]


@pytest.mark.parametrize("name, families", CASES, ids=[f"{n}-{'+'.join(f)}" for n, f in CASES])
def test_in_memory_fuses_as_the_pipeline_does(tmp_path, name, families):
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(fixture_path(name), out, only=families)
    fused, result = fuse_in_memory(onnx.load(fixture_path(name)), families)
    assert result.fusions == report.fusions and result.fusions
    assert result.near_misses == report.near_misses
    assert fused.graph.SerializeToString() == onnx.load(out).graph.SerializeToString()
