"""The masks exporters build in the graph are claimed as causal / window / key padding only when
running the mask's own subgraph agrees; any other mask is kept as an additive bias (still exact)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from fixtures import fixture_path
from fusions.attention.graphs import MASK_FILL, MaskNodes, attention_model, with_computed_mask
from onnx import TensorProto, helper, numpy_helper

import otfuse
from otfuse.fusions.attention.masks import classify_mask
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.graph import GraphIndex

FLOAT_TYPES = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16)


def _attention_attrs(path):
    """The first attention node's attributes, and its (attn_bias, key_padding_mask) inputs."""
    node = next(n for n in onnx.load(path).graph.node if n.op_type in ("Attention", "RopeAttention"))
    first_mask_input = 5 if node.op_type == "RopeAttention" else 3  # after q, k, v (, cos, sin)
    masks = list(node.input[first_mask_input:first_mask_input + 2]) + ["", ""]
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}, masks[:2]


def _fuse_and_diff(tmp_path, model: onnx.ModelProto, name: str):
    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src)
    otfuse.fuse(src, out)
    result = otfuse.diff(src, out, dims={"batch": 2, "seq": 9})
    assert result.ok, [row.to_dict() for row in result.outputs]
    return out


def _float_wheres(path) -> list[str]:
    """Where nodes computing a float tensor (a mask); TorchScript's int64 shape Wheres do not count."""
    model = onnx.load(path)
    graph = GraphIndex(model)
    return [n.name for n in model.graph.node if n.op_type == "Where" and graph.elem_type(n.output[0]) in FLOAT_TYPES
            and not any(graph.producer.get(i) is not None and graph.producer[i].op_type == "IsNaN" for i in n.input)]


@pytest.mark.parametrize("name,causal,window,empty_rows", [
    ("llama", 1, 0, "uniform"), ("mistral", 1, 4, "uniform"), ("qwen3", 1, 0, "uniform"), ("llama_kv", 1, 0, "uniform"),
    ("bloom", 1, 0, "uniform"), ("bert", 0, 0, "uniform"), ("gpt2", 1, 0, "uniform"),
    # TorchScript: Where(Expand(And(...)), 0, -inf) over ConstantOfShape(True), Cast-to-bool'd comparisons
    # and a Gather from the flattened mask; the fully masked rows are zeros (IsNaN guard), not uniform.
    ("llama_torchscript", 1, 0, "zero"), ("mistral_torchscript", 1, 4, "zero"),
])
def test_exported_masks_become_causal_window_and_padding(tmp_path, name, causal, window, empty_rows):
    out = tmp_path / "f.onnx"
    otfuse.fuse(fixture_path(name), out)
    attrs, (bias, padding) = _attention_attrs(out)
    assert (attrs.get("causal", 0), attrs.get("window", 0)) == (causal, window)
    assert attrs["empty_rows"].decode() == empty_rows
    assert padding == "attention_mask"  # key_padding_mask: the model's own [B, Skv] input
    assert not bias  # Bloom's ALiBi too: alibi_slopes (tests/fusions/attention/test_alibi.py)
    assert not _float_wheres(out), "the S x S mask is gone"


@pytest.mark.parametrize("name", ["llama_torchscript", "mistral_torchscript", "gpt2"])
@pytest.mark.parametrize("seq", [1, 9])
def test_claimed_masks_match_with_left_padding(tmp_path, name, seq):
    out = tmp_path / f"{name}_fused.onnx"
    otfuse.fuse(fixture_path(name), out)
    pad = min(3, seq - 1)
    feeds = {
        "input_ids": np.random.default_rng(0).integers(0, 200, (2, seq)).astype(np.int64),
        "attention_mask": np.array([[0] * pad + [1] * (seq - pad), [1] * seq], dtype=np.int64),
        "position_ids": np.broadcast_to(np.arange(seq), (2, seq)).astype(np.int64).copy(),
    }
    result = otfuse.diff(fixture_path(name), out, inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]


def _mutated(name: str, mutate) -> onnx.ModelProto:
    model = onnx.load(fixture_path(name))
    mutate(model)
    return model


def test_anti_causal_mask_is_not_claimed_causal(tmp_path):
    def swap(model):
        node = next(n for n in model.graph.node if n.op_type == "LessOrEqual")
        node.input[0], node.input[1] = node.input[1], node.input[0]  # j >= i: not causal
    out = _fuse_and_diff(tmp_path, _mutated("llama", swap), "anti")
    attrs, (bias, padding) = _attention_attrs(out)
    assert attrs.get("causal", 0) == 0 and bias and not padding, "kept as an additive bias"


def test_another_window_size_is_claimed_as_that_size(tmp_path):
    def narrower(model):
        sub = next(n for n in model.graph.node if n.op_type == "Sub" and
                   any(i.name == n.input[1] for i in model.graph.initializer))
        init = next(i for i in model.graph.initializer if i.name == sub.input[1])
        value = onnx.numpy_helper.to_array(init)
        init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(2, dtype=value.dtype), init.name))
    out = _fuse_and_diff(tmp_path, _mutated("mistral", narrower), "window2")
    attrs, _ = _attention_attrs(out)
    assert attrs["window"] == 2


def test_mask_with_a_small_fill_is_kept_as_a_bias(tmp_path):
    def soft(model):
        where = next(n for n in model.graph.node if n.op_type == "Where" and
                     any(i.name == n.input[2] for i in model.graph.initializer))
        init = next(i for i in model.graph.initializer if i.name == where.input[2])
        init.CopyFrom(onnx.numpy_helper.from_array(np.asarray(-3.0, dtype=np.float32), init.name))
    out = _fuse_and_diff(tmp_path, _mutated("llama", soft), "soft")
    attrs, (bias, padding) = _attention_attrs(out)
    assert attrs.get("causal", 0) == 0 and bias and not padding


def test_claims_are_explained_when_refused():
    model = _mutated("llama", lambda m: None)
    graph = GraphIndex(model)
    where = next(n for n in model.graph.node if n.op_type == "Where")
    node = next(n for n in model.graph.node if n.op_type == "LessOrEqual")
    node.input[0], node.input[1] = node.input[1], node.input[0]
    graph = GraphIndex(model)
    with pytest.raises(Refuse, match="contradicts"):
        classify_mask(graph, where.output[0], {}, ())


def test_torchscript_window_wider_than_its_constant_is_claimed_as_wide_as_it_is(tmp_path):
    """Greater -> GreaterOrEqual: the band is W + 1 wide while the constant says W; the non-strict
    bound is read as W + 1 (and proven by running), never as W."""
    def wider(model):
        node = next(n for n in model.graph.node if n.op_type == "Greater")
        node.op_type = "GreaterOrEqual"
    out = _fuse_and_diff(tmp_path, _mutated("mistral_torchscript", wider), "wider")
    attrs, (bias, padding) = _attention_attrs(out)
    assert (attrs.get("causal", 0), attrs.get("window", 0), bias) == (1, 5, "")


def test_torchscript_padding_read_from_the_wrong_row_is_not_claimed(tmp_path):
    """TorchScript gathers the padding from the flattened mask at b * Skv + j: reading b * Skv + j - 1
    (a shifted key) must not pass for key padding."""
    def shifted(model):
        graph = GraphIndex(model)
        gather = next(n for n in model.graph.node if n.op_type == "Gather" and
                      getattr(graph.producer.get(n.input[0]), "op_type", "") == "Flatten")
        model.graph.initializer.append(numpy_helper.from_array(np.array(1, dtype=np.int64), "one_back"))
        model.graph.node.insert(list(model.graph.node).index(gather),
                                helper.make_node("Sub", [gather.input[1], "one_back"], ["shifted_index"]))
        gather.input[1] = "shifted_index"
    out = _fuse_and_diff(tmp_path, _mutated("llama_torchscript", shifted), "shifted")
    attrs, (bias, padding) = _attention_attrs(out)
    assert attrs.get("causal", 0) == 0 and bias and not padding


# -- hand-built masks: SDPA on graph inputs q, k, v; the mask computed from q's shape ---------------
MIN = MASK_FILL


def _model_with_mask(build) -> onnx.ModelProto:
    """attention_model's SDPA with its ``mask`` input replaced by nodes: ``build(node, const, seq)``
    returns the float [.., S, S] mask from the 1-D [S] sequence length."""
    recorded = MaskNodes()
    seq = recorded.node("Shape", ["q"], start=2, end=3)
    return with_computed_mask(attention_model(), recorded, build(recorded.node, recorded.const, seq))


def _where(node, const, visible):
    """Where(visible [S, S], 0, min) as [1, 1, S, S]."""
    return node("Where", [node("Unsqueeze", [visible, const([0, 1])]), const(0.0, np.float32), const(MIN, np.float32)])


def _trilu_mask(upper: int):
    def build(node, const, seq):
        square = node("Concat", [seq, seq], axis=0)
        ones = node("ConstantOfShape", [square], value=numpy_helper.from_array(np.array([1.0], dtype=np.float32)))
        return _where(node, const, node("Cast", [node("Trilu", [ones], upper=upper)], to=TensorProto.BOOL))
    return build


def _tril_equal_mask(upper: int, compared: float, rank: int = 2):
    """torch's SDPA ``is_causal`` as the dynamo exporter writes it: ``Where(Trilu(Expand(1, [S, S]))
    == 0, min, 0)``, a [S, S] mask the scores broadcast (``rank`` 4: unsqueezed to [1, 1, S, S])."""
    def build(node, const, seq):
        square = node("Concat", [seq, seq], axis=0)
        ones = node("Expand", [const(1.0, np.float32), square])
        masked = node("Equal", [node("Trilu", [ones], upper=upper), const(compared, np.float32)])
        mask = node("Where", [masked, const(MIN, np.float32), const(0.0, np.float32)])
        return node("Unsqueeze", [mask, const([0, 1])]) if rank == 4 else mask
    return build


def _cumsum_mask(shift: int):
    """Positions by CumSum(ones) - 1; the keys' shifted by ``shift`` (a diagonal off by that)."""
    def build(node, const, seq):
        ones = node("ConstantOfShape", [seq], value=numpy_helper.from_array(np.array([1], dtype=np.int64)))
        position = node("Sub", [node("CumSum", [ones, const(0)]), const(1)])
        key = node("Add", [position, const(shift)]) if shift else position
        visible = node("LessOrEqual", [node("Unsqueeze", [key, const([0])]), node("Unsqueeze", [position, const([1])])])
        return _where(node, const, visible)
    return build


def _buffer_mask(buffer: np.ndarray):
    """A precomputed [64, 64] bool buffer sliced to [S, S] (as models that register one do)."""
    def build(node, const, seq):
        return _where(node, const, node("Slice", [const(buffer, bool), const([0, 0]), node("Concat", [seq, seq], axis=0)]))
    return build


def _masked_where_mask(build_condition, fill_inner=MIN):
    """Where(j > i, min, Where(True, 0, min')): the condition names the masked keys, chained."""
    def build(node, const, seq):
        idx = node("Range", [const(0), node("Squeeze", [seq, const([0])]), const(1)])
        masked = build_condition(node, const, idx)
        inner = node("Where", [const(True, bool), const(0.0, np.float32), const(fill_inner, np.float32)])
        return node("Unsqueeze", [node("Where", [masked, const(MIN, np.float32), inner]), const([0, 1])])
    return build


def _future_keys(node, const, idx):
    return node("Greater", [node("Unsqueeze", [idx, const([0])]), node("Unsqueeze", [idx, const([1])])])


def _band_as_difference(node, const, idx):
    """Causal, and q - kv < 20: a 20-key window spelled as a difference against the constant."""
    q, kv = node("Unsqueeze", [idx, const([1])]), node("Unsqueeze", [idx, const([0])])
    future = node("Greater", [kv, q])
    too_far = node("Not", [node("Less", [node("Sub", [q, kv]), const(20)])])
    return node("Or", [future, too_far])


def _keys_up_to_a_clamp(node, const, idx):
    """j > min(i, 20): causal until the 21st query, which then sees only 21 keys."""
    q, kv = node("Unsqueeze", [idx, const([1])]), node("Unsqueeze", [idx, const([0])])
    return node("Greater", [kv, node("Min", [q, const(20)])])


def _claimed(tmp_path, build, name):
    out = _fuse_and_diff(tmp_path, _model_with_mask(build), name)
    attrs, (bias, padding) = _attention_attrs(out)
    return attrs.get("causal", 0), attrs.get("window", 0), bool(bias), padding


@pytest.mark.parametrize("name,build", [
    ("trilu_lower", _trilu_mask(upper=0)),
    ("cumsum", _cumsum_mask(shift=0)),
    ("tril_buffer", _buffer_mask(np.tril(np.ones((64, 64), dtype=bool)))),
    ("masked_where_chain", _masked_where_mask(_future_keys)),
    ("tril_equal_zero_2d", _tril_equal_mask(upper=0, compared=0.0)),
    ("tril_equal_zero_4d", _tril_equal_mask(upper=0, compared=0.0, rank=4)),
])
def test_other_causal_spellings_are_claimed(tmp_path, name, build):
    assert _claimed(tmp_path, build, name) == (1, 0, False, "")


def test_a_window_spelled_as_a_difference_is_claimed_as_that_window(tmp_path):
    """q - kv < 20 reads as a window of 20, and holds when run (at 20 + 3 and 2 * 20 + 1 keys too)."""
    assert _claimed(tmp_path, _masked_where_mask(_band_as_difference), "band_as_difference") == (1, 20, False, "")


@pytest.mark.parametrize("name,build", [
    ("trilu_upper", _trilu_mask(upper=1)),  # keys at and after the query: not causal
    ("cumsum_shifted", _cumsum_mask(shift=1)),  # j + 1 <= i: the diagonal masked
    ("band_buffer", _buffer_mask(np.tril(np.ones((64, 64), dtype=bool)) & np.triu(np.ones((64, 64), dtype=bool), -3))),
    ("chain_other_fill", _masked_where_mask(_future_keys, fill_inner=np.float32(-1e9))),
    # Seen only past 20 keys: the check runs at 20 + 3 and 2 * 20 + 1 keys too, so this is no "causal".
    ("clamped_query", _masked_where_mask(_keys_up_to_a_clamp)),
    ("tril_equal_one", _tril_equal_mask(upper=0, compared=1.0)),  # masks the visible keys instead
    ("triu_equal_zero", _tril_equal_mask(upper=1, compared=0.0)),  # anti-causal
])
def test_masks_that_are_not_what_they_seem_stay_a_bias(tmp_path, name, build):
    causal, window, bias, padding = _claimed(tmp_path, build, name)
    assert (causal, window, bias, padding) == (0, 0, True, "")


def test_padding_read_as_equal_to_one_is_not_claimed(tmp_path):
    """key_padding_mask attends wherever the mask is non-zero; a graph testing mask == 1 differs
    for other values (the check feeds 3s too), so it stays a bias."""
    def equal_one(model):
        cast = next(n for n in model.graph.node if n.op_type == "Cast" and n.input[0] == "attention_mask")
        model.graph.initializer.append(numpy_helper.from_array(np.array(1, dtype=np.int64), "one"))
        cast.op_type = "Equal"
        cast.input.append("one")
        del cast.attribute[:]
    out = _fuse_and_diff(tmp_path, _mutated("llama", equal_one), "equal_one")
    attrs, (bias, padding) = _attention_attrs(out)
    assert attrs.get("causal", 0) == 0 and bias and not padding


def test_a_window_too_long_to_check_is_not_claimed():
    """A window (or any offset) over 8192 would need an [B, 1, S, S] run too large to make here."""
    model = _mutated("mistral", lambda m: None)
    sub = next(n for n in model.graph.node if n.op_type == "Sub" and
               any(i.name == n.input[1] for i in model.graph.initializer))
    init = next(i for i in model.graph.initializer if i.name == sub.input[1])
    init.CopyFrom(numpy_helper.from_array(np.asarray(10000, dtype=numpy_helper.to_array(init).dtype), init.name))
    graph = GraphIndex(model)
    where = next(n for n in model.graph.node if n.op_type == "Where" and graph.scalar_value(n.input[2]) is not None
                 and graph.scalar_value(n.input[2]) < -1e4)
    with pytest.raises(Refuse, match="10000.*8192"):
        classify_mask(graph, where.output[0], {}, ())


def test_a_computed_mask_kept_as_a_bias_is_reported(tmp_path):
    """A mask the graph computes but otfuse cannot prove is still fused exactly, as an additive
    bias the kernel reads in every tile: the report lists it as fused less than fully, with why."""
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(_model_with_mask(_trilu_mask(upper=1)), src)
    report = otfuse.fuse(src, out)
    (miss,) = [m for m in report.near_misses if "mask kept" in m["pattern"]]
    assert miss["fused_as"] in ("Attention", "RopeAttention") and "contradicts" in miss["reason"]


def test_a_mask_given_as_an_input_is_not_reported(tmp_path):
    """A [B, 1, S, S] mask that is a graph input is what the model states: nothing was lost."""
    model = attention_model()
    assert any(i.name == "mask" for i in model.graph.input)
    src, out = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, src)
    report = otfuse.fuse(src, out)
    assert report.fusions.get("Attention") == 1
    assert not [m for m in report.near_misses if "mask kept" in m["pattern"]], report.near_misses


# -- masks of no Where form, claimed from running them (opaque_masks.py) ----------------------------
def _trilu_of_min(k: int, keys_below: int | None = None, fill=MIN):
    """``Trilu(full([S, S], min), k, upper)``: min on and above diagonal k, 0 below, with no Where
    (the form of HF's causal mask before its in-place padding); ``keys_below``: times
    ``j < keys_below``, which makes the keys from there on visible to every query."""
    def build(node, const, seq):
        square = node("Concat", [seq, seq], axis=0)
        full = node("ConstantOfShape", [square], value=numpy_helper.from_array(np.array([fill], dtype=np.float32)))
        mask = node("Trilu", [full, const(k)], upper=1)
        if keys_below is not None:
            keys = node("Range", [const(0), node("Squeeze", [seq, const([0])]), const(1)])
            mask = node("Mul", [mask, node("Cast", [node("Less", [keys, const(keys_below)])], to=TensorProto.FLOAT)])
        return node("Unsqueeze", [mask, const([0, 1])])
    return build


def test_a_causal_mask_of_no_where_form_is_claimed_by_running_it(tmp_path):
    assert _claimed(tmp_path, _trilu_of_min(k=1), "trilu_of_min") == (1, 0, False, "")


@pytest.mark.parametrize("name,build", [
    ("diagonal_masked", _trilu_of_min(k=0)),
    # causal up to 20 keys: the run goes past the constant (23 and 41 keys) and sees key 20 visible
    ("causal_below_20_keys", _trilu_of_min(k=1, keys_below=20)),
    # -1e4 does not absorb the scores: a row that sees no key would be softmax(s), not uniform
    ("small_fill", _trilu_of_min(k=1, fill=np.float32(-1e4))),
])
def test_masks_of_no_where_form_that_are_not_causal_stay_a_bias(tmp_path, name, build):
    assert _claimed(tmp_path, build, name) == (0, 0, True, "")
    src = tmp_path / f"{name}.onnx"
    report = otfuse.fuse(src, tmp_path / "again.onnx")
    (miss,) = [m for m in report.near_misses if "mask kept" in m["pattern"]]
    assert "matches no causal / padding claim" in miss["reason"], miss


def test_a_padding_mask_scaled_by_the_mask_value_is_not_claimed(tmp_path):
    """``(1 - m) * min`` hides m == 0, but (1 - 3) * min overflows to +inf (the check feeds 3s):
    an additive padding mask of no Where form that is no "non-zero attends" padding stays a bias."""
    def scaled(model):
        graph = GraphIndex(model)
        where = next(n for n in model.graph.node
                     if n.op_type == "Where" and graph.elem_type(n.output[0]) in FLOAT_TYPES)
        model.graph.initializer.extend([numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
                                        numpy_helper.from_array(MIN, "min_f")])
        nodes = [helper.make_node("Cast", ["attention_mask"], ["m_f"], to=TensorProto.FLOAT),
                 helper.make_node("Sub", ["one_f", "m_f"], ["unmasked"]),
                 helper.make_node("Mul", ["unmasked", "min_f"], ["scaled_padding"]),
                 helper.make_node("Unsqueeze", ["scaled_padding", "axes_12"], ["scaled_padding_4d"])]
        model.graph.initializer.append(numpy_helper.from_array(np.array([1, 2], np.int64), "axes_12"))
        for user in [n for n in model.graph.node if where.output[0] in n.input]:
            user.input[:] = ["scaled_padding_4d" if i == where.output[0] else i for i in user.input]
        for node in reversed(nodes):
            model.graph.node.insert(0, node)
    out = _fuse_and_diff(tmp_path, _mutated("bert", scaled), "scaled_padding")
    attrs, (bias, padding) = _attention_attrs(out)
    assert bias and not padding
    report = otfuse.fuse(tmp_path / "scaled_padding.onnx", tmp_path / "again.onnx")
    # padding for 0 / 1 values, which the refusal says (opaque_masks.py's 0 / 1 run)
    assert report.near_misses and all("only where that mask holds 0 or 1" in m["reason"]
                                      for m in report.near_misses), report.near_misses


# -- optimum's masks: the causal-and-padding condition sliced to the keys, cond[..., :Shape(K)[2]] --
def _optimum(tmp_path, key: str) -> onnx.ModelProto:
    from models.test_export_matrix import COVERAGE, ENTRIES, MATRIX

    return onnx.load(COVERAGE.materialise(MATRIX / ENTRIES[key]["file"], tmp_path))


def _fuse_and_diff_padded(tmp_path, model: onnx.ModelProto, name: str):
    """Fused, and diffed with row 0 left-padded (query rows that see no key) and a hole and a 3 in
    row 1, after a cache of 3 where the model takes one."""
    from otfuse.run.feeds import make_feeds

    src, out = tmp_path / f"{name}.onnx", tmp_path / f"{name}_fused.onnx"
    onnx.save(model, src, save_as_external_data=True, location=f"{name}.bin")
    report = otfuse.fuse(src, out)
    feeds = make_feeds(src, {"batch": 2, "seq": 7, "past": 3})
    mask = feeds["attention_mask"]
    mask[0, :4], mask[1, 1], mask[1, -2] = 0, 0, 3
    result = otfuse.diff(src, out, inputs=feeds)
    assert result.ok, [row.to_dict() for row in result.outputs]
    return out, report


@pytest.mark.parametrize("key", ["llama/optimum_nopast", "llama/optimum_past", "gpt2/optimum_nopast",
                                 "qwen2/optimum_past"])
def test_optimum_masks_sliced_to_the_keys_become_causal_and_padding(tmp_path, key):
    out, report = _fuse_and_diff_padded(tmp_path, _optimum(tmp_path, key), key.replace("/", "_"))
    assert not [m for m in report.near_misses if "mask kept" in m["pattern"]], report.near_misses
    attrs, (bias, padding) = _attention_attrs(out)
    assert attrs["causal"] == 1 and padding == "attention_mask" and not bias
    assert not _float_wheres(out), "the S x S mask is gone"


def test_an_optimum_mask_sliced_by_the_head_size_stays_a_bias(tmp_path):
    """cond[..., :Shape(K)[3]]: the head size (16) where the key count belongs, the same below 16
    keys; the check runs past the sizes the mask reads off shapes (19 and 33 keys)."""
    model = _optimum(tmp_path, "llama/optimum_nopast")
    model.graph.initializer.append(numpy_helper.from_array(np.array(3, np.int64), "head_size_axis"))
    for layer in (0, 1):
        next(n for n in model.graph.node if n.name == f"/model/layers.{layer}/self_attn/Gather_12").input[1] = \
            "head_size_axis"
    out, report = _fuse_and_diff_padded(tmp_path, model, "head_size")
    kept = [m for m in report.near_misses if "mask kept" in m["pattern"]]
    assert len(kept) == 2 and all("seq 19" in m["reason"] for m in kept), report.near_misses
    attrs, (bias, padding) = _attention_attrs(out)
    assert bias and not padding
