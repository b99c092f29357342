"""One RMSNorm + projections node against MLAS in paired turns: GFLOP/s of the products in the node.

    python bench/norm_linear_node.py --hidden 896 --widths 4864 4864 --tokens 2048 \
        --variant main=/work/coord/lib_ed1d4df.so new= --threads 2 --turns 9

Sessions, one run each per turn, the first slot rotating (no session always runs first):
"unfused" = otfuse's RMSNorm then one ORT MatMul per width (MLAS, weights prepacked as constants:
what the model without norm_linear runs), "matmul" = the MatMuls alone on an already normalised
input (MLAS's GEMM rate on the node's shapes), and one fused RMSNormLinear session per --variant
(LABEL=LIBRARY[,EP=1], LIBRARY empty for OTFUSE_LIBRARY; the custom-op route: plain ORT + the
library, W read in place; EP=1: the library's plugin EP, W packed once; any other KEY=VALUE set in
the environment around that session's creation and runs). Prints per M each session's median GFLOP/s (2 M K sum(widths) over its wall time;
the norm's time counts in unfused and the variants) and the median of per-turn unfused / variant
matmul / variant and first variant / variant time ratios (above 1: the variant is faster), and the FMA peak
(bench/fma_peak.c, the same threads) before and after the turns: this host runs FMA-bound loops up
to ~1.5x slower for stretches of seconds, so only figures of the same turns compare
(bench/README.md, "norm_linear large M, session 17"). --dtype fp16: x, the weights and the outputs
float16; ORT runs the unfused MatMuls as float32 on converted weights between inserted Casts, and the
Casts of the outputs count in "unfused" / "matmul" (in a model ORT drops those before an activation
it then runs in float32: Qwen2's gate / up, 2 x [512, 4864] at 512 rows, ~4% of the node), so the
fp16 ratios here lean ~4% toward the fused node (bench/README.md, "norm_linear never slower,
session 19"). Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import norm_linear as nl  # noqa: E402
import norm_linear_ab as ab  # noqa: E402

common.use_checkout()
import otfuse  # noqa: E402


def node_model(hidden: int, widths: list[int], with_norm: bool, dtype=np.float32) -> onnx.ModelProto:
    """x [1, M, hidden] -> (decomposed RMSNorm ->) one MatMul per width (outputs y0, y1, ...), all
    of `dtype` (float16: ORT runs the unfused MatMuls as float32 on converted weights, between Casts)."""
    nl.HIDDEN = hidden
    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x = nl.rms(nodes, inits, "x", "norm", dtype, rng) if with_norm else "x"
    for i, n in enumerate(widths):
        w = (rng.standard_normal((hidden, n), dtype=np.float32) * 0.02).astype(dtype)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", elem, ["batch", "seq", n]))
    inputs = [helper.make_tensor_value_info("x", elem, ["batch", "seq", hidden])]
    model = helper.make_model(helper.make_graph(nodes, "node", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def print_split(labels: list[str], times: list[dict], flop: float, split_at: float) -> None:
    """The turns apart by the host's state in each (MLAS's rate on the node's shapes, "matmul"): per
    class the turns, each session's median GFLOP/s and the first variant / variant paired ratios."""
    rates = [flop / w * 1e-9 for w in times[1]["walls"]]
    print("  matmul GFLOP/s per turn: " + " ".join(f"{r:.0f}" for r in rates), flush=True)
    for name, keep in (("quiet", lambda r: r >= split_at), ("slow", lambda r: r < split_at)):
        turns = [i for i, r in enumerate(rates) if keep(r)]
        if not turns:
            continue
        picked = [{"walls": [t["walls"][i] for i in turns]} for t in times]
        line = f"  {name} (matmul >= {split_at:.0f}: {len(turns)} turns):" if name == "quiet" else \
            f"  {name} (matmul < {split_at:.0f}: {len(turns)} turns):"
        for label, t in zip(labels, picked):
            line += f" {label} {flop / statistics.median(t['walls']) * 1e-9:.0f}"
        line += " GFLOP/s |"
        for label, t in zip(labels[3:], picked[3:]):
            line += f" {labels[2]}/{label} {common.paired_ratio(picked[2], t):.3f}x"
        print(line, flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--widths", nargs="+", type=int, default=[4864, 4864])
    parser.add_argument("--tokens", nargs="+", type=int, default=[2048])
    parser.add_argument("--variant", nargs="+", default=["new="], help="LABEL=LIBRARY (empty: OTFUSE_LIBRARY)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["fp32", "fp16"], default="fp32")
    parser.add_argument("--turns", type=int, default=9)
    parser.add_argument("--split-at", type=float, default=0.0,
                        help="GFLOP/s: also report the turns whose matmul (MLAS) rate is at least / below it apart "
                             "(the host's quiet / slow stretches)")
    parser.add_argument("--dump", default="", help="append each M's per-turn wall times to this JSON-lines file")
    args = parser.parse_args()
    default_library = otfuse.library_path()
    peak = common.fma_peak(args.threads)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU {common.cpu_identity()}; threads {args.threads}; "
          f"K {args.hidden} N {args.widths} {args.dtype}; FMA peak before {peak}", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        src, base, fused, bare = (folder / f"{n}.onnx" for n in ("src", "base", "fused", "bare"))
        dtype = np.float16 if args.dtype == "fp16" else np.float32
        onnx.save(node_model(args.hidden, args.widths, True, dtype), src)
        onnx.save(node_model(args.hidden, args.widths, False, dtype), bare)
        otfuse.fuse(src, base, only=["norm"])
        otfuse.fuse(src, fused, only=["norm", "norm_linear"])
        ops = [n.op_type for n in onnx.load(fused, load_external_data=False).graph.node]
        assert any(op.endswith("NormLinear") for op in ops), ops
        def session(path, library, env=None, ep=False):  # without ORT's memory pattern, as before
            return ab.session(path, args.threads, library, env or {}, ep, mem_pattern=False)

        labels = ["unfused", "matmul"]
        envs: list[dict[str, str]] = [{}, {}]
        sessions = [session(base, default_library), session(bare, default_library)]
        for spec in args.variant:
            label, library, env, ep = ab.parse_variant(spec)
            labels.append(label)
            sessions.append(session(fused, library or default_library, env, ep))
            envs.append(env)
        for m in args.tokens:
            x = np.random.default_rng(m).standard_normal((1, m, args.hidden)).astype(dtype)
            feeds = {"x": x}
            reference = sessions[0].run(None, feeds)
            for label, s in zip(labels[2:], sessions[2:]):
                out = s.run(None, feeds)
                diff = max(float(np.max(np.abs(a.astype(np.float32) - b))) for a, b in zip(out, reference))
                print(f"  M={m} {label}: max |diff| vs unfused {diff:.2g}", flush=True)
            keys = sorted({key for env in envs for key in env})
            runner = ab.env_runner(keys, repeat=1)
            runs = [runner(s, env, feeds) for s, env in zip(sessions, envs)]
            times = common.side_by_side(runs, args.turns, args.turns, rotate=True)
            flop = 2.0 * m * args.hidden * sum(args.widths)
            line = f"M={m}:"
            for label, t in zip(labels, times):
                line += f" {label} {flop / statistics.median(t['walls']) * 1e-9:.0f}"
            line += " GFLOP/s |"
            for label, t in zip(labels[2:], times[2:]):
                line += (f" {label}: unfused/{label} {common.paired_ratio(times[0], t):.3f}x, "
                         f"matmul/{label} {common.paired_ratio(times[1], t):.3f}x, "
                         f"{labels[2]}/{label} {common.paired_ratio(times[2], t):.3f}x |")
            print(line, flush=True)
            if args.split_at > 0:
                print_split(labels, times, flop, args.split_at)
            if args.dump:
                with open(args.dump, "a") as f:
                    f.write(json.dumps({"m": m, "labels": labels, "walls": [t["walls"] for t in times]}) + "\n")
    print(f"FMA peak after {common.fma_peak(args.threads)}", flush=True)


if __name__ == "__main__":
    main()
