"""CPU kernels of the attention family (Attention, RopeAttention) against otfuse.verify.reference,
through real ONNX Runtime sessions with the custom-op library.

bfloat16 tensors cross the graph boundary as float32 with a Cast on each side (ORT's Python API
cannot feed or fetch bfloat16); the values are bfloat16-exact, so the Casts change nothing.
Both code paths of the kernel (query tiles over packed K/V panels, and the direct path used for
a few query rows) and the CPU variants (AVX-512, AVX2, baseline) are exercised with the
OTFUSE_ATTENTION_PATH, OTFUSE_ATTENTION_ISA and OTFUSE_CPU_ISA knobs; OTFUSE_ATTENTION_TILES
shrinks the tiles so small shapes cross many tile edges.
"""

from __future__ import annotations

import zlib

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from buffers import off_line
from cpu_isa import cpu_isas
from onnx import TensorProto, helper

from otfuse.verify import reference

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
F32 = np.dtype(np.float32)
DTYPES = [F32, F16, BF16]
ONNX_TYPE = {F32: TensorProto.FLOAT, F16: TensorProto.FLOAT16, BF16: TensorProto.BFLOAT16,
             np.dtype(np.int64): TensorProto.INT64, np.dtype(np.int32): TensorProto.INT32,
             np.dtype(bool): TensorProto.BOOL}
# float32: different summation orders (tiles, online softmax) only; half types: one output ulp.
TOLERANCE = {F32: 2e-5, F16: 2e-3, BF16: 1.6e-2}
NODE_NAME = "fused_attention_0"
ATTENTION_INPUTS = ["Q", "K", "V", "attn_bias", "key_padding_mask", "past_key", "past_value", "alibi_slopes", "sinks"]
ROPE_INPUTS = ["Q", "K", "V", "cos", "sin", "attn_bias", "key_padding_mask", "past_key", "past_value", "alibi_slopes", "sinks"]


def build_model(op: str, inputs: dict, attrs: dict, outputs=("Y",)) -> onnx.ModelProto:
    names = ROPE_INPUTS if op == "RopeAttention" else ATTENTION_INPUTS
    graph_inputs, nodes, input_names = [], [], []
    for name in names:
        array = inputs.get(name)
        if array is None:
            input_names.append("")
            continue
        if array.dtype == BF16:
            graph_inputs.append(helper.make_tensor_value_info(f"{name}_f32", TensorProto.FLOAT, None))
            nodes.append(helper.make_node("Cast", [f"{name}_f32"], [name], to=TensorProto.BFLOAT16))
        else:
            graph_inputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[array.dtype], None))
        input_names.append(name)
    while input_names and not input_names[-1]:
        input_names.pop()
    dtype = inputs["Q"].dtype
    all_outputs = ["Y", "present_key", "present_value"]
    output_names = [n if n in outputs else "" for n in all_outputs]
    while output_names and not output_names[-1]:
        output_names.pop()
    graph_outputs, tail = [], []
    for name in output_names:
        if not name:
            continue
        if dtype == BF16:
            tail.append(helper.make_node("Cast", [name], [f"{name}_f32"], to=TensorProto.FLOAT))
            graph_outputs.append(helper.make_tensor_value_info(f"{name}_f32", TensorProto.FLOAT, None))
        else:
            graph_outputs.append(helper.make_tensor_value_info(name, ONNX_TYPE[dtype], None))
    node = helper.make_node(op, input_names, output_names, domain="otfuse", name=NODE_NAME, **attrs)
    graph = helper.make_graph(nodes + [node] + tail, "g", graph_inputs, graph_outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])


def make_session(model: onnx.ModelProto, library: str, threads: int = 2) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.register_custom_ops_library(library)
    options.intra_op_num_threads = threads
    options.log_severity_level = 4
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def run_op(library: str, op: str, inputs: dict, attrs: dict, outputs=("Y",), threads: int = 2) -> list:
    session = make_session(build_model(op, inputs, attrs, outputs), library, threads)
    feeds = {}
    for name, array in inputs.items():
        if array is None:
            continue
        if array.dtype == BF16:
            feeds[f"{name}_f32"] = array.astype(F32)
        else:
            feeds[name] = array
    results = session.run(None, feeds)
    dtype = inputs["Q"].dtype
    return [r.astype(BF16) if dtype == BF16 else r for r in results]


def reference_outputs(op: str, inputs: dict, attrs: dict) -> tuple:
    fn = reference.rope_attention if op == "RopeAttention" else reference.attention
    names = ROPE_INPUTS if op == "RopeAttention" else ATTENTION_INPUTS
    return fn(*[inputs.get(n) for n in names], **attrs)


def assert_close(actual: np.ndarray, expected: np.ndarray, tol: float | None = None) -> None:
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    tol = tol or TOLERANCE[expected.dtype]
    np.testing.assert_allclose(actual.astype(np.float64), expected.astype(np.float64), rtol=tol, atol=tol)


def check(library, inputs: dict, attrs: dict, op: str = "Attention", outputs=("Y",)) -> list:
    got = run_op(library, op, inputs, attrs, outputs)
    y, pk, pv = reference_outputs(op, inputs, attrs)
    want = {"Y": y, "present_key": pk, "present_value": pv}
    for name, g in zip([o for o in ("Y", "present_key", "present_value") if o in outputs], got):
        if name == "Y":
            assert_close(g, want[name])
        else:  # present = past ++ new (rotated): exact copies
            np.testing.assert_array_equal(g.view(np.uint8), want[name].view(np.uint8))
    return got


def rand(rng, shape, dtype, scale=1.0) -> np.ndarray:
    return np.asarray(rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype)


def qkv(rng, b, n, nkv, sq, skv, d, dtype, layout="BNSD", dv=None, scale=1.0):
    dv = dv or d
    if layout == "BNSD":
        shapes = [(b, n, sq, d), (b, nkv, skv, d), (b, nkv, skv, dv)]
    else:
        shapes = [(b, sq, n, d), (b, skv, nkv, d), (b, skv, nkv, dv)]
    q, k, v = (rand(rng, s, dtype, scale) for s in shapes)
    return {"Q": q, "K": k, "V": v}


def with_past(inputs: dict, past: int) -> dict:
    """Moves the first `past` keys/values of a BNSD K/V into past_key/past_value."""
    inputs["past_key"], inputs["past_value"] = inputs["K"][:, :, :past], inputs["V"][:, :, :past]
    inputs["K"], inputs["V"] = inputs["K"][:, :, past:], inputs["V"][:, :, past:]
    return inputs


def seeded(*parts) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(parts).encode()))


# ---- plain attention vs the reference ----

SIZES = [1, 3, 65, 200]


@pytest.mark.parametrize("s", SIZES)
@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_matches_reference(library, dtype, layout, causal, s):
    rng = seeded("basic", dtype.name, layout, causal, s)
    inputs = qkv(rng, 2, 3, 3, s, s, 64, dtype, layout)
    check(library, inputs, {"num_heads": 3, "causal": causal, "layout": layout})


@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("tiles", ["64x128", "5x16", "7x32"])
def test_paths_and_tile_sizes(library, monkeypatch, path, tiles):
    # Small tiles: many diagonal, fully visible and skipped tiles; odd sizes cross every edge.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("paths", path, tiles)
    for sq, skv, window in [(37, 37, 0), (37, 53, 0), (37, 53, 9), (1, 70, 0), (70, 70, 33)]:
        inputs = qkv(rng, 1, 2, 1, sq, skv, 40, F32, dv=24)
        if skv > sq:
            inputs = with_past(inputs, skv - sq)
        check(library, inputs, {"num_heads": 2, "kv_num_heads": 1, "causal": 1, "window": window})


@pytest.mark.parametrize("case", ["plain", "window", "padding", "alibi_softcap", "empty"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_decode_key_splits(library, monkeypatch, dtype, case):
    # Decoding over a long past: the direct path splits the keys of its few row blocks into
    # ranges of whole tiles (4 x 16 tiles over 300 keys: 4 splits of 5 tiles for one query row,
    # 2 of 10 for three; with the window 3 and 2 splits from key 96, the first tile on its edge)
    # and merges the splits' partial results. Some splits see no key (padding); with "empty" every
    # row of batch 1 sees none at all (empty_rows = "uniform": the mean of V).
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "4x16")
    rng = seeded("splits", dtype.name, case)
    b, n, nkv, d, skv = 2, 4, 2, 24, 300
    for sq in (1, 3):
        inputs = with_past(qkv(rng, b, n, nkv, sq, skv, d, dtype, dv=40), skv - sq)
        attrs = {"num_heads": n, "kv_num_heads": nkv, "causal": 1}
        mask = np.ones((b, skv), np.int64)
        if case == "window":
            attrs["window"] = 200
        elif case == "padding":
            mask[0, :200] = 0
            mask[1, 50:140] = 0
        elif case == "alibi_softcap":
            inputs["alibi_slopes"] = (2.0 ** (-8.0 * np.arange(1, n + 1) / n)).astype(F32)
            attrs["softcap"] = 5.0
        elif case == "empty":
            mask[1] = 0
            attrs["empty_rows"] = "uniform"
        if not mask.all():
            inputs["key_padding_mask"] = mask
        check(library, inputs, attrs)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("softcap", [0.0, 3.0])
def test_cpu_variants_agree(library, monkeypatch, dtype, path, softcap):
    # The AVX-512 and AVX2 variants use FMA and other exp evaluation orders: not bit-exact with
    # the baseline, but all stay within the reference tolerance and close to each other. D = 72:
    # 4.5 panels of 16 lanes (the AVX-512 kernels take them in pairs, then a single one).
    # OTFUSE_ATTENTION_ISA=avx2 picks the AVX2 variant on a CPU with AVX-512.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    rng = seeded("isa", dtype.name, path, softcap)
    inputs = qkv(rng, 1, 2, 2, 67, 67, 72, dtype)
    attrs = {"num_heads": 2, "causal": 1, "softcap": softcap}
    default, avx2, baseline = _under_each_isa(library, monkeypatch, inputs, attrs)
    assert_close(default, avx2)
    assert_close(default, baseline)


@pytest.mark.parametrize("tiles", ["64x128", "7x32"])
@pytest.mark.parametrize("d", [72, 16, 8])
def test_float32_keys_packed_panel_by_panel(library, monkeypatch, tiles, d):
    # float32 values of whole 16-lane panels are read in place and the keys packed a panel of 16
    # keys at a time (AVX-512: 16 x 16 transposes, then lane by lane for D % 16; a panel of fewer
    # than 16 keys lane by lane, zero-filled): 67 keys leave 3 in the last panel, over a past
    # and a new segment.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("pack-panels", tiles, d)
    inputs = with_past(qkv(rng, 1, 2, 1, 40, 67, d, F32, dv=32), 27)
    attrs = {"num_heads": 2, "kv_num_heads": 1, "causal": 1}
    default, avx2, baseline = _under_each_isa(library, monkeypatch, inputs, attrs)
    assert_close(default, baseline)
    assert_close(avx2, baseline)


@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
@pytest.mark.parametrize("tiles", ["64x128", "7x32"])
@pytest.mark.parametrize("d, dv", [(72, 24), (20, 40), (16, 8)])
def test_half_keys_and_values_packed(library, monkeypatch, dtype, tiles, d, dv):
    # float16 / bfloat16 keys packed a panel at a time (AVX-512: 16 rows widened in registers and
    # transposed, a masked tail for D % 16; AVX2: 8 x 8 blocks when D and Dv are multiples of 8,
    # else lane by lane) and values 16 (8) lanes at a time: 67 keys over a past and a new
    # segment leave 3 in the last panel.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("pack-half", dtype.name, tiles, d, dv)
    inputs = with_past(qkv(rng, 1, 2, 1, 40, 67, d, dtype, dv=dv), 27)
    attrs = {"num_heads": 2, "kv_num_heads": 1, "causal": 1}
    default, avx2, baseline = _under_each_isa(library, monkeypatch, inputs, attrs)
    assert_close(default, baseline)
    assert_close(avx2, baseline)


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
@pytest.mark.parametrize("case", ["causal", "window", "alibi", "padding"])
def test_lazy_packing_equals_a_packing_phase(library, monkeypatch, dtype, case):
    # Each key tile is packed by the first task that reads it (tasks that find it being packed
    # pack the tiles they read next): bit for bit what packing every tile in a phase of its own
    # gives, on 1, 2 and 4 threads. 7 x 16 tiles over 130 keys: many tasks race for each tile;
    # ALiBi walks the tiles backwards, padding skips a whole tile (never packed).
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "7x16")
    rng = seeded("lazy-pack", dtype.name, case)
    n, nkv = 4, 2
    inputs = with_past(qkv(rng, 2, n, nkv, 90, 130, 24, dtype, dv=40), 40)
    attrs = {"num_heads": n, "kv_num_heads": nkv, "causal": 1}
    if case == "window":
        attrs["window"] = 37
    elif case == "alibi":
        inputs["alibi_slopes"] = (2.0 ** (-8.0 * np.arange(1, n + 1) / n)).astype(F32)
    elif case == "padding":
        mask = np.ones((2, 130), np.int64)
        mask[0, 16:40] = 0
        inputs["key_padding_mask"] = mask
    (lazy,) = check(library, inputs, attrs)
    for threads in (1, 4):
        (other,) = run_op(library, "Attention", inputs, attrs, threads=threads)
        np.testing.assert_array_equal(other.view(np.uint8), lazy.view(np.uint8))
    monkeypatch.setenv("OTFUSE_ATTENTION_PACK", "phase")
    (phase,) = run_op(library, "Attention", inputs, attrs)
    np.testing.assert_array_equal(phase.view(np.uint8), lazy.view(np.uint8))


def _under_each_isa(library, monkeypatch, inputs, attrs):
    """The op's output with the default kernels, the AVX2 variant forced, and the baseline."""
    (default,) = check(library, inputs, attrs)
    monkeypatch.setenv("OTFUSE_ATTENTION_ISA", "avx2")
    (avx2,) = check(library, inputs, attrs)
    monkeypatch.delenv("OTFUSE_ATTENTION_ISA")
    monkeypatch.setenv("OTFUSE_CPU_ISA", "baseline")
    (baseline,) = check(library, inputs, attrs)
    return default, avx2, baseline


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("head_size", [128, 20])
@pytest.mark.parametrize("group", [4, 6])
def test_cpu_variants_agree_decoding(library, monkeypatch, dtype, head_size, group):
    # The direct path's block kernels (AVX-512, float16 / bfloat16: 4 query rows x 4 keys; AVX2: 4 x 2; scores
    # summed across lanes together; values widened in registers on AVX-512) against the baseline,
    # on a decode step of grouped heads: 4 or 6 query rows per kv head (6: a 4-row block and 2
    # rows left), 301 keys (a key block left over), D = 128 or 20 (a masked tail; AVX2 takes the
    # per-key loop there).
    rng = seeded("isa-decode", dtype.name, head_size, group)
    inputs = qkv(rng, 1, 2 * group, 2, 1, 301, head_size, dtype)
    attrs = {"num_heads": 2 * group, "kv_num_heads": 2, "causal": 1}
    default, avx2, baseline = _under_each_isa(library, monkeypatch, inputs, attrs)
    assert_close(default, baseline)
    assert_close(avx2, baseline)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("head_size", [24, 136])
def test_decode_values_read_in_place_over_past_and_new(library, monkeypatch, dtype, head_size):
    # The direct path's P·V reading float16 / bfloat16 values where they are (AVX-512: 64-lane
    # passes, unmasked inside the row, masked at its end; AVX2: 16-lane passes, then one of 8 for
    # D % 16 == 8): D = 24 and 136, the past rows (BNSD) and the new ones (BSND, row stride
    # heads * D) as two segments of a tile, 4 query rows per kv head.
    rng = seeded("decode-values", dtype.name, head_size)
    inputs = qkv(rng, 1, 8, 2, 1, 3, head_size, dtype, layout="BSND")
    inputs["past_key"] = rand(rng, (1, 2, 290, head_size), dtype)
    inputs["past_value"] = rand(rng, (1, 2, 290, head_size), dtype)
    attrs = {"num_heads": 8, "kv_num_heads": 2, "causal": 1, "layout": "BSND"}
    default, avx2, baseline = _under_each_isa(library, monkeypatch, inputs, attrs)
    assert_close(default, baseline)
    assert_close(avx2, baseline)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("group", [5, 6, 8])
def test_decode_key_blocks_with_leftover_rows(library, monkeypatch, dtype, group):
    # AVX-512 direct path (every type since session 26): 4 keys x 4 query rows per block, the rows
    # past the last multiple of 4 (group 5, 6) key by key; D = 72 (four 16-lane chunks and a masked
    # half), 131 keys (not a multiple of 4): a past of 130 and one new key.
    rng = seeded("decode-key-blocks", dtype.name, group)
    inputs = with_past(qkv(rng, 1, 2 * group, 2, 1, 131, 72, dtype), 130)
    attrs = {"num_heads": 2 * group, "kv_num_heads": 2, "causal": 1}
    default, avx2, baseline = _under_each_isa(library, monkeypatch, inputs, attrs)
    assert_close(default, baseline)
    assert_close(avx2, baseline)


@pytest.mark.parametrize("order", ["forwards", "alibi_backwards"])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
def test_decode_next_key_tile_fetch_edges(library, monkeypatch, dtype, order):
    # AVX-512, float16 / bfloat16 decode: each tile's P·V pass fetches the next tile's past keys
    # into L2 (NextKeyTile), the score pass the block's values. The next tile may be cut by the
    # end of the past (new rows after it), by the end of the task's key split, or lie before the
    # current one (ALiBi walks the tiles backwards); pasts of a whole number of tiles, one key
    # more and one less; D = 40 (a row of 80 bytes: the fetched range ends inside a line).
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "4x16")
    rng = seeded("next-keys", dtype.name, order)
    n, nkv, d = 8, 2, 40
    for past, new in [(64, 1), (63, 2), (65, 1), (160, 3), (17, 1)]:
        inputs = qkv(rng, 1, n, nkv, new, new, d, dtype)
        inputs["past_key"] = rand(rng, (1, nkv, past, d), dtype)
        inputs["past_value"] = rand(rng, (1, nkv, past, d), dtype)
        attrs = {"num_heads": n, "kv_num_heads": nkv, "causal": 1}
        if order == "alibi_backwards":
            inputs["alibi_slopes"] = (2.0 ** (-8.0 * np.arange(1, n + 1) / n)).astype(F32)
        check(library, inputs, attrs)


@pytest.mark.parametrize("head_size", [128, 72])
@pytest.mark.parametrize("dtype", [F16, BF16], ids=lambda d: d.name)
def test_decode_value_pass_key_pairs(library, monkeypatch, dtype, head_size):
    # The direct path's P·V passes over a tile's keys in pairs with the L1 lead and the next
    # tile's L2 fetch in a loop of their own, then the keys the lead would pass (AVX-512 since
    # session 17, AVX2 since session 11): tiles of 16 and 32 keys cut by the past's end so that
    # a tile's past segment holds fewer keys than the pair loop needs (< 10), exactly 10, 11, an
    # odd and an even count; D = 128 (whole 64-lane passes) and 72 (one masked pass).
    rng = seeded("pv-pairs", dtype.name, head_size)
    n, nkv = 8, 2
    for tiles in ("4x16", "4x32"):
        monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
        for past in (7, 9, 10, 11, 42, 75):
            monkeypatch.delenv("OTFUSE_CPU_ISA", raising=False)  # _under_each_isa leaves the baseline set
            inputs = qkv(rng, 1, n, nkv, 1, 1, head_size, dtype)
            inputs["past_key"] = rand(rng, (1, nkv, past, head_size), dtype)
            inputs["past_value"] = rand(rng, (1, nkv, past, head_size), dtype)
            _under_each_isa(library, monkeypatch, inputs, {"num_heads": n, "kv_num_heads": nkv, "causal": 1})


@pytest.mark.parametrize("window", [1, 16, 100, 500])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_sliding_window(library, dtype, window):
    rng = seeded("window", dtype.name, window)
    inputs = qkv(rng, 1, 2, 2, 200, 200, 32, dtype)
    check(library, inputs, {"num_heads": 2, "causal": 1, "window": window})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
@pytest.mark.parametrize("isa", ["avx2", "avx512"])
def test_narrow_window_row_sweep(library, monkeypatch, isa, dtype):
    # Windows up to 512 keys run as a sweep over 14-row (AVX2: 12-row) blocks, each over exactly its
    # keys (AttendWindowRows); 16-bit inputs, whose values P·V reads from packed tiles, up to 192
    # keys on AVX-512 and 512 on AVX2; wider windows on tiles: all against the reference, with a
    # KV cache (the past / new seam inside a block's keys), softcap and a bias, rows not a multiple
    # of the block, a block's keys across 2-5 value tiles, and bit for bit on 1 and 3 threads.
    if isa not in cpu_isas():
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setenv("OTFUSE_ATTENTION_ISA", isa)
    rng = seeded("row-sweep", isa, dtype.name)
    for sq, past, window, extra in [(150, 0, 100, {}), (77, 600, 512, {"softcap": 30.0}), (90, 600, 513, {}),
                                    (64, 0, 20, {"bias": True}), (200, 500, 13, {}), (120, 300, 192, {}),
                                    (120, 300, 193, {"softcap": 30.0})]:
        inputs = qkv(rng, 1, 4, 2, sq, sq, 64, dtype)
        if past:
            inputs["past_key"] = rand(rng, (1, 2, past, 64), dtype)
            inputs["past_value"] = rand(rng, (1, 2, past, 64), dtype)
        attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": 1, "window": window}
        if extra.get("softcap"):
            attrs["softcap"] = extra["softcap"]
        if extra.get("bias"):
            inputs["attn_bias"] = rand(rng, (1, 4, sq, sq + past), dtype)
        (y,) = check(library, inputs, attrs)
        (one,) = run_op(library, "Attention", inputs, attrs, threads=1)
        (three,) = run_op(library, "Attention", inputs, attrs, threads=3)
        np.testing.assert_array_equal(one.view(np.uint8), y.view(np.uint8))
        np.testing.assert_array_equal(three.view(np.uint8), y.view(np.uint8))


def test_window_one_sees_only_itself(library):
    rng = seeded("window1")
    inputs = qkv(rng, 1, 1, 1, 9, 9, 8, F32)
    (y,) = run_op(library, "Attention", inputs, {"num_heads": 1, "causal": 1, "window": 1})
    np.testing.assert_allclose(y, inputs["V"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_window_fetches_the_tile_below_without_changing_results(library, monkeypatch, layout):
    # A sliding-window task fetches the raw rows of the key tile below its first one (the next
    # tasks' first tile, packed lazily) and its output rows while its tiles run: with the tile
    # below in the past, in the new rows, across both (contiguous or not: BSND new rows are
    # strided), none, or the window wider than every row's keys; on 1 and 2 threads.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "8x16")
    rng = seeded("window-below", layout)
    for sq, past, window in [(70, 0, 40), (40, 60, 45), (40, 30, 33), (50, 20, 1), (30, 10, 500)]:
        inputs = qkv(rng, 1, 2, 1, sq, sq, 16, F32, layout=layout)
        if past:
            inputs["past_key"] = rand(rng, (1, 1, past, 16), F32)
            inputs["past_value"] = rand(rng, (1, 1, past, 16), F32)
        attrs = {"num_heads": 2, "kv_num_heads": 1, "causal": 1, "window": window, "layout": layout}
        (y,) = check(library, inputs, attrs)
        (one,) = run_op(library, "Attention", inputs, attrs, threads=1)
        np.testing.assert_array_equal(one.view(np.uint8), y.view(np.uint8))


def _off_line(array: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `array` starting `offset` bytes past a 64-byte line."""
    out = off_line(array.shape, array.dtype, offset)
    out[...] = array
    return out


def _run_bound(library, inputs: dict, attrs: dict) -> np.ndarray:
    """Y with every input bound as an OrtValue over the caller's memory (no copy: its alignment stays)."""
    session = make_session(build_model("Attention", inputs, attrs), library)
    binding = session.io_binding()
    for name, array in inputs.items():
        value = ort.OrtValue.ortvalue_from_numpy(array)
        assert value.data_ptr() == array.ctypes.data
        binding.bind_ortvalue_input(name, value)
    binding.bind_output("Y")
    session.run_with_iobinding(binding)
    return binding.copy_outputs_to_cpu()[0]


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("offset", [16, 48])
def test_values_read_in_place_off_a_cache_line(library, monkeypatch, isa, offset):
    # float32 values read in place (D a multiple of 16) from rows that do not start on a 64-byte
    # line take P·V in blocks of 64 keys (TilePv): the same sums, bit for bit, as aligned rows.
    if isa not in cpu_isas():
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setenv("OTFUSE_ATTENTION_ISA", isa)
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    rng = seeded("v-off-line", isa, offset)
    for causal, sq, skv in [(0, 70, 200), (1, 130, 130), (1, 40, 300)]:
        inputs = qkv(rng, 1, 2, 2, sq, skv, 32, F32)
        attrs = {"num_heads": 2, "causal": causal}
        aligned = _run_bound(library, {k: _off_line(v, 0) for k, v in inputs.items()}, attrs)
        shifted = _run_bound(library, {**inputs, "V": _off_line(inputs["V"], offset)}, attrs)
        np.testing.assert_array_equal(shifted.view(np.uint8), aligned.view(np.uint8))
        assert_close(aligned, reference_outputs("Attention", inputs, attrs)[0])


@pytest.mark.parametrize("tiles", ["64x128", "8x32"])
@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_misaligned_values_staged_like_aligned_ones(library, monkeypatch, layout, tiles):
    # float32 values whose rows do not all start on a 64-byte line (past or new) are copied tile by
    # tile into an aligned buffer by the packing tasks when there is no present_value, and P·V
    # reads them there: Y bit for bit as from the same inputs on 64-byte lines (read in place).
    # KV cache shapes (past + new, the boundary inside a tile), GQA, a window, 1 and 3 threads.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("staged-values", layout, tiles)
    for sq, past, causal, window in [(40, 90, 1, 0), (64, 0, 0, 0), (50, 100, 1, 40), (33, 200, 0, 0)]:
        inputs = qkv(rng, 1, 4, 2, sq, sq, 32, F32, layout=layout)
        if past:
            inputs["past_key"] = rand(rng, (1, 2, past, 32), F32)
            inputs["past_value"] = rand(rng, (1, 2, past, 32), F32)
        attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": causal, "window": window, "layout": layout}
        aligned = _run_bound(library, {k: _off_line(v, 0) for k, v in inputs.items()}, attrs)
        for name, offset in [("V", 16), ("past_value", 48)]:
            if name not in inputs:
                continue
            shifted = _run_bound(library, {**inputs, name: _off_line(inputs[name], offset)}, attrs)
            np.testing.assert_array_equal(shifted.view(np.uint8), aligned.view(np.uint8))
        (one,) = run_op(library, "Attention", {**inputs, "V": _off_line(inputs["V"], 16)}, attrs, threads=1)
        (three,) = run_op(library, "Attention", {**inputs, "V": _off_line(inputs["V"], 16)}, attrs, threads=3)
        np.testing.assert_array_equal(one.view(np.uint8), aligned.view(np.uint8))
        np.testing.assert_array_equal(three.view(np.uint8), aligned.view(np.uint8))
        assert_close(aligned, reference_outputs("Attention", inputs, attrs)[0])


@pytest.mark.parametrize("isa", ["avx2", "avx512"])
@pytest.mark.parametrize("tiles", ["64x128", "8x32"])
def test_strided_new_values_packed_like_in_place_ones(library, monkeypatch, isa, tiles):
    # float32 values (D a multiple of 16) are read in place, except the tiles holding new rows that
    # are not D apart (BSND: N*D), whose values are packed (from the tile with the first new row,
    # past rows included): Y bit for bit as the same inputs in BNSD, whose values all stay in place;
    # with and without a past (the boundary inside a tile or on one), causal or not, a window.
    if isa not in cpu_isas():
        pytest.skip(f"this CPU has no {isa}")
    monkeypatch.setenv("OTFUSE_ATTENTION_ISA", isa)
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("strided-values", isa, tiles)
    for sq, past, causal, window in [(70, 0, 0, 0), (40, 90, 1, 0), (33, 64, 1, 0), (50, 100, 1, 40)]:
        bsnd = qkv(rng, 1, 4, 2, sq, sq, 32, F32, layout="BSND")
        bsnd["past_key"], bsnd["past_value"] = rand(rng, (1, 2, past, 32), F32), rand(rng, (1, 2, past, 32), F32)
        if not past:
            del bsnd["past_key"], bsnd["past_value"]
        bnsd = {k: (np.ascontiguousarray(v.transpose(0, 2, 1, 3)) if k in "QKV" else v) for k, v in bsnd.items()}
        attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": causal, "window": window, "output_layout": "BNSD"}
        (y,) = check(library, bsnd, {**attrs, "layout": "BSND"})
        (expected,) = run_op(library, "Attention", bnsd, attrs)
        np.testing.assert_array_equal(y.view(np.uint8), expected.view(np.uint8))


WINDOW_SLOT_CASES = {  # tiles: (sq, past, window, head size); every case has tasks of 5+ key tiles
    "64x128": [(700, 0, 520, 128), (300, 500, 450, 128)],
    "16x32": [(150, 0, 100, 32), (90, 70, 117, 32), (200, 0, 150, 32)],
}


@pytest.mark.parametrize("tiles", list(WINDOW_SLOT_CASES))
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_window_queries_in_place_and_rows_fetched_through_the_slots(library, monkeypatch, dtype, tiles):
    # A sliding-window task reads float32 BNSD query rows where they are (QueryRowsInPlace) and,
    # when it has 5 key tiles or more, fetches its output rows and the next task's query rows
    # through the tile kernels' prefetch slots during its fourth tile: Y bit for bit as BSND inputs
    # (query rows copied), on 1 and 2 threads; windows not multiples of the tile, with a past.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("window-slots", dtype.name, tiles)
    for sq, past, window, d in WINDOW_SLOT_CASES[tiles]:
        bsnd = qkv(rng, 1, 2, 1, sq, sq, d, dtype, layout="BSND")
        if past:
            bsnd["past_key"], bsnd["past_value"] = rand(rng, (1, 1, past, d), dtype), rand(rng, (1, 1, past, d), dtype)
        bnsd = {k: (np.ascontiguousarray(v.transpose(0, 2, 1, 3)) if k in "QKV" else v) for k, v in bsnd.items()}
        attrs = {"num_heads": 2, "kv_num_heads": 1, "causal": 1, "window": window, "output_layout": "BNSD"}
        (y,) = check(library, bnsd, attrs)
        (one,) = run_op(library, "Attention", bnsd, attrs, threads=1)
        (copied,) = run_op(library, "Attention", bsnd, {**attrs, "layout": "BSND"})
        np.testing.assert_array_equal(one.view(np.uint8), y.view(np.uint8))
        np.testing.assert_array_equal(copied.view(np.uint8), y.view(np.uint8))


@pytest.mark.parametrize("tiles", ["64x128", "28x32", "20x48"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_edge_tiles_skip_what_no_row_block_sees(library, monkeypatch, dtype, tiles):
    # On the tiles crossing the diagonal or the window's lower edge the tile kernels skip, per row
    # block (14 or 6 rows), the key panels and keys none of its rows sees. Float32 values of 32
    # lanes are read in place, split where the past meets the new rows; float16 ones are packed.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", "packed")
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("band", dtype.name, tiles)
    for sq, past, window in [(90, 0, 0), (90, 0, 37), (61, 45, 0), (61, 45, 50), (33, 100, 17)]:
        inputs = qkv(rng, 1, 2, 2, sq, sq, 32, dtype)
        if past:
            inputs["past_key"] = rand(rng, (1, 2, past, 32), dtype)
            inputs["past_value"] = rand(rng, (1, 2, past, 32), dtype)
        check(library, inputs, {"num_heads": 2, "causal": 1, "window": window})



@pytest.mark.parametrize("kv_heads", [4, 2, 1])
@pytest.mark.parametrize("layout", ["BNSD", "BSND"])
def test_grouped_query_heads(library, layout, kv_heads):
    rng = seeded("gqa", layout, kv_heads)
    inputs = qkv(rng, 2, 4, kv_heads, 33, 33, 16, F32, layout)
    check(library, inputs, {"num_heads": 4, "kv_num_heads": kv_heads, "causal": 1, "layout": layout})


@pytest.mark.parametrize("tiles", ["3x16", "64x128"])
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_decode_serves_a_kv_group_per_task(library, monkeypatch, dtype, tiles):
    # Direct path: one task takes the query heads of one kv head (a slice of them when the group
    # has more heads than a tile has rows: 8 > 3), so each cached row is read once per group.
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", tiles)
    rng = seeded("decode_group", dtype.name, tiles)
    for new in (1, 2):
        inputs = qkv(rng, 2, 8, 1, new, new, 32, dtype)
        inputs["past_key"] = rand(rng, (2, 1, 45, 32), dtype)
        inputs["past_value"] = rand(rng, (2, 1, 45, 32), dtype)
        check(library, inputs, {"num_heads": 8, "kv_num_heads": 1, "causal": 1},
              outputs=("Y", "present_key", "present_value"))


def test_gqa_head_mapping_is_h_over_group(library):
    # kv head g must serve query heads [g*group, (g+1)*group): V of kv head g is the constant g.
    b, n, nkv, s, d = 1, 6, 2, 5, 4
    q = np.zeros((b, n, s, d), np.float32)
    k = np.zeros((b, nkv, s, d), np.float32)
    v = np.broadcast_to(np.arange(nkv, dtype=np.float32)[None, :, None, None], (b, nkv, s, d)).copy()
    (y,) = run_op(library, "Attention", {"Q": q, "K": k, "V": v}, {"num_heads": n, "kv_num_heads": nkv})
    np.testing.assert_array_equal(y[0, :, 0, 0], [0, 0, 0, 1, 1, 1])


@pytest.mark.parametrize("past,new", [(37, 1), (100, 65), (0, 20), (130, 3)])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_kv_cache(library, dtype, past, new):
    rng = seeded("cache", dtype.name, past, new)
    inputs = qkv(rng, 2, 4, 2, new, new, 32, dtype)
    inputs["past_key"] = rand(rng, (2, 2, past, 32), dtype)
    inputs["past_value"] = rand(rng, (2, 2, past, 32), dtype)
    attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": 1}
    check(library, inputs, attrs, outputs=("Y", "present_key", "present_value"))
    check(library, inputs, attrs, outputs=("Y",))  # K/V read from past and new, no present written
    check(library, inputs, attrs, outputs=("Y", "present_value"))


def test_present_without_past(library):
    rng = seeded("present")
    inputs = qkv(rng, 1, 2, 2, 9, 9, 8, F16, "BSND")
    check(library, inputs, {"num_heads": 2, "causal": 1, "layout": "BSND"},
          outputs=("Y", "present_key", "present_value"))


PRESENT_CASES = ["gqa", "no_past", "bsnd", "window", "padding", "empty_rows", "decode_splits", "no_query", "rope"]


def present_case(rng, case: str, dtype, dv: int):
    """(op, inputs, attrs) of test_present_written_by_the_tasks: 2 x 4 query heads over 2 kv heads,
    D = 20, 23 past + 47 new keys unless the case says otherwise."""
    b, n, nkv, d = 2, 4, 2, 20
    past, new, sq = {"no_past": (0, 47, 47), "window": (64, 6, 6), "decode_splits": (299, 1, 1),
                     "no_query": (23, 5, 0)}.get(case, (23, 47, 47))
    layout = "BSND" if case == "bsnd" else "BNSD"
    inputs = qkv(rng, b, n, nkv, sq, new, d, dtype, layout, dv=dv)
    inputs["past_key"] = rand(rng, (b, nkv, past, d), dtype)  # always BNSD
    inputs["past_value"] = rand(rng, (b, nkv, past, dv), dtype)
    attrs = {"num_heads": n, "kv_num_heads": nkv, "causal": 1, "layout": layout}
    if case == "window":
        attrs["window"] = 9  # the last rows see keys 61..69: tiles 0-2 are read by no task
    elif case == "padding":
        mask = np.ones((b, past + new), np.int64)
        mask[:, 16:40] = 0  # tile 1 wholly padded out: read by no task
        inputs["key_padding_mask"] = mask
    elif case == "empty_rows":
        mask = np.ones((b, past + new), np.int64)
        mask[1] = 0  # no task reads batch 1's tiles; its rows get the mean of every value
        inputs["key_padding_mask"] = mask
        attrs["empty_rows"] = "uniform"
    elif case == "rope":
        c, s = cos_sin(rng, past + np.arange(new), d, dtype)
        inputs["cos"], inputs["sin"] = c[None, None], s[None, None]  # [1, 1, S, r]
        return "RopeAttention", inputs, attrs
    return "Attention", inputs, attrs


@pytest.mark.parametrize("dv", [40, 32])
@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("case", PRESENT_CASES)
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_present_written_by_the_tasks(library, monkeypatch, dtype, case, path, dv):
    # present_key / present_value are copied tile by tile by the task that packs each key tile, or
    # on the direct path the first task that reads it (streaming stores), and the tiles no task
    # reads (below the window, padded out, no query row) afterwards: exact copies of past ++ new
    # (new keys rotated) on every path, ISA, packing mode and thread count, either output alone;
    # Y bit for bit what the node gives without present outputs. float32 values of Dv = 32 (whole
    # 16-lane panels) are read in place by the packed path from present_value, written before the
    # tile is marked packed (and before the uniform empty rows read every value). 16-key tiles
    # straddle past and new; float16 rows of 40 / 80 bytes start off 64-byte lines (the copy's
    # unaligned heads and tails); BSND new rows are strided; decoding over 300 keys splits them.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "4x16" if case == "decode_splits" else "7x16")
    rng = seeded("present-tasks", dtype.name, case, path, dv)
    op, inputs, attrs = present_case(rng, case, dtype, dv)
    both = ("Y", "present_key", "present_value")
    want = check(library, inputs, attrs, op=op, outputs=both)
    (alone,) = run_op(library, op, inputs, attrs)
    np.testing.assert_array_equal(alone.view(np.uint8), want[0].view(np.uint8))
    runs = [run_op(library, op, inputs, attrs, outputs=both, threads=threads) for threads in (1, 3)]
    runs.append([want[0], *run_op(library, op, inputs, attrs, outputs=("Y", "present_key"))[1:], want[2]])
    runs.append([want[0], want[1], *run_op(library, op, inputs, attrs, outputs=("Y", "present_value"))[1:]])
    for knob, value in [("OTFUSE_ATTENTION_PACK", "phase"), ("OTFUSE_ATTENTION_ISA", "avx2"),
                        ("OTFUSE_CPU_ISA", "baseline")]:
        monkeypatch.setenv(knob, value)
        got = run_op(library, op, inputs, attrs, outputs=both)
        runs.append(got if knob == "OTFUSE_ATTENTION_PACK" else [want[0], *got[1:]])  # Y: other FMAs
        monkeypatch.delenv(knob)
    for got in runs:
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.view(np.uint8), w.view(np.uint8))


BIAS_SHAPES = {
    "1x1x1xSkv": lambda b, n, sq, skv: (1, 1, 1, skv),
    "BxNx1xSkv": lambda b, n, sq, skv: (b, n, 1, skv),
    "Bx1xSqxSkv": lambda b, n, sq, skv: (b, 1, sq, skv),
    "BxNxSqxSkv": lambda b, n, sq, skv: (b, n, sq, skv),
    "SqxSkv": lambda b, n, sq, skv: (sq, skv),
    "BxNxSqx1": lambda b, n, sq, skv: (b, n, sq, 1),
    "scalar": lambda b, n, sq, skv: (),
}


@pytest.mark.parametrize("bias_dtype", ["same", "float32"])
@pytest.mark.parametrize("shape", BIAS_SHAPES.values(), ids=BIAS_SHAPES.keys())
@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_attn_bias_broadcast(library, dtype, shape, bias_dtype):
    rng = seeded("bias", dtype.name, shape(2, 3, 5, 7), bias_dtype)
    b, n, sq, past = 2, 3, 19, 30
    inputs = qkv(rng, b, n, n, sq, sq, 16, dtype)
    inputs["past_key"] = rand(rng, (b, n, past, 16), dtype)
    inputs["past_value"] = rand(rng, (b, n, past, 16), dtype)
    inputs["attn_bias"] = rand(rng, shape(b, n, sq, past + sq), F32 if bias_dtype == "float32" else dtype, 2.0)
    check(library, inputs, {"num_heads": n, "causal": 1})


def test_alibi_bias_bloom_shape(library):
    # BLOOM's alibi is [B*N, 1, Skv] (slope * key position); the rewriter reshapes it to [B, N, 1, Skv].
    rng = seeded("alibi")
    b, n, s = 2, 4, 50
    slopes = 2.0 ** (-8.0 * np.arange(1, n + 1) / n)
    alibi = (slopes[:, None] * np.arange(s)[None, :]).astype(np.float32)
    inputs = qkv(rng, b, n, n, s, s, 16, F32)
    inputs["attn_bias"] = np.broadcast_to(alibi[None, :, None, :], (b, n, 1, s)).copy()
    check(library, inputs, {"num_heads": n, "causal": 1})


@pytest.mark.parametrize("mask_dtype", [np.int64, np.int32, np.bool_])
@pytest.mark.parametrize("path", ["direct", "packed"])
def test_key_padding_mask_left_padding(library, monkeypatch, path, mask_dtype):
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "8x16")
    rng = seeded("kpm", path, np.dtype(mask_dtype).name)
    b, n, s = 3, 2, 41
    inputs = qkv(rng, b, n, n, s, s, 16, F32)
    mask = np.ones((b, s), mask_dtype)
    mask[1, :7] = 0   # left padding: with causal, query rows 0..6 see no key at all (output 0)
    mask[2, :35] = 0  # whole leading tiles padded out
    inputs["key_padding_mask"] = mask
    (y,) = check(library, inputs, {"num_heads": n, "causal": 1})
    assert not np.any(y[1, :, :7]) and np.all(np.abs(y[1, :, 7:]).sum(-1) > 0)


@pytest.mark.parametrize("causal", [0, 1])
@pytest.mark.parametrize("path", ["direct", "packed"])
def test_key_padding_mask_padded_ends_trimmed(library, monkeypatch, path, causal):
    # The padded keys at either end of a row's keys are not visited (whole tiles skipped, the last
    # kept key's tile trimmed after it, whole 16-key panels before the first kept key skipped), and
    # a tile with no padded key takes no mask term: right padding ending inside a panel, both ends
    # padded, a hole in the middle, one key kept; every variant against the reference.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "8x32")
    rng = seeded("kpm-ends", path, causal)
    b, n, s = 4, 2, 100
    inputs = qkv(rng, b, n, n, s, s, 16, F32)
    mask = np.ones((b, s), np.int64)
    mask[0, 70:] = 0
    mask[1, :37] = 0
    mask[1, 90:] = 0
    mask[2, 50:60] = 0
    mask[2, 99] = 0
    mask[3, :] = 0
    mask[3, 64] = 1
    inputs["key_padding_mask"] = mask
    _under_each_isa(library, monkeypatch, inputs, {"num_heads": n, "causal": causal})


@pytest.mark.parametrize("path", ["direct", "packed"])
def test_softcap_alone_small_scores_every_variant(library, monkeypatch, path):
    # Rows whose every |s * scale / softcap| <= 0.3 (a softcap of 50 over unit scores, as a
    # soft-capped model's) take the exponent's folded polynomial (CappedExp) four rows at a time;
    # rows 8.. scaled so that their block's largest |a| is ~0.5 take the per-vector tanh forms;
    # 70 keys: whole vectors and a tail. Every variant against the reference.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "16x64")
    rng = seeded("softcap-small", path)
    inputs = qkv(rng, 1, 2, 2, 24, 70, 32, F32)
    inputs["Q"][:, :, 8:12] *= 25.0
    _under_each_isa(library, monkeypatch, inputs, {"num_heads": 2, "softcap": 50.0})


def test_fully_masked_rows_are_zero(library):
    rng = seeded("masked")
    inputs = qkv(rng, 2, 2, 2, 6, 6, 8, F32)
    bias = np.zeros((2, 1, 6, 6), np.float32)
    bias[0, 0, 2, :] = -np.inf  # one row with every key at -inf
    inputs["attn_bias"] = bias
    mask = np.ones((2, 6), np.int64)
    mask[1] = 0  # a batch with no key at all
    inputs["key_padding_mask"] = mask
    (y,) = check(library, inputs, {"num_heads": 2})
    assert not np.any(y[0, :, 2]) and not np.any(y[1])
    assert np.all(np.isfinite(y))


def test_finite_min_mask_is_not_fully_masked(library):
    # HF's additive masks use finfo.min, not -inf: a row masked that way averages V, like the
    # unfused Softmax does (only -inf, key_padding_mask, causal and window mask a key).
    rng = seeded("finfo")
    inputs = qkv(rng, 1, 1, 1, 4, 4, 8, F32)
    inputs["attn_bias"] = np.full((1, 1, 4, 4), np.finfo(np.float32).min, np.float32)
    (y,) = check(library, inputs, {"num_heads": 1})
    np.testing.assert_allclose(y[0, 0], np.broadcast_to(inputs["V"][0, 0].mean(0), (4, 8)), rtol=1e-5, atol=1e-6)


def test_no_keys_at_all(library):
    rng = seeded("nokeys")
    inputs = qkv(rng, 1, 2, 2, 3, 0, 8, F32)
    (y,) = check(library, inputs, {"num_heads": 2})
    assert y.shape == (1, 2, 3, 8) and not np.any(y)


def test_more_queries_than_keys_causal_is_bottom_right(library):
    # Query i sits at position Skv - Sq + i: the first Sq - Skv rows see no key.
    rng = seeded("bottomright")
    inputs = qkv(rng, 1, 1, 1, 6, 4, 8, F32)
    (y,) = check(library, inputs, {"num_heads": 1, "causal": 1})
    assert not np.any(y[0, 0, :2]) and np.any(y[0, 0, 2:])


# ---- empty_rows: what a row with no visible key outputs ----


def empty_rows_case(rng, case, dtype, layout="BNSD"):
    """Inputs, attributes and the [B, Sq] rows left without a visible key, per way of emptying them."""
    b, n, nkv, d = 2, 4, 2, 16
    if case == "causal_sq_gt_skv":  # bottom-right causal: the first Sq - Skv rows see nothing
        sq, skv = 21, 13
        inputs = qkv(rng, b, n, nkv, sq, skv, d, dtype, layout)
        empty = np.zeros((b, sq), bool)
        empty[:, :sq - skv] = True
        return inputs, {"causal": 1}, empty
    sq = skv = 37
    inputs = qkv(rng, b, n, nkv, sq, skv, d, dtype, layout)
    mask = np.ones((b, skv), np.int64)
    empty = np.zeros((b, sq), bool)
    if case == "left_padding":  # HF's attention_mask of a left-padded batch, with causal
        mask[1, :19] = 0  # whole leading key tiles padded out: rows 0..18 see no key
        empty[1, :19] = True
        attrs = {"causal": 1}
    else:  # "window": a window of 4 over a padded stretch: rows 10..14 see only padded keys
        mask[0, 7:15] = 0
        empty[0, 10:15] = True
        attrs = {"causal": 1, "window": 4}
    inputs["key_padding_mask"] = mask
    return inputs, attrs, empty


@pytest.mark.parametrize("mode", ["zero", "uniform"])
@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("case", ["causal_sq_gt_skv", "left_padding", "window"])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_empty_rows(library, monkeypatch, dtype, case, path, mode):
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "8x16")
    rng = seeded("empty_rows", dtype.name, case, path, mode)
    inputs, attrs, empty = empty_rows_case(rng, case, dtype)
    (y,) = check(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "empty_rows": mode, **attrs})
    # kv head g serves query heads 2g, 2g+1: an empty row holds the mean of its kv head's V over
    # every key (padded and causally masked ones included), in float32 rounded once; or 0
    v = inputs["V"].astype(F32)
    mean = np.repeat(v.sum(axis=2, dtype=F32) / np.float32(v.shape[2]), 2, axis=1)  # [B, N, Dv]
    for bb, i in zip(*np.nonzero(empty)):
        want = mean[bb] if mode == "uniform" else np.zeros_like(mean[bb])
        assert_close(y[bb, :, i], want.astype(dtype))
    assert np.all(np.abs(y[~np.broadcast_to(empty[:, None], y.shape[:3])].astype(F32)).sum(-1) > 0)


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_uniform_empty_rows_equal_a_finite_minimum_mask(library, dtype):
    # The reason for empty_rows = "uniform": Hugging Face's additive mask (0 / finfo(float32).min)
    # passed as attn_bias gives the same Y as causal + key_padding_mask, fully padded rows included.
    rng = seeded("finfo_equiv", dtype.name)
    inputs, attrs, empty = empty_rows_case(rng, "left_padding", dtype)
    mask = inputs.pop("key_padding_mask")
    sq, skv = inputs["Q"].shape[2], mask.shape[1]
    visible = (np.arange(skv)[None, :] <= np.arange(sq)[:, None])[None] & (mask != 0)[:, None, :]
    bias = np.where(visible, 0, np.finfo(np.float32).min).astype(np.float32)[:, None]  # [B, 1, Sq, Skv]
    (unfused,) = run_op(library, "Attention", {**inputs, "attn_bias": bias}, {"num_heads": 4, "kv_num_heads": 2})
    (fused,) = run_op(library, "Attention", {**inputs, "key_padding_mask": mask},
                      {"num_heads": 4, "kv_num_heads": 2, "empty_rows": "uniform", **attrs})
    assert empty.any()
    assert_close(fused, unfused)


def test_uniform_empty_rows_from_a_minus_infinity_bias(library):
    rng = seeded("uniform_inf")
    inputs = qkv(rng, 2, 2, 1, 6, 6, 8, F32, "BSND")
    bias = np.zeros((2, 2, 6, 6), np.float32)
    bias[0, 1, 3, :] = -np.inf  # one head of one row sees no key
    inputs["attn_bias"] = bias
    (y,) = check(library, inputs, {"num_heads": 2, "kv_num_heads": 1, "layout": "BSND", "empty_rows": "uniform"})
    np.testing.assert_allclose(y[0, 3, 1], inputs["V"][0, :, 0].mean(0), rtol=1e-6, atol=1e-6)


def test_uniform_empty_rows_without_keys_are_zero(library):
    rng = seeded("uniform_nokeys")
    (y,) = check(library, qkv(rng, 1, 2, 2, 3, 0, 8, F32), {"num_heads": 2, "empty_rows": "uniform"})
    assert not np.any(y)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_rope_attention_uniform_empty_rows(library, dtype):
    rng = seeded("rope_uniform", dtype.name)
    inputs, attrs, _ = empty_rows_case(rng, "left_padding", dtype, "BSND")
    s, d = inputs["Q"].shape[1], inputs["Q"].shape[3]
    c, si = cos_sin(rng, np.arange(s), d, dtype)
    inputs["cos"], inputs["sin"] = c[None, :, None], si[None, :, None]  # [1, S, 1, r] (BSND)
    check(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "layout": "BSND", "empty_rows": "uniform", **attrs},
          op="RopeAttention", outputs=("Y", "present_key"))


@pytest.mark.parametrize("softcap", [1.0, 30.0])
@pytest.mark.parametrize("dtype", [F32, BF16], ids=lambda d: d.name)
def test_softcap(library, dtype, softcap):
    rng = seeded("softcap", dtype.name, softcap)
    inputs = qkv(rng, 1, 2, 2, 70, 70, 16, dtype, scale=3.0)
    inputs["attn_bias"] = rand(rng, (1, 1, 70, 70), F32)
    check(library, inputs, {"num_heads": 2, "causal": 1, "softcap": softcap, "scale": 0.5})


@pytest.mark.parametrize("magnitude", ["small", "mixed", "saturating"])
@pytest.mark.parametrize("path", ["direct", "packed"])
def test_softcap_alone_at_every_magnitude(library, monkeypatch, path, magnitude):
    # The softcap without a bias or ALiBi is computed in the exp pass, from the raw scores: tanh's
    # polynomial when a vector's |s * scale / softcap| <= 0.625, the rational form otherwise
    # ("mixed": both in one row; "saturating": |a| up to ~10, tanh = ±1), the max capped from the
    # raw max. Masked keys (holes in the padding, a batch row with none visible, the causal edge
    # of 7 x 32 tiles) must stay exp = 0 through tanh: every variant, no NaN, zeros where no key is seen.
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "7x32")
    rng = seeded("softcap-magnitude", path, magnitude)
    spread = {"small": 0.3, "mixed": 1.3, "saturating": 4.0}[magnitude]
    inputs = qkv(rng, 2, 2, 2, 45, 45, 24, F32, scale=spread)
    mask = np.ones((2, 45), np.int64)
    mask[0, rng.random(45) < 0.3] = 0
    mask[1] = 0
    inputs["key_padding_mask"] = mask
    attrs = {"num_heads": 2, "causal": 1, "softcap": 5.0}
    for y in _under_each_isa(library, monkeypatch, inputs, attrs):
        assert np.isfinite(y).all()
        assert not y[1].any()


@pytest.mark.parametrize("dtype", [F32, F16], ids=lambda d: d.name)
def test_softcap_with_an_infinite_mask_bias(library, monkeypatch, dtype):
    # With attn_bias the capped scores are formed in the score pass (tanh, then + bias): a bias of
    # -inf masks keys after the cap, on every variant, without NaN; the scores cover both tanh forms.
    monkeypatch.setenv("OTFUSE_ATTENTION_TILES", "7x32")
    rng = seeded("softcap-inf-bias", dtype.name)
    inputs = qkv(rng, 1, 2, 2, 40, 40, 16, dtype, scale=2.0)
    bias = rand(rng, (1, 2, 40, 40), F32)
    bias[rng.random(bias.shape) < 0.3] = -np.inf
    bias[..., 0] = 0.0  # every row sees key 0
    inputs["attn_bias"] = bias
    for y in _under_each_isa(library, monkeypatch, inputs, {"num_heads": 2, "softcap": 2.0}):
        assert np.isfinite(y.astype(np.float32)).all()


@pytest.mark.parametrize("layout,output_layout", [("BNSD", "BSND"), ("BSND", "BNSD"), ("BSND", "BSND")])
def test_layouts(library, layout, output_layout):
    rng = seeded("layouts", layout, output_layout)
    inputs = qkv(rng, 2, 4, 2, 11, 11, 8, F32, layout, dv=12)
    check(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "causal": 1, "layout": layout,
                            "output_layout": output_layout})


def test_bsh_rank3_inputs(library):
    rng = seeded("bsh")
    b, s, n, nkv, d = 2, 13, 4, 2, 8
    inputs = {"Q": rand(rng, (b, s, n * d), F16), "K": rand(rng, (b, s, nkv * d), F16),
              "V": rand(rng, (b, s, nkv * d), F16)}
    (y,) = check(library, inputs, {"num_heads": n, "kv_num_heads": nkv, "causal": 1, "layout": "BSND"})
    assert y.shape == (b, s, n * d)
    check(library, inputs, {"num_heads": n, "kv_num_heads": nkv, "layout": "BSND", "output_layout": "BNSD"})


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_explicit_scale_and_value_head_size(library, dtype):
    rng = seeded("scale", dtype.name)
    inputs = qkv(rng, 1, 2, 2, 20, 20, 24, dtype, dv=40)
    check(library, inputs, {"num_heads": 2, "scale": 0.3, "causal": 1})


def test_multithreaded_matches_single_thread(library):
    rng = seeded("threads")
    inputs = qkv(rng, 2, 4, 2, 150, 150, 32, F16)
    attrs = {"num_heads": 4, "kv_num_heads": 2, "causal": 1}
    one = run_op(library, "Attention", inputs, attrs, threads=1)
    two = run_op(library, "Attention", inputs, attrs, threads=2)
    np.testing.assert_array_equal(one[0].view(np.uint8), two[0].view(np.uint8))


def test_empty_batch_and_queries(library):
    rng = seeded("empty")
    for b, sq in [(0, 4), (2, 0)]:
        inputs = qkv(rng, b, 2, 2, sq, 4, 8, F32)
        (y,) = run_op(library, "Attention", inputs, {"num_heads": 2})
        assert y.shape == (b, 2, sq, 8)


def test_reference_matches_onnx_attention_23(library):
    # Anchors the reference to the standard op: causal GQA with a KV cache and an additive mask.
    rng = seeded("onnx23")
    b, n, nkv, sq, past, d = 2, 4, 2, 5, 7, 8
    q, k, v = rand(rng, (b, n, sq, d), F32), rand(rng, (b, nkv, sq, d), F32), rand(rng, (b, nkv, sq, d), F32)
    pk, pv = rand(rng, (b, nkv, past, d), F32), rand(rng, (b, nkv, past, d), F32)
    mask = rand(rng, (b, 1, sq, past + sq), F32)
    node = helper.make_node("Attention", ["q", "k", "v", "m", "pk", "pv"], ["y", "ok", "ov"], is_causal=1,
                            q_num_heads=n, kv_num_heads=nkv)
    names = ["q", "k", "v", "m", "pk", "pv"]
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in names],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in ["y", "ok", "ov"]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    try:
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # an ORT without Attention-23
        pytest.skip(f"ONNX Attention-23 not available: {e}")
    y, ok, ov = session.run(None, dict(zip(names, [q, k, v, mask, pk, pv])))
    ry, rk, rv = reference.attention(q, k, v, mask, None, pk, pv, num_heads=n, kv_num_heads=nkv, causal=1)
    np.testing.assert_allclose(ry, y, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(rk, ok)


# ---- RopeAttention ----


def cos_sin(rng, positions, r, dtype=F32):
    inv = 1.0 / 10000 ** (np.arange(0, r, 2) / r)
    freqs = np.outer(positions, inv)
    emb = np.concatenate([freqs, freqs], -1)
    return np.cos(emb).astype(dtype), np.sin(emb).astype(dtype)


@pytest.mark.parametrize("mode,rotary_dim,sections", [("half", 0, ()), ("interleaved", 0, ()), ("half", 16, ()),
                                                       ("half", 0, (8, 12, 12)), ("interleaved", 8, ())])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: d.name)
def test_rope_attention_matches_reference(library, dtype, mode, rotary_dim, sections):
    rng = seeded("rope", dtype.name, mode, rotary_dim, sections)
    b, n, nkv, s, d = 2, 4, 2, 70, 32
    inputs = qkv(rng, b, n, nkv, s, s, d, dtype)
    r = rotary_dim or d
    c, si = cos_sin(rng, np.arange(s), r, dtype)
    inputs["cos"], inputs["sin"] = c[None, None], si[None, None]  # [1, 1, S, r]
    attrs = {"num_heads": n, "kv_num_heads": nkv, "causal": 1, "rotary_mode": mode, "rotary_dim": rotary_dim}
    if sections:
        attrs["rotary_sections"] = list(sections)
    ref_attrs = dict(attrs)
    ref_attrs.pop("rotary_sections", None)
    got = run_op(library, "RopeAttention", inputs, attrs, outputs=("Y", "present_key"))
    y, pk, _ = reference.rope_attention(*[inputs.get(x) for x in ROPE_INPUTS], rotary_sections=sections, **ref_attrs)
    assert_close(got[0], y)
    np.testing.assert_array_equal(got[1].view(np.uint8), pk.view(np.uint8))


@pytest.mark.parametrize("path", ["direct", "packed"])
@pytest.mark.parametrize("new", [1, 9])
def test_rope_attention_decode_with_cache(library, monkeypatch, path, new):
    monkeypatch.setenv("OTFUSE_ATTENTION_PATH", path)
    rng = seeded("ropecache", path, new)
    b, n, nkv, past, d = 2, 4, 1, 50, 16
    inputs = qkv(rng, b, n, nkv, new, new, d, F16, "BSND")
    inputs["past_key"] = rand(rng, (b, nkv, past, d), F16)  # already rotated
    inputs["past_value"] = rand(rng, (b, nkv, past, d), F16)
    c, s = cos_sin(rng, past + np.arange(new), d, F32)  # float32 cos/sin with float16 Q/K/V
    inputs["cos"], inputs["sin"] = c[None, :, None, :], s[None, :, None, :]  # [1, S, 1, r] (BSND)
    attrs = {"num_heads": n, "kv_num_heads": nkv, "causal": 1, "layout": "BSND"}
    for outputs in [("Y", "present_key", "present_value"), ("Y",)]:
        got = run_op(library, "RopeAttention", inputs, attrs, outputs=outputs)
        y, pk, pv = reference.rope_attention(*[inputs.get(x) for x in ROPE_INPUTS], **attrs)
        assert_close(got[0], y)
        if len(got) == 3:
            np.testing.assert_array_equal(got[1], pk)
            np.testing.assert_array_equal(got[2], pv)


def test_rope_attention_per_batch_cos(library):
    # cos/sin [B, 1, S, r]: each batch row has its own positions (left-padded generation).
    rng = seeded("ropebatch")
    b, n, s, d = 2, 2, 12, 16
    inputs = qkv(rng, b, n, n, s, s, d, F32)
    pos = np.stack([np.arange(s), np.maximum(np.arange(s) - 3, 0)])
    c, si = cos_sin(rng, pos.reshape(-1), d)
    inputs["cos"], inputs["sin"] = c.reshape(b, 1, s, d), si.reshape(b, 1, s, d)
    mask = np.ones((b, s), np.int64)
    mask[1, :3] = 0
    inputs["key_padding_mask"] = mask
    check(library, inputs, {"num_heads": n, "causal": 1}, op="RopeAttention", outputs=("Y", "present_key"))


def test_rope_attention_equals_rotary_then_attention(library):
    # The fused op equals the two otfuse ops it replaces, run by the kernels themselves.
    rng = seeded("ropecompose")
    inputs = qkv(rng, 1, 2, 2, 30, 30, 16, F16)
    c, s = cos_sin(rng, np.arange(30), 16, F16)
    inputs["cos"], inputs["sin"] = c[None, None], s[None, None]
    attrs = {"num_heads": 2, "causal": 1}
    (fused,) = run_op(library, "RopeAttention", inputs, attrs)
    node = helper.make_node("RotaryEmbeddingQK", ["Q", "K", "cos", "sin"], ["q", "k"], domain="otfuse")
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT16, None) for x in ["Q", "K", "cos", "sin"]],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT16, None) for x in ["q", "k"]])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])
    rq, rk = make_session(model, library).run(None, {x: inputs[x] for x in ["Q", "K", "cos", "sin"]})
    (plain,) = run_op(library, "Attention", {"Q": rq, "K": rk, "V": inputs["V"]}, attrs)
    np.testing.assert_array_equal(fused, plain)


# ---- errors: ORT raises an exception naming the op and the node; the process survives ----


def expect_error(library, inputs, attrs, match, op="Attention", outputs=("Y",)):
    with pytest.raises(Exception) as info:
        run_op(library, op, inputs, attrs, outputs)
    message = str(info.value)
    assert op in message and NODE_NAME in message, message
    assert match in message, message


def small(layout="BNSD", n=4, nkv=2, s=5, d=8):
    return qkv(np.random.default_rng(0), 2, n, nkv, s, s, d, F32, layout)


def test_error_heads_not_divisible(library):
    expect_error(library, small(n=4, nkv=3), {"num_heads": 4, "kv_num_heads": 3}, "not a multiple of kv_num_heads")


def test_error_missing_num_heads(library):
    expect_error(library, small(), {}, "'num_heads' is required")


def test_error_head_count_mismatch(library):
    expect_error(library, small(), {"num_heads": 8, "kv_num_heads": 2}, "but num_heads = 8")


def test_error_head_size_mismatch(library):
    inputs = small()
    inputs["K"] = inputs["K"][..., :6].copy()
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "K's head size D = 6 differs")


def test_error_value_length(library):
    inputs = small()
    inputs["V"] = inputs["V"][:, :, :4].copy()
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "V has 4 positions but K has 5")


def test_error_batch_mismatch(library):
    inputs = small()
    inputs["K"] = inputs["K"][:1].copy()
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "batch sizes differ")


def test_error_bias_not_broadcastable(library):
    inputs = small()
    inputs["attn_bias"] = np.zeros((2, 3, 5, 5), np.float32)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "attn_bias has shape [2, 3, 5, 5]")
    inputs["attn_bias"] = np.zeros((1, 2, 4, 5, 5), np.float32)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "not broadcastable")


def test_error_bias_type(library):
    inputs = small()
    inputs["attn_bias"] = np.zeros((5, 5), np.float16)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "attn_bias has element type float16")


def test_error_past_shapes(library):
    inputs = small()
    inputs["past_key"] = np.zeros((2, 2, 3, 8), np.float32)
    inputs["past_value"] = np.zeros((2, 2, 4, 8), np.float32)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "past_value has shape [2, 2, 4, 8]")
    inputs["past_value"] = None
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "must be given together")
    inputs["past_key"] = np.zeros((2, 4, 3, 8), np.float32)
    inputs["past_value"] = np.zeros((2, 4, 3, 8), np.float32)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "past_key has shape [2, 4, 3, 8]")


def test_error_key_padding_mask(library):
    inputs = small()
    inputs["key_padding_mask"] = np.ones((2, 4), np.int64)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "key_padding_mask has shape [2, 4]")
    inputs["key_padding_mask"] = np.ones((2, 5), np.float32)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "key_padding_mask has element type float32")


def test_error_layout_rank(library):
    inputs = small()
    inputs["Q"] = inputs["Q"].reshape(2, 4, 40)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "layout BNSD needs rank 4")
    inputs = small("BSND")
    inputs["Q"] = inputs["Q"].reshape(2, 5, 32)[..., :30].copy()
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "layout": "BSND"}, "not a multiple of num_heads")


@pytest.mark.parametrize("attrs,match", [
    ({"layout": "BHSD"}, "'layout' must be"),
    ({"window": 4}, "needs causal = 1"),
    ({"window": -1, "causal": 1}, "'window' must be >= 0"),
    ({"causal": 2}, "'causal' must be 0 or 1"),
    ({"softcap": -1.0}, "'softcap' must be"),
    ({"scale": 1}, "'scale' must be a float"),
    ({"empty_rows": "mean"}, "'empty_rows' must be \"zero\" or \"uniform\", got \"mean\""),
])
def test_error_attributes(library, attrs, match):
    model = build_model("Attention", small(), {"num_heads": 4, "kv_num_heads": 2, **attrs})
    with pytest.raises(Exception, match=f"Attention \\(node '{NODE_NAME}'\\).*{match}"):
        make_session(model, library)


def test_error_rope_cos(library):
    inputs = small()
    inputs["cos"] = np.ones((1, 1, 5, 6), np.float32)
    inputs["sin"] = np.ones((1, 1, 5, 6), np.float32)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "but its last dim must be r = 8",
                 op="RopeAttention")
    inputs["cos"] = inputs["sin"] = np.ones((1, 4, 5, 8), np.float32)  # 4 heads: does not fit K's 2
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2}, "does not broadcast to K.shape[:-1] + [r]",
                 op="RopeAttention")
    inputs["cos"] = inputs["sin"] = np.ones((5, 8), np.float32)
    expect_error(library, inputs, {"num_heads": 4, "kv_num_heads": 2, "rotary_dim": 10},
                 "rotary_dim 10 is larger than Q's last dim D = 8", op="RopeAttention")


def test_session_survives_errors(library):
    inputs = small()
    session = make_session(build_model("Attention", inputs, {"num_heads": 4, "kv_num_heads": 2}), library)
    with pytest.raises(Exception):
        session.run(None, {"Q": inputs["Q"], "K": inputs["K"], "V": inputs["V"][:, :, :2].copy()})
    (y,) = session.run(None, {"Q": inputs["Q"], "K": inputs["K"], "V": inputs["V"]})
    assert np.all(np.isfinite(y))
