"""`shared_weight` on the custom-op route (kernels/cpu/norm_linear.cc, PackSharedWeights): a W_i the
rule marks as read by a Gather too (a tied embedding table) is packed once from the kernel info's
constant, as the plugin EP's PrePack packs it, and every run reads the panels (float32 one row on a
CPU without AVX-512 keeps ORT's Gemm on the initializer). Results against the reference, bit for
bit the in-place route's where the summation order is the same ([K, N] weights: k ascending in one
FMA chain either way) and the plugin EP's always (the same panels and plan); a weight that is no
constant is read per run; OTFUSE_NORM_LINEAR_SHARED_PACK=0 reads in place; the session's memory
against the unfused tied graph's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import otfuse
from otfuse.run import session as otfuse_session
from kernels.norm_linear.test_cpu import BF16, F16, F32, SHAPES, Case, _check
from kernels.norm_linear.test_plugin_ep import RSS_IN_CHILD, opset18_model

SHARED = "OTFUSE_NORM_LINEAR_SHARED_PACK"


def _case(name: str, dtype, **kwargs) -> Case:
    shape, widths, transposed = SHAPES[name]
    return Case("AddRMSNormLinear", dtype, shape=shape, widths=widths, transposed=transposed,
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=7, **kwargs)


def _shared(case: Case) -> list[int]:
    return [1] * len(case.widths)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_packed_shared_weights_on_every_shape(name, dtype, monkeypatch):
    """Every row count over the panels packed at kernel creation: the reference's results, and bit
    for bit the in-place reading's for [K, N] weights (the same FMAs in the same order)."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    case = _case(name, dtype)
    packed = case.run(shared_weight=_shared(case))
    _check(case, packed)
    if not any(case.transposed):
        for a, b in zip(packed, case.run()):
            np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not otfuse_session._ort_has_kernel_ep_api(), reason="no plugin-EP kernel API (ORT < 1.24)")
@pytest.mark.parametrize("name", ["decode", "stream-blocks", "packed-transposed", "dot-rows", "lane-64-rows",
                                  "packed-one-chunk", "decode-packed"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_packed_shared_weights_match_the_plugin_ep(name, dtype, monkeypatch):
    """Both layouts, every few-row form and the staged tasks: the custom-op route's panels give the
    plugin EP's results bit for bit (PackWeight's panels, the same plan)."""
    from kernels.norm_linear.test_plugin_ep import _ep_run

    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    case = _case(name, dtype)
    for a, b in zip(case.run(shared_weight=_shared(case)), _ep_run(case)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["decode", "stream-blocks", "packed-transposed", "lane-64-rows"])
def test_knob_reads_shared_weights_in_place(name, monkeypatch):
    """OTFUSE_NORM_LINEAR_SHARED_PACK=0: the node's results without the attribute, bit for bit."""
    case = _case(name, F32)
    monkeypatch.setenv(SHARED, "0")
    for a, b in zip(case.run(shared_weight=_shared(case)), case.run()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(not otfuse_session._ort_has_kernel_ep_api(), reason="no plugin-EP kernel API (ORT < 1.24)")
@pytest.mark.parametrize("name", ["one-row-one-col", "decode", "decode-packed"])
def test_one_row_reads_the_panels_on_every_cpu(name):
    """Float32, one row, no forced path: ours over the panels (not ORT's Gemm on the initializer, as
    an unmarked node takes on a CPU without AVX-512), so the plugin EP's results bit for bit."""
    from kernels.norm_linear.test_plugin_ep import _ep_run

    case = _case(name, F32)
    got = case.run(shared_weight=_shared(case))
    _check(case, got)
    for a, b in zip(got, _ep_run(case)):
        np.testing.assert_array_equal(a, b)


def test_forced_ort_gemm_reads_the_shared_initializer(monkeypatch):
    """OTFUSE_NORM_LINEAR_GEMM=ort still runs ORT's Gemm: the initializer is there (ORT keeps it)."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "ort")
    case = _case("decode", F32)
    got = case.run(shared_weight=_shared(case))
    _check(case, got)
    for a, b in zip(got, case.run()):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_shared_weight_that_is_no_constant_is_read_per_run(dtype):
    """A graph-input W_i has no constant to pack: read per run (the same bits as unmarked)."""
    case = _case("packed-transposed", dtype, const=False)
    got = case.run(shared_weight=_shared(case))
    _check(case, got)
    for a, b in zip(got, case.run()):
        np.testing.assert_array_equal(a, b)


def test_only_the_marked_weight_is_packed(monkeypatch):
    """shared_weight = [1, 0]: one product over panels, one in place, in the same run."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    case = _case("packed-chunks", F32)
    got = case.run(shared_weight=[1, 0])
    _check(case, got)
    np.testing.assert_array_equal(got[1], case.run()[1])


@pytest.mark.parametrize("overrides, message", [
    (dict(shared_weight=[1]), "attribute 'shared_weight' has 1 entries"),
    (dict(shared_weight=[0, 2, 0]), "entries must be 0 or 1"),
])
def test_bad_shared_weight_is_refused(overrides, message):
    with pytest.raises(Exception) as info:
        Case("RMSNormLinear").run(**overrides)
    assert message in str(info.value)


def _tied_head(vocab: int, hidden: int, heads: int = 1) -> onnx.ModelProto:
    """x -> LayerNorm -> MatMul(., Transpose(E)) (`heads` of them, each its own LayerNorm) and
    Gather(E, ids): a tied LM head, as bench/lm_head_ab.py builds it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((vocab, hidden), dtype=np.float32) * 0.02), "E")]
    nodes = [helper.make_node("Transpose", ["E"], ["ET"], perm=[1, 0]),
             helper.make_node("Gather", ["E", "ids"], ["emb"], axis=0)]
    outputs = [helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, "seq", hidden])]
    for h in range(heads):
        inits += [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), f"s{h}"),
                  numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), f"b{h}")]
        nodes += [helper.make_node("LayerNormalization", ["x", f"s{h}", f"b{h}"], [f"ln{h}"], axis=-1, epsilon=1e-5),
                  helper.make_node("MatMul", [f"ln{h}", "ET"], [f"logits{h}"])]
        outputs.append(helper.make_tensor_value_info(f"logits{h}", TensorProto.FLOAT, [1, "seq", vocab]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", hidden]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"])]
    return opset18_model(nodes, "lm_head", inputs, outputs, inits)


MEMORY_CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
import otfuse
""" + RSS_IN_CHILD + r"""
before = rss("VmRSS")
options = ort.SessionOptions()
options.intra_op_num_threads = 2
options.register_custom_ops_library(otfuse.library_path())
session = ort.InferenceSession(sys.argv[1], options, providers=["CPUExecutionProvider"])
created = rss("VmRSS")
rng = np.random.default_rng(1)
feeds = {"x": rng.standard_normal((1, 70, int(sys.argv[2])), dtype=np.float32),
         "ids": rng.integers(0, 100, (1, 70), dtype=np.int64)}
np.savez(sys.argv[3], *session.run(None, feeds))
print(json.dumps({"created": created - before, "peak": rss("VmHWM")}))
"""


@pytest.mark.parametrize("heads", [1, 2])
def test_tied_head_holds_no_more_than_the_unfused_session(tmp_path, heads):
    """The custom-op route on a tied head (64 MiB table): with the panels, RSS at creation and peak
    within a few MiB of the unfused session's (which keeps E for its Gather and MLAS's packed copy
    of the folded Transpose); read in place (knob 0) it holds a table's bytes less. Two heads on one
    table share one set of panels (the unfused session packs two copies). Outputs: the in-place
    route's to float32 rounding."""
    vocab, hidden = 16384, 1024
    onnx.save(_tied_head(vocab, hidden, heads), tmp_path / "src.onnx")
    otfuse.fuse(tmp_path / "src.onnx", tmp_path / "base.onnx", only=["norm"])
    otfuse.fuse(tmp_path / "src.onnx", tmp_path / "fused.onnx", only=["norm", "norm_linear"])
    flags = [list(a.ints) for n in onnx.load(tmp_path / "fused.onnx").graph.node for a in n.attribute
             if a.name == "shared_weight"]
    assert flags == [[1]] * heads
    results = {}
    for label, model, knob in (("unfused", "base", "1"), ("packed", "fused", "1"), ("in_place", "fused", "0")):
        out = tmp_path / f"{label}.npz"
        run = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(tmp_path / f"{model}.onnx"), str(hidden),
                              str(out)], capture_output=True, text=True, env={**os.environ, SHARED: knob}, check=True)
        results[label] = json.loads(run.stdout.strip().splitlines()[-1])
        results[label]["outputs"] = [v for _, v in sorted(np.load(out).items())]
    table_mib = vocab * hidden * 4 / 2**20
    assert results["packed"]["created"] <= results["unfused"]["created"] + 4, results
    assert results["packed"]["peak"] <= results["unfused"]["peak"] + 8, results
    assert results["packed"]["created"] >= results["in_place"]["created"] + 0.9 * table_mib, results  # it packed
    assert results["packed"]["created"] <= results["in_place"]["created"] + 1.1 * table_mib, results  # once
    for a, b in zip(results["packed"]["outputs"], results["in_place"]["outputs"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)
