"""BLOOM's graph-built ALiBi bias becomes ``alibi_slopes`` (generated in the kernel) only when running
its subgraph proves ``slope_h * (cumsum(mask) - 1) * mask`` (otfuse/fusions/attention/alibi.py);
the mutations that break the form keep it an ``attn_bias`` (or refuse), and every fused model
diffs clean against the original, left padding and holes in the mask included."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import fixture_path
from fusing import attrs, fused_nodes
from onnx import helper, numpy_helper
from peak_memory import run_child

import otfuse

BLOOM_SLOPES = [2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8]  # 4 heads: 2^(-8 h / 4)


def _fuse(tmp_path, model: onnx.ModelProto, name: str):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    return src, out, report


def _diff_with_padding(src, out, seq=9):
    """Left padding in row 0, a hole and a non-1 value in row 1: the cumsum positions differ from j."""
    rng = np.random.default_rng(0)
    feeds = {"input_ids": rng.integers(0, 200, (2, seq)).astype(np.int64),
             "attention_mask": np.array([[0, 0, 0] + [1] * (seq - 3), [1, 1, 0, 1, 3] + [1] * (seq - 5)], np.int64)}
    for inputs in (feeds, None):
        result = otfuse.diff(src, out, inputs=inputs, dims=None if inputs else {"batch": 2, "seq": seq})
        assert result.ok, [row.to_dict() for row in result.outputs]


def _attention(out) -> tuple[onnx.NodeProto, dict, dict[str, np.ndarray]]:
    model = onnx.load(out)
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    (node, *_) = [n for n in fused_nodes(model) if n.op_type == "Attention"]
    return node, attrs(node), inits


def _slopes(node, inits):
    return inits[node.input[7]].tolist() if len(node.input) > 7 and node.input[7] else None


def _mutated(mutate) -> onnx.ModelProto:
    model = onnx.load(fixture_path("bloom"))
    mutate(model)
    return model


def _init(model, name) -> onnx.TensorProto:
    return next(i for i in model.graph.initializer if i.name == name)


def _node(model, op_type, output):
    return next(n for n in model.graph.node if n.op_type == op_type and n.output[0] == output)


def test_bloom_alibi_becomes_slopes_generated_in_the_kernel(tmp_path):
    src, out, report = _fuse(tmp_path, onnx.load(fixture_path("bloom")), "bloom")
    assert report.fusions["Attention"] == 2
    node, a, inits = _attention(out)
    assert _slopes(node, inits) == BLOOM_SLOPES
    assert a["alibi_positions"] == b"mask_cumsum" and a["causal"] == 1
    assert not node.input[3], "no attn_bias: neither the ALiBi nor the mask is materialised"
    assert node.input[4] == "attention_mask"
    fused = onnx.load(out)
    assert not [n for n in fused.graph.node if n.op_type == "CumSum"], "the bias subgraph is gone"
    _diff_with_padding(src, out)


def test_other_slopes_are_recovered_from_the_graph(tmp_path):
    # "Wrong" slopes for BLOOM's formula are still slopes: read from the run, not assumed.
    def other(model):
        init = _init(model, _node(model, "Mul", "mul_1").input[0])
        init.CopyFrom(numpy_helper.from_array(np.array([[0.5], [-0.25], [3.0], [0.1]], np.float32), init.name))
    src, out, _ = _fuse(tmp_path, _mutated(other), "slopes")
    node, _, inits = _attention(out)
    assert _slopes(node, inits) == np.array([0.5, -0.25, 3.0, 0.1], np.float32).tolist()
    _diff_with_padding(src, out)


@pytest.mark.parametrize("mutation", ["offset", "squared", "length_shift", "per_batch"])
def test_mutated_biases_stay_an_additive_bias(tmp_path, mutation):
    def mutate(model):
        if mutation == "offset":  # (cumsum - 2) * mask: softmax-equal for contiguous masks only
            sub = _node(model, "Sub", "sub")  # its 1 is shared with the Range steps: a new constant
            one = numpy_helper.to_array(_init(model, sub.input[1]))
            model.graph.initializer.append(numpy_helper.from_array(np.asarray(2, one.dtype), "two"))
            sub.input[1] = "two"
        elif mutation == "squared":  # positions that are not the cumsum
            _node(model, "Mul", "mul").input[1] = "sub"
        elif mutation == "length_shift":  # + S on every key position: softmax-equal, not the op's form
            mul = _node(model, "Mul", "mul")
            model.graph.node.insert(list(model.graph.node).index(mul) + 1, helper.make_node(
                "Add", ["mul_q", "sym_size_int_9"], ["mul"], name="length_shift"))
            mul.output[0] = "mul_q"
        else:  # slopes that differ per batch row: [B*N] rows from a [2, N] table
            init = _init(model, _node(model, "Mul", "mul_1").input[0])
            table = np.array([[[0.25], [0.5], [1.0], [2.0]], [[1.0], [1.0], [1.0], [1.0]]], np.float32)
            init.CopyFrom(numpy_helper.from_array(table, init.name))
    src, out, report = _fuse(tmp_path, _mutated(mutate), mutation)
    if mutation == "per_batch":
        # [2, N, Skv] only broadcasts at batch 2; the rule must not read it as per-head slopes.
        node, _, inits = (_attention(out) if report.fusions.get("Attention") else (None, None, None))
        assert node is None or _slopes(node, inits) is None
        return
    node, _, inits = _attention(out)
    assert _slopes(node, inits) is None and node.input[3], "kept as attn_bias"
    kept = [m for m in report.near_misses if "ALiBi kept" in m["pattern"]]
    assert kept and kept[0]["fused_as"] == "Attention" and "ALiBi" in kept[0]["reason"], report.near_misses
    _diff_with_padding(src, out)


def test_an_extra_reader_of_the_biased_scores_refuses(tmp_path):
    def leak(model):
        model.graph.output.append(helper.make_tensor_value_info("baddbmm", onnx.TensorProto.FLOAT, None))
    _, _, report = _fuse(tmp_path, _mutated(leak), "leak")
    assert report.fusions.get("Attention", 0) == 1  # layer 1 fuses, layer 0's scores are read outside
    assert any("baddbmm" in (m.get("reason") or "") for m in report.near_misses), report.near_misses


def test_an_extra_reader_of_the_bias_keeps_it_and_still_uses_slopes(tmp_path):
    def read(model):
        model.graph.output.append(helper.make_tensor_value_info("view", onnx.TensorProto.FLOAT, None))
    src, out, report = _fuse(tmp_path, _mutated(read), "reader")
    assert report.fusions["Attention"] == 2
    node, _, inits = _attention(out)
    assert _slopes(node, inits) == BLOOM_SLOPES
    assert "view" in {o.name for o in onnx.load(out).graph.output}
    _diff_with_padding(src, out)


_PEAK_RSS = """
import json, sys
import otfuse
from otfuse.run.feeds import make_feeds
path, seqs = sys.argv[1], [int(s) for s in sys.argv[2:]]
session, peaks = otfuse.InferenceSession(path), []
for seq in seqs:  # growing: each peak is the run at that length (an empty cache where the model has one)
    session.run(None, make_feeds(path, {"batch": 1, "seq": seq, "past": 0}))
    peaks.append(peak_rss())
print(json.dumps(peaks))
"""


def peak_rss_growth(path, short: int = 256, long: int = 2048) -> int:
    """Bytes the peak RSS of one session of ``path`` (a child process, its own allocator) grows by
    from a ``short`` run to a ``long`` one: an [S, S] tensor at 2048 tokens is 16 MiB per head."""
    first, second = run_child(_PEAK_RSS, path, short, long)
    return second - first


def test_fused_bloom_memory_for_the_bias_does_not_grow_with_the_square_of_the_sequence(tmp_path):
    # Unfused, 4 heads of [2048, 2048] float32 scores (64 MiB) plus the [1, 1, 2048, 2048] mask
    # exist at 2048 tokens; fused, only O(S) tensors (the logits: 2 MiB). The unfused model is the
    # control that the measurement sees an S x S tensor.
    src, out, report = _fuse(tmp_path, onnx.load(fixture_path("bloom")), "bloom")
    assert report.fusions["Attention"] == 2
    fused_growth, unfused_growth = peak_rss_growth(out), peak_rss_growth(src)
    assert unfused_growth > 48 * 2**20, unfused_growth
    assert fused_growth < 24 * 2**20, (fused_growth, unfused_growth)


# Every committed BLOOM export gets its ALiBi as slopes (the matrix itself checks the counts and
# the diff; test_opaque_masks.py the optimum and unoptimised ones with padding, mutations, memory).
BLOOM_WITH_SLOPES = ["dynamo_nopos_dyn", "dynamo_nopos_dyn.fp16", "dynamo_nopos_dyn.onnxsim",
                     "dynamo_nopos_dyn.onnxslim", "dynamo_nopos_dyn.ort_basic", "dynamo_nopos_dyn.ort_extended",
                     "dynamo_nopos_dyn.unoptimised", "dynamo_nopos_static", "optimum_nopast", "optimum_past",
                     "ts14_nopos_dyn", "ts14_nopos_static", "ts17_nopos_dyn", "ts17_nopos_static", "ts20_nopos_dyn",
                     "ts20_nopos_static"]


@pytest.mark.parametrize("variant", BLOOM_WITH_SLOPES)
def test_matrix_bloom_exports_generate_alibi_in_the_kernel(tmp_path, variant):
    from models.test_export_matrix import COVERAGE, ENTRIES, MATRIX

    (tmp_path / "in").mkdir()
    path = COVERAGE.materialise(MATRIX / ENTRIES[f"bloom/{variant}"]["file"], tmp_path / "in")
    report = otfuse.fuse(path, tmp_path / "out.onnx")
    assert report.fusions["Attention"] == 2
    assert not [m for m in report.near_misses if "ALiBi" in m["pattern"]], report.near_misses
    model = onnx.load(tmp_path / "out.onnx")
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in [n for n in fused_nodes(model) if n.op_type == "Attention"]:
        assert _slopes(node, inits) == BLOOM_SLOPES and not node.input[3], node
        assert attrs(node)["alibi_positions"] == b"mask_cumsum"


def test_matrix_bloom_fp16_alibi_matches_ort_at_4100_keys_with_exact_slopes(tmp_path):
    # The float16 export's bias subgraph, run alone, is float16(slope * float16(k_pos)); in the whole
    # model ONNX Runtime's CPU EP computes it in float32 (inserted Casts), so the exact slopes
    # (alibi_round = 0) diff clean past key 2048 and alibi_round = 1 does not (alibi.py, _claim).
    from models.test_export_matrix import COVERAGE, ENTRIES, MATRIX

    (tmp_path / "in").mkdir()
    path = COVERAGE.materialise(MATRIX / ENTRIES["bloom/dynamo_nopos_dyn.fp16"]["file"], tmp_path / "in")
    otfuse.fuse(path, tmp_path / "out.onnx")
    model = onnx.load(tmp_path / "out.onnx")
    assert all("alibi_round" not in attrs(n) for n in fused_nodes(model) if n.op_type == "Attention")
    result = otfuse.diff(path, tmp_path / "out.onnx", dims={"batch": 1, "seq": 4100})
    assert result.ok, [row.to_dict() for row in result.outputs]
    for node in fused_nodes(model):
        if node.op_type == "Attention":
            node.attribute.append(helper.make_attribute("alibi_round", 1))
    onnx.save(model, tmp_path / "rounded.onnx")
    assert not otfuse.diff(path, tmp_path / "rounded.onnx", dims={"batch": 1, "seq": 4100}).ok


def _long_rows(slopes, positions, dtype):
    """A graph's bias rows [1, N, Skv] at long positions, built as an exporter in ``dtype`` would."""
    return (np.asarray(slopes, np.float32)[None, :, None] * positions).astype(dtype)


def test_alibi_form_tells_float32_float16_and_other_roundings_apart():
    import ml_dtypes

    from otfuse.fusions.attention.alibi import alibi_forms

    slopes = np.array(BLOOM_SLOPES + [2.0**-0.5], np.float32).astype(np.float16).astype(np.float32)
    positions = np.arange(4100, dtype=np.float32)[None, None, :]
    assert alibi_forms(_long_rows(slopes, positions, np.float32), slopes, positions) == {"float32"}
    half = _long_rows(slopes, positions.astype(np.float16).astype(np.float32), np.float16)
    assert alibi_forms(half, slopes, positions) == {"float16"}
    short = positions[..., :40]  # both at short positions: why the long probe exists
    assert alibi_forms(_long_rows(slopes[:4], short, np.float32), slopes[:4], short) == {"float32", "float16"}
    # Mutations: a bfloat16 bias (Falcon's), a float16 product of exact positions, a perturbed slope.
    assert alibi_forms(_long_rows(slopes, positions, ml_dtypes.bfloat16), slopes, positions) == set()
    assert alibi_forms(_long_rows(slopes, positions, np.float16), slopes, positions) == set()
    perturbed = slopes.copy()
    perturbed[-1] = np.nextafter(perturbed[-1], np.float32(1))
    assert alibi_forms(_long_rows(perturbed, positions, np.float32), slopes, positions) == set()
    assert alibi_forms(half, perturbed, positions) == set()


def test_a_bias_rounded_to_bfloat16_at_long_positions_is_not_claimed(tmp_path):
    # BLOOM's float32 bias with a float32 -> bfloat16 -> float32 round trip after the product: the
    # short probes still see exact products of the power-of-two slopes (up to key 256), the long
    # probe does not, so it stays an attn_bias.
    def bfloat16(model):
        mul = _node(model, "Mul", "mul_1")
        mul.output[0] = "mul_1_exact"
        casts = [helper.make_node("Cast", ["mul_1_exact"], ["mul_1_bf16"], to=onnx.TensorProto.BFLOAT16),
                 helper.make_node("Cast", ["mul_1_bf16"], ["mul_1"], to=onnx.TensorProto.FLOAT)]
        at = list(model.graph.node).index(mul) + 1
        for node in reversed(casts):
            model.graph.node.insert(at, node)
    src, out, report = _fuse(tmp_path, _mutated(bfloat16), "bf16")
    node, a, inits = _attention(out)
    assert _slopes(node, inits) is None and node.input[3]
    assert any("contradicts" in m["reason"] for m in report.near_misses if "ALiBi" in m["pattern"]), report.near_misses


def test_rope_fold_carries_the_slopes_onto_rope_attention():
    # otfuse.Attention(alibi_slopes) over a RotaryEmbeddingQK pair folds into RopeAttention with
    # the slopes at their contract position (input 9) and alibi_positions kept.
    from fusing import fuse_in_memory

    f, i64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
    x = [helper.make_tensor_value_info(n, f, [1, 2, 4, 8]) for n in ("q", "k", "v")]
    tables = [helper.make_tensor_value_info(n, f, [1, 1, 4, 8]) for n in ("cos", "sin")]
    mask = helper.make_tensor_value_info("mask", i64, [1, 4])
    nodes = [helper.make_node("RotaryEmbeddingQK", ["q", "k", "cos", "sin"], ["qr", "kr"], domain="otfuse"),
             helper.make_node("Attention", ["qr", "kr", "v", "", "mask", "", "", "slopes"], ["y"], domain="otfuse",
                              num_heads=2, causal=1, alibi_positions="mask_cumsum")]
    graph = helper.make_graph(nodes, "g", x + tables + [mask], [helper.make_tensor_value_info("y", f, [1, 2, 4, 8])],
                              [numpy_helper.from_array(np.array([0.5, 0.25], np.float32), "slopes")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])
    fused, report = fuse_in_memory(model, "attention")
    (node,) = fused_nodes(fused)
    assert node.op_type == "RopeAttention" and node.input[9] == "slopes" and node.input[6] == "mask"
    assert attrs(node)["alibi_positions"] == b"mask_cumsum"


def test_a_bias_of_key_indices_becomes_index_positions(tmp_path):
    # slope_h * j from the mask's shape only (cumsum of ones): the op's relative slope_h * (j - t)
    # differs by slope_h * t in each row, which the softmax cancels; padding no longer shifts it.
    def indices(model):
        ones = [helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
                helper.make_node("ConstantOfShape", ["mask_shape"], ["ones"],
                                 value=numpy_helper.from_array(np.array([1], np.int64)))]
        for node in (_node(model, "CumSum", "cumsum"), _node(model, "Mul", "mul")):
            node.input[:] = ["ones" if name == "attention_mask" else name for name in node.input]
        for node in reversed(ones):
            model.graph.node.insert(0, node)
    src, out, report = _fuse(tmp_path, _mutated(indices), "indices")
    node, a, inits = _attention(out)
    assert _slopes(node, inits) == BLOOM_SLOPES and a.get("alibi_positions", b"index") == b"index"
    assert not node.input[3]
    _diff_with_padding(src, out)


def _static_bloom(tmp_path):
    """The matrix's static-shape dynamo BLOOM (batch 2, seq 7): the exporter's optimiser proved the
    Reshape pair around P·V an identity and dropped it, so P·V is one 4-D MatMul of the
    [B, N, Sq, Skv] probabilities with the [B, N, Skv, D] values, while QKᵀ stays on [B*N, S, D]."""
    import gzip
    import shutil

    from fixtures import FIXTURES

    packed = FIXTURES / "matrix" / "bloom"
    model = onnx.load_from_string(gzip.decompress((packed / "dynamo_nopos_static.onnx.gz").read_bytes()))
    shutil.copyfile(packed / "weights.bin", tmp_path / "weights.bin")
    return model


def test_static_bloom_with_a_4d_pv_matmul_fuses_with_slopes(tmp_path):
    src, out, report = _fuse(tmp_path, _static_bloom(tmp_path), "static")
    assert report.fusions["Attention"] == 2 and not report.near_misses, report.near_misses
    for node in [n for n in fused_nodes(onnx.load(out)) if n.op_type == "Attention"]:
        assert attrs(node)["causal"] == 1 and attrs(node)["alibi_positions"] == b"mask_cumsum"
    assert otfuse.diff(src, out).ok


def test_a_4d_pv_matmul_broadcasting_one_value_batch_is_refused(tmp_path):
    """Mutation: the values sliced to batch 1, which the 4-D MatMul broadcasts over the batch; the
    fused op does not broadcast V, so nothing is fused (and the reason says why)."""
    model = _static_bloom(tmp_path)
    graph = model.graph
    softmaxes = {n.output[0] for n in graph.node if n.op_type == "Softmax"}
    for index, node in enumerate(list(graph.node)):
        if node.op_type == "MatMul" and node.input[0] in softmaxes:
            names = [f"{node.name}_{part}" for part in ("starts", "ends", "axes")]
            graph.initializer.extend(numpy_helper.from_array(np.array([v], np.int64), n)
                                     for v, n in zip((0, 1, 0), names))
            sliced = helper.make_node("Slice", [node.input[1], *names], [f"{node.name}_v1"])
            node.input[1] = sliced.output[0]
            graph.node.insert(list(graph.node).index(node), sliced)
    src, out, report = _fuse(tmp_path, model, "broadcast_v")
    assert "Attention" not in report.fusions
    assert report.near_misses
    assert otfuse.diff(src, out).ok


def _mpt(tmp_path, variant: str) -> onnx.ModelProto:
    """A matrix MPT export: ``Where(masked, min, s + alibi)`` with MPT's ``slope_h * (j - Skv + 1)``
    (a [N, 1, max] constant, sliced to the keys) added before the masked_fill."""
    import gzip
    import shutil

    from fixtures import FIXTURES

    packed = FIXTURES / "matrix" / "mpt"
    shutil.copyfile(packed / "weights.bin", tmp_path / "weights.bin")
    return onnx.load_from_string(gzip.decompress((packed / f"{variant}.onnx.gz").read_bytes()))


def _mpt_diffs(src, out):
    """Left padding, a hole and a fully masked query row (seq 1 with its only key padded)."""
    import onnxruntime as ort

    reference, fused = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]), otfuse.InferenceSession(out)
    rng = np.random.default_rng(0)
    for seq in (1, 9, 40):
        mask = np.ones((2, seq), np.int64)
        mask[0, : seq // 2 + 1] = 0
        mask[1, min(2, seq - 1)] = 0 if seq > 3 else 1
        feeds = {"input_ids": rng.integers(0, 200, (2, seq)).astype(np.int64), "attention_mask": mask}
        np.testing.assert_allclose(fused.run(None, feeds)[0], reference.run(None, feeds)[0], rtol=1e-4, atol=1e-4)


def _alibi_adds(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The ``s + alibi`` Adds under each masked_fill that feeds a Softmax."""
    produced = {out: n for n in model.graph.node for out in n.output}
    softmax_inputs = {n.input[0] for n in model.graph.node if n.op_type == "Softmax"}
    wheres = [produced[name] for name in softmax_inputs if produced.get(name) is not None
              and produced[name].op_type == "Where"]
    return [produced[w.input[2]] for w in wheres if getattr(produced.get(w.input[2]), "op_type", "") == "Add"]


@pytest.mark.parametrize("variant", ["dynamo_nopos_dyn", "ts17_nopos_dyn"])
def test_mpt_alibi_before_masked_fill_becomes_slopes(tmp_path, variant):
    """The per-row offset of MPT's key-only bias cancels under the softmax because masked_fill
    replaces the masked scores: slopes with alibi_positions "index", the mask causal + padding."""
    src, out, report = _fuse(tmp_path, _mpt(tmp_path, variant), variant)
    assert report.fusions["Attention"] == 2 and not report.near_misses, report.near_misses
    for node in [n for n in fused_nodes(onnx.load(out)) if n.op_type == "Attention"]:
        a = attrs(node)
        assert (a["causal"], a["alibi_positions"], a["empty_rows"]) == (1, b"index", b"uniform")
        assert node.input[3] == "" and node.input[4] == "attention_mask" and node.input[7]
    _mpt_diffs(src, out)


def _squared_alibi(model):
    """alibi * alibi: not linear in the key index."""
    for index, add in enumerate(_alibi_adds(model)):
        square = helper.make_node("Mul", [add.input[1], add.input[1]], [f"{add.input[1]}_squared_{index}"])
        add.input[1] = square.output[0]
        model.graph.node.insert(list(model.graph.node).index(add), square)


def _small_fill(model):
    """masked_fill with -1e4: the masked scores keep s + alibi's influence differently, and the
    fill no longer absorbs (chain_checks.fill refuses it)."""
    model.graph.initializer.append(numpy_helper.from_array(np.array(-1e4, np.float32), "small_fill"))
    for add in _alibi_adds(model):
        where = next(n for n in model.graph.node if n.op_type == "Where" and add.output[0] in n.input)
        where.input[1] = "small_fill"


@pytest.mark.parametrize("mutation", [_squared_alibi, _small_fill])
def test_mpt_mutations_keep_the_bias_and_say_why(tmp_path, mutation):
    model = _mpt(tmp_path, "dynamo_nopos_dyn")
    mutation(model)
    src, out, report = _fuse(tmp_path, model, mutation.__name__)
    for node in [n for n in fused_nodes(onnx.load(out)) if n.op_type == "Attention"]:
        assert len(node.input) <= 7 or not node.input[7]  # no alibi_slopes
    assert report.near_misses
    assert otfuse.diff(src, out).ok


def _falcon_alibi_bias() -> onnx.ModelProto:
    """Falcon's build_alibi_tensor (transformers 4.57.6) as its dynamo export writes it: bfloat16 slopes
    times bfloat16 cumsum positions, cast back to float32, viewed as [B*N, 1, Skv]."""
    tp = onnx.TensorProto
    nodes = [helper.make_node("CumSum", ["m", "axis"], ["cumsum"]), helper.make_node("Sub", ["cumsum", "one"], ["pos0"]),
             helper.make_node("Mul", ["pos0", "m"], ["pos"]), helper.make_node("Unsqueeze", ["pos", "axis1"], ["pos3"]),
             helper.make_node("Cast", ["pos3"], ["pos_bf16"], to=tp.BFLOAT16),
             helper.make_node("Mul", ["slopes", "pos_bf16"], ["alibi_bf16"]),
             helper.make_node("Cast", ["alibi_bf16"], ["alibi_f32"], to=tp.FLOAT),
             helper.make_node("Shape", ["m"], ["skv"], start=1),
             helper.make_node("Concat", ["flat", "skv"], ["shape"], axis=0),
             helper.make_node("Reshape", ["alibi_f32", "shape"], ["alibi"])]
    slopes = helper.make_tensor("slopes", tp.BFLOAT16, [4, 1], [np.float32(s) for s in BLOOM_SLOPES])
    inits = [numpy_helper.from_array(np.array(-1, np.int64), "axis"), numpy_helper.from_array(np.array(1, np.int64), "one"),
             numpy_helper.from_array(np.array([1], np.int64), "axis1"), slopes,
             numpy_helper.from_array(np.array([-1, 1], np.int64), "flat")]
    graph = helper.make_graph(nodes, "falcon_alibi", [helper.make_tensor_value_info("m", tp.INT64, ["batch", "seq"])],
                              [helper.make_tensor_value_info("alibi", tp.FLOAT, [None, 1, "seq"])], inits)
    return onnx.shape_inference.infer_shapes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_falcon_bfloat16_alibi_is_not_claimed():
    """Falcon's bias rounds slope_h * j through bfloat16: with these power-of-two slopes it is exact up to
    key 256 (every key the probes reach) and off from key 257, so slopes would be wrong past it. ONNX
    Runtime's CPU has no bfloat16 Mul: the probe cannot run it and refuses, which keeps it an attn_bias
    (the whole Falcon export does not run there either). A prober that runs it must still refuse."""
    from onnx.reference import ReferenceEvaluator

    from otfuse.fusions.attention.alibi import classify_alibi
    from otfuse.rewriter.graph import GraphIndex
    from otfuse.rewriter.refuse import Refuse

    model = _falcon_alibi_bias()
    (got,) = ReferenceEvaluator(model).run(None, {"m": np.ones((1, 300), np.int64)})
    exact = np.array(BLOOM_SLOPES, np.float32)[:, None] * np.arange(300, dtype=np.float32)
    off = np.nonzero((got.reshape(4, 300) != exact).any(axis=0))[0]
    assert off.size and off[0] == 257
    with pytest.raises(Refuse):
        classify_alibi(GraphIndex(model), "alibi", 4, "m", {})
