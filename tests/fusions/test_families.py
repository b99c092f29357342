"""The family registry (otfuse/fusions/__init__.py) and what each family says about itself: its
name is its package, the ops it emits are the ones its passes make and the ones docs/ops.md
describes, and none is opt-in (norm_linear was until session 19); a target's defaults leave out
the families it has no op for."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from fixtures import fixture_path
from fusing import fuse_in_memory, fused_nodes

from otfuse.fusions import FAMILIES, OPT_IN, select_families
from otfuse.targets.lowering import writes

OPS_MD = (Path(__file__).resolve().parents[2] / "docs" / "ops.md").read_text()


def test_the_registry_order_and_defaults():
    assert list(FAMILIES) == ["norm", "norm_linear", "rope", "attention", "activation"]
    assert OPT_IN == frozenset() and select_families() == list(FAMILIES)
    for name, family in FAMILIES.items():
        assert family.name == name and type(family).__module__ == "otfuse.rewriter.family"


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_a_target_defaults_to_the_families_it_has_ops_for(target):
    """norm_linear's ops have no ort or onnx counterpart: its sites would go back with their norms,
    so the target's defaults leave it out; named with ``only`` it still runs (and says why each
    site went back: tests/targets/test_refusals.py)."""
    def writable(family):
        return writes(target, family.emits)

    assert select_families(writable=writable) == ["norm", "rope", "attention", "activation"]
    assert select_families(skip=["rope"], writable=writable) == ["norm", "attention", "activation"]
    assert select_families(only=["norm", "norm_linear"], writable=writable) == ["norm", "norm_linear"]
    assert select_families(writable=lambda family: writes("otfuse", family.emits)) == list(FAMILIES)


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
