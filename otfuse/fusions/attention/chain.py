"""The scaled dot-product attention chain as exporters write it (Hugging Face SDPA through the
dynamo or TorchScript exporter, eager code), as patterns:

    q [B,N,S,D] -> [Mul scale] ------------------------------\\
    k [B,Nkv,S,D] -> [Concat(past, k)] -> [repeat_kv] -> Kᵀ -> [Mul scale] -> MatMul -> [Mul|Div scale]
        -> [softcap] -> [Where(cond, s, fill)] -> [Add mask] -> [Concat(·, sinks) -> [- row max]]
        -> Softmax(-1) -> [Slice(·, [..., :-1]) after sinks] -> [Where(IsNaN(p), 0, p)
        or ONNX's Where(ReduceMax(mask) == -inf, 0, p)]
        (or [Add mask] -> [Where(cond, s, fill)])
        -> MatMul(·, repeat_kv(v)) -> [Transpose]

repeat_kv is ``Unsqueeze(2) -> Expand|Tile -> Reshape`` (read as an index map, no copy), or a
bare ``Tile`` of a single kv head (MQA); Kᵀ is a Transpose of the last two axes, or the dynamo
exporter's ``Reshape -> Transpose -> Reshape``, or keys the graph holds transposed (the permute of
[B, S, Nkv, D], a graph input, a cache kept transposed). softcap is Gemma2's ``c * tanh(s / c)``.
The Softmax may run in float32 between Casts (HF eager fp16/bf16). What each piece must satisfy
is checked by chain_checks.py; which spelling reads q, k and v where is a ``Layout`` (sdpa.py).
"""

from __future__ import annotations

import numpy as np

from otfuse.domain import OP_DOMAIN
from otfuse.fusions.attention.fused_matmul import fused_scores
from otfuse.rewriter.pattern import ANY, Absent, Const, Either, Var, op
from otfuse.rewriter.refuse import Refuse
from otfuse.rewriter.spellings import unsqueeze


def repeat_kv(x, tag: str):
    """repeat_kv(x, n_rep): Unsqueeze(axis 2) -> Expand (or Tile) -> Reshape merging (Nkv, rep)
    into heads; or a bare Tile of the head axis, which is HF's grouping only when Nkv = 1. The
    last alternative reads the repeated tensor as it is (every head its own kv head)."""
    return Either(op.Reshape(_replicated(x, tag), Var(f"{tag}_merge_shape"), _bind=f"{tag}_merge"),
                  op.Tile(_unexpanded(x, tag), Const(f"{tag}_head_repeats"), _bind=f"{tag}_tile_heads"), x)


def _replicated(x, tag: str):
    """repeat_kv before its merge: the 5-D ``Unsqueeze(x, 2) -> Expand|Tile`` [B, Nkv, rep, S, D]."""
    unsqueezed = unsqueeze(x, f"{tag}_unsq")
    return Either(op.Expand(unsqueezed, Var(f"{tag}_expand_shape"), _bind=f"{tag}_expand"),
                  op.Tile(_unexpanded(unsqueezed, tag), Const(f"{tag}_repeats"), _bind=f"{tag}_expand"))


def _all_ones(value: np.ndarray) -> None:
    if not (value.size and np.all(value == 1)):
        raise Refuse(f"expands to {value.tolist()}, not all ones")


def _unexpanded(x, tag: str):
    """x, or x through the no-op ``Expand(x, [1, ...])`` the dynamo exporter writes before the
    ``Tile`` of ``tensor.repeat(...)`` (the Tile's output shape is checked, so a longer ones
    vector that would add axes is refused there)."""
    return Either(op.Expand(x, Const(f"{tag}_ones", where=_all_ones)), x)


def with_cache(tag: str):
    """The keys (values) attention reads: new ones, or Concat(past, new) along the sequence."""
    return Either(op.Concat(Var(f"past_{tag}"), Var(tag), axis=ANY, _bind=f"{tag}_cache"), Var(tag))


def _transposed(k):
    """Kᵀ of repeat_kv(k): a Transpose of the last two axes, or the dynamo exporter's
    ``Reshape [B*N, S, D] -> Transpose -> Reshape [B, N, D, S]``, whose first Reshape may also
    be repeat_kv's merge (static shapes: it flattens the 5-D replicated keys directly)."""
    repeated = repeat_kv(k, "k")
    flat = op.Reshape(Either(_replicated(k, "k"), repeated), Var("kt_flat_shape"), _bind="kt_flat")
    return Either(op.Transpose(repeated, perm=[0, 1, 3, 2], _bind="k_transpose"),
                  op.Reshape(op.Transpose(flat, perm=[0, 2, 1]), Var("kt_shape"), _bind="kt_unflat"))


def scaled(value, tag: str):
    return Either(op.Mul(value, Const(f"{tag}_mul")), op.Div(value, Const(f"{tag}_div")), value)


def _soft_capped(scores):
    """Gemma2's logit soft-capping of the scaled scores: ``Mul(Tanh(Div(s, c)), c)`` or with
    ``Mul(s, 1/c)`` inside (the two constants are compared by the rule's check)."""
    inner = Either(op.Div(scores, Const("softcap_div")), op.Mul(scores, Const("softcap_recip")))
    return Either(op.Mul(op.Tanh(inner, _bind="softcap_tanh"), Const("softcap_mul")), scores)


def _fill_wheres(scores) -> tuple:
    """Older eager code's boolean mask: ``Where(cond, s, fill)`` (cond True = attend), or with the
    branches swapped ``Where(cond, fill, s)`` (cond True = masked); the fill is checked by the rule."""
    return (op.Where(Var("fill_cond"), scores, Const("fill"), _bind="fill_where"),
            op.Where(Var("fill_cond"), Const("fill"), scores, _bind="fill_where"))


def _filled(scores):
    return Either(*_fill_wheres(scores), scores)


def _probabilities(scores):
    """Softmax(-1) of the masked scores, in T, or in float32 between Casts (HF eager's
    ``softmax(s, dtype=float32).to(q.dtype)``, Meta's ``softmax(s.float()).type_as(q)``):
    ``Cast(float) -> Softmax -> Cast(T)`` with the mask Add before or after the widening Cast, or
    as the exporters write it, ``Softmax -> Cast(float) -> Cast(T)``. The Casts' types are checked
    by the rule."""
    filled = _filled(scores)
    # the mask added before the fill (MPT: ALiBi added, then masked_fill) or after it
    masked = Either(op.Add(filled, Var("mask"), _bind="mask_added"), filled,
                    *_fill_wheres(op.Add(scores, Var("mask"), _bind="mask_add")))
    plain = op.Softmax(masked, _bind="softmax")
    widened = Either(op.Cast(masked, _bind="softmax_widen"),
                     op.Add(op.Cast(filled, _bind="softmax_widen"), Var("mask"), _bind="mask_added"))
    in_float = op.Cast(op.Softmax(widened, _bind="softmax"), _bind="softmax_narrow")
    round_trip = op.Cast(op.Cast(plain, _bind="softmax_widen"), _bind="softmax_narrow")
    never_narrowed = op.Softmax(widened, _bind="softmax")  # refused by the rule, with its reason
    # gpt-oss's attention sinks: the Softmax over Concat(masked scores, sink logits), its last
    # column dropped before P·V (TorchScript between its two Casts, checked as the round trip).
    sink_plain = _sink_dropped(op.Softmax(_with_sink(masked), _bind="softmax"))
    sink_round_trip = op.Cast(_sink_dropped(op.Cast(op.Softmax(_with_sink(masked), _bind="softmax"),
                                                    _bind="softmax_widen")), _bind="softmax_narrow")
    return Either(in_float, round_trip, plain, never_narrowed, sink_plain, sink_round_trip)


def _with_sink(masked):
    """gpt-oss's ``cat([scores, sinks], -1)``, optionally minus its row max (``combined -
    combined.max(-1, keepdim=True)``): ``Sub(c, ReduceMax(c))`` of the one Concat (the axes, the
    sink logits and the ReduceMax are checked by the rule: chain_checks.sinks)."""
    combined = op.Concat(masked, Var("sink_logits"), axis=ANY, _bind="sink_concat")
    row_max = op.ReduceMax(combined, Either(Const("sink_max_axes"), Absent()), _optional_tail=True,
                           _bind="sink_max")
    return Either(op.Sub(combined, row_max, _bind="sink_shift"), combined)


def _sink_dropped(probs):
    """``probs[..., :-1]``: the sink's column sliced off (the bounds are checked by the rule)."""
    return op.Slice(probs, Const("sink_starts"), Const("sink_ends"), Either(Const("sink_axes"), Absent()),
                    Either(Const("sink_steps"), Absent()), _optional_tail=True, _bind="sink_slice")


def _rows_all_masked():
    """ONNX Attention's function body zeroes the rows its bias masks entirely:
    ``Where(Equal(ReduceMax(mask, [-1]), -inf), 0, p)`` (the axes an input from opset 18, an
    attribute before; the keepdims and the constants are checked by the rule)."""
    row_max = op.ReduceMax(Var("mask"), Either(Const("row_max_axes"), Absent()), _optional_tail=True,
                           _bind="row_max")
    return op.Equal(row_max, Const("row_masked"))


def sdpa_chain(q, k, v=None, keys_t=None):
    """The chain; ``keys_t`` replaces Kᵀ (= the transpose of repeat_kv(k)) when the keys come
    already transposed."""
    keys = None if keys_t is not None else repeat_kv(k, "k")  # for ORT's FusedMatMul(transB=1)
    keys_t = keys_t if keys_t is not None else _transposed(k)
    scores = Either(op.MatMul(scaled(q, "q"), scaled(keys_t, "kt"), _bind="qk"),
                    *fused_scores(scaled(q, "q"), scaled(keys_t, "kt"), keys))
    probs = _probabilities(_soft_capped(scaled(scores, "scores")))
    guarded = Either(op.Where(op.IsNaN(probs), Const("nan_fill"), probs, _bind="nan_guard"),
                     op.Where(_rows_all_masked(), Const("nan_fill"), probs, _bind="row_guard"), probs)
    out = op.MatMul(guarded, repeat_kv(v if v is not None else with_cache("v"), "v"), _bind="pv")
    return Either(op.Transpose(out, perm=[0, 2, 1, 3], _bind="out_transpose"), out)


def rope_pair(index: int, role: str):
    """Output ``index`` of the q/k rotation pair, bound as the ``role`` ('q_rot' or 'k_rot') value:
    which output is the query depends on the order the exporter wrote them in."""
    return op.RotaryEmbeddingQK(Var("rope_x0"), Var("rope_x1"), Var("cos"), Var("sin"), _domain=OP_DOMAIN,
                                _output=index, _bind="rope", _as=role)


def rope_keys(index: int):
    """The new keys as rotated by the pair node (possibly appended to a past cache)."""
    rotated = rope_pair(index, "k_rot")
    return Either(op.Concat(Var("past_k"), rotated, axis=ANY, _bind="k_cache"), rotated)


def to_bnsd(value, tag: str):
    return op.Transpose(value, perm=[0, 2, 1, 3], _bind=f"{tag}_to_bnsd")


def keys_from_bsnd():
    """Kᵀ straight from the head split: ``key.permute(0, 2, 3, 1)`` of [B, S, Nkv, D] (GPT-2's
    eager ``_split_heads(key, k=True)``)."""
    return op.Transpose(Var("k"), perm=[0, 2, 3, 1], _bind="k_bsnd_transpose")
