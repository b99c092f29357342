"""The family registry (otfuse/fusions/__init__.py) and what each family says about itself: its
name is its package, the ops it emits are the ones its passes make and the ones docs/ops.md
describes, and only norm_linear is opt-in (until it is measured on an AVX-512 CPU)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from fixtures import fixture_path
from fusing import fuse_in_memory, fused_nodes

from otfuse.fusions import FAMILIES, OPT_IN, select_families

OPS_MD = (Path(__file__).resolve().parents[2] / "docs" / "ops.md").read_text()


def test_the_registry_order_and_defaults():
    assert list(FAMILIES) == ["norm", "norm_linear", "rope", "attention", "activation"]
    assert OPT_IN == {"norm_linear"} and select_families() == ["norm", "rope", "attention", "activation"]
    for name, family in FAMILIES.items():
        assert family.name == name and type(family).__module__ == "otfuse.rewriter.family"


@pytest.mark.parametrize("name", FAMILIES)
def test_every_emitted_op_is_in_the_contract(name):
    for op_type in FAMILIES[name].emits:
        assert f"`{op_type}`" in OPS_MD or f"### {op_type}\n" in OPS_MD, op_type


@pytest.mark.parametrize("fixture", ["llama", "gpt2", "llama_opset23", "qwen3"])
def test_a_family_makes_only_the_ops_it_emits(fixture):
    model = onnx.load(fixture_path(fixture))
    made = set()
    for families in (["norm"], ["norm", "norm_linear"], ["rope"], ["rope", "attention"], ["activation"]):
        fused, _ = fuse_in_memory(model, families)
        ops = {node.op_type for node in fused_nodes(fused)}
        assert ops <= {op for name in families for op in FAMILIES[name].emits}, (families, ops)
        made |= ops
    assert made  # each fixture fuses something
