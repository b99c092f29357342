"""The Ascend (CANN) kernels of the rotary family (RotaryEmbedding, RotaryEmbeddingQK), end to end
inside ONNX Runtime sessions, against otfuse's CPU test double of the CANN runtime (tests/fake_cann)
— no NPU, no CANN.

As in tests/kernels/norm/test_ascend.py, the session config ``otfuse.ascend_ep.fake_mode=1`` makes
the library register its Ascend kernels under the CPU EP in place of the CPU kernels of the same op
and element type; the double implements the documented aclnn calls (aclnnRotaryPositionEmbedding,
aclnnApplyRotaryPosEmbV2, ...) on host memory, checks their arguments as the docs say CANN does, and
logs every call. Each op is diffed against the CPU kernel; the log shows how the node was mapped onto
the aclnn arguments. With attention (RopeAttention, the exported fixtures):
tests/kernels/attention/test_ascend.py.
"""

from __future__ import annotations

import kernels.rope.test_cpu as R
import numpy as np
import pytest
from kernels.ascend_sessions import APPLY, COPY, F16, F32, HALF, RPE, one_clean_call, rope, rope_vs_cpu, seeded


# cos/sin forms the aclnn doc lists (after otfuse's reshaping) and ones it reaches by merging dims.
ROPE_LAYOUTS = {name: R.LAYOUTS[name] for name in (
    "bnsd_cos_11sr", "bnsd_cos_b1sr", "bnsd_cos_sr", "bsnd_cos_bs1r", "bsnd_cos_1s1r", "odd_sizes", "rank2",
    "rank3_cos_r", "rank5", "decode_one_position", "many_tasks_bsnd")}
# interleave mode takes only 11SD / 1S1D cos: a cos that varies along B and S apart cannot be expressed
INTERLEAVE_REFUSED = {"bnsd_cos_b1sr"}


@pytest.mark.parametrize("layout", ROPE_LAYOUTS, ids=ROPE_LAYOUTS.keys())
@pytest.mark.parametrize("mode", R.MODES)
@pytest.mark.parametrize("dtype", R.DTYPES, ids=lambda d: d.name)
def test_rotary_embedding_matches_cpu(library, fake, dtype, mode, layout):
    x_shape, cos_shape = ROPE_LAYOUTS[layout]
    rng = seeded("rope", dtype.name, mode, layout)
    inputs = [R.random(rng, x_shape, dtype), *R.cos_sin(rng, cos_shape, dtype)]
    if mode == "interleaved" and layout in INTERLEAVE_REFUSED:
        with pytest.raises(Exception, match=r"aclnnRotaryPositionEmbedding cannot express cos/sin \[2, 1, 10, 16\] "
                                            r"broadcast over X \[2, 4, 10, 16\]: it takes cos/sin of the forms "
                                            r"11SD / 1S1D in interleaved mode"):
            rope(library, "RotaryEmbedding", inputs, {"mode": mode}, True)
        return
    rope_vs_cpu(library, "RotaryEmbedding", inputs, {"mode": mode})
    (call,) = one_clean_call(fake, RPE)
    assert call["mode"] == (1 if mode == "interleaved" else 0)
    assert len(call["x"]["shape"]) == 4 and call["x"] == call["out"] and call["cos"]["dtype"] == dtype.name


def test_rotary_reshapes_onto_a_documented_cos_form(library, fake):
    # BNSD x with an 11SD cos is taken as BSND with a 1S1D cos (B*N merged): the doc attaches
    # extra conditions to BNSD x only
    rng = seeded("form")
    x = R.random(rng, (2, 4, 10, 16), F16)
    rope_vs_cpu(library, "RotaryEmbedding", [x, *R.cos_sin(rng, (1, 1, 10, 16), F16)])
    (call,) = one_clean_call(fake, RPE)
    assert call["x"]["shape"] == [8, 10, 1, 16] and call["cos"]["shape"] == [1, 10, 1, 16]
    fake.clear()
    rope_vs_cpu(library, "RotaryEmbedding", [x, *R.cos_sin(rng, (2, 1, 10, 16), F16)])
    (call,) = one_clean_call(fake, RPE)
    assert call["x"]["shape"] == [2, 4, 10, 16] and call["cos"]["shape"] == [2, 1, 10, 16]  # B1SD


@pytest.mark.parametrize("mode", R.MODES)
@pytest.mark.parametrize("dtype", R.DTYPES, ids=lambda d: d.name)
def test_partial_rotary_uses_strided_views(library, fake, dtype, mode):
    rng = seeded("partial", dtype.name, mode)
    inputs = [R.random(rng, (2, 3, 7, 20), dtype), *R.cos_sin(rng, (1, 1, 7, 8), dtype)]
    rope_vs_cpu(library, "RotaryEmbedding", inputs, {"mode": mode, "rotary_dim": 8})
    (call,) = one_clean_call(fake, RPE)
    # x: the first 8 lanes of each 20-lane row, read in place; out: contiguous scratch
    assert call["x"]["shape"][-1] == 8 and call["x"]["strides"][-2:] == [20, 1]
    assert "strides" not in call["out"]
    copies = fake.calls(COPY + "GetWorkspaceSize")
    assert [c["selfRef"]["shape"][-1] for c in copies] == [8, 12]  # rotated lanes, pass-through lanes
    assert [c["selfRef"]["offset"] for c in copies] == [0, 8]


@pytest.mark.parametrize("dtype", R.DTYPES, ids=lambda d: d.name)
def test_sections_one_call_per_section(library, fake, dtype):
    rng = seeded("sections", dtype.name)
    inputs = [R.random(rng, (2, 4, 6, 16), dtype), *R.cos_sin(rng, (1, 1, 6, 16), dtype)]
    rope_vs_cpu(library, "RotaryEmbedding", inputs, {"sections": [4, 6, 6]})
    calls = one_clean_call(fake, RPE, 3)
    assert [c["x"]["shape"][-1] for c in calls] == [4, 6, 6]
    assert [c["cos"]["offset"] for c in calls] == [0, 4, 10]  # cos lanes of each section, in place
    assert all(c["mode"] == 0 for c in calls)


@pytest.mark.parametrize("dtype", HALF, ids=lambda d: d.name)
def test_float32_cos_is_cast_to_the_input_type(library, fake, dtype):
    # aclnnRotaryPositionEmbedding wants cos/sin of x's dtype: otfuse casts them first
    rng = seeded("castcos", dtype.name)
    inputs = [R.random(rng, (1, 4, 9, 32), dtype), *R.cos_sin(rng, (1, 1, 9, 32), F32)]
    rope_vs_cpu(library, "RotaryEmbedding", inputs)
    (call,) = one_clean_call(fake, RPE)
    assert call["cos"]["dtype"] == dtype.name
    casts = fake.calls(COPY + "GetWorkspaceSize")
    assert [(c["selfRef"]["dtype"], c["src"]["dtype"]) for c in casts] == [(dtype.name, "float32")] * 2


QK_V2 = {  # Q, K, cos shapes that aclnnApplyRotaryPosEmbV2 takes (D = 128), and its layout
    "bnsd": ((2, 8, 5, 128), (2, 2, 5, 128), (1, 1, 5, 128), 3),
    "bsnd": ((2, 5, 8, 128), (2, 5, 2, 128), (2, 5, 1, 128), 1),
    "bnsd_cos_per_batch": ((2, 4, 3, 128), (2, 4, 3, 128), (2, 1, 3, 128), 3),
}


@pytest.mark.parametrize("case", QK_V2, ids=QK_V2.keys())
@pytest.mark.parametrize("dtype", R.DTYPES, ids=lambda d: d.name)
def test_qk_apply_rotary_pos_emb_v2_in_place(library, fake, dtype, case):
    q_shape, k_shape, cos_shape, layout = QK_V2[case]
    rng = seeded("qk", dtype.name, case)
    inputs = [R.random(rng, q_shape, dtype), R.random(rng, k_shape, dtype), *R.cos_sin(rng, cos_shape, dtype)]
    rope_vs_cpu(library, "RotaryEmbeddingQK", inputs)
    (call,) = one_clean_call(fake, APPLY)
    assert call["layout"] == layout and call["rotaryMode"] == "half"
    assert call["queryRef"]["shape"] == list(q_shape) and call["keyRef"]["shape"] == list(k_shape)
    b = q_shape[0]
    assert call["cos"]["shape"] == ([b, 1, q_shape[2], 128] if layout == 3 else [b, q_shape[1], 1, 128])
    assert not fake.calls(RPE + "GetWorkspaceSize")
    # in place: Q and K are copied into the outputs first (then cos/sin broadcast over B if needed)
    copies = fake.calls(COPY + "GetWorkspaceSize")
    assert [c["selfRef"]["shape"] for c in copies[:2]] == [list(q_shape), list(k_shape)]


QK_FALLBACK = {  # not for aclnnApplyRotaryPosEmbV2: two aclnnRotaryPositionEmbedding calls
    "head_dim_64": ((1, 4, 5, 64), (1, 2, 5, 64), (1, 1, 5, 64), {}),
    "interleaved": ((1, 4, 5, 128), (1, 2, 5, 128), (1, 1, 5, 128), {"mode": "interleaved"}),
    "partial": ((1, 4, 5, 128), (1, 2, 5, 128), (1, 1, 5, 64), {"rotary_dim": 64}),
    "ub_too_small": ((1, 5, 96, 128), (1, 5, 64, 128), (1, 5, 1, 128), {}),  # (96 + 64) heads exceed the UB
    "rank3": ((5, 8, 128), (5, 2, 128), (5, 1, 128), {}),
}


@pytest.mark.parametrize("case", QK_FALLBACK, ids=QK_FALLBACK.keys())
def test_qk_falls_back_to_two_rotations(library, fake, case):
    q_shape, k_shape, cos_shape, attrs = QK_FALLBACK[case]
    rng = seeded("qkfb", case)
    inputs = [R.random(rng, q_shape, F16), R.random(rng, k_shape, F16), *R.cos_sin(rng, cos_shape, F16)]
    rope_vs_cpu(library, "RotaryEmbeddingQK", inputs, attrs)
    assert not fake.calls(APPLY + "GetWorkspaceSize")
    calls = one_clean_call(fake, RPE, 2)
    assert [np.prod(c["x"]["shape"]) for c in calls] == [np.prod(q_shape[:-1]) * cos_shape[-1],
                                                          np.prod(k_shape[:-1]) * cos_shape[-1]]


def test_rotary_width_limit(library, fake):
    rng = seeded("wide")
    inputs = [R.random(rng, (1, 1, 2, 896), F16), *R.cos_sin(rng, (1, 1, 2, 896), F16)]
    with pytest.raises(Exception, match=r"rotates at most 894 lanes per call \(D < 896\); this node rotates 896"):
        rope(library, "RotaryEmbedding", inputs, {}, True)
    # a wide head whose rotated part is narrow is fine (strided view)
    inputs = [R.random(rng, (1, 1, 2, 1024), F16), *R.cos_sin(rng, (1, 1, 2, 64), F16)]
    rope_vs_cpu(library, "RotaryEmbedding", inputs, {"rotary_dim": 64})


def test_interleave_batch_times_heads_limit(library, fake):
    rng = seeded("bn")
    inputs = [R.random(rng, (40, 30, 2, 8), F16), *R.cos_sin(rng, (1, 1, 2, 8), F16)]
    with pytest.raises(Exception, match=r"interleave mode needs B \* N < 1000"):
        rope(library, "RotaryEmbedding", inputs, {"mode": "interleaved"}, True)
