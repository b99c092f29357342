"""Norm + Linear: unfused (otfuse norm op + separate ORT MatMuls with constant weights) vs the
fused RMSNormLinear / AddRMSNormLinear kernels, on a LLaMA-7B-sized block, side by side.

    python bench/norm_linear.py                       # fp32 and fp16, M = 1, 16, 512
    python bench/norm_linear.py --dtypes fp32 --tokens 1 16

The block: RMSNorm(x) -> q/k/v (4096 -> 4096/1024/1024), and AddRMSNorm(h, r) -> gate/up
(4096 -> 11008 each). Both models are built decomposed, then fused by otfuse: ``--only norm``
for the unfused baseline, ``norm`` + ``norm_linear`` for the fused one, so both run the same
norm kernels and differ only in the projections. Same session options for both (intra-op threads
= --threads), best of N runs after a warm-up. Not a test: prints the machine's figures.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_model, use_checkout  # noqa: E402

use_checkout()
import otfuse  # noqa: E402

HIDDEN, Q, KV, FFN = 4096, 4096, 1024, 11008


def rms(nodes, inits, x, name, dtype, rng):
    """x -> decomposed RMSNorm (the exporter's spelling)."""
    w = f"{name}.weight"
    inits.append(numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(dtype), w))
    for const, value in ((f"{name}.two", np.array(2.0, np.float32)), (f"{name}.eps", np.array(1e-6, np.float32)),
                         (f"{name}.axes", np.array([-1], np.int64))):
        inits.append(numpy_helper.from_array(value, const))
    xf = f"{name}.xf"
    nodes += [
        helper.make_node("Cast", [x], [xf], to=TensorProto.FLOAT),
        helper.make_node("Pow", [xf, f"{name}.two"], [f"{name}.sq"]),
        helper.make_node("ReduceMean", [f"{name}.sq", f"{name}.axes"], [f"{name}.ms"]),
        helper.make_node("Add", [f"{name}.ms", f"{name}.eps"], [f"{name}.mse"]),
        helper.make_node("Sqrt", [f"{name}.mse"], [f"{name}.rms"]),
        helper.make_node("Reciprocal", [f"{name}.rms"], [f"{name}.inv"]),
        helper.make_node("Mul", [xf, f"{name}.inv"], [f"{name}.n32"]),
        helper.make_node("Cast", [f"{name}.n32"], [f"{name}.n"], to=helper.np_dtype_to_tensor_dtype(np.dtype(dtype))),
        helper.make_node("Mul", [w, f"{name}.n"], [f"{name}.out"]),
    ]
    return f"{name}.out"


def block_model(dtype) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes, inits, outputs = [], [], []

    def proj(x, name, n):
        w = f"{name}.weight"
        inits.append(numpy_helper.from_array((rng.standard_normal((HIDDEN, n), dtype=np.float32) * 0.02).astype(dtype), w))
        nodes.append(helper.make_node("MatMul", [x, w], [name]))
        outputs.append(helper.make_tensor_value_info(name, elem, ["batch", "seq", n]))

    n1 = rms(nodes, inits, "x", "attn_norm", dtype, rng)
    for name, n in (("q", Q), ("k", KV), ("v", KV)):
        proj(n1, name, n)
    nodes.append(helper.make_node("Add", ["h", "r"], ["resid"]))
    n2 = rms(nodes, inits, "resid", "mlp_norm", dtype, rng)
    for name in ("gate", "up"):
        proj(n2, name, FFN)
    outputs.append(helper.make_tensor_value_info("resid", elem, ["batch", "seq", HIDDEN]))
    inputs = [helper.make_tensor_value_info(n, elem, ["batch", "seq", HIDDEN]) for n in ("x", "h", "r")]
    graph = helper.make_graph(nodes, "block", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.register_custom_ops_library(otfuse.library_path())
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def best_of(sess, feeds, runs: int) -> float:
    sess.run(None, feeds)
    best = float("inf")
    for _ in range(runs):
        start = time.perf_counter()
        sess.run(None, feeds)
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 512])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    print(f"CPU {cpu_model()}, nproc {os.cpu_count()}, intra-op threads {args.threads}, "
          f"onnxruntime {ort.__version__}, loadavg {open('/proc/loadavg').read().split()[:3]}")
    flops_per_token = 2 * HIDDEN * (Q + 2 * KV + 2 * FFN)
    print("| dtype | M | unfused ms | fused ms | speed-up | fused GFLOP/s | max abs diff |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        for name in args.dtypes:
            dtype = np.float32 if name == "fp32" else np.float16
            src = folder / f"block_{name}.onnx"
            onnx.save(block_model(dtype), src)
            base, fused = folder / f"base_{name}.onnx", folder / f"fused_{name}.onnx"
            otfuse.fuse(src, base, only=["norm"])
            report = otfuse.fuse(src, fused, only=["norm", "norm_linear"])
            assert report.fusions == {"AddRMSNormLinear": 1, "RMSNormLinear": 1}, report.fusions
            t0 = time.perf_counter()
            s_base = session(base, args.threads)
            t1 = time.perf_counter()
            s_fused = session(fused, args.threads)
            t2 = time.perf_counter()
            for m in args.tokens:
                rng = np.random.default_rng(m)
                feeds = {k: rng.standard_normal((1, m, HIDDEN)).astype(dtype) for k in ("x", "h", "r")}
                runs = 3 if m >= 256 else 15
                tb, tf = best_of(s_base, feeds, runs), best_of(s_fused, feeds, runs)
                diff = max(float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32))))
                           for a, b in zip(s_base.run(None, feeds), s_fused.run(None, feeds)))
                print(f"| {name} | {m} | {tb * 1e3:.1f} | {tf * 1e3:.1f} | {tb / tf:.2f}x | "
                      f"{flops_per_token * m / tf * 1e-9:.0f} | {diff:.2g} |", flush=True)
            print(f"  ({name}: session creation {t1 - t0:.2f} s unfused, {t2 - t1:.2f} s fused incl. packing)")
            del s_base, s_fused
    print(f"loadavg after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
