"""Random small graphs around each pattern family: the family's own builders
(tests/fusions/<family>/graphs.py) with knobs drawn from a seeded generator (spelling, sizes,
the mutations the builders know), then rewritten by mutations any graph can take: float16 (with
or without float32 inputs and outputs), commutative inputs swapped, interior values read by extra
nodes or exposed as graph outputs, input dims static / unnamed / ``-1`` / renamed.

Each draw is a ``Case`` whose ``knobs`` say what was drawn, so a failure names its graph."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from float16 import to_float16
from fusions.attention.graphs import STATIC_BATCH, STATIC_SEQ, attention_model, keys_transposed_model
from fusions.fixture_variants import STATIC_DIMS, VARIANTS, variant
from fusions.norm.graphs import layer_norm_decomposed, rms_norm, single_norm_model
from fusions.rope.graphs import rope_model, rope_sections_model
from graphs import F32, GraphBuilder, retyped
from onnx import TensorProto, helper
from properties.perturb import perturb

COMMUTATIVE = {"Add", "Mul", "Sum", "Max", "Min", "And", "Or", "Equal"}


@dataclass
class Case:
    family: str
    only: list[str]  # the families otfuse runs (--only)
    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    knobs: dict

    def describe(self) -> str:
        return f"{self.family}: " + ", ".join(f"{k}={v}" for k, v in self.knobs.items())


class Draw:
    """The knobs of one case, drawn from ``rng`` and recorded as they are drawn."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.knobs = rng, {}

    def __call__(self, name: str, choices, p=None):
        value = choices[int(self.rng.choice(len(choices), p=p))]
        self.knobs[name] = value
        return value

    def flag(self, name: str, p: float) -> bool:
        value = bool(self.rng.random() < p)
        self.knobs[name] = value
        return value


# --- the families ------------------------------------------------------------------------------

def _norm(draw: Draw) -> tuple[onnx.ModelProto, list[str]]:
    kind = draw("kind", ["rms", "layer"])
    hidden = draw("hidden", [8, 16, 32, 48])
    residual = draw.flag("residual", 0.5)
    kwargs = dict(kind=kind, hidden=hidden, residual=residual, sum_used=residual and draw.flag("sum_used", 0.7),
                  square=draw("square", ["pow", "mul"]), eps=draw("eps", [1e-5, 1e-6, 1e-3]))
    if kind == "rms":
        kwargs.update(inverse=draw("inverse", ["reciprocal", "div_one", "div"]),
                      weight_first=draw.flag("weight_first", 0.5), axes_as_input=draw.flag("axes_as_input", 0.8),
                      gemma=draw.flag("gemma", 0.2), cast=draw.flag("cast", 0.3),
                      # mutations: the fused op must not claim these
                      keepdims=draw("keepdims", [1, 0], p=[0.9, 0.1]),
                      exponent=draw("exponent", [2.0, 3.0], p=[0.9, 0.1]),
                      weight_before_reduce=draw.flag("weight_before_reduce", 0.1))
        if kwargs["keepdims"] == 0:  # the reduced value still broadcasts against x: axes (0,)
            kwargs["axes"] = (0,)
    else:
        kwargs.update(bias=draw.flag("bias", 0.7), axes=draw("axes", [(-1,), (2,), (1,)], p=[0.6, 0.3, 0.1]))
    if kind == "rms" and kwargs["cast"] and draw.flag("float16_upcast", 0.5):
        return single_norm_model(dtype=np.float16, **kwargs), ["norm"]  # float16 x, norm in float32
    return single_norm_model(**kwargs), ["norm"]


def _rope(draw: Draw) -> tuple[onnx.ModelProto, list[str]]:
    head_dim = draw("head_dim", [8, 16, 32])
    if draw.flag("sections", 0.15):
        quarter = head_dim // 4
        sections = draw("section_widths", [(quarter, quarter, 2 * quarter), (2 * quarter, 2 * quarter)])
        return rope_sections_model(sections, head_dim, split=draw.flag("split", 0.5)), ["rope"]
    heads = draw("heads", [2, 4])
    mode = draw("mode", ["half", "interleaved"])
    kwargs = dict(heads=heads, kv_heads=draw("kv_heads", [k for k in (1, 2, 4) if heads % k == 0 and k <= heads]),
                  head_dim=head_dim, mode=mode, layout=draw("layout", ["BNSD", "BSND"]),
                  rotary_dim=draw("rotary_dim", [None, head_dim // 2], p=[0.7, 0.3]),
                  pair=draw.flag("pair", 0.6), k_positions_differ=draw.flag("k_positions_differ", 0.2),
                  cos_sin_swapped=draw.flag("cos_sin_swapped", 0.1))
    if mode == "half":
        kwargs.update(split=draw.flag("split", 0.3), neg_first_half=draw.flag("neg_first_half", 0.1))
    sliced = not kwargs.get("split") or kwargs["rotary_dim"]  # the rotation has a Slice to leak
    kwargs["extra_consumer"] = draw("extra_consumer", [None, "Neg", "Concat", "Slice" if sliced else "Neg"],
                                    p=[0.7, 0.1, 0.1, 0.1])
    return rope_model(**kwargs), ["rope"]


def _attention(draw: Draw) -> tuple[onnx.ModelProto, list[str]]:
    heads, head_dim = draw("heads", [2, 4]), draw("head_dim", [4, 8, 16])
    if draw.flag("keys_transposed", 0.25):
        keys = draw("keys", ["bsnd", "input", "cache"])
        return keys_transposed_model(heads=heads, head_dim=head_dim, keys=keys, q_layout=draw("q_layout", ["bsnd", "bnsd"]),
                                     v_layout=draw("v_layout", ["bsnd", "bnsd"])), ["attention"]
    softcap = draw("softcap", [None, 30.0, 5.0], p=[0.7, 0.2, 0.1])
    kwargs = dict(heads=heads, head_dim=head_dim,
                  kv_heads=draw("kv_heads", [k for k in (1, 2, 4) if heads % k == 0 and k <= heads]),
                  scale_at=draw("scale_at", ["both", "scores_div", "none"], p=[0.45, 0.45, 0.1]),
                  q_scale=draw("q_scale", [None, 0.5, 1.0], p=[0.8, 0.1, 0.1]),
                  kt=draw("kt", ["transpose", "reshape"], p=[0.8, 0.2]),
                  mask=draw.flag("mask", 0.7), nan_guard=draw.flag("nan_guard", 0.5),
                  out_transpose=draw.flag("out_transpose", 0.8), leak_probs=draw.flag("leak_probs", 0.15),
                  scale_input=draw.flag("scale_input", 0.1), softcap=softcap,
                  repeat=draw("repeat", ["expand", "tile", "tile_heads"], p=[0.6, 0.2, 0.2]),
                  # mutations
                  softmax_axis=draw("softmax_axis", [-1, -2, 3], p=[0.85, 0.1, 0.05]),
                  v_grouping=draw("v_grouping", ["hf", "interleave"], p=[0.85, 0.15]))
    if softcap is not None:
        kwargs.update(softcap_inner=draw("softcap_inner", [None, 20.0], p=[0.8, 0.2]),
                      softcap_spelling=draw("softcap_spelling", ["div", "mul"]),
                      softcap_after_mask=draw.flag("softcap_after_mask", 0.2))
    return attention_model(**kwargs), ["attention"]


def _norm_linear(draw: Draw) -> tuple[onnx.ModelProto, list[str]]:
    rng, hidden = draw.rng, draw("hidden", [8, 16, 32])
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", "seq", hidden])
    if draw.flag("residual", 0.5):
        x = b.node("Add", [x, b.input("r", F32, ["batch", "seq", hidden])], base="sum")
        if draw.flag("sum_out", 0.7):
            _output(b, x, "sum_out")
    n = rms_norm(b, x, hidden) if draw("kind", ["rms", "layer"]) == "rms" else layer_norm_decomposed(b, x, hidden)
    weight = lambda *shape: b.const((0.1 * rng.standard_normal(shape)).astype(np.float32), "w")  # noqa: E731
    for i in range(draw("projections", [1, 2, 3])):
        width = int(rng.choice([4, 8, 12, 24]))
        form = draw(f"proj{i}", ["matmul", "transposed", "bias", "gemm", "left", "dynamic"],
                    p=[0.4, 0.15, 0.2, 0.1, 0.1, 0.05])
        if form == "gemm":
            flat = b.node("Reshape", [n, b.const(np.array([-1, hidden], np.int64))])
            _output(b, b.node("Gemm", [flat, weight(width, hidden), weight(width)], transB=1), f"y{i}")
        elif form == "left":
            _output(b, b.node("MatMul", [weight(3, hidden), b.node("Transpose", [n], perm=[0, 2, 1])]), f"y{i}")
        else:
            w = {"transposed": lambda: b.node("Transpose", [weight(width, hidden)], perm=[1, 0]),
                 "dynamic": lambda: b.input(f"w{i}", F32, [hidden, width])}.get(form, lambda: weight(hidden, width))()
            y = b.node("MatMul", [n, w])
            _output(b, b.node("Add", [y, weight(width)]) if form == "bias" else y, f"y{i}")
    if draw.flag("norm_read_elsewhere", 0.2):
        _output(b, b.node("Neg", [n]), "neg_norm")
    return b.model(), ["norm", "norm_linear"]


def _output(b: GraphBuilder, value: str, name: str) -> None:
    b.nodes.append(helper.make_node("Identity", [value], [name], name=f"id_{name}"))
    b.outputs.append(helper.make_empty_tensor_value_info(name))  # typed by graphs.retyped


FAMILIES = {"norm": _norm, "rope": _rope, "attention": _attention, "norm_linear": _norm_linear}


# --- mutations any graph takes -----------------------------------------------------------------

def _interior_values(model: onnx.ModelProto) -> list[str]:
    outputs = {o.name for o in model.graph.output}
    return [v for node in model.graph.node for v in node.output if v and v not in outputs]


def permute_commutative(model: onnx.ModelProto, rng: np.random.Generator) -> int:
    """Reverse the inputs of each commutative node with probability 1/2; how many were."""
    swapped = 0
    for node in model.graph.node:
        if node.op_type in COMMUTATIVE and len(node.input) >= 2 and rng.random() < 0.5:
            node.input[:] = list(reversed(node.input))
            swapped += 1
    return swapped


def add_consumers(model: onnx.ModelProto, rng: np.random.Generator, count: int) -> list[str]:
    """``count`` float interior values each also read by a new node (Neg, Relu, Sigmoid) whose
    output is a new graph output; the values chosen."""
    floats = [v for v in _interior_values(model) if _elem(model, v) in (TensorProto.FLOAT, TensorProto.FLOAT16)]
    chosen = list(rng.choice(floats, size=min(count, len(floats)), replace=False)) if floats else []
    for i, value in enumerate(chosen):
        op = ["Neg", "Relu", "Sigmoid"][i % 3]
        model.graph.node.append(helper.make_node(op, [value], [f"extra_{i}"], name=f"extra_{op}_{i}"))
        model.graph.output.append(helper.make_empty_tensor_value_info(f"extra_{i}"))
    return [str(v) for v in chosen]


def expose_interior(model: onnx.ModelProto, rng: np.random.Generator, p: float) -> list[str]:
    """Each interior value becomes a graph output too, with probability ``p``."""
    chosen = [v for v in _interior_values(model) if rng.random() < p]
    for value in chosen:
        model.graph.output.append(helper.make_empty_tensor_value_info(value))
    return chosen


def _elem(model: onnx.ModelProto, name: str) -> int:
    for value in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if value.name == name:
            return value.type.tensor_type.elem_type
    return 0


# --- inputs and the whole case -----------------------------------------------------------------

def _feeds(model: onnx.ModelProto, sizes: dict[str, int], rng: np.random.Generator) -> dict[str, np.ndarray]:
    feeds = {}
    for value in model.graph.input:
        tensor = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else sizes[d.dim_param] for d in tensor.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type)
        if "mask" in value.name:  # an additive float mask: zeros and large negatives
            feeds[value.name] = np.where(rng.random(shape) < 0.2, -1e4, 0.0).astype(dtype)
        elif "scale" in value.name:
            feeds[value.name] = np.asarray(rng.uniform(0.2, 0.6), dtype=dtype).reshape(shape)
        else:
            feeds[value.name] = (rng.standard_normal(shape) * _scale(value.name)).astype(dtype)
    return feeds


def _scale(name: str) -> float:
    return 1.0 if name.startswith(("cos", "sin")) else 0.7


def _dim_names(model: onnx.ModelProto) -> set[str]:
    return {d.dim_param for v in model.graph.input for d in v.type.tensor_type.shape.dim if d.dim_param}


def generate(family: str, seed: int) -> Case:
    """The ``seed``-th random graph of ``family``."""
    rng = np.random.default_rng([seed, sorted(FAMILIES).index(family)])
    draw = Draw(rng)
    model, only = FAMILIES[family](draw)
    sizes = {"batch": int(rng.integers(1, 4)), "seq": int(rng.integers(1, 8)), "past": int(rng.integers(1, 5))}
    sizes["total"] = sizes["past"] + sizes["seq"]
    if draw.knobs.get("kt") == "reshape":
        sizes.update(batch=STATIC_BATCH, seq=STATIC_SEQ)  # attention_model pins them for this Kᵀ
    dims = draw("dims", ["as built", *VARIANTS], p=[0.5] + [0.5 / len(VARIANTS)] * len(VARIANTS))
    if dims == "static":
        if _dim_names(model) <= set(STATIC_DIMS):
            sizes.update(STATIC_DIMS)
        else:  # the static variant knows batch and seq only
            dims = draw.knobs["dims"] = "renamed"
    draw.knobs["perturbed"] = []
    for _ in range(int(rng.choice([0, 1, 2], p=[0.5, 0.35, 0.15]))):
        change = perturb(model, rng, lambda m: _feeds(m, sizes, np.random.default_rng(seed)))
        if change:
            draw.knobs["perturbed"].append(change)
    model = retyped(model)
    float_type = draw("float", ["float32", "float16", "float16_io32"], p=[0.6, 0.2, 0.2])
    if float_type != "float32" and _elem(model, model.graph.input[0].name) == TensorProto.FLOAT:
        model = to_float16(retyped(model), keep_io_types=float_type == "float16_io32")
    draw.knobs["swapped"] = permute_commutative(model, rng)
    draw.knobs["consumers_of"] = add_consumers(model, rng, int(rng.choice([0, 0, 1, 2])))
    draw.knobs["exposed"] = expose_interior(model, rng, p=float(rng.choice([0.0, 0.05, 0.2])))
    model = retyped(model)
    feeds = _feeds(model, sizes, rng)
    if dims != "as built":
        model = variant(model, dims)
    return Case(family, only, model, feeds, draw.knobs)
