"""Norm + Linear: unfused (otfuse norm op + separate ORT MatMuls with constant weights) vs the
fused RMSNormLinear / AddRMSNormLinear kernels, on a LLaMA-7B-sized block, side by side.

    python bench/norm_linear.py                       # fp32 and fp16, M = 1, 16, 512
    python bench/norm_linear.py --dtypes fp32 --tokens 1 16

The block: RMSNorm(x) -> q/k/v (4096 -> 4096/1024/1024), and AddRMSNorm(h, r) -> gate/up
(4096 -> 11008 each). Both models are built decomposed, then fused by otfuse: ``--only norm``
for the unfused baseline, ``norm`` + ``norm_linear`` for the fused one, so both run the same
norm kernels and differ only in the projections. Same session options for both (intra-op threads
= --threads). After a warm-up the two sessions take turns, one run each, and a run is *clean*
when everyone else used under --contended cores meanwhile (/proc/stat minus this process);
turns go on until --runs clean pairs exist (at most --max-runs). The table shows the median of
the clean runs (all runs when none was clean, marked), the clean count and the others' load.
A profiled run of the unfused session gives the norms' share of its time and MLAS's GFLOP/s in
the MatMuls. Not a test: prints the machine's figures.
"""

from __future__ import annotations

import argparse
import json
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


def session(path: Path, threads: int, profile: str = "") -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    # The sessions take turns in one process: a pool left spinning after its run would take CPU
    # from the other session's run (measured: unfused M = 16 took 50 ms in turns, 27 ms alone).
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    options.register_custom_ops_library(otfuse.library_path())
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def cpu_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat, all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed_run(sess, feeds) -> tuple[float, float]:
    """(seconds, cores everyone else used meanwhile) of one run."""
    c0, b0, t0 = os.times(), cpu_busy_seconds(), time.perf_counter()
    sess.run(None, feeds)
    wall = time.perf_counter() - t0
    c1, b1 = os.times(), cpu_busy_seconds()
    mine = (c1.user - c0.user) + (c1.system - c0.system)
    return wall, max(0.0, (b1 - b0) - mine) / wall


def side_by_side(sessions, feeds, runs: int, max_runs: int, contended: float) -> list[dict]:
    """Warm-up, then the sessions take turns until `runs` turns were clean for all of them."""
    for sess in sessions:
        sess.run(None, feeds)
    turns = []
    while len(turns) < max_runs:
        turns.append([timed_run(sess, feeds) for sess in sessions])
        if sum(all(o < contended for _, o in turn) for turn in turns) >= runs:
            break
    results = []
    for i in range(len(sessions)):
        clean = [turn[i][0] for turn in turns if all(o < contended for _, o in turn)]
        times = clean or [turn[i][0] for turn in turns]
        results.append({"median": float(np.median(times)), "clean": len(clean), "turns": len(turns),
                        "others": float(np.median([turn[i][1] for turn in turns]))})
    return results


def profile_split(path: Path, threads: int, feeds, folder: Path, runs: int = 3) -> dict[str, float]:
    """Microseconds per op type in the fastest of `runs` profiled runs (after a warm-up) of the
    session at `path`."""
    sess = session(path, threads, profile=str(folder / "profile"))
    for _ in range(runs + 1):
        sess.run(None, feeds)
    events = json.loads(Path(sess.end_profiling()).read_text())
    model_runs = sorted((e for e in events if e.get("name") == "model_run"), key=lambda e: e["ts"])[1:]
    best = min(model_runs, key=lambda e: e["dur"])
    per_op: dict[str, float] = {"total": float(best["dur"])}
    for e in events:
        if (e.get("cat") == "Node" and e["name"].endswith("_kernel_time")
                and best["ts"] <= e["ts"] <= best["ts"] + best["dur"]):
            op = e["args"].get("op_name", "?")
            per_op[op] = per_op.get(op, 0.0) + float(e["dur"])
    return per_op


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "fp16"], choices=["fp32", "fp16"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 512])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=0, help="clean turns wanted (default 15; 5 at M >= 256)")
    parser.add_argument("--max-runs", type=int, default=0, help="turns at most (default 3x --runs)")
    parser.add_argument("--contended", type=float, default=0.25,
                        help="a turn during which others used this many cores or more is not clean")
    parser.add_argument("--wait-quiet", type=float, default=0.0,
                        help="before each case, wait (up to --wait-max s) for the 1-minute loadavg to drop under this")
    parser.add_argument("--wait-max", type=float, default=300.0)
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled unfused run")
    args = parser.parse_args()
    print(f"CPU {cpu_model()}, nproc {os.cpu_count()}, intra-op threads {args.threads}, "
          f"onnxruntime {ort.__version__}, loadavg {open('/proc/loadavg').read().split()[:3]}")
    flops_per_token = 2 * HIDDEN * (Q + 2 * KV + 2 * FFN)
    print("| dtype | M | unfused ms | fused ms | speed-up | fused GFLOP/s | clean turns | others (cores) "
          "| norms' share of unfused | MLAS MatMul GFLOP/s | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
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
                if args.wait_quiet:
                    start = time.perf_counter()
                    while os.getloadavg()[0] >= args.wait_quiet and time.perf_counter() - start < args.wait_max:
                        time.sleep(5)
                runs = args.runs or (5 if m >= 256 else 15)
                tb, tf = side_by_side([s_base, s_fused], feeds, runs, args.max_runs or 3 * runs, args.contended)
                diff = max(float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32))))
                           for a, b in zip(s_base.run(None, feeds), s_fused.run(None, feeds)))
                share = mlas = "-"
                if not args.no_profile:
                    split = profile_split(base, args.threads, feeds, folder)
                    norms = sum(v for k, v in split.items() if "Norm" in k)
                    share = f"{norms / split['total']:.1%}"
                    if split.get("MatMul"):
                        mlas = f"{flops_per_token * m / (split['MatMul'] * 1e-6) * 1e-9:.0f}"
                clean = f"{tf['clean']}/{tf['turns']}" + ("" if tf["clean"] else " (none clean: all runs)")
                print(f"| {name} | {m} | {tb['median'] * 1e3:.1f} | {tf['median'] * 1e3:.1f} | "
                      f"{tb['median'] / tf['median']:.2f}x | {flops_per_token * m / tf['median'] * 1e-9:.0f} | "
                      f"{clean} | {max(tb['others'], tf['others']):.2f} | {share} | {mlas} | {diff:.2g} |",
                      flush=True)
            print(f"  ({name}: session creation {t1 - t0:.2f} s unfused, {t2 - t1:.2f} s fused incl. packing)")
            del s_base, s_fused
    print(f"loadavg after: {open('/proc/loadavg').read().split()[:3]}")


if __name__ == "__main__":
    main()
