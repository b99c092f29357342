"""Norm + Linear: unfused (otfuse norm op + separate ORT MatMuls with constant weights) vs the
fused RMSNormLinear / AddRMSNormLinear kernels, on a LLaMA-7B-sized block, side by side.

    python bench/norm_linear.py                       # fp32 and fp16, M = 1, 16, 512, 2048
    python bench/norm_linear.py --dtypes fp32 --tokens 1 16

The block: RMSNorm(x) -> q/k/v (4096 -> 4096/1024/1024), and AddRMSNorm(h, r) -> gate/up
(4096 -> 11008 each). Both models are built decomposed, then fused by otfuse: ``--only norm``
for the unfused baseline, ``norm`` + ``norm_linear`` for the fused one, so both run the same
norm kernels and differ only in the projections. Same session options for both (intra-op threads
= --threads, pools not spinning). After a warm-up the two sessions take turns, one run each, and
a turn is *clean* when everyone else used under --contended cores during all its runs (/proc/stat
minus this process); turns go on until --runs clean ones exist (at most 3x; --runs + 2 at M >= 256). The table shows the
medians of the clean turns (of all turns when none was clean, marked), the clean count and the
others' load; the ratios are the result, not the times: per turn unfused / fused, the median over
turns, in wall time and in this process's CPU time. With --forced, fp32 also runs one fused session
per forced GEMM path (OTFUSE_NORM_LINEAR_GEMM=ort: ORT's own Gemm through OrtApi::InvokeOp;
own: otfuse's GEMM) beside the default one, and with --forced own-avx2 (every dtype) otfuse's
GEMM on its AVX2 micro-kernels (OTFUSE_GEMM_ISA=avx2) on an AVX-512 CPU.

Printed in the same run, so that no figure is carried over from another machine: the CPU model
and flags, the ISA path otfuse's kernels take, the machine's references (memory read bandwidth,
bench/stream_read.c; FMA peak, bench/fma_peak.c; ORT MatMul's GFLOP/s on the block's shapes at
each M), and per dtype each session's memory (child processes: RSS growth at session creation,
the weights as ORT holds them, and peak RSS after a run). Not a test.
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
import common  # noqa: E402

common.use_checkout()
import otfuse  # noqa: E402

HIDDEN, Q, KV, FFN = 4096, 4096, 1024, 11008
WIDTHS = (Q, KV, KV, FFN, FFN)


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


# A forced path: the environment its fused session is created with (the kernels read it then).
FORCED_ENV = {
    "ort": {"OTFUSE_NORM_LINEAR_GEMM": "ort"},
    "own": {"OTFUSE_NORM_LINEAR_GEMM": "own"},
    "own-avx2": {"OTFUSE_NORM_LINEAR_GEMM": "own", "OTFUSE_GEMM_ISA": "avx2"},
}


def forced_session(path: Path, threads: int, forced: str) -> ort.InferenceSession:
    """A session whose norm + linear kernels were created with FORCED_ENV[forced] set."""
    saved = {key: os.environ.get(key) for key in FORCED_ENV[forced]}
    os.environ.update(FORCED_ENV[forced])
    try:
        return common.ort_session(path, threads)
    finally:
        for key, value in saved.items():
            if value is None:
                del os.environ[key]
            else:
                os.environ[key] = value


def gemm_isa_path() -> str:
    """The micro-kernels of otfuse's GEMM in a default session (kernels/common/gemm.cc's rule)."""
    flags = common.cpu_flags()
    if os.environ.get("OTFUSE_CPU_ISA") == "baseline" or not {"avx2", "fma", "f16c"} <= flags:
        return "baseline"
    if os.environ.get("OTFUSE_GEMM_ISA") == "avx2" or "avx512f" not in flags:
        return "avx2+fma"
    return "avx512f"


def speed(base: dict, other: dict) -> str:
    """'1.05x (cpu 1.08x)': base's time over other's, the median of per-turn ratios, in wall time
    and in this process's CPU time (less moved by others' load: a pool that does not spin uses
    CPU only while working)."""
    return f"{common.paired_ratio(base, other):.2f}x (cpu {common.paired_ratio(base, other, 'cpus'):.2f}x)"


def feeds_for(m: int, dtype) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(m)
    return {k: rng.standard_normal((1, m, HIDDEN)).astype(dtype) for k in ("x", "h", "r")}


def wait_quiet(limit: float, most: float) -> None:
    start = time.perf_counter()
    while limit and os.getloadavg()[0] >= limit and time.perf_counter() - start < most:
        time.sleep(5)


def print_references(args) -> None:
    bandwidth = common.read_bandwidth(args.threads)
    peaks = common.fma_peak(args.threads)
    print(f"memory read bandwidth, {args.threads} threads (bench/stream_read.c, 461 MB, 10 passes): "
          + (f"best {bandwidth['best']} GB/s, median {bandwidth['median']} GB/s" if bandwidth else "n/a"))
    print(f"FMA peak, {args.threads} threads (bench/fma_peak.c): "
          + (", ".join(f"{bits}-bit {g:.0f} GFLOP/s" for bits, g in sorted(peaks.items())) or "n/a"))
    runs = {m: 1 if m >= 2048 else 3 if m >= 512 else 7 for m in args.tokens}
    rates = [f"M = {m}: {common.ort_matmul_gflops(m, HIDDEN, WIDTHS, args.threads, runs[m]):.0f}" for m in args.tokens]
    print(f"ORT MatMul (MLAS, prepacked float32), [M, 4096] x [4096, 28160], GFLOP/s: {'; '.join(rates)}")


def print_memory(name: str, base: Path, fused: Path, folder: Path, threads: int, weight_bytes: int) -> None:
    feeds = folder / f"feeds_{name}.npz"
    np.savez(feeds, **feeds_for(16, np.float32 if name == "fp32" else np.float16))
    cells = []
    for label, path in (("unfused", base), ("fused", fused)):
        memory = common.session_memory(path, threads, feeds)
        cells.append(f"{label} {memory['created_mib']:.0f} MiB at creation, peak RSS {memory['peak_rss_mib']:.0f} MiB"
                     if memory else f"{label} n/a")
    print(f"  ({name} memory: projection weights in the model {weight_bytes / 2**20:.0f} MiB; " + "; ".join(cells)
          + "; one run at M = 16)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 512, 2048])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=0, help="clean turns wanted (default 15; 5 at M >= 256, 3 at M >= 2048)")
    parser.add_argument("--max-runs", type=int, default=0, help="turns at most (default 3x --runs; --runs + 2 at M >= 256)")
    parser.add_argument("--contended", type=float, default=0.25,
                        help="a turn during which others used this many cores or more is not clean")
    parser.add_argument("--wait-quiet", type=float, default=0.0,
                        help="before each case, wait (up to --wait-max s) for the 1-minute loadavg to drop under this")
    parser.add_argument("--wait-max", type=float, default=300.0)
    parser.add_argument("--forced", nargs="+", default=["ort", "own"], choices=[*FORCED_ENV, "none"],
                        help="paths also measured, each forced in a session of its own (none: only the default): "
                             "ort / own = OTFUSE_NORM_LINEAR_GEMM (float32 only), own-avx2 = otfuse's GEMM with "
                             "its AVX2 micro-kernels (OTFUSE_GEMM_ISA=avx2, every dtype)")
    parser.add_argument("--no-references", action="store_true", help="skip bandwidth, FMA peak and MatMul rates")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-session memory probes")
    args = parser.parse_args()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU {common.cpu_identity()}; nproc {os.cpu_count()}")
    print(f"otfuse ISA path: {common.otfuse_isa_path()}, GEMM {gemm_isa_path()}; onnxruntime {ort.__version__}; intra-op threads "
          f"{args.threads}; loadavg {open('/proc/loadavg').read().split()[:3]}")
    if not args.no_references:
        print_references(args)
    forced = [path for path in args.forced if path != "none"]
    print("| dtype | M | unfused ms | fused ms | fused / unfused speed | "
          + "".join(f"{path} forced / unfused | " for path in forced)
          + "clean turns | others (cores) | max abs diff |")
    print("|---|---|---|---|---|" + "---|" * len(forced) + "---|---|---|")
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
            sessions = [common.ort_session(base, args.threads), common.ort_session(fused, args.threads)]
            # The kernel reads its knobs when ORT creates it: one session per forced path (16-bit
            # weights always take otfuse's GEMM: only its ISA can be forced).
            paths = forced if name == "fp32" else [path for path in forced if path == "own-avx2"]
            sessions += [forced_session(fused, args.threads, path) for path in paths]
            for m in args.tokens:
                feeds = feeds_for(m, dtype)
                wait_quiet(args.wait_quiet, args.wait_max)
                runs = args.runs or (3 if m >= 2048 else 5 if m >= 256 else 15)
                turns = args.max_runs or (3 * runs if m < 256 else runs + 2)
                times = common.side_by_side([lambda s=s: s.run(None, feeds) for s in sessions],
                                            runs, turns, args.contended)
                reference = sessions[0].run(None, feeds)
                diff = max(float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32))))
                           for s in sessions[1:] for a, b in zip(reference, s.run(None, feeds)))
                tb, tf = times[0], times[1]
                clean = f"{tf['clean']}/{tf['turns']}" + ("" if tf["clean"] else " (none clean: all runs)")
                measured = dict(zip(paths, times[2:]))
                cells = [speed(tb, tf)] + [speed(tb, measured[path]) if path in measured else "-" for path in forced]
                print(f"| {name} | {m} | {tb['median'] * 1e3:.1f} | {tf['median'] * 1e3:.1f} | "
                      + "".join(f"{c} | " for c in cells)
                      + f"{clean} | {max(t['others'] for t in times):.2f} | {diff:.2g} |", flush=True)
                del feeds, reference
            del sessions
            if not args.no_memory:
                print_memory(name, base, fused, folder, args.threads, HIDDEN * sum(WIDTHS) * np.dtype(dtype).itemsize)
    print(f"loadavg after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
