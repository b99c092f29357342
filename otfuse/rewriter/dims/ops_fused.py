"""Shape rules of the otfuse domain's ops (docs/ops.md), so later passes see through what earlier
ones fused (the norm + linear family reads the norms' outputs, the fold reads the attention's)."""

from __future__ import annotations

from otfuse.domain import OP_DOMAIN
from otfuse.rewriter.dims import expr as E
from otfuse.rewriter.dims.engine import NodeContext, Shape, handles


@handles("RMSNorm", "LayerNorm", "RotaryEmbedding", "Gelu", "QuickGelu", "SiLU", "ReluSquared", domain=OP_DOMAIN)
def _like_x(ctx: NodeContext):
    return [(ctx.elem(0), ctx.shape(0), None)]


def _residual(ctx: NodeContext) -> Shape | None:
    """A and B have one shape (no broadcasting, by the op's contract)."""
    a, b = ctx.shape(0), ctx.shape(1)
    if a is not None and b is not None and len(a) == len(b):
        for x, y in zip(a, b):
            ctx.learn(x, y)
        return tuple(ctx.canonical(d) for d in a)
    return a if a is not None else b


@handles("AddRMSNorm", "AddLayerNorm", domain=OP_DOMAIN)
def _add_norm(ctx: NodeContext):
    shape = _residual(ctx)
    return [(ctx.elem(0), shape, None), (ctx.elem(0), shape, None)]


@handles("RotaryEmbeddingQK", domain=OP_DOMAIN)
def _rotary_qk(ctx: NodeContext):
    return [(ctx.elem(0), ctx.shape(0), None), (ctx.elem(1), ctx.shape(1), None)]


def _bnsd(ctx: NodeContext, shape: Shape | None, layout: str, heads: int) -> Shape | None:
    """[B, N, S, D] of a Q/K/V given in ``layout`` (BSND may be 3-D [B, S, N*D])."""
    if shape is None:
        return None
    if len(shape) == 4:
        return tuple(shape) if layout == "BNSD" else (shape[0], shape[2], shape[1], shape[3])
    if len(shape) == 3 and layout == "BSND" and heads:
        head = E.exact_div(shape[2], E.const(heads))
        return (shape[0], E.const(heads), shape[1], head) if head is not None else None
    return None


def _attention_outputs(ctx: NodeContext, past_key_input: int):
    elem = ctx.elem(0)
    layout = ctx.attr("layout", b"BNSD")
    layout = layout.decode() if isinstance(layout, bytes) else layout
    out_layout = ctx.attr("output_layout", None)
    out_layout = layout if out_layout is None else (out_layout.decode() if isinstance(out_layout, bytes) else out_layout)
    heads = ctx.attr("num_heads", 0)
    kv_heads = ctx.attr("kv_num_heads", heads)
    q_shape = ctx.shape(0)
    q = _bnsd(ctx, q_shape, layout, heads)
    k = _bnsd(ctx, ctx.shape(1), layout, kv_heads)
    v = _bnsd(ctx, ctx.shape(2), layout, kv_heads)
    if q is None or v is None:
        return [(elem, None, None)] * len(ctx.node.output)
    if out_layout == "BNSD":
        y = (q[0], q[1], q[2], v[3])
    elif len(q_shape) == 3:
        y = (q[0], q[2], ctx.canonical(E.mul(q[1], v[3])))
    else:
        y = (q[0], q[2], q[1], v[3])
    outs = [(elem, y, None)]
    if k is not None:
        total = k[2]
        past = ctx.shape(past_key_input)
        if past is not None and len(past) == 4:
            total = ctx.canonical(E.add(past[2], k[2]))
        outs.append((elem, (k[0], k[1], total, k[3]), None))
        outs.append((elem, (v[0], v[1], total, v[3]), None))
    return outs


@handles("Attention", domain=OP_DOMAIN)
def _attention(ctx: NodeContext):
    return _attention_outputs(ctx, 5)


@handles("RopeAttention", domain=OP_DOMAIN)
def _rope_attention(ctx: NodeContext):
    return _attention_outputs(ctx, 7)


@handles("RMSNormLinear", "AddRMSNormLinear", "LayerNormLinear", "AddLayerNormLinear", domain=OP_DOMAIN)
def _norm_linear(ctx: NodeContext):
    op = ctx.node.op_type
    residual = op.startswith("Add")
    x = _residual(ctx) if residual else ctx.shape(0)
    elem = ctx.elem(0)
    features = list(ctx.attr("out_features", []) or [])
    outs = []
    for n in features:
        outs.append((elem, None if x is None else tuple(x[:-1]) + (E.const(n),), None))
    while len(outs) < len(ctx.node.output):
        outs.append((elem, x, None))  # the sum S (Add forms), then the normalised Yn
    return outs


@handles("SwiGLU", "GeGLU", domain=OP_DOMAIN)
def _gated_activation(ctx: NodeContext):
    """A and B of one shape, Y the same; or A alone [..., 2H] and Y [..., H]."""
    if ctx.has(1):
        return [(ctx.elem(0), _residual(ctx), None)]
    a = ctx.shape(0)
    half = None if not a else E.exact_div(a[-1], E.const(2))
    return [(ctx.elem(0), None if half is None else tuple(a[:-1]) + (half,), None)]
