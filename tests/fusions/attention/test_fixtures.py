"""Attention family on real exports: every attention site fused (with the q/k rotation folded in
where the model has RoPE), and the fused models match the originals in ORT, prefill and decode."""

from __future__ import annotations

import onnx
import pytest
from fixtures import fixture_entries, fixture_path

import otfuse

ENTRIES = fixture_entries()
# Fixtures whose attention is not fused yet.
NOT_YET: set[str] = set()
SITES = sorted(n for n, e in ENTRIES.items() if e["expected"].get("attention") and n not in NOT_YET)


def _dims(name, **extra):
    modules = ENTRIES[name]["config"]["vocab_size"] is None  # models/rope3d.py, legacy_attention.py: static seq
    dims = {"batch": 2} if modules else {"batch": 2, "seq": 7}
    if ENTRIES[name]["kv_cache"]:
        dims["past_seq"] = 3
    return {**dims, **extra}


@pytest.mark.parametrize("name", SITES)
def test_every_attention_site_is_fused_and_outputs_match(tmp_path, name):
    out = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(fixture_path(name), out)
    fused_attention = report.fusions.get("Attention", 0) + report.fusions.get("RopeAttention", 0)
    assert fused_attention == ENTRIES[name]["expected"]["attention"], report.fusions
    ops = {n.op_type for n in onnx.load(out).graph.node}
    assert "Softmax" not in ops
    result = otfuse.diff(fixture_path(name), out, dims=_dims(name))
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("name", ["llama", "qwen2", "mistral", "gpt_neox", "gptj", "phi", "rope3d", "gemma2"])
def test_rope_is_folded_into_attention(tmp_path, name):
    report = otfuse.fuse(fixture_path(name), tmp_path / "f.onnx")
    assert "RotaryEmbeddingQK" not in report.fusions and report.fusions["RopeAttention"] >= 1


@pytest.mark.parametrize("past,seq", [(0, 6), (5, 1), (4, 3)])
def test_kv_cache_decoder_prefill_and_decode(tmp_path, past, seq):
    out = tmp_path / "llama_kv_fused.onnx"
    report = otfuse.fuse(fixture_path("llama_kv"), out)
    assert report.fusions["RopeAttention"] == 2
    result = otfuse.diff(fixture_path("llama_kv"), out, dims={"batch": 2, "seq": seq, "past_seq": past})
    assert result.ok, [row.to_dict() for row in result.outputs]
    names = {row.name for row in result.outputs}
    assert "present.0.key" in names and "present.1.value" in names


@pytest.mark.parametrize("name", ["llama", "mistral", "bloom", "gpt2", "bert", "qwen3", "gemma2"])
def test_left_padding_matches_exactly_fully_masked_rows_included(tmp_path, name):
    """The mask the graph built is added as it is, so padded rows (every key masked by a finite
    minimum) come out as in the original, not as zeros."""
    import numpy as np

    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out)
    batch, seq = 2, 9
    feeds = {
        "input_ids": np.random.default_rng(0).integers(0, 200, (batch, seq)).astype(np.int64),
        "attention_mask": np.array([[0, 0, 0] + [1] * (seq - 3), [1] * seq], dtype=np.int64),
        "position_ids": np.broadcast_to(np.arange(seq), (batch, seq)).astype(np.int64).copy(),
        "token_type_ids": np.zeros((batch, seq), dtype=np.int64),
    }
    names = {i["name"] for i in ENTRIES[name]["inputs"]}
    result = otfuse.diff(fixture_path(name), out, inputs={k: v for k, v in feeds.items() if k in names})
    assert result.ok, [row.to_dict() for row in result.outputs]


def test_gemma2_soft_capping_and_masks_are_attributes(tmp_path):
    """Gemma2 (eager): tanh soft-capping → softcap, query_pre_attn_scalar 8 → scale 8**-0.5, the
    sliding layer's mask → window 4, the full layer's → causal; dropping the cap breaks the diff."""
    out = tmp_path / "gemma2_fused.onnx"
    otfuse.fuse(fixture_path("gemma2"), out)
    fused = onnx.load(out)
    nodes = [n for n in fused.graph.node if n.op_type == "RopeAttention"]
    got = [{a.name: onnx.helper.get_attribute_value(a) for a in n.attribute} for n in nodes]
    assert [(a["softcap"], a["causal"], a["window"]) for a in got] == [(5.0, 1, 4), (5.0, 1, 0)]
    assert all(a["scale"] == pytest.approx(8 ** -0.5) for a in got)
    assert [n.op_type for n in fused.graph.node].count("Tanh") == 1  # the final logits' cap stays
    for node in nodes:
        next(a for a in node.attribute if a.name == "softcap").f = 0.0
    onnx.save(fused, tmp_path / "uncapped.onnx")
    assert not otfuse.diff(fixture_path("gemma2"), tmp_path / "uncapped.onnx", dims=_dims("gemma2")).ok


@pytest.mark.parametrize("name, layout, kv_heads, softcap", [
    ("legacy_kt_softcap", "BSND", 4, 2.0),  # key.permute(0,2,3,1): q, k, v read before their transposes
    ("legacy_tile_gqa", "BNSD", 2, 0.0),  # Unsqueeze -> Expand(ones) -> Tile -> Reshape absorbed
    ("legacy_tile_mqa", "BNSD", 1, 0.0),  # Expand(ones) -> Tile of the one kv head absorbed
])
def test_legacy_spellings_fuse_into_one_attention(tmp_path, name, layout, kv_heads, softcap):
    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out)
    fused = onnx.load(out)
    ops = [n.op_type for n in fused.graph.node]
    assert "Tile" not in ops and "Expand" not in ops and "Tanh" not in ops
    (node,) = [n for n in fused.graph.node if n.op_type == "Attention"]
    a = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
    assert (a["layout"].decode(), a["kv_num_heads"], a.get("softcap", 0.0)) == (layout, kv_heads, softcap)
    if layout == "BSND":
        assert ops.count("Transpose") == 0
    if softcap:  # the cap bends these scores: a fusion without it would not pass the diff
        next(x for x in node.attribute if x.name == "softcap").f = 0.0
        onnx.save(fused, tmp_path / "uncapped.onnx")
        assert not otfuse.diff(fixture_path(name), tmp_path / "uncapped.onnx", dims={"batch": 2}).ok


@pytest.mark.parametrize("name", ["llama_fp16", "llama_fp16_eager", "llama_fp16_eager_torchscript"])
def test_fp16_left_padding_matches_at_every_real_token(tmp_path, name):
    """float16 with left padding: the real tokens match. The padded queries (every key masked by
    finfo(float16).min) are left out: ONNX Runtime's CPU runs the fp16 Add -> Softmax in float32
    without rounding between (measured, graph optimisations off), so it gives softmax(s - 65504) =
    softmax(s) there, where torch, the ONNX spec and the fused op (empty_rows uniform) give the
    uniform row (s + -65504 rounds to -65504 in float16)."""
    import numpy as np

    from otfuse.run.session import InferenceSession, baseline_session, run

    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out)
    batch, seq, pad = 2, 9, 3
    feeds = {
        "input_ids": np.random.default_rng(0).integers(0, 200, (batch, seq)).astype(np.int64),
        "attention_mask": np.array([[0] * pad + [1] * (seq - pad), [1] * seq], dtype=np.int64),
        "position_ids": np.broadcast_to(np.arange(seq), (batch, seq)).astype(np.int64).copy(),
    }
    want = run(baseline_session(str(fixture_path(name))), feeds)["logits"].astype(np.float32)
    got = run(InferenceSession(str(out)), feeds)["logits"].astype(np.float32)
    want[0, :pad] = got[0, :pad] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-2, atol=1e-2)  # docs/ops.md: the float16 tolerance


@pytest.mark.parametrize("name, casts_dropped", [
    ("llama_fp16_eager", 0),  # the exporter's optimizer already dropped Softmax -> Cast(float) -> Cast(fp16)
    ("llama_fp16_eager_torchscript", 4),  # Softmax(fp16) -> Cast(float) -> Cast(fp16) per layer
    ("legacy_fp16_upcast", 2),  # Cast(float) -> Softmax -> Cast(fp16): scores.float().softmax().type_as(q)
])
def test_softmax_in_float32_between_casts_is_fused(tmp_path, name, casts_dropped):
    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out)
    nodes = onnx.load(fixture_path(name)).graph.node
    around = {i for n in nodes if n.op_type == "Softmax" for i in (*n.input, *n.output)}
    casts = {n.name for n in nodes if n.op_type == "Cast" and ({*n.input, *n.output} & around)}
    casts |= {n.name for n in nodes if n.op_type == "Cast" and any(  # the second Cast of Cast -> Cast
        c.name in casts and c.output[0] in n.input for c in nodes)}
    assert len(casts) == casts_dropped
    after = onnx.load(out).graph.node
    assert not [n for n in after if n.op_type == "Softmax" or n.name in casts]


def test_where_filled_scores_with_a_constant_causal_condition_become_causal(tmp_path):
    """legacy_where_causal: torch.where(tril[:S, :S], scores, finfo.min), the condition a constant
    [1, 1, 8, 8] after export (S fixed): read off entry by entry, it is the causal mask -> causal = 1,
    no attn_bias; the diff catches the attribute dropped."""
    out = tmp_path / "legacy_where_causal_fused.onnx"
    otfuse.fuse(fixture_path("legacy_where_causal"), out)
    fused = onnx.load(out)
    (node,) = [n for n in fused.graph.node if n.op_type == "Attention"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    assert attrs["causal"] == 1 and attrs["window"] == 0 and attrs["empty_rows"] == b"uniform"
    assert len(node.input) <= 3 or not node.input[3]
    assert otfuse.diff(fixture_path("legacy_where_causal"), out, dims={"batch": 2}).ok
    next(a for a in node.attribute if a.name == "causal").i = 0
    onnx.save(fused, tmp_path / "not_causal.onnx")
    assert not otfuse.diff(fixture_path("legacy_where_causal"), tmp_path / "not_causal.onnx", dims={"batch": 2}).ok


def test_where_filled_scores_become_a_bias_that_the_diff_checks(tmp_path):
    """The same condition with one entry below the diagonal flipped is no causal mask -> attn_bias =
    Where(cond, 0, finfo.min) in float32, reported with the row that breaks it; the same bias with
    its branches swapped fails the diff."""
    import numpy as np

    model = onnx.load(fixture_path("legacy_where_causal"))
    cond = next(t for t in model.graph.initializer if t.name == "slice_4")
    values = onnx.numpy_helper.to_array(cond).copy()
    values[0, 0, 5, 2] = False
    cond.CopyFrom(onnx.numpy_helper.from_array(values, cond.name))
    src, out = tmp_path / "flipped.onnx", tmp_path / "flipped_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    assert any("query row 5 sees keys 0..5 except key 2" in m["reason"] for m in report.near_misses), \
        report.near_misses
    fused = onnx.load(out)
    (node,) = [n for n in fused.graph.node if n.op_type == "Attention"]
    where = next(n for n in fused.graph.node if n.output[0] == node.input[3])
    assert where.op_type == "Where"
    fill = next(t for t in fused.graph.initializer if t.name == where.input[2])
    assert onnx.numpy_helper.to_array(fill) == np.finfo(np.float32).min
    assert otfuse.diff(src, out, dims={"batch": 2}).ok
    where.input[1], where.input[2] = where.input[2], where.input[1]
    onnx.save(fused, tmp_path / "swapped.onnx")
    assert not otfuse.diff(src, tmp_path / "swapped.onnx", dims={"batch": 2}).ok
