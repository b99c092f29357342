"""Where bench/e2e_llama.py's prefill spends its time above the GEMM-bound floor, node type by node
type, each against its own floor measured in the same process and in the same turn:

- MatMul nodes: ORT's MatMul (MLAS, weights prepacked) on the same [M, K] x [K, N] shape, alone in
  a session of its own, run right after the model in every turn (the node / reference time ratio
  is taken per turn, so a host that speeds up or slows down between turns moves both);
- attention nodes: their useful FLOPs (the causal triangle) at the rate those reference MatMuls
  reached together in that turn (issue 12's floor: every useful FLOP at ORT MatMul's rate);
- every other node: the bytes it reads and writes (ORT's profile: activations, weights, outputs)
  at the read bandwidth of bench/stream_read.c, measured in that turn too.

With --ours, each projection shape also runs as an otfuse RMSNormLinear node (otfuse's GEMM, the
norm_linear family's route) and as the RMSNorm alone, in the same turns: MLAS vs our GEMM
on the model's shapes in one run (the norm's time is printed beside it, not subtracted).

    python bench/e2e_gap.py --workdir /work/e2e --seq 8192 --turns 3        # after e2e_llama.py made the models
    python bench/e2e_gap.py --workdir /work/e2e --seq 2048 --turns 8 --ours

Prints the CPU, the references of the run, per node type (median over turns) its time, its floor,
their ratio and its share of the time above the floor, then per MatMul shape the node's rate
against the reference's. Not a test.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import e2e_llama as e2e  # noqa: E402

common.use_checkout()

GEMM_OPS = ("MatMul", "Gemm", "FusedMatMul")
ATTENTION_OPS = ("Attention", "RopeAttention", "MultiHeadAttention", "GroupQueryAttention")


def model_session(path: Path, threads: int, profile_prefix: str):
    """The fused model as e2e_llama.py runs it (otfuse.InferenceSession, threads that do not spin), profiled."""
    import onnxruntime as ort
    import otfuse

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_profiling = True
    options.profile_file_prefix = profile_prefix
    return otfuse.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def reference_models(m: int, shapes: list[tuple[int, int]], ours: bool, workdir: Path) -> dict[str, Path]:
    """One model per (K, N): MatMul (MLAS) and, with `ours`, RMSNormLinear and RMSNorm alone."""
    from onnx import TensorProto, helper, numpy_helper
    import onnx

    rng = np.random.default_rng(0)
    paths = {}
    for k, n in shapes:
        w = numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32) / math.sqrt(k), "w")
        scale = numpy_helper.from_array(np.ones(k, np.float32), "scale")
        x = helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        graphs = {"mlas": helper.make_graph([helper.make_node("MatMul", ["a", "w"], ["y"])], "mm", [x], [y], [w])}
        if ours:
            graphs["ours"] = helper.make_graph(
                [helper.make_node("RMSNormLinear", ["a", "scale", "w"], ["y"], domain="otfuse", epsilon=1e-5,
                                  out_features=[n])], "nl", [x], [y], [scale, w])
            graphs["norm"] = helper.make_graph(
                [helper.make_node("RMSNorm", ["a", "scale"], ["y"], domain="otfuse", epsilon=1e-5)], "n", [x], [y], [scale])
        for kind, graph in graphs.items():
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("otfuse", 1)])
            model.ir_version = 9
            path = workdir / f"{kind}_{m}_{k}_{n}.onnx"
            onnx.save(model, str(path))
            paths[f"{kind} {k}x{n}"] = path
    return paths


def reference_session(path: Path, threads: int):
    import onnxruntime as ort
    import otfuse

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return otfuse.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def node_runs(profile_file: str, causal: set[str]) -> dict[str, dict]:
    """Per node of the model: op type, shapes, useful GFLOP, bytes moved, and its time (ms) in each run."""
    nodes: dict[str, dict] = {}
    for e in json.loads(Path(profile_file).read_text()):
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        a = e.get("args", {})
        name = e["name"][: -len("_kernel_time")]
        if name not in nodes:
            ins, outs = e2e._shapes(a.get("input_type_shape")), e2e._shapes(a.get("output_type_shape"))
            nodes[name] = {"op": a.get("op_name", "?"), "ins": ins, "outs": outs,
                           "gflop": e2e.node_flops(a.get("op_name", "?"), ins, outs, name in causal) / 1e9,
                           "bytes": sum(int(a.get(f, 0) or 0) for f in ("activation_size", "parameter_size", "output_size")),
                           "ms": []}
        nodes[name]["ms"].append(e["dur"] / 1e3)
    return nodes


def model_runs(profile_file: str) -> list[float]:
    return [e["dur"] / 1e3 for e in json.loads(Path(profile_file).read_text())
            if e.get("cat") == "Session" and e.get("name") == "model_run"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", type=Path, default=Path("/tmp/otfuse_e2e_llama"))
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--variant", default="otfuse", choices=["otfuse", "otfuse_no_nl", "otfuse_all"])
    p.add_argument("--vocab", type=int, default=1024)
    p.add_argument("--intermediate", type=int, default=5632)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--reference-rows", type=int, default=0,
                   help="rows of the reference MatMuls (default: the model's own, --seq)")
    p.add_argument("--ours", action="store_true", help="also otfuse's GEMM (RMSNormLinear) on each projection shape")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)

    model = args.workdir / f"vocab{args.vocab}_mlp{args.intermediate}" / "export" / f"{args.variant}.onnx"
    if not model.exists():
        print(f"{model} is missing: run bench/e2e_llama.py --workdir {args.workdir} --variants {args.variant} first")
        return 2
    print(f"CPU: {common.cpu_identity()}; otfuse ISA path: {common.otfuse_isa_path()}")
    print(f"{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC; {args.variant} S={args.seq}, {args.turns} turns, "
          f"{args.threads} threads", flush=True)
    m_ref = args.reference_rows or args.seq
    h, i, v, q, kv = e2e.HIDDEN, args.intermediate, args.vocab, e2e.HEADS * e2e.HEAD_DIM, e2e.KV_HEADS * e2e.HEAD_DIM
    shapes = sorted({(h, q), (h, kv), (h, i), (i, h), (h, v)})
    tmp = Path(tempfile.mkdtemp(prefix="e2e_gap_"))
    refs = reference_models(m_ref, shapes, args.ours, tmp)
    ref_sessions = {name: reference_session(path, args.threads) for name, path in refs.items()}
    feeds_by_k = {k: {"a": np.random.default_rng(1).standard_normal((m_ref, k), dtype=np.float32)} for k in {h, i}}
    session = model_session(model, args.threads, str(tmp / "profile"))
    feeds = e2e._feeds(args.seq, args.vocab)
    causal = e2e.causal_nodes(model)

    def run_ref(name):
        k = int(name.split()[1].split("x")[0])
        t0 = time.perf_counter()
        ref_sessions[name].run(None, feeds_by_k[k])
        return (time.perf_counter() - t0) * 1e3

    session.run(["logits"], feeds)  # warm-up (profiled: dropped below)
    for name in ref_sessions:
        run_ref(name)
    turns = []
    for t in range(args.turns):
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        b0, t0 = common.cpu_busy_seconds(), time.perf_counter()
        session.run(["logits"], feeds)
        wall = time.perf_counter() - t0
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
        busy = (common.cpu_busy_seconds() - b0) / wall
        ref_ms = {name: run_ref(name) for name in ref_sessions}
        bw = common.read_bandwidth(args.threads, reps=5)
        turns.append({"wall_ms": wall * 1e3, "cores_busy": round(busy, 2), "minor_faults": faults, "ref_ms": ref_ms,
                      "read_gb_per_s": bw["best"] if bw else None})
        print(f"  turn {t}: model {wall:.3f} s ({busy:.2f} cores busy, {faults} minor faults), read "
              f"{turns[-1]['read_gb_per_s']} GB/s, " + ", ".join(f"{n} {ms:.0f}" for n, ms in ref_ms.items()) + " ms",
              flush=True)
    profile = session.end_profiling()
    nodes = node_runs(profile, causal)
    runs = model_runs(profile)[1:]

    # Per turn: the reference rate over the model's projections (their FLOP-weighted MLAS rate).
    scale = args.seq / m_ref
    for turn in turns:
        flop = ms = 0.0
        for (k, n) in shapes:
            count = sum(1 for nd in nodes.values() if nd["op"] in GEMM_OPS and nd["ins"][0][-1] == k and nd["outs"][0][-1] == n)
            flop += count * 2.0 * args.seq * k * n
            ms += count * turn["ref_ms"][f"mlas {k}x{n}"] * scale
        turn["mlas_gflops"] = flop / 1e9 / (ms / 1e3)

    def floor_ms(nd, turn) -> tuple[str, float]:
        if nd["op"] in GEMM_OPS:
            k, n = nd["ins"][0][-1], nd["outs"][0][-1]
            rows = math.prod(nd["outs"][0][:-1])
            return "MatMul (same shape alone)", turn["ref_ms"][f"mlas {k}x{n}"] * rows / m_ref
        if nd["op"] in ATTENTION_OPS:
            return "useful FLOPs at MLAS rate", nd["gflop"] / turn["mlas_gflops"] * 1e3
        bw = turn["read_gb_per_s"] or float("nan")
        return "bytes at read bandwidth", nd["bytes"] / (bw * 1e9) * 1e3

    by_type: dict[str, dict] = {}
    for name, nd in nodes.items():
        timed = nd["ms"][1:]  # the warm-up dropped
        if len(timed) != len(turns):
            continue
        t = by_type.setdefault(nd["op"], {"count": 0, "ms": [0.0] * len(turns), "floor": [0.0] * len(turns), "basis": ""})
        t["count"] += 1
        for j, turn in enumerate(turns):
            basis, f = floor_ms(nd, turn)
            t["ms"][j] += timed[j]
            t["floor"][j] += f
            t["basis"] = basis
    node_total = [sum(t["ms"][j] for t in by_type.values()) for j in range(len(turns))]
    floor_total = [sum(t["floor"][j] for t in by_type.values()) for j in range(len(turns))]
    useful = e2e.useful_gflop(args.seq, args.vocab, args.intermediate)
    e2e_floor = [sum(useful.values()) / turn["mlas_gflops"] * 1e3 for turn in turns]
    med = statistics.median

    print(f"\nper turn: MLAS on the model's projection shapes ({m_ref} rows) "
          + ", ".join(f"{turn['mlas_gflops']:.0f}" for turn in turns) + " GFLOP/s; read "
          + ", ".join(f"{turn['read_gb_per_s']}" for turn in turns) + " GB/s")
    print(f"model run (profiled) {med(runs):.0f} ms median, nodes {med(node_total):.0f} ms, between nodes "
          f"{med(r - n for r, n in zip(runs, node_total)):.0f} ms; e2e floor (useful FLOPs at MLAS rate) "
          f"{med(e2e_floor):.0f} ms: model / floor {med(r / f for r, f in zip(runs, e2e_floor)):.3f}; "
          f"minor faults per run {med(t['minor_faults'] for t in turns):.0f}")
    excess_total = med(r - f for r, f in zip(runs, e2e_floor))
    print(f"\n{'node type':<16}{'n':>3}{'ms':>9}{'floor ms':>10}{'x floor':>9}{'excess ms':>11}   floor basis")
    rows = []
    for op, t in sorted(by_type.items(), key=lambda kv: -med(kv[1]["ms"])):
        ms, fl = med(t["ms"]), med(t["floor"])
        ratio = med(a / b for a, b in zip(t["ms"], t["floor"]) if b > 0) if fl > 0 else float("nan")
        excess = med(a - b for a, b in zip(t["ms"], t["floor"]))
        rows.append({"op": op, "count": t["count"], "ms": ms, "floor_ms": fl, "x_floor": ratio, "excess_ms": excess,
                     "basis": t["basis"]})
        print(f"{op:<16}{t['count']:>3}{ms:>9.1f}{fl:>10.1f}{ratio:>9.2f}{excess:>11.1f}   {t['basis']}")
    print(f"{'between nodes':<19}{med(r - n for r, n in zip(runs, node_total)):>9.1f}")
    print(f"(time above the e2e floor: {excess_total:.0f} ms; the floors of the node types sum to "
          f"{med(floor_total):.0f} ms)")

    print(f"\nper MatMul shape (rows x K x N): the model's node vs MLAS alone, GFLOP/s, median over turns")
    shape_rows = []
    for (k, n) in shapes:
        names = [nm for nm, nd in nodes.items() if nd["op"] in GEMM_OPS and nd["ins"][0][-1] == k and nd["outs"][0][-1] == n]
        gf_ref = 2.0 * m_ref * k * n / 1e9
        ref = [turn["ref_ms"][f"mlas {k}x{n}"] for turn in turns]
        line = {"k": k, "n": n, "nodes": len(names), "mlas_gflops": gf_ref / (med(ref) / 1e3)}
        if names:
            per_turn = [sum(nodes[nm]["ms"][1 + j] for nm in names) / len(names) for j in range(len(turns))]
            gf_node = 2.0 * args.seq * k * n / 1e9
            line["model_gflops"] = gf_node / (med(per_turn) / 1e3)
            line["model_over_ref_time"] = med(a / (b * args.seq / m_ref) for a, b in zip(per_turn, ref))
        if args.ours and f"ours {k}x{n}" in refs:
            ours = [turn["ref_ms"][f"ours {k}x{n}"] for turn in turns]
            norm = [turn["ref_ms"][f"norm {k}x{n}"] for turn in turns]
            line["ours_with_norm_gflops"] = gf_ref / (med(ours) / 1e3)
            line["norm_ms"] = med(norm)
            line["mlas_over_ours_time"] = med(a / b for a, b in zip(ref, ours))
        shape_rows.append(line)
        print(f"  {m_ref} x {k} x {n}: MLAS alone {line['mlas_gflops']:.0f}"
              + (f", in the model ({len(names)} nodes, {args.seq} rows) {line['model_gflops']:.0f} "
                 f"(time {line['model_over_ref_time']:.2f}x alone)" if names else "")
              + (f"; otfuse RMSNormLinear {line['ours_with_norm_gflops']:.0f} counting its norm "
                 f"({line['norm_ms']:.1f} ms alone): MLAS time / ours {line['mlas_over_ours_time']:.2f}" if args.ours else ""))
    if args.json:
        args.json.write_text(json.dumps({"cpu": common.cpu_identity(), "seq": args.seq, "variant": args.variant,
                                         "turns": turns, "by_type": rows, "shapes": shape_rows,
                                         "model_run_ms": runs, "e2e_floor_ms": e2e_floor}, indent=1))
    os.unlink(profile)
    return 0


if __name__ == "__main__":
    sys.exit(main())
