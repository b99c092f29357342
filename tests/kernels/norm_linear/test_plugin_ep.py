"""The Norm + Linear kernels on the library's plugin EP (kernels/cpu/norm_linear_ep.cc, ORT >= 1.24):
the EP claims the *NormLinear nodes, packs their weights once (OrtKernelImpl::PrePackWeight)
and ORT frees the initializers. Real ORT sessions: the results against the reference and against
the custom-op route, the providers, and the session's memory against the unfused graph's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
import onnx
from onnx import TensorProto, helper, numpy_helper

import otfuse
from otfuse.run import session as otfuse_session
from kernels.norm_linear.test_cpu import BF16, F16, F32, KINDS, SHAPES, Case, _check

pytestmark = pytest.mark.skipif(not otfuse_session._ort_has_kernel_ep_api(),
                                reason=f"onnxruntime {ort.__version__} has no plugin-EP kernel API (< 1.24)")


def _ep_run(case: Case, threads: int = 2):
    """case.run(), with the plugin EP in front of the CPU EP."""
    model, feeds = case.model()
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(otfuse.library_path())
    devices = otfuse_session.plugin_ep_devices(otfuse.library_path())
    assert devices, "the library offers no plugin EP device"
    options.add_provider_for_devices(devices, {})
    session = ort.InferenceSession(model.SerializeToString(), options)
    assert session.get_providers() == [otfuse_session.EP_NAME, "CPUExecutionProvider"]
    return session.run(None, feeds)


@pytest.mark.parametrize("op", list(KINDS))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_matches_reference_and_custom_op_route(op, dtype):
    case = Case(op, dtype, keep=True)
    got = _ep_run(case)
    _check(case, got)
    for a, b in zip(got, case.run()):  # [K, N] weights: k ascending in one FMA chain on both routes
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_packed_weights_on_every_shape(name, dtype, monkeypatch):
    """Every row count reads the packed panels (16-bit ones keep their type, widened in the
    micro-kernels or once per tile step for many rows; one row 4 panels per call; a few rows with the
    AVX2 kernels 32-deep calls): partial tiles, k blocks, row chunks, column ranges, both layouts, 1
    to 812 rows. [K, N] weights: bit for bit the custom-op route's results on otfuse's GEMM (k
    ascending in one FMA chain on both routes; the custom-op route's float32 single row takes ORT's
    Gemm on CPUs without AVX-512 unless forced)."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    shape, widths, transposed = SHAPES[name]
    case = Case("AddRMSNormLinear", dtype, shape=shape, widths=widths, transposed=transposed,
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=7)
    got = _ep_run(case)
    _check(case, got)
    if not any(transposed):
        for a, b in zip(got, case.run()):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows", [1, 5, 16, 64, 128, 250])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_few_rows_split_packed_ranges(monkeypatch, rows, dtype):
    """Three equal packed ranges (N = 700 x 3), which 2 threads would not share evenly: up to 64 rows
    (16-bit panels: up to 256, one row chunk, so that their widening is not repeated per chunk) each
    range is taken by two tasks (352 + 348 columns, the second ending in a partial tile;
    common/gemm.cc, AddPackedOnceTasks) that read their tiles from the middle of the range's panels,
    over three k blocks (256 + 256 + 89). Bit for bit the custom-op route's results, on 1 to 3
    threads."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    case = Case("AddRMSNormLinear", dtype, shape=(rows, 601), widths=(700, 700, 700), transposed=[0, 0, 0],
                bias=[1, 0, 1], keep=True, seed=21)
    expected = case.run()
    for threads in (1, 2, 3):
        got = _ep_run(case, threads)
        _check(case, got)
        for a, b in zip(got, expected):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows", [7, 8, 10, 11, 23])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_last_rows_of_a_tile_pair_in_one_call(monkeypatch, rows, dtype):
    """Panels packed once, AVX-512: a task's last 7-11 rows over a tile pair are one call (a full
    row block and one of 1-5 rows: gemm_tiles.inc, MicroQuadTail), alone or after two-block calls
    (23 = 12 + 11), over three k blocks (208 + 208 + 185), tile pairs and a lone partial tile (600 =
    37 tiles + 8 columns, 40 = 2 + 8), with and without a bias. Bit for bit the custom-op route's
    results, on 1 to 3 threads (other ISAs: their own calls, the same check)."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    case = Case("AddRMSNormLinear", dtype, shape=(rows, 601), widths=(600, 40), transposed=[0, 0],
                bias=[1, 0], keep=True, seed=27)
    _check_same_on_threads_and_routes(case)


def _check_same_on_threads_and_routes(case):
    """Right, and bit for bit one thread's result on 1 to 3 threads, on both routes (custom op and
    plugin EP): a plan may move column and row splits, never the order of a sum."""
    expected = case.run(threads=1)
    _check(case, expected)
    for threads in (1, 2, 3):
        for got in (case.run(threads=threads), _ep_run(case, threads)):
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)


# Nodes whose whole column ranges would leave 2 threads uneven (three equal ranges, or 3 row chunks x
# 3 ranges): rows, K, widths. The plans pick narrower ranges (custom-op route: 768 or 384 columns,
# read deep in place at 512 rows, packed per call at 900) or more row chunks (weights packed once).
UNEVEN = {
    "deep-thirds": (512, 301, (768, 768, 768)),
    "deep-one-range-of-three": (512, 301, (3072,)),
    "packed-span-thirds": (900, 301, (2304,)),
    # 16-bit panels packed once at 257-576 rows: one row chunk, each range in parts (1024 + 1024 +
    # 256 columns on 2 threads: parts narrowed until even; the fewest and most rows of that regime)
    "packed-one-chunk-parts": (400, 301, (2304,)),
    "packed-one-chunk-fewest-rows": (257, 200, (1000, 40)),
    "packed-one-chunk-most-rows": (576, 160, (3072,)),
}


@pytest.mark.parametrize("name", list(UNEVEN))
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_uneven_ranges_split_evenly(monkeypatch, name, dtype):
    """Where a task per whole range would load 2 threads 2 : 1 (common/gemm.cc, PlanChoice): both
    routes' results bit for bit the same on 1 to 3 threads (the plan moves column and row splits,
    and past the few-row plans splits its last tasks in column halves, never the order of a sum)."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    rows, k, widths = UNEVEN[name]
    case = Case("AddRMSNormLinear", dtype, shape=(rows, k), widths=widths, transposed=[0] * len(widths),
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=23)
    _check_same_on_threads_and_routes(case)


# Deep in-place tasks (custom-op route, 257-576 rows) whose last k block's two-block calls write Y
# from their registers (gemm_tiles.inc, YRows; bench/README.md "norm_linear fp16, session 18"):
# rows, K, widths, bias. 1, 2 and 3 k blocks (K 200, 300, 600: the first with nothing to add to),
# a last row block of 1 or 2 rows, tile pairs, a lone tile, partial tiles (33, 70 = 4 x 16 + 6).
DEEP_Y = {
    "deep-y-one-block": (301, 200, (96, 33)),
    "deep-y-two-blocks": (512, 300, (70, 160)),
    "deep-y-three-blocks": (362, 600, (128, 33)),
}


# K not a multiple of kPackDepth (256): the deep tasks' k blocks and the packed panels' blocks of
# equal depth (common/gemm.h, EvenDepth: Qwen2's 896 as 4 x 224, 1157 as 4 x 232 + 229) instead of
# 256-row blocks and a short rest; the plan's last deep tasks split in column halves (common/gemm.cc,
# TaperTail). Rows from the deep range (97-576, float32), past it (packed per call) and at few rows,
# partial tiles, several column ranges.
EVEN = {
    "even-qwen2-gate-up": (512, 896, (1216, 1216)),
    "even-qwen2-qkv": (130, 896, (896, 128, 128)),
    "even-odd-k": (301, 1157, (200, 33)),
    "even-packed-per-call": (700, 1157, (160,)),
    "even-few-rows": (16, 1157, (100, 40)),
}


@pytest.mark.parametrize("name", list(EVEN))
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_even_k_blocks_and_tapered_tails_keep_the_sums(monkeypatch, name, dtype):
    """Equal k blocks and tapered tails move where accumulators are stored and reloaded and which
    task computes a column, not the FMA order: the custom-op route (W in place) and the plugin EP
    (panels packed once) bit for bit the same on 1 to 3 threads, and right against the reference."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    rows, k, widths = EVEN[name]
    case = Case("AddRMSNormLinear", dtype, shape=(rows, k), widths=widths, transposed=[0] * len(widths),
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=rows + k)
    _check_same_on_threads_and_routes(case)


@pytest.mark.parametrize("name", list(DEEP_Y))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_deep_tasks_write_y_from_registers_as_before(monkeypatch, name, dtype):
    """The custom-op route's deep tasks write float32 / float16 Y from the accumulator registers in
    their last k block (bfloat16: through WriteRows, as before); the plugin EP's tasks over packed
    panels still store the accumulators and write Y from them. The same FMAs in the same order, the
    same bias add and one rounding: both routes bit for bit the same, with and without a bias, on 1
    to 3 threads."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    rows, k, widths = DEEP_Y[name]
    for bias in ([1, 0], [0, 1]):
        case = Case("AddRMSNormLinear", dtype, shape=(rows, k), widths=widths, transposed=[0, 0], bias=bias,
                    keep=True, seed=rows + k)
        _check_same_on_threads_and_routes(case)


# One row over [k, n] weights read in place (common/gemm.cc, OneRowCandidateCols): the widest
# column ranges the threads share evenly, one task per thread where that is even (GPT-2's 3072 and
# 2304, LLaMA's q/k/v 2048 + 512 + 512), more where it is not (768 x 3, and a product narrower
# than kMinRangeCols beside a wide one); partial last tiles, an odd K.
ONE_ROW = {
    "one-wide": (301, (3072,)),
    "one-qkv": (301, (2048, 512, 512)),
    "one-thirds": (203, (768, 768, 768)),
    "one-narrow-beside-wide": (203, (4000, 9, 130)),
    # float32 W whose rows are a multiple of 4 KiB apart (N = 1024, 2048) sweeps W's rows
    # (gemm_tiles.inc, OneRowSweepsF32), beside a product that keeps the lockstep.
    "one-rows-4k-apart": (768, (2048, 1024, 40)),
}


@pytest.mark.parametrize("name", list(ONE_ROW))
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_one_row_wide_ranges(monkeypatch, name, dtype):
    """Decode (one row) with otfuse's GEMM on the custom-op route: right, and bit for bit the same
    on 1 to 3 threads and as the plugin EP's packed panels (the ranges move, the sums do not)."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    k, widths = ONE_ROW[name]
    case = Case("AddRMSNormLinear", dtype, shape=(1, k), widths=widths, transposed=[0] * len(widths),
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=29)
    _check_same_on_threads_and_routes(case)


# The AVX2 kernels' last k block in row-block order (gemm_tiles.inc, SweepRowsLastBlock: each row
# block over every tile, float32 Y written from the registers): deep in-place tasks (custom-op route,
# 129-576 rows) and tasks over panels packed once (plugin EP), 1 to 4 k blocks, a partial last row
# block, beside a product with a partial tile (whose tasks keep the tile-outer order): rows, K,
# widths. 700 rows: row chunks on the plugin EP (the custom-op route packs per call there).
AVX2_LAST_BLOCK = {
    "qwen2-gate-up": (512, 896, (1216, 1216)),
    "one-block-partial-rows": (301, 200, (256, 70)),
    "three-blocks": (200, 600, (160, 33)),
    "packed-once-chunks": (700, 300, (512,)),
}


@pytest.mark.parametrize("name", list(AVX2_LAST_BLOCK))
def test_avx2_last_block_by_row_blocks_agrees_with_the_default_kernels(monkeypatch, name):
    """Both routes with the AVX2 kernels (OTFUSE_GEMM_ISA=avx2) bit for bit the default kernels'
    results (AVX-512 where the CPU has it, which keep the tile-outer order): the last k block's calls
    run in another order and write Y from their registers, each output's FMAs unchanged."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "own")
    rows, k, widths = AVX2_LAST_BLOCK[name]
    case = Case("AddRMSNormLinear", F32, shape=(rows, k), widths=widths, transposed=[0] * len(widths),
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=rows + k)
    default = [case.run(threads=2), _ep_run(case, 2)]
    monkeypatch.setenv("OTFUSE_GEMM_ISA", "avx2")
    avx2 = [case.run(threads=2), _ep_run(case, 2)]
    _check(case, avx2[0])
    for got, want in zip(avx2, default):
        for a, b in zip(got, want):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["packed-one-chunk", "stream-pairs", "packed-deep", "packed-chunks"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_avx2_kernels_agree_with_the_default_ones(monkeypatch, name, dtype):
    """The AVX2 micro-kernels (OTFUSE_GEMM_ISA=avx2) over the packed panels, bit for bit the default
    ones' results (AVX-512 where the CPU has it): from 4 row blocks on, AVX2 multiplies each panel
    by all of a task's row blocks with calls that fetch the next A block and panel as they go
    (float32 panels, and 16-bit ones widened once per tile), the same FMAs in the same order. 65 to
    812 rows: partial last row blocks, 1 to 3 k blocks, partial tiles, row chunks, column ranges.
    (float16 outputs round the float32 sums, so an FMA order changed there shows in float32 only.)"""
    shape, widths, _ = SHAPES[name]
    case = Case("AddRMSNormLinear", dtype, shape=shape, widths=widths, transposed=[0] * len(widths),
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=13)
    default = _ep_run(case)
    monkeypatch.setenv("OTFUSE_GEMM_ISA", "avx2")
    avx2 = _ep_run(case)
    _check(case, avx2)
    for a, b in zip(avx2, default):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("threads", [1, 3])
def test_thread_count_does_not_change_results(threads):
    case = Case("RMSNormLinear", shape=(4, 203, 70), widths=(1100, 9), transposed=[0, 1], seed=2)
    np.testing.assert_array_equal(_ep_run(case, threads)[0], _ep_run(case, 2)[0])


def test_unequal_products_every_task_on_any_thread_count():
    """A q, k, v-shaped node: one wide product and two narrow ones, 800 rows (two row chunks), so
    tasks of three sizes, which the threads claim largest first from one queue (common/gemm.cc,
    GemmInPlace): every output right and bit for bit the same on 1, 2 and 3 threads."""
    case = Case("RMSNormLinear", shape=(1, 800, 64), widths=(2080, 520, 48), transposed=[0, 0, 0], seed=4)
    got = {threads: _ep_run(case, threads) for threads in (1, 2, 3)}
    _check(case, got[2])
    for threads in (1, 3):
        for a, b in zip(got[threads], got[2]):
            np.testing.assert_array_equal(a, b)


def test_packed_rows_buffer_grows_and_is_reused():
    """A's packed copy is kept by the calling thread from one run to the next (common/thread_floats.h,
    kCallerPackedA): a small run, a larger one (the buffer grows), the small one again (reused), each
    right, on one thread so that every task writes into the caller's buffer."""
    small = Case("RMSNormLinear", shape=(1, 100, 64), widths=(48, 40), transposed=[0, 0], seed=8)
    large = Case("RMSNormLinear", shape=(2, 700, 96), widths=(80, 40), transposed=[0, 0], seed=9)
    for case in (small, large, small):
        _check(case, _ep_run(case, 1))


def test_runtime_weights_are_read_per_run():
    """A weight fed per run is no initializer: nothing is packed, the run reads it."""
    constant = Case("LayerNormLinear", shape=(3, 70, 40), widths=(17, 5), transposed=[1, 0], seed=3)
    runtime = Case("LayerNormLinear", shape=(3, 70, 40), widths=(17, 5), transposed=[1, 0], const=False, seed=3)
    got = _ep_run(runtime)
    _check(runtime, got)
    _check(constant, _ep_run(constant))


def test_bad_node_is_refused_at_session_creation():
    case = Case("RMSNormLinear")
    model, _ = case.model(axis=0)
    options = ort.SessionOptions()
    options.register_custom_ops_library(otfuse.library_path())
    options.add_provider_for_devices(otfuse_session.plugin_ep_devices(otfuse.library_path()), {})
    with pytest.raises(Exception, match="RMSNormLinear .node 'fused_0'.*axis"):
        ort.InferenceSession(model.SerializeToString(), options)


def test_forced_ort_gemm_is_refused(monkeypatch):
    """ORT's Gemm cannot be created from a plugin EP's kernel: forcing it fails loudly."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "ort")
    with pytest.raises(Exception, match="OTFUSE_NORM_LINEAR_GEMM=ort: no ORT Gemm in the plugin EP"):
        _ep_run(Case("RMSNormLinear"))



# The child processes' resident-memory reader (kB lines of /proc/self/status, in MiB).
RSS_IN_CHILD = r"""
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
"""


def opset18_model(nodes, name, inputs, outputs, inits) -> onnx.ModelProto:
    """A model of one graph at opset 18, IR 9 (what ORT 1.32 and the exporters here agree on)."""
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model

def _block(k: int, widths):
    """Sigmoid -> the exporter's decomposed RMSNorm -> MatMuls -> Relu: CPU EP nodes on both sides
    of the fused node."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((1 + 0.1 * rng.standard_normal(k)).astype(np.float32), "scale"),
             numpy_helper.from_array(np.array(2.0, np.float32), "two"),
             numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    nodes = [helper.make_node("Sigmoid", ["x"], ["xs"]),
             helper.make_node("Pow", ["xs", "two"], ["sq"]),
             helper.make_node("ReduceMean", ["sq", "axes"], ["ms"]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Reciprocal", ["rms"], ["inv"]),
             helper.make_node("Mul", ["xs", "inv"], ["n"]),
             helper.make_node("Mul", ["scale", "n"], ["normed"])]
    outputs = []
    for i, n in enumerate(widths):
        inits.append(numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32) * 0.02, f"w{i}"))
        nodes += [helper.make_node("MatMul", ["normed", f"w{i}"], [f"p{i}"]),
                  helper.make_node("Relu", [f"p{i}"], [f"y{i}"])]
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [1, "seq", n]))
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", k])]
    return opset18_model(nodes, "block", inputs, outputs, inits)


MEMORY_CHILD = r"""
import json, os, sys
import numpy as np
import otfuse.run.session as s
""" + RSS_IN_CHILD + r"""
before = rss("VmRSS")
session = s.InferenceSession(sys.argv[1])
created = rss("VmRSS")
dtype = np.dtype(sys.argv[5]) if len(sys.argv) > 5 else np.float32  # x's type: the model's
x = np.random.default_rng(1).standard_normal((1, int(sys.argv[2]), int(sys.argv[3]))).astype(dtype)
# a model with an If (test_plugin_ep_edges.py) runs both branches
feeds = [{"x": x, "cond": np.array(c)} for c in (True, False)] if len(session.get_inputs()) == 2 else [{"x": x}]
np.savez(sys.argv[4], *[y for f in feeds for y in session.run(None, f)])
print(json.dumps({"providers": session.get_providers(), "created": created - before, "peak": rss("VmHWM")}))
"""


def test_fused_session_holds_no_more_than_the_unfused_one(tmp_path):
    """otfuse.InferenceSession on the fused block: the EP route, its packed panels in place of the
    freed initializers (96 MiB of float32 weights): RSS at creation within 4 MiB of the unfused
    graph's (whose MatMuls prepack and free theirs) and peak within 8 MiB (a kept copy of any one
    weight would be 32 MiB; the per-thread scratch rows and accumulators, a few MiB, follow which
    threads ran tasks: +5.5 MiB seen once on a loaded machine, +0.1 MiB usually), outputs as the
    custom-op route's."""
    import onnx
    k, widths = 2048, (4096, 4096, 4096)
    onnx.save(_block(k, widths), tmp_path / "src.onnx")
    otfuse.fuse(tmp_path / "src.onnx", tmp_path / "base.onnx", only=["norm"])
    otfuse.fuse(tmp_path / "src.onnx", tmp_path / "fused.onnx", only=["norm", "norm_linear"])
    results = {}
    for label, model, ep in (("unfused", "base", "1"), ("ep", "fused", "1"), ("custom", "fused", "0")):
        env = {**os.environ, "OTFUSE_NORM_LINEAR_EP": ep}
        out = tmp_path / f"{label}.npz"
        run = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(tmp_path / f"{model}.onnx"), "70", str(k),
                              str(out)], capture_output=True, text=True, env=env, check=True)
        results[label] = json.loads(run.stdout.strip().splitlines()[-1])
        results[label]["outputs"] = [v for _, v in sorted(np.load(out).items())]
    fused_ops = [node.op_type for node in onnx.load(tmp_path / "fused.onnx").graph.node]
    assert "RMSNormLinear" in fused_ops and "MatMul" not in fused_ops, fused_ops
    assert results["ep"]["providers"][0] == otfuse_session.EP_NAME
    assert results["custom"]["providers"] == ["CPUExecutionProvider"]
    assert results["ep"]["created"] <= results["unfused"]["created"] + 4, results
    assert results["ep"]["peak"] <= results["unfused"]["peak"] + 8, results
    assert results["unfused"]["created"] > 90  # the weights are resident (the check measures something)
    for a, b in zip(results["ep"]["outputs"], results["custom"]["outputs"]):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(results["ep"]["outputs"], results["unfused"]["outputs"]):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-4)


def test_float16_panels_take_the_weights_bytes(tmp_path):
    """float16 weights (48 MiB) packed once stay 16-bit: the EP session's RSS at creation and peak
    within 4 MiB of the custom-op route's (which reads the initializers as stored), outputs bit for
    bit the same ([K, N] weights, 70 rows: the widened-once stage). glibc's mmap threshold is fixed
    at 1 MiB in both: by default it rises to the size of a freed block (up to 32 MiB), so the 16 MiB
    initializers ORT frees after packing stay on the heap, resident though free (+16 MiB at
    creation, measured; float32's 32 MiB blocks are mapped either way)."""
    k, widths = 2048, (4096, 4096, 4096)
    model, _ = Case("RMSNormLinear", F16, shape=(1, 70, k), widths=widths, bias=[0, 0, 0], seed=5).model()
    onnx.save(model, tmp_path / "fused.onnx")
    results = {}
    for label, ep in (("ep", "1"), ("custom", "0")):
        out = tmp_path / f"{label}.npz"
        run = subprocess.run([sys.executable, "-c", MEMORY_CHILD, str(tmp_path / "fused.onnx"), "70", str(k), str(out), "float16"],
                             capture_output=True, text=True, check=True,
                             env={**os.environ, "OTFUSE_NORM_LINEAR_EP": ep, "MALLOC_MMAP_THRESHOLD_": str(1 << 20)})
        results[label] = json.loads(run.stdout.strip().splitlines()[-1])
        results[label]["outputs"] = [v for _, v in sorted(np.load(out).items())]
    assert results["ep"]["providers"][0] == otfuse_session.EP_NAME
    assert results["custom"]["providers"] == ["CPUExecutionProvider"]
    assert results["custom"]["created"] > 45  # the weights are resident (the check measures something)
    assert results["ep"]["created"] <= results["custom"]["created"] + 4, results
    assert results["ep"]["peak"] <= results["custom"]["peak"] + 4, results
    for a, b in zip(results["ep"]["outputs"], results["custom"]["outputs"]):
        np.testing.assert_array_equal(a, b)


def test_a_model_without_norm_linear_nodes_keeps_the_cpu_ep_alone(tmp_path):
    # The EP joins only a model with a node for it: every other session partitions as before.
    model = onnx.helper.make_model(onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])], "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])]),
        opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "relu.onnx"
    onnx.save(model, path)
    assert not otfuse_session.mentions_norm_linear(path) and not otfuse_session.mentions_norm_linear(b"")
    for source in (str(path), path.read_bytes()):
        assert otfuse.InferenceSession(source).get_providers() == ["CPUExecutionProvider"]
    assert otfuse_session.cpu_providers(path) == ["CPUExecutionProvider"]
