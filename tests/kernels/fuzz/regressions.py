"""One fixed case per defect the fuzz cases and the sanitizers found, by name (tests/kernels/test_fuzz.py
runs each on the backends named). Before the fix each was undefined behaviour, a read out of bounds
or a wrong result; now each is an error naming the problem, or the reference's result."""

from __future__ import annotations

import numpy as np

from otfuse.verify import reference

from .attention import Draw, expected
from .case import BOOL, F16, F32, INT64_MAX, Case, Empty

HUGE_EMPTY = (0, 2**40, 2**40, 4)  # zero elements, but 2**40 * 2**40 * 4 overflows as a stride


def _rng(name: str) -> np.random.Generator:
    return np.random.default_rng(sum(map(ord, name)))


def norm_strides_overflow() -> Case:
    return Case("RMSNorm", [Empty((0, 2**62, 4), F32), np.ones(4, np.float32)], {}, 1, error=r"overflow int64")


def rotary_strides_overflow() -> Case:
    # PlanRows multiplied X's row strides 4 * 2**40 * 2**40 (signed overflow) before any check.
    return Case("RotaryEmbedding", [Empty(HUGE_EMPTY, F32), np.ones(4, np.float32), np.ones(4, np.float32)], {}, 1,
                error=r"overflow int64")


def attention_strides_overflow() -> Case:
    # The BNSD strides of Q, N * Sq * D = 2**80, overflowed before the batch of 0 was seen.
    q = Empty((0, 1, 2**40, 2**40), F16)
    return Case("Attention", [q, Empty((0, 1, 3, 2**40), F16), Empty((0, 1, 3, 8), F16)], {"num_heads": 1}, 3,
                error=r"overflow int64")


def attention_output_overflow() -> Case:
    # Y = [0, N, Sq, Dv] takes Sq from Q and Dv from V: Y's strides (N * Sq * Dv) overflowed.
    q, k, v = Empty((0, 256, 2**30, 8), F16), Empty((0, 4, 1, 8), F16), Empty((0, 4, 1, 2**40), F16)
    return Case("Attention", [q, k, v], {"num_heads": 256, "kv_num_heads": 4}, 3,
                error=r"output Y: the dims of shape \[0, 256, 1073741824, 1099511627776\] overflow int64")


def attention_positions_overflow() -> Case:
    # Skv = P + S = 2**63: the Ascend kernel added them unchecked.
    past = Empty((0, 1, 2**62, 1), F16)
    return Case("Attention", [past, past, past, None, None, past, past], {"num_heads": 1}, 3,
                error=r"past \+ new sequence length overflows")


def rotary_sections_overflow() -> Case:
    # The Ascend kernels (and RopeAttention on CPU) summed the widths unchecked: 4 * 2**62 wraps to 0.
    x = np.ones((2, 4), np.float32)
    return Case("RotaryEmbedding", [x, np.ones(4, np.float32), np.ones(4, np.float32)], {"sections": [2**62] * 4}, 1,
                error=r"attribute 'sections' sum overflows int64")


def rope_attention_sections_overflow() -> Case:
    w = _small("RopeAttention")
    w.attrs["rotary_sections"] = [2**62] * 4
    return w.case(error=r"attribute 'rotary_sections' sum overflows int64")


def _small(op: str) -> Draw:
    rng = _rng(op)
    w = Draw(op, F16, 1, 2, 2, 4, 2, None, 8, 8, "BNSD", False, {"num_heads": 2})
    w.inputs = {name: rng.standard_normal(shape).astype(np.float16) for name, shape in
                (("Q", (1, 2, 4, 8)), ("K", (1, 2, 2, 8)), ("V", (1, 2, 2, 8)))}
    if op == "RopeAttention":
        w.inputs["cos"] = w.inputs["sin"] = np.ones((1, 8), np.float16)
    return w


def attention_huge_window() -> Case:
    # window = INT64_MAX with Sq > Skv: causal_offset - window + 1 overflowed (CPU first key, Ascend
    # mask views and empty-row scan). Now the window is capped at Skv: the same mask.
    w = _small("Attention")
    w.attrs.update(causal=1, window=INT64_MAX, empty_rows="uniform")
    w.inputs["key_padding_mask"] = np.array([[True, False]])
    w.omit = frozenset({1, 2})
    return w.case(expected(w))


def attention_long_window_mask() -> Case:
    # Sq = S = 1100, window 1100, key_padding_mask: the Ascend kernel's window view started 1099 rows
    # into the 2048 x 2048 causal mask and read ~150 rows past its end (ASan, in the double).
    rng = _rng("long window")
    w = Draw("Attention", F16, 1, 1, 1, 1100, 1100, None, 8, 8, "BNSD", False,
             {"num_heads": 1, "causal": 1, "window": 1100})
    w.inputs = {name: rng.standard_normal((1, 1, 1100, 8)).astype(np.float16) for name in ("Q", "K", "V")}
    w.inputs["key_padding_mask"] = (rng.random((1, 1100)) < 0.9).astype(BOOL)
    w.omit = frozenset({1, 2})
    return w.case(expected(w))


def attention_zero_head_size_past() -> Case:
    # D = 0 with a past: past_key has no elements and ORT gives it a null data pointer, which the CPU
    # kernel passed to memcpy (0 bytes, still undefined: UBSan nonnull-attribute).
    rng = _rng("zero D")
    w = Draw("Attention", F32, 1, 2, 1, 3, 4, 2, 0, 8, "BNSD", False, {"num_heads": 2, "kv_num_heads": 1})
    w.inputs = {"Q": np.zeros((1, 2, 3, 0), np.float32), "K": np.zeros((1, 1, 4, 0), np.float32),
                "V": rng.standard_normal((1, 1, 4, 8)).astype(np.float32),
                "past_key": np.zeros((1, 1, 2, 0), np.float32),
                "past_value": rng.standard_normal((1, 1, 2, 8)).astype(np.float32)}
    return w.case(expected(w), may_refuse=r"head size|D = 0|\(run this node on CPU\)")


def rotary_qk_cos_one_lane() -> Case:
    # D = 128 took aclnnApplyRotaryPosEmbV2, which broadcast a [.., 1] cos over the 128 lanes instead
    # of refusing it: a result where the contract says error.
    rng = _rng("qk")
    q, k = (rng.standard_normal(shape).astype(np.float16) for shape in ((1, 4, 2, 128), (1, 4, 1, 128)))
    cos = np.ones((1, 4, 1, 1), np.float16)
    return Case("RotaryEmbeddingQK", [q, k, cos, cos], {}, 2, error=r"cos has shape \[1, 4, 1, 1\] but its last dim "
                                                                    r"must be r = 128")


def rotary_qk_reference() -> Case:
    # The same inputs with a proper cos still take aclnnApplyRotaryPosEmbV2 and match.
    rng = _rng("qk ok")
    q, k = (rng.standard_normal(shape).astype(np.float16) for shape in ((1, 4, 2, 128), (1, 4, 1, 128)))
    cos, sin = (rng.standard_normal((1, 4, 1, 128)).astype(np.float16) for _ in range(2))
    return Case("RotaryEmbeddingQK", [q, k, cos, sin], {}, 2, expected=list(reference.rotary_embedding_qk(q, k, cos, sin)))


REGRESSIONS = {
    "norm_strides_overflow": norm_strides_overflow,
    "rotary_strides_overflow": rotary_strides_overflow,
    "attention_strides_overflow": attention_strides_overflow,
    "attention_output_overflow": attention_output_overflow,
    "attention_positions_overflow": attention_positions_overflow,
    "rotary_sections_overflow": rotary_sections_overflow,
    "rope_attention_sections_overflow": rope_attention_sections_overflow,
    "attention_huge_window": attention_huge_window,
    "attention_long_window_mask": attention_long_window_mask,
    "attention_zero_head_size_past": attention_zero_head_size_past,
    "rotary_qk_cos_one_lane": rotary_qk_cos_one_lane,
    "rotary_qk_reference": rotary_qk_reference,
}
