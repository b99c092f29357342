"""Small hand-built ONNX graphs that spell subgraphs the way exporters do, with knobs to mutate
them. The real-export tests use models/fixtures; these make every mutation explicit."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = TensorProto.FLOAT
F16 = TensorProto.FLOAT16
OPSET = 18


class GraphBuilder:
    def __init__(self, opset: int = OPSET):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.opset = opset
        self._count = 0

    def name(self, base: str) -> str:
        self._count += 1
        return f"{base}_{self._count}"

    def input(self, name: str, elem: int, shape) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem, shape))
        return name

    def output(self, name: str, elem: int, shape) -> None:
        self.outputs.append(helper.make_tensor_value_info(name, elem, shape))

    def const(self, value, base: str = "c") -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def node(self, op_type: str, inputs, base: str | None = None, outputs: int = 1, **attrs):
        outs = [self.name(base or op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=self.name(op_type), **attrs))
        return outs[0] if outputs == 1 else outs

    def model(self) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "g", self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = 9
        return onnx.shape_inference.infer_shapes(model)


def rms_norm(b: GraphBuilder, x: str, hidden: int, *, eps=1e-6, weight=None, dtype=np.float32,
             cast=False, square="pow", inverse="reciprocal", axes=(-1,), axes_as_input=True,
             weight_first=True, keepdims=1, exponent=2.0, eps_const=True, weight_before_reduce=False,
             gemma=False) -> str:
    """weight * (x / sqrt(mean(x^2) + eps)), spelled with the chosen ops."""
    rng = np.random.default_rng(0)
    weight = weight if weight is not None else (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype)
    w = b.const(weight, "weight")
    xf = b.node("Cast", [x], to=F32) if cast else x
    # The mutation "weight applied before the reduction": the squared value is not x.
    xs = b.node("Mul", [xf, b.const(np.float32(1.5))]) if weight_before_reduce else xf
    sq = b.node("Pow", [xs, b.const(np.float32(exponent))]) if square == "pow" else b.node("Mul", [xs, xs])
    if axes_as_input:
        ms = b.node("ReduceMean", [sq, b.const(np.array(axes, dtype=np.int64))], keepdims=keepdims)
    else:
        ms = b.node("ReduceMean", [sq], axes=list(axes), keepdims=keepdims)
    eps_name = b.const(np.float32(eps), "eps") if eps_const else b.input("eps_in", F32, [])
    std = b.node("Sqrt", [b.node("Add", [ms, eps_name])])
    if inverse == "reciprocal":
        normed = b.node("Mul", [xf, b.node("Reciprocal", [std])])
    elif inverse == "div_one":
        normed = b.node("Mul", [xf, b.node("Div", [b.const(np.float32(1.0)), std])])
    else:
        normed = b.node("Div", [xf, std])
    if cast:
        normed = b.node("Cast", [normed], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))
    if gemma:
        w = b.node("Add", [b.const(np.asarray(1.0, dtype=dtype)), w])
    return b.node("Mul", [w, normed] if weight_first else [normed, w])


def layer_norm_decomposed(b: GraphBuilder, x: str, hidden: int, *, eps=1e-5, bias=True,
                          square="pow", axes=(-1,)) -> str:
    rng = np.random.default_rng(1)
    mean = b.node("ReduceMean", [x, b.const(np.array(axes, dtype=np.int64))], keepdims=1)
    centered = b.node("Sub", [x, mean])
    sq = (b.node("Pow", [centered, b.const(np.float32(2.0))]) if square == "pow"
          else b.node("Mul", [centered, centered]))
    var = b.node("ReduceMean", [sq, b.const(np.array(axes, dtype=np.int64))], keepdims=1)
    std = b.node("Sqrt", [b.node("Add", [var, b.const(np.float32(eps))])])
    normed = b.node("Div", [centered, std])
    out = b.node("Mul", [normed, b.const((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))])
    if bias:
        out = b.node("Add", [out, b.const((0.1 * rng.standard_normal(hidden)).astype(np.float32))])
    return out


def single_norm_model(kind: str = "rms", hidden: int = 16, dtype=np.float32, residual=False,
                      sum_used=True, **kwargs) -> onnx.ModelProto:
    """x [batch, seq, hidden] -> norm -> y (and the residual sum as a second output if used)."""
    # ReduceMean takes axes as an attribute before opset 18.
    b = GraphBuilder(opset=OPSET if kwargs.get("axes_as_input", True) else 17)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = b.input("x", elem, ["batch", "seq", hidden])
    if residual:
        r = b.input("r", elem, ["batch", "seq", hidden])
        x = b.node("Add", [x, r], base="sum")
    if kind == "rms":
        rms_norm(b, x, hidden, dtype=dtype, **kwargs)
    else:
        layer_norm_decomposed(b, x, hidden, **kwargs)
    b.nodes[-1].output[0] = "y"
    b.output("y", elem, ["batch", "seq", hidden])
    if residual and sum_used:
        b.node("Identity", [x], base="sum_out")
        b.nodes[-1].output[0] = "sum_out"
        b.output("sum_out", elem, ["batch", "seq", hidden])
    return b.model()


# -- rotary embedding ------------------------------------------------------------------------------
INT64_MAX = 2**63 - 1


def _slice(b: GraphBuilder, x: str, start: int, end: int, axis: int = -1, step: int = 1) -> str:
    i64 = lambda v: b.const(np.array([v], dtype=np.int64))  # noqa: E731
    return b.node("Slice", [x, i64(start), i64(end), i64(axis), i64(step)])


def rotate_half(b: GraphBuilder, x: str, width: int, *, split=False, neg_first_half=False,
                split_at=None) -> str:
    """Concat(-x[h:], x[:h]) as LLaMA exports it (or with Split; or mutated)."""
    h = split_at if split_at is not None else width // 2
    if split:
        x1, x2 = b.node("Split", [x, b.const(np.array([h, width - h], dtype=np.int64))], axis=-1, outputs=2)
    else:
        x1, x2 = _slice(b, x, 0, h), _slice(b, x, h, INT64_MAX)
    if neg_first_half:
        return b.node("Concat", [x2, b.node("Neg", [x1])], axis=-1)
    return b.node("Concat", [b.node("Neg", [x2]), x1], axis=-1)


def rotate_interleaved(b: GraphBuilder, x: str, width: int, shape_of: str) -> str:
    """GPT-J's rotate_every_two: stack(-x[1::2], x[0::2], -1).flatten(-2)."""
    even, odd = _slice(b, x, 0, INT64_MAX, step=2), _slice(b, x, 1, INT64_MAX, step=2)
    last = b.const(np.array([-1], dtype=np.int64))
    stacked = b.node("Concat", [b.node("Unsqueeze", [b.node("Neg", [odd]), last]),
                                b.node("Unsqueeze", [even, last])], axis=-1)
    return b.node("Reshape", [stacked, b.node("Shape", [shape_of])])


def rope(b: GraphBuilder, x: str, cos: str, sin: str, width: int, *, mode="half", partial_dim=None,
         head_dim=None, cos_sin_swapped=False, **rotate_kwargs) -> str:
    """x*cos + rotate(x)*sin, optionally on the first ``partial_dim`` lanes only."""
    xr = _slice(b, x, 0, partial_dim) if partial_dim else x
    rotated = (rotate_interleaved(b, xr, width, xr) if mode == "interleaved"
               else rotate_half(b, xr, width, **rotate_kwargs))
    if cos_sin_swapped:
        cos, sin = sin, cos
    out = b.node("Add", [b.node("Mul", [xr, cos]), b.node("Mul", [rotated, sin])])
    if partial_dim:
        out = b.node("Concat", [out, _slice(b, x, partial_dim, INT64_MAX)], axis=-1)
    return out


def rope_model(*, heads=4, kv_heads=2, head_dim=16, rotary_dim=None, mode="half", layout="BNSD",
               pair=True, k_positions_differ=False, dtype=np.float32, extra_consumer=None,
               **rope_kwargs) -> onnx.ModelProto:
    """q (and k) [B, N, S, D] (or BSND) rotated by cos/sin graph inputs [B, 1, S, r] (or [B, S, 1, r])."""
    b = GraphBuilder()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    r = rotary_dim or head_dim
    q_shape = ["batch", heads, "seq", head_dim] if layout == "BNSD" else ["batch", "seq", heads, head_dim]
    k_shape = ["batch", kv_heads, "seq", head_dim] if layout == "BNSD" else ["batch", "seq", kv_heads, head_dim]
    t_shape = ["batch", 1, "seq", r] if layout == "BNSD" else ["batch", "seq", 1, r]
    # q and k come from one tensor, as from one projection input: that is how pairs are recognised.
    source = b.input("qk_source", elem, q_shape)
    q = b.node("Identity", [source], base="q")
    cos, sin = b.input("cos", elem, t_shape), b.input("sin", elem, t_shape)
    kwargs = dict(mode=mode, partial_dim=rotary_dim, **rope_kwargs)
    rope(b, q, cos, sin, r, **kwargs)
    b.nodes[-1].output[0] = "q_rot"
    b.output("q_rot", elem, q_shape)
    if pair:
        k = _slice(b, source, 0, kv_heads, axis=1 if layout == "BNSD" else 2)
        k_cos, k_sin = cos, sin
        if k_positions_differ:
            k_cos, k_sin = b.input("cos_k", elem, t_shape), b.input("sin_k", elem, t_shape)
        rope(b, k, k_cos, k_sin, r, **kwargs)
        b.nodes[-1].output[0] = "k_rot"
        b.output("k_rot", elem, k_shape)
    if extra_consumer:
        node = next(n for n in b.nodes if n.op_type == extra_consumer)
        b.nodes.append(helper.make_node("Identity", [node.output[0]], ["leak"]))
        b.outputs.append(helper.make_empty_tensor_value_info("leak"))
    return b.model()


def rope_sections_model(sections=(4, 6, 6), head_dim=16, split=False) -> onnx.ModelProto:
    """Multi-axis RoPE: each section of head_dim rotated (rotate_half) with its own cos/sin."""
    b = GraphBuilder()
    x = b.input("x", F32, ["batch", 4, "seq", head_dim])
    if split:
        parts = b.node("Split", [x, b.const(np.array(sections, dtype=np.int64))], axis=-1,
                       outputs=len(sections))
    else:
        bounds = np.cumsum((0,) + tuple(sections))
        parts = [_slice(b, x, int(bounds[i]), int(bounds[i + 1]) if i < len(sections) - 1 else INT64_MAX)
                 for i in range(len(sections))]
    rotated = []
    for i, (part, width) in enumerate(zip(parts, sections)):
        cos = b.input(f"cos_{i}", F32, ["batch", 1, "seq", width])
        sin = b.input(f"sin_{i}", F32, ["batch", 1, "seq", width])
        rotated.append(rope(b, part, cos, sin, width))
    b.node("Concat", rotated, axis=-1)
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", 4, "seq", head_dim])
    return b.model()


# -- attention ---------------------------------------------------------------------------------------
def _repeat_heads(b: GraphBuilder, x: str, batch_dims, kv_heads: int, rep: int, head_dim: int,
                  interleave: bool, repeat: str = "expand") -> str:
    """repeat_kv as HF writes it (kv head g serves query heads g*rep .. g*rep+rep-1), or the
    other grouping (query head h reads kv head h % kv_heads) when ``interleave``. ``repeat``:
    "expand" (HF), "tile" (Tile instead of Expand), "tile_heads" (a bare Tile(x, [1, rep, 1, 1]):
    always the other grouping)."""
    if repeat == "tile_heads":
        return b.node("Tile", [x, b.const(np.array([1, rep, 1, 1], dtype=np.int64))])
    axis = 1 if interleave else 2
    unsq = b.node("Unsqueeze", [x, b.const(np.array([axis], dtype=np.int64))])
    if repeat == "tile":
        repeats = [1, rep, 1, 1, 1] if interleave else [1, 1, rep, 1, 1]
        expanded = b.node("Tile", [unsq, b.const(np.array(repeats, dtype=np.int64))])
        return b.node("Reshape", [expanded, b.const(np.array([0, kv_heads * rep, -1, head_dim], dtype=np.int64))])
    shape_5d = [1, rep, kv_heads, 1, head_dim] if interleave else [1, kv_heads, rep, 1, head_dim]
    expanded = b.node("Expand", [unsq, b.const(np.array(shape_5d, dtype=np.int64))])
    return b.node("Reshape", [expanded, b.const(np.array([0, kv_heads * rep, -1, head_dim], dtype=np.int64))])


def _soft_cap(b: GraphBuilder, scores: str, cap: float, inner: float | None, spelling: str, dtype) -> str:
    """Gemma2's cap * tanh(scores / cap) (``inner`` replaces the cap inside tanh when given);
    ``spelling`` "mul" multiplies by the reciprocal instead of dividing."""
    inner = cap if inner is None else inner
    if spelling == "div":
        scaled = b.node("Div", [scores, b.const(np.asarray(inner, dtype=dtype))])
    else:
        scaled = b.node("Mul", [scores, b.const(np.asarray(1.0 / inner, dtype=dtype))])
    return b.node("Mul", [b.node("Tanh", [scaled]), b.const(np.asarray(cap, dtype=dtype))])


STATIC_SEQ, STATIC_BATCH = 5, 2  # the Reshape-Transpose-Reshape Kᵀ variant is built with static sizes


def attention_model(*, heads=4, kv_heads=2, head_dim=8, scale_at="both", q_scale=None, k_scale=None,
                    kt="transpose", mask=True, nan_guard=True, softmax_axis=-1, out_transpose=True,
                    v_grouping="hf", k_perm=(0, 1, 3, 2), leak_probs=False, dtype=np.float32,
                    scale_input=False, softcap=None, softcap_inner=None, softcap_spelling="div",
                    softcap_after_mask=False, repeat="expand") -> onnx.ModelProto:
    """q [B,N,S,D], k/v [B,Nkv,S,D] graph inputs -> SDPA as the dynamo exporter writes it."""
    b = GraphBuilder()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    seq = STATIC_SEQ if kt != "transpose" else "seq"
    batch = STATIC_BATCH if kt != "transpose" else "batch"
    q = b.input("q", elem, [batch, heads, seq, head_dim])
    k = b.input("k", elem, [batch, kv_heads, seq, head_dim])
    v = b.input("v", elem, [batch, kv_heads, seq, head_dim])
    rep = heads // kv_heads
    if rep > 1:
        k = _repeat_heads(b, k, None, kv_heads, rep, head_dim, interleave=False, repeat=repeat)
        v = _repeat_heads(b, v, None, kv_heads, rep, head_dim, interleave=v_grouping != "hf", repeat=repeat)
    if kt == "transpose":
        kT = b.node("Transpose", [k], perm=list(k_perm))
    else:  # the dynamo exporter's Reshape [-1, S, D] -> Transpose -> Reshape [B, N, D, S] (static S)
        flat = b.node("Reshape", [k, b.const(np.array([-1, STATIC_SEQ, head_dim], dtype=np.int64))])
        tr = b.node("Transpose", [flat], perm=[0, 2, 1])
        kT = b.node("Reshape", [tr, b.const(np.array([STATIC_BATCH, heads, head_dim, STATIC_SEQ], dtype=np.int64))])
    side = np.asarray(head_dim ** -0.25, dtype=dtype)
    if scale_at == "both":
        q = b.node("Mul", [q, b.const(np.asarray(q_scale if q_scale is not None else side, dtype=dtype))])
        kT = b.node("Mul", [kT, b.input("k_scale_in", elem, []) if scale_input
                            else b.const(np.asarray(k_scale if k_scale is not None else side, dtype=dtype))])
    scores = b.node("MatMul", [q, kT])
    if scale_at == "scores_div":
        scores = b.node("Div", [scores, b.const(np.asarray(np.sqrt(head_dim), dtype=dtype))])
    cap = lambda s: _soft_cap(b, s, softcap, softcap_inner, softcap_spelling, dtype)  # noqa: E731
    if softcap is not None and not softcap_after_mask:
        scores = cap(scores)
    if mask:
        scores = b.node("Add", [scores, b.input("mask", elem, [batch, 1, seq, seq])])
    if softcap is not None and softcap_after_mask:
        scores = cap(scores)
    probs = b.node("Softmax", [scores], axis=softmax_axis)
    if nan_guard:
        probs = b.node("Where", [b.node("IsNaN", [probs]), b.const(np.asarray(0.0, dtype=dtype)), probs])
    out = b.node("MatMul", [probs, v])
    if out_transpose:
        out = b.node("Transpose", [out], perm=[0, 2, 1, 3])
    b.nodes[-1].output[0] = "y"
    b.output("y", elem, [batch, seq, heads, head_dim] if out_transpose else [batch, heads, seq, head_dim])
    if leak_probs:
        softmax = next(n for n in b.nodes if n.op_type == "Softmax")
        b.nodes.append(helper.make_node("Identity", [softmax.output[0]], ["probs_out"]))
        b.outputs.append(helper.make_empty_tensor_value_info("probs_out"))
    return b.model()


def keys_transposed_model(*, heads=4, head_dim=8, keys="bsnd", k_perm=(0, 2, 3, 1), q_layout="bsnd",
                          v_layout="bsnd", kt_heads=None, kt_dim=None, dtype=np.float32) -> onnx.ModelProto:
    """Attention whose Kᵀ is not a transpose of BNSD keys: GPT-2's eager ``key.permute(0, 2, 3, 1)``
    of [B, S, N, D] (``keys="bsnd"``; ``k_perm`` another permutation of a suitably shaped input),
    a [B, N, D, S] graph input (``"input"``; ``kt_heads``/``kt_dim`` change its dims), or a
    transposed cache ``Concat(past_kt [B, N, D, P], permuted new keys, axis=-1)`` (``"cache"``).
    q / v are ``Transpose([0,2,1,3])`` of [B, S, N, D] inputs ("bsnd") or BNSD inputs ("bnsd")."""
    b = GraphBuilder()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    kv_len = "total" if keys == "cache" else "seq"

    def heads_first(name, layout, seq):
        if layout == "bnsd":
            return b.input(name, elem, ["batch", heads, seq, head_dim])
        return b.node("Transpose", [b.input(name, elem, ["batch", seq, heads, head_dim])], perm=[0, 2, 1, 3])

    q = heads_first("q", q_layout, "seq")
    if keys == "input":
        kt = b.input("k_t", elem, ["batch", kt_heads or heads, kt_dim or head_dim, "seq"])
    else:
        bnds = ["batch", heads, head_dim, "seq"]  # Kᵀ's dims; the input holds them permuted
        kt = b.node("Transpose", [b.input("k", elem, [bnds[k_perm.index(i)] for i in range(4)])], perm=list(k_perm))
        if keys == "cache":
            past = b.input("past_kt", elem, ["batch", heads, head_dim, "past"])
            kt = b.node("Concat", [past, kt], axis=-1)
            v_all = b.node("Concat", [b.input("past_v", elem, ["batch", heads, "past", head_dim]),
                                      heads_first("v", v_layout, "seq")], axis=2)
    v = v_all if keys == "cache" else heads_first("v", v_layout, "seq")
    scores = b.node("Div", [b.node("MatMul", [q, kt]), b.const(np.asarray(np.sqrt(head_dim), dtype=dtype))])
    scores = b.node("Add", [scores, b.input("mask", elem, ["batch", 1, "seq", kv_len])])
    out = b.node("Transpose", [b.node("MatMul", [b.node("Softmax", [scores], axis=-1), v])], perm=[0, 2, 1, 3])
    b.nodes[-1].output[0] = "y"
    b.output("y", elem, ["batch", "seq", heads, head_dim])
    return b.model()
