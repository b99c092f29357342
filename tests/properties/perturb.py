"""Semantic mutations for the random graphs: one small constant, one attribute or one graph
input's dim changed, so the graph still runs but may no longer compute what the pattern's fused op
does (an exponent of 2 becomes 3, a Softmax axis moves, a head dim broadcasts). otfuse must then
refuse, or fuse something that still computes the same outputs.

A change is kept only when the model stays valid: strict shape inference accepts it, and ONNX
Runtime runs it on the case's inputs and agrees with ONNX's reference evaluator."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from graphs import retyped

_SMALL = 8  # constants up to this many elements are shapes, axes, bounds and scalars, not weights
_ATTRIBUTES = {"axis", "axes", "perm", "keepdims", "epsilon", "transB", "transA", "alpha", "beta", "split"}


def _constant(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    small = [t for t in model.graph.initializer if 0 < int(np.prod(t.dims)) <= _SMALL]
    if not small:
        return None
    tensor = small[int(rng.integers(len(small)))]
    values = numpy_helper.to_array(tensor).copy()
    flat = values.reshape(-1)
    i = int(rng.integers(flat.size))
    before = flat[i].item()
    if values.dtype.kind == "f":
        flat[i] = flat[i] * rng.choice([-1.0, 0.5, 2.0, 1.001]) if flat[i] else rng.choice([1.0, -1.0])
    else:
        flat[i] = int(rng.choice([max(before - 1, -(2**62)), min(before + 1, 2**62), 0, -1]))
    tensor.CopyFrom(numpy_helper.from_array(values, tensor.name))
    return f"constant {tensor.name}[{i}] {before} -> {flat[i].item()}"


def _attribute(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    found = [(node, attr) for node in model.graph.node for attr in node.attribute if attr.name in _ATTRIBUTES]
    if not found:
        return None
    node, attr = found[int(rng.integers(len(found)))]
    before = helper.get_attribute_value(attr)
    if attr.type == onnx.AttributeProto.INT:
        attr.i = (1 - attr.i) if attr.name in ("keepdims", "transA", "transB") else int(rng.integers(-4, 4))
    elif attr.type == onnx.AttributeProto.FLOAT:
        attr.f = float(attr.f * rng.choice([10.0, 0.1, -1.0]))
    elif attr.type == onnx.AttributeProto.INTS and attr.ints:
        if attr.name == "perm":
            attr.ints[:] = [int(v) for v in rng.permutation(list(attr.ints))]
        else:
            attr.ints[int(rng.integers(len(attr.ints)))] = int(rng.integers(-4, 4))
    return f"{node.op_type} {node.name}.{attr.name} {before} -> {helper.get_attribute_value(attr)}"


def _broadcast_input(model: onnx.ModelProto, rng: np.random.Generator) -> str | None:
    weights = {t.name for t in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in weights and len(v.type.tensor_type.shape.dim) >= 2]
    if not inputs:
        return None
    value = inputs[int(rng.integers(len(inputs)))]
    dims = value.type.tensor_type.shape.dim
    axis = int(rng.integers(len(dims)))
    before = dims[axis].dim_param or dims[axis].dim_value
    dims[axis].Clear()
    dims[axis].dim_value = 1
    return f"input {value.name} dim {axis} {before} -> 1"


PERTURBATIONS: dict[str, Callable] = {"constant": _constant, "attribute": _attribute, "broadcast": _broadcast_input}


def perturb(model: onnx.ModelProto, rng: np.random.Generator, feeds_for: Callable, tries: int = 6) -> str | None:
    """Apply one valid perturbation to ``model`` in place (``feeds_for(model)`` makes its inputs);
    what changed, or None when ``tries`` attempts all made an invalid model."""
    for _ in range(tries):
        candidate = onnx.ModelProto()
        candidate.CopyFrom(model)
        kind = list(PERTURBATIONS)[int(rng.integers(len(PERTURBATIONS)))]
        change = PERTURBATIONS[kind](candidate, rng)
        if change is not None and _runs(candidate, feeds_for):
            model.CopyFrom(candidate)
            return change
    return None


def _runs(model: onnx.ModelProto, feeds_for: Callable) -> bool:
    try:
        checked = retyped(model)
        onnx.checker.check_model(checked, full_check=True)
        options = ort.SessionOptions()
        options.log_severity_level = 4
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as otfuse diff runs it
        session = ort.InferenceSession(checked.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feeds = feeds_for(checked)
        got = session.run(None, feeds)
        # ONNX's reference evaluator as the judge of what the graph means: ORT concatenates an
        # empty slice of the wrong shape into uninitialised lanes where the spec refuses it.
        want = ReferenceEvaluator(checked).run(None, feeds)
    except Exception:  # noqa: BLE001 - any rejection means: not a valid mutation
        return False
    return all(a.shape == b.shape and np.allclose(a, b, rtol=1e-3, atol=1e-3, equal_nan=True)
               for a, b in zip(got, want))
