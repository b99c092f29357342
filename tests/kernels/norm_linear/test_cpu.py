"""CPU kernels of the Norm + Linear family against otfuse.verify.reference, in real ORT sessions.

Weights are constant initializers or graph inputs; the kernel reads both in place, so they must
give the same bits. The products take one of three paths (kernels/cpu/norm_linear.cc): ORT's own
Gemm (float32, one row, CPUs without AVX-512), our GEMM reading W in place (up to 64 rows; 576 for [K, N] weights with AVX2 / AVX-512, 256-deep k blocks
past 256 rows) or packing it per task (more rows); OTFUSE_NORM_LINEAR_GEMM=ort / own forces ORT's or ours for float32, OTFUSE_CPU_ISA=baseline
the portable micro-kernels, OTFUSE_GEMM_ISA=avx2 the AVX2 ones on an AVX-512 CPU. The shapes below reach every path, layout and edge (partial tiles,
k blocks, row chunks, column ranges) on every path the machine has. bfloat16 crosses the graph
boundary as float32 with a Cast on each side (ORT's Python API cannot feed bfloat16).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import otfuse
from otfuse.verify import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
ONNX_TYPE = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16, BF16: TensorProto.BFLOAT16}
# Y_i sums K products: the tolerance grows with K (float32 summation order differs from numpy's).
TOLERANCE = {F32: 2e-5, F16: 2e-3, BF16: 2e-2}

KINDS = {
    "RMSNormLinear": (False, False),  # (residual Add, LayerNorm)
    "AddRMSNormLinear": (True, False),
    "LayerNormLinear": (False, True),
    "AddLayerNormLinear": (True, True),
}


def _tensor(name: str, array: np.ndarray):
    dtype = array.dtype
    if dtype == BF16:
        return helper.make_tensor(name, TensorProto.BFLOAT16, array.shape, array.view(np.uint16).tobytes(), raw=True)
    return helper.make_tensor(name, ONNX_TYPE[dtype], array.shape, array.tobytes(), raw=True)


class Case:
    def __init__(self, op: str, dtype=F32, shape=(2, 5, 64), widths=(64, 32, 32), transposed=None,
                 bias=None, norm_bias=True, keep=False, const=True, seed=0, epsilon=1e-5):
        rng = np.random.default_rng(seed)
        self.op, self.dtype, self.keep, self.const, self.epsilon = op, np.dtype(dtype), keep, const, epsilon
        self.add, self.layer = KINDS[op]
        k = shape[-1]
        self.transposed = list(transposed or [0] * len(widths))
        self.has_bias = list(bias if bias is not None else [1] * len(widths))
        cast = lambda a: np.asarray(a, dtype=np.float32).astype(self.dtype)  # noqa: E731
        self.x = cast(rng.standard_normal(shape))
        self.b = cast(rng.standard_normal(shape)) if self.add else None
        self.scale = cast(1 + 0.1 * rng.standard_normal(k))
        self.norm_bias = cast(0.1 * rng.standard_normal(k)) if self.layer and norm_bias else None
        self.weights = [cast(0.1 * rng.standard_normal((n, k) if t else (k, n)))
                        for n, t in zip(widths, self.transposed)]
        self.biases = [cast(0.1 * rng.standard_normal(n)) if hb else None for n, hb in zip(widths, self.has_bias)]
        self.widths = list(widths)

    def expected(self) -> list[np.ndarray]:
        biases = self.biases
        if self.add and self.layer:
            ys, s, yn = reference.add_layer_norm_linear(self.x, self.b, self.scale, self.norm_bias, self.weights,
                                                        biases, self.transposed, self.epsilon)
        elif self.add:
            ys, s, yn = reference.add_rms_norm_linear(self.x, self.b, self.scale, self.weights, biases,
                                                      self.transposed, self.epsilon)
        elif self.layer:
            (ys, yn), s = reference.layer_norm_linear(self.x, self.scale, self.norm_bias, self.weights, biases,
                                                      self.transposed, self.epsilon), None
        else:
            (ys, yn), s = reference.rms_norm_linear(self.x, self.scale, self.weights, biases, self.transposed,
                                                    self.epsilon), None
        return ys + ([s] if self.add else []) + ([yn] if self.keep else [])

    def model(self, **attr_overrides):
        t = ONNX_TYPE[self.dtype]
        boundary = TensorProto.FLOAT if self.dtype == BF16 else t
        nodes, inputs, inits, feeds = [], [], [], {}

        def feed(name, array):
            outer = f"{name}_in" if self.dtype == BF16 else name
            inputs.append(helper.make_tensor_value_info(outer, boundary, list(array.shape)))
            feeds[outer] = array.astype(np.float32) if self.dtype == BF16 else array
            if self.dtype == BF16:
                nodes.append(helper.make_node("Cast", [outer], [name], to=TensorProto.BFLOAT16))
            return name

        names = [feed("x", self.x)] + ([feed("b", self.b)] if self.add else [])
        inits.append(_tensor("scale", self.scale))
        names.append("scale")
        if self.layer:
            if self.norm_bias is not None:
                inits.append(_tensor("norm_bias", self.norm_bias))
            names.append("norm_bias" if self.norm_bias is not None else "")
        for i, w in enumerate(self.weights):
            if self.const:
                inits.append(_tensor(f"w{i}", w))
                names.append(f"w{i}")
            else:
                names.append(feed(f"w{i}", w))
        for i, bias in enumerate(self.biases):
            if bias is not None:
                inits.append(_tensor(f"bias{i}", bias))
                names.append(f"bias{i}")
        outs = [f"y{i}" for i in range(len(self.weights))] + (["s"] if self.add else []) + (["yn"] if self.keep else [])
        attrs = dict(epsilon=self.epsilon, axis=-1, out_features=self.widths, transposed=self.transposed,
                     has_bias=self.has_bias)
        attrs.update(attr_overrides)
        attrs = {k: v for k, v in attrs.items() if v is not None}
        nodes.append(helper.make_node(self.op, names, [f"{o}_t" for o in outs] if self.dtype == BF16 else outs,
                                      name="fused_0", domain="otfuse", **attrs))
        if self.dtype == BF16:
            nodes += [helper.make_node("Cast", [f"{o}_t"], [o], to=TensorProto.FLOAT) for o in outs]
        graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info(o, boundary, None) for o in outs],
                                  inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("otfuse", 1)])
        model.ir_version = 9
        return model, feeds

    def run(self, threads: int = 2, **attr_overrides):
        model, feeds = self.model(**attr_overrides)
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.register_custom_ops_library(otfuse.library_path())
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        return session.run(None, feeds)


def _check(case: Case, got: list[np.ndarray]) -> None:
    expected = case.expected()
    assert len(got) == len(expected)
    tol = TOLERANCE[case.dtype]
    for index, (g, e) in enumerate(zip(got, expected)):
        assert g.shape == e.shape, (index, g.shape, e.shape)
        np.testing.assert_allclose(g.astype(np.float32), e.astype(np.float32), rtol=tol, atol=tol,
                                   err_msg=f"output {index}")


@pytest.mark.parametrize("op", list(KINDS))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_matches_reference(op, dtype):
    _check(Case(op, dtype), Case(op, dtype).run())


@pytest.mark.parametrize("op", list(KINDS))
def test_constant_and_runtime_weights_agree(op):
    case = Case(op, shape=(3, 7, 40), widths=(17, 5), transposed=[1, 0], keep=True, seed=3)
    runtime = Case(op, shape=(3, 7, 40), widths=(17, 5), transposed=[1, 0], keep=True, const=False, seed=3)
    constant, per_run = case.run(), runtime.run()
    _check(case, constant)
    for a, b in zip(constant, per_run):
        np.testing.assert_array_equal(a, b)


# (shape, widths, transposed): every path and edge of the products.
SHAPES = {
    "one-row-one-col": ((1, 64), (1,), [0]),  # float32: ORT's Gemm; else one row streamed
    "decode": ((1, 1, 4096), (40, 24), [0, 1]),  # one row, deep K, both layouts
    # one row over packed panels (plugin EP): calls of 4 tiles, then 3 / 1 left, over k blocks of 256,
    # 256 and 89, two column ranges (1100 = 560 + 540), each taken by two tasks (288 + 272, 272 + 268:
    # common/gemm.cc, AddPackedOnceTasks), and a partial tile
    "decode-packed": ((1, 601), (1100, 70), [0, 0]),
    # one row, [K, N] weights: float16 / bfloat16 with the AVX2 / AVX-512 kernels take the row sweep
    # (gemm_tiles.inc, RowSweepTask): K = 203 = 25 sweeps of 8 rows + 3 single rows, four column
    # ranges of 1100 (the last one ending in a partial tile), 2 tiles + 5 columns, a single tile
    "decode-sweep": ((1, 203), (1100, 37, 16), [0, 0, 0]),
    # the same sweep over a row block of 3 rows (up to kRowBlock = 6 rows: one row block)
    "rows-sweep": ((3, 203), (300, 37), [0, 0]),
    # a few rows over packed panels, AVX2 kernels: 32-deep calls (89 = 32 + 32 + 25 in the last k block)
    "few-rows-deep": ((7, 601), (100,), [0]),
    "stream-blocks": ((13, 70), (5, 33, 16), [0, 1, 0]),  # 13 rows = 6 + 6 + 1, odd K, partial tiles
    "stream-deep": ((2, 3, 300), (100, 7), [1, 0]),  # K past one 256-deep transposed stage, K % 16 != 0
    "stream-ranges": ((64, 100), (1100,), [0]),  # 64 rows: the most streamed, four column ranges
    # 7-18 rows, [K, N], AVX-512: every row of a tile in one call (gemm_tiles.inc, MicroTall), over
    # 13 steps of 16 k (the last 11 deep), four column ranges whose last tiles prefetch the next
    # step's first ones, a partial tile (37 = 2 x 16 + 5) and a lone tile
    "stream-tall": ((2, 8, 203), (1100, 37, 16), [0, 0, 0]),
    "stream-tall-widest": ((18, 45), (300, 33), [0, 0]),  # three full row blocks in one call
    "stream-tall-two-blocks": ((9, 70), (40,), [0]),  # 6 + 3 rows
    # 7-18 rows, AVX-512: 32-deep steps (kTallDepth) with their k loop unrolled, K a multiple of 32 (no
    # run-time-depth step), the next call's accumulators fetched across tiles and steps, a partial tile
    "stream-tall-deep": ((2, 8, 96), (100, 48), [0, 0]),
    # 19-64 rows: 18 read in place and staged, then from the stage 18 at a time: 40 = 18 + 18 + 4
    # (a last lone row block), 25 = 18 + 7 (a last group of 6 + 1)
    "stream-tall-groups": ((2, 20, 70), (300, 33), [0, 0]),
    "stream-tall-groups-odd": ((25, 203), (600,), [0]),
    # 94 rows, [K, N]: streamed two tiles per call with AVX-512 (pairs, a lone tile, a partial one,
    # a last row block of 4 rows), 32-deep in place one tile per call with the AVX2 kernels
    "stream-pairs": ((94, 70), (80, 33), [0, 0]),
    "packed-one-chunk": ((65, 40), (48, 17), [0, 1]),  # the first packed size of [N, K] weights, one k block
    # 65-256 rows, [K, N] (common/gemm.h, kDeepPlainMinRowsAvx512 / Avx2): 97 rows, the first read deep
    # in place by AVX-512 (float32 W whose rows do not alias: the next pair's rows fetched over 4
    # two-block calls, not 8), three k blocks (256 + 256 + 88); 2048 float32 columns (rows 8 KiB
    # apart) and 16-bit W keep the 32-deep pairs; AVX2: 32-deep in place
    "mid-first-deep": ((97, 600), (100, 2048), [0, 0]),
    # the most rows AVX2 reads 32 deep in place (128) and the first it reads deep (129; AVX-512: deep
    # for float32 except the aliasing 2048 columns)
    "mid-last-stream-avx2": ((128, 70), (48, 17), [0, 0]),
    "mid-first-deep-avx2": ((129, 300), (70, 2048), [0, 0]),
    # the most rows AVX-512 reads 32 deep in place (16-bit W, aliasing float32 rows: 4096 columns of
    # float16 are 8 KiB apart too), a last row block of 4 rows
    "mid-last": ((256, 300), (100, 4096), [0, 0]),
    # the first deep in-place size of [K, N] weights (AVX-512: a tile pair and a lone tile; [N, K]: staged)
    "packed-first-avx512": ((257, 40), (48, 17), [0, 1]),
    # [K, N], deep in place (common/gemm.h, kDeepPlain): three k blocks (256 + 256 + 88),
    # 301 rows (a last row block of one row), tile pairs, a lone partial tile (100 = 6 x 16 + 4) and
    # a pair whose second tile is partial (33), the next pair's rows fetched across k blocks
    "deep-plain": ((301, 600), (100, 33), [0, 0]),
    # [K, N]: the most rows read in place (576) and the first packed per task (577)
    "deep-plain-last": ((576, 300), (70,), [0]),
    # 16-bit W deep in place, 512 rows x 2000 columns: ranges whose accumulators and A slice fit in
    # 3/4 of L2 (common/gemm.cc, DeepRangeFitsL2: 4 x 500 columns with a 2 MiB L2, not 3 x 672)
    "deep-plain-narrow": ((512, 300), (2000,), [0]),
    "packed-after-deep": ((577, 300), (70,), [0]),
    "packed-deep": ((2, 70, 601), (130, 13), [0, 1]),  # three k blocks (256, 256, 89), K % 8 != 0
    "packed-chunks": ((4, 203, 70), (1100, 9), [0, 1]),  # 812 rows: two row chunks, two column ranges
    # one row chunk of a [K, N] weight packed per call: its 1100 columns in narrower ranges, so
    # that the threads' tasks balance (common/gemm.cc, PlanTasks)
    "packed-narrow": ((301, 70), (1100,), [0]),
    # 1001 rows: two row chunks (504 + 497, its last row block partial) that one task per column range
    # spans on the custom-op route (W packed once for both), over two k blocks (256 + 44)
    "packed-span": ((1001, 300), (1100, 500, 300), [0, 0, 0]),
    # 1100 rows (two chunks of 552) in one span, on 2 threads at least 6 tasks whose chunks'
    # accumulators stay in L2 (common/gemm.cc, FineGrained): 192-column ranges (4 x 160 + 64 + 64),
    # a width only the fine-grained plans try; each task's last k block writes Y as it goes
    "packed-fine": ((1100, 120), (640, 64, 64), [0, 0, 0]),
    # [n, k] weights, many rows: AVX-512's staged units (two tiles, then a partial one) over three k
    # blocks and two column ranges; the other kernels' packed blocks
    "packed-transposed": ((2, 70, 601), (300, 40), [1, 1]),
    # [n, k] weights, up to 4 rows: the dot form (16-lane partial sums along k, W's rows in groups of
    # 8 / 6 / 4 (AVX-512) or 6 / 3 / 2 / 1, then one row at a time), with a k tail and k < 16
    "dot-rows": ((3, 1, 37), (9, 17, 1), [1, 1, 1]),
    "dot-four": ((4, 300), (50, 3, 8), [1, 0, 1]),
    "dot-short-k": ((2, 7), (13, 6), [1, 1]),
    # [n, k] weights, 5 to 64 rows: the lane form (A's rows in the lanes, tiles of 24 / 12 / 8 / 6 of
    # W's rows by 1-4 zmm, or 12 / 6 / 4 by 1-3 ymm, and every smaller height for the tails), k in
    # blocks of 128 / 64 (AVX-512) or 256 / 128 with a tail, vectors in several chunks with AVX2
    "lane-one-vector": ((5, 64), (24, 23, 1), [1, 1, 1]),
    "lane-two-vectors": ((17, 129), (25, 24), [1, 1]),
    "lane-three-vectors": ((40, 300), (61, 30), [1, 0]),
    "lane-64-rows": ((2, 32, 280), (50, 9), [1, 1]),
}


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_odd_sizes(name, dtype):
    shape, widths, transposed = SHAPES[name]
    case = Case("AddRMSNormLinear", dtype, shape=shape, widths=widths, transposed=transposed,
                bias=[i % 2 for i in range(len(widths))], keep=True, seed=7)
    _check(case, case.run())


@pytest.mark.parametrize("path", ["ort", "own"])
@pytest.mark.parametrize("name", ["one-row-one-col", "decode", "stream-blocks", "packed-deep", "dot-rows"])
def test_forced_float32_paths(monkeypatch, path, name):
    """ORT's Gemm and ours on every row count, both layouts and biases."""
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", path)
    shape, widths, transposed = SHAPES[name]
    case = Case("LayerNormLinear", F32, shape=shape, widths=widths, transposed=transposed, keep=True, seed=13)
    _check(case, case.run())


def test_bad_gemm_knob_is_refused(monkeypatch):
    monkeypatch.setenv("OTFUSE_NORM_LINEAR_GEMM", "mkl")
    with pytest.raises(Exception) as info:
        Case("RMSNormLinear").run()
    assert "OTFUSE_NORM_LINEAR_GEMM must be ort or own, got 'mkl'" in str(info.value)


def test_layernorm_without_norm_bias_and_projection_bias():
    case = Case("LayerNormLinear", shape=(4, 32), widths=(8, 24), bias=[0, 0], norm_bias=False)
    _check(case, case.run())


def test_empty_rows():
    case = Case("RMSNormLinear", shape=(0, 5, 32), widths=(8,))
    got = case.run()
    assert got[0].shape == (0, 5, 8)


@pytest.mark.parametrize("name", ["decode-sweep", "rows-sweep", "stream-blocks", "stream-tall", "stream-tall-deep", "stream-tall-groups", "stream-ranges", "stream-pairs", "mid-first-deep",
                                  "mid-first-deep-avx2", "deep-plain", "packed-deep", "packed-chunks", "packed-transposed",
                                  "dot-four", "lane-three-vectors"])
def test_thread_count_does_not_change_results(name):
    shape, widths, transposed = SHAPES[name]
    case = Case("AddLayerNormLinear", shape=shape, widths=widths, transposed=transposed, seed=11)
    one, two = case.run(threads=1), case.run(threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["decode-sweep", "rows-sweep", "deep-plain-narrow"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["f16", "bf16"])
def test_row_sweep_thread_count_does_not_change_results(name, dtype):
    """16-bit [K, N] weights: the row sweep's column ranges (up to 6 rows) and the deep in-place
    tasks' L2-sized ranges (512 rows) on 1 and 2 threads."""
    shape, widths, transposed = SHAPES[name]
    case = Case("RMSNormLinear", dtype, shape=shape, widths=widths, transposed=transposed, seed=3)
    one, two = case.run(threads=1), case.run(threads=2)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rows", [1100, 512])
@pytest.mark.parametrize("isa", ["auto", "avx2"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_products_bits_do_not_depend_on_the_plans_column_ranges(monkeypatch, isa, dtype, rows):
    """A product's Y is the same bits whatever its node's other products, i.e. whatever column ranges
    the plan gives its tasks and whichever of them it splits in halves at the plan's tail
    (common/gemm.cc, TaperTail: tasks that pack W per call, 577+ rows). 1100 rows (two chunks of 552
    in one span) and 512 (deep in-place tasks, whose ranges FineBudgets narrows to half of L2),
    1000 columns (62 tiles and a partial one) alone, beside a narrow product, and beside a wide one
    (other column ranges, other tasks at the tail)."""
    if isa == "avx2":
        monkeypatch.setenv("OTFUSE_GEMM_ISA", "avx2")
    alone = Case("RMSNormLinear", dtype, shape=(rows, 300), widths=(1000,), bias=[1], seed=5)
    expected = alone.run()
    _check(alone, expected)
    for widths in ((1000, 40), (1000, 2200)):
        case = Case("RMSNormLinear", dtype, shape=(rows, 300), widths=widths, bias=[1, 0], seed=6)
        case.x, case.scale, case.weights[0], case.biases[0] = alone.x, alone.scale, alone.weights[0], alone.biases[0]
        got = case.run()
        _check(case, got)
        bits = np.uint16 if dtype == F16 else np.uint32
        np.testing.assert_array_equal(got[0].view(bits), expected[0].view(bits), err_msg=f"beside {widths[1]} columns")


@pytest.mark.parametrize("op", ["RMSNormLinear", "AddLayerNormLinear"])
@pytest.mark.parametrize("rows", [1, 5, 16, 47, 301, 1003])
@pytest.mark.parametrize("dtype", [F32, F16, BF16], ids=["f32", "f16", "bf16"])
def test_normalised_rows_output_does_not_change_products(op, rows, dtype):
    """The norm's tasks write A in the layouts the GEMM reads (kernels/cpu/norm_linear.cc, Normalize):
    through the Yn output when the node has one, else through a row block of their own, packed into
    row blocks of 6 (row counts that are not multiples of 6 leave a short last block) or row-major
    for the dot / lane forms. Both give the products the same bits, on every path ([K, N] and
    [N, K] weights, streamed, packed in one and in two row chunks) and thread count."""
    kwargs = dict(shape=(rows, 88), widths=(70, 33), transposed=[0, 1], seed=rows)
    without, with_yn = Case(op, dtype, **kwargs), Case(op, dtype, keep=True, **kwargs)
    got = {(keep, threads): case.run(threads=threads) for keep, case in ((False, without), (True, with_yn))
           for threads in (1, 2)}
    _check(with_yn, got[True, 2])
    for key, outputs in got.items():
        for a, b in zip(outputs, got[False, 2]):  # Y_i, and S (Yn is not in both)
            np.testing.assert_array_equal(a, b, err_msg=str(key))


def test_kept_row_buffers_grow_and_are_reused():
    """A's buffers are kept per thread from one run to the next (kernels/common/thread_floats.h):
    small, large (they grow), small again (reused), with and without Yn, each right; one thread,
    so the caller also runs every task."""
    small = dict(shape=(100, 64), widths=(48, 40), transposed=[0, 1], seed=8)
    large = dict(shape=(2, 700, 96), widths=(80, 40), transposed=[0, 1], seed=9)
    few = dict(shape=(20, 96), widths=(80, 40), transposed=[1, 1], seed=10)
    for kwargs in (small, large, few, small, large, few):
        for keep in (False, True):
            for dtype in (F32, F16):
                case = Case("AddRMSNormLinear", dtype, keep=keep, **kwargs)
                _check(case, case.run(threads=1))


@pytest.mark.parametrize("rows", [1, 4, 5, 16, 40, 64])
@pytest.mark.parametrize("dtype", [F32, F16], ids=["f32", "f16"])
def test_transposed_weights_agree_with_k_n_ones(rows, dtype):
    """The same weights stored [K, N] and [N, K]: from 5 rows on the [N, K] lane form runs the same
    FMAs in the same order as the [K, N] path (bit-identical results); up to 4 rows the dot form sums
    16 lanes of partial sums, so the two agree within float32 rounding (docs/ops.md)."""
    widths = (37, 16)
    plain = Case("RMSNormLinear", dtype, shape=(rows, 200), widths=widths, transposed=[0, 0], seed=17)
    flipped = Case("RMSNormLinear", dtype, shape=(rows, 200), widths=widths, transposed=[1, 1], seed=17)
    flipped.weights = [np.ascontiguousarray(w.T) for w in plain.weights]
    a, b = plain.run(), flipped.run()
    _check(flipped, b)
    for x, y in zip(a, b):
        if rows > 4:
            np.testing.assert_array_equal(x, y)
        else:
            np.testing.assert_allclose(x.astype(np.float32), y.astype(np.float32), rtol=TOLERANCE[dtype],
                                       atol=TOLERANCE[dtype])


@pytest.mark.parametrize("rows", [16, 64])
@pytest.mark.parametrize("threads", [1, 2])
def test_lane_form_over_an_odd_count_of_column_ranges(rows, threads):
    """An [N, K] weight wide enough for an odd count of the lane form's column ranges (64 rows:
    10000 columns in 5 ranges of at most 2048; an LM head's shape at few rows): every range's
    columns right, the same bits as the [K, N] weight's path, on either thread count."""
    plain = Case("RMSNormLinear", F32, shape=(rows, 40), widths=(10000,), transposed=[0], seed=23)
    flipped = Case("RMSNormLinear", F32, shape=(rows, 40), widths=(10000,), transposed=[1], seed=23)
    flipped.weights = [np.ascontiguousarray(w.T) for w in plain.weights]
    a, b = plain.run(threads=threads), flipped.run(threads=threads)
    _check(flipped, b)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


_RUN_IN_CHILD = (
    "import numpy as np, onnxruntime as ort, otfuse, sys\n"
    "o = ort.SessionOptions(); o.register_custom_ops_library(otfuse.library_path())\n"
    "for i in range(int(sys.argv[1])):\n"
    "    s = ort.InferenceSession(f'{sys.argv[2]}/m{i}.onnx', o, providers=['CPUExecutionProvider'])\n"
    "    feeds = dict(np.load(f'{sys.argv[2]}/f{i}.npz'))\n"
    "    np.savez(f'{sys.argv[2]}/{sys.argv[3]}{i}.npz', *s.run(None, feeds))\n")


def test_baseline_avx2_and_avx512_variants_agree(tmp_path):
    """The portable micro-kernels (multiply + add), the AVX2 ones (FMA; forced by OTFUSE_GEMM_ISA=avx2)
    and the default ones (AVX-512F where the CPU has it, else AVX2 again), one child process each,
    each against the reference; AVX2 and the default agree bit for bit (the same FMAs in the same
    order), baseline within float32 rounding; on every path of otfuse's GEMM (forced for float32,
    whose one-row products would otherwise take ORT's Gemm), including AVX-512's paired row blocks
    (13, 64, 65, 94, 97 to 256, 257 and 812 rows)."""
    import os
    import subprocess
    import sys
    cases = []
    for name in SHAPES:
        if name == "one-row-one-col":
            continue
        shape, widths, transposed = SHAPES[name]
        for dtype in (F32, F16, BF16):
            cases.append(Case("RMSNormLinear", dtype, shape=shape, widths=widths, transposed=transposed, seed=5))
    for i, case in enumerate(cases):
        model, feeds = case.model()
        (tmp_path / f"m{i}.onnx").write_bytes(model.SerializeToString())
        np.savez(tmp_path / f"f{i}.npz", **feeds)
    knobs = {"baseline": {"OTFUSE_CPU_ISA": "baseline"}, "avx2": {"OTFUSE_GEMM_ISA": "avx2"}, "auto": {}}
    for isa, knob in knobs.items():
        env = {k: v for k, v in os.environ.items() if k not in ("OTFUSE_CPU_ISA", "OTFUSE_GEMM_ISA")}
        env.update(knob, OTFUSE_NORM_LINEAR_GEMM="own")
        subprocess.run([sys.executable, "-c", _RUN_IN_CHILD, str(len(cases)), str(tmp_path), isa], env=env, check=True)
    for i, case in enumerate(cases):
        outputs = {isa: [a for _, a in sorted(np.load(tmp_path / f"{isa}{i}.npz").items(), key=lambda kv: int(kv[0][4:]))]
                   for isa in knobs}
        for got in outputs.values():
            _check(case, got)
        tol = TOLERANCE[case.dtype]
        for b, a2, a in zip(outputs["baseline"], outputs["avx2"], outputs["auto"]):
            np.testing.assert_allclose(b.astype(np.float32), a.astype(np.float32), rtol=tol, atol=tol)
            np.testing.assert_array_equal(a2, a)


@pytest.mark.parametrize("isa", ["baseline", "avx2", "auto"])
def test_float16_results_round_to_nearest_even_on_every_path(monkeypatch, isa):
    """float16 Y is the float32 sum plus the bias rounded once to nearest even, as numpy rounds: with
    K = 1 every path's sum is one exact product (float16 x float16 fits float32), so only the rounding
    differs between paths (the AVX2 / AVX-512 kernels store through F16C, the portable ones through
    FromFloat<Float16>). Weights over the whole float16 range (subnormals, the largest finite value)
    and biases that make ties at every scale, overflow to inf and subnormal results; 1 to 600 rows:
    the row sweep, the in-place tasks, the deep in-place tasks (at 512 rows in L2-sized column
    ranges) and the packed task whose last k block writes Y as it goes (bench/README.md, "norm_linear,
    session 16: fp16")."""
    if isa == "baseline":
        monkeypatch.setenv("OTFUSE_CPU_ISA", "baseline")
    elif isa == "avx2":  # (the AVX2 kernels forced: as test_avx2_kernels_agree_with_the_default_ones)
        monkeypatch.setenv("OTFUSE_GEMM_ISA", "avx2")
    rng = np.random.default_rng(31)
    n = 1600  # 100 full tiles
    bits = rng.integers(0, 0x7c00, n, dtype=np.uint16) | (rng.integers(0, 2, n, dtype=np.uint16) << 15)
    w = bits.view(np.float16).copy()
    w[:4] = [np.float16(65504), np.float16(-65504), np.float16(2.0**-24), np.float16(1.0)]
    ulp = np.spacing(np.minimum(np.abs(w), np.float16(32768))).astype(np.float32)  # float16 ulps (finite)
    bias = (ulp * rng.choice([0.5, 1.5, -0.5, 3.0], n).astype(np.float32)).astype(np.float16)
    bias[0] = np.float16(16.0)  # 65504 * 1.5 + 16: inf either way; 65504 + 16 = 65520 ties to inf
    for rows in (1, 16, 300, 512, 600):
        case = Case("RMSNormLinear", F16, shape=(rows, 1), widths=(n,), bias=[1], keep=True, seed=rows)
        case.x = np.where(np.arange(rows) % 2 == 0, 100, -100).astype(np.float16).reshape(rows, 1)
        case.scale = np.array([1.5], dtype=np.float16)
        case.weights, case.biases = [w.reshape(1, n)], [bias]
        y, yn = case.run()
        assert set(np.abs(yn.astype(np.float32)).ravel()) == {1.5}
        with np.errstate(over="ignore"):  # (65504 * 1.5: inf, as the kernels round it)
            expected = (yn.astype(np.float32) * w.astype(np.float32)[None, :] + bias.astype(np.float32)).astype(np.float16)
        np.testing.assert_array_equal(y.view(np.uint16), expected.view(np.uint16), err_msg=f"{isa}, {rows} rows")


def test_bad_gemm_isa_knob_is_refused(monkeypatch):
    monkeypatch.setenv("OTFUSE_GEMM_ISA", "amx")
    with pytest.raises(Exception) as info:
        Case("RMSNormLinear").run()
    assert "OTFUSE_GEMM_ISA must be avx2 or avx512 (or unset), got 'amx'" in str(info.value)


@pytest.mark.parametrize("overrides,message", [
    (dict(axis=-2), "attribute 'axis' must be -1"),
    (dict(out_features=None), "'out_features' is required"),
    (dict(transposed=[0]), "attribute 'transposed' has 1 entries"),
    (dict(has_bias=[1, 1, 2]), "entries must be 0 or 1"),
    (dict(has_bias=[0, 0, 0]), "expected 5 inputs"),
    (dict(out_features=[64, 32, 31]), "W3 has shape [64, 32] but must equal [K, out_features]"),
    (dict(epsilon=-1.0), "attribute 'epsilon' must be a finite number >= 0"),
])
def test_bad_nodes_are_refused(overrides, message):
    with pytest.raises(Exception, match=None) as info:
        Case("RMSNormLinear").run(**overrides)
    assert message in str(info.value)
    assert "RMSNormLinear (node 'fused_0')" in str(info.value)


def test_mismatched_k_at_run_time():
    case = Case("RMSNormLinear", const=False, shape=(2, 32), widths=(8,))
    case.weights[0] = np.zeros((16, 8), dtype=np.float32)
    with pytest.raises(Exception) as info:
        case.run()
    assert "W1 has shape [16, 8]" in str(info.value)


def test_weight_of_another_type_is_refused():
    case = Case("RMSNormLinear", shape=(2, 32), widths=(8,))
    case.weights[0] = case.weights[0].astype(np.float16)
    with pytest.raises(Exception) as info:
        case.run()
    assert "W1 has element type float16" in str(info.value)


def test_too_few_outputs():
    case = Case("AddRMSNormLinear", widths=(8, 8), shape=(2, 16))
    model, feeds = case.model()
    del model.graph.node[-1].output[-1]  # drop S: the Add* forms always output it
    del model.graph.output[-1]
    options = ort.SessionOptions()
    options.register_custom_ops_library(otfuse.library_path())
    with pytest.raises(Exception) as info:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(None, feeds)
    assert "expected 3 or 4 outputs, got 2" in str(info.value)
