"""Masks whose causal / sliding-window part is a graph constant (static-shape exports), read off
entry by entry (otfuse/fusions/attention/constant_masks.py) and claimed as ``causal`` /
``window`` / ``key_padding_mask`` with no ``attn_bias``.

TorchScript's static Mistral exports fold the causal comparison and the window overlay into
constants beside the padding gathered from ``attention_mask``: each fuses as the dynamic exports
do (``causal = 1``, ``window = 4``, ``key_padding_mask``). Mutations of the constant (one entry
flipped, a row's window shifted by one, the causal bound dropped, a fill too weak to mask) keep
the bias and say why in the report. Small static graphs cover the other ways a constant part
meets the padding (``Add``, ``Min``, ``Where``, ``And``) and a constant bias on its own."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fusing import attrs, fused_nodes
from graphs import GraphBuilder
from onnx import TensorProto, helper, numpy_helper

import otfuse
from models.test_export_matrix import COVERAGE, ENTRIES, MATRIX, dims_for

STATIC = [f"mistral/{ts}_{pos}_static" for ts in ("ts14", "ts17", "ts20") for pos in ("pos", "nopos")]
DYNAMIC = [key.replace("_static", "_dyn") for key in STATIC] + ["mistral/dynamo_pos_static",
                                                               "mistral/dynamo_nopos_static"]
KEPT = "mask kept as a materialised attn_bias"


def _attentions(out) -> list[tuple[dict, dict]]:
    """(attributes, {input name: value}) of each fused Attention / RopeAttention."""
    names = {"Attention": ["Q", "K", "V", "attn_bias", "key_padding_mask"],
             "RopeAttention": ["Q", "K", "V", "cos", "sin", "attn_bias", "key_padding_mask"]}
    found = []
    for node in fused_nodes(onnx.load(out, load_external_data=False)):
        if node.op_type in names:
            inputs = dict(zip(names[node.op_type], list(node.input) + [""] * 8))
            found.append((attrs(node), inputs))
    return found


def _padded_feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Row 0 left-padded by 2, row 1 with a hole and a 3 (any non-zero attends)."""
    rng = np.random.default_rng(0)
    mask = np.ones((2, 7), np.int64)
    mask[0, :2] = 0
    mask[1, 1], mask[1, 5] = 0, 3
    feeds = {"input_ids": rng.integers(0, 200, (2, 7)).astype(np.int64), "attention_mask": mask}
    if any(v.name == "position_ids" for v in model.graph.input):
        feeds["position_ids"] = np.tile(np.arange(7, dtype=np.int64), (2, 1))
    return feeds


def _fuse(tmp_path, model: onnx.ModelProto, name: str):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src, save_as_external_data=True, location=f"{name}.bin")
    return src, out, otfuse.fuse(src, out)


def _matrix(tmp_path, key: str) -> onnx.ModelProto:
    return onnx.load(COVERAGE.materialise(MATRIX / ENTRIES[key]["file"], tmp_path))


@pytest.mark.parametrize("key", STATIC)
def test_static_torchscript_mistral_mask_is_causal_window_and_padding(tmp_path, key):
    entry = ENTRIES[key]
    (tmp_path / "in").mkdir()
    src = COVERAGE.materialise(MATRIX / entry["file"], tmp_path / "in")
    out = tmp_path / "fused.onnx"
    report = otfuse.fuse(src, out)
    assert not [m for m in report.near_misses if m.get("pattern", "").endswith(KEPT)], report.near_misses
    found = _attentions(out)
    assert len(found) == entry["expected"]["attention"]
    for a, inputs in found:
        assert (a["causal"], a["window"], a["empty_rows"]) == (1, 4, b"zero")
        assert inputs["attn_bias"] == "" and inputs["key_padding_mask"] == "attention_mask"
    result = otfuse.diff(src, out, dims=dims_for(entry))
    assert result.ok, [row.to_dict() for row in result.outputs]
    model = onnx.load(src, load_external_data=False)
    result = otfuse.diff(src, out, inputs=_padded_feeds(model))
    assert result.ok, [row.to_dict() for row in result.outputs]


@pytest.mark.parametrize("key", DYNAMIC)
def test_dynamic_and_dynamo_variants_are_unchanged(tmp_path, key):
    """The same model exported with dynamic shapes (and by dynamo at static ones) was already
    claimed from the mask's structure: the same attributes, still no bias."""
    (tmp_path / "in").mkdir()
    src = COVERAGE.materialise(MATRIX / ENTRIES[key]["file"], tmp_path / "in")
    report = otfuse.fuse(src, tmp_path / "fused.onnx")
    assert not [m for m in report.near_misses if m.get("pattern", "").endswith(KEPT)], report.near_misses
    rows = "zero" if key.split("/")[1].startswith("ts") else "uniform"
    for a, inputs in _attentions(tmp_path / "fused.onnx"):
        assert (a["causal"], a["window"], a["empty_rows"]) == (1, 4, rows.encode())
        assert inputs["attn_bias"] == "" and inputs["key_padding_mask"] == "attention_mask"


# -- mutations of ts14_pos_static's constant part ------------------------------------------------
def _constant_node(model: onnx.ModelProto, output: str) -> onnx.NodeProto:
    return next(n for n in model.graph.node if n.op_type == "Constant" and n.output[0] == output)


def _rewrite_constant(model: onnx.ModelProto, output: str, change) -> None:
    node = _constant_node(model, output)
    values = numpy_helper.to_array(node.attribute[0].t).copy()
    change(values)
    node.attribute[0].t.CopyFrom(numpy_helper.from_array(values))


def _overlay(model: onnx.ModelProto) -> str:
    """The folded sliding-window overlay: the constant bool [1, 1, 7, 7] an And reads."""
    for node in model.graph.node:
        for name in node.input if node.op_type == "And" else ():
            const = next((c for c in model.graph.node if c.op_type == "Constant" and c.output[0] == name), None)
            if const is not None and const.attribute[0].t.data_type == TensorProto.BOOL and \
                    list(const.attribute[0].t.dims) == [1, 1, 7, 7]:
                return name
    raise AssertionError("no overlay constant")


def _flip_entry(model):
    _rewrite_constant(model, _overlay(model), lambda v: v.__setitem__((0, 0, 5, 3), False))


def _shift_one_row(model):
    _rewrite_constant(model, _overlay(model), lambda v: v.__setitem__((0, 0, 6, 3), False))


def _not_causal(model):
    """The causal comparison's query index all 6: every key <= 6, so only the overlay is left."""
    less = next(n for n in model.graph.node if n.op_type == "LessOrEqual")
    _rewrite_constant(model, less.input[1], lambda v: v.__setitem__(slice(None), 6))


def _weak_fill(model):
    """Every layer's Where(cond, 0, -inf) fills -100: the keys it hides keep weight."""
    for where in [n for n in model.graph.node if n.op_type == "Where" and "self_attn" in n.name]:
        node = next((c for c in model.graph.node if c.op_type == "Constant" and c.output[0] == where.input[2]), None)
        if node is not None and np.isneginf(numpy_helper.to_array(node.attribute[0].t)).all():
            _rewrite_constant(model, where.input[2], lambda v: v.__setitem__(slice(None), -100.0))


MUTATIONS = {
    "flipped_entry": (_flip_entry, "query row 5 sees keys 2..5 except key 3, not one band"),
    "shifted_row": (_shift_one_row, "window that differs per row: query row 6 sees its last 3 keys, row 4 its last 4"),
    "not_causal": (_not_causal, "is not causal: query row 0 (position 0) sees key 6"),
    "weak_fill": (_weak_fill, "the mask adds 0.0 / -100.0, not 0 / a large negative minimum"),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_a_constant_part_not_exactly_causal_stays_a_bias_and_says_why(tmp_path, mutation):
    change, reason = MUTATIONS[mutation]
    model = _matrix(tmp_path, "mistral/ts14_pos_static")
    change(model)
    src, out, report = _fuse(tmp_path, model, mutation)
    kept = [m for m in report.near_misses if m.get("pattern", "").endswith(KEPT)]
    assert len(kept) == 2 and all(m["fused_as"] == "RopeAttention" for m in kept), report.near_misses
    assert all(reason in m["reason"] for m in kept), [m["reason"] for m in kept]
    for a, inputs in _attentions(out):
        assert (a.get("causal", 0), a.get("window", 0)) == (0, 0) and inputs["attn_bias"]
        assert inputs["key_padding_mask"] == ""
    result = otfuse.diff(src, out, inputs=_padded_feeds(model))  # the bias is exact
    assert result.ok, [row.to_dict() for row in result.outputs]


# -- the other spellings of a constant part, on a small static graph ------------------------------
S, W, HEADS, HEAD_DIM = 10, 3, 4, 8
MIN = float(np.finfo(np.float32).min)


def _band(window: int = W) -> np.ndarray:
    i, j = np.arange(S)[:, None], np.arange(S)[None, :]
    return (j <= i) & (j > i - window)


def _static_model(mask: str, visible: np.ndarray | None = None, fill: float = -np.inf,
                  constant_values: np.ndarray | None = None) -> onnx.ModelProto:
    """q, k, v [2, 4, 10, 8] and attention_mask [2, 10] at fixed sizes; the scores plus a mask
    whose constant part is ``visible`` (the band by default), combined with the padding by
    ``mask``: "add", "min", "where", "and", "alone" (the constant bias only) or "values" (the
    constant [1, 1, S, S] ``constant_values`` added as it is)."""
    b = GraphBuilder()
    visible = _band() if visible is None else visible
    f32 = TensorProto.FLOAT
    q, k, v = (b.input(name, f32, [2, HEADS, S, HEAD_DIM]) for name in ("q", "k", "v"))
    kt = b.node("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.node("Mul", [b.node("MatMul", [q, kt]), b.const(np.asarray(HEAD_DIM ** -0.5, np.float32))])
    padding = b.node("Cast", [b.node("Unsqueeze", [b.input("attention_mask", TensorProto.INT64, [2, S]),
                                                   b.const(np.array([1, 2], np.int64))])], to=TensorProto.BOOL)
    zero, filler = b.const(np.asarray(0.0, np.float32)), b.const(np.asarray(fill, np.float32))
    bias = b.const(np.where(visible, 0.0, fill).astype(np.float32)[None, None])
    if mask == "add":
        added = b.node("Add", [bias, b.node("Where", [padding, zero, filler])])
    elif mask == "min":
        added = b.node("Min", [bias, b.node("Where", [padding, zero, filler])])
    elif mask == "where":
        added = b.node("Where", [padding, bias, filler])
    elif mask == "and":
        added = b.node("Where", [b.node("And", [b.const(visible[None, None]), padding]), zero, filler])
    elif mask == "alone":
        added = bias
    else:
        added = b.const(constant_values.astype(np.float32))
    probs = b.node("Softmax", [b.node("Add", [scores, added])], axis=-1)
    probs = b.node("Where", [b.node("IsNaN", [probs]), zero, probs])
    b.node("MatMul", [probs, v])
    b.nodes[-1].output[0] = "y"
    b.output("y", f32, [2, HEADS, S, HEAD_DIM])
    return b.model()


def _fuse_small(tmp_path, model, name):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    return src, out, report


@pytest.mark.parametrize("mask,fill", [("add", -np.inf), ("min", MIN), ("where", MIN), ("where", -np.inf),
                                       ("and", MIN), ("alone", MIN), ("alone", -np.inf)])
def test_constant_parts_combined_with_the_padding_are_claimed(tmp_path, mask, fill):
    src, out, report = _fuse_small(tmp_path, _static_model(mask, fill=fill), f"{mask}_{np.isinf(fill)}")
    assert report.fusions.get("Attention") == 1 and not report.near_misses, report.near_misses
    ((a, inputs),) = _attentions(out)
    assert (a["causal"], a["window"]) == (1, W)
    assert a["empty_rows"] == (b"zero" if np.isinf(fill) else b"uniform")
    assert inputs["attn_bias"] == ""
    assert inputs["key_padding_mask"] == ("" if mask == "alone" else "attention_mask")
    result = otfuse.diff(src, out)
    assert result.ok, [row.to_dict() for row in result.outputs]


def test_a_window_as_wide_as_the_sequence_is_plain_causal(tmp_path):
    """At the one size the export runs at, a window of S or more keeps every earlier key."""
    src, out, report = _fuse_small(tmp_path, _static_model("where", _band(S), MIN), "wide")
    ((a, inputs),) = _attentions(out)
    assert (a["causal"], a["window"]) == (1, 0) and inputs["attn_bias"] == ""


@pytest.mark.parametrize("name,values,reason", [
    ("bidirectional", np.abs(np.arange(S)[:, None] - np.arange(S)[None, :]) < W,
     "is not causal: query row 0 (position 0) sees key 2"),
    ("strictly_before", np.tril(np.ones((S, S), bool), -1), "query row i sees the keys up to i - 1, not i"),
    ("one_wider_row", _band() | (np.arange(S)[None, :] == np.array([[-1]] * 8 + [[5], [-1]])),
     "query row 3 sees its last 3 keys, row 8 its last 4"),
])
def test_a_constant_bias_of_another_form_stays_a_bias_and_is_reported(tmp_path, name, values, reason):
    model = _static_model("values", constant_values=np.where(values, 0.0, MIN)[None, None])
    src, out, report = _fuse_small(tmp_path, model, name)
    kept = [m for m in report.near_misses if m.get("pattern", "").endswith(KEPT)]
    assert len(kept) == 1 and reason in kept[0]["reason"], report.near_misses
    ((a, inputs),) = _attentions(out)
    assert a.get("causal", 0) == 0 and inputs["attn_bias"]
    assert otfuse.diff(src, out).ok


def test_a_constant_bias_with_a_weak_fill_stays_a_bias_and_is_reported(tmp_path):
    model = _static_model("values", constant_values=np.where(_band(), 0.0, -100.0)[None, None])
    src, out, report = _fuse_small(tmp_path, model, "weak")
    kept = [m for m in report.near_misses if m.get("pattern", "").endswith(KEPT)]
    assert len(kept) == 1 and "fills -100, too weak to mask a key" in kept[0]["reason"], report.near_misses
    ((a, inputs),) = _attentions(out)
    assert a.get("causal", 0) == 0 and inputs["attn_bias"]


def test_a_learned_constant_bias_is_kept_without_a_report(tmp_path):
    """A constant of many values is a bias the model states (relative positions), no lost mask."""
    values = np.random.default_rng(0).standard_normal((1, HEADS, S, S))
    src, out, report = _fuse_small(tmp_path, _static_model("values", constant_values=values), "learned")
    assert not report.near_misses, report.near_misses
    ((a, inputs),) = _attentions(out)
    assert a.get("causal", 0) == 0 and inputs["attn_bias"]


def test_a_constant_mask_proven_at_one_size_is_not_applied_at_others(tmp_path):
    """One mask row [1, 1, 1, 10] added to every query row: at its own size (one query, the last
    position) it is the band, but the scores have 10 query rows, which it does not mask causally."""
    row = _band()[-1:][None, None]
    model = _static_model("values", constant_values=np.where(row, 0.0, MIN))
    src, out, report = _fuse_small(tmp_path, model, "one_row")
    kept = [m for m in report.near_misses if m.get("pattern", "").endswith(KEPT)]
    assert len(kept) == 1 and "proven at its one size 1 x 10 (Sq x Skv), and the scores' query / key lengths " \
        "are 10 x 10" in kept[0]["reason"], report.near_misses
    ((a, inputs),) = _attentions(out)
    assert a.get("causal", 0) == 0 and inputs["attn_bias"]
    assert otfuse.diff(src, out).ok


def test_a_constant_part_that_differs_between_heads_stays_a_bias(tmp_path):
    """The op applies one causal band and window to every head: a [1, 4, S, S] mask whose head 1
    keeps a window of 4 is no such mask, though each head alone is a band."""
    heads = np.stack([_band(4 if h == 1 else W) for h in range(HEADS)])[None]
    src, out, report = _fuse_small(tmp_path, _static_model("values", constant_values=np.where(heads, 0.0, MIN)),
                                   "per_head")
    kept = [m for m in report.near_misses if m.get("pattern", "").endswith(KEPT)]
    assert len(kept) == 1 and "differs between batch rows or heads" in kept[0]["reason"], report.near_misses
    ((a, inputs),) = _attentions(out)
    assert a.get("causal", 0) == 0 and inputs["attn_bias"]
    assert otfuse.diff(src, out).ok
