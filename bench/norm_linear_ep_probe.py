"""PROBE (bench/README.md, "norm_linear through a plugin EP"): does ORT's plugin-EP kernel API let a
library pre-pack the *NormLinear weights once, with ORT freeing the initializers, while ORT's CPU EP
runs the rest of the graph? Builds bench/norm_linear_ep_probe.cc, fuses a small RMSNorm -> 3
MatMuls block (K = 4096, N = 4096 + 2 x 8192: 320 MiB of float32 weights), and in fresh child
processes creates three sessions: unfused (otfuse's norm + ORT MatMuls), fused through the
custom-op library, fused with the probe EP claiming the RMSNormLinear node. Prints per session the
providers, what the probe logged (claimed nodes, PrePackWeight calls), whether ORT inserted copy
nodes, the output difference to the unfused session and the RSS (growth at creation, peak).

    python bench/norm_linear_ep_probe.py [--rows 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import norm_linear as nl  # noqa: E402

common.use_checkout()
import otfuse  # noqa: E402

HERE = Path(__file__).resolve().parent
HEADERS = Path.home() / ".cache/otfuse/ort-headers/go-v1.27.0"
WIDTHS = (4096, 8192, 8192)

CHILD = r"""
import json, sys
import numpy as np
import onnxruntime as ort
def rss():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out
model, library, probe, mode, feeds, out = sys.argv[1:7]
before = rss()["VmRSS"]
options = ort.SessionOptions()
options.intra_op_num_threads = 2
options.log_severity_level = 0 if mode == "ep-log" else 3
options.register_custom_ops_library(library)
if mode.startswith("ep"):
    ort.register_execution_provider_library("otfuse_probe", probe)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == "OtfuseProbeEp"]
    options.add_provider_for_devices(devices, {})
    session = ort.InferenceSession(model, options)
else:
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
created = rss()["VmRSS"]
result = session.run(None, dict(np.load(feeds)))
np.savez(out, *result)
print(json.dumps({"providers": session.get_providers(), "created_mib": created - before,
                  "peak_rss_mib": rss()["VmHWM"]}))
"""


def block(rows: int) -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    # CPU EP nodes before and after the fused one: the probe EP must share tensors with them
    # without copies.
    nodes.append(helper.make_node("Sigmoid", ["x"], ["xs"]))
    n1 = nl.rms(nodes, inits, "xs", "norm", np.float32, rng)
    for i, n in enumerate(WIDTHS):
        w = f"w{i}"
        inits.append(numpy_helper.from_array(rng.standard_normal((nl.HIDDEN, n), dtype=np.float32) * 0.02, w))
        nodes.append(helper.make_node("MatMul", [n1, w], [f"p{i}"]))
        nodes.append(helper.make_node("Relu", [f"p{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", onnx.TensorProto.FLOAT, [1, "seq", n]))
    inputs = [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, "seq", nl.HIDDEN])]
    model = helper.make_model(helper.make_graph(nodes, "probe", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def build_probe(folder: Path) -> Path:
    out = folder / "ep_probe.so"
    subprocess.run(["g++", "-O2", "-std=c++17", "-shared", "-fPIC", f"-I{HEADERS}",
                    str(HERE / "norm_linear_ep_probe.cc"), "-o", str(out)], check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        probe = build_probe(folder)
        src, base, fused = folder / "src.onnx", folder / "base.onnx", folder / "fused.onnx"
        onnx.save(block(args.rows), src)
        otfuse.fuse(src, base, only=["norm"])
        otfuse.fuse(src, fused, only=["norm", "norm_linear"])
        print("fused nodes:", [n.op_type for n in onnx.load(fused).graph.node])
        feeds = folder / "feeds.npz"
        np.savez(feeds, x=np.random.default_rng(1).standard_normal((1, args.rows, nl.HIDDEN)).astype(np.float32))
        outputs = {}
        for label, model, mode in (("unfused", base, "custom"), ("fused, custom op", fused, "custom"),
                                   ("fused, probe EP", fused, "ep"), ("fused, probe EP, verbose log", fused, "ep-log")):
            out = folder / f"out_{mode}_{label[:5]}.npz"
            run = subprocess.run([sys.executable, "-c", CHILD, str(model), otfuse.library_path(), str(probe), mode,
                                  str(feeds), str(out)], capture_output=True, text=True, env=common.child_env())
            log = run.stderr.splitlines()
            probe_lines = [line for line in log if line.startswith("probe:")]
            copies = [line for line in log if "MemcpyTransformer modified" in line]
            print(f"== {label}: exit {run.returncode}")
            if run.returncode != 0:
                print("\n".join(log[-15:]))
                continue
            print("  ", run.stdout.strip().splitlines()[-1])
            for line in probe_lines:
                print("  ", line)
            placements = [line for line in log if "placed on" in line or "Node(s) placed" in line
                          or line.lstrip().startswith("Node name:")]
            for line in copies[:2] + placements[:12]:
                print("  ", line[-150:])
            outputs[label] = [v for _, v in sorted(np.load(out).items())]
        if "unfused" in outputs:
            for label, values in outputs.items():
                diff = max(float(np.max(np.abs(a - b))) for a, b in zip(values, outputs["unfused"]))
                print(f"max |{label} - unfused| = {diff:.3g}")


if __name__ == "__main__":
    main()
