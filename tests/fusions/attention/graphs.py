"""Attention subgraphs as exporters spell them (SDPA chains, repeat_kv, soft-capping, keys given
transposed), with knobs to mutate them."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from graphs import GraphBuilder


def _repeat_heads(b: GraphBuilder, x: str, batch_dims, kv_heads: int, rep: int, head_dim: int,
                  interleave: bool, repeat: str = "expand", merge: bool = True) -> str:
    """repeat_kv as HF writes it (kv head g serves query heads g*rep .. g*rep+rep-1), or the
    other grouping (query head h reads kv head h % kv_heads) when ``interleave``. ``repeat``:
    "expand" (HF), "tile" (Tile instead of Expand), "tile_heads" (a bare Tile(x, [1, rep, 1, 1]):
    always the other grouping). ``merge=False`` returns the 5-D replicated tensor (the dynamo
    exporter's static-shape Kᵀ flattens it itself)."""
    if repeat == "tile_heads":
        return b.node("Tile", [x, b.const(np.array([1, rep, 1, 1], dtype=np.int64))])
    axis = 1 if interleave else 2
    unsq = b.node("Unsqueeze", [x, b.const(np.array([axis], dtype=np.int64))])
    if repeat == "tile":
        repeats = [1, rep, 1, 1, 1] if interleave else [1, 1, rep, 1, 1]
        expanded = b.node("Tile", [unsq, b.const(np.array(repeats, dtype=np.int64))])
    else:
        shape_5d = [1, rep, kv_heads, 1, head_dim] if interleave else [1, kv_heads, rep, 1, head_dim]
        expanded = b.node("Expand", [unsq, b.const(np.array(shape_5d, dtype=np.int64))])
    if not merge:
        return expanded
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
                    softcap_after_mask=False, repeat="expand", k_grouping="hf", kt_flat=None,
                    kv_batch=None) -> onnx.ModelProto:
    """q [B,N,S,D], k/v [B,Nkv,S,D] graph inputs -> SDPA as the dynamo exporter writes it.
    ``kt``: "transpose", "reshape3" (Reshape [-1, S, D] -> Transpose -> Reshape [B, N, D, S], static
    sizes) or "reshape3_folded" (that, flattening repeat_kv's 5-D keys: no merge Reshape);
    ``kt_flat`` replaces the first Reshape's shape. ``repeat="none"``: no repeat_kv (one kv head
    broadcast by the MatMuls, Falcon's MQA); ``kv_batch``: k and v's batch (1: broadcast too)."""
    b = GraphBuilder()
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    seq = STATIC_SEQ if kt != "transpose" else "seq"
    batch = STATIC_BATCH if kt != "transpose" else "batch"
    q = b.input("q", elem, [batch, heads, seq, head_dim])
    kv_batch = batch if kv_batch is None else kv_batch
    k = b.input("k", elem, [kv_batch, kv_heads, seq, head_dim])
    v = b.input("v", elem, [kv_batch, kv_heads, seq, head_dim])
    rep = heads // kv_heads
    if rep > 1 and repeat != "none":
        k = _repeat_heads(b, k, None, kv_heads, rep, head_dim, interleave=k_grouping != "hf", repeat=repeat,
                          merge=kt != "reshape3_folded")
        v = _repeat_heads(b, v, None, kv_heads, rep, head_dim, interleave=v_grouping != "hf", repeat=repeat)
    if kt == "transpose":
        kT = b.node("Transpose", [k], perm=list(k_perm))
    else:  # the dynamo exporter's Reshape [-1, S, D] -> Transpose -> Reshape [B, N, D, S] (static S)
        flat_shape = kt_flat if kt_flat is not None else [-1, STATIC_SEQ, head_dim]
        flat = b.node("Reshape", [k, b.const(np.array(flat_shape, dtype=np.int64))])
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


# -- hand-built masks: nodes computing attention_model's `mask` input ------------------------------
MASK_FILL = np.float32(-3.4028234663852886e38)  # float32's lowest: what the exporters fill with


class MaskNodes:
    """Records the nodes and constants of a hand-written mask subgraph (unique names m0.., mc0..)."""

    def __init__(self):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def node(self, op: str, inputs, **attrs) -> str:
        out = f"m{len(self.nodes)}"
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value, dtype=np.int64) -> str:
        name = f"mc{len(self.inits)}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name


def with_computed_mask(model: onnx.ModelProto, recorded: MaskNodes, mask: str,
                       extra_inputs=()) -> onnx.ModelProto:
    """``model`` (attention_model's) with its ``mask`` graph input replaced by ``recorded``'s nodes
    computing ``mask``; ``extra_inputs`` (value infos) are the graph inputs those nodes read."""
    recorded.nodes.append(helper.make_node("Identity", [mask], ["mask"], name="mask_out"))
    graph = model.graph
    kept_inputs = [i for i in graph.input if i.name != "mask"]
    del graph.input[:]
    graph.input.extend(kept_inputs + list(extra_inputs))
    graph.initializer.extend(recorded.inits)
    old = list(graph.node)
    del graph.node[:]
    graph.node.extend(recorded.nodes + old)
    del graph.value_info[:]
    return onnx.shape_inference.infer_shapes(model)
