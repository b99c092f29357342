"""Attention-family ops as ORT's ``com.microsoft.MultiHeadAttention`` and ONNX's ``Attention`` (opset 23).

Both emitters put Q in the op's layout and K / V in BNSD, concatenate the past themselves
(``present_*`` are then exactly otfuse's), and write the masks as the op's mask input:
- visibility by otfuse's rules (docs/ops.md, "Masks"): query row ``i`` at position
  ``t = Skv - Sq + i`` sees key ``j`` iff ``j <= t`` (causal), ``t - window < j`` (window) and
  ``key_padding_mask[b, j] != 0``;
- ``empty_rows = "uniform"``: an additive mask, ``0`` where visible and a finite minimum ``c``
  elsewhere, so a row that sees no key is uniform over all keys, as otfuse's op and the exporter's
  ``finfo.min`` mask compute (``c`` = ``finfo(T).min``; ``-1e30`` in float32, as ORT's Attention
  zeroes rows that are exactly ``finfo(float32).min``, measured with ORT 1.32);
- ``empty_rows = "zero"``: ONNX's boolean mask, whose fully masked rows are 0 (the ONNX spec);
  ORT's ops have no such mask: the additive one, then a ``Where`` zeroing the rows that see no key.
An additive ``attn_bias`` is passed as the mask when no other mask is set. Grouped heads: ONNX's op
takes them; ORT's MultiHeadAttention needs ``Nkv = N``, so K and V are repeated per query head
(a copy; ``present_*`` keep ``Nkv`` heads). ``softcap``: ONNX's op (applied before the mask, as
otfuse's); ORT's MultiHeadAttention has none.
``sinks``: ORT's GroupQueryAttention ``head_sink`` (input 11: ``max(row max, sink_h)`` as the
softmax's shift and ``exp(sink_h - max)`` added to its denominator after the bias, so a row its
``attention_bias`` hides entirely is 0: otfuse's contract, measured with ORT 1.32's CPU kernel,
tests/targets/test_sinks.py), only where GroupQueryAttention is written (no past, queries as long
as the keys, values of the keys' head size) and, in float16, for sinks that are constants exact in
float16 (``head_sink`` is in the attention's type). MultiHeadAttention and ONNX's ``Attention`` have
no sink input: those sites stay unfused, saying why.
"""

from __future__ import annotations

import numpy as np
import onnx

from otfuse.rewriter.checks import dims_equal, type_name
from otfuse.targets import rope
from otfuse.targets.build import MS_DOMAIN, CannotExpress, Emitter
from otfuse.targets.call import FusedCall

_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.FLOAT16: np.float16}


def _fill(elem_type: int):
    """The finite minimum of an additive mask of ``elem_type``."""
    if elem_type == onnx.TensorProto.FLOAT:
        return np.float32(-1e30)
    if elem_type == onnx.TensorProto.FLOAT16:
        return np.float16(np.finfo(np.float16).min)
    raise CannotExpress(f"an additive mask of type {type_name(elem_type)}")


def _bnsd(em: Emitter, value: str, layout: str, heads: int, like: str) -> str:
    """``value`` (shaped as ``like``, in ``layout``) as 4-D BNSD."""
    rank = em.graph.rank(like)
    if layout == "BNSD":
        return value
    if rank == 3:
        value = em.op1("Reshape", [value, em.ints([0, 0, heads, -1])])
    return em.op1("Transpose", [value], perm=[0, 2, 1, 3])


def _visible(em: Emitter, call: FusedCall, q: str, kall: str) -> str | None:
    """The bool ``[B or 1, 1, Sq, Skv]`` of the keys each query row sees, or None (all)."""
    a = call.attributes
    parts = []
    if a["causal"] or a["window"]:
        sq, skv = em.dim_range(q, 2, 3), em.dim_range(kall, 2, 3)
        zero, one = em.constant(np.int64(0)), em.constant(np.int64(1))
        sq0, skv0 = (em.op1("Squeeze", [v, em.ints([0])]) for v in (sq, skv))
        rows = em.op1("Add", [em.op1("Range", [zero, sq0, one]), em.op1("Sub", [skv0, sq0])])
        rows = em.op1("Unsqueeze", [rows, em.ints([1])])
        cols = em.op1("Unsqueeze", [em.op1("Range", [zero, skv0, one]), em.ints([0])])
        parts.append(em.op1("LessOrEqual", [cols, rows]))
        if a["window"]:
            parts.append(em.op1("Greater", [cols, em.op1("Sub", [rows, em.constant(np.int64(a["window"]))])]))
    band = None
    for part in parts:
        band = part if band is None else em.op1("And", [band, part])
    if band is not None:
        band = em.op1("Unsqueeze", [band, em.ints([0, 1])])
    kpm = call.input("key_padding_mask")
    if kpm:
        padded = em.op1("Unsqueeze", [em.op1("Cast", [kpm], to=onnx.TensorProto.BOOL), em.ints([1, 2])])
        band = padded if band is None else em.op1("And", [band, padded])
    if band is None:
        return None
    # Both ops want the mask's query axis to be Sq, not a broadcast 1.
    rows = em.op1("Concat", [em.ints([1, 1]), em.dim_range(q, 2, 3), em.dim_range(kall, 2, 3)], axis=0)
    return em.op1("Expand", [band, rows])


def _alibi(em: Emitter, call: FusedCall, q: str, kall: str) -> str:
    """The ALiBi bias ``slope_h * float32(k_pos - q_pos)`` as float32 ``[B or 1, N, Sq, Skv]``, built
    as otfuse's kernel evaluates it per score (docs/ops.md, "ALiBi": one float32 product of the slope
    and the integer distance); materialised, so O(N Sq Skv) floats per batch row."""
    a = call.attributes
    mode = a["alibi_positions"]
    if mode not in ("index", "mask_cumsum"):
        raise CannotExpress(f"alibi_positions = {mode!r}")
    sq, skv = em.dim_range(q, 2, 3), em.dim_range(kall, 2, 3)
    zero, one = em.constant(np.int64(0)), em.constant(np.int64(1))
    sq0, skv0 = (em.op1("Squeeze", [v, em.ints([0])]) for v in (sq, skv))
    if mode == "index":  # k_pos = j, q_pos = Skv - Sq + i
        k_pos = em.op1("Unsqueeze", [em.op1("Range", [zero, skv0, one]), em.ints([0])])  # [1, Skv]
        q_pos = em.op1("Add", [em.op1("Range", [zero, sq0, one]), em.op1("Sub", [skv0, sq0])])
        distance = em.op1("Sub", [k_pos, em.op1("Unsqueeze", [q_pos, em.ints([1])])])  # [Sq, Skv]
        distance = em.op1("Unsqueeze", [distance, em.ints([0, 1])])
    else:  # BLOOM's key-only positions (cumsum(m) - 1) * m of the padding mask, q_pos = 0
        kpm = call.input("key_padding_mask")
        if not kpm:  # all ones: k_pos = j
            distance = em.op1("Unsqueeze", [em.op1("Range", [zero, skv0, one]), em.ints([0, 1, 2])])
        else:
            if em.graph.elem_type(kpm) not in (onnx.TensorProto.BOOL, onnx.TensorProto.INT32,
                                               onnx.TensorProto.INT64):
                raise CannotExpress(f"ALiBi positions from a key_padding_mask of type "
                                    f"{type_name(em.graph.elem_type(kpm))}")
            m = em.op1("Cast", [kpm], to=onnx.TensorProto.INT64)  # the integer value, as the kernel reads it
            k_pos = em.op1("Mul", [em.op1("Sub", [em.op1("CumSum", [m, em.constant(np.int64(1))]), one]), m])
            distance = em.op1("Unsqueeze", [k_pos, em.ints([1, 2])])  # [B, 1, 1, Skv]
    slopes = em.op1("Reshape", [call.input("alibi_slopes"), em.ints([1, -1, 1, 1])])
    bias = em.op1("Mul", [slopes, em.cast(distance, onnx.TensorProto.FLOAT)])
    shape = em.op1("Concat", [em.ints([1, a["num_heads"]]), sq, skv], axis=0)
    return em.op1("Expand", [bias, shape])


def _alibi_mask(em: Emitter, call: FusedCall, q: str, kall: str, elem_type: int, target: str) -> tuple[str, str]:
    """``_mask`` with ALiBi: the bias plus the visibility as one float32 additive mask (``c`` where
    a key is hidden: ``s + alibi + c`` rounds to ``c``, so a row that sees no key is uniform), or for
    ONNX's empty rows of 0 ``-inf`` there (the spec's 0 for a row masked entirely)."""
    a = call.attributes
    if elem_type != onnx.TensorProto.FLOAT:
        raise CannotExpress(f"ALiBi on {type_name(elem_type)} attention (the target adds its bias in "
                            f"{type_name(elem_type)}, otfuse's op in float32)")
    if call.input("attn_bias"):
        raise CannotExpress("ALiBi together with an additive attn_bias")
    if a["softcap"]:
        raise CannotExpress("ALiBi together with softcap")
    alibi = _alibi(em, call, q, kall)
    visible = _visible(em, call, q, kall)
    if visible is None:
        return alibi, ""
    if a["empty_rows"] == "zero" and target == "onnx":
        return em.op1("Where", [visible, alibi, em.constant(np.float32(-np.inf))]), ""
    additive = em.op1("Add", [alibi, em.op1("Where", [visible, em.constant(np.float32(0)),
                                                      em.constant(_fill(elem_type))])])
    if a["empty_rows"] != "zero":
        return additive, ""
    seen = em.op1("ReduceSum", [em.cast(visible, onnx.TensorProto.FLOAT), em.ints([-1])], keepdims=1)
    return additive, em.op1("Greater", [seen, em.constant(np.float32(0))])


def _mask(em: Emitter, call: FusedCall, q: str, kall: str, elem_type: int, target: str) -> tuple[str, str]:
    """(the op's mask input, "" for none: additive in ``elem_type``, or bool for ONNX's empty rows
    of 0; the bool ``[B or 1, 1, Sq, 1]`` of rows that see a key, where the ORT op's output of the
    others must be zeroed afterwards, or "")."""
    a = call.attributes
    if call.input("alibi_slopes"):
        return _alibi_mask(em, call, q, kall, elem_type, target)
    bias = call.input("attn_bias")
    visible = _visible(em, call, q, kall)
    if bias:
        if visible is not None:
            raise CannotExpress("an additive bias together with causal / window / padding masks")
        if em.graph.elem_type(bias) != elem_type:
            raise CannotExpress(f"the bias {bias!r} is {type_name(em.graph.elem_type(bias))}, the attention "
                                f"{type_name(elem_type)}")
        # A row whose every key the bias masks with -inf: ONNX's Attention outputs 0 (the spec), as
        # empty_rows = "zero"; ORT's ops are then followed by a Where zeroing it. The mean of
        # "uniform" has no such mask.
        if a["empty_rows"] != "zero":
            raise CannotExpress("an additive bias with empty_rows = 'uniform' (a row the bias masks entirely "
                                "with -inf: otfuse's op outputs the mean of V, the target ops 0 or NaN)")
        if target == "onnx":
            return bias, ""
        return _ort_bias(em, bias, q, kall)

    if visible is None:
        return "", ""
    if a["empty_rows"] == "zero" and target == "onnx":
        return visible, ""
    fill = _fill(elem_type)
    additive = em.op1("Where", [visible, em.constant(np.asarray(0, dtype=fill.dtype)), em.constant(fill)])
    if a["empty_rows"] != "zero":
        return additive, ""
    # ORT's ops average a row the additive mask covers entirely: zero those rows afterwards.
    seen = em.op1("ReduceSum", [em.cast(visible, onnx.TensorProto.FLOAT), em.ints([-1])], keepdims=1)
    return additive, em.op1("Greater", [seen, em.constant(np.float32(0))])


def _ort_bias(em: Emitter, bias: str, q: str, kall: str) -> tuple[str, str]:
    """The bias as ORT's ``attention_bias`` (``[B or 1, N or 1, Sq, Skv]``) and the rows it leaves a
    key (not all ``-inf``): ``[B or 1, N or 1, Sq, 1]``, per head for a bias with a head axis
    (BLOOM's and MPT's materialised ALiBi)."""
    shape = em.graph.shape(bias)
    if shape is None or len(shape) > 4:
        raise CannotExpress(f"a bias {bias!r} of shape {shape}, with empty_rows = 'zero'")
    rows = em.op1("Concat", [em.ints([1, 1]), em.dim_range(q, 2, 3), em.dim_range(kall, 2, 3)], axis=0)
    full = em.op1("Expand", [bias, rows])
    finite = em.op1("Not", [em.op1("IsInf", [em.cast(full, onnx.TensorProto.FLOAT)], detect_positive=0)])
    seen = em.op1("ReduceSum", [em.cast(finite, onnx.TensorProto.FLOAT), em.ints([-1])], keepdims=1)
    rows = em.op1("Greater", [seen, em.constant(np.float32(0))])
    if len(shape) >= 3 and shape[-3] != 1:
        em.per_head_rows.add(rows)
    return full, rows


def _zero_empty_rows(em: Emitter, y3: str, rows: str, elem_type: int, heads: int) -> str:
    """``y3`` ``[B, Sq, N*Dv]`` with the rows that saw no key set to 0 (``rows``: ``_mask``'s,
    ``[B or 1, N or 1, Sq, 1]``; per head when its head axis is not provably 1)."""
    if not rows:
        return y3
    zero = em.constant(np.asarray(0, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    if rows not in em.per_head_rows:
        keep = em.op1("Squeeze", [rows, em.ints([1])])  # [B or 1, Sq, 1]
        return em.op1("Where", [keep, y3, zero])
    keep = em.op1("Transpose", [rows], perm=[0, 2, 1, 3])  # [B or 1, Sq, N or 1, 1]
    y4 = em.op1("Reshape", [y3, em.ints([0, 0, heads, -1])])
    return em.op1("Reshape", [em.op1("Where", [keep, y4, zero]), em.ints([0, 0, -1])])
    zero = em.constant(np.asarray(0, dtype=onnx.helper.tensor_dtype_to_np_dtype(elem_type)))
    if rows not in em.per_head_rows:
        keep


def _keys(em: Emitter, call: FusedCall, k: str, heads: int) -> tuple[str, str, str, str]:
    """(K, V in BNSD with the past in front, and the same new K / V in BNSD), writing present_*."""
    layout = call.attributes["layout"]
    k4, v4 = _bnsd(em, k, layout, heads, call.input("K")), _bnsd(em, call.input("V"), layout, heads, call.input("V"))
    kall, vall = k4, v4
    if call.input("past_key"):
        kall = em.op1("Concat", [call.input("past_key"), k4], call.output("present_key") or None, axis=2)
        vall = em.op1("Concat", [call.input("past_value"), v4], call.output("present_value") or None, axis=2)
    else:
        if call.output("present_key"):
            em.op1("Identity", [k4], call.output("present_key"))
        if call.output("present_value"):
            em.op1("Identity", [v4], call.output("present_value"))
    return kall, vall, k4, v4


def _output(em: Emitter, call: FusedCall, y: str, y_layout: str, heads: int) -> None:
    """Write ``y`` (``y_layout``: "BNSD" 4-D, or "BSH" 3-D) as the node's Y."""
    want, rank = call.attributes["output_layout"], em.graph.rank(call.output("Y"))
    target = call.output("Y")
    if y_layout == "BNSD":
        if want == "BNSD":
            em.op1("Identity", [y], target)
            return
        t = em.op1("Transpose", [y], perm=[0, 2, 1, 3])
        em.op1("Reshape", [t, em.ints([0, 0, -1])], target) if rank == 3 else em.op1("Identity", [t], target)
        return
    if want == "BSND" and rank == 3:
        em.op1("Identity", [y], target)
        return
    four = em.op1("Reshape", [y, em.ints([0, 0, heads, -1])])
    em.op1("Transpose", [four], target, perm=[0, 2, 1, 3]) if want == "BNSD" else em.op1("Identity", [four], target)


def _repeat_heads(em: Emitter, value: str, groups: int, heads: int) -> str:
    if groups == 1:
        return value
    wide = em.op1("Unsqueeze", [value, em.ints([2])])
    shape = em.op1("Concat", [em.dim_range(value, 0, 2), em.ints([groups]), em.dim_range(value, 2, 4)], axis=0)
    wide = em.op1("Expand", [wide, shape])
    return em.op1("Reshape", [wide, em.op1("Concat", [em.dim_range(value, 0, 1), em.ints([heads, -1]),
                                                       em.dim_range(value, 3, 4)], axis=0)])


def _attend(em: Emitter, call: FusedCall, q: str, k: str, target: str) -> None:
    a = call.attributes
    heads, kv_heads = a["num_heads"], a["kv_num_heads"]
    elem_type = em.graph.elem_type(call.input("Q"))
    if a["scale"] < 0:
        raise CannotExpress(f"scale {a['scale']}")
    scale = float(a["scale"]) if a["scale"] else None
    if call.input("sinks") and target == "onnx":
        raise CannotExpress("attention sinks (a per-head logit in the softmax's denominator): ONNX's Attention "
                            "op has no sink input")
    if call.input("sinks") and not _group_query_fits(em, call):
        raise CannotExpress("attention sinks with a KV cache, queries not as long as the keys or values of another "
                            "head size (MultiHeadAttention has no sink input; GroupQueryAttention's head_sink is "
                            "written only where it reads no past here)")
    kall, vall, _, _ = _keys(em, call, k, heads=kv_heads)
    q4 = _bnsd(em, q, a["layout"], heads, call.input("Q"))
    if target == "ort" and _group_query_fits(em, call) and _own_causal(call):
        # its own causal mask and window: no [Sq, Skv] mask tensor (a causal row always sees a key)
        y = _group_query(em, call, _merged_heads(em, q4), kall, vall, "", scale, causal=1,
                         local_window_size=a["window"] or -1)
        _output(em, call, y, "BSH", heads)
        return
    mask, rows = _mask(em, call, q4, kall, elem_type, target)
    if target == "onnx":
        y = em.op1("Attention", [q4, kall, vall] + ([mask] if mask else []), opset=23, scale=scale,
                   softcap=float(a["softcap"]) if a["softcap"] else None)
        _output(em, call, y, "BNSD", heads)
        return
    q3 = _merged_heads(em, q4)
    if _group_query_fits(em, call):
        _output(em, call, _zero_empty_rows(em, _group_query(em, call, q3, kall, vall, mask, scale), rows, elem_type,
                                         heads),
                "BSH", heads)
        return
    if a["softcap"]:
        raise CannotExpress(f"softcap {a['softcap']} with a KV cache or queries not as long as the new keys "
                            f"(MultiHeadAttention has no soft-capping; GroupQueryAttention reads no past here)")
    kh, vh = (_repeat_heads(em, v, heads // kv_heads, heads) for v in (kall, vall))
    inputs = [q3, kh, vh, "", "", mask] if mask else [q3, kh, vh]
    y = em.op1("MultiHeadAttention", inputs, domain=MS_DOMAIN, opset=1, num_heads=heads, scale=scale)
    _output(em, call, _zero_empty_rows(em, y, rows, elem_type, heads), "BSH", heads)


def _merged_heads(em: Emitter, bnsd: str) -> str:
    """``[B, N, S, D]`` as ``[B, S, N*D]``."""
    return em.op1("Reshape", [em.op1("Transpose", [bnsd], perm=[0, 2, 1, 3]), em.ints([0, 0, -1])])


def _group_query_fits(em: Emitter, call: FusedCall) -> bool:
    """GroupQueryAttention (no causal skipping: ``causal = 0``, every mask in ``attention_bias``) is
    used where MultiHeadAttention would need copies or has no softcap: grouped heads or softcap,
    without a past (its past with several queries wants batch 1), queries as long as the keys (its
    query and key share ``sequence_length``) and values of the keys' head size."""
    a = call.attributes
    if not (a["softcap"] or a["kv_num_heads"] != a["num_heads"] or call.input("sinks")) or call.input("past_key"):
        return False
    seq = 2 if a["layout"] == "BNSD" else 1
    shapes = [em.graph.shape(call.input(n)) for n in "QKV"]
    # 4-D, or BSND's 3-D [B, S, heads * D] (K and V both over Nkv heads: their last dims compare)
    if any(s is None or len(s) not in (3, 4) or (len(s) == 3 and a["layout"] == "BNSD") for s in shapes) or \
            len(shapes[1]) != len(shapes[2]):
        return False
    return dims_equal(shapes[0][seq], shapes[1][seq]) and dims_equal(shapes[1][-1], shapes[2][-1])


def _own_causal(call: FusedCall) -> bool:
    """Only a causal (or window) mask: GroupQueryAttention's own ``causal = 1`` and
    ``local_window_size = window`` (ORT 1.32's CPU kernel keeps ``local_window_size`` keys up to the
    query's own, measured: tests/fusions/test_contrib_gqa.py) compute it with queries as long as
    the keys."""
    a = call.attributes
    return bool(a["causal"]) and not any(call.input(n) for n in ("attn_bias", "key_padding_mask", "alibi_slopes"))


def _group_query(em: Emitter, call: FusedCall, q3: str, k4: str, v4: str, mask: str, scale, causal: int = 0,
                 local_window_size: int = -1) -> str:
    """``seqlens_k`` = S - 1 for every batch row and ``total_sequence_length`` = S: no padding as
    GroupQueryAttention sees it (padding is in ``attention_bias``, as every other mask, unless the
    only mask is causal: then the op's own)."""
    a = call.attributes
    keys = em.dim_range(k4, 2, 3)
    int32 = onnx.TensorProto.INT32
    lengths = em.op1("Expand", [em.cast(em.op1("Sub", [keys, em.ints([1])]), int32), em.dim_range(q3, 0, 1)])
    total = em.cast(em.op1("Squeeze", [keys, em.ints([0])]), int32)
    inputs = [q3, _merged_heads(em, k4), _merged_heads(em, v4), "", "", lengths, total, "", "", "", mask,
              _head_sink(em, call)]
    while not inputs[-1]:
        inputs.pop()
    y = em.op1("GroupQueryAttention", inputs, domain=MS_DOMAIN, opset=1,
               num_heads=a["num_heads"], kv_num_heads=a["kv_num_heads"], causal=causal, scale=scale,
               local_window_size=local_window_size if local_window_size > 0 else None,
               softcap=float(a["softcap"]) if a["softcap"] else None)
    return y


def _head_sink(em: Emitter, call: FusedCall) -> str:
    """``sinks`` as GroupQueryAttention's ``head_sink`` ``[N]`` in the attention's type, or "": as is
    for float32; for float16 / bfloat16 a constant whose values that type holds exactly (otfuse's
    op reads the float32 sink: a rounded one would be another model)."""
    sinks = call.input("sinks")
    elem_type = em.graph.elem_type(call.input("Q"))
    if not sinks or elem_type == onnx.TensorProto.FLOAT:
        return sinks or ""
    value = em.graph.constant_value(sinks) if em.graph.is_constant(sinks) else None
    np_type = onnx.helper.tensor_dtype_to_np_dtype(elem_type)
    narrowed = None if value is None else np.asarray(value).astype(np_type)
    if narrowed is None or not np.array_equal(narrowed.astype(np.float32), np.asarray(value, np.float32)):
        raise CannotExpress(f"attention sinks that are not constants exact in {type_name(elem_type)} "
                            f"(GroupQueryAttention's head_sink is in the attention's type)")
    return em.constant(narrowed)


def _rotation_call(call: FusedCall) -> FusedCall:
    a = call.attributes
    return FusedCall("RotaryEmbedding", {"cos": call.input("cos"), "sin": call.input("sin")}, {},
                     {"mode": a["rotary_mode"], "rotary_dim": a["rotary_dim"], "sections": a["rotary_sections"]},
                     call.node)


def _plain(target: str):
    def emit(em: Emitter, call: FusedCall) -> None:
        _attend(em, call, call.input("Q"), call.input("K"), target)
    return emit


def _with_rope(target: str):
    def emit(em: Emitter, call: FusedCall) -> None:
        rotation = _rotation_call(call)
        q = rope.rotate(em, rotation, call.input("Q"), target)
        k = rope.rotate(em, rotation, call.input("K"), target)
        _attend(em, call, q, k, target)
    return emit


ORT = {"Attention": _plain("ort"), "RopeAttention": _with_rope("ort")}
ONNX = {"Attention": _plain("onnx"), "RopeAttention": _with_rope("onnx")}
