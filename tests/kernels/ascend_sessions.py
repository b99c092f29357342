"""What the Ascend kernel tests share: sessions with the Ascend kernels under the CPU EP against the
CANN test double (``otfuse.ascend_ep.fake_mode=1``) or the CPU kernels, tolerances, seeded inputs,
the aclnn call names and the call-log check, and running a rotation both ways."""

from __future__ import annotations

import zlib

import kernels.rope.test_cpu as R
import numpy as np
import onnx
import onnxruntime as ort
from fake_cann import FAKE_MODE_KEY, FakeCann, fake_mode_options

F32, F16, BF16 = R.F32, R.F16, R.BF16
HALF = [F16, BF16]
FP32_KEY = "otfuse.ascend_ep.fp32_attention"
RPE = "aclnnRotaryPositionEmbedding"
APPLY = "aclnnApplyRotaryPosEmbV2"
FIA = "aclnnFusedInferAttentionScoreV3"
COPY = "aclnnInplaceCopy"
TOL = {F32: 1e-5, F16: 2e-3, BF16: 1.6e-2}


def options(library, ascend: bool, fp32: str | None = None) -> ort.SessionOptions:
    if ascend and fp32 is None:
        return fake_mode_options(library, threads=2)
    so = ort.SessionOptions()
    if ascend:
        so.add_session_config_entry(FAKE_MODE_KEY, "1")
    if fp32 is not None:
        so.add_session_config_entry(FP32_KEY, fp32)
    so.register_custom_ops_library(library)
    so.log_severity_level = 4
    return so


def session(model: onnx.ModelProto, library, ascend, fp32=None) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), options(library, ascend, fp32),
                                providers=["CPUExecutionProvider"])


def close(got, want, tol=None):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    tol = tol if tol is not None else TOL[want.dtype]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol)


def seeded(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


def one_clean_call(fake: FakeCann, api: str, count: int = 1) -> list[dict]:
    """`count` phase-one calls of `api`, each followed by phase two with the workspace asked for;
    every aclTensor / aclTensorList released; nothing from aclrtMalloc but the cached mask."""
    phase1 = fake.calls(api + "GetWorkspaceSize")
    phase2 = fake.calls(api)
    assert len(phase1) == len(phase2) == count, (len(phase1), len(phase2))
    for p1, p2 in zip(phase1, phase2):
        assert p1["status"] == 0 and p2["workspace_size"] == p1["workspace_size"]
    assert len(fake.calls("aclCreateTensor")) == len(fake.calls("aclDestroyTensor"))
    assert len(fake.calls("aclCreateTensorList")) == len(fake.calls("aclDestroyTensorList"))
    return phase1


def rope(library, op, inputs, attrs, ascend):
    n_outputs = 2 if op == "RotaryEmbeddingQK" else 1
    model = R.build_model(op, inputs, n_outputs, attrs)
    results = session(model, library, ascend).run(None, R.feeds_for(inputs))
    return [r.astype(BF16) if inputs[0].dtype == BF16 else r for r in results]


def rope_vs_cpu(library, op, inputs, attrs=None):
    got = rope(library, op, inputs, attrs or {}, True)
    want = rope(library, op, inputs, attrs or {}, False)
    for g, w in zip(got, want):
        close(g, w)
    return got
