#!/usr/bin/env python3
"""The activation family's CPU kernels against the machine's memory read bandwidth, and against
the unfused subgraphs in plain ONNX Runtime, side by side in one run.

For each op and dtype, on tensors much larger than the caches (``--elements`` per input):

- fused: one otfuse node (Gelu none / tanh, QuickGelu, SiLU, SwiGLU and GeGLU with two inputs or
  the halves of one) with the custom-op library;
- unfused: the graph exporters write for it (GPT-2's NewGELU for the tanh form, ONNX ``Gelu``-20
  for the erf form as dynamo exports it, ``x * Sigmoid(x)``, ``SiLU(gate) * up``, ...), default ORT
  graph optimisations, no custom ops;
- read bandwidth: ``bench/stream_read.c`` (compiled here with gcc), THREADS threads summing a
  buffer as large as the fused kernel's traffic, its best pass.

They take turns, ``--repeat`` rounds, so each sees the same machine load; the best of each is
compared. The kernel's traffic is what it must move: its inputs read and Y written, so
"of read bandwidth" = (bytes read + bytes written) / time / stream_read's GB/s. Goal (issue 14):
>= 70%.

    python bench/activation_kernel.py [--elements 33554432] [--dtype float32 float16] [--threads 2]
                                      [--repeat 5] [--ops ...] [--json out.json]
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
    else:  # silu, swiglu
        n("Mul", [x, n("Sigmoid", [x], f"{y}_s")], y)


def models(op: str, dtype: str, n: int) -> tuple[onnx.ModelProto, onnx.ModelProto, list[str]]:
    """(fused, unfused, input names) for `op` on `n` elements per input ([2n] for the split form)."""
    fused_op, attrs, form = OPS[op]
    t = ONNX_TYPE[dtype]
    names = {"x": ["x"], "two": ["gate", "up"], "split": ["x"]}[form]
    width = 2 * n if form == "split" else n
    inputs = [helper.make_tensor_value_info(name, t, [width]) for name in names]
    output = [helper.make_tensor_value_info("y", t, [n])]
    fused = helper.make_node(fused_op, names, ["y"], domain="otfuse", **attrs)
    nodes: list = []
    if form == "x":
        _unfused_activation(nodes, op, "x", "y", t)
    else:
        if form == "split":
            nodes.append(helper.make_node("Split", ["x"], ["gate", "up"], axis=0, num_outputs=2))
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


def _timed(run) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def bench_op(op: str, dtype: str, n: int, threads: int, repeat: int, library: str, folder: Path) -> dict:
    fused_model, unfused_model, names = models(op, dtype, n)
    rng = np.random.default_rng(len(op))
    width = 2 * n if OPS[op][2] == "split" else n
    feeds = {name: (rng.standard_normal(width, dtype=np.float32) * 2).astype(dtype) for name in names}
    y_fused, y_unfused = np.empty(n, dtype), np.empty(n, dtype)
    fused = BoundRun(session(fused_model, threads, library), feeds, y_fused)
    unfused = BoundRun(session(unfused_model, threads, None), feeds, y_unfused)
    traffic = sum(a.nbytes for a in feeds.values()) + y_fused.nbytes
    stream = StreamRead(threads, max(1, traffic // 10**6), folder)
    for run in (fused, unfused, fused, unfused):
        run()  # warm up: pages touched, thread pools started
    times = {"fused": [], "unfused": [], "stream_read_gbps": []}
    for _ in range(repeat):
        times["fused"].append(_timed(fused))
        times["unfused"].append(_timed(unfused))
        times["stream_read_gbps"].append(stream())
    tol = 1e-4 if dtype == "float32" else 1e-2
    err = np.abs(y_fused.astype(np.float64) - y_unfused.astype(np.float64))
    agree = bool(np.all(err <= tol + tol * np.abs(y_unfused.astype(np.float64))))
    best_fused, best_read = min(times["fused"]), max(times["stream_read_gbps"])
    fused_gbps = traffic / best_fused / 1e9
    return {
        "op": op, "dtype": dtype, "elements": n, "traffic_bytes": traffic, "threads": threads,
        "fused_ms": best_fused * 1e3, "fused_median_ms": statistics.median(times["fused"]) * 1e3,
        "unfused_ms": min(times["unfused"]) * 1e3, "speedup": min(times["unfused"]) / best_fused,
        "fused_gbps": fused_gbps, "read_gbps": best_read, "read_fraction": fused_gbps / best_read,
        "read_gbps_all": times["stream_read_gbps"], "outputs_agree": agree, "max_abs_diff": float(err.max()),
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=1 << 25, help="elements per input")
    parser.add_argument("--dtype", nargs="+", default=["float32", "float16"], choices=sorted(ONNX_TYPE))
    parser.add_argument("--ops", nargs="+", default=list(OPS), choices=list(OPS))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    library = otfuse.library_path()
    info = common.machine_info()
    print(f"CPU: {info['cpu_model']} ({info['nproc']} CPUs), loadavg {open('/proc/loadavg').read().split()[:3]}")
    print(f"{args.threads} threads, {args.elements} elements per input, best of {args.repeat} rounds\n")
    header = f"{'op':13} {'dtype':8} {'fused ms':>9} {'unfused ms':>10} {'speed-up':>8} {'fused GB/s':>10} " \
             f"{'read GB/s':>9} {'of read':>8}  outputs"
    print(header)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for dtype in args.dtype:
            for op in args.ops:
                row = bench_op(op, dtype, args.elements, args.threads, args.repeat, library, Path(folder))
                rows.append(row)
                mark = "" if row["read_fraction"] >= GOAL_READ_FRACTION else "  (< 70%)"
                print(f"{op:13} {dtype:8} {row['fused_ms']:9.1f} {row['unfused_ms']:10.1f} {row['speedup']:7.2f}x "
                      f"{row['fused_gbps']:10.1f} {row['read_gbps']:9.1f} {row['read_fraction']:8.0%}  "
                      f"{'agree' if row['outputs_agree'] else 'DIFFER'}{mark}", flush=True)
    print(f"\nloadavg after: {open('/proc/loadavg').read().split()[:3]}")
    if args.json:
        args.json.write_text(json.dumps({"machine": info, "args": vars(args) | {"json": str(args.json)},
                                         "results": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
