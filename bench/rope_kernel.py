#!/usr/bin/env python3
"""RoPE on X [1, 32, S, 128]: the unfused subgraph in plain ONNX Runtime vs otfuse's fused
RotaryEmbedding kernel, side by side, plus the fused kernel's bandwidth against a plain memory
copy of the same bytes.

For each dtype and S, both run on the same inputs with the same thread count (2 by default):

- unfused: the graph LLaMA exports, ``x1 = Slice(x, 0:64)``, ``x2 = Slice(x, 64:128)``,
  ``Concat(Neg(x2), x1)``, ``Mul(x, cos)``, ``Mul(rotated, sin)``, ``Add``; cos/sin are graph
  inputs of shape [1, 1, S, 128]; default ORT graph optimisations, no custom ops;
- fused: one ``otfuse.RotaryEmbedding`` node with the custom-op library.

Inputs and outputs are bound once (IO binding into preallocated numpy arrays), so the times are
the sessions' run calls only. The fused kernel's traffic is X + cos + sin read and Y written;
the copy reference moves the same number of bytes (half read, half written) with ``np.copyto``
on one thread and split over two, whichever is faster: the machine's practical memory limit.
Goals (from the issue): fused >= 4x faster than unfused and >= 70% of copy bandwidth.

    python bench/rope_kernel.py [--seq 2048 8192 32768] [--dtype float32 float16] [--threads 2]
                                [--repeat 7] [--isa default|baseline] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.use_checkout()

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import otfuse  # noqa: E402

BATCH, HEADS, HEAD_DIM = 1, 32, 128
GOAL_SPEEDUP = 4.0
GOAL_COPY_FRACTION = 0.70
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}


def _io(t: int) -> list:
    """x, cos, sin (inputs) and y (output) value infos."""
    x_shape = ["batch", "heads", "seq", HEAD_DIM]
    cos_shape = [1, 1, "seq", HEAD_DIM]
    return [helper.make_tensor_value_info(name, t, shape)
            for name, shape in (("x", x_shape), ("cos", cos_shape), ("sin", cos_shape), ("y", x_shape))]


def unfused_model(dtype: str) -> onnx.ModelProto:
    """rotate_half RoPE as the LLaMA export spells it."""
    h = HEAD_DIM // 2
    t = ONNX_TYPE[dtype]

    def const(name, value):
        return helper.make_tensor(name, TensorProto.INT64, [1], [value])

    inits = [const("zero", 0), const("half", h), const("end", HEAD_DIM), const("axis", 3)]
    nodes = [
        helper.make_node("Slice", ["x", "zero", "half", "axis"], ["x1"]),
        helper.make_node("Slice", ["x", "half", "end", "axis"], ["x2"]),
        helper.make_node("Neg", ["x2"], ["neg_x2"]),
        helper.make_node("Concat", ["neg_x2", "x1"], ["rotated"], axis=-1),
        helper.make_node("Mul", ["x", "cos"], ["x_cos"]),
        helper.make_node("Mul", ["rotated", "sin"], ["rotated_sin"]),
        helper.make_node("Add", ["x_cos", "rotated_sin"], ["y"]),
    ]
    io = _io(t)
    graph = helper.make_graph(nodes, "rope_unfused", io[:3], io[3:], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def fused_model(dtype: str) -> onnx.ModelProto:
    t = ONNX_TYPE[dtype]
    node = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["y"], domain="otfuse", name="rope", mode="half")
    io = _io(t)
    graph = helper.make_graph([node], "rope_fused", io[:3], io[3:])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)])


def session(model: onnx.ModelProto, threads: int, library: str | None) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    if library:
        options.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class BoundRun:
    """A session with its inputs and a preallocated output bound once; ``__call__`` runs it."""

    def __init__(self, sess: ort.InferenceSession, feeds: dict[str, np.ndarray], out: np.ndarray):
        self.sess, self.out = sess, out
        self.binding = sess.io_binding()
        for name, array in feeds.items():
            self.binding.bind_input(name, "cpu", 0, array.dtype, list(array.shape), array.ctypes.data)
        self.binding.bind_output("y", "cpu", 0, out.dtype, list(out.shape), out.ctypes.data)

    def __call__(self) -> None:
        self.sess.run_with_iobinding(self.binding)


def time_round_robin(fns: dict, repeat: int, warmup: int = 2) -> dict:
    """Times every fn `repeat` times, taking turns, so that all of them see the same machine load
    (other work on a shared machine comes and goes). Median and minimum per fn."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return {name: {"median_s": statistics.median(t), "min_s": min(t), "runs": len(t)} for name, t in times.items()}


class Copy:
    """A plain copy moving total_bytes (total/2 read + total/2 written), on 1 or 2 threads."""

    def __init__(self, total_bytes: int, pool: ThreadPoolExecutor):
        n = total_bytes // 2
        self.bytes = 2 * n
        self.src = np.ones(n, np.uint8)
        self.dst = np.zeros(n, np.uint8)
        self.halves = [slice(0, n // 2), slice(n // 2, n)]
        self.pool = pool

    def one_thread(self) -> None:
        np.copyto(self.dst, self.src)

    def two_threads(self) -> None:  # np.copyto releases the GIL for plain copies
        list(self.pool.map(lambda s: np.copyto(self.dst[s], self.src[s]), self.halves))


def check_outputs(dtype: str, fused: np.ndarray, unfused: np.ndarray) -> str:
    if dtype == "float32":  # same products and sum, no FMA on either side
        return "bit-exact" if np.array_equal(fused, unfused) else "MISMATCH"
    err = np.abs(fused.astype(np.float32) - unfused.astype(np.float32))
    ok = bool(np.all(err <= 1e-2 + 1e-2 * np.abs(unfused.astype(np.float32))))
    return f"{'ok' if ok else 'MISMATCH'} (max |diff| {err.max():.2g}, {np.mean(fused != unfused):.1%} differ)"


def bench_case(dtype: str, seq: int, threads: int, repeat: int, library: str) -> dict:
    rng = np.random.default_rng(seq)
    x = rng.standard_normal((BATCH, HEADS, seq, HEAD_DIM), dtype=np.float32).astype(dtype)
    angles = rng.uniform(-np.pi, np.pi, (1, 1, seq, HEAD_DIM // 2)).astype(np.float32)
    angles = np.concatenate([angles, angles], axis=-1)  # Concat(freqs, freqs), as HF builds them
    cos, sin = np.cos(angles).astype(dtype), np.sin(angles).astype(dtype)
    feeds = {"x": x, "cos": cos, "sin": sin}

    y_unfused = np.empty_like(x)
    y_fused = np.empty_like(x)
    unfused = BoundRun(session(unfused_model(dtype), threads, None), feeds, y_unfused)
    fused = BoundRun(session(fused_model(dtype), threads, library), feeds, y_fused)
    traffic = x.nbytes + cos.nbytes + sin.nbytes + y_fused.nbytes
    with ThreadPoolExecutor(2) as pool:
        copy = Copy(traffic, pool)
        t = time_round_robin({"unfused": unfused, "fused": fused, "copy_1t": copy.one_thread,
                              "copy_2t": copy.two_threads}, repeat)
    agreement = check_outputs(dtype, y_fused, y_unfused)
    del unfused, fused, y_unfused, y_fused, x, copy

    def gbps(stat: str) -> dict:
        copy_best = min(t["copy_1t"][stat], t["copy_2t"][stat])
        fused = traffic / t["fused"][stat] / 1e9
        return {"speedup": t["unfused"][stat] / t["fused"][stat], "fused_gbps": fused,
                "copy_gbps": traffic / copy_best / 1e9, "copy_1t_gbps": traffic / t["copy_1t"][stat] / 1e9,
                "copy_2t_gbps": traffic / t["copy_2t"][stat] / 1e9, "copy_fraction": fused * copy_best * 1e9 / traffic}

    return {
        "dtype": dtype, "seq": seq, "shape": [BATCH, HEADS, seq, HEAD_DIM], "threads": threads,
        "times": t, "traffic_bytes": traffic, "median": gbps("median_s"), "best": gbps("min_s"),
        "outputs": agreement,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, nargs="+", default=[2048, 8192, 32768])
    parser.add_argument("--dtype", nargs="+", default=["float32", "float16"], choices=sorted(ONNX_TYPE))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=7, help="timed runs per measurement (median reported)")
    parser.add_argument("--isa", choices=["default", "baseline"], default="default",
                        help="baseline: force the portable row kernels (OTFUSE_CPU_ISA=baseline)")
    parser.add_argument("--json", type=Path, help="also write every figure here")
    args = parser.parse_args(argv)
    if args.isa == "baseline":
        os.environ["OTFUSE_CPU_ISA"] = "baseline"
    library = otfuse.library_path()

    machine = common.machine_info()
    machine["loadavg_before"] = Path("/proc/loadavg").read_text().split()[:3]
    machine["onnxruntime"] = ort.__version__
    machine["numpy"] = np.__version__
    machine["library"] = library
    machine["isa"] = args.isa
    print(f"{machine['cpu_model']}, nproc {machine['nproc']}, {machine['memory_gib']} GiB, "
          f"ORT {ort.__version__}, loadavg {' '.join(machine['loadavg_before'])}, {args.threads} threads, "
          f"row kernels: {'baseline (forced)' if args.isa == 'baseline' else 'default (AVX2+F16C when present)'}")

    results = []
    header = (f"{'dtype':<8} {'S':>6} {'unfused ms':>11} {'fused ms':>9} {'speedup':>8} {'fused GB/s':>11} "
              f"{'copy GB/s':>10} {'of copy':>8}  {'(best run: speedup, GB/s, of copy)':<36} outputs")
    print(header)
    print("-" * len(header))
    for dtype in args.dtype:
        for seq in args.seq:
            r = bench_case(dtype, seq, args.threads, args.repeat, library)
            results.append(r)
            m, b = r["median"], r["best"]
            best_speedup = f"{b['speedup']:.1f}x"
            print(f"{dtype:<8} {seq:>6} {r['times']['unfused']['median_s'] * 1e3:>11.2f} "
                  f"{r['times']['fused']['median_s'] * 1e3:>9.2f} {m['speedup']:>7.1f}x {m['fused_gbps']:>11.1f} "
                  f"{m['copy_gbps']:>10.1f} {m['copy_fraction']:>7.0%}  "
                  f"{best_speedup:>8}"
                  f" {b['fused_gbps']:>8.1f} {b['copy_fraction']:>7.0%}{'':<11} {r['outputs']}", flush=True)
    machine["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print(f"loadavg after: {' '.join(machine['loadavg_after'])}")
    print("times: median of the run calls (unfused, fused and the copies take turns); GB/s: (X + cos + sin + Y "
          "bytes) / time; copy: np.copyto of the same bytes (half read, half written), faster of 1 and 2 threads")

    failures = []
    for r in results:
        name = f"{r['dtype']} S={r['seq']}"
        m = r["median"]
        if m["speedup"] < GOAL_SPEEDUP:
            failures.append(f"{name}: speedup {m['speedup']:.1f}x < {GOAL_SPEEDUP:g}x")
        if m["copy_fraction"] < GOAL_COPY_FRACTION:
            failures.append(f"{name}: {m['copy_fraction']:.0%} of copy bandwidth < {GOAL_COPY_FRACTION:.0%}")
        if "MISMATCH" in r["outputs"]:
            failures.append(f"{name}: fused and unfused outputs disagree ({r['outputs']})")
    for failure in failures:
        print(f"GOAL MISSED: {failure}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "results": results, "goals": {
            "speedup": GOAL_SPEEDUP, "copy_fraction": GOAL_COPY_FRACTION}, "failures": failures}, indent=2))
        print(f"wrote {args.json}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
