"""The ONNX ``Attention`` op (opsets 23-25) re-targeted to ``otfuse.Attention`` (docs/ops.md).

What maps directly: Q/K/V as BNSD 4-D tensors (``layout`` BNSD) or 3-D ``[B, S, heads*D]`` with
``q_num_heads``/``kv_num_heads`` (``layout`` BSND, our 3-D form of it); ``past_key``/``past_value``
→ ``present_key``/``present_value``; ``scale``; ``softcap``; a ``Transpose(0, 2, 1, 3)`` of a
4-D output → ``output_layout`` BSND. A ``repeat_kv`` (Unsqueeze(2) →
Expand → Reshape) in front of K and V is absorbed as ``kv_num_heads`` when no cache is involved.

What is translated:
- ``is_causal``: ONNX aligns the causal frontier to the past length (query ``i`` sees keys
  ``j <= i + P``; top-left, ``j <= i``, without a past), otfuse to the bottom right
  (``j <= i + Skv - Sq``). They agree exactly when the query length equals the new keys' length,
  so that must be provable from the shapes; otherwise the node is left alone.
- ``attn_mask``: a float mask is added (``attn_bias``), a bool mask (True = attend) masks with
  -inf; both are first offered to ``masks.py``, which may prove them causal / window / padding.
  A bool mask it cannot read becomes ``Where(mask, 0, -inf)`` (plain nodes). Its last dim must be
  provably the total key length (ONNX pads a shorter mask with -inf; ORT refuses it).

- Attention-25's ``left_window_size`` / ``right_window_size``: a left window with the causal
  bound (``is_causal``, or ``right_window_size = 0``) is otfuse's ``window = left + 1``.

Refused (``ATTENTION_OP`` lists what is modelled; anything else, an unknown attribute or a newer
op version included, is refused): ``qk_matmul_output_mode`` other than 0, the
``qk_matmul_output`` output, a ``softmax_precision`` below the inputs' type, ``nonpad_kv_seqlen``
(opset 24), a window reaching to the right of the query.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from otfuse.fusions.attention.chain_checks import padding_input
from otfuse.fusions.attention.masks import classify_bool_mask, classify_mask
from otfuse import ops
from otfuse.rewriter import checks
from otfuse.rewriter.allow_list import OpAllowList, only, require_allowed
from otfuse.rewriter.builder import Helpers, Value
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.pattern import Absent, Either, Match, Var, attr, op
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.rule import Fusion, RewriteContext, Rule
from otfuse.rewriter.spellings import unsqueeze, unsqueeze_axes

FAMILY = "attention"
_OPTIONAL_INPUTS = ("mask", "past_k", "past_v", "nonpad_kv_seqlen")

# Everything of ONNX Attention-23/24/25 this rule translates; anything else is refused.
ATTENTION_OP = OpAllowList(
    "Attention", versions=frozenset({23, 24, 25}),
    attributes={"is_causal": only(0, 1), "q_num_heads": None, "kv_num_heads": None, "scale": None,
                "softcap": None, "softmax_precision": None, "qk_matmul_output_mode": only(0),
                "left_window_size": None, "right_window_size": None},
    inputs=6,  # Q, K, V, attn_mask, past_key, past_value (not nonpad_kv_seqlen, opset 24)
    outputs=3,  # Y, present_key, present_value (not qk_matmul_output)
)


def _repeat_kv(tag: str):
    """repeat_kv(x): Unsqueeze(axis 2) -> Expand -> Reshape merging (Nkv, rep) into the heads."""
    unsqueezed = unsqueeze(Var(tag), f"{tag}_unsq")
    return op.Reshape(op.Expand(unsqueezed, Var(f"{tag}_expand_shape"), _bind=f"{tag}_expand"),
                      Var(f"{tag}_merge_shape"), _bind=f"{tag}_merge")


def _attention_op():
    """The op with any of its optional inputs given or left out (empty names in between)."""
    optional = [Either(Var(name), Absent()) for name in _OPTIONAL_INPUTS]
    heads = [(Var("q"), _repeat_kv("k"), _repeat_kv("v")), (Var("q"), Var("k"), Var("v"))]
    attention = Either(*(op.Attention(*qkv, *optional[:count], _bind="attention")
                         for qkv in heads for count in range(len(optional), -1, -1)))
    # The exporter's head transpose after a 4-D op becomes output_layout BSND (one copy less).
    return Either(op.Transpose(attention, perm=[0, 2, 1, 3], _bind="out_transpose"), attention)


def _dims(graph: GraphIndex, value: str, what: str) -> tuple:
    shape = graph.shape(value)
    if shape is None or len(shape) not in (3, 4):
        raise Refuse(f"{what} {value!r} needs a known rank 3 or 4, has {shape}")
    return shape


def _total(past, new):
    """past + new as a dim: a number, a symbolic sum, or None when unknown."""
    if past == 0 or (isinstance(past, int) and isinstance(new, int)):
        return past + new if isinstance(new, int) else new
    return None if past is None or new is None else f"{past} + {new}"


def _heads(graph: GraphIndex, match: Match, node: onnx.NodeProto) -> dict:
    """B, N, Nkv, Sq, S (new keys), D, Dv, the rank of Q/K/V and their type, from the shapes (4-D)
    or the head attributes (3-D); heads and head sizes static and lined up."""
    q, k, v = match.value("q"), match.value("k"), match.value("v")
    shapes = [_dims(graph, value, what) for value, what in ((q, "Q"), (k, "K"), (v, "V"))]
    rank = len(shapes[0])
    if any(len(shape) != rank for shape in shapes):
        raise Refuse("Q, K and V have different ranks")
    elem = graph.elem_type(q)
    if elem not in checks.FLOAT_TYPES or any(graph.elem_type(x) != elem for x in (k, v, node.output[0])):
        raise Refuse("Q, K, V and Y must share one float type")
    if rank == 4:
        (batch, heads, q_len, head_dim), (_, kv_heads, kv_len, k_dim), (_, v_heads, _, v_dim) = shapes
        _check_head_attributes(node, heads, kv_heads)
    else:
        heads, kv_heads = attr(node, "q_num_heads", 0), attr(node, "kv_num_heads", 0)
        (batch, q_len, q_hidden), (_, kv_len, k_hidden), (_, _, v_hidden) = shapes
        if not heads or not kv_heads or not all(isinstance(d, int) for d in (q_hidden, k_hidden, v_hidden)):
            raise Refuse("3-D inputs need q_num_heads, kv_num_heads and static hidden sizes")
        if q_hidden % heads or k_hidden % kv_heads or v_hidden % kv_heads:
            raise Refuse(f"hidden sizes {q_hidden}/{k_hidden}/{v_hidden} do not divide into "
                         f"{heads}/{kv_heads} heads")
        head_dim, k_dim, v_dim, v_heads = q_hidden // heads, k_hidden // kv_heads, v_hidden // kv_heads, kv_heads
    checks.require_static(heads=heads, kv_heads=kv_heads, head_size=head_dim, v_head_size=v_dim)
    if k_dim != head_dim or v_heads != kv_heads or heads % kv_heads:
        raise Refuse(f"Q/K/V heads do not line up: {heads} query heads of {head_dim}, K "
                     f"{kv_heads} heads of {k_dim}, V {v_heads} heads")
    return {"batch": batch, "heads": heads, "kv_heads": kv_heads, "q_len": q_len, "kv_len": kv_len,
            "head_dim": head_dim, "v_dim": v_dim, "rank": rank, "elem": elem}


def _scores_attributes(node: onnx.NodeProto, elem: int) -> dict:
    """scale and softcap as otfuse's, and a softmax precision otfuse's float32 covers."""
    attributes = {}
    scale = attr(node, "scale")
    if scale is not None:
        if not math.isfinite(scale) or scale == 0:
            raise Refuse(f"scale {scale} (otfuse's 0 means 1/sqrt(D))")
        attributes["scale"] = float(scale)
    softcap = attr(node, "softcap", 0.0)
    if softcap < 0 or not math.isfinite(softcap):
        raise Refuse(f"softcap {softcap}")
    if softcap > 0:
        attributes["softcap"] = float(softcap)
    precision = attr(node, "softmax_precision")
    if precision not in (None, onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, elem):
        raise Refuse(f"softmax_precision {checks.type_name(precision)} is below otfuse's float32")
    return attributes


def _geometry(graph: GraphIndex, match: Match) -> tuple[dict, tuple]:
    """The fused node's attributes (masks aside), after every check that can refuse, and the
    scores' [B, N, Sq, Skv]."""
    node = match.node("attention")
    require_allowed(graph, node, ATTENTION_OP)
    if match.has("nonpad_kv_seqlen"):
        raise Refuse("nonpad_kv_seqlen (an external cache) is not supported")
    if attr(node, "qk_matmul_output_mode", 0) != 0 or (len(node.output) > 3 and node.output[3]):
        raise Refuse("the qk_matmul_output is requested")
    h = _heads(graph, match, node)
    kv_heads = h["kv_heads"]
    if match.has("k_merge"):
        kv_heads = _check_repeat_kv(graph, match, h["heads"])
    past_len = _check_cache(graph, match, kv_heads, h["head_dim"], h["v_dim"], h["elem"])
    attributes = {"num_heads": h["heads"], "kv_num_heads": kv_heads, "layout": "BNSD" if h["rank"] == 4 else "BSND"}
    if match.has("out_transpose") and h["rank"] != 4:
        raise Refuse("a transpose after a 3-D output")
    attributes["output_layout"] = "BSND" if match.has("out_transpose") else attributes["layout"]
    attributes.update(_scores_attributes(node, h["elem"]))
    causal, window = _causal_window(node)
    if causal:
        # ONNX: key j <= i + P (the past length); otfuse: j <= i + (P + S) - Sq. Equal iff Sq == S.
        if not checks.dims_equal(h["q_len"], h["kv_len"]):
            raise Refuse(f"is_causal with {h['q_len']} queries and {h['kv_len']} new keys: ONNX aligns the "
                         f"causal mask to the past length, otfuse to the bottom right")
        attributes["causal"] = 1
    if window:
        attributes["window"] = window
    scores = (h["batch"], h["heads"], h["q_len"], _total(past_len, h["kv_len"]))
    if match.has("mask"):
        _check_mask(graph, match.value("mask"), h["elem"], scores)
    return attributes, scores


def _causal_window(node) -> tuple[bool, int]:
    """(causal, otfuse window) from is_causal and Attention-25's window sizes. A query at
    position p sees keys p - left <= j <= p + right (each bound when >= 0), and j <= p with
    is_causal: the causal side is is_causal or right = 0, the window left + 1 (otfuse: the
    ``window`` positions up to and including p). A window reaching to the right is refused."""
    left, right = attr(node, "left_window_size", -1), attr(node, "right_window_size", -1)
    causal = bool(attr(node, "is_causal", 0)) or right == 0
    if left < -1 or right < -1:
        raise Refuse(f"window sizes {left} / {right} (below -1)")
    if not causal and (right > 0 or left >= 0):
        raise Refuse(f"a non-causal window (left {left}, right {right}): otfuse's window looks left only")
    return causal, left + 1 if left >= 0 else 0


def _check_head_attributes(node, heads, kv_heads) -> None:
    """4-D inputs carry their heads in the shapes; stated attributes must agree with them."""
    for name, value in (("q_num_heads", heads), ("kv_num_heads", kv_heads)):
        stated = attr(node, name, 0)
        if stated and stated != value:
            raise Refuse(f"{name} {stated} contradicts the input shapes ({value})")


def _check_repeat_kv(graph, match, heads) -> int:
    """The kv heads before repeat_kv, proven to be HF's grouping: [B, Nkv, S, D] -> Unsqueeze(2)
    -> Expand [B, Nkv, rep, S, D] -> Reshape [B, Nkv*rep, S, D]. Only without a cache: ONNX
    concatenates the past with the repeated keys, so its past would have every query head."""
    if match.has("past_k") or any(match.node("attention").output[1:3]):
        raise Refuse("repeat_kv with a KV cache: the cache holds the repeated heads")
    kv_heads = None
    for tag in ("k", "v"):
        source = graph.shape(match.value(tag))
        if source is None or len(source) != 4 or not isinstance(source[1], int):
            raise Refuse(f"the {tag} before repeat_kv has shape {source}")
        axes = unsqueeze_axes(graph, match, f"{tag}_unsq")
        rep = heads // source[1] if source[1] and heads % source[1] == 0 else 0
        expanded = graph.shape(match.node(f"{tag}_expand").output[0])
        merged = checks.reshaped_dims(graph, match.node(f"{tag}_merge"))
        want_expanded = [source[0], source[1], rep, source[2], source[3]]
        want_merged = [source[0], heads, source[2], source[3]]
        if axes != [2] or not rep or not checks.shapes_equal(expanded, want_expanded) or \
                not checks.shapes_equal(merged, want_merged):
            wrong = (checks.shape_mismatch(expanded, want_expanded) if not checks.shapes_equal(expanded, want_expanded)
                     else checks.shape_mismatch(merged, want_merged))
            raise Refuse(f"the {tag} repeat is not repeat_kv: {list(source)} -> {expanded} -> {merged} ({wrong})")
        if kv_heads not in (None, source[1]):
            raise Refuse("k and v are repeated from different head counts")
        kv_heads = source[1]
    return kv_heads


def _check_cache(graph, match, kv_heads, head_dim, v_dim, elem):
    """The past length (0 without a past); past_key/past_value are BNSD [B, Nkv, P, D / Dv]."""
    if match.has("past_k") != match.has("past_v"):
        raise Refuse("only one of past_key and past_value is given")
    if not match.has("past_k"):
        return 0
    past_k, past_v = match.value("past_k"), match.value("past_v")
    pk, pv = graph.shape(past_k), graph.shape(past_v)
    if pk is None or pv is None or len(pk) != 4 or len(pv) != 4:
        raise Refuse(f"past_key / past_value have shapes {pk} / {pv}, not rank 4")
    if pk[1] != kv_heads or pv[1] != kv_heads or pk[3] != head_dim or pv[3] != v_dim:
        raise Refuse(f"past shapes {list(pk)} / {list(pv)} do not hold {kv_heads} heads of {head_dim}/{v_dim}")
    if graph.elem_type(past_k) != elem or graph.elem_type(past_v) != elem:
        raise Refuse("the past has another type than Q")
    return pk[2]


def _check_mask(graph, mask, elem, target) -> None:
    shape, mask_type = graph.shape(mask), graph.elem_type(mask)
    if mask_type not in (onnx.TensorProto.BOOL, elem, onnx.TensorProto.FLOAT):
        raise Refuse(f"attn_mask has type {checks.type_name(mask_type)}, not bool or float")
    if shape is None or not 1 <= len(shape) <= 4:
        raise Refuse(f"attn_mask {mask!r} has an unknown rank or one above 4")
    if not checks.dims_equal(shape[-1], target[-1]):
        raise Refuse(f"attn_mask's last dim {shape[-1]} is not provably the key count {target[-1]} "
                     f"(ONNX pads a shorter mask with -inf)")
    for dim, want in zip(reversed(shape[:-1]), reversed(target[:-1])):
        if dim != 1 and isinstance(dim, int) and isinstance(want, int) and dim != want:
            raise Refuse(f"attn_mask shape {list(shape)} does not broadcast to {list(target)}")


def _mask_inputs(ctx: RewriteContext, match: Match, attributes: dict, helpers: Helpers,
                 scores: tuple) -> tuple[Value, Value]:
    """(attn_bias, key_padding_mask), updating causal/window/empty_rows for a proven mask."""
    if not match.has("mask"):
        return "", ""
    graph, mask = ctx.graph, match.value("mask")
    boolean = graph.elem_type(mask) == onnx.TensorProto.BOOL
    try:
        claim = (classify_bool_mask if boolean else classify_mask)(graph, mask, ctx.memo, scores)
    except Refuse:
        claim = None
    if claim is not None:
        windows = [w for w in (claim.window, attributes.get("window", 0)) if w]  # both bound the keys
        attributes.update(causal=int(claim.causal or attributes.get("causal", 0)),
                          window=min(windows, default=0), empty_rows=claim.empty_rows)
        return "", padding_input(graph, helpers, claim.key_padding)
    if not boolean:
        return mask, ""
    dtype = onnx.helper.tensor_dtype_to_np_dtype(graph.elem_type(match.value("q")))
    zero, masked = helpers.constant(np.array(0, dtype)), helpers.constant(np.array(-np.inf, dtype))
    return helpers.node("Where", [mask, zero, masked]), ""


def _analyse(ctx: RewriteContext, match: Match) -> Fusion:
    attributes, scores = _geometry(ctx.graph, match)
    helpers = Helpers(match.root)
    bias, padding = _mask_inputs(ctx, match, attributes, helpers, scores)
    past = {name: match.value(key) for name, key in (("past_key", "past_k"), ("past_value", "past_v"))
            if match.has(key)}
    present = dict(zip(("present_key", "present_value"), match.node("attention").output[1:3]))
    call = ops.Attention(Q=match.value("q"), K=match.value("k"), V=match.value("v"), attn_bias=bias,
                         key_padding_mask=padding, **past, Y=match.root.output[0], **present, **attributes)
    return Fusion(call, match.covered, helpers)


ATTENTION_OP_RULE = Rule("Attention(ONNX op)", _attention_op(), _analyse, FAMILY, frozenset({"Attention"}))

RULES: list[Rule] = [ATTENTION_OP_RULE]
