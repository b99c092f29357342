"""Attention family: scaled dot-product attention chains (chain.py) fused into ``Attention``
(docs/ops.md), and into ``RopeAttention`` when the q/k rotation feeds only this attention.

Every spelling is one ``Layout``: its pattern, where the chain has the query, keys and values it
multiplies, how the keys are laid out, and how the fused node reads Q, K and V. One ``analyse``
serves them all: the chain's checks (chain_checks.py), the dims of q, k and v bound by name, the
mask claim, and the ``Fusion``. The additive mask is passed through as ``attn_bias``: whatever the
graph computed (causal, sliding window, padding, ALiBi), the fused node adds exactly it, so the
fusion is exact; older eager code's ``Where(cond, s, fill)`` is fused when the fill masks for
good (-inf behind the NaN guard, or <= -1e30), as ``Where(cond, 0, fill)`` added or as the
causal/window/padding masks.py proves.

Heads merged into the batch (BLOOM) are flat_heads.py; the layouts of keys the graph holds
transposed are in keys_transposed.py.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from otfuse import ops
from otfuse.fusions.attention import chain_checks as chain
from otfuse.fusions.attention.filled_alibi import alibi_before_fill
from otfuse.fusions.attention.chain import rope_keys, rope_pair, sdpa_chain, to_bnsd, with_cache
from otfuse.fusions.attention.fused_matmul import fused_alpha
from otfuse.rewriter import checks
from otfuse.rewriter.builder import Fresh, Helpers, OutputName
from otfuse.rewriter.dim_binder import Dims
from otfuse.rewriter.pattern import Either, Match, Pattern, Var, attr, attributes
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import Fusion, RewriteContext, Rule

FAMILY = "attention"

# The keys' dims as the chain reads them, by how they are laid out (for ``ctx.dims``).
_KEY_DIMS = {"BNSD": "_ Nkv Skv D", "BSND": "_ Skv Nkv D", "BNDS": "_ Nkv D Skv"}


@dataclass(frozen=True)
class Layout:
    """One spelling of the chain. ``q``, ``keys``, ``values``: where the chain has the query and
    the keys and values it reads (before repeat_kv), as match bindings (the first bound one);
    ``keys_dims``: how those keys are laid out (BNSD, BSND, or BNDS: given transposed), or the tag
    of an ``Either`` of the pattern that says it; ``layout``: where the fused node reads Q, K and
    V; ``rope``: the q/k rotation pair is folded in (RopeAttention); ``bsnd_out_only``: fused only
    with the output transpose; ``keys_to_bnsd``: the emit puts a Transpose to BNSD in front of K;
    ``candidate``: a filter on the match (NotCandidate)."""

    name: str
    pattern: Pattern
    q: str = "q"
    keys: tuple[str, ...] = ("k_cache", "k")
    values: tuple[str, ...] = ("v_cache", "v")
    keys_dims: str = "BNSD"
    layout: str = "BNSD"
    rope: bool = False
    bsnd_out_only: bool = False
    keys_to_bnsd: bool = False
    candidate: Callable[[RewriteContext, Match], None] | None = None


def read(match: Match, names: str | tuple[str, ...]) -> str:
    """The value of the first of ``names`` the match binds (a value, or a bound node's output)."""
    for name in (names,) if isinstance(names, str) else names:
        if name in match.values:
            return match.values[name]
        if name in match.nodes:
            return match.nodes[name].output[0]
    raise KeyError(f"none of {names} is bound")


def _key_layout(layout: Layout, match: Match) -> str:
    return match.tag(layout.keys_dims) or layout.keys_dims


def _bind_dims(ctx: RewriteContext, layout: Layout, match: Match) -> Dims:
    """B N Sq D of q, Nkv Skv D of the keys, Nkv Sv Dv of the values: heads and head sizes must
    be static and agree; the lengths are checked by the kernel at run time. Keys or values of
    batch 1 broadcast over q's batch in the MatMuls are refused (the kernel needs equal batches),
    as are any batch or lengths the graph broadcasts (chain.require_aligned)."""
    q, k_all, v_all = read(match, layout.q), read(match, layout.keys), read(match, layout.values)
    key_layout = _key_layout(layout, match)
    dims = ctx.dims(q=(q, "B N Sq D"))
    k_label = "Kᵀ" if key_layout == "BNDS" else "k"
    dims.bind(**{k_label: (k_all, _KEY_DIMS[key_layout])})
    dims.bind(v=(v_all, "_ Nkv Sv Dv"))
    for label in (k_label, "v"):
        if dims.shape(label)[0] == 1 and dims["B"] != 1:
            raise Refuse(f"{label} has batch 1, which the MatMul broadcasts over q's batch {dims['B']}: the op "
                         f"reads one batch of keys and values per query batch")
    checks.require_static(heads=dims["N"], head_size=dims["D"], kv_heads=dims["Nkv"], v_heads=dims.shape("v")[1],
                          v_head_size=dims["Dv"])
    keys = dims.shape(k_label)
    chain.require_aligned(dims.shape("q"), keys, dims.shape("v"), q_and_k_batch=(dims["B"], keys[0]),
                          q_and_v_batch=(dims["B"], dims.shape("v")[0]), k_and_v_lengths=(dims["Skv"], dims["Sv"]))
    return dims


def _check_chain(ctx: RewriteContext, layout: Layout, match: Match, dims: Dims) -> None:
    """Everything between q, k, v and the output, in the order the checks always ran."""
    graph = ctx.graph
    q, k_all, v_all = read(match, layout.q), read(match, layout.keys), read(match, layout.values)
    heads, kv_heads = dims["N"], dims["Nkv"]
    elem = graph.elem_type(q)
    chain.require_softmax_casts(graph, match, elem)
    if elem not in checks.FLOAT_TYPES or graph.elem_type(k_all) != elem or graph.elem_type(v_all) != elem:
        raise Refuse("q, k and v must share one float type")
    for tag, source in (("k", k_all), ("v", v_all)):
        chain.require_repeat(graph, match, tag, source, heads, kv_heads)
    # One kv head needs no repeat_kv: the MatMuls broadcast it over the query heads (Falcon's MQA).
    if not (match.has("k_expand") or match.has("k_tile_heads")) and kv_heads not in (heads, 1):
        raise Refuse(f"{kv_heads} kv heads meet {heads} query heads without repeat_kv")
    chain.require_keys_transpose(graph, match, heads)
    for tag in ("k_cache", "v_cache"):
        if match.has(tag) and attr(match.node(tag), "axis") not in (2, -2):
            raise Refuse(f"the cache Concat {match.node(tag).name!r} does not append along the sequence")
    if match.has("k_cache") != match.has("v_cache"):
        raise Refuse("only one of k and v has a cache")
    chain.require_softmax_over_keys(graph, match)
    scores = (dims["B"], heads, dims["Sq"], dims["Skv"])
    if match.has("mask"):
        chain.require_mask(graph, match.value("mask"), scores)
    if match.has("fill_where"):
        chain.require_broadcast(graph, match.value("fill_cond"), scores, "the Where condition")
        chain.fill(graph, match)
    if match.has("nan_guard"):
        nan_fill = graph.scalar_value(match.value("nan_fill"))
        if nan_fill != 0.0:
            raise Refuse(f"the NaN guard fills {nan_fill}, not 0")
    if match.has("row_guard"):
        chain.require_row_guard(graph, match)
    if match.has("sink_concat") and match.has("fill_where"):
        raise Refuse("attention sinks after a Where fill of the scores: not read")
    if graph.elem_type(match.root.output[0]) != elem:
        raise Refuse("the output type differs from q's")


def _attributes(ctx: RewriteContext, layout: Layout, match: Match, dims: Dims) -> dict:
    attributes_ = {"num_heads": dims["N"], "kv_num_heads": dims["Nkv"], "scale": chain.scale(ctx.graph, match),
                   "layout": layout.layout, "output_layout": "BSND" if match.has("out_transpose") else "BNSD"}
    if match.has("softcap_tanh"):
        attributes_["softcap"] = chain.softcap(ctx.graph, match)
    if layout.bsnd_out_only and not match.has("out_transpose"):
        raise Refuse("BSND inputs with a BNSD output: left to the plain rules")
    if layout.rope:
        rope = attributes(match.node("rope"))
        attributes_.update(rotary_mode=rope.get("mode", "half"), rotary_dim=rope.get("rotary_dim", 0))
        if rope.get("sections"):
            attributes_["rotary_sections"] = list(rope["sections"])
    return attributes_


def analyse_sdpa(layout: Layout, ctx: RewriteContext, match: Match) -> Fusion:
    if layout.candidate is not None:
        layout.candidate(ctx, match)
    fused_alpha(ctx.graph, match)  # ORT's FusedMatMul as the scores: its allow-list first, for every layout
    dims = _bind_dims(ctx, layout, match)
    _check_chain(ctx, layout, match, dims)
    attributes_ = _attributes(ctx, layout, match, dims)
    root = match.root
    helpers = Helpers(root)
    named = {"V": match.value("v")}
    if layout.rope:
        q = list(match.node("rope").output).index(match.value("q_rot"))
        named.update(Q=match.value(f"rope_x{q}"), K=match.value(f"rope_x{1 - q}"), cos=match.value("cos"),
                     sin=match.value("sin"))
    else:
        named.update(Q=match.value("q"), K=read(match, ("k", "k_t")))
    if layout.keys_to_bnsd:
        perm = [0, 2, 1, 3] if _key_layout(layout, match) == "BSND" else [0, 1, 3, 2]
        named["K"] = helpers.node("Transpose", [named["K"]], Fresh(f"{root.output[0]}/k_to_bnsd"),
                                  name=OutputName(), perm=perm)
    scores = (dims["B"], dims["N"], dims["Sq"], dims["Skv"])
    if match.has("sink_concat"):  # gpt-oss: proven per-head constant logits, the sink column dropped
        named["sinks"] = helpers.constant(chain.sinks(ctx.graph, match, dims["N"]), f"{root.output[0]}/sinks")
    slopes = alibi_before_fill(ctx, match, attributes_, helpers, scores)
    if slopes is not None:
        named["alibi_slopes"], named["key_padding_mask"] = slopes
    else:
        named["attn_bias"], named["key_padding_mask"] = chain.mask_inputs(ctx, match, attributes_, helpers, scores,
                                                                          sinks=match.has("sink_concat"))
    outputs = {"Y": root.output[0]}
    if match.has("k_cache"):
        named.update(past_key=match.value("past_k"), past_value=match.value("past_v"))
        outputs.update(present_key=match.node("k_cache").output[0], present_value=match.node("v_cache").output[0])
    op = ops.RopeAttention if layout.rope else ops.Attention
    return Fusion(op(**named, **outputs, **attributes_), match.covered, helpers)


def layout_rule(layout: Layout) -> Rule:
    return Rule(layout.name, layout.pattern, partial(analyse_sdpa, layout), FAMILY, frozenset({"Softmax"}),
                fused_op="RopeAttention" if layout.rope else "Attention")


def _rope_chains(bsnd: bool) -> Either:
    """The chain on the two outputs of a rotation pair, in either order (which one is q depends
    on the order the exporter wrote them in); BSND: rotated before the head transpose (GPT-J)."""
    if bsnd:
        return Either(*(sdpa_chain(to_bnsd(rope_pair(q, "q_rot"), "q"), to_bnsd(rope_pair(1 - q, "k_rot"), "k"),
                                   to_bnsd(Var("v"), "v")) for q in (0, 1)))
    return Either(*(sdpa_chain(rope_pair(q, "q_rot"), rope_keys(1 - q)) for q in (0, 1)))


# GPT-J rotates q and k before the head transpose ([B, S, N, D]): the fused node reads q, k and v
# in that layout (layout BSND) and the three transposes disappear.
ROPE_BSND = Layout("RopeAttention(BSND)", _rope_chains(bsnd=True), q="q_to_bnsd", keys=("k_to_bnsd",),
                   values=("v_to_bnsd",), layout="BSND", rope=True, bsnd_out_only=True)
ROPE = Layout("RopeAttention", _rope_chains(bsnd=False), q="q_rot", keys=("k_cache", "k_rot"), rope=True)
PLAIN = Layout("Attention", sdpa_chain(Var("q"), with_cache("k")))

RULES: list[Rule] = [layout_rule(ROPE_BSND), layout_rule(ROPE), layout_rule(PLAIN)]
