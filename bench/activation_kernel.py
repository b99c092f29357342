#!/usr/bin/env python3
"""The activation family's CPU kernels against the machine's memory read bandwidth, and against
the unfused subgraphs in plain ONNX Runtime, side by side in one run.

For each op, dtype and thread count, on [rows, width] tensors much larger than L2 (``--shape``,
default 8192 x 5632, an MLP's intermediate at 8192 tokens):

- fused: one otfuse node (Gelu none / tanh, QuickGelu, SiLU, ReluSquared, SwiGLU and GeGLU with two inputs or
  the halves of one) with the custom-op library;
- unfused: the graph exporters write for it (GPT-2's NewGELU for the tanh form, ONNX ``Gelu``-20
  for the erf form as dynamo exports it, ``x * Sigmoid(x)``, ``SiLU(gate) * up``, ...), default ORT
  graph optimisations, no custom ops;
- read bandwidth: ``bench/stream_read.c`` (compiled here with gcc), THREADS threads summing a
  buffer as large as the fused kernel's traffic, its best pass.

They take turns, ``--repeat`` rounds, so each sees the same machine load; the best of each is
compared; "CPU ms" is the process's CPU time (all threads) in the fused kernel's best round
(about threads x wall when the kernel had the cores to itself). The kernel's traffic is what it
must move: its inputs read and Y written, so "of read bandwidth" = (bytes read + bytes written) /
time / stream_read's GB/s. Goal (issue 14): >= 70%. The header names the CPU and the activation variant the kernels take (the library's rule,
or OTFUSE_ACTIVATION_ISA).

    python bench/activation_kernel.py [--shape 8192 5632] [--dtype float32 float16] [--threads 1 2]
                                      [--repeat 5] [--ops ...] [--no-unfused] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.use_checkout()

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import otfuse  # noqa: E402
from rope_kernel import BoundRun, session  # noqa: E402  (one IO-bound session per model)

GOAL_READ_FRACTION = 0.70
ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
# op name -> (otfuse op, its attributes, inputs: "x" | "two" | "split")
OPS = {
    "gelu_erf": ("Gelu", {}, "x"),
    "gelu_tanh": ("Gelu", {"approximate": "tanh"}, "x"),
    "quick_gelu": ("QuickGelu", {"alpha": 1.702}, "x"),
    "silu": ("SiLU", {}, "x"),
    "relu_squared": ("ReluSquared", {}, "x"),
    "swiglu": ("SwiGLU", {}, "two"),
    "swiglu_split": ("SwiGLU", {}, "split"),
    "geglu_tanh": ("GeGLU", {"approximate": "tanh"}, "two"),
}


def _const(nodes: list, name: str, value: float, t: int) -> str:
    dtype = np.float16 if t == TensorProto.FLOAT16 else np.float32
    nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(value, dtype))))
    return name


def _unfused_activation(nodes: list, op: str, x: str, y: str, t: int) -> None:
    """What exporters write for the element-wise activation of x."""
    def n(op_type, inputs, out):
        nodes.append(helper.make_node(op_type, inputs, [out]))
        return out

    if op == "gelu_erf":  # dynamo at opset 20
        n("Gelu", [x], y)
    elif op in ("gelu_tanh", "geglu_tanh"):  # GPT-2's NewGELU
        cube = n("Pow", [x, _const(nodes, f"{y}_3", 3.0, t)], f"{y}_cube")
        inner = n("Add", [x, n("Mul", [cube, _const(nodes, f"{y}_k", 0.044715, t)], f"{y}_kx3")], f"{y}_in")
        scaled = n("Mul", [inner, _const(nodes, f"{y}_c", math.sqrt(2 / math.pi), t)], f"{y}_u")
        one_plus = n("Add", [n("Tanh", [scaled], f"{y}_t"), _const(nodes, f"{y}_1", 1.0, t)], f"{y}_1t")
        n("Mul", [n("Mul", [x, _const(nodes, f"{y}_h", 0.5, t)], f"{y}_hx"), one_plus], y)
    elif op == "quick_gelu":
        n("Mul", [x, n("Sigmoid", [n("Mul", [x, _const(nodes, f"{y}_a", 1.702, t)], f"{y}_ax")], f"{y}_s")], y)
    elif op == "relu_squared":  # TorchScript's torch.square(relu(x))
        r = n("Relu", [x], f"{y}_r")
        n("Mul", [r, r], y)
    else:  # silu, swiglu
        n("Mul", [x, n("Sigmoid", [x], f"{y}_s")], y)


def input_shape(op: str, shape: tuple[int, int]) -> tuple[int, int]:
    """Each input's shape: [rows, 2 * width] for the split form (gate and up halves of one input)."""
    rows, width = shape
    return (rows, 2 * width) if OPS[op][2] == "split" else (rows, width)


def models(op: str, dtype: str, shape: tuple[int, int]) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """(fused, unfused, input names) for `op` with Y of `shape` [rows, width]."""
    fused_op, attrs, form = OPS[op]
    t = ONNX_TYPE[dtype]
    names = {"x": ["x"], "two": ["gate", "up"], "split": ["x"]}[form]
    inputs = [helper.make_tensor_value_info(name, t, list(input_shape(op, shape))) for name in names]
    output = [helper.make_tensor_value_info("y", t, list(shape))]
    fused = helper.make_node(fused_op, names, ["y"], domain="otfuse", **attrs)
    nodes: list = []
    if form == "x":
        _unfused_activation(nodes, op, "x", "y", t)
    else:
        if form == "split":
            nodes.append(helper.make_node("Split", ["x"], ["gate", "up"], axis=-1, num_outputs=2))
        _unfused_activation(nodes, op, "gate", "act", t)
        nodes.append(helper.make_node("Mul", ["act", "up"], ["y"]))
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("otfuse", 1)]
    make = lambda graph_nodes: helper.make_model(helper.make_graph(graph_nodes, op, inputs, output),  # noqa: E731
                                                 opset_imports=opsets)
    return make([fused]), make(nodes), names


class StreamRead:
    """bench/stream_read.c, built once: THREADS threads summing `megabytes` MB, best of `passes`."""

    def __init__(self, threads: int, megabytes: int, folder: Path):
        self.binary = folder / "stream_read"
        source = Path(__file__).resolve().parent / "stream_read.c"
        subprocess.run(["gcc", "-O2", "-mavx2", "-pthread", str(source), "-o", str(self.binary)], check=True)
        self.threads, self.megabytes = threads, megabytes

    def __call__(self, passes: int = 5) -> float:
        """GB/s of the best pass."""
        out = subprocess.run([str(self.binary), str(self.threads), str(self.megabytes), str(passes)],
                             check=True, capture_output=True, text=True).stdout
        return float(re.search(r"best ([\d.]+) GB/s", out).group(1))


def reference_output(op: str, feeds: dict[str, np.ndarray], rows: slice) -> np.ndarray:
    """otfuse.verify.reference's float64 formula on `rows` of the inputs."""
    from otfuse.verify import reference
    fused_op, attrs, form = OPS[op]
    x = {name: array[rows].astype(np.float32) for name, array in feeds.items()}
    gelu = lambda v: reference.gelu_exact(v, attrs.get("approximate", "none"))  # noqa: E731
    if form == "x":
        act = {"Gelu": gelu, "SiLU": reference.silu_exact,
               "QuickGelu": lambda v: reference.quick_gelu_exact(v, attrs["alpha"]),
               "ReluSquared": reference.relu_squared_exact}[fused_op]
        return act(x["x"])
    gate, up = (x["gate"], x["up"]) if form == "two" else np.split(x["x"], 2, axis=-1)
    act = reference.silu_exact if fused_op == "SwiGLU" else gelu
    return act(gate) * up.astype(np.float64)


def activation_isa() -> str:
    """The variant the activation kernels take here: activation_kernel.cc's rule (AVX-512F, else
    AVX2 + FMA + F16C, else baseline), or the one OTFUSE_ACTIVATION_ISA / OTFUSE_CPU_ISA forces."""
    import os
    if forced := os.environ.get("OTFUSE_ACTIVATION_ISA"):
        return f"{forced} (OTFUSE_ACTIVATION_ISA)"
    if os.environ.get("OTFUSE_CPU_ISA") == "baseline":
        return "baseline (OTFUSE_CPU_ISA)"
    flags = common.cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags:
        return "baseline"
    return "avx512 (16 lanes)" if "avx512f" in flags else "avx2 (8 lanes)"


def _timed(run) -> tuple[float, float]:
    """(wall, CPU) seconds of one run; CPU is this process's, every thread's."""
    start, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - start, time.process_time() - cpu


def bench_op(op: str, dtype: str, shape: tuple[int, int], threads: int, repeat: int, library: str,
             folder: Path, with_unfused: bool = True) -> dict:
    fused_model, unfused_model, names = models(op, dtype, shape)
    rng = np.random.default_rng(len(op))
    feeds = {name: (rng.standard_normal(input_shape(op, shape), dtype=np.float32) * 2).astype(dtype)
             for name in names}
    y_fused, y_unfused = np.empty(shape, dtype), np.empty(shape, dtype)
    fused = BoundRun(session(fused_model, threads, library), feeds, y_fused)
    unfused = BoundRun(session(unfused_model, threads, None), feeds, y_unfused) if with_unfused else None
    read_bytes, written_bytes = sum(a.nbytes for a in feeds.values()), y_fused.nbytes
    traffic = read_bytes + written_bytes
    stream = StreamRead(threads, max(1, traffic // 10**6), folder)
    runs = [r for r in (fused, unfused) if r is not None]
    for run in runs + runs:
        run()  # warm up: pages touched, thread pools started
    times = {"fused": [], "fused_cpu": [], "unfused": [], "stream_read_gbps": []}
    for _ in range(repeat):
        wall, cpu = _timed(fused)
        times["fused"].append(wall)
        times["fused_cpu"].append(cpu)
        if unfused is not None:
            times["unfused"].append(_timed(unfused)[0])
        times["stream_read_gbps"].append(stream())
    # The outputs against the unfused graph's, or (--no-unfused) the first rows against numpy's
    # float64 formula.
    rows = slice(None) if unfused is not None else slice(0, 8)
    expected = y_unfused[rows].astype(np.float64) if unfused is not None else reference_output(op, feeds, rows)
    tol = 1e-4 if dtype == "float32" else 1e-2
    err = np.abs(y_fused[rows].astype(np.float64) - expected)
    agree = bool(np.all(err <= tol + tol * np.abs(expected)))
    best_fused, best_read = min(times["fused"]), max(times["stream_read_gbps"])
    fused_gbps = traffic / best_fused / 1e9
    best_unfused = min(times["unfused"]) if times["unfused"] else math.nan
    return {
        "op": op, "dtype": dtype, "shape": list(shape), "read_bytes": read_bytes, "written_bytes": written_bytes,
        "traffic_bytes": traffic, "threads": threads,
        "fused_ms": best_fused * 1e3, "fused_median_ms": statistics.median(times["fused"]) * 1e3,
        "fused_cpu_ms": times["fused_cpu"][times["fused"].index(best_fused)] * 1e3,
        "unfused_ms": best_unfused * 1e3, "speedup": best_unfused / best_fused,
        "fused_gbps": fused_gbps, "read_gbps": best_read, "read_fraction": fused_gbps / best_read,
        "read_gbps_all": times["stream_read_gbps"], "outputs_agree": agree, "max_abs_diff": float(err.max()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs=2, default=[8192, 5632], metavar=("ROWS", "WIDTH"),
                        help="Y's shape (each input's, the split form's is [ROWS, 2 WIDTH])")
    parser.add_argument("--dtype", nargs="+", default=["float32", "float16"], choices=sorted(ONNX_TYPE))
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--no-unfused", action="store_true",
                        help="time the fused kernels and stream_read only (outputs checked against numpy)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    library = otfuse.library_path()
    info = common.machine_info() | {"cpu": common.cpu_identity(), "activation_isa": activation_isa()}
    shape = tuple(args.shape)
    print(f"CPU: {info['cpu']} ({info['nproc']} CPUs), loadavg {open('/proc/loadavg').read().split()[:3]}")
    print(f"activation kernels: {info['activation_isa']}; {info['date']}")
    print(f"Y [{shape[0]}, {shape[1]}], best of {args.repeat} rounds; GB/s = (bytes read + bytes written) / time, "
          f"'of read' = that / stream_read's best GB/s (same threads, same bytes, same rounds)\n")
    header = f"{'op':13} {'dtype':8} {'thr':>3} {'MB r+w':>10} {'fused ms':>9} {'CPU ms':>7} {'unfused ms':>10} {'speed-up':>8} " \
             f"{'fused GB/s':>10} {'read GB/s':>9} {'of read':>8}  outputs"
    print(header)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for threads in args.threads:
            for dtype in args.dtype:
                for op in args.ops:
                    row = bench_op(op, dtype, shape, threads, args.repeat, library, Path(folder), not args.no_unfused)
                    rows.append(row)
                    mark = "" if row["read_fraction"] >= GOAL_READ_FRACTION else "  (< 70%)"
                    rw = f"{row['read_bytes'] // 10**6}+{row['written_bytes'] // 10**6}"
                    print(f"{op:13} {dtype:8} {threads:3} {rw:>10} {row['fused_ms']:9.1f} {row['fused_cpu_ms']:7.1f} "
                          f"{row['unfused_ms']:10.1f} "
                          f"{row['speedup']:7.2f}x {row['fused_gbps']:10.1f} {row['read_gbps']:9.1f} "
                          f"{row['read_fraction']:8.0%}  {'agree' if row['outputs_agree'] else 'DIFFER'}{mark}",
                          flush=True)
    print(f"\nloadavg after: {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "args": vars(args) | {"json": str(args.json)},
                                         "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
