"""What the pieces of a matched attention chain (chain.py) must satisfy to be one ``Attention``,
each check raising ``Refuse``, and what they contribute to the fused node: the scale, the
soft-cap, and the mask inputs (``mask_inputs``: the graph's mask as causal / window / padding when
masks.py proves what it computes, else as an additive bias built with plain nodes)."""

from __future__ import annotations

import math

import numpy as np
import onnx

from otfuse.fusions.attention.fused_matmul import fused_alpha
from otfuse.fusions.attention.constant_masks import looks_like_mask
from otfuse.fusions.attention.mask_probes import FLOAT_PADDING
from otfuse.fusions.attention.masks import classify_bool_mask, classify_mask, zero_filled
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Helpers, Value
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Match, attr
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import RewriteContext
from otfuse.rewriter.spellings import unsqueeze_axes


def known_shape(graph: GraphIndex, value: str, rank: int, what: str) -> tuple:
    shape = graph.shape(value)
    if shape is None or len(shape) != rank:
        raise Refuse(f"{what} {value!r} must have a known rank-{rank} shape, has {shape}")
    return shape


def may_equal(a, b) -> bool:
    """False only when two dims are provably different (two different numbers)."""
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


def broadcasts(a, b) -> bool:
    """Whether the graph broadcasts one dim against the other where the fused op does not: two
    different numbers, or a literal 1 against a dim that is not one (at any other size the graph
    is valid only by broadcasting the 1). Two dims that may be equal are left to the kernel's
    run-time check."""
    return not may_equal(a, b) or _is_one(a) != _is_one(b)


def _is_one(dim) -> bool:
    return isinstance(dim, int) and dim == 1


def require_aligned(q: tuple, keys: tuple, values: tuple, **pairs: tuple) -> None:
    """q, k and v meet in the two MatMuls without broadcasting (``pairs``: what -> (dim, dim))."""
    for what, (a, b) in pairs.items():
        if broadcasts(a, b):
            raise Refuse(f"q/k/v shapes do not line up: {what.replace('_', ' ')} {a} vs {b}, which the graph "
                         f"broadcasts and the op does not (q {list(q)}, k {list(keys)}, v {list(values)})")


def _scalar(graph: GraphIndex, match: Match, name: str) -> float:
    value = graph.scalar_value(match.value(name))
    if value is None or not math.isfinite(value) or value == 0:
        raise Refuse(f"scale constant '{name}' is not one finite non-zero number")
    return value


def scale(graph: GraphIndex, match: Match) -> float:
    """The product of the scale constants the chain multiplies by (and divides by), and the
    alpha of ORT's FusedMatMul when it computes the scores."""
    value = fused_alpha(graph, match)
    for tag in ("q", "kt", "scores"):
        if match.has(f"{tag}_mul"):
            value *= _scalar(graph, match, f"{tag}_mul")
        if match.has(f"{tag}_div"):
            value /= _scalar(graph, match, f"{tag}_div")
    return float(np.float32(value))


def require_broadcast(graph: GraphIndex, value: str, target: tuple, what: str) -> None:
    shape = graph.shape(value)
    if shape is None or len(shape) > 4:
        raise Refuse(f"{what} has an unknown or too large rank")
    for dim, want in zip(reversed(shape), reversed(target)):
        # The kernel checks broadcasting at run time; refuse only what provably widens scores:
        # a dim that differs, or any dim but 1 where the scores have a literal 1.
        if dim != 1 and (not may_equal(dim, want) or _is_one(want)):
            raise Refuse(f"{what} has shape {list(shape)}, which does not broadcast to {list(target)} "
                         f"(dim {dim} vs {want})")


# A Where fill at most this (or -inf) is what adding it gives too: s + fill rounds to fill in
# float32 for every |s| < ulp(fill) / 2 (3.8e22 at -1e30, 1e31 at finfo(float32).min).
_FILL_ABSORBS_SCORES = -1e30


def fill(graph: GraphIndex, match: Match) -> float:
    """The fill of ``Where(cond, s, fill)``, when replacing the masked scores by it equals adding
    it (the op adds an ``attn_bias`` or masks with -inf): one number, -inf (with the graph's
    IsNaN guard: a row with every key masked is NaN without it, 0 in the op) or <= -1e30. A
    smaller fill (-1e4, float16's -65504) keeps s in s + fill: a fully masked row would be
    softmax(s) in the op, uniform in the graph."""
    name = match.value("fill")
    value = graph.scalar_value(name)
    if value is None or len(graph.constant_shape(name) or ()) > 4:
        raise Refuse(f"the Where fill {name!r} is not one number")
    if value == -math.inf:
        if not match.has("nan_guard"):
            raise Refuse("the Where fill is -inf without the IsNaN guard: a row with every key masked is NaN "
                         "in the graph, 0 in the op")
    elif not value <= _FILL_ABSORBS_SCORES:
        raise Refuse(f"the Where fill {value:g} is not -inf or <= {_FILL_ABSORBS_SCORES:g}: adding it keeps the "
                     f"scores (a fully masked row would be softmax(s), not uniform)")
    return value


def softcap(graph: GraphIndex, match: Match) -> float:
    """The cap c of ``c * tanh(s / c)``: the outer factor, which the inner divisor must equal
    (or the inner factor be 1/c to the constant's precision); c > 0, one scalar each."""
    for name in ("softcap_mul", "softcap_div", "softcap_recip"):
        if match.has(name) and len(graph.constant_shape(match.value(name)) or ()) > 4:
            raise Refuse(f"the soft-capping constant '{name}' widens the scores' rank")
    cap = graph.scalar_value(match.value("softcap_mul"))
    if cap is None or not math.isfinite(cap) or cap <= 0:
        raise Refuse(f"the soft-capping factor is {cap}, not one finite positive number")
    if match.has("softcap_div"):
        inner = graph.scalar_value(match.value("softcap_div"))
        if inner != cap:
            raise Refuse(f"soft-capping divides by {inner} but multiplies by {cap}")
    else:
        recip = match.value("softcap_recip")
        inner = graph.scalar_value(recip)
        eps = float(np.finfo(graph.constant_value(recip).dtype).eps) if inner is not None else 0.0
        if inner is None or abs(inner * cap - 1.0) > eps:
            raise Refuse(f"soft-capping multiplies by {inner} inside tanh, not by 1/{cap}")
    return float(np.float32(cap))


def require_repeat(graph: GraphIndex, match: Match, tag: str, source: str, heads: int, kv_heads: int) -> None:
    """repeat_kv in front of k (v), when the chain has one: HF's grouping of the kv heads."""
    if match.has(f"{tag}_tile_heads"):
        # Tile(x, [1, r, 1, 1]) lays the heads out as [x, x, ...]: query head h reads kv head
        # h % Nkv, which is HF's h // (N / Nkv) only when there is one kv head.
        repeats = [int(r) for r in graph.constant_value(match.value(f"{tag}_head_repeats")).reshape(-1)]
        tiled = known_shape(graph, match.node(f"{tag}_tile_heads").output[0], 4, "the tiled kv heads")
        if kv_heads != 1 or repeats != [1, heads, 1, 1] or tiled[1] != heads:
            raise Refuse(f"Tile {match.node(f'{tag}_tile_heads').name!r} repeats {kv_heads} kv heads by "
                         f"{repeats}: query head h would read kv head h % {kv_heads}, not h // {heads // kv_heads}")
        return
    if not match.has(f"{tag}_expand"):
        return
    unsq = match.node(f"{tag}_unsq")
    axes = unsqueeze_axes(graph, match, f"{tag}_unsq")
    if axes != [2]:
        raise Refuse(f"repeat_kv Unsqueeze {unsq.name!r} adds axis {axes}, not 2")
    expanded = known_shape(graph, match.node(f"{tag}_expand").output[0], 5, "repeat_kv Expand")
    src = graph.shape(source)
    rep = heads // kv_heads
    if match.has(f"{tag}_repeats"):  # Tile: the repeats must copy along the new axis 2 only
        repeats = [int(r) for r in graph.constant_value(match.value(f"{tag}_repeats")).reshape(-1)]
        if repeats != [1, 1, rep, 1, 1]:
            raise Refuse(f"repeat_kv Tile repeats {repeats}, not [1, 1, {rep}, 1, 1]")
    want = [src[0], kv_heads, rep, src[2], src[3]]
    if heads % kv_heads or not checks.shapes_equal(expanded, want):
        raise Refuse(f"repeat_kv expands {list(src)} to {list(expanded)}, not x{rep} along a new axis 2 "
                     f"({checks.shape_mismatch(expanded, want)})")
    if not match.has(f"{tag}_merge"):
        return  # the keys' Kᵀ flattens the replicated heads itself (require_keys_transpose)
    merged = checks.reshaped_dims(graph, match.node(f"{tag}_merge"))
    want = [src[0], heads, src[2], src[3]]
    if not checks.shapes_equal(merged, want):
        raise Refuse(f"repeat_kv merges into {list(merged)}, not [B, {heads}, S, D] "
                     f"({checks.shape_mismatch(merged, want)})")


def require_keys_transpose(graph: GraphIndex, match: Match, heads: int) -> None:
    """The dynamo exporter's Kᵀ, ``Reshape -> Transpose -> Reshape``: only the last two axes swap.
    With static shapes its first Reshape flattens repeat_kv's 5-D [B, Nkv, rep, S, D] (checked as
    HF's by require_repeat) itself: row-major, batch b and head kv*rep + r, as the merge would."""
    if not match.has("kt_flat"):  # a Transpose of the last two axes, or keys given transposed
        return
    keys = match.node("kt_flat").input[0]
    if match.has("k_expand") and not match.has("k_merge"):
        replicated = known_shape(graph, keys, 5, "repeat_kv Expand")
        k_shape = (replicated[0], heads, replicated[3], replicated[4])
    else:
        k_shape = known_shape(graph, keys, 4, "keys")
    flat = checks.reshaped_dims(graph, match.node("kt_flat"))
    unflat = checks.reshaped_dims(graph, match.node("kt_unflat"))
    if flat is None or len(flat) != 3 or not checks.shapes_equal(flat[1:], k_shape[2:]):
        raise Refuse(f"Kᵀ's first Reshape gives {flat}, not [B*N, S, D] "
                     f"({checks.shape_mismatch(None if flat is None else flat[1:], k_shape[2:])})")
    want = [k_shape[0], k_shape[1], k_shape[3], k_shape[2]]
    if not checks.shapes_equal(unflat, want):
        raise Refuse(f"Kᵀ's last Reshape gives {unflat}, not [B, N, D, S] ({checks.shape_mismatch(unflat, want)})")


def require_row_guard(graph: GraphIndex, match: Match) -> None:
    """ONNX's ``Where(ReduceMax(mask, [-1]) == -inf, 0, p)``: a row whose added mask is -inf
    everywhere has no visible key, and the op gives such a row 0 (``empty_rows`` "zero", what a
    claimed causal / padding mask or an ``attn_bias`` of -inf leaves too); on any other row the
    guard keeps p. The mask it reads must be the one added to these scores, reduced over the keys
    with the row kept."""
    if not (match.has("mask_added") or match.has("mask_add")):
        raise Refuse("the row guard reads a mask that is not added to the scores")
    row_max = match.node("row_max")
    axes = ([int(a) for a in graph.constant_value(match.value("row_max_axes")).reshape(-1)]
            if match.has("row_max_axes") else attr(row_max, "axes"))
    rank = graph.rank(match.value("mask"))
    if axes is None or len(axes) != 1 or rank is None or axes[0] not in (-1, rank - 1):
        raise Refuse(f"the row guard's ReduceMax {row_max.name!r} reduces axes {axes}, not the keys")
    if attr(row_max, "keepdims", 1) != 1 or attr(row_max, "noop_with_empty_axes", 0) != 0:
        raise Refuse(f"the row guard's ReduceMax {row_max.name!r} drops the reduced axis")
    masked = graph.scalar_value(match.value("row_masked"))
    if masked != -math.inf or graph.scalar_value(match.value("nan_fill")) != 0.0:
        raise Refuse(f"the row guard compares the row maximum with {masked}, not -inf, or fills another "
                     f"value than 0")


def require_softmax_over_keys(graph: GraphIndex, match: Match) -> None:
    node = match.node("softmax")
    opset = next((e.version for e in graph.model.opset_import if e.domain in ("", "ai.onnx")), 0)
    axis = attr(node, "axis", -1 if opset >= 13 else 1)
    if axis not in (-1, 3):
        raise Refuse(f"Softmax runs over axis {axis}, not the keys")


def require_softmax_casts(graph: GraphIndex, match: Match, elem: int) -> None:
    """Casts around the Softmax drop exactly only as T -> float32 (or float64: ONNX Attention's
    ``softmax_precision`` DOUBLE, a float32 result to within its rounding) -> T: the op's softmax
    is float32 and it rounds once, at the end (a narrowing Cast would round where it does not)."""
    name = onnx.TensorProto.DataType.Name
    if match.has("softmax_widen") and not match.has("softmax_narrow"):
        widen = match.node("softmax_widen")
        raise Refuse(f"the Softmax after Cast {widen.name!r} runs in {name(attr(widen, 'to') or 0)} and its "
                     f"probabilities are never cast back to q's {name(elem)}")
    if not match.has("softmax_narrow"):
        return
    widen, narrow = match.node("softmax_widen"), match.node("softmax_narrow")
    source, wide, back = graph.elem_type(widen.input[0]), attr(widen, "to"), attr(narrow, "to")
    if source != elem or wide not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE):
        raise Refuse(f"Cast {widen.name!r} around the Softmax takes {name(source)} to "
                     f"{name(wide or 0)}, not q's {name(elem)} to FLOAT (or DOUBLE)")
    if back != elem:
        raise Refuse(f"Cast {narrow.name!r} after the Softmax gives {name(back or 0)}, not q's {name(elem)}")


def require_mask(graph: GraphIndex, mask: str, target: tuple) -> None:
    require_broadcast(graph, mask, target, f"the mask {mask!r}")
    if graph.elem_type(mask) not in checks.FLOAT_TYPES:
        raise Refuse(f"the mask {mask!r} is not a float tensor")


def padding_input(graph: GraphIndex, helpers: Helpers, key_padding: str | None) -> Value:
    """The proven padding input as the op's ``key_padding_mask`` (int64, int32 or bool): a float
    one (SmolLM's float ``attention_mask`` as onnxscript's test models declare it) through
    ``Cast(to=bool)``, which is ``m != 0`` with NaN attending, as mask_probes checked the graph's
    mask computes for such values too."""
    if not key_padding:
        return ""
    if graph.elem_type(key_padding) in FLOAT_PADDING:
        return helpers.node("Cast", [key_padding], to=onnx.TensorProto.BOOL)
    return key_padding


def mask_inputs(ctx: RewriteContext, match: Match, attributes: dict, helpers: Helpers,
                scores: tuple, sinks: bool = False) -> tuple[Value, Value]:
    """(attn_bias, key_padding_mask): the graph's mask as causal/window/padding when masks.py
    can prove what it computes for these ``scores`` (their [B, N, Sq, Skv]; ``attributes``
    updated), else as an additive bias (reported); ONNX Attention's all-zero bias is none.
    With attention ``sinks`` a row the mask hides entirely puts all its weight on the sink (0 in
    the op, whatever ``empty_rows``): in the graph too when the mask's fill is -inf or absorbs
    the scores (<= -1e30: ``s + fill`` rounds to ``fill`` and ``exp(fill - sink)`` is 0 for
    ``|sink| <= 1e20``, chain_checks.sinks); a weaker finite fill keeps the mask as the bias,
    which the op adds as the graph does (exact)."""
    if match.has("fill_where"):
        return _filled_mask_inputs(ctx, match, attributes, helpers, scores)
    if not match.has("mask") or zero_filled(ctx.graph, match.value("mask")):
        return "", ""
    try:
        claim = classify_mask(ctx.graph, match.value("mask"), ctx.memo, scores)
    except Refuse as refusal:
        _report_unclaimed(ctx, match.value("mask"), refusal)
        return match.value("mask"), ""
    if sinks and claim.empty_rows == "uniform":
        if claim.fill is None or not claim.fill <= _FILL_ABSORBS_SCORES:
            ctx.fused_less_than_fully(
                "mask kept as a materialised attn_bias",
                f"with attention sinks a row the mask hides entirely is 0 in the op; in the graph only when the "
                f"mask's fill absorbs the scores (<= {_FILL_ABSORBS_SCORES:g}), and this one's is {claim.fill}")
            return match.value("mask"), ""
    empty_rows = "zero" if sinks else claim.empty_rows  # every row sees the sink (docs/ops.md)
    attributes.update(causal=int(claim.causal), window=claim.window, empty_rows=empty_rows)
    return "", padding_input(ctx.graph, helpers, claim.key_padding)


def _report_unclaimed(ctx: RewriteContext, mask: str, refusal: Refuse) -> None:
    """A mask the graph computes but masks.py could not prove causal / window / padding becomes a
    materialised bias: the kernel then reads it and computes every tile. A mask that is a graph
    input, or a constant that holds no mask (a learned bias), is what the model states, not a
    lost claim; a constant of 0 / one minimum (or bool) is reported like a computed mask."""
    graph = ctx.graph
    if mask in graph.graph_inputs or (graph.is_constant(mask) and not looks_like_mask(graph.constant_value(mask))):
        return
    ctx.fused_less_than_fully("mask kept as a materialised attn_bias", str(refusal))


def _filled_mask_inputs(ctx: RewriteContext, match: Match, attributes: dict,
                        helpers: Helpers, scores: tuple) -> tuple[Value, Value]:
    """``Where(cond, s, fill)``: with no other mask, a condition masks.py proves causal /
    window / padding becomes those attributes (the fill masks for good, see ``fill``: a row
    with every key masked is uniform for a finite fill, 0 for -inf behind the NaN guard).
    Otherwise the bias ``Where(cond, 0, fill)`` (``Where(cond, fill, 0)`` for swapped
    branches) is built in front of the node, plus the added mask (``s + (fill + m)`` is
    ``fill + m`` as ``fill`` argues, ``s + (0 + m)`` is ``s + m``); a mask added before the
    Where (MPT's ALiBi, then masked_fill) becomes ``Where(cond, m, fill)``. In float32 (exact for
    every T; ORT's CPU has no bfloat16 Where)."""
    graph, cond = ctx.graph, match.value("fill_cond")
    swapped = match.node("fill_where").input[1] == match.value("fill")
    if not swapped and not match.has("mask"):
        try:
            claim = classify_bool_mask(graph, cond, ctx.memo, scores)
        except Refuse as refusal:
            _report_unclaimed(ctx, cond, refusal)
            claim = None
        if claim is not None:
            empty_rows = "uniform" if math.isfinite(fill(graph, match)) else "zero"
            attributes.update(causal=int(claim.causal), window=claim.window, empty_rows=empty_rows)
            return "", padding_input(graph, helpers, claim.key_padding)
    filler = helpers.float32(fill(graph, match))
    mask = match.value("mask") if match.has("mask") else None
    if mask is not None and graph.elem_type(mask) != onnx.TensorProto.FLOAT:
        mask = helpers.node("Cast", [mask], to=onnx.TensorProto.FLOAT)
    if match.has("mask_add"):  # Where(cond, s + m, fill): s + Where(cond, m, fill), whatever m is
        return helpers.node("Where", [cond, filler, mask] if swapped else [cond, mask, filler]), ""
    zero = helpers.float32(0.0)
    bias = helpers.node("Where", [cond, filler, zero] if swapped else [cond, zero, filler])
    if mask is not None:
        bias = helpers.node("Add", [bias, mask])
    return bias, ""


# A sink logit at most this large in magnitude: every finite fill a claimed mask may hold with
# sinks (<= -1e30, mask_inputs) still hides a key next to it, exp(fill - sink) = 0 in float32, so a
# row the mask hides entirely is 0 in the graph as in the op.
_SINK_BOUND = 1e20


def sinks(graph: GraphIndex, match: Match, heads: int) -> np.ndarray:
    """gpt-oss's attention sinks (chain.py ``_with_sink``/``_sink_dropped``) as the op's float32 ``[N]``
    ``sinks``, proven: the Concat joins the key axis of the rank-4 scores and the sink logits come
    second, one column wide (the dimension engine's last dim is a literal 1); the logits are a
    constant read through ``Expand`` (value-preserving broadcasts) whose dims right-aligned to 4-D
    are ``[1, N or 1, 1, 1]`` (one logit per head, the same for every batch row and query row),
    finite and at most ``1e20`` in magnitude; the ReduceMax subtracted before the Softmax (softmax
    is shift-invariant along its axis) reduces exactly the key axis keeping it; the Slice after it
    keeps ``[0, -1)`` of the key axis with step 1, i.e. drops exactly the sink column. The matcher
    already refused any other reader of the interior values (the concatenated logits, the
    probabilities with the sink column)."""
    concat = match.node("sink_concat")
    rank = graph.rank(concat.output[0])
    if rank != 4 or attr(concat, "axis") not in (-1, 3):
        raise Refuse(f"the sink Concat {concat.name!r} joins axis {attr(concat, 'axis')} of a rank-{rank} tensor, "
                     f"not the keys")
    logits = match.value("sink_logits")
    shape = graph.shape(logits)
    if shape is None or len(shape) != 4 or shape[-1] != 1:
        raise Refuse(f"the sink logits {logits!r} have shape {shape}: not one column [B, N, Sq, 1]")
    source = logits
    while (node := graph.producer.get(source)) is not None and node.op_type == "Expand":
        source = node.input[0]
    value = graph.constant_value(source) if graph.is_constant(source) else None
    if value is None:
        raise Refuse(f"the sink logits {logits!r} are computed from the graph's inputs, not a constant per head")
    value = np.asarray(value)
    if value.ndim > 4 or value.dtype.kind != "f":
        raise Refuse(f"the sink logits {source!r} are a {value.dtype} constant of shape {list(value.shape)}")
    dims = (1,) * (4 - value.ndim) + value.shape
    value4 = value.reshape(dims)
    if dims[3] != 1 or dims[1] not in (1, heads) or not np.array_equal(
            value4, np.broadcast_to(value4[:1, :, :1, :], dims), equal_nan=True):
        raise Refuse(f"the sink logits {source!r} (dims {list(dims)} right-aligned to [B, N, Sq, 1]) are not one "
                     f"value per head: they vary along the batch or the query rows, or hold {dims[1]} heads "
                     f"for {heads}")
    per_head = value4[0, :, 0, 0].astype(np.float64)
    logits32 = np.broadcast_to(per_head, (heads,)).astype(np.float32)
    if not np.array_equal(logits32.astype(np.float64), np.broadcast_to(per_head, (heads,))):
        raise Refuse(f"the sink logits {source!r} are not exact in float32")
    if not np.all(np.isfinite(logits32)) or np.any(np.abs(logits32) > _SINK_BOUND):
        raise Refuse(f"the sink logits {logits32.tolist()} are not all finite and within ±{_SINK_BOUND:g}")
    if match.has("sink_max"):
        _require_key_max(graph, match)
    _require_sink_slice(graph, match)
    return logits32


def _require_key_max(graph: GraphIndex, match: Match) -> None:
    row_max = match.node("sink_max")
    axes = ([int(a) for a in graph.constant_value(match.value("sink_max_axes")).reshape(-1)]
            if match.has("sink_max_axes") else attr(row_max, "axes"))
    if axes is None or len(axes) != 1 or axes[0] not in (-1, 3):
        raise Refuse(f"the ReduceMax {row_max.name!r} subtracted before the Softmax reduces axes {axes}, not the keys")
    if attr(row_max, "keepdims", 1) != 1 or attr(row_max, "noop_with_empty_axes", 0) != 0:
        raise Refuse(f"the ReduceMax {row_max.name!r} subtracted before the Softmax drops the reduced axis")


def _require_sink_slice(graph: GraphIndex, match: Match) -> None:
    node = match.node("sink_slice")

    def ints(name: str, default=None):
        if not match.has(name):
            return default
        return [int(x) for x in np.asarray(graph.constant_value(match.value(name))).reshape(-1)]

    starts, ends = ints("sink_starts"), ints("sink_ends")
    axes, steps = ints("sink_axes", [0] * len(starts)), ints("sink_steps", [1] * len(starts))
    if graph.rank(node.input[0]) != 4 or len(starts) != 1 or len(ends) != 1 or len(axes) != 1 or len(steps) != 1 \
            or axes[0] not in (-1, 3):
        raise Refuse(f"the Slice {node.name!r} after the Softmax cuts axes {axes}, not the key axis alone")
    if starts != [0] or ends != [-1] or steps != [1]:
        raise Refuse(f"the Slice {node.name!r} keeps [{starts[0]}:{ends[0]}:{steps[0]}] of the keys and the sink, "
                     f"not [0:-1]: it does not drop exactly the sink column")
