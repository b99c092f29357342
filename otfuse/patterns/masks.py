"""Recognise the attention mask an exporter built in the graph, so ``Attention`` can apply it as
``causal`` / ``window`` / ``key_padding_mask`` (no S x S tensor, masked tiles skipped) instead of
adding a materialised ``[B, 1, Sq, Skv]`` bias.

Hugging Face's exported mask is ``Where(AND of conditions, 0, min)``. The conditions are read from
the structure: ``LessOrEqual(kv_idx, q_idx)`` (causal), ``Greater(kv_idx, Sub(q_idx, W))`` (sliding
window W), ``GatherND(Cast(attention_mask, bool), ...)`` (padding), constant ``True``; anything else
and the mask stays a bias. The claim is then **checked by running the mask's own subgraph** in
ONNX Runtime at several batch/sequence/cache sizes and paddings (including sequences longer than
the window) against ``causal and window and padding`` with bottom-right alignment: what the
structure suggests must be what the graph computes, or nothing is claimed.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import attr

BOOL = onnx.TensorProto.BOOL
# A "minimum" at least this negative masks a key for good in float32 and float16 alike.
_MASKED_BELOW = -1e4


@dataclass(frozen=True)
class MaskClaim:
    causal: bool
    window: int  # 0 = none
    key_padding: str | None  # the graph input holding the [B, Skv] padding mask
    empty_rows: str  # "uniform" for a finite minimum (HF), "zero" for -inf


def classify_mask(graph: GraphIndex, mask: str, memo: dict) -> MaskClaim | str:
    """A verified claim for the float ``mask``, or why none can be made (memoised per mask)."""
    key = ("mask", mask)
    if key not in memo:
        try:
            memo[key] = _classify(graph, mask)
        except _NoClaim as refusal:
            memo[key] = str(refusal)
    return memo[key]


class _NoClaim(Exception):
    pass


def _classify(graph: GraphIndex, mask: str) -> MaskClaim:
    where = graph.producer.get(mask)
    if where is None or where.op_type != "Where":
        raise _NoClaim("the mask is not Where(condition, 0, minimum)")
    keep = graph.scalar_value(where.input[1])
    fill = graph.scalar_value(where.input[2])
    if keep != 0.0 or fill is None or fill > _MASKED_BELOW:
        raise _NoClaim(f"the mask adds {keep} / {fill}, not 0 / a large negative minimum")
    return _claim(graph, where.input[0], "uniform" if np.isfinite(fill) else "zero")


def classify_bool_mask(graph: GraphIndex, condition: str, memo: dict) -> MaskClaim | str:
    """As ``classify_mask`` for a bool mask (True = attend; masked keys count as -inf)."""
    key = ("bool_mask", condition)
    if key not in memo:
        try:
            memo[key] = _claim(graph, condition, "zero")
        except _NoClaim as refusal:
            memo[key] = str(refusal)
    return memo[key]


def _claim(graph: GraphIndex, condition: str, empty_rows: str) -> MaskClaim:
    causal, window, padding = False, 0, None
    for leaf in _and_leaves(graph, condition):
        kind, value = _leaf_kind(graph, leaf)
        if kind in ("true", "versus_constant"):
            continue
        if kind == "causal":
            causal = True
        elif kind == "window":
            window = value
        elif kind == "padding":
            padding = value
        else:
            raise _NoClaim(f"the mask has a condition otfuse does not know ({value})")
    if window and not causal:
        raise _NoClaim("a sliding window without the causal condition")
    if not causal and padding is None:
        raise _NoClaim("the mask is neither causal nor padding")
    claim = MaskClaim(causal, window, padding, empty_rows)
    _verify_by_running(graph, condition, claim)
    return claim


def _and_leaves(graph: GraphIndex, value: str) -> list[str]:
    """The conditions AND-ed together; broadcasts (Expand) of a condition do not change it."""
    node = graph.producer.get(value)
    if node is not None and node.op_type == "And":
        return _and_leaves(graph, node.input[0]) + _and_leaves(graph, node.input[1])
    if node is not None and node.op_type == "Expand":
        return _and_leaves(graph, node.input[0])
    return [value]


def _leaf_kind(graph: GraphIndex, value: str) -> tuple[str, object]:
    if graph.is_constant(value):
        const = graph.constant_value(value)
        if const.dtype == np.bool_ and const.size and const.all():
            return "true", None
        return "unknown", "a constant condition"
    node = graph.producer.get(value)
    if node is None:
        return "unknown", f"graph input {value!r}"
    if node.op_type in ("LessOrEqual", "GreaterOrEqual"):
        if any(graph.is_constant(name) for name in node.input):
            return "versus_constant", None  # e.g. BERT's q_idx >= 0: true, if running agrees
        return "causal", None  # which side is the query is settled by running the graph
    if node.op_type == "Greater":
        sub = graph.producer.get(node.input[1])
        if sub is not None and sub.op_type == "Sub" and graph.scalar_value(sub.input[1]) is not None:
            window = graph.scalar_value(sub.input[1])
            if window == int(window) and window > 0:
                return "window", int(window)
    if node.op_type == "GatherND":
        cast = graph.producer.get(node.input[0])
        if cast is not None and cast.op_type == "Cast" and attr(cast, "to") == BOOL and \
                cast.input[0] in graph.graph_inputs and graph.rank(cast.input[0]) == 2:
            return "padding", cast.input[0]
    return "unknown", f"{node.op_type} {node.name!r}"


# -- verification -------------------------------------------------------------------------------
def _subgraph(graph: GraphIndex, output: str) -> onnx.ModelProto:
    """The nodes computing ``output`` as a model of their own (only small constants allowed)."""
    needed, order, stack = set(), [], [output]
    while stack:
        value = stack.pop()
        node = graph.producer.get(value)
        if node is None or id(node) in needed:
            continue
        needed.add(id(node))
        stack.extend(name for name in node.input if name)
    order = [node for node in graph.graph.node if id(node) in needed]
    reads = {name for node in order for name in node.input if name}
    inputs = [vi for vi in graph.graph.input if vi.name in reads and vi.name not in graph.initializers]
    initializers = []
    for name in sorted(reads & set(graph.initializers)):
        if (graph.constant_size(name) or 0) > 4096:
            raise _NoClaim("the mask is computed from large weights")
        initializers.append(onnx.numpy_helper.from_array(graph.constant_value(name), name))
    out = onnx.helper.make_tensor_value_info(output, BOOL, None)
    model = onnx.helper.make_model(onnx.helper.make_graph(order, "mask", inputs, [out], initializers),
                                   opset_imports=[e for e in graph.model.opset_import if e.domain in ("", "ai.onnx")])
    model.ir_version = graph.model.ir_version
    return model


def _configurations(claim: MaskClaim, has_past: bool):
    seqs = [1, 5, 12]
    if claim.window:
        seqs += [claim.window + 3, 2 * claim.window + 1] if claim.window <= 1024 else [claim.window + 3]
    pasts = [0, 3] if has_past else [0]
    for seq in seqs:
        for past in pasts:
            yield 2, seq, past


def _padding_patterns(batch: int, total: int, rng) -> list[np.ndarray]:
    ones = np.ones((batch, total), dtype=np.int64)
    left = ones.copy()
    left[0, : total // 2] = 0
    random = (rng.random((batch, total)) > 0.3).astype(np.int64)
    return [ones, left, random]


def _verify_by_running(graph: GraphIndex, condition: str, claim: MaskClaim) -> None:
    import onnxruntime as ort

    from otfuse.feeds import make_feeds

    model = _subgraph(graph, condition)
    names = {vi.name for vi in model.graph.input}
    has_past = any("past" in name or "cache" in name or "key_values" in name for name in names)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 - any failure means: no claim
        raise _NoClaim(f"the mask subgraph does not run on its own ({type(exc).__name__})") from None
    rng = np.random.default_rng(0)
    for batch, seq, past in _configurations(claim, has_past):
        feeds = make_feeds(model, {"batch": batch, "seq": seq, "past": past})
        total = past + seq
        for padding in _padding_patterns(batch, total, rng):
            if claim.key_padding:
                feeds[claim.key_padding] = padding.astype(feeds[claim.key_padding].dtype)
            try:
                (got,) = session.run(None, feeds)
            except Exception as exc:  # noqa: BLE001
                raise _NoClaim(f"the mask subgraph failed at seq {seq}, past {past} ({type(exc).__name__})") from None
            expected = _expected(claim, batch, seq, past, padding)
            if got.ndim != 4 or got.shape[-2:] != (seq, total) or \
                    not np.array_equal(np.broadcast_to(got, expected.shape), expected):
                raise _NoClaim(f"running the mask (seq {seq}, past {past}) contradicts "
                               f"causal={claim.causal}, window={claim.window}, padding={claim.key_padding}")


def _expected(claim: MaskClaim, batch: int, seq: int, past: int, padding: np.ndarray) -> np.ndarray:
    t = past + np.arange(seq)[:, None]  # query positions, bottom-right aligned
    j = np.arange(past + seq)[None, :]
    visible = np.ones((seq, past + seq), dtype=bool)
    if claim.causal:
        visible &= j <= t
    if claim.window:
        visible &= j > t - claim.window
    visible = np.broadcast_to(visible, (batch, 1, seq, past + seq)).copy()
    if claim.key_padding:
        visible &= padding[:, None, None, :] != 0
    return visible
