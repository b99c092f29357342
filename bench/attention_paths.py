"""The attention paths of issue #12 for bench/attention_kernel.py --paths: one otfuse.Attention
model per path, its useful FLOPs (or, for decoding, the K/V bytes it must read), and the
machine references of the same run (ORT MatMul GFLOP/s, read bandwidth, FMA peak).

Useful FLOPs = 4 * D * (visible (query, key) pairs) per head: Q·Kᵀ and P·V over the keys each
query row may see (causal, window, padding), never the skipped or masked ones.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np

HEADS = 16
HEAD_SIZE = 128


@dataclass
class Path:
    name: str
    heads: int = HEADS
    kv_heads: int = HEADS
    causal: bool = False
    window: int = 0        # as a fraction of S when < 1
    softcap: float = 0.0
    padding: float = 0.0   # fraction of keys padded out (the last ones)
    bert_bias: bool = False
    alibi: bool = False
    cache: float = 0.0     # fraction of S that is new (Sq = cache * S, past = S - Sq); 0: no cache
    fp16: bool = False
    decode: bool = False   # Sq = 1 over a past of DECODE_PAST keys, no present outputs
    present: bool = False


DECODE_PAST = 4096
PATHS = [
    Path("dense"),
    Path("causal", causal=True),
    Path("window S/4", causal=True, window=0.25),
    Path("key padding 25%", padding=0.25),
    Path("bias [B,1,1,S]", bert_bias=True),
    Path("alibi slopes", causal=True, alibi=True),
    Path("softcap 50", causal=True, softcap=50.0),
    Path("GQA 16:4", causal=True, kv_heads=4),
    Path("MQA 16:1", causal=True, kv_heads=1),
    Path("KV cache Sq=S/4", causal=True, cache=0.25, present=True),
    Path("KV cache, no present", causal=True, cache=0.25),
    Path("fp16 causal", causal=True, fp16=True),
    Path("fp16 GQA 16:4", causal=True, kv_heads=4, fp16=True),
    Path("fp16 KV cache", causal=True, cache=0.25, fp16=True, present=True),
]
DECODE_PATHS = [
    Path("decode 32:8 fp32", heads=32, kv_heads=8, causal=True, decode=True),
    Path("decode 32:8 fp16", heads=32, kv_heads=8, causal=True, decode=True, fp16=True),
    Path("decode 32:8 fp32 +present", heads=32, kv_heads=8, causal=True, decode=True, present=True),
]


def shapes(p: Path, s: int) -> tuple[int, int, int]:
    """(Sq, new keys, past keys)."""
    if p.decode:
        return 1, 1, DECODE_PAST
    if p.cache:
        sq = int(s * p.cache)
        return sq, sq, s - sq
    return s, s, 0


def window_of(p: Path, s: int) -> int:
    return int(p.window * s) if 0 < p.window < 1 else int(p.window)


def visible_pairs(p: Path, s: int) -> int:
    sq, new, past = shapes(p, s)
    skv = new + past
    t = np.arange(skv - sq, skv, dtype=np.int64)  # query positions
    hi = np.minimum(t + 1, skv) if p.causal else np.full(sq, skv)
    w = window_of(p, s)
    lo = np.maximum(t - w + 1, 0) if w else np.zeros(sq, np.int64)
    keep = skv - int(p.padding * skv)  # keys [keep, skv) padded out
    return int(np.clip(np.minimum(hi, keep) - lo, 0, None).sum())


def useful_flops(p: Path, s: int) -> float:
    return 4.0 * HEAD_SIZE * p.heads * visible_pairs(p, s)


def kv_bytes(p: Path, s: int) -> float:
    _, new, past = shapes(p, s)
    return 2.0 * p.kv_heads * (new + past) * HEAD_SIZE * (2 if p.fp16 else 4)


def build(p: Path, s: int):
    """The model and its feeds."""
    from onnx import TensorProto, helper

    elem = TensorProto.FLOAT16 if p.fp16 else TensorProto.FLOAT
    dtype = np.float16 if p.fp16 else np.float32
    sq, new, past = shapes(p, s)
    skv = new + past
    rng = np.random.default_rng(0)

    def tensor(*dims):
        return rng.standard_normal(dims, dtype=np.float32).astype(dtype)

    feeds = {"q": tensor(1, p.heads, sq, HEAD_SIZE), "k": tensor(1, p.kv_heads, new, HEAD_SIZE),
             "v": tensor(1, p.kv_heads, new, HEAD_SIZE)}
    names = ["q", "k", "v", "", "", "", "", ""]
    if p.bert_bias:
        feeds["bias"] = (rng.standard_normal((1, 1, 1, skv), dtype=np.float32) * 0.5).astype(dtype)
        names[3] = "bias"
    if p.padding:
        mask = np.ones((1, skv), np.int64)
        mask[:, skv - int(p.padding * skv):] = 0
        feeds["mask"] = mask
        names[4] = "mask"
    if past:
        feeds["past_k"] = tensor(1, p.kv_heads, past, HEAD_SIZE)
        feeds["past_v"] = tensor(1, p.kv_heads, past, HEAD_SIZE)
        names[5], names[6] = "past_k", "past_v"
    if p.alibi:
        feeds["slopes"] = (2.0 ** (-8.0 * np.arange(1, p.heads + 1) / p.heads)).astype(np.float32)
        names[7] = "slopes"
    while names[-1] == "":
        names.pop()
    attrs = {"num_heads": p.heads, "kv_num_heads": p.kv_heads, "causal": int(p.causal)}
    if window_of(p, s):
        attrs["window"] = window_of(p, s)
    if p.softcap:
        attrs["softcap"] = p.softcap
    outputs = ["y"] + (["present_k", "present_v"] if p.present else [])
    node = helper.make_node("Attention", names, outputs, domain="otfuse", **attrs)
    types = {"mask": TensorProto.INT64, "slopes": TensorProto.FLOAT}
    inputs = [helper.make_tensor_value_info(n, types.get(n, elem), list(feeds[n].shape)) for n in feeds]
    outs = [helper.make_tensor_value_info(n, elem, None) for n in outputs]
    graph = helper.make_graph([node], p.name.replace(" ", "_"), inputs, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])
    model.ir_version = 9
    return model, feeds


def best_seconds(run, repeats: int, budget_s: float) -> tuple[float, float, int]:
    """(best wall seconds, best CPU seconds of this process, calls) of up to `repeats` timed calls
    after a warm-up, fewer once `budget_s` is spent. On this shared VM a call loses its cores to
    other work for whole stretches; the CPU seconds (both threads; ORT's workers do not spin,
    see common.ort_session) count only the time it ran."""
    run()
    walls, cpus = [], []
    start = time.perf_counter()
    while len(walls) < repeats and (not walls or time.perf_counter() - start < budget_s):
        c0, t0 = time.process_time(), time.perf_counter()
        run()
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return min(walls), min(cpus), len(walls)


def matmul_reference(m: int, k: int, n: int, threads: int, repeats: int = 5) -> dict:
    """ORT MatMul (MLAS, the [k, n] operand a constant) on [m, k] x [k, n], float32: GFLOP/s by
    wall and by CPU seconds per thread, timed like the attention paths (best_seconds)."""
    import tempfile
    from pathlib import Path as FsPath

    import onnx
    from onnx import TensorProto, helper, numpy_helper

    import common
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), "w")
    graph = helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "matmul",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    with tempfile.TemporaryDirectory() as folder:
        path = FsPath(folder) / "matmul.onnx"
        onnx.save(model, path)
        sess = common.ort_session(path, threads, library=False)
    feeds = {"a": rng.standard_normal((m, k), dtype=np.float32)}
    wall, cpu, _ = best_seconds(lambda: sess.run(None, feeds), repeats, budget_s=8.0)
    flops = 2.0 * m * k * n
    return {"shape": f"[{m},{k}]x[{k},{n}]", "gflops": flops / wall * 1e-9, "gflops_cpu": flops / (cpu / threads) * 1e-9}


def session(model, threads: int, isa: str | None):
    """An ORT session of `model` with otfuse's ops; `isa` = "avx2" forces the AVX2 tile kernels
    (OTFUSE_ATTENTION_ISA is read when the session creates its kernels)."""
    import sys
    from pathlib import Path as FsPath

    sys.path.insert(0, str(FsPath(__file__).resolve().parent))
    import common

    old = os.environ.get("OTFUSE_ATTENTION_ISA")
    if isa:
        os.environ["OTFUSE_ATTENTION_ISA"] = isa
    else:
        os.environ.pop("OTFUSE_ATTENTION_ISA", None)
    try:
        import tempfile

        import onnx
        with tempfile.TemporaryDirectory() as folder:
            path = FsPath(folder) / "attention.onnx"
            onnx.save(model, path)
            return common.ort_session(path, threads)
    finally:
        if old is None:
            os.environ.pop("OTFUSE_ATTENTION_ISA", None)
        else:
            os.environ["OTFUSE_ATTENTION_ISA"] = old


def attention_isa(flags: set[str], forced: str | None) -> str:
    """The tile kernels otfuse's Attention runs here (attention.cc's Avx512Allowed rule)."""
    if not {"avx2", "fma", "f16c"} <= flags or os.environ.get("OTFUSE_CPU_ISA") == "baseline":
        return "baseline"
    if forced == "avx2" or not {"avx512f", "avx512vl", "avx512bw", "avx512dq"} <= flags:
        return "avx2 (8-lane ymm, 6x16 tiles)"
    return "avx512 (16-lane zmm, 8x32 tiles)"
