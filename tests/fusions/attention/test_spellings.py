"""Attention family on hand-built SDPA graphs: spellings fuse with the right attributes and exact
numerics; mutations are refused or fused with attributes that keep them exact."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from fusing import assert_same_outputs, attrs, fuse_model, fused_nodes
from fusions.attention.graphs import attention_model, keys_transposed_model

import otfuse
from graphs import read_elsewhere


def fuse_attention(tmp_path, model):
    return fuse_model(tmp_path, model, only=["attention"])


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(kt="reshape3"),
    dict(kt="reshape3_folded"),
    dict(kt="reshape3_folded", kv_heads=1),
    dict(kt="reshape3_folded", repeat="tile"),
    dict(scale_at="scores_div"),
    dict(kv_heads=4),
    dict(kv_heads=1),
    dict(mask=False, nan_guard=False, out_transpose=False),
    dict(dtype=np.float16),
], ids=["gqa", "kt_reshape_transpose_reshape", "kt_flattens_repeat_kv", "kt_flattens_repeat_kv_mqa",
        "kt_flattens_tiled_repeat_kv", "scale_on_scores", "mha", "mqa", "bare", "fp16"])
def test_sdpa_spellings_fuse_into_one_attention_node(tmp_path, kwargs):
    fused, report = fuse_attention(tmp_path, attention_model(**kwargs))
    assert report.fusions == {"Attention": 1}
    assert [n.op_type for n in fused.graph.node] == ["Attention"], "repeat_kv must be absorbed"
    node = fused_nodes(fused)[0]
    a = attrs(node)
    assert a["num_heads"] == 4 and a["kv_num_heads"] == kwargs.get("kv_heads", 2)
    assert a["scale"] == pytest.approx(8 ** -0.5, rel=1e-3)
    assert a["output_layout"].decode() == ("BNSD" if kwargs.get("out_transpose") is False else "BSND")
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(k_grouping="other"), "adds axis [1], not 2"),
    (dict(kt_flat=[4, 10, 8]), "Kᵀ's first Reshape gives"),
    (dict(kt_flat=[8, 8, 5]), "Kᵀ's first Reshape gives"),
], ids=["other_grouping", "flat_merges_seq", "flat_swaps_seq_and_dim"])
def test_kt_flattening_replicated_keys_other_than_repeat_kv_is_not_fused(tmp_path, kwargs, reason):
    # The static-shape dynamo Kᵀ flattens the 5-D replicated keys: it is HF's repeat_kv only when
    # the new axis 2 holds the copies (kv head outer) and the flatten keeps [S, D] whole. The
    # other grouping ([B, rep, Nkv, S, D]: head h reads kv head h % Nkv) or a flatten mixing
    # the sequence into the rows computes another function.
    fused, report = fuse_attention(tmp_path, attention_model(kt="reshape3_folded", **kwargs))
    assert fused is None
    assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


def test_one_kv_head_broadcast_by_the_matmuls_is_mqa(tmp_path):
    # Falcon: k and v [B, 1, S, D] with no repeat_kv; the MatMuls broadcast the one head.
    fused, report = fuse_attention(tmp_path, attention_model(kv_heads=1, repeat="none"))
    assert [n.op_type for n in fused.graph.node] == ["Attention"]
    assert attrs(fused_nodes(fused)[0])["kv_num_heads"] == 1
    assert_same_outputs(tmp_path)


def test_keys_of_batch_one_broadcast_over_the_batch_are_not_fused(tmp_path):
    # k, v [1, 1, S, D] against q [B, N, S, D]: the MatMuls broadcast the batch too; the op does not.
    fused, report = fuse_attention(tmp_path, attention_model(kv_heads=1, repeat="none", kv_batch=1))
    assert fused is None
    assert any("has batch 1, which the MatMul broadcasts" in miss["reason"] for miss in report.near_misses), \
        report.near_misses


def test_scale_split_unevenly_is_fused_with_the_product(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(q_scale=0.5, k_scale=0.25))
    assert attrs(fused_nodes(fused)[0])["scale"] == pytest.approx(0.125)
    assert_same_outputs(tmp_path)


def test_scale_from_a_graph_input_is_not_fused(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(scale_input=True))
    assert fused is None
    assert any("not a constant" in miss["reason"] for miss in report.near_misses)


def test_softmax_over_another_axis_is_not_fused(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(softmax_axis=2))
    assert fused is None
    assert any("Softmax runs over axis 2" in miss["reason"] for miss in report.near_misses)


def test_k_not_transposed_is_not_fused(tmp_path):
    fused, _ = fuse_attention(tmp_path, attention_model(k_perm=(0, 1, 2, 3)))
    assert fused is None


def test_v_from_another_head_grouping_keeps_its_repeat(tmp_path):
    # v repeated as [v0, v1, v0, v1] (not HF's [v0, v0, v1, v1]): its repeat is not an index map
    # the kernel knows, so the fused node must read the repeated tensor and count every head.
    fused, report = fuse_attention(tmp_path, attention_model(v_grouping="other"))
    node = fused_nodes(fused)[0]
    assert attrs(node)["kv_num_heads"] == 4
    assert "Expand" in [n.op_type for n in fused.graph.node]
    assert_same_outputs(tmp_path)


def test_probabilities_used_elsewhere_block_the_fusion(tmp_path):
    fused, report = fuse_attention(tmp_path, attention_model(leak_probs=True))
    assert fused is None
    assert any("also used by" in miss["reason"] for miss in report.near_misses)


# -- logit soft-capping (Gemma2): cap * tanh(scores / cap) between the scale and the mask ----------
@pytest.mark.parametrize("spelling", ["div", "mul"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=["fp32", "fp16"])
def test_soft_capping_is_fused_as_softcap(tmp_path, spelling, dtype):
    fused, report = fuse_attention(tmp_path, attention_model(softcap=3.0, softcap_spelling=spelling, dtype=dtype))
    assert report.fusions == {"Attention": 1}
    assert [n.op_type for n in fused.graph.node] == ["Attention"]
    a = attrs(fused_nodes(fused)[0])
    assert a["softcap"] == 3.0 and a["scale"] == pytest.approx(8 ** -0.5, rel=1e-3)
    assert_same_outputs(tmp_path)


def test_soft_capping_without_mask_or_scale_is_fused(tmp_path):
    fused, _ = fuse_attention(tmp_path, attention_model(softcap=1.5, scale_at="none", mask=False))
    a = attrs(fused_nodes(fused)[0])
    assert a["softcap"] == 1.5 and a["scale"] == 1.0
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("kwargs, reason", [
    (dict(softcap=3.0, softcap_inner=2.0), "divides by 2.0 but multiplies by 3.0"),
    (dict(softcap=3.0, softcap_inner=2.0, softcap_spelling="mul"), "not by 1/3.0"),
    (dict(softcap=-3.0), "not one finite positive number"),
], ids=["other_divisor", "other_reciprocal", "negative_cap"])
def test_soft_capping_with_other_constants_is_not_fused(tmp_path, kwargs, reason):
    fused, report = fuse_attention(tmp_path, attention_model(**kwargs))
    assert fused is None
    assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


def test_soft_capping_after_the_mask_is_not_fused(tmp_path):
    # tanh of (scores + mask): the op caps before adding the bias, so this is another function.
    fused, _ = fuse_attention(tmp_path, attention_model(softcap=3.0, softcap_after_mask=True))
    assert fused is None


def test_soft_capping_per_head_is_not_fused(tmp_path):
    model = attention_model(softcap=3.0)
    tanh = next(n for n in model.graph.node if n.op_type == "Tanh")
    outer = next(n for n in model.graph.node if n.op_type == "Mul" and tanh.output[0] in n.input)
    cap = next(t for t in model.graph.initializer if t.name in outer.input)
    cap.CopyFrom(numpy_helper.from_array(np.array([3.0, 3.0, 2.0, 3.0], np.float32).reshape(1, 4, 1, 1), cap.name))
    fused, report = fuse_attention(tmp_path, model)
    assert fused is None
    assert any("not one finite positive number" in miss["reason"] for miss in report.near_misses)


# -- repeat_kv spelled with Tile -------------------------------------------------------------------
@pytest.mark.parametrize("kv_heads", [2, 1], ids=["gqa", "mqa"])
def test_repeat_kv_with_tile_on_a_new_axis_is_absorbed(tmp_path, kv_heads):
    # Unsqueeze(2) -> Tile([1, 1, rep, 1, 1]) -> Reshape is HF's grouping: head h reads h // rep.
    fused, report = fuse_attention(tmp_path, attention_model(kv_heads=kv_heads, repeat="tile"))
    assert [n.op_type for n in fused.graph.node] == ["Attention"]
    assert attrs(fused_nodes(fused)[0])["kv_num_heads"] == kv_heads
    assert_same_outputs(tmp_path)


def test_bare_tile_of_one_kv_head_is_absorbed(tmp_path):
    # MQA: Tile(k, [1, N, 1, 1]) gives h % 1 == h // N, both the only kv head.
    fused, _ = fuse_attention(tmp_path, attention_model(kv_heads=1, repeat="tile_heads"))
    assert [n.op_type for n in fused.graph.node] == ["Attention"]
    assert attrs(fused_nodes(fused)[0])["kv_num_heads"] == 1
    assert_same_outputs(tmp_path)


def test_bare_tile_of_several_kv_heads_is_read_as_it_is(tmp_path):
    # Tile(k, [1, rep, 1, 1]) gives [k0, k1, k0, k1]: query head h reads h % Nkv, not HF's h // rep.
    # The fused node must not take the kv heads as a group: it reads the tiled tensors, N kv heads.
    fused, _ = fuse_attention(tmp_path, attention_model(kv_heads=2, repeat="tile_heads"))
    assert attrs(fused_nodes(fused)[0])["kv_num_heads"] == 4
    assert [n.op_type for n in fused.graph.node].count("Tile") == 2
    assert_same_outputs(tmp_path)
    # Absorbing the Tiles as HF's grouping (kv_num_heads = 2 on the untiled k, v) would be wrong:
    node, tiles = fused_nodes(fused)[0], {n.output[0]: n.input[0] for n in fused.graph.node if n.op_type == "Tile"}
    node.input[1], node.input[2] = tiles[node.input[1]], tiles[node.input[2]]
    next(a for a in node.attribute if a.name == "kv_num_heads").i = 2
    onnx.save(fused, tmp_path / "m_fused.onnx")
    with pytest.raises(AssertionError):
        assert_same_outputs(tmp_path)


def test_tile_on_another_axis_keeps_its_repeat(tmp_path):
    # v: Unsqueeze(1) -> Tile([1, rep, 1, 1, 1]) -> Reshape: the other head grouping, via Tile.
    fused, _ = fuse_attention(tmp_path, attention_model(repeat="tile", v_grouping="other"))
    assert attrs(fused_nodes(fused)[0])["kv_num_heads"] == 4
    assert "Tile" in [n.op_type for n in fused.graph.node]
    assert_same_outputs(tmp_path)


# -- keys the graph already holds transposed ----------------------------------------------------------
def test_keys_permuted_from_bsnd_are_read_in_bsnd_with_q_and_v(tmp_path):
    # GPT-2's eager split: q, v permute(0,2,1,3), k permute(0,2,3,1), all of [B, S, N, D].
    fused, report = fuse_attention(tmp_path, keys_transposed_model())
    assert [n.op_type for n in fused.graph.node] == ["Attention"], "the three transposes must go"
    a = attrs(fused_nodes(fused)[0])
    assert a["layout"] == b"BSND" and a["output_layout"] == b"BSND" and a["kv_num_heads"] == 4
    assert a["scale"] == pytest.approx(8 ** -0.5)
    assert list(fused_nodes(fused)[0].input[:3]) == ["q", "k", "v"]
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("kwargs", [dict(q_layout="bnsd"), dict(v_layout="bnsd"), dict(keys="input"),
                                    dict(keys="input", q_layout="bnsd", v_layout="bnsd")],
                         ids=["q_bnsd", "v_bnsd", "kt_input", "kt_input_qv_bnsd"])
def test_keys_given_transposed_get_a_transpose_to_bnsd(tmp_path, kwargs):
    fused, report = fuse_attention(tmp_path, keys_transposed_model(**kwargs))
    assert report.fusions == {"Attention": 1}
    node = fused_nodes(fused)[0]
    assert attrs(node)["layout"] == b"BNSD"
    transpose = next(n for n in fused.graph.node if n.output[0] == node.input[1])
    assert attrs(transpose)["perm"] == ([0, 1, 3, 2] if kwargs.get("keys") == "input" else [0, 2, 1, 3])
    assert_same_outputs(tmp_path)


def test_a_cache_kept_transposed_is_read_through_a_transpose(tmp_path):
    fused, report = fuse_attention(tmp_path, keys_transposed_model(keys="cache"))
    assert report.fusions == {"Attention": 1}
    assert "Concat" in [n.op_type for n in fused.graph.node]  # the caches stay what the graph made
    assert_same_outputs(tmp_path, dims={"batch": 2, "seq": 5, "past": 3, "total": 8})


@pytest.mark.parametrize("perm", [(0, 2, 1, 3), (0, 3, 2, 1), (0, 1, 3, 2)])
def test_keys_permuted_otherwise_are_not_read_as_bsnd(tmp_path, perm):
    # [B, N, D, S] from another permutation: its input is not [B, S, N, D] (heads and positions
    # elsewhere), so neither BSND rule may take it as keys. (0,1,3,2) is the plain rule's Kᵀ.
    fused, report = fuse_attention(tmp_path, keys_transposed_model(k_perm=perm))
    if perm == (0, 1, 3, 2):
        assert attrs(fused_nodes(fused)[0])["layout"] == b"BNSD"
        assert_same_outputs(tmp_path)
    else:
        assert fused is None


def test_keys_given_transposed_with_other_shapes_are_not_fused(tmp_path):
    fused, report = fuse_attention(tmp_path, keys_transposed_model(keys="input", kt_heads=1))
    assert fused is None
    assert any("has Nkv = 1: not proven equal" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_a_symbolic_head_size_of_the_keys_is_the_queries_one(tmp_path):
    """Kᵀ [B, N, d, S] with d symbolic: Q·Kᵀ's inner dims agree in every run, so d is q's 8."""
    fused, report = fuse_attention(tmp_path, keys_transposed_model(keys="input", kt_dim="d"))
    assert [n.op_type for n in fused_nodes(fused)] == ["Attention"], report.near_misses
    assert_same_outputs(tmp_path, dims={"batch": 2, "seq": 5, "d": 8})


# -- the softmax in float32 between Casts (HF eager fp16/bf16, Meta's scores.float()) ---------------
F32, F16, BF16 = onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16


def softmax_with_casts(model, before=(F32,), after=(F16,), mask_in_float=False, infer=True):
    """``model`` with Casts to the ``before`` types in front of its Softmax and to the ``after``
    types behind it; ``mask_in_float``: the first Cast sits between the scores and the mask Add
    (the mask input becomes float32). ``infer=False``: the caller fixes up types, then infers."""
    nodes = list(model.graph.node)
    softmax = next(n for n in nodes if n.op_type == "Softmax")
    head = next(n for n in nodes if n.output[0] == softmax.input[0]) if mask_in_float else softmax
    at = nodes.index(head)
    if mask_in_float:  # Add(scores, mask) -> Add(Cast(scores), mask)
        slot = next(i for i, name in enumerate(head.input) if name != "mask")
        for value in model.graph.input:
            if value.name == "mask":
                value.type.tensor_type.elem_type = F32
    else:
        slot = 0
    chain = []
    for i, to in enumerate(before):
        chain.append(onnx.helper.make_node("Cast", [head.input[slot]], [f"wide_{i}"], name=f"wide_{i}", to=to))
        head.input[slot] = f"wide_{i}"
    tail, probs = [], softmax.output[0]
    softmax.output[0] = previous = "probs_0"
    for i, to in enumerate(after):
        out = probs if i == len(after) - 1 else f"probs_{i + 1}"
        tail.append(onnx.helper.make_node("Cast", [previous], [out], name=f"narrow_{i}", to=to))
        previous = out
    nodes[at:at] = chain
    nodes[nodes.index(softmax) + 1:nodes.index(softmax) + 1] = tail
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model, strict_mode=True) if infer else model


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(mask_in_float=True),
    dict(before=(), after=(F32, F16)),
    dict(nan_guard=False, mask=False),
], ids=["cast_softmax_cast", "mask_added_in_float", "softmax_cast_cast", "no_mask_no_guard"])
def test_softmax_in_float32_between_casts_is_fused(tmp_path, kwargs):
    casts = {k: kwargs.pop(k) for k in ("before", "after", "mask_in_float") if k in kwargs}
    model = softmax_with_casts(attention_model(dtype=np.float16, **kwargs), **casts)
    fused, report = fuse_attention(tmp_path, model)
    assert report.fusions == {"Attention": 1}, report.near_misses
    assert [n.op_type for n in fused.graph.node] == ["Attention"], "the Casts must go"
    assert attrs(fused_nodes(fused)[0])["kv_num_heads"] == 2
    assert_same_outputs(tmp_path)


@pytest.mark.parametrize("to, reason", [
    (BF16, "gives BFLOAT16, not q's FLOAT16"),  # the probabilities rounded to bf16: the op would not
    # kept float32 (the Cast to float32 of float32 probabilities is a copy, dropped): the op would
    # round them to float16
    (F32, "never cast back to q's FLOAT16"),
], ids=["bf16", "float32"])
def test_probabilities_cast_to_another_type_than_qs_are_not_fused(tmp_path, to, reason):
    # Cast(float) -> Softmax -> Cast(to), and the values cast to `to` for the product (a valid graph).
    # MHA: a Cast after repeat_kv would also hide v's kv heads (a refusal of its own).
    model = attention_model(dtype=np.float16, out_transpose=False, nan_guard=False, kv_heads=4)
    model = softmax_with_casts(model, (F32,), (to,), infer=False)
    narrowed = next(n for n in model.graph.node if n.name == "narrow_0").output[0]
    matmul = next(n for n in model.graph.node if n.op_type == "MatMul" and n.input[0] == narrowed)
    cast = onnx.helper.make_node("Cast", [matmul.input[1]], ["v_cast"], name="v_cast", to=to)
    matmul.input[1] = "v_cast"
    model.graph.node.insert(list(model.graph.node).index(matmul), cast)
    model.graph.output[0].type.tensor_type.elem_type = to
    del model.graph.value_info[:]
    model = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    fused, report = fuse_attention(tmp_path, model)
    assert fused is None
    assert any(reason in miss["reason"] for miss in report.near_misses), report.near_misses


@pytest.mark.parametrize("before, after", [((F16,), (F32,)), ((), (F16, F32))], ids=["scores", "probabilities"])
def test_float32_attention_rounded_through_float16_is_not_fused(tmp_path, before, after):
    # A float32 graph that narrows the scores (or the probabilities) to float16 rounds where the
    # op, float32 throughout, would not.
    fused, report = fuse_attention(tmp_path, softmax_with_casts(attention_model(), before, after))
    assert fused is None
    assert any("not q's FLOAT to FLOAT" in miss["reason"] or "takes FLOAT to FLOAT16" in miss["reason"]
               for miss in report.near_misses), report.near_misses


def test_softmax_between_casts_over_another_axis_is_not_fused(tmp_path):
    fused, report = fuse_attention(tmp_path, softmax_with_casts(attention_model(dtype=np.float16, softmax_axis=2)))
    assert fused is None
    assert any("Softmax runs over axis 2" in miss["reason"] for miss in report.near_misses)


def test_float32_probabilities_used_elsewhere_block_the_fusion(tmp_path):
    model = softmax_with_casts(attention_model(dtype=np.float16))
    read_elsewhere(model, "probs_0")
    fused, report = fuse_attention(tmp_path, model)
    assert fused is None
    assert any("also used by" in miss["reason"] or "graph output" in miss["reason"]
               for miss in report.near_misses), report.near_misses


def assert_bf16_outputs_match(tmp_path, feeds_shapes, seed=0, **given):
    """ORT has no CPU bfloat16 MatMul: the original runs in onnx's reference evaluator (bfloat16
    rounding at every node, as the graph says), the fused model in ORT with our library. Inputs:
    random bfloat16 of ``feeds_shapes``, and the ``given`` arrays."""
    import ml_dtypes
    from onnx.reference import ReferenceEvaluator

    from otfuse.run.session import InferenceSession, run

    rng = np.random.default_rng(seed)
    feeds = {name: rng.standard_normal(shape).astype(ml_dtypes.bfloat16) for name, shape in feeds_shapes.items()}
    feeds.update(given)
    with np.errstate(over="ignore"):  # finfo.min + finfo.min is -inf, in the graph as here
        want = ReferenceEvaluator(str(tmp_path / "m.onnx")).run(None, feeds)[0].astype(np.float32)
    got = run(InferenceSession(str(tmp_path / "m_fused.onnx")), feeds)["y"].astype(np.float32)
    np.testing.assert_allclose(got, want, rtol=5e-2, atol=5e-2)  # docs/ops.md: the bfloat16 tolerance


@pytest.mark.parametrize("casts", [dict(), dict(before=(), after=(F32, BF16))],
                         ids=["cast_softmax_cast", "softmax_cast_cast"])
def test_bf16_softmax_in_float32_between_casts_is_fused(tmp_path, casts):
    import ml_dtypes

    model = softmax_with_casts(attention_model(dtype=ml_dtypes.bfloat16), **{"after": (BF16,), **casts})
    fused, report = fuse_attention(tmp_path, model)
    assert [n.op_type for n in fused.graph.node] == ["Attention"], report.near_misses
    assert_bf16_outputs_match(tmp_path, {"q": (2, 4, 5, 8), "k": (2, 2, 5, 8), "v": (2, 2, 5, 8), "mask": (2, 1, 5, 5)})


# -- a boolean mask written Where(cond, scores, fill) (older eager code, GPT-2 before 4.4x) -----------
def scores_filled(model, fill, cond="input", swapped=False, after_mask=False):
    """``model`` (attention_model) with ``Where(cond, s, fill)`` on the scores in front of the mask
    Add (or of the Softmax; ``after_mask``: of the masked scores, MPT's order): ``cond`` a bool
    graph input "visible" [batch, 1, seq, seq] (True = attend; with ``swapped``, "masked" and
    ``Where(masked, fill, s)``), or "causal" (j <= i from a Range over q's sequence length);
    ``fill`` a number (of the scores' type) or "input"."""
    nodes = list(model.graph.node)
    softmax = next(n for n in nodes if n.op_type == "Softmax")
    producer = next(n for n in nodes if n.output[0] == softmax.input[0])
    reader, slot = (producer, 0) if producer.op_type == "Add" and not after_mask else (softmax, 0)
    elem = model.graph.input[0].type.tensor_type.elem_type
    added, inits = [], []
    if cond == "causal":
        inits += [numpy_helper.from_array(np.array(v, np.int64), n) for n, v in
                  (("i2", 2), ("zero_i", 0), ("one_i", 1), ("kv_axes", [0, 1, 2]), ("q_axes", [0, 1, 3]))]
        added += [onnx.helper.make_node("Shape", ["q"], ["q_shape"]),
                  onnx.helper.make_node("Gather", ["q_shape", "i2"], ["q_len"], axis=0),
                  onnx.helper.make_node("Range", ["zero_i", "q_len", "one_i"], ["idx"]),
                  onnx.helper.make_node("Unsqueeze", ["idx", "kv_axes"], ["kv_idx"]),  # [1, 1, 1, S]
                  onnx.helper.make_node("Unsqueeze", ["idx", "q_axes"], ["q_idx"]),  # [1, 1, S, 1]
                  onnx.helper.make_node("LessOrEqual", ["kv_idx", "q_idx"], ["cond"])]
        cond_name = "cond"
    else:
        cond_name = "masked" if swapped else "visible"
        model.graph.input.append(onnx.helper.make_tensor_value_info(cond_name, onnx.TensorProto.BOOL,
                                                                    ["batch", 1, "seq", "seq"]))
    if fill == "input":
        model.graph.input.append(onnx.helper.make_tensor_value_info("fill", elem, []))
    else:
        dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
        inits.append(numpy_helper.from_array(np.array(fill, dtype=np.float32).astype(dtype), "fill"))
    scores = reader.input[slot] if reader is softmax else next(i for i in producer.input if i != "mask")
    branches = ["fill", scores] if swapped else [scores, "fill"]
    added.append(onnx.helper.make_node("Where", [cond_name, *branches], ["filled"], name="fill_where"))
    reader.input[list(reader.input).index(scores)] = "filled"
    at = nodes.index(reader)
    nodes[at:at] = added
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.graph.initializer.extend(inits)
    del model.graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model, strict_mode=True)


def visibility(batch=2, seq=5, fully_masked_row=True, seed=0):
    """A random bool [batch, 1, seq, seq] (True = attend) with the diagonal visible, and one query
    row that sees no key (a padded position)."""
    rng = np.random.default_rng(seed)
    visible = (rng.random((batch, 1, seq, seq)) < 0.6) | np.eye(seq, dtype=bool)
    if fully_masked_row:
        visible[0, 0, 1, :] = False
    return visible


def feeds_with(model, **given):
    from otfuse.run.feeds import make_feeds

    return {**make_feeds(model, dims={"batch": 2, "seq": 5}, seed=0), **given}


@pytest.mark.parametrize("fill", [float(np.finfo(np.float32).min), -1e30], ids=["finfo_min", "minus_1e30"])
@pytest.mark.parametrize("mask", [False, True], ids=["alone", "then_added_mask"])
def test_where_fill_on_the_scores_becomes_a_bias(tmp_path, fill, mask):
    model = scores_filled(attention_model(mask=mask, nan_guard=False), fill)
    fused, report = fuse_attention(tmp_path, model)
    assert report.fusions == {"Attention": 1}, report.near_misses
    node = fused_nodes(fused)[0]
    bias = next(n for n in fused.graph.node if n.output[0] == node.input[3])
    assert bias.op_type == ("Add" if mask else "Where")
    feeds = {"visible": visibility()}
    if mask:  # an additive padding mask too: row 2 of batch 1 masked everywhere by it
        padding = np.zeros((2, 1, 5, 5), np.float32)
        padding[1, 0, 2, :] = np.finfo(np.float32).min
        feeds["mask"] = padding
    result = otfuse.diff(tmp_path / "m.onnx", tmp_path / "m_fused.onnx", inputs=feeds_with(model, **feeds))
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("swapped", [True, False], ids=["masked_fill", "where_visible"])
def test_where_fill_after_the_mask_add_becomes_a_where_of_the_mask(tmp_path, swapped):
    # MPT: Where(masked, min, s + alibi). The bias is Where(masked, min, m): s + m where visible,
    # s + min = min where masked, whatever m holds (here a padding row of min in m as well).
    model = scores_filled(attention_model(nan_guard=False), float(np.finfo(np.float32).min), swapped=swapped,
                          after_mask=True)
    fused, report = fuse_attention(tmp_path, model)
    assert report.fusions == {"Attention": 1}, report.near_misses
    node = fused_nodes(fused)[0]
    assert next(n for n in fused.graph.node if n.output[0] == node.input[3]).op_type == "Where"
    visible = visibility()
    padding = np.random.default_rng(1).normal(size=(2, 1, 5, 5)).astype(np.float32)
    padding[1, 0, 2, :] = np.finfo(np.float32).min
    feeds = feeds_with(model, mask=padding, **({"masked": ~visible} if swapped else {"visible": visible}))
    result = otfuse.diff(tmp_path / "m.onnx", tmp_path / "m_fused.onnx", inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]


def test_where_fill_after_the_mask_add_that_keeps_the_scores_is_not_fused(tmp_path):
    model = scores_filled(attention_model(nan_guard=False), -1e4, swapped=True, after_mask=True)
    fused, report = fuse_attention(tmp_path, model)
    assert fused is None
    assert any("is not -inf or <=" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_where_fill_with_branches_swapped_reads_true_as_masked(tmp_path):
    # Where(masked, fill, s): the bias must be Where(masked, fill, 0); the same bias with the
    # branches the other way round (True = attend) fails the diff.
    model = scores_filled(attention_model(nan_guard=False, mask=False), float(np.finfo(np.float32).min), swapped=True)
    fused, report = fuse_attention(tmp_path, model)
    assert report.fusions == {"Attention": 1}, report.near_misses
    feeds = feeds_with(model, masked=~visibility())
    assert otfuse.diff(tmp_path / "m.onnx", tmp_path / "m_fused.onnx", inputs=feeds).ok
    where = next(n for n in fused.graph.node if n.op_type == "Where")
    where.input[1], where.input[2] = where.input[2], where.input[1]
    onnx.save(fused, tmp_path / "unswapped.onnx")
    assert not otfuse.diff(tmp_path / "m.onnx", tmp_path / "unswapped.onnx", inputs=feeds).ok


def test_where_fill_of_a_causal_condition_becomes_causal(tmp_path):
    # The condition (j <= i from a Range) is proven causal by masks.py: no bias, the masked keys'
    # fill (finfo.min) becomes the op's causal mask (their probabilities are exactly 0 either way).
    model = scores_filled(attention_model(nan_guard=False, mask=False), float(np.finfo(np.float32).min), cond="causal")
    fused, report = fuse_attention(tmp_path, model)
    assert [n.op_type for n in fused.graph.node] == ["Attention"], report.near_misses
    a = attrs(fused_nodes(fused)[0])
    assert (a["causal"], a["window"], a["empty_rows"]) == (1, 0, b"uniform")
    assert len(fused_nodes(fused)[0].input) == 3
    for seq in (1, 5, 9):
        assert_same_outputs(tmp_path, dims={"batch": 2, "seq": seq})


def test_minus_inf_fill_is_fused_only_behind_the_nan_guard(tmp_path):
    # -inf: a row with every key masked is NaN in the graph's Softmax. Behind HF's IsNaN guard it
    # is 0, which is what the op gives; without the guard fusing would turn NaN into 0.
    fused, report = fuse_attention(tmp_path, scores_filled(attention_model(nan_guard=False, mask=False), -np.inf))
    assert fused is None
    assert any("-inf without the IsNaN guard" in miss["reason"] for miss in report.near_misses), report.near_misses
    model = scores_filled(attention_model(mask=False), -np.inf)
    fused, report = fuse_attention(tmp_path, model)
    assert report.fusions == {"Attention": 1}, report.near_misses
    result = otfuse.diff(tmp_path / "m.onnx", tmp_path / "m_fused.onnx", inputs=feeds_with(model, visible=visibility()))
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("fill, dtype", [(-1e4, np.float32), (-1e9, np.float32),
                                         (float(np.finfo(np.float16).min), np.float16)],
                         ids=["minus_1e4", "minus_1e9", "fp16_finfo_min"])
def test_where_fill_too_small_to_absorb_the_scores_is_not_fused(tmp_path, fill, dtype):
    model = scores_filled(attention_model(nan_guard=False, mask=False, dtype=dtype), fill)
    fused, report = fuse_attention(tmp_path, model)
    assert fused is None
    assert any("is not -inf or <= -1e+30" in miss["reason"] for miss in report.near_misses), report.near_misses


def test_a_small_fill_as_a_bias_would_change_a_fully_masked_row(tmp_path):
    # Why -1e4 is refused: the op would compute softmax(s - 1e4) = softmax(s) for a row that sees
    # no key, where the graph's Where makes it uniform. Build that fusion by hand: the diff fails.
    model = scores_filled(attention_model(nan_guard=False, mask=False, out_transpose=False), -1e4)
    onnx.save(model, tmp_path / "m.onnx")
    nodes = [onnx.helper.make_node("Where", ["visible", "zero", "fill"], ["bias"]),
             onnx.helper.make_node("Attention", ["q", "k", "v", "bias"], ["y"], domain="otfuse", num_heads=4,
                                   kv_num_heads=2)]
    inits = [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(-1e4), "fill")]
    graph = onnx.helper.make_graph(nodes, "g", model.graph.input, model.graph.output, inits)
    hand = onnx.helper.make_model(graph, opset_imports=[*model.opset_import, onnx.helper.make_opsetid("otfuse", 1)])
    hand.ir_version = model.ir_version
    onnx.save(hand, tmp_path / "hand.onnx")
    partial = feeds_with(model, visible=visibility(fully_masked_row=False))
    assert otfuse.diff(tmp_path / "m.onnx", tmp_path / "hand.onnx", inputs=partial).ok  # exp(-1e4) is 0
    full = feeds_with(model, visible=visibility(fully_masked_row=True))
    assert not otfuse.diff(tmp_path / "m.onnx", tmp_path / "hand.onnx", inputs=full).ok


def test_where_fill_that_is_not_a_constant_is_not_fused(tmp_path):
    fused, report = fuse_attention(tmp_path, scores_filled(attention_model(nan_guard=False, mask=False), "input"))
    assert fused is None
    assert any("'fill' is not a constant" in miss["reason"] for miss in report.near_misses), report.near_misses


@pytest.mark.parametrize("mask_in_float", [False, True], ids=["mask_added_in_bf16", "mask_added_in_float"])
def test_bf16_where_fill_and_softmax_in_float32_are_fused(tmp_path, mask_in_float):
    # bfloat16's finfo.min (-3.39e38) absorbs the scores as float32's does; Casts around the Softmax
    # (the float32 mask added after the widening Cast: the bias is Where(cond, 0, fill) + mask in float32).
    import ml_dtypes

    model = attention_model(dtype=ml_dtypes.bfloat16, nan_guard=False)
    model = scores_filled(model, float(ml_dtypes.finfo(ml_dtypes.bfloat16).min))
    model = softmax_with_casts(model, after=(BF16,), mask_in_float=mask_in_float)
    fused, report = fuse_attention(tmp_path, model)
    assert report.fusions == {"Attention": 1}, report.near_misses
    assert "Softmax" not in [n.op_type for n in fused.graph.node]
    mask = np.random.default_rng(1).standard_normal((2, 1, 5, 5))
    mask[1, 0, 2, :] = float(ml_dtypes.finfo(ml_dtypes.bfloat16).min)  # a row masked by the added mask too
    mask = mask.astype(np.float32 if mask_in_float else ml_dtypes.bfloat16)
    assert_bf16_outputs_match(tmp_path, {"q": (2, 4, 5, 8), "k": (2, 2, 5, 8), "v": (2, 2, 5, 8)},
                              visible=visibility(), mask=mask)
