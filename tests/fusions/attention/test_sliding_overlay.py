"""Gemma3's and EXAONE-4's sliding-window layer as the dynamo exporter writes transformers 4.57's
``and_masks(causal, sliding_window_overlay, padding)``: ``Greater(kv_idx, Reshape(Sub(q_idx, W)))``
And ``LessOrEqual(kv_idx, Reshape(q_idx))`` And ``GatherND(attention_mask, ...)``. The corpus
export (corpus_new/gemma3/dynamo_pos_dyn, 391 KB) is too large to commit, so its mask's node
sequence is rebuilt here node for node on an SDPA over graph inputs q, k, v. The window is read
off the comparison and claimed only when running the mask agrees."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusions.attention.graphs import MASK_FILL, MaskNodes, attention_model, with_computed_mask
from onnx import TensorProto, helper

import otfuse
from otfuse.fusions.attention.masks import classify_mask
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.refuse import Refuse

MIN = MASK_FILL
WINDOW = 4


def _overlay_model(window_term=None, causal_op="LessOrEqual") -> onnx.ModelProto:
    """The exporter's mask feeding attention_model's SDPA. ``window_term(node, const, kv, q)``
    replaces the window comparison (the exporter's is ``Greater(kv, Reshape(Sub(q, 4), [-1, 1]))``)."""
    recorded = MaskNodes()
    node, const = recorded.node, recorded.const

    column = const([-1, 1])
    seq = node("Shape", ["attention_mask"], start=1, end=2)
    batch = node("Shape", ["attention_mask"], start=0, end=1)
    ones = node("Reshape", [node("Cast", [node("Expand", [const(1.0, np.float32), seq])], to=TensorProto.BOOL), column])
    arange = node("Range", [const(0), node("Squeeze", [seq]), const(1)])
    if window_term is None:
        window = node("Greater", [arange, node("Reshape", [node("Sub", [arange, const(WINDOW)]), column])])
    else:
        window = window_term(node, const, arange, lambda v: node("Reshape", [v, column]))
    causal = node(causal_op, [arange, node("Reshape", [arange, column])])
    both = node("And", [ones, node("And", [node("And", [ones, window]), causal])])
    # padding: GatherND(Cast(attention_mask, bool), [batch_idx, kv_idx]) reshaped to [B, 1, S]
    rows = node("Reshape", [node("Range", [const(0), node("Squeeze", [batch]), const(1)]), column])
    grid = node("Shape", [node("Max", [rows, arange])])
    index = node("Concat", [node("Unsqueeze", [node("Expand", [rows, grid]), const([-1])]),
                            node("Unsqueeze", [node("Expand", [arange, grid]), const([-1])])], axis=-1)
    kept = node("GatherND", [node("Cast", ["attention_mask"], to=TensorProto.BOOL), index])
    kept = node("Reshape", [kept, node("Concat", [batch, const([1]), seq], axis=0)])
    visible = node("Unsqueeze", [node("And", [both, kept]), const([1])])
    mask = node("Where", [visible, const(0.0, np.float32), const(MIN, np.float32)])
    attention_mask = helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"])
    return with_computed_mask(attention_model(), recorded, mask, [attention_mask])


def _fused(tmp_path, model, name):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    otfuse.fuse(src, out)
    result = otfuse.diff(src, out, dims={"batch": 2, "seq": 9})
    assert result.ok, [row.to_dict() for row in result.outputs]
    fused = onnx.load(out)
    attention = next(n for n in fused.graph.node if n.op_type in ("Attention", "RopeAttention"))
    attrs = {a.name: helper.get_attribute_value(a) for a in attention.attribute}
    masks = list(attention.input[3:5]) + ["", ""]
    return attrs.get("causal", 0), attrs.get("window", 0), bool(masks[0]), masks[1]


def _classify(model):
    graph = GraphIndex(model)
    return classify_mask(graph, "mask", {}, ())


def test_the_exporters_overlay_is_a_window_of_four(tmp_path):
    claim = _classify(_overlay_model())
    assert (claim.causal, claim.window, claim.key_padding) == (True, WINDOW, "attention_mask")
    assert _fused(tmp_path, _overlay_model(), "overlay") == (1, WINDOW, False, "attention_mask")


def _greater_or_equal(node, const, kv, column):  # kv >= q - 4: five keys
    return node("GreaterOrEqual", [kv, column(node("Sub", [kv, const(WINDOW)]))])


def _difference_less(node, const, kv, column):  # q - kv < 4, the query first
    return node("Less", [node("Sub", [column(kv), kv]), const(WINDOW)])


def _difference_less_or_equal(node, const, kv, column):  # q - kv <= 4: five keys
    return node("LessOrEqual", [node("Sub", [column(kv), kv]), const(WINDOW)])


def _operands_swapped(node, const, kv, column):  # q - 4 < kv
    return node("Less", [column(node("Sub", [kv, const(WINDOW)])), kv])


def _other_constant(node, const, kv, column):  # kv > q - 3
    return node("Greater", [kv, column(node("Sub", [kv, const(3)]))])


def _constant_on_the_key_side_too(node, const, kv, column):  # kv + 2 > q - 4: six keys
    return node("Greater", [node("Add", [kv, const(2)]), column(node("Sub", [kv, const(WINDOW)]))])


def _cache_offset(node, const, kv, column):  # kv > (q + past) - 4, past read off a shape (0 here)
    past = node("Sub", [node("Squeeze", [node("Shape", ["attention_mask"], start=1, end=2)]),
                        node("Squeeze", [node("Shape", ["q"], start=2, end=3)])])
    return node("Greater", [kv, column(node("Sub", [node("Add", [kv, past]), const(WINDOW)]))])


@pytest.mark.parametrize("name,term,window", [
    ("greater_or_equal", _greater_or_equal, WINDOW + 1),
    ("difference_less", _difference_less, WINDOW),
    ("difference_less_or_equal", _difference_less_or_equal, WINDOW + 1),
    ("operands_swapped", _operands_swapped, WINDOW),
    ("other_constant", _other_constant, 3),
    ("constant_on_the_key_side_too", _constant_on_the_key_side_too, WINDOW + 2),
    ("cache_offset", _cache_offset, WINDOW),
])
def test_other_spellings_of_the_window_term_claim_the_window_they_compute(name, term, window):
    claim = _classify(_overlay_model(term))
    assert (claim.causal, claim.window, claim.key_padding) == (True, window, "attention_mask")


def test_a_window_fused_from_another_spelling_diffs_clean(tmp_path):
    assert _fused(tmp_path, _overlay_model(_greater_or_equal), "ge") == (1, WINDOW + 1, False, "attention_mask")


def _lookahead(node, const, kv, column):  # q > kv - 4: always true with causal, no window
    return node("Greater", [column(kv), node("Sub", [kv, const(WINDOW)])])


def _key_offset_only(node, const, kv, column):  # kv + 4 > q, the constant on the key's side
    return node("Greater", [node("Add", [kv, const(WINDOW)]), column(kv)])


def test_a_lookahead_bound_is_no_window():
    """Read structurally as a window of 4 (which index is the query shows only when it runs);
    running it refutes that, so no window is claimed."""
    with pytest.raises(Refuse, match="contradicts causal=True, window=4"):
        _classify(_overlay_model(_lookahead))


def test_the_constant_on_the_keys_side_is_the_same_window():
    claim = _classify(_overlay_model(_key_offset_only))
    assert (claim.causal, claim.window) == (True, WINDOW)


def test_a_strict_causal_comparison_keeps_the_bias(tmp_path):
    """kv < q masks the diagonal: running refutes causal=True, so nothing is claimed."""
    with pytest.raises(Refuse, match="contradicts"):
        _classify(_overlay_model(causal_op="Less"))
    assert _fused(tmp_path, _overlay_model(causal_op="Less"), "strict") == (0, 0, True, "")


def _query_range_shifted(node, const, kv, column):
    """kv > q' - 4 with q' = Range(1, S + 1): a window of 3 whose shift hides in the Range's start,
    so the structure reads 4."""
    seq = node("Squeeze", [node("Shape", ["attention_mask"], start=1, end=2)])
    shifted = node("Range", [const(1), node("Add", [seq, const(1)]), const(1)])
    return node("Greater", [kv, column(node("Sub", [shifted, const(WINDOW)]))])


def test_a_window_read_wrong_by_its_structure_is_refuted_by_running(tmp_path):
    with pytest.raises(Refuse, match="contradicts causal=True, window=4"):
        _classify(_overlay_model(_query_range_shifted))
    assert _fused(tmp_path, _overlay_model(_query_range_shifted), "shifted") == (0, 0, True, "")
