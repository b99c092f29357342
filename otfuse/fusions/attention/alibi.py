"""Recognise the ALiBi bias an exporter built in the graph, so ``Attention`` can generate it in its
tiles from ``alibi_slopes`` (docs/ops.md, "ALiBi") instead of reading a materialised bias.

The bias is the value the scores are added to, ``[B*N, 1, Skv]`` (BLOOM's ``baddbmm`` operand) or
``[B, N, 1, Skv]``: one row per (batch, head), the same for every query (key-only). Nothing is
read from its structure but the inputs whose values it depends on. What it computes is **checked
by running its own subgraph** in ONNX Runtime (as masks.py checks masks) at several batch /
sequence / cache sizes and paddings (values 0, 1 and 3), and must equal, exactly:

* reading the values of the padding mask ``m`` (the one the attention mask claim proved to be the
  key padding): BLOOM's ``slope_h * (cumsum(m) - 1) * m`` → ``alibi_positions = "mask_cumsum"``
  (the op's form, key-only, the same formula);
* reading no input values: ``slope_h * j`` → ``alibi_positions = "index"``, whose relative form
  ``slope_h * (j - t)`` differs from it by ``slope_h * t`` in each query row, which the row-wise
  softmax cancels.

The slopes are recovered per head from the run itself (key 1 minus key 0 with no padding), so a
graph with other slopes gets its own; a per-query term, an offset, or a slope that changes with
the batch or the sequence contradicts the run and the bias stays an additive ``attn_bias``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from otfuse.fusions.attention.mask_probes import input_values_read, probe_session, static_sizes, subgraph_model
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.refuse import Refuse

# Probed sizes: sequences past every small constant an exporter adds (BLOOM's "- 1") and across
# a padding run; a cache of 3 when the subgraph has past inputs.
_SEQUENCES = (2, 5, 12, 40)
# One long probe (dynamic exports): key positions past 2048, where float16 no longer holds every
# integer and slope_h * k_pos needs more bits than float16 has, so a graph that rounds the bias to
# float16 is told apart from the exact float32 product the op generates.
_LONG_SEQUENCE = 4100
_PADDING_VALUES = np.array([0, 1, 3], dtype=np.int64)


@dataclass(frozen=True)
class AlibiClaim:
    slopes: tuple[float, ...]  # float32 values, one per head
    positions: str  # "index" or "mask_cumsum"


def classify_alibi(graph: GraphIndex, bias: str, heads: int, key_padding: str | None, memo: dict,
                   row_offsets: bool = False) -> AlibiClaim:
    """A verified claim for the additive ``bias`` of ``heads`` heads, whose key padding (if any)
    is the graph input ``key_padding``; raises Refuse saying why none can be made. Memoised per
    pass (every layer reads the same bias). ``row_offsets``: the caller proved that every masked
    key is replaced, not added to (a masked_fill after the bias), so an integer offset per row
    (MPT's ``slope_h * (j - Skv + 1)``) cancels in the softmax and is allowed."""
    key = ("alibi", bias, heads, key_padding, row_offsets)
    if key not in memo:
        try:
            memo[key] = _claim(graph, bias, heads, key_padding, row_offsets)
        except Refuse as refusal:
            memo[key] = refusal
    found = memo[key]
    if isinstance(found, Refuse):
        raise Refuse(str(found))
    return found


def _claim(graph: GraphIndex, bias: str, heads: int, key_padding: str | None, row_offsets: bool) -> AlibiClaim:
    reads = input_values_read(graph, bias, {})
    if not reads:
        positions = "index"
    elif key_padding is not None and reads == {key_padding} and not row_offsets:
        positions = "mask_cumsum"
    else:
        why = "no padding mask was proven for this attention" if key_padding is None else \
            f"the proven padding mask is {key_padding!r}"
        raise Refuse(f"the ALiBi bias reads the values of {sorted(reads)} ({why})")
    model = subgraph_model(graph, bias)
    # A "float16" bias (the float16 export's Cast(k_pos) and float16 Mul) is still claimed with the
    # exact float32 product (alibi_round = 0): ONNX Runtime's CPU EP runs those float16 ops in
    # float32 and drops the float16 Cast pairs between them, so in the whole model the bias is never
    # rounded (the subgraph run alone rounds it at its float16 output). Measured on
    # bloom/dynamo_nopos_dyn.fp16 at 4100 keys: otfuse diff max_abs 0.0027 with alibi_round = 0,
    # 0.142 with alibi_round = 1 (and with the bias kept as a float16 attn_bias).
    slopes, _form = _verify_by_running(model, heads, key_padding if positions == "mask_cumsum" else None, row_offsets)
    return AlibiClaim(tuple(float(s) for s in slopes), positions)


def key_positions(padding: np.ndarray | None, batch: int, skv: int) -> np.ndarray:
    """[B, Skv] int64: j without a padding mask, BLOOM's ``(cumsum(m) - 1) * m`` with one."""
    if padding is None:
        return np.broadcast_to(np.arange(skv, dtype=np.int64), (batch, skv))
    m = padding.astype(np.int64)
    return (np.cumsum(m, axis=-1) - 1) * m


def _as_rows(got: np.ndarray, batch: int, heads: int, skv: int) -> np.ndarray:
    """The bias as [B, N, Skv], when it is [B*N, 1, Skv] or [B, N, 1, Skv] (one row per head), or
    [1, N, 1, Skv] / [N, 1, Skv], which the [B, N, Sq, Skv] scores broadcast over the batch (MPT)."""
    if got.shape in ((batch * heads, 1, skv), (batch, heads, 1, skv)):
        return got.reshape(batch, heads, skv)
    if got.shape in ((1, heads, 1, skv), (heads, 1, skv)):
        return np.broadcast_to(got.reshape(1, heads, skv), (batch, heads, skv))
    raise Refuse(f"running the ALiBi bias gives shape {list(got.shape)}, not [B*N, 1, Skv] = "
                 f"{[batch * heads, 1, skv]} or [B, N, 1, Skv]: not one key-only row per head")


def _probes(has_past: bool, key_padding: str | None, rng, static: tuple[int, int] | None):
    """(batch, seq, past, padding or None): no padding first (the slopes come from it); a static
    export only at its own (batch, seq)."""
    for batch in (1, 2) if static is None else (static[0],):
        for seq in _SEQUENCES if static is None else (static[1],):
            for past in (0, 3) if has_past and static is None else (0,):
                for padding in _paddings(batch, past + seq, rng) if key_padding else [None]:
                    yield batch, seq, past, padding


def _row_offsets(rows: np.ndarray, slopes: np.ndarray) -> np.ndarray:
    """The integer c of each row ``slope_h * (j + c)`` (key 0 read back), or Refuse."""
    with np.errstate(divide="ignore", invalid="ignore"):
        offsets = rows[..., :1].astype(np.float64) / slopes[None, :, None].astype(np.float64)
    rounded = np.round(offsets)
    if not np.all(np.isfinite(offsets)) or not np.allclose(offsets, rounded, rtol=0, atol=1e-3):
        raise Refuse("the ALiBi bias's key 0 is not slope_h times an integer offset")
    return rounded.astype(np.float32)


def _verify_by_running(model, heads: int, key_padding: str | None, row_offsets: bool = False) -> tuple[np.ndarray, str]:
    """(slopes, form): the form ("float32" or "float16", alibi_form) that every probe matches."""
    from otfuse.run.feeds import make_feeds

    session, has_past = probe_session(model, "ALiBi bias")
    slopes = None
    static = static_sizes(model)
    forms = {"float32", "float16"}  # the forms every probe so far matches
    for batch, seq, past, padding in _long_probes(_probes(has_past, key_padding, np.random.default_rng(0), static),
                                                  key_padding, static):
        feeds = make_feeds(model, {"batch": batch, "seq": seq, "past": past})
        if padding is not None:
            feeds[key_padding] = padding.astype(feeds[key_padding].dtype)
        got = _run(session, feeds, seq, past)
        if seq == _LONG_SEQUENCE and got.shape[-1] < seq:
            # A table precomputed for the longest sequence and sliced (MPT's max_seq_len): the graph
            # cannot add it to longer scores, so its own length is the longest probe there is.
            seq = got.shape[-1]
            if seq <= max(_SEQUENCES):
                raise Refuse(f"the ALiBi bias holds only {seq} keys")
            feeds = make_feeds(model, {"batch": batch, "seq": seq, "past": past})
            if padding is not None:
                padding = padding[:, :seq]
                feeds[key_padding] = padding.astype(feeds[key_padding].dtype)
            got = _run(session, feeds, seq, past)
        rows = _as_rows(got, batch, heads, past + seq)
        if slopes is None:  # keys 1 and 0 of the first, unpadded run
            slopes = rows[0, :, 1].astype(np.float32) - rows[0, :, 0].astype(np.float32)
            if not np.all(np.isfinite(slopes)):
                raise Refuse("the ALiBi bias has non-finite slopes")
        positions = key_positions(padding, batch, past + seq)[:, None, :].astype(np.float32)
        if row_offsets:  # float32 slope_h * float32(j + c), as the exporter computes it
            positions = positions + _row_offsets(rows, slopes)
        matched = alibi_forms(rows, slopes, positions)
        forms &= matched
        if not matched:
            raise Refuse(f"running the ALiBi bias (batch {batch}, seq {seq}, past {past}) contradicts slope_h * k_pos "
                         f"with alibi_positions = {'mask_cumsum' if key_padding else 'index'}, both in float32 and "
                         f"rounded to float16")
        if not forms:
            raise Refuse(f"running the ALiBi bias (batch {batch}, seq {seq}, past {past}) matches neither slope_h * "
                         f"k_pos in float32 nor rounded to float16 in every probe")
    return slopes, "float32" if "float32" in forms else "float16"


def _run(session, feeds, seq: int, past: int) -> np.ndarray:
    try:
        (got,) = session.run(None, feeds)
    except Exception as exc:  # noqa: BLE001
        raise Refuse(f"the ALiBi bias subgraph failed at seq {seq}, past {past} ({type(exc).__name__})") from None
    return np.asarray(got)


def alibi_forms(rows: np.ndarray, slopes: np.ndarray, positions: np.ndarray) -> set[str]:
    """The biases the graph's ``rows`` [B, N, Skv] equal, compared in float32 (exactly, no
    tolerance): "float32" for ``slope_h * k_pos`` in float32 (the op's alibi_round = 0), "float16"
    for float16 exports' ``float16(slope_h * float16(k_pos))`` (the positions cast to float16, then
    a float16 Mul: alibi_round = 1); none for anything else (a bfloat16 bias, another slope). Short
    probes often match both; the long one tells them apart."""
    got = rows.astype(np.float32)
    forms = set()
    if np.array_equal(got, slopes[None, :, None] * positions):
        forms.add("float32")
    half = (slopes[None, :, None] * positions.astype(np.float16).astype(np.float32)).astype(np.float16)
    if np.array_equal(got, half.astype(np.float32)):
        forms.add("float16")
    return forms


def _long_probes(probes, key_padding: str | None, static: tuple[int, int] | None):
    """The short probes, then (dynamic exports only: a static one never runs at other sizes) one
    long run of batch 1, unpadded and, with a padding mask, left-padded by 3."""
    yield from probes
    if static is not None:
        return
    if key_padding is None:
        yield 1, _LONG_SEQUENCE, 0, None
        return
    ones = np.ones((1, _LONG_SEQUENCE), dtype=np.int64)
    yield 1, _LONG_SEQUENCE, 0, ones
    left = ones.copy()
    left[0, :3] = 0
    yield 1, _LONG_SEQUENCE, 0, left


def _paddings(batch: int, total: int, rng) -> list[np.ndarray]:
    ones = np.ones((batch, total), dtype=np.int64)
    left = ones.copy()
    left[0, : total // 2] = 0
    random = rng.choice(_PADDING_VALUES, size=(batch, total), p=[0.3, 0.5, 0.2])
    return [ones, left, random]
