"""Fuzz cases of the attention family: Attention, RopeAttention (docs/ops.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from cpu_isa import cpu_isas

from otfuse.verify import reference

from .case import (BF16, BOOL, F16, F32, F64, FLOAT_TYPES, I32, I64, INT64_MAX, MISSING_INPUT, TYPE_MISMATCH,
                   X_TYPE_ERROR, Case, Empty, ShapeOnly, chance, environment, other_float, pick, values)
from .rotary import ASCEND_FORM_REFUSAL, split_even

OPS = ("Attention", "RopeAttention")
CPU_KINDS = ("decode_splits",)  # beside valid / invalid (tests/kernels/test_fuzz.py)
ATTENTION_INPUTS = ["Q", "K", "V", "attn_bias", "key_padding_mask", "past_key", "past_value", "alibi_slopes", "sinks"]
ROPE_INPUTS = ["Q", "K", "V", "cos", "sin", "attn_bias", "key_padding_mask", "past_key", "past_value", "alibi_slopes",
               "sinks"]
# The Ascend kernel refuses any sinks input (docs/ops.md, "Ascend mapping").
ASCEND_NO_SINKS = r"attention sinks are not mapped"
TILES = ["16x16", "5x32", "1x16", "7x48", "64x128", "3x16"]
# Key tiles of 16 with at least 8 of them (2 x kMinSplitTiles, kernels/cpu/attention.cc): a few query
# rows then take the decode key splits (flash decoding), which the other draws, at most 110 keys over
# tiles of 16+, never reach. The sinks counted once per split went unseen that way (8cc2a74).
SPLIT_TILES = ["1x16", "2x16", "3x16", "16x16"]


@dataclass
class Draw:
    """One random node: its dims, attributes and inputs (by name), before it becomes a Case."""

    op: str
    t: np.dtype
    b: int
    n: int
    nkv: int
    sq: int
    s_new: int
    past: int | None
    d: int
    dv: int
    layout: str
    rank3: bool
    attrs: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    omit: frozenset = frozenset()
    env: dict = field(default_factory=dict)
    threads: int = 1

    @property
    def skv(self) -> int:
        return (self.past or 0) + self.s_new

    def heads_shape(self, heads: int, s: int, d: int) -> list[int]:
        if self.layout == "BNSD":
            return [self.b, heads, s, d]
        return [self.b, s, heads * d] if self.rank3 else [self.b, s, heads, d]

    def case(self, expected=None, **kw) -> Case:
        names = ROPE_INPUTS if self.op == "RopeAttention" else ATTENTION_INPUTS
        return Case(self.op, [self.inputs.get(name) for name in names], self.attrs, 3, self.omit, expected,
                    env=self.env, threads=self.threads, **kw)


def _window(rng: np.random.Generator, skv: int) -> int:
    return int(pick(rng, [1, 2, 3, int(rng.integers(1, skv + 4)), 2**62, INT64_MAX]))


def _attributes(rng: np.random.Generator, w: Draw, ascend: bool) -> None:
    a = w.attrs
    a["num_heads"] = w.n
    if w.nkv != w.n or chance(rng, 0.5):
        a["kv_num_heads"] = w.nkv
    if w.layout != "BNSD" or chance(rng, 0.3):
        a["layout"] = w.layout
    if chance(rng, 0.4):
        a["output_layout"] = pick(rng, ["BNSD", "BSND"])
    if chance(rng, 0.5):
        a["causal"] = 1
        if chance(rng, 0.4):
            a["window"] = _window(rng, w.skv)
    if not ascend and chance(rng, 0.2):
        a["softcap"] = float(pick(rng, [0.5, 5.0, 30.0]))
    if chance(rng, 0.3):
        a["scale"] = float(pick(rng, [0.1, 0.5, 2.0, -0.3]))
    if chance(rng, 0.3):
        a["empty_rows"] = pick(rng, ["uniform", "zero"])
    if w.op == "RopeAttention":
        if chance(rng, 0.5):
            a["rotary_mode"] = pick(rng, ["half", "interleaved"])
        if w.d % 2 or chance(rng, 0.3):
            a["rotary_dim"] = 2 * int(rng.integers(1, w.d // 2 + 1))
        r = a.get("rotary_dim") or w.d
        if chance(rng, 0.3):
            a["rotary_sections"] = split_even(rng, r)


def _cos_shape(rng: np.random.Generator, w: Draw, r: int) -> list[int]:
    """A cos/sin shape broadcastable to both Q's and K's rank-4 view in the layout."""
    if w.layout == "BNSD":
        q, k = [w.b, w.n, w.sq], [w.b, w.nkv, w.s_new]
    else:
        q, k = [w.b, w.sq, w.n], [w.b, w.s_new, w.nkv]
    shape = [qd if qd == kd and chance(rng, 0.7) else 1 for qd, kd in zip(q, k)] + [r]
    while len(shape) > 1 and shape[0] == 1 and chance(rng, 0.4):
        shape.pop(0)
    return shape


def _sinks(rng: np.random.Generator, n: int) -> np.ndarray:
    """One logit per head, a few units of either sign, sometimes -inf (that head has no sink)."""
    sinks = (rng.standard_normal(n) * 3).astype(F32)
    if chance(rng, 0.2):
        sinks[rng.random(n) < 0.5] = -np.inf
    return sinks


def _inputs(rng: np.random.Generator, w: Draw, ascend: bool = False) -> None:
    t, x = w.t, w.inputs
    x["Q"] = values(rng, w.heads_shape(w.n, w.sq, w.d), t)
    x["K"] = values(rng, w.heads_shape(w.nkv, w.s_new, w.d), t)
    x["V"] = values(rng, w.heads_shape(w.nkv, w.s_new, w.dv), t)
    if w.past is not None:
        x["past_key"] = values(rng, [w.b, w.nkv, w.past, w.d], t)
        x["past_value"] = values(rng, [w.b, w.nkv, w.past, w.dv], t)
    if chance(rng, 0.4):
        full = [w.b, w.n, w.sq, w.skv]
        rank = int(rng.integers(0, 5))
        shape = [dim if chance(rng, 0.5) else 1 for dim in full[4 - rank:]]
        bias = values(rng, shape, pick(rng, [t, F32]))
        if chance(rng, 0.3):
            bias[rng.random(shape) < 0.3] = -np.inf
        x["attn_bias"] = bias
    if chance(rng, 0.3):
        dtype = pick(rng, [BOOL, I32, I64])
        keep = rng.random((w.b, w.skv)) < 0.7
        x["key_padding_mask"] = keep if dtype == BOOL else (keep * pick(rng, [1, 3])).astype(dtype)
    if w.op == "RopeAttention":
        r = w.attrs.get("rotary_dim") or w.d
        shape = _cos_shape(rng, w, r)
        c_type = pick(rng, [t, F32])
        x["cos"], x["sin"] = values(rng, shape, c_type), values(rng, shape, c_type)
    if not ascend and chance(rng, 0.25):
        x["sinks"] = _sinks(rng, w.n)


def draw(rng: np.random.Generator, op: str, backend: str, splits: bool = False) -> Draw:
    ascend = backend == "ascend"
    nkv = int(pick(rng, [1, 2, 3]))
    n = nkv * int(pick(rng, [1, 2, 3, 4]))
    sq = 0 if chance(rng, 0.04) else int(pick(rng, [1, 1, 2, 3, 5, 8, 13, 20, 33, 64, 70]))
    s_new = sq if chance(rng, 0.6) else int(pick(rng, [0, 1, 2, 5, 9, 17, 40, 70]))
    past = int(pick(rng, [0, 1, 3, 8, 20, 40])) if chance(rng, 0.4) else None
    splits = splits or (not ascend and chance(rng, 0.15))
    if splits:  # decoding over a long past: the key splits, with any attribute or input drawn below
        sq = int(pick(rng, [1, 1, 2, 3]))
        s_new = sq if chance(rng, 0.6) else int(pick(rng, [0, 1, 2]))
        past = int(rng.integers(8 * 16, 40 * 16))
    if ascend:  # aclnnFusedInferAttentionScoreV3: Dv = D, 16-byte aligned (docs/ops.md refusals)
        d = dv = int(pick(rng, [8, 16, 24, 32, 64]))
    else:
        d = int(pick(rng, [2, 4, 6, 8, 16, 18, 32, 64] + ([] if op == "RopeAttention" else [0, 1, 3, 17])))
        dv = d if chance(rng, 0.6) else int(pick(rng, [0, 1, 3, 8, 16, 20]))
    layout = pick(rng, ["BNSD", "BSND"])
    w = Draw(op, pick(rng, [F16, BF16, F16, BF16, F32] if ascend else FLOAT_TYPES),
             0 if chance(rng, 0.04) else int(rng.integers(1, 4)), n, nkv, sq, s_new, past, d, dv, layout,
             layout == "BSND" and chance(rng, 0.3))
    _attributes(rng, w, ascend)
    _inputs(rng, w, ascend)
    w.omit = frozenset(i for i in (1, 2) if chance(rng, 0.5))
    w.env = environment(rng)
    if splits:
        w.env["OTFUSE_ATTENTION_TILES"] = pick(rng, SPLIT_TILES)
        if chance(rng, 0.3):
            w.env["OTFUSE_ATTENTION_PATH"] = "direct"
    else:
        if chance(rng, 0.5):
            w.env["OTFUSE_ATTENTION_TILES"] = pick(rng, TILES)
        if chance(rng, 0.4):
            w.env["OTFUSE_ATTENTION_PATH"] = pick(rng, ["direct", "packed"])
    if not ascend and "OTFUSE_CPU_ISA" not in w.env and chance(rng, 0.3) and "avx2" in cpu_isas():
        # Each tile variant the CPU runs, whichever the dispatch prefers: the AVX2 tiles on an AVX-512
        # CPU (no CPUID faulting needed), the AVX-512 ones where 256-bit units make AVX2 the default.
        w.env["OTFUSE_ATTENTION_ISA"] = pick(rng, [isa for isa in ("avx2", "avx512") if isa in cpu_isas()])
    if chance(rng, 0.15):  # the packing phase before the tasks instead of lazy packing
        w.env["OTFUSE_ATTENTION_PACK"] = "phase"
    w.threads = int(rng.integers(1, 3))
    return w


def expected(w: Draw, backend: str = "cpu") -> list[np.ndarray]:
    names = ROPE_INPUTS if w.op == "RopeAttention" else ATTENTION_INPUTS
    fn = reference.rope_attention if w.op == "RopeAttention" else reference.attention
    kw = dict(w.attrs)
    kw.setdefault("layout", w.layout)
    inputs = dict(w.inputs)
    if backend == "ascend" and w.t != F32:
        # The Ascend kernel casts float32 cos/sin to T before rotating (docs/ops.md, RotaryEmbedding
        # on Ascend). A large scale makes the softmax sharp enough that this rounding alone moves an
        # output past the tolerance (case ascend-RopeAttention-valid-84 at 150 cases: 0.055).
        for name in ("cos", "sin"):
            if inputs.get(name) is not None and inputs[name].dtype == F32:
                inputs[name] = inputs[name].astype(w.t)
    outputs = fn(*[inputs.get(name) for name in names], **kw)
    return [o for i, o in enumerate(outputs) if i not in w.omit]


def _huge_batchless(w: Draw) -> Case:
    """Zero batch, long sequences: every output is empty, and no dim product overflows."""
    w.layout, w.rank3, w.attrs = "BNSD", False, {"num_heads": w.n, "kv_num_heads": w.nkv, "causal": 1}
    s = 2**30
    w.inputs = {"Q": Empty((0, w.n, s, 8), w.t), "K": Empty((0, w.nkv, s, 8), w.t), "V": Empty((0, w.nkv, s, 8), w.t),
                "past_key": Empty((0, w.nkv, 2 * s, 8), w.t), "past_value": Empty((0, w.nkv, 2 * s, 8), w.t)}
    shapes = [(0, w.n, s, 8), (0, w.nkv, 3 * s, 8), (0, w.nkv, 3 * s, 8)]
    return w.case([ShapeOnly(shape) for i, shape in enumerate(shapes) if i not in w.omit],
                  note="valid: zero batch, 2**30 positions")


def _long_window(rng: np.random.Generator, w: Draw) -> Case:
    """Sq = S > 1024, a window about as long, and key_padding_mask: the Ascend kernel then builds the
    mask from views of its 2048 x 2048 causal mask, which must stay inside it."""
    s = int(rng.integers(1030, 1100))
    w.b = w.n = w.nkv = 1
    w.sq, w.s_new, w.past, w.d, w.dv, w.layout, w.rank3 = s, s, None, 8, 8, "BNSD", False
    w.attrs = {"num_heads": 1, "causal": 1, "window": int(rng.integers(s - 40, s + 1))}
    w.inputs = {name: values(rng, [1, 1, s, 8], w.t) for name in ("Q", "K", "V")}
    w.inputs["key_padding_mask"] = rng.random((1, s)) < 0.9
    w.omit = frozenset({1, 2})
    return w.case(expected(w), note=f"valid: Sq = S = {s}, window {w.attrs['window']}, key_padding_mask")


def valid(rng: np.random.Generator, op: str, backend: str) -> Case:
    w = draw(rng, op, backend)
    if op == "Attention" and chance(rng, 0.05):
        return _huge_batchless(w)
    if op == "Attention" and chance(rng, 0.05):
        return _long_window(rng, w)
    may_refuse = ASCEND_FORM_REFUSAL if backend == "ascend" and op == "RopeAttention" else None
    return w.case(expected(w, backend), may_refuse=may_refuse,
                  note=f"valid {w.layout}{' rank 3' if w.rank3 else ''} B {w.b} N {w.n}/{w.nkv} Sq {w.sq} "
                       f"S {w.s_new} P {w.past} D {w.d}/{w.dv} {w.t.name}")


def decode_splits(rng: np.random.Generator, op: str, backend: str) -> Case:
    """A valid CPU case that always takes the decode key splits, with every other draw as random as in
    `valid`: kernel paths that the random draws reach rarely get cases of their own in every run."""
    w = draw(rng, op, backend, splits=True)
    return w.case(expected(w, backend), note=f"decode key splits {w.layout} B {w.b} N {w.n}/{w.nkv} Sq {w.sq} "
                                             f"S {w.s_new} P {w.past} D {w.d}/{w.dv} {w.t.name}")


def _mutate_shapes(rng: np.random.Generator, w: Draw, mutation: str) -> str:
    """Q/K/V/past dims that do not fit together; returns the error regex."""
    x = w.inputs
    if mutation == "q_rank":
        x["Q"] = values(rng, pick(rng, [[w.b, w.sq], [w.b, w.n, w.sq, w.d, 1]]), w.t)
        return r"Q has shape .* needs rank"
    if mutation in ("q_heads", "k_heads"):  # rank 4 ([B, S, N*D] with other heads is another D: rank3_not_multiple)
        w.rank3 = False
        x["Q"] = values(rng, w.heads_shape(w.n, w.sq, w.d), w.t)
        x["K"] = values(rng, w.heads_shape(w.nkv, w.s_new, w.d), w.t)
        x["V"] = values(rng, w.heads_shape(w.nkv, w.s_new, w.dv), w.t)
    if mutation == "q_heads":
        w.attrs["num_heads"] = 2 * w.n
        w.attrs["kv_num_heads"] = w.nkv
        return r"Q has shape .*heads in layout .* but num_heads|is not a multiple of num_heads"
    if mutation == "k_heads":
        x["K"] = values(rng, w.heads_shape(w.nkv + 1, w.s_new, w.d), w.t)
        return r"K has shape .*(heads in layout .* but kv_num_heads|is not a multiple of kv_num_heads)"
    if mutation == "k_d":
        x["K"] = values(rng, w.heads_shape(w.nkv, w.s_new, w.d + 2), w.t)
        return r"K's head size D = \d+ differs from Q's"
    if mutation == "v_seq":
        x["V"] = values(rng, w.heads_shape(w.nkv, w.s_new + 1, w.dv), w.t)
        return r"V has \d+ positions but K has"
    if mutation == "batch":
        w.b += 1
        x["K"] = values(rng, w.heads_shape(w.nkv, w.s_new, w.d), w.t)
        return r"batch sizes differ"
    if mutation == "rank3_bnsd":
        w.attrs["layout"] = "BNSD"
        x["Q"] = values(rng, [w.b, w.sq, w.n * w.d], w.t)
        return r"Q has shape .* but layout BNSD needs rank 4"
    if mutation == "past_only":
        x[pick(rng, ["past_key", "past_value"])] = None
        x["past_key"] = x.get("past_key")
        if x["past_key"] is None and x.get("past_value") is None:
            x["past_key"] = values(rng, [w.b, w.nkv, 2, w.d], w.t)
        return r"past_key and past_value must be given together"
    if mutation == "past_rank":
        x["past_key"] = values(rng, [w.b, w.nkv, 2], w.t)
        x["past_value"] = values(rng, [w.b, w.nkv, 2, w.dv], w.t)
        return r"past_key has shape .* expected rank 4"
    if mutation == "past_value_shape":
        x["past_key"] = values(rng, [w.b, w.nkv, 2, w.d], w.t)
        x["past_value"] = values(rng, [w.b, w.nkv, 3, w.dv], w.t)
        return r"past_value has shape"
    raise AssertionError(mutation)


def _mutate_extras(rng: np.random.Generator, w: Draw, mutation: str) -> str:
    """attn_bias, key_padding_mask and the RoPE tables; returns the error regex."""
    x, full = w.inputs, [w.b, w.n, w.sq, w.skv]
    if mutation == "bias_rank5":
        x["attn_bias"] = values(rng, [1] * 5, F32)
        return r"attn_bias has shape .*not broadcastable"
    if mutation == "bias_dim":
        j = int(rng.integers(4))
        shape = [1] * 4
        shape[j] = full[j] + 1 if full[j] > 1 else 2  # neither the dim nor 1 (an empty dim: 1 would broadcast)
        x["attn_bias"] = values(rng, shape, F32)
        return r"attn_bias has shape .*not broadcastable"
    if mutation == "bias_dtype":
        x["attn_bias"] = values(rng, [1, 1, 1, w.skv], pick(rng, [I64, F64, other_float(rng, w.t)]))
        return r"attn_bias has element type"
    if mutation == "mask_shape":
        x["key_padding_mask"] = np.ones(pick(rng, [[w.b, w.skv + 1], [w.skv], [w.b, 1, w.skv]]), bool)
        return r"key_padding_mask has shape"
    if mutation == "sinks_shape":
        x["sinks"] = _sinks(rng, w.n + 1)
        return r"sinks has shape|" + ASCEND_NO_SINKS
    if mutation == "sinks_value":
        x["sinks"] = _sinks(rng, w.n)
        x["sinks"][int(rng.integers(w.n))] = pick(rng, [np.nan, np.inf])
        return r"sinks\[\d+\] = .*expected a finite number or -inf|" + ASCEND_NO_SINKS
    if mutation == "sinks_on_ascend":  # valid sinks: refused by the Ascend kernel only
        x["sinks"] = _sinks(rng, w.n)
        return ASCEND_NO_SINKS
    if mutation == "mask_dtype":
        x["key_padding_mask"] = np.ones([w.b, w.skv], pick(rng, [F32, np.int8, F16]))
        return r"key_padding_mask has element type"
    r = w.attrs.get("rotary_dim") or w.d
    if mutation == "cos_last":  # 1: broadcastable, but the contract wants exactly r lanes
        x["cos"] = values(rng, [pick(rng, [r + 2, 1])], F32)
        x["sin"] = values(rng, x["cos"].shape, F32)
        return r"cos has shape .* but its last dim must be r"
    if mutation == "cos_dim":
        x["cos"] = values(rng, [w.b + 1 if w.b else 2, 1, 1, r], F32)
        x["sin"] = values(rng, x["cos"].shape, F32)
        return r"cos has shape .*, which does not broadcast to Q\.shape\[:-1\] \+ \[r\]"
    if mutation == "sin_shape":
        x["sin"] = values(rng, [2] + list(x["cos"].shape), x["cos"].dtype)
        return r"sin has shape .* but must equal cos\.shape"
    if mutation == "cos_dtype":
        x["cos"] = x["cos"].astype(pick(rng, [I64, F64, other_float(rng, w.t)]))
        x["sin"] = x["sin"].astype(x["cos"].dtype)
        return r"cos has element type"
    raise AssertionError(mutation)


ATTRIBUTE_MUTATIONS = {
    "num_heads_missing": ({"num_heads": None}, r"attribute 'num_heads' is required"),
    "num_heads_zero": ({"num_heads": 0}, r"num_heads and kv_num_heads must be >= 1"),
    "kv_heads_negative": ({"kv_num_heads": -1}, r"num_heads and kv_num_heads must be >= 1"),
    "num_heads_float": ({"num_heads": 2.0}, r"attribute 'num_heads' must be an int"),
    "num_heads_huge": ({"num_heads": 2**62, "kv_num_heads": 1},
                       r"heads in layout .* but num_heads|is not a multiple of num_heads|at most 256 query heads"
                       r"|num_heads \* Dv = .* overflows int64"),  # rank-3 Q of hidden 0: D = 0 fits any num_heads
    "window_no_causal": ({"causal": 0, "window": 4}, r"attribute 'window' > 0 needs causal = 1"),
    "window_negative": ({"causal": 1, "window": -1}, r"attribute 'window' must be >= 0"),
    "causal_two": ({"causal": 2}, r"attribute 'causal' must be 0 or 1"),
    "scale_nan": ({"scale": float("nan")}, r"attribute 'scale' must be finite"),
    "scale_inf": ({"scale": float("inf")}, r"attribute 'scale' must be finite"),
    "softcap_negative": ({"softcap": -1.0}, r"attribute 'softcap' must be a finite number >= 0"),
    "softcap_inf": ({"softcap": float("inf")}, r"attribute 'softcap' must be a finite number >= 0"),
    "layout": ({"layout": "BSDN"}, r"attribute 'layout' must be \"BNSD\" or \"BSND\""),
    "output_layout": ({"output_layout": "bnsd"}, r"attribute 'output_layout' must be \"BNSD\" or \"BSND\""),
    "layout_int": ({"layout": 1}, r"attribute 'layout' must be a string"),
    "empty_rows": ({"empty_rows": "mean"}, r"attribute 'empty_rows' must be \"zero\" or \"uniform\""),
}
ROPE_ATTRIBUTE_MUTATIONS = {
    "rotary_mode": ({"rotary_mode": "full"}, r"attribute 'rotary_mode' must be \"half\" or \"interleaved\""),
    "rotary_dim_odd": ({"rotary_dim": 3}, r"attribute 'rotary_dim' must be even and >= 0"),
    "rotary_dim_large": ({"rotary_dim": 2**62, "rotary_sections": None},
                         r"rotary_dim (= )?\d+ (must be even and <= the head size|is larger than)"),
    "rotary_sections_odd": ({"rotary_sections": [1, 1]}, r"attribute 'rotary_sections' .*must hold even widths"),
    "rotary_sections_sum": ({"rotary_dim": 2, "rotary_sections": [2, 2]}, r"attribute 'rotary_sections' .*sums to"),
    "rotary_sections_overflow": ({"rotary_dim": None, "rotary_sections": [2**62] * 4},
                                 r"attribute 'rotary_sections' sum overflows int64"),
}
SHAPE_MUTATIONS = ("q_rank", "q_heads", "k_heads", "k_d", "v_seq", "batch", "rank3_bnsd", "past_only", "past_rank",
                   "past_value_shape")
EXTRA_MUTATIONS = ("bias_rank5", "bias_dim", "bias_dtype", "mask_shape", "mask_dtype", "sinks_shape", "sinks_value")
ROPE_EXTRA_MUTATIONS = ("cos_last", "cos_dim", "sin_shape", "cos_dtype")


def _overflowing(w: Draw, mutation: str) -> Case:
    """Empty inputs whose dims (or Y's) overflow int64 as strides."""
    w.layout, w.rank3 = "BNSD", False
    w.attrs = {"num_heads": w.n, "kv_num_heads": w.nkv}
    if w.op == "RopeAttention":
        w.inputs.update(cos=np.ones(8, np.float32), sin=np.ones(8, np.float32))
    if mutation == "huge_q":
        w.inputs.update(Q=Empty((0, w.n, 2**40, 2**40), w.t), K=Empty((0, w.nkv, 3, 2**40), w.t),
                        V=Empty((0, w.nkv, 3, 8), w.t))
    else:  # Y = [0, N, Sq, Dv] from Q's Sq and V's Dv: 2**20 * 2**20 * 2**40 positions
        w.attrs["num_heads"] = w.nkv = w.n = 2**20
        w.attrs["kv_num_heads"] = 1
        w.inputs.update(Q=Empty((0, 2**20, 2**20, 8), w.t), K=Empty((0, 1, 1, 8), w.t),
                        V=Empty((0, 1, 1, 2**40), w.t))
    for name in ("attn_bias", "key_padding_mask", "past_key", "past_value", "sinks"):
        w.inputs.pop(name, None)
    return w.case(error=r"overflow int64|at most 256 query heads", note=f"invalid: {mutation}")


def invalid(rng: np.random.Generator, op: str, backend: str) -> Case:
    w = draw(rng, op, backend)
    rope = op == "RopeAttention"
    attribute_mutations = dict(ATTRIBUTE_MUTATIONS, **(ROPE_ATTRIBUTE_MUTATIONS if rope else {}))
    mutations = (list(SHAPE_MUTATIONS) + list(EXTRA_MUTATIONS) + list(attribute_mutations)
                 + (list(ROPE_EXTRA_MUTATIONS) if rope else []) + ["q_dtype", "k_dtype", "missing_v", "huge_q",
                                                                   "huge_y"])
    if w.layout == "BSND" and w.n > 1:
        mutations.append("rank3_not_multiple")
    mutations.append("sinks_dtype")
    if backend == "ascend" and w.t != F32:  # float32 nodes run on the CPU kernel by default
        mutations.append("sinks_on_ascend")
    mutation = pick(rng, mutations)
    by_ort = False
    if mutation in attribute_mutations:
        changes, error = attribute_mutations[mutation]
        for name, value in changes.items():
            if value is None:
                w.attrs.pop(name, None)
            else:
                w.attrs[name] = value
        if backend == "ascend" and mutation.startswith("softcap"):
            error += r"|has no logit soft-capping"
    elif mutation in SHAPE_MUTATIONS:
        error = _mutate_shapes(rng, w, mutation)
    elif mutation in EXTRA_MUTATIONS + ROPE_EXTRA_MUTATIONS + ("sinks_on_ascend",):
        error = _mutate_extras(rng, w, mutation)
    elif mutation == "rank3_not_multiple":
        w.attrs["layout"] = "BSND"
        w.inputs["Q"] = values(rng, [w.b, w.sq, w.n * w.d + 1], w.t)
        error = r"Q has shape .* is not a multiple of num_heads"
    elif mutation in ("huge_q", "huge_y"):
        return _overflowing(w, mutation)
    elif mutation == "q_dtype":
        for name in ("Q", "K", "V", "past_key", "past_value"):
            if w.inputs.get(name) is not None:
                w.inputs[name] = w.inputs[name].astype(F64)
        error, by_ort = X_TYPE_ERROR, True
    elif mutation == "sinks_dtype":  # float32 only in the schema: ORT refuses the model itself
        w.inputs["sinks"] = _sinks(rng, w.n).astype(pick(rng, [F16, F64]))
        error, by_ort = r"Type 'tensor\(\w+\)' of input parameter \(in(8|10)\)", True
    elif mutation == "k_dtype":
        w.inputs["K"] = w.inputs["K"].astype(pick(rng, [t for t in (F16, F32, BF16) if t != w.t]))
        error, by_ort = TYPE_MISMATCH, True
    else:  # missing_v
        w.inputs["V"] = None
        error, by_ort = MISSING_INPUT, True
    return w.case(error=error, by_ort=by_ort, note=f"invalid: {mutation}")
