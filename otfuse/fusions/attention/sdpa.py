"""Attention family: scaled dot-product attention chains fused into ``Attention`` (docs/ops.md),
and into ``RopeAttention`` when the q/k rotation feeds only this attention.

The chain as exporters write it (Hugging Face SDPA through the dynamo or TorchScript exporter):

    q [B,N,S,D] -> [Mul scale] ------------------------------\\
    k [B,Nkv,S,D] -> [Concat(past, k)] -> [repeat_kv] -> Kᵀ -> [Mul scale] -> MatMul -> [Mul|Div scale]
        -> [softcap] -> [Where(cond, s, fill)] -> [Add mask] -> Softmax(-1) -> [Where(IsNaN(p), 0, p)]
        -> MatMul(·, repeat_kv(v)) -> [Transpose]

repeat_kv is ``Unsqueeze(2) -> Expand|Tile -> Reshape`` (read as an index map, no copy), or a
bare ``Tile`` of a single kv head (MQA); Kᵀ is a Transpose of the last two axes, or the dynamo
exporter's ``Reshape -> Transpose -> Reshape``, or keys the graph holds transposed (the permute of
[B, S, Nkv, D], a graph input, a cache kept transposed). softcap is Gemma2's ``c * tanh(s / c)``.
The additive mask is passed through as ``attn_bias``: whatever the graph computed (causal,
sliding window, padding, ALiBi), the fused node adds exactly it, so the fusion is exact. The
Softmax may run in float32 between Casts (HF eager fp16/bf16: ``Cast(float) -> Softmax ->
Cast(T)``, or ``Softmax -> Cast(float) -> Cast(T)``), as the op does. Older eager code's
``Where(cond, s, fill)`` is fused when the fill masks for good (-inf behind the NaN guard, or
<= -1e30), as ``Where(cond, 0, fill)`` added or as the causal/window/padding masks.py proves.

Here: the chain, ``AttentionRule`` (its checks and rewrite, which the other spellings reuse) and
the rules with RoPE folded in. Heads merged into the batch (BLOOM) are flat_heads.py; keys the
graph holds transposed are keys_transposed.py.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from otfuse.domain import OP_DOMAIN
from otfuse.fusions.attention.masks import classify_bool_mask, classify_mask
from otfuse.rewriter import checks
from otfuse.rewriter.builder import PlainNodes
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import ANY, Const, Either, Match, Var, attr, op
from otfuse.rewriter.rule import Refuse, Replacement, RewriteContext, Rule
from otfuse.rewriter.spellings import unsqueeze, unsqueeze_axes

FAMILY = "attention"


def _repeat_kv(x, tag: str):
    """repeat_kv(x, n_rep): Unsqueeze(axis 2) -> Expand (or Tile) -> Reshape merging (Nkv, rep)
    into heads; or a bare Tile of the head axis, which is HF's grouping only when Nkv = 1. The
    last alternative reads the repeated tensor as it is (every head its own kv head)."""
    unsqueezed = unsqueeze(x, f"{tag}_unsq")
    expanded = Either(op.Expand(unsqueezed, Var(f"{tag}_expand_shape"), _bind=f"{tag}_expand"),
                      op.Tile(_unexpanded(unsqueezed, tag), Const(f"{tag}_repeats"), _bind=f"{tag}_expand"))
    return Either(op.Reshape(expanded, Var(f"{tag}_merge_shape"), _bind=f"{tag}_merge"),
                  op.Tile(_unexpanded(x, tag), Const(f"{tag}_head_repeats"), _bind=f"{tag}_tile_heads"), x)


def _all_ones(value: np.ndarray) -> str | None:
    return None if value.size and np.all(value == 1) else f"expands to {value.tolist()}, not all ones"


def _unexpanded(x, tag: str):
    """x, or x through the no-op ``Expand(x, [1, ...])`` the dynamo exporter writes before the
    ``Tile`` of ``tensor.repeat(...)`` (the Tile's output shape is checked, so a longer ones
    vector that would add axes is refused there)."""
    return Either(op.Expand(x, Const(f"{tag}_ones", where=_all_ones)), x)


def _with_cache(tag: str):
    """The keys (values) attention reads: new ones, or Concat(past, new) along the sequence."""
    return Either(op.Concat(Var(f"past_{tag}"), Var(tag), axis=ANY, _bind=f"{tag}_cache"), Var(tag))


def _transposed(k):
    return Either(op.Transpose(k, perm=[0, 1, 3, 2], _bind="k_transpose"),
                  op.Reshape(op.Transpose(op.Reshape(k, Var("kt_flat_shape"), _bind="kt_flat"), perm=[0, 2, 1]),
                             Var("kt_shape"), _bind="kt_unflat"))


def scaled(value, tag: str):
    return Either(op.Mul(value, Const(f"{tag}_mul")), op.Div(value, Const(f"{tag}_div")), value)


def _soft_capped(scores):
    """Gemma2's logit soft-capping of the scaled scores: ``Mul(Tanh(Div(s, c)), c)`` or with
    ``Mul(s, 1/c)`` inside (the two constants are compared by the rule's check)."""
    inner = Either(op.Div(scores, Const("softcap_div")), op.Mul(scores, Const("softcap_recip")))
    return Either(op.Mul(op.Tanh(inner, _bind="softcap_tanh"), Const("softcap_mul")), scores)


def _filled(scores):
    """Older eager code's boolean mask: ``Where(cond, s, fill)`` (cond True = attend), or with the
    branches swapped ``Where(cond, fill, s)`` (cond True = masked); the fill is checked by the rule."""
    return Either(op.Where(Var("fill_cond"), scores, Const("fill"), _bind="fill_where"),
                  op.Where(Var("fill_cond"), Const("fill"), scores, _bind="fill_where"), scores)


def _probabilities(scores):
    """Softmax(-1) of the masked scores, in T, or in float32 between Casts (HF eager's
    ``softmax(s, dtype=float32).to(q.dtype)``, Meta's ``softmax(s.float()).type_as(q)``):
    ``Cast(float) -> Softmax -> Cast(T)`` with the mask Add before or after the widening Cast, or
    as the exporters write it, ``Softmax -> Cast(float) -> Cast(T)``. The Casts' types are checked
    by the rule."""
    filled = _filled(scores)
    masked = Either(op.Add(filled, Var("mask")), filled)
    plain = op.Softmax(masked, _bind="softmax")
    widened = Either(op.Cast(masked, _bind="softmax_widen"),
                     op.Add(op.Cast(filled, _bind="softmax_widen"), Var("mask")))
    in_float = op.Cast(op.Softmax(widened, _bind="softmax"), _bind="softmax_narrow")
    round_trip = op.Cast(op.Cast(plain, _bind="softmax_widen"), _bind="softmax_narrow")
    return Either(in_float, round_trip, plain)


def sdpa_chain(q, k, v=None, keys_t=None):
    """The chain; ``keys_t`` replaces Kᵀ (= the transpose of repeat_kv(k)) when the keys come
    already transposed."""
    keys_t = keys_t if keys_t is not None else _transposed(_repeat_kv(k, "k"))
    scores = op.MatMul(scaled(q, "q"), scaled(keys_t, "kt"), _bind="qk")
    probs = _probabilities(_soft_capped(scaled(scores, "scores")))
    guarded = Either(op.Where(op.IsNaN(probs), Const("nan_fill"), probs, _bind="nan_guard"), probs)
    out = op.MatMul(guarded, _repeat_kv(v if v is not None else _with_cache("v"), "v"), _bind="pv")
    return Either(op.Transpose(out, perm=[0, 2, 1, 3], _bind="out_transpose"), out)


def _rope_pair(index: int, role: str):
    """Output ``index`` of the q/k rotation pair, bound as the ``role`` ('q_rot' or 'k_rot') value:
    which output is the query depends on the order the exporter wrote them in."""
    return op.RotaryEmbeddingQK(Var("rope_x0"), Var("rope_x1"), Var("cos"), Var("sin"), _domain=OP_DOMAIN,
                                _output=index, _bind="rope", _as=role)


def _rope_keys(index: int):
    """The new keys as rotated by the pair node (possibly appended to a past cache)."""
    rotated = _rope_pair(index, "k_rot")
    return Either(op.Concat(Var("past_k"), rotated, axis=ANY, _bind="k_cache"), rotated)


def known_shape(graph: GraphIndex, value: str, rank: int, what: str) -> tuple:
    shape = graph.shape(value)
    if shape is None or len(shape) != rank:
        raise Refuse(f"{what} {value!r} must have a known rank-{rank} shape, has {shape}")
    return shape


def _may_equal(a, b) -> bool:
    """False only when two dims are provably different (two different numbers)."""
    return not (isinstance(a, int) and isinstance(b, int) and a != b)


def _scalar(graph: GraphIndex, match: Match, name: str) -> float:
    value = graph.scalar_value(match.value(name))
    if value is None or not math.isfinite(value) or value == 0:
        raise Refuse(f"scale constant '{name}' is not one finite non-zero number")
    return value


def _check_broadcast(graph: GraphIndex, value: str, target: tuple, what: str) -> None:
    shape = graph.shape(value)
    if shape is None or len(shape) > 4:
        raise Refuse(f"{what} has an unknown or too large rank")
    for dim, want in zip(reversed(shape), reversed(target)):
        # The kernel checks broadcasting at run time; refuse only what provably widens scores.
        if dim != 1 and not _may_equal(dim, want):
            raise Refuse(f"{what} has shape {list(shape)}, which does not broadcast to {list(target)} "
                         f"(dim {dim} vs {want})")


# A Where fill at most this (or -inf) is what adding it gives too: s + fill rounds to fill in
# float32 for every |s| < ulp(fill) / 2 (3.8e22 at -1e30, 1e31 at finfo(float32).min).
_FILL_ABSORBS_SCORES = -1e30


def _fill(graph: GraphIndex, match: Match) -> float:
    """The fill of ``Where(cond, s, fill)``, when replacing the masked scores by it equals adding
    it (the op adds an ``attn_bias`` or masks with -inf): one number, -inf (with the graph's
    IsNaN guard: a row with every key masked is NaN without it, 0 in the op) or <= -1e30. A
    smaller fill (-1e4, float16's -65504) keeps s in s + fill: a fully masked row would be
    softmax(s) in the op, uniform in the graph."""
    fill = match.value("fill")
    value = graph.scalar_value(fill)
    if value is None or len(graph.constant_shape(fill) or ()) > 4:
        raise Refuse(f"the Where fill {fill!r} is not one number")
    if value == -math.inf:
        if not match.has("nan_guard"):
            raise Refuse("the Where fill is -inf without the IsNaN guard: a row with every key masked is NaN "
                          "in the graph, 0 in the op")
    elif not value <= _FILL_ABSORBS_SCORES:
        raise Refuse(f"the Where fill {value:g} is not -inf or <= {_FILL_ABSORBS_SCORES:g}: adding it keeps the "
                      f"scores (a fully masked row would be softmax(s), not uniform)")
    return value


def _softcap(graph: GraphIndex, match: Match) -> float:
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


class BiasBuilder(PlainNodes):
    """Plain ONNX nodes a rewrite adds in front of the fused node; ``value`` is the combined bias
    built so far (None: no bias)."""

    def __init__(self, ctx: RewriteContext, root: onnx.NodeProto):
        super().__init__(ctx, root)
        self.value: str | None = None

    def float32(self, value: float) -> str:
        return self.constant(np.array(value, dtype=np.float32))


class AttentionRule(Rule):
    name = "Attention"
    family = FAMILY
    anchor_ops = frozenset({"Softmax"})
    exports = ("k_cache", "v_cache")
    fused_op = "Attention"
    pattern = sdpa_chain(Var("q"), _with_cache("k"))

    def check(self, ctx: RewriteContext, match: Match) -> str | None:
        self.attributes(ctx.graph, match)  # raises Refuse with the reason
        return None

    # -- the pieces -----------------------------------------------------------------------------
    def q_value(self, match: Match) -> str:
        return match.value("q")

    def k_new(self, match: Match) -> str:
        return match.value("k")

    def keys_read(self, match: Match) -> str:
        """Keys attention reads before repeat_kv: the cache Concat output, or the new keys."""
        return match.node("k_cache").output[0] if match.has("k_cache") else self.k_new(match)

    def values_read(self, match: Match) -> str:
        return match.node("v_cache").output[0] if match.has("v_cache") else match.value("v")

    def key_dims(self, graph: GraphIndex, match: Match) -> tuple:
        """[B, Nkv, Skv, D] of the keys read (a rule reading them in another layout permutes)."""
        return known_shape(graph, self.keys_read(match), 4, "k")

    def attributes(self, graph: GraphIndex, match: Match) -> dict:
        q, k_all = self.q_value(match), self.keys_read(match)
        v_all = self.values_read(match)
        batch, heads, q_len, head_dim = known_shape(graph, q, 4, "q")
        _, kv_heads, kv_len, k_dim = self.key_dims(graph, match)
        _, v_heads, v_len, v_dim = known_shape(graph, v_all, 4, "v")
        loose = checks.not_static(heads=heads, head_size=head_dim, kv_heads=kv_heads, v_heads=v_heads,
                                  v_head_size=v_dim)
        if loose:
            raise Refuse(f"head counts and head sizes must be static: {loose}")
        # Sequence lengths are checked by the kernel at run time; head layout must be proven here.
        if k_dim != head_dim or v_heads != kv_heads or not _may_equal(v_len, kv_len):
            raise Refuse(f"q/k/v shapes do not line up: q {graph.shape(q)}, k {graph.shape(k_all)}, "
                          f"v {graph.shape(v_all)}")
        elem = graph.elem_type(q)
        self._check_softmax_casts(graph, match, elem)
        if elem not in checks.FLOAT_TYPES or graph.elem_type(k_all) != elem or graph.elem_type(v_all) != elem:
            raise Refuse("q, k and v must share one float type")
        for tag, source in (("k", k_all), ("v", v_all)):
            self._check_repeat(graph, match, tag, source, heads, kv_heads)
        if not (match.has("k_merge") or match.has("k_tile_heads")) and kv_heads != heads:
            raise Refuse(f"{kv_heads} kv heads meet {heads} query heads without repeat_kv")
        self._check_transpose(graph, match)
        for tag in ("k_cache", "v_cache"):
            if match.has(tag) and attr(match.node(tag), "axis") not in (2, -2):
                raise Refuse(f"the cache Concat {match.node(tag).name!r} does not append along the sequence")
        if match.has("k_cache") != match.has("v_cache"):
            raise Refuse("only one of k and v has a cache")
        self._check_softmax(graph, match)
        if match.has("mask"):
            self._check_mask(graph, match.value("mask"), (batch, heads, q_len, kv_len))
        if match.has("fill_where"):
            _check_broadcast(graph, match.value("fill_cond"), (batch, heads, q_len, kv_len), "the Where condition")
            _fill(graph, match)
        if match.has("nan_guard"):
            fill = graph.scalar_value(match.value("nan_fill"))
            if fill != 0.0:
                raise Refuse(f"the NaN guard fills {fill}, not 0")
        if graph.elem_type(self.root_output(match)) != elem:
            raise Refuse("the output type differs from q's")
        attributes = {
            "num_heads": heads,
            "kv_num_heads": kv_heads,
            "scale": self._scale(graph, match),
            "layout": "BNSD",
            "output_layout": "BSND" if match.has("out_transpose") else "BNSD",
        }
        if match.has("softcap_tanh"):
            attributes["softcap"] = _softcap(graph, match)
        return attributes

    def root_output(self, match: Match) -> str:
        return match.covered[0].output[0]

    def _check_repeat(self, graph, match, tag, source, heads, kv_heads) -> None:
        if match.has(f"{tag}_tile_heads"):
            # Tile(x, [1, r, 1, 1]) lays the heads out as [x, x, ...]: query head h reads kv head
            # h % Nkv, which is HF's h // (N / Nkv) only when there is one kv head.
            repeats = [int(r) for r in graph.constant_value(match.value(f"{tag}_head_repeats")).reshape(-1)]
            tiled = known_shape(graph, match.node(f"{tag}_tile_heads").output[0], 4, "the tiled kv heads")
            if kv_heads != 1 or repeats != [1, heads, 1, 1] or tiled[1] != heads:
                raise Refuse(f"Tile {match.node(f'{tag}_tile_heads').name!r} repeats {kv_heads} kv heads by "
                              f"{repeats}: query head h would read kv head h % {kv_heads}, not h // {heads // kv_heads}")
            return
        if not match.has(f"{tag}_merge"):
            return
        unsq = match.node(f"{tag}_unsq")
        axes = unsqueeze_axes(graph, match, f"{tag}_unsq")
        if axes != [2]:
            raise Refuse(f"repeat_kv Unsqueeze {unsq.name!r} adds axis {axes}, not 2")
        expanded = known_shape(graph, match.node(f"{tag}_expand").output[0], 5, "repeat_kv Expand")
        merged = checks.reshaped_dims(graph, match.node(f"{tag}_merge"))
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
        want = [src[0], heads, src[2], src[3]]
        if not checks.shapes_equal(merged, want):
            raise Refuse(f"repeat_kv merges into {list(merged)}, not [B, {heads}, S, D] "
                         f"({checks.shape_mismatch(merged, want)})")

    def _check_transpose(self, graph, match) -> None:
        if not match.has("kt_flat"):  # a Transpose of the last two axes, or keys given transposed
            return
        keys = match.node("kt_flat").input[0]
        k_shape = known_shape(graph, keys, 4, "keys")
        flat = checks.reshaped_dims(graph, match.node("kt_flat"))
        unflat = checks.reshaped_dims(graph, match.node("kt_unflat"))
        if flat is None or len(flat) != 3 or not checks.shapes_equal(flat[1:], k_shape[2:]):
            raise Refuse(f"Kᵀ's first Reshape gives {flat}, not [B*N, S, D] "
                         f"({checks.shape_mismatch(None if flat is None else flat[1:], k_shape[2:])})")
        want = [k_shape[0], k_shape[1], k_shape[3], k_shape[2]]
        if not checks.shapes_equal(unflat, want):
            raise Refuse(f"Kᵀ's last Reshape gives {unflat}, not [B, N, D, S] ({checks.shape_mismatch(unflat, want)})")

    def _check_softmax(self, graph, match) -> None:
        node = match.node("softmax")
        opset = next((e.version for e in graph.model.opset_import if e.domain in ("", "ai.onnx")), 0)
        axis = attr(node, "axis", -1 if opset >= 13 else 1)
        if axis not in (-1, 3):
            raise Refuse(f"Softmax runs over axis {axis}, not the keys")

    def _check_softmax_casts(self, graph, match, elem) -> None:
        """Casts around the Softmax drop exactly only as T -> float32 -> T: the op's softmax is
        float32 and it rounds once, at the end (a narrowing Cast would round where it does not)."""
        if not match.has("softmax_narrow"):
            return
        widen, narrow = match.node("softmax_widen"), match.node("softmax_narrow")
        name = onnx.TensorProto.DataType.Name
        source, wide, back = graph.elem_type(widen.input[0]), attr(widen, "to"), attr(narrow, "to")
        if source != elem or wide != onnx.TensorProto.FLOAT:
            raise Refuse(f"Cast {widen.name!r} around the Softmax takes {name(source)} to "
                          f"{name(wide or 0)}, not q's {name(elem)} to FLOAT")
        if back != elem:
            raise Refuse(f"Cast {narrow.name!r} after the Softmax gives {name(back or 0)}, not q's {name(elem)}")

    def _check_mask(self, graph, mask, target) -> None:
        _check_broadcast(graph, mask, target, f"the mask {mask!r}")
        if graph.elem_type(mask) not in checks.FLOAT_TYPES:
            raise Refuse(f"the mask {mask!r} is not a float tensor")

    def _scale(self, graph, match) -> float:
        scale = 1.0
        for tag in ("q", "kt", "scores"):
            if match.has(f"{tag}_mul"):
                scale *= _scalar(graph, match, f"{tag}_mul")
            if match.has(f"{tag}_div"):
                scale /= _scalar(graph, match, f"{tag}_div")
        return float(np.float32(scale))

    # -- rewrite --------------------------------------------------------------------------------
    def inputs(self, match: Match) -> list[str]:
        return [self.q_value(match), self.k_new(match), match.value("v")]

    def extra_attributes(self, graph: GraphIndex, match: Match) -> dict:
        return {}

    def mask_inputs(self, ctx: RewriteContext, match: Match, attributes: dict,
                    bias: BiasBuilder | None = None) -> tuple[str, str]:
        """(attn_bias, key_padding_mask): the graph's mask as causal/window/padding when
        masks.py can prove what it computes (attributes updated), else as an additive bias. A
        Where fill goes through ``bias`` (the rules whose pattern has one pass it)."""
        if match.has("fill_where"):
            return self._filled_mask_inputs(ctx, match, attributes, bias)
        if not match.has("mask"):
            return "", ""
        claim = classify_mask(ctx.graph, match.value("mask"), ctx.memo)
        if isinstance(claim, str):
            return match.value("mask"), ""
        attributes.update(causal=int(claim.causal), window=claim.window, empty_rows=claim.empty_rows)
        return "", claim.key_padding or ""

    def _filled_mask_inputs(self, ctx: RewriteContext, match: Match, attributes: dict,
                            bias: BiasBuilder) -> tuple[str, str]:
        """``Where(cond, s, fill)``: with no other mask, a condition masks.py proves causal /
        window / padding becomes those attributes (the fill masks for good, see ``_fill``: a row
        with every key masked is uniform for a finite fill, 0 for -inf behind the NaN guard).
        Otherwise the bias ``Where(cond, 0, fill)`` (``Where(cond, fill, 0)`` for swapped
        branches) is built in front of the node, plus the added mask (``s + (fill + m)`` is
        ``fill + m`` as ``_fill`` argues, ``s + (0 + m)`` is ``s + m``). In float32 (exact for
        every T; ORT's CPU has no bfloat16 Where)."""
        graph, cond, fill = ctx.graph, match.value("fill_cond"), match.value("fill")
        swapped = match.node("fill_where").input[1] == fill
        if not swapped and not match.has("mask"):
            claim = classify_bool_mask(graph, cond, ctx.memo)
            if not isinstance(claim, str):
                empty_rows = "uniform" if math.isfinite(_fill(graph, match)) else "zero"
                attributes.update(causal=int(claim.causal), window=claim.window, empty_rows=empty_rows)
                return "", claim.key_padding or ""
        zero, fill = bias.float32(0.0), bias.float32(_fill(graph, match))
        bias.value = bias.node("Where", [cond, fill, zero] if swapped else [cond, zero, fill])
        if match.has("mask"):
            mask = match.value("mask")
            if graph.elem_type(mask) != onnx.TensorProto.FLOAT:
                mask = bias.node("Cast", [mask], to=onnx.TensorProto.FLOAT)
            bias.value = bias.node("Add", [bias.value, mask])
        return bias.value, ""

    def rewrite(self, ctx: RewriteContext, match: Match, root: onnx.NodeProto) -> Replacement:
        graph = ctx.graph
        attributes = {**self.attributes(graph, match), **self.extra_attributes(graph, match)}
        cached = match.has("k_cache")
        builder = BiasBuilder(ctx, root)
        bias, padding = self.mask_inputs(ctx, match, attributes, builder)
        inputs = self.inputs(match) + [
            bias,
            padding,
            match.value("past_k") if cached else "",
            match.value("past_v") if cached else "",
        ]
        while inputs and not inputs[-1]:
            inputs.pop()
        outputs = [root.output[0]]
        if cached:
            outputs += [match.node("k_cache").output[0], match.node("v_cache").output[0]]
        node = ctx.fused_node(self.fused_op, inputs, outputs, root, **attributes)
        return builder.replacement(node)


class RopeAttentionRule(AttentionRule):
    """The rotation of q and k (one RotaryEmbeddingQK node) folded into the attention."""

    name = "RopeAttention"
    fused_op = "RopeAttention"
    pattern = Either(*(sdpa_chain(_rope_pair(q, "q_rot"), _rope_keys(1 - q)) for q in (0, 1)))

    def q_index(self, match: Match) -> int:
        return list(match.node("rope").output).index(match.value("q_rot"))

    def q_value(self, match: Match) -> str:
        return match.value("q_rot")

    def k_new(self, match: Match) -> str:
        return match.value("k_rot")

    def inputs(self, match: Match) -> list[str]:
        q = self.q_index(match)
        return [match.value(f"rope_x{q}"), match.value(f"rope_x{1 - q}"), match.value("v"),
                match.value("cos"), match.value("sin")]

    def extra_attributes(self, graph: GraphIndex, match: Match) -> dict:
        rope = {a.name: onnx.helper.get_attribute_value(a) for a in match.node("rope").attribute}
        extra = {"rotary_mode": rope.get("mode", b"half").decode(), "rotary_dim": rope.get("rotary_dim", 0)}
        if rope.get("sections"):
            extra["rotary_sections"] = list(rope["sections"])
        return extra


def to_bnsd(value, tag: str):
    return op.Transpose(value, perm=[0, 2, 1, 3], _bind=f"{tag}_to_bnsd")


class RopeAttentionBSNDRule(RopeAttentionRule):
    """GPT-J rotates q and k before the head transpose ([B, S, N, D]): the fused node reads q, k
    and v in that layout (layout BSND) and the three transposes disappear."""

    name = "RopeAttention(BSND)"
    pattern = Either(*(sdpa_chain(to_bnsd(_rope_pair(q, "q_rot"), "q"), to_bnsd(_rope_pair(1 - q, "k_rot"), "k"),
                                  to_bnsd(Var("v"), "v")) for q in (0, 1)))

    def q_value(self, match: Match) -> str:
        return match.node("q_to_bnsd").output[0]

    def keys_read(self, match: Match) -> str:
        return match.node("k_to_bnsd").output[0]

    def attributes(self, graph: GraphIndex, match: Match) -> dict:
        values = {**super().attributes(graph, match), "layout": "BSND"}
        if not match.has("out_transpose"):
            raise Refuse("BSND inputs with a BNSD output: left to the plain rules")
        return values

    def values_read(self, match: Match) -> str:
        return match.node("v_to_bnsd").output[0]


RULES: list[Rule] = [RopeAttentionBSNDRule(), RopeAttentionRule(), AttentionRule()]
