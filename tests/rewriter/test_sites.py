"""Sites no rule began to match are still in the report (issue 10: BLOOM's TorchScript export fused
no attention and reported nothing). Each family's site signatures find its anchors in the graph
left after fusing; every anchor no near miss names becomes one "<family> site" near miss."""

from __future__ import annotations

import numpy as np
from onnx import helper
from fusing import fuse_model
from graphs import F32, GraphBuilder

from otfuse.rewriter.sites import GraphScan, SiteSignature, unfused_sites

S, D = 6, 8


def _scores_attention(b: GraphBuilder, q: str, k: str, v: str, between: str) -> str:
    """softmax(between(Q Kᵀ)) V, ``between`` a unary op between the MatMul and the Softmax."""
    scores = b.node("MatMul", [q, b.node("Transpose", [k], perm=[0, 2, 1])])
    odd = b.node(between, [scores])
    return b.node("MatMul", [b.node("Softmax", [odd], axis=-1), v])


def _three_inputs(b: GraphBuilder) -> tuple[str, str, str]:
    return tuple(b.input(n, F32, [2, S, D]) for n in ("q", "k", "v"))


def test_an_attention_no_rule_matched_is_reported_by_its_softmax(tmp_path):
    b = GraphBuilder()
    q, k, v = _three_inputs(b)
    _scores_attention(b, q, k, v, "Tanh")  # a bare Tanh of the scores: no rule's spelling
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, [2, S, D])
    _, report = fuse_model(tmp_path, b.model(), only=["attention"])
    sites = [m for m in report.near_misses if m["pattern"] == "attention site"]
    assert len(sites) == 1, report.near_misses
    assert sites[0]["location"].startswith("Softmax ")
    assert "no attention rule matched" in sites[0]["reason"]


def test_a_classifier_softmax_is_not_an_attention_site(tmp_path):
    b = GraphBuilder()
    x = b.input("x", F32, [2, D])
    logits = b.node("MatMul", [x, b.const(np.ones((D, 4), np.float32))])
    b.node("Softmax", [logits], axis=-1)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, [2, 4])
    _, report = fuse_model(tmp_path, b.model(), only=["attention"])
    assert not report.near_misses


def test_an_op_another_tool_fused_is_reported_as_a_norm_site(tmp_path):
    b = GraphBuilder()
    x = b.input("x", F32, [2, S, D])
    skip = b.input("skip", F32, [2, S, D])
    b.nodes.append(_contrib("SkipLayerNormalization", [x, skip, b.const(np.ones(D, np.float32)),
                                                        b.const(np.zeros(D, np.float32))], "y"))
    b.output("y", F32, [2, S, D])
    graph = helper.make_graph(b.nodes, "g", b.inputs, b.outputs, b.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    _, report = fuse_model(tmp_path, model, only=["norm"])
    (site,) = report.near_misses
    assert site["pattern"] == "norm site" and "SkipLayerNormalization" in site["location"]


def test_a_site_a_rule_already_reported_is_not_reported_twice():
    b = GraphBuilder()
    q, k, v = _three_inputs(b)
    _scores_attention(b, q, k, v, "Tanh")
    model = b.model()
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    signature = SiteSignature("softmax", frozenset({"Softmax"}))
    assert unfused_sites(model, [("attention", signature)], reported={softmax.name}) == []
    assert len(unfused_sites(model, [("attention", signature)], reported=set())) == 1


def test_reaches_walks_only_through_the_ops_it_is_given():
    b = GraphBuilder()
    x = b.input("x", F32, [2, D])
    y = b.node("Relu", [b.node("Tanh", [b.node("MatMul", [x, b.const(np.ones((D, D), np.float32))])])])
    model = b.model()
    scan = GraphScan(model)
    relu = next(n for n in model.graph.node if n.op_type == "Relu")
    assert scan.reaches(relu, {"MatMul"}, {"Tanh"}, upstream=True)
    assert not scan.reaches(relu, {"MatMul"}, set(), upstream=True)
    assert not scan.reaches(relu, {"MatMul"}, {"Tanh"}, upstream=True, depth=1)
    assert y


def _contrib(op: str, inputs: list[str], output: str):
    return helper.make_node(op, inputs, [output], name=op, domain="com.microsoft", epsilon=1e-5)
