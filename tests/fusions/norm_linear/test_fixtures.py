"""Norm + Linear family on real exports: every norm whose output feeds a projection with a
constant weight becomes a *NormLinear node, no such projection is left behind, and the fused
model matches the original in ORT (float32 1e-4, float16 1e-2)."""

from __future__ import annotations

import onnx
import pytest
from fixtures import fixture_entries, fixture_path

import otfuse
from otfuse.rewriter.graph import GraphIndex

ENTRIES = fixture_entries()
NORMS = {"RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm"}
# Norm sites that feed projections: decoders all norms (q/k/v, gate/up or fc, lm_head); BERT all
# but the last (its output is the model's); Qwen3's per-head q/k norms feed no projection.
EXPECTED = {"llama": 5, "qwen2": 5, "bert": 4, "gpt2": 5, "phi": 3, "mistral": 5, "qwen3": 5,
            "gpt_neox": 5, "gptj": 3, "bloom": 5, "llama_fp16": 5, "llama_kv": 5, "llama_opset23": 5}


def _projection_readers(graph: GraphIndex, value: str) -> list[onnx.NodeProto]:
    """MatMul / Gemm nodes that read ``value`` (directly or through a Reshape) as their first
    operand with a constant weight (or a Transpose of one)."""
    found = []
    for user in graph.uses(value):
        if user.op_type == "Reshape" and user.input[0] == value:
            found += _projection_readers(graph, user.output[0])
        elif user.op_type in ("MatMul", "Gemm") and user.input[0] == value:
            w = user.input[1]
            producer = graph.producer.get(w)
            if graph.is_constant(w) or (producer is not None and producer.op_type == "Transpose"
                                        and graph.is_constant(producer.input[0])):
                found.append(user)
    return found


def _sites(path) -> int:
    model = onnx.load(path)
    graph = GraphIndex(model)
    return sum(1 for n in model.graph.node
               if n.domain == "otfuse" and n.op_type in NORMS and _projection_readers(graph, n.output[0]))


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_norm_projection_site_is_fused(tmp_path, name):
    norms_only = tmp_path / "norm.onnx"
    otfuse.fuse(fixture_path(name), norms_only, only=["norm"])
    assert _sites(norms_only) == EXPECTED[name]

    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(fixture_path(name), out, only=["norm", "norm_linear"])
    linear = sum(v for k, v in report.fusions.items() if k.endswith("Linear"))
    assert linear == EXPECTED[name], report.fusions
    assert _sites(out) == 0  # no norm -> projection pair left unfused
    assert not [m for m in report.near_misses if m["family"] == "norm_linear"], report.near_misses
    fused = onnx.load(out)
    assert sum(n.op_type.endswith("Linear") for n in fused.graph.node if n.domain == "otfuse") == linear
    dims = {"batch": 2, "seq": 7, **({"past_seq": 3} if ENTRIES[name]["kv_cache"] else {})}
    result = otfuse.diff(fixture_path(name), out, dims=dims)
    assert result.ok, [row.to_dict() for row in result.outputs]


def test_every_family_together_still_matches(tmp_path):
    """norm_linear before rope and attention: the projections' outputs keep their names."""
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(fixture_path("llama"), out, only=["norm", "norm_linear", "rope", "attention"])
    assert report.fusions.get("AddRMSNormLinear") == 4 and report.fusions.get("RMSNormLinear") == 1
    result = otfuse.diff(fixture_path("llama"), out, dims={"batch": 2, "seq": 7})
    assert result.ok, [row.to_dict() for row in result.outputs]


def test_gpt2_gemm_and_tied_lm_head(tmp_path):
    out = tmp_path / "fused.onnx"
    otfuse.fuse(fixture_path("gpt2"), out, only=["norm", "norm_linear"])
    nodes = [n for n in onnx.load(out).graph.node if n.op_type == "AddLayerNormLinear"]
    transposed = [list(a.ints) for n in nodes for a in n.attribute if a.name == "transposed"]
    biased = [list(a.ints) for n in nodes for a in n.attribute if a.name == "has_bias"]
    assert transposed.count([1]) == 1  # lm_head reads the tied embedding [vocab, hidden] transposed
    assert biased.count([1]) == 4  # the four Conv1D Gemms carry their bias


# Exports whose lm_head is the embedding table (a Gather reads it too): GPT-2 and BLOOM tie it;
# the Qwen2 / LLaMA-family fixtures (and Phi, GPT-NeoX, GPT-J) have their own lm_head weight.
TIED = {"gpt2", "bloom"}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_shared_weight_only_on_a_tied_lm_head(tmp_path, name):
    """shared_weight = 1 exactly on the projection whose weight a Gather reads (the tied lm_head,
    read transposed), nowhere else: an untied lm_head (Qwen2's, LLaMA's) and every other projection
    carry no attribute, so the custom-op kernel never copies their weights."""
    out = tmp_path / "fused.onnx"
    otfuse.fuse(fixture_path(name), out, only=["norm", "norm_linear"])
    model = onnx.load(out)
    gathered = {n.input[0] for n in model.graph.node if n.op_type == "Gather"}
    marked = []
    for node in model.graph.node:
        if not (node.domain == "otfuse" and node.op_type.endswith("Linear")):
            continue
        attributes = {a.name: list(a.ints) for a in node.attribute if a.type == onnx.AttributeProto.INTS}
        widths = attributes["out_features"]
        first = len(node.input) - len(widths) - sum(attributes.get("has_bias", []))
        weights = node.input[first:first + len(widths)]
        for weight, shared in zip(weights, attributes.get("shared_weight", [0] * len(widths))):
            assert shared == int(weight in gathered), (node.name, weight)
            if shared:
                marked.append((weight, attributes["transposed"][weights.index(weight)]))
    assert len(marked) == (1 if name in TIED else 0), marked
    assert all(transposed == 1 for _, transposed in marked)


def _tied_qwen2(path) -> None:
    """The Qwen2 fixture with its lm_head tied as Qwen2-0.5B's is: the head's MatMul reads
    Transpose(embed_tokens) (the exporter's spelling on GPT-2) instead of its own [K, V] weight."""
    model = onnx.load(fixture_path("qwen2"))
    table = "model.model.embed_tokens.weight"
    (head,) = [n for n in model.graph.node if n.op_type == "MatMul" and n.input[1] in
               {i.name for i in model.graph.initializer if list(i.dims) == [64, 256]}]
    old = head.input[1]
    head.input[1] = "embed_tokens_t"
    model.graph.node.insert(list(model.graph.node).index(head),
                            onnx.helper.make_node("Transpose", [table], ["embed_tokens_t"], perm=[1, 0]))
    model.graph.initializer.remove(next(i for i in model.graph.initializer if i.name == old))
    onnx.save(model, path)


def test_tied_qwen2_head_is_marked(tmp_path):
    """Qwen2's export with a tied head (mutated from the untied fixture): its head, and only it, is
    marked, read transposed; the fused model matches."""
    _tied_qwen2(tmp_path / "tied.onnx")
    out = tmp_path / "fused.onnx"
    otfuse.fuse(tmp_path / "tied.onnx", out, only=["norm", "norm_linear"])
    marked = [(n.input[-1], {a.name: list(a.ints) for a in n.attribute}) for n in onnx.load(out).graph.node
              if any(a.name == "shared_weight" for a in n.attribute)]
    assert [(w, a["shared_weight"], a["transposed"]) for w, a in marked] == \
        [("model.model.embed_tokens.weight", [1], [1])]
    result = otfuse.diff(tmp_path / "tied.onnx", out, dims={"batch": 2, "seq": 7})
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("name", ["gpt2", "qwen2_tied"])
def test_tied_head_on_the_custom_op_route(tmp_path, name, monkeypatch):
    """Plain ORT with the custom-op library (no plugin EP, so the kernel packs the tied table
    itself): the logits with the panels and with the table read in place
    (OTFUSE_NORM_LINEAR_SHARED_PACK=0) match the original's."""
    import numpy as np
    import onnxruntime as ort

    from otfuse.run.feeds import make_feeds

    source = fixture_path(name) if name == "gpt2" else tmp_path / "tied.onnx"
    if name == "qwen2_tied":
        _tied_qwen2(source)
    out = tmp_path / "fused.onnx"
    otfuse.fuse(source, out, only=["norm", "norm_linear"])
    feeds = make_feeds(onnx.load(source), dims={"batch": 1, "seq": 70}, seed=3)
    expected = ort.InferenceSession(str(source), providers=["CPUExecutionProvider"]).run(None, feeds)
    for knob in ("1", "0"):
        monkeypatch.setenv("OTFUSE_NORM_LINEAR_SHARED_PACK", knob)
        options = ort.SessionOptions()
        options.register_custom_ops_library(otfuse.library_path())
        got = ort.InferenceSession(str(out), options, providers=["CPUExecutionProvider"]).run(None, feeds)
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-4, atol=1e-4, err_msg=f"knob {knob}")
