"""Activation sites no rule fused are in the report: an Erf / Tanh / Sigmoid between two
projections that no rule began to match (a "activation site" near miss, by the family's site
signature), or one a rule refused (its near miss only, not a second site report); Tanh used
elsewhere (attention's soft-capping, a final logit cap) is not an MLP site."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import onnx
from fusing import fuse_in_memory, fused_nodes
from fusions.activation.graphs import gelu_tanh
from graphs import F32, GraphBuilder
from onnx import helper

from otfuse.fusions.activation import FAMILY
from otfuse.rewriter.sites import GraphScan

S, D, H = 5, 8, 16


def _mlp(build, down: bool = True, contrib: bool = False):
    """x [2, S, D] -> MatMul (up) -> build(g, h) -> MatMul (down) -> y."""
    g = GraphBuilder()
    x = g.input("x", F32, [2, S, D])
    h = g.node("MatMul", [x, g.const(np.full((D, H), 0.1, np.float32))])
    out = build(g, h)
    if down:
        out = g.node("MatMul", [out, g.const(np.full((H, D), 0.1, np.float32))])
    g.nodes[-1].output[0] = "y"
    g.output("y", F32, [2, S, D if down else H])
    if not contrib:
        return g.model()
    graph = helper.make_graph(g.nodes, "g", g.inputs, g.outputs, g.inits)
    return helper.make_model(graph, ir_version=9, opset_imports=[helper.make_opsetid("", g.opset),
                                                                  helper.make_opsetid("com.microsoft", 1)])


def _sites(model):
    fused, report = fuse_in_memory(model, ["activation"])
    return fused, report.near_misses, [m for m in report.near_misses if m["pattern"] == "activation site"]


def test_an_activation_no_rule_began_to_match_is_reported():
    def silu_of_a_sum(g, h):  # h * sigmoid(h + b): K of another value than the product's
        other = g.node("MatMul", [g.inputs[0].name, g.const(np.full((D, H), 0.2, np.float32))])
        return g.node("Mul", [h, g.node("Sigmoid", [g.node("Add", [h, other])])])

    fused, misses, sites = _sites(_mlp(silu_of_a_sum))
    assert not fused_nodes(fused)
    assert len(sites) == 1 and len(misses) == 1, misses
    assert sites[0]["location"].startswith("Sigmoid ")
    assert "between two projections" in sites[0]["reason"] and sites[0]["family"] == "activation"


def test_a_refused_activation_is_reported_once_by_its_rule():
    fused, misses, sites = _sites(_mlp(lambda g, h: gelu_tanh(g, h, k=0.0447)))
    assert not fused_nodes(fused)
    assert not sites, misses
    assert misses and all(m["pattern"] == "SpelledActivation" for m in misses), misses
    assert any("Tanh: its argument is" in m["reason"] for m in misses), misses


def test_an_activation_op_no_rule_models_is_reported():
    def gemm_fast_gelu(g, h):
        g.nodes.append(helper.make_node("GemmFastGelu", [h, g.const(np.full((H, H), 0.1, np.float32))], ["gfg"],
                                        name="gfg", domain="com.microsoft"))
        return "gfg"

    model = _mlp(gemm_fast_gelu, contrib=True)
    _, misses, sites = _sites(model)
    assert [m["location"] for m in sites] == ["GemmFastGelu 'gfg'"], misses


def test_tanh_soft_capping_is_not_an_activation_site():
    def capped_scores(g, h):  # tanh(s / 30) * 30 -> Softmax -> MatMul, as Gemma 2's attention
        capped = g.node("Mul", [g.node("Tanh", [g.node("Div", [h, g.const(np.float32(30.0))])]),
                                g.const(np.float32(30.0))])
        return g.node("Softmax", [capped], axis=-1)

    def capped_logits(g, h):  # the final logit cap: nothing follows it
        return g.node("Mul", [g.node("Tanh", [g.node("Div", [h, g.const(np.float32(30.0))])]),
                              g.const(np.float32(30.0))])

    for model in (_mlp(capped_scores), _mlp(capped_logits, down=False)):
        _, misses, sites = _sites(model)
        assert not sites, misses


def test_the_signatures_find_one_site_per_layer_in_every_matrix_variant_and_nothing_else():
    """Before fusing, on the export matrix: exactly the MLP activations (no soft-capping Tanh, no
    attention Softmax neighbour), whatever the exporter, tool chain or ORT contrib ops."""
    matrix = Path(__file__).resolve().parents[3] / "models" / "fixtures" / "matrix"
    variants = json.loads((matrix / "manifest.json").read_text())["models"]
    wrong = {}
    for name, entry in variants.items():
        model = onnx.load_from_string(gzip.decompress((matrix / entry["file"]).read_bytes()))
        scan = GraphScan(model)
        anchors = [node.name for node in scan.nodes
                   if any(node.op_type in s.op_types and s.test(scan, node) for s in FAMILY.sites)]
        if len(anchors) != entry["expected"]["layers"]:
            wrong[name] = anchors
    assert not wrong
