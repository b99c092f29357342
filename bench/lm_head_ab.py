"""LM-head A/B: final LayerNorm + a tied lm_head (the `[V, K]` embedding table E, read by a Gather
too, multiplied as `MatMul(ln, Transpose(E))` the way GPT-2 / Qwen2 exports have it) unfused
against fused sessions (LayerNormLinear, `transposed` = 1; tied: `shared_weight` = 1, so the
custom-op kernel packs E once, `OTFUSE_NORM_LINEAR_SHARED_PACK=0` reads it in place as an untied E
always is) that differ in the library they load or the environment their runs see, side by side in one process (bench/
norm_linear_ab.py's variants). Prints, measured in the same run: the CPU model, the memory read
bandwidth (bench/stream_read.c), ORT's MatMul GFLOP/s on [M, K] x [K, V] (MLAS, prepacked), and
per variant its time, the unfused / variant ratio (median of per-turn ratios), the GFLOP/s and the
rate at which it passes over E's bytes (GB/s: E's bytes / time).

    python bench/lm_head_ab.py --vocab 50257 --hidden 768 --tokens 16 128 \
        --variant new= base=/work/coord/lib_74f7c80.so knob=,OTFUSE_GEMM_ISA=avx2 \
        inplace=,OTFUSE_NORM_LINEAR_SHARED_PACK=0

A variant is LABEL=LIBRARY[,KEY=VALUE...] (LIBRARY empty: OTFUSE_LIBRARY); EP=1 runs the node on
the library's plugin EP (E packed once by PrePack). Not a test.
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
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import norm_linear_ab as ab  # noqa: E402

common.use_checkout()
import otfuse  # noqa: E402


def lm_head_model(vocab: int, hidden: int, tied: bool) -> onnx.ModelProto:
    """x [1, M, K] -> LayerNorm -> MatMul(., Transpose(E)) -> logits; Gather(E, ids) -> emb (tied)."""
    rng = np.random.default_rng(0)
    table = (rng.standard_normal((vocab, hidden), dtype=np.float32) * 0.02).astype(np.float32)
    inits = [numpy_helper.from_array(table, "E"),
             numpy_helper.from_array((1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32), "ln.scale"),
             numpy_helper.from_array((0.1 * rng.standard_normal(hidden)).astype(np.float32), "ln.bias")]
    nodes = [helper.make_node("LayerNormalization", ["x", "ln.scale", "ln.bias"], ["ln"], axis=-1, epsilon=1e-5),
             helper.make_node("Transpose", ["E"], ["ET"], perm=[1, 0]),
             helper.make_node("MatMul", ["ln", "ET"], ["logits"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", hidden])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq", vocab])]
    if tied:
        nodes.append(helper.make_node("Gather", ["E", "ids"], ["emb"], axis=0))
        inputs.append(helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "seq"]))
        outputs.append(helper.make_tensor_value_info("emb", TensorProto.FLOAT, [1, "seq", hidden]))
    graph = helper.make_graph(nodes, "lm_head", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def feeds_for(m: int, vocab: int, hidden: int, tied: bool) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(m)
    feeds = {"x": rng.standard_normal((1, m, hidden), dtype=np.float32)}
    if tied:
        feeds["ids"] = rng.integers(0, vocab, (1, m), dtype=np.int64)
    return feeds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=50257)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--untied", action="store_true", help="no Gather of E")
    parser.add_argument("--tokens", nargs="+", type=int, default=[16, 128])
    parser.add_argument("--variant", nargs="+", required=True, help="LABEL=LIBRARY[,KEY=VALUE...] (EP=1: plugin EP)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5, help="clean turns wanted")
    parser.add_argument("--turns", type=int, default=7, help="turns at most")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each session per turn")
    args = parser.parse_args()
    tied = not args.untied
    default_library = otfuse.library_path()
    bandwidth = common.read_bandwidth(args.threads)
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU {common.cpu_identity()}; "
          f"otfuse ISA {common.otfuse_isa_path()}; loadavg {open('/proc/loadavg').read().split()[:3]}; "
          f"V {args.vocab} K {args.hidden} tied {tied}; read bandwidth {bandwidth} GB/s ({args.threads} threads)",
          flush=True)
    table_gb = args.vocab * args.hidden * 4 / 1e9
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        src, base, fused = (folder / f"{n}.onnx" for n in ("lm_head", "base", "fused"))
        onnx.save(lm_head_model(args.vocab, args.hidden, tied), src)
        otfuse.fuse(src, base, only=["norm"])
        report = otfuse.fuse(src, fused, only=["norm", "norm_linear"])
        shared = [list(a.ints) for n in onnx.load(fused).graph.node for a in n.attribute if a.name == "shared_weight"]
        print(f"fused: {report.fusions}, shared_weight {shared or 'absent'}", flush=True)
        sessions = [("unfused", ab.session(base, args.threads, default_library, {}), {})]
        for spec in args.variant:
            label, library, env, ep = ab.parse_variant(spec)
            sessions.append((label, ab.session(fused, args.threads, library or default_library, env, ep), env))
        keys = sorted({key for _, _, env in sessions for key in env})
        runner = ab.env_runner(keys, args.repeat)

        for m in args.tokens:
            mlas = common.ort_matmul_gflops(m, args.hidden, [args.vocab], args.threads, runs=3)
            feeds = feeds_for(m, args.vocab, args.hidden, tied)
            runs = [runner(s, env, feeds) for _, s, env in sessions]
            reference = runs[0]()[0]
            diffs = [float(np.max(np.abs(reference - run()[0]))) for run in runs[1:]]
            times = common.side_by_side(runs, args.runs, args.turns)
            flops = 2.0 * m * args.hidden * args.vocab
            base_t = times[0]
            line = (f"M={m}: ORT MatMul {mlas:.0f} GFLOP/s | unfused {base_t['median'] * 1e3 / args.repeat:.2f} ms "
                    f"({flops / base_t['median'] * args.repeat * 1e-9:.0f} GFLOP/s), clean {base_t['clean']}/{base_t['turns']}, "
                    f"others {max(t['others'] for t in times):.2f} cores |")
            for (label, _, _), t, diff in zip(sessions[1:], times[1:], diffs):
                seconds = t["median"] / args.repeat
                line += (f" {label} {seconds * 1e3:.2f} ms {common.paired_ratio(base_t, t):.3f}x "
                         f"({flops / seconds * 1e-9:.0f} GFLOP/s, E at {table_gb / seconds:.1f} GB/s, diff {diff:.2g}) |")
            print(line, flush=True)
    for key in keys:
        os.environ.pop(key, None)


if __name__ == "__main__":
    main()
