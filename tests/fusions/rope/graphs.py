"""Rotary-embedding subgraphs as exporters spell them (half, interleaved, partial, sections), with knobs to
mutate them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

from graphs import F32, GraphBuilder


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
