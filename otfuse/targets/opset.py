"""Raising a model's default-domain opset for the ``onnx`` target, only where that keeps every other
op's meaning.

Between the model's opset and the target's, each op the graph uses either keeps its schema, or
changed only in ways that leave what it computes for this graph alone: types added, or an optional
attribute / input whose default is the old behaviour (``COMPATIBLE``, checked against the ONNX
changelog by hand), or changed in a way one exact rewrite carries over (``ADAPTED``: the Reduce
ops' ``axes`` attribute became an input in opset 18). Any other change, or an op ONNX does not know
in the default domain (ORT's own), refuses the raise, naming the op and the version.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.defs
from onnx import numpy_helper

# The highest version the emitters ask for (RMSNormalization, RotaryEmbedding, Attention: 23).
TARGET_OPSET = 23

_BF16_22 = ("Cos", "Sin", "Tan", "Dropout", "Elu", "Selu", "Round", "Softplus", "Softsign", "HardSigmoid",
            "HardSwish", "Mish", "Conv", "ConvTranspose", "AveragePool", "MaxPool", "GlobalAveragePool",
            "InstanceNormalization", "Acos", "Asin", "Atan", "Cosh", "Sinh", "Asinh", "Acosh", "Atanh")
_TYPES_19_TO_24 = ("Cast", "CastLike", "Constant", "Identity", "Reshape", "Shape", "Size", "Pad")

# op -> versions whose change only added types, or an optional attribute/input defaulting to the old
# behaviour (Shape-15 start/end, Pad-18 axes, Pad-19 wrap mode, Split-18 num_outputs, Cast-19
# saturate and Cast-24 round_mode for float8 targets only, Scatter*-16/18 reduction modes,
# Resize-18 antialias/axes/keep_aspect_ratio_policy and Resize-19 half_pixel_symmetric).
COMPATIBLE: dict[str, set[int]] = {
    **{op: {19, 21, 23, 24} for op in _TYPES_19_TO_24},
    **{op: {22} for op in _BF16_22},
    "Shape": {15, 19, 21, 23, 24}, "Pad": {18, 19, 21, 23, 24}, "Split": {18},
    "ConstantOfShape": {20, 21, 23, 24}, "Flatten": {21, 23, 24}, "Squeeze": {21, 23, 24},
    "Unsqueeze": {21, 23, 24}, "Transpose": {21, 23, 24}, "Equal": {19}, "Greater": set(), "Less": set(),
    "GreaterOrEqual": {16}, "LessOrEqual": {16}, "Where": {16}, "Pow": {15}, "IsNaN": {20}, "IsInf": {20},
    "ReduceMax": {20}, "ReduceMin": {20}, "SplitToSequence": {24}, "If": {19, 21, 23, 24},
    "Loop": {19, 21, 23, 24}, "Scan": {19, 21, 23, 24}, "Identity": {14, 16, 19, 21, 23, 24},
    # reduction modes / resize modes added, the default the old behaviour
    "ScatterND": {16, 18}, "ScatterElements": {16, 18}, "Resize": {18, 19},
}
_REDUCE_18 = ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
              "ReduceLogSumExp", "ReduceSumSquare")
ADAPTED: dict[str, set[int]] = {op: {18} for op in _REDUCE_18}


class OpsetTooLow(Exception):
    """An emitter needs an opset the model cannot be raised to."""


def model_opset(model: onnx.ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)


def _nodes(graph: onnx.GraphProto):
    for node in graph.node:
        yield node
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                yield from _nodes(sub)


def raise_refusal(model: onnx.ModelProto, to: int) -> str:
    """"" when the raise to ``to`` keeps every op's meaning, else why not."""
    old = model_opset(model)
    for op in sorted({n.op_type for n in _nodes(model.graph) if n.domain in ("", "ai.onnx")}):
        try:
            start = onnx.defs.get_schema(op, old).since_version
        except onnx.defs.SchemaError:
            return f"{op} is not an ONNX op of opset {old} (ONNX Runtime's own op in the default domain)"
        versions = {onnx.defs.get_schema(op, v).since_version for v in range(old + 1, to + 1)} - {start}
        unknown = sorted(v for v in versions if v not in COMPATIBLE.get(op, set()) | ADAPTED.get(op, set()))
        if unknown:
            return f"{op} changed in opset {unknown[0]} in a way otfuse does not carry over"
    return ""


def reachable(model: onnx.ModelProto, target: str) -> tuple[int, str]:
    """(the highest default-domain opset the emitters may use, why not higher)."""
    old = model_opset(model)
    if target != "onnx" or old >= TARGET_OPSET:
        return max(old, TARGET_OPSET) if target != "onnx" else old, ""
    why = raise_refusal(model, TARGET_OPSET)
    if not why:
        return TARGET_OPSET, ""
    lower = 17 if old < 17 and not raise_refusal(model, 17) else old
    return lower, f"the model's opset {old} cannot be raised to {TARGET_OPSET}: {why}"


def raise_to(model: onnx.ModelProto, needed: int) -> None:
    """Raise the default-domain opset to ``needed`` (already checked by ``reachable``)."""
    old = model_opset(model)
    if needed <= old:
        return
    _adapt(model.graph, old, needed)
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = needed
    model.ir_version = max(model.ir_version, onnx.helper.find_min_ir_version_for(
        [onnx.helper.make_opsetid("", needed)], ignore_unknown=True))


def _adapt(graph: onnx.GraphProto, old: int, new: int) -> None:
    if not (old < 18 <= new):
        return
    for node in _nodes(graph):
        if node.op_type in _REDUCE_18 and node.domain in ("", "ai.onnx"):
            axes = next((a for a in node.attribute if a.name == "axes"), None)
            if axes is None:
                continue
            name = f"{node.name or node.output[0]}_axes"
            graph.initializer.append(numpy_helper.from_array(np.asarray(list(axes.ints), np.int64), name))
            node.attribute.remove(axes)
            del node.input[1:]
            node.input.append(name)
