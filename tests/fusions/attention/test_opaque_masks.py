"""The BLOOM exports whose padding mask masks.py cannot read by its form, fused with the ALiBi
generated in the kernel: optimum's (the padding written into the causal mask in place, a
ScatterND, sliced to ``Shape(Kᵀ)[2]``; otfuse/fusions/attention/opaque_masks.py proves it by
running it) and the unoptimised dynamo export (``Where(c, Expand(0, []), min)``). Each fuses both
layers as ``Attention`` with ``alibi_slopes``, ``causal`` and ``key_padding_mask`` and no
``attn_bias``, diffs clean with left padding, holes, values of 3 and a cache, and its peak memory
does not grow with the square of the sequence. Mutations that change what the mask or the bias
computes keep them an ``attn_bias`` (reported, still exact)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import attrs, fused_nodes
from onnx import helper, numpy_helper

import otfuse
from fusions.attention.test_alibi import BLOOM_SLOPES, peak_rss_growth
from models.test_export_matrix import COVERAGE, ENTRIES, MATRIX

VARIANTS = ["optimum_nopast", "optimum_past", "dynamo_nopos_dyn.unoptimised"]


def _load(tmp_path, variant: str) -> onnx.ModelProto:
    """The matrix variant, its weights.bin beside the file ``_fuse`` writes into ``tmp_path``."""
    return onnx.load(COVERAGE.materialise(MATRIX / ENTRIES[f"bloom/{variant}"]["file"], tmp_path))


def _fuse(tmp_path, model: onnx.ModelProto, name: str):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src, save_as_external_data=True, location=f"{name}.bin")
    return src, out, otfuse.fuse(src, out)


def _attentions(out) -> list[tuple[dict, list[str], list | None]]:
    """(attributes, inputs padded to the 8 of the contract, slopes) of each fused Attention."""
    model = onnx.load(out)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    found = []
    for node in [n for n in fused_nodes(model) if n.op_type == "Attention"]:
        slopes = inits[node.input[7]].tolist() if len(node.input) > 7 and node.input[7] else None
        found.append((attrs(node), list(node.input) + [""] * (8 - len(node.input)), slopes))
    return found


def _padded_feeds(model: onnx.ModelProto, seq: int = 7, past: int = 0) -> dict[str, np.ndarray]:
    """Row 0 left-padded past the first new token, row 1 with a hole and a 3 (non-zero attends)."""
    rng = np.random.default_rng(0)
    total = past + seq
    mask = np.ones((2, total), np.int64)
    mask[0, : past + 2] = 0
    mask[1, 1], mask[1, total - 2] = 0, 3
    feeds = {"input_ids": rng.integers(0, 200, (2, seq)).astype(np.int64), "attention_mask": mask}
    for value in model.graph.input:
        if value.name.startswith("past_key_values"):
            feeds[value.name] = (rng.standard_normal((2, 4, past, 16)) * 0.5).astype(np.float32)
    return feeds


def _diffs_clean(src, out, model: onnx.ModelProto) -> None:
    """Padded runs of 7 tokens (after 3 cached ones where the model takes a cache) and of one
    token after 5 cached ones (a decoding step)."""
    has_past = any(v.name.startswith("past_key_values") for v in model.graph.input)
    for seq, past in ((7, 3), (1, 5)) if has_past else ((7, 0),):
        result = otfuse.diff(src, out, inputs=_padded_feeds(model, seq, past))
        assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("variant", VARIANTS)
def test_bloom_mask_and_alibi_are_generated_in_the_kernel(tmp_path, variant):
    model = _load(tmp_path, variant)
    src, out, report = _fuse(tmp_path, model, variant)
    assert report.fusions["Attention"] == 2 and not report.near_misses, report.near_misses
    for a, inputs, slopes in _attentions(out):
        assert slopes == BLOOM_SLOPES and a["alibi_positions"] == b"mask_cumsum"
        assert (a["causal"], a["window"], a["empty_rows"]) == (1, 0, b"uniform")
        assert inputs[3] == "" and inputs[4] == "attention_mask", "no attn_bias: neither ALiBi nor mask materialised"
    left = {n.op_type for n in onnx.load(out, load_external_data=False).graph.node}
    assert not left & {"ScatterND", "CumSum", "Trilu", "Where"}, "the mask and bias subgraphs are gone"
    _diffs_clean(src, out, model)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_bloom_bias_memory_is_flat_from_256_to_2048_tokens(tmp_path, variant):
    # Fused: only O(S) tensors grow (logits, MLP activations: 2 MiB each at 2048; ~12 MiB measured
    # in all). One [1, 1, S, S] float32 mask is 16 MiB at 2048, the [1, N, S, S] ALiBi + mask bias
    # 64 MiB; the unfused model (the control, once) grows by ~390 MiB.
    src, out, report = _fuse(tmp_path, _load(tmp_path, variant), variant)
    assert report.fusions["Attention"] == 2
    fused = peak_rss_growth(out)
    assert fused < 24 * 2**20, fused
    if variant == "optimum_nopast":
        unfused = peak_rss_growth(src)
        assert unfused > 64 * 2**20, (fused, unfused)


# -- mutations of optimum's mask and bias ------------------------------------------------------
def _node(model: onnx.ModelProto, name: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.name == name)


def _constant(model: onnx.ModelProto, name: str, value: np.ndarray) -> str:
    model.graph.initializer.append(numpy_helper.from_array(value, name))
    return name


def _padding_by_query(model):
    """attention_mask[:, None, :, None]: the padding hides query rows, not keys (not key-only)."""
    _node(model, "/transformer/Unsqueeze_10").input[1] = _constant(model, "axis_3", np.array([3], np.int64))


def _sliced_by_head_size(model):
    """mask[..., :Shape(Kᵀ)[1]]: the head size (16), not the key count; equal to Skv below 16 keys."""
    for layer in (0, 1):
        _node(model, f"/transformer/h.{layer}/self_attention/Gather_7").input[1] = \
            _constant(model, f"index_1_{layer}", np.array(1, np.int64))


def _sliced_by_merged_batch(model):
    """mask[..., :Shape(Kᵀ)[0]]: B*N, which no input's dims state (K would have to be computed)."""
    for layer in (0, 1):
        _node(model, f"/transformer/h.{layer}/self_attention/Gather_7").input[1] = \
            _constant(model, f"index_0_{layer}", np.array(0, np.int64))


def _positions_squared(model):
    """slope_h * (cumsum(m) - 1) ** 2: a per-key bias that is no slope times BLOOM's position."""
    mul = _node(model, "/transformer/Mul")
    mul.input[1] = mul.input[0]  # (cumsum - 1)^2, m dropped
    mul.input[0] = "/transformer/Sub_output_0"


@pytest.mark.parametrize("mutation,kept", [
    (_padding_by_query, {"mask kept", "ALiBi kept"}),  # no padding proven, so no mask_cumsum either
    (_sliced_by_head_size, {"mask kept", "ALiBi kept"}),  # probed at 19 and 33 keys: [.., S, 16]
    (_sliced_by_merged_batch, {"mask kept", "ALiBi kept"}),
    (_positions_squared, {"ALiBi kept"}),  # the mask is still proven
])
def test_optimum_mutations_keep_a_materialised_bias_and_say_why(tmp_path, mutation, kept):
    model = _load(tmp_path, "optimum_nopast")
    mutation(model)
    src, out, report = _fuse(tmp_path, model, mutation.__name__)
    assert report.fusions["Attention"] == 2
    patterns = {m["pattern"].split(": ")[-1].rsplit(" as ", 1)[0] for m in report.near_misses}
    assert patterns == kept, report.near_misses
    for a, inputs, slopes in _attentions(out):
        assert inputs[3], "an attn_bias"
        assert (slopes is None) == ("ALiBi kept" in kept)
        assert bool(inputs[4]) == ("mask kept" not in kept)
    _diffs_clean(src, out, model)


def test_perturbed_slopes_are_recovered_exactly(tmp_path):
    """Other slopes in the exporter's table (negative, > 1, not powers of two) are what the run
    gives: read from it, not assumed to be BLOOM's."""
    model = _load(tmp_path, "optimum_nopast")
    slopes = np.array([[0.5], [-0.25], [3.0], [0.1]], np.float32)
    table = _node(model, "/transformer/Constant_11")
    table.attribute[0].t.CopyFrom(numpy_helper.from_array(slopes))
    src, out, report = _fuse(tmp_path, model, "slopes")
    assert report.fusions["Attention"] == 2 and not report.near_misses, report.near_misses
    for _, inputs, found in _attentions(out):
        assert found == slopes.reshape(-1).tolist() and not inputs[3]
    _diffs_clean(src, out, model)


def test_unoptimised_mask_adding_a_non_zero_where_visible_stays_a_bias(tmp_path):
    """Where(c, Expand(0.5, []), min): visible keys get +0.5, which no claim states."""
    model = _load(tmp_path, "dynamo_nopos_dyn.unoptimised")
    zero = next(n for n in model.graph.node if n.output[0] == "val_106")
    zero.attribute[0].t.CopyFrom(numpy_helper.from_array(np.array(0.5, np.float32)))
    src, out, report = _fuse(tmp_path, model, "half")
    assert report.fusions["Attention"] == 2
    reasons = [m["reason"] for m in report.near_misses if "mask kept" in m["pattern"]]
    assert reasons and all("matches no causal / padding claim" in r for r in reasons), report.near_misses
    for _, inputs, slopes in _attentions(out):
        assert inputs[3] and slopes is None
    _diffs_clean(src, out, model)


def test_a_mask_reading_another_input_is_not_claimed_from_running():
    """An opaque mask that reads the values of a [B, S] input and also of past keys: no claim
    leaves the second unprobed, so none is made."""
    from otfuse.fusions.attention.opaque_masks import claim_by_running
    from otfuse.rewriter.graph import GraphIndex
    from otfuse.rewriter.refuse import Refuse

    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    nodes = [helper.make_node("Cast", ["attention_mask"], ["m"], to=f),
             helper.make_node("ReduceSum", ["other"], ["o"], keepdims=1),
             helper.make_node("Mul", ["m", "o"], ["mask"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("attention_mask", i64, ["b", "s"]),
                                           helper.make_tensor_value_info("other", f, ["b", "s"])],
                              [helper.make_tensor_value_info("mask", f, None)])
    with pytest.raises(Refuse, match="reads the values of"):
        claim_by_running(GraphIndex(helper.make_model(graph)), "mask", "not Where")
