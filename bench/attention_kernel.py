"""Bench: otfuse.Attention against the unfused ORT subgraph and ORT's GroupQueryAttention (CPU).

B = 1, 16 heads, head size 128, causal, float32, S = 2048 / 8192 / 16384 (query = key length,
no cache). Three cases, each run in its own child process so its peak memory is its own:

  unfused   HF's SDPA attention as the dynamo exporter spells it (models/fixtures/llama.onnx):
            Mul(Q, √scale), Mul(Kᵀ, √scale), MatMul, Add(Where(mask, 0, -inf)), Softmax,
            IsNaN → Where(0), MatMul(·, V); Q/K/V BNSD, the [1, 1, S, S] bool causal mask fed as an
            input; ORT's default graph optimisations. Materialises [1, 16, S, S] scores.
  ort_gqa   com.microsoft GroupQueryAttention (num_heads = kv_num_heads = 16; query/key/value
            BSH [1, S, 2048], no past, seqlens_k = [S - 1], total_sequence_length = S; outputs
            Y, present_key, present_value). Its CPU kernel also allocates [1, 16, S, S] float32
            probabilities in older releases; ORT 1.32's peaks at ~0.65 GiB at S = 8192.
  otfuse    otfuse.Attention (num_heads = 16, causal = 1, BNSD).

The unfused case is skipped where its [1, 16, S, S] float32 scores would exceed --max-scores-gb
(default 6), and any case whose peak, projected from its smaller size by S², would not fit in the
memory available (the unfused graph peaks at ~6x its scores tensor); both are reported as such. Time: best of --repeats runs after one warm-up, --threads intra-op threads.
CPU seconds per run (process time, both threads) are reported too: on a shared 2-core machine a
run's wall time doubles whenever another process takes a core, its CPU time does not.
Peak memory: the child's VmHWM (= ru_maxrss) and the growth of its RSS over the runs.

    python bench/attention_kernel.py                       # all cases, S = 2048 8192 16384
    python bench/attention_kernel.py --sizes 2048 --json out.json
    OTFUSE_LIBRARY=build/dev/libotfuse_ops.so python bench/attention_kernel.py

Exits non-zero when a goal of the issue fails: otfuse >= 10x the unfused subgraph, >= 1.0x
GroupQueryAttention, and otfuse's working memory growing linearly in S.

Every other path of the kernel (issue #12): bench/attention_paths.py.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.use_checkout()

HEADS = 16
HEAD_SIZE = 128
CASES = ("unfused", "ort_gqa", "otfuse")


def scores_bytes(s: int) -> int:
    return HEADS * s * s * 4


def build_model(case: str, s: int):
    import onnx
    from onnx import TensorProto, helper

    f32 = TensorProto.FLOAT
    scale = 1.0 / HEAD_SIZE ** 0.5
    if case == "unfused":
        # As the dynamo exporter spells HF's SDPA attention (models/fixtures/llama.onnx): sqrt(scale)
        # on Q and on Kᵀ, the bool mask turned additive by Where, and the IsNaN → Where(0) guard.
        root = scale ** 0.5
        nodes = [
            helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
            helper.make_node("Mul", ["q", "root_scale"], ["qs"]),
            helper.make_node("Mul", ["kt", "root_scale"], ["ks"]),
            helper.make_node("Where", ["mask", "zero", "minus_inf"], ["bias"]),
            helper.make_node("MatMul", ["qs", "ks"], ["qk"]),
            helper.make_node("Add", ["qk", "bias"], ["masked"]),
            helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
            helper.make_node("IsNaN", ["probs"], ["nan"]),
            helper.make_node("Where", ["nan", "zero", "probs"], ["guarded"]),
            helper.make_node("MatMul", ["guarded", "v"], ["y"]),
        ]
        inputs = [helper.make_tensor_value_info(n, f32, [1, HEADS, s, HEAD_SIZE]) for n in "qkv"]
        inputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, [1, 1, s, s]))
        inits = [helper.make_tensor("root_scale", f32, [], [root]), helper.make_tensor("zero", f32, [], [0.0]),
                 helper.make_tensor("minus_inf", f32, [], [float("-inf")])]
        outputs = [helper.make_tensor_value_info("y", f32, [1, HEADS, s, HEAD_SIZE])]
        opsets = [helper.make_opsetid("", 17)]
    elif case == "ort_gqa":
        hidden = HEADS * HEAD_SIZE
        nodes = [helper.make_node(
            "GroupQueryAttention", ["q", "k", "v", "", "", "seqlens_k", "total_sequence_length"],
            ["y", "present_key", "present_value"], domain="com.microsoft",
            num_heads=HEADS, kv_num_heads=HEADS, scale=scale)]
        inputs = [helper.make_tensor_value_info(n, f32, [1, s, hidden]) for n in "qkv"]
        inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, [1]),
                   helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [])]
        inits = []
        outputs = [helper.make_tensor_value_info("y", f32, [1, s, hidden]),
                   helper.make_tensor_value_info("present_key", f32, None),
                   helper.make_tensor_value_info("present_value", f32, None)]
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    else:
        nodes = [helper.make_node("Attention", ["q", "k", "v"], ["y"], domain="otfuse",
                                  num_heads=HEADS, causal=1, scale=scale)]
        inputs = [helper.make_tensor_value_info(n, f32, [1, HEADS, s, HEAD_SIZE]) for n in "qkv"]
        inits = []
        outputs = [helper.make_tensor_value_info("y", f32, [1, HEADS, s, HEAD_SIZE])]
        opsets = [helper.make_opsetid("", 17), helper.make_opsetid("otfuse", 1)]
    graph = helper.make_graph(nodes, case, inputs, outputs, initializer=inits)
    return onnx.helper.make_model(graph, opset_imports=opsets)


def feeds_for(case: str, s: int) -> dict:
    import numpy as np

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, HEADS, s, HEAD_SIZE), dtype=np.float32) for _ in range(3))
    if case == "unfused":
        mask = np.tril(np.ones((s, s), bool))[None, None]  # True = attend (HF's SDPA bool mask)
        return {"q": q, "k": k, "v": v, "mask": mask}
    if case == "ort_gqa":
        bsh = [x.transpose(0, 2, 1, 3).reshape(1, s, HEADS * HEAD_SIZE).copy() for x in (q, k, v)]
        return {"q": bsh[0], "k": bsh[1], "v": bsh[2], "seqlens_k": np.array([s - 1], np.int32),
                "total_sequence_length": np.array(s, np.int32)}
    return {"q": q, "k": k, "v": v}


def run_child(case: str, s: int, threads: int, repeats: int) -> dict:
    """Runs one case in this process and returns its figures (called in the child)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if case == "otfuse":
        import otfuse

        options.register_custom_ops_library(otfuse.library_path())
    feeds = feeds_for(case, s)
    session = ort.InferenceSession(build_model(case, s).SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    rss_before = common.proc_memory_mib()["rss_mib"]
    times, cpu_times = [], []
    for i in range(repeats + 1):
        cpu_start = time.process_time()
        start = time.perf_counter()
        outputs = session.run(None, feeds)
        elapsed = time.perf_counter() - start
        cpu = time.process_time() - cpu_start
        if i > 0:  # the first run warms up
            times.append(elapsed)
            cpu_times.append(cpu)
        del outputs
    memory = common.proc_memory_mib()
    return {
        "case": case, "s": s, "threads": threads, "times_s": times, "best_s": min(times),
        "cpu_times_s": cpu_times, "best_cpu_s": min(cpu_times),
        "rss_before_run_mib": rss_before, "peak_rss_mib": memory["peak_rss_mib"],
        "ru_maxrss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "run_growth_mib": round(memory["peak_rss_mib"] - rss_before, 1),
        "ort_version": ort.__version__,
    }


def measure(case: str, s: int, threads: int, repeats: int, timeout: float) -> dict:
    cmd = [sys.executable, __file__, "--child", case, str(s), "--threads", str(threads), "--repeats", str(repeats)]
    load_before = os.getloadavg()
    try:
        env = common.child_env()
        env.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads would spin next to ORT's
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"case": case, "s": s, "error": f"timed out after {timeout:.0f} s"}
    if proc.returncode == -9:
        return {"case": case, "s": s, "error": "killed by SIGKILL (out of memory)"}
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"case": case, "s": s, "error": f"exit {proc.returncode}: {tail}"}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["loadavg_before"] = [round(x, 2) for x in load_before]
    result["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return result


def _mem_available_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2048, 8192, 16384])
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-scores-gb", type=float, default=6.0,
                        help="skip the unfused case where [1,16,S,S] float32 exceeds this (GB)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per case")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--child", nargs=2, metavar=("CASE", "S"), help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:
        print(json.dumps(run_child(args.child[0], int(args.child[1]), args.threads, args.repeats)))
        return 0

    machine = common.machine_info()
    machine["loadavg_start"] = [round(x, 2) for x in os.getloadavg()]
    print(f"{machine['cpu_model']}, {machine['nproc']} cores, {machine['memory_gib']} GiB, "
          f"loadavg {machine['loadavg_start']}, threads {args.threads}, best of {args.repeats}")
    results = []
    for s in args.sizes:
        for case in args.cases:
            # The peak of a smaller size of the same case, scaled by S² (its scores dominate): a
            # case that would not fit is skipped rather than OOM-killed on a shared machine.
            smaller = [r for r in results if r["case"] == case and "peak_rss_mib" in r]
            projected_gib = (smaller[-1]["peak_rss_mib"] / 1024 * (s / smaller[-1]["s"]) ** 2
                             if smaller and case != "otfuse" else 0.0)
            available_gib = _mem_available_gib()
            if case == "unfused" and scores_bytes(s) > args.max_scores_gb * 1e9:
                r = {"case": case, "s": s,
                     "skipped": f"[1,16,S,S] float32 scores = {scores_bytes(s) / 1e9:.1f} GB > {args.max_scores_gb} GB"}
            elif available_gib and projected_gib > 0.9 * available_gib:
                r = {"case": case, "s": s,
                     "skipped": f"needs ~{projected_gib:.0f} GiB (its S={smaller[-1]['s']} peak x S²), "
                                f"{available_gib:.0f} GiB available"}
            else:
                r = measure(case, s, args.threads, args.repeats, args.timeout)
            results.append(r)
            print(f"  S={s:<6} {case:<8} " + (
                f"{r['best_s'] * 1e3:10.1f} ms  (CPU {r['best_cpu_s']:.2f} s)  peak {r['peak_rss_mib']:8.1f} MiB  "
                f"(+{r['run_growth_mib']:.1f} MiB while running)  load {r['loadavg_before'][0]:.2f}"
                if "best_s" in r else r.get("skipped") or r.get("error")), flush=True)

    # Table and goals.
    by = {(r["case"], r["s"]): r for r in results}
    print()
    # "CPU vs GQA": the ratio of CPU seconds per run (both threads). Unlike wall time it does not
    # double when another process takes one of the two cores for a run; the goals use wall time.
    header = (f"{'S':>6} | {'unfused':>18} | {'ORT GQA':>18} | {'otfuse':>18} | {'vs unfused':>10} | {'vs GQA':>7}"
              f" | {'CPU vs GQA':>10}")
    print(header)
    print("-" * len(header))
    failures = []

    def cell(r):
        if r is None:
            return "-"
        if "best_s" in r:
            return f"{r['best_s']:.3f} s {r['peak_rss_mib'] / 1024:.2f} GiB"
        return "skipped" if "skipped" in r else "error"

    growth = {}
    for s in args.sizes:
        u, g, o = by.get(("unfused", s)), by.get(("ort_gqa", s)), by.get(("otfuse", s))
        vs_u = vs_g = cpu_g = "-"
        if o and "best_s" in o:
            growth[s] = o["run_growth_mib"]
            if u and "best_s" in u:
                ratio = u["best_s"] / o["best_s"]
                vs_u = f"{ratio:.1f}x"
                if ratio < 10:
                    failures.append(f"S={s}: otfuse is {ratio:.1f}x the unfused subgraph (goal >= 10x)")
            if g and "best_s" in g:
                ratio = g["best_s"] / o["best_s"]
                vs_g = f"{ratio:.2f}x"
                cpu_g = f"{g['best_cpu_s'] / o['best_cpu_s']:.2f}x"
                if ratio < 1.0:
                    failures.append(f"S={s}: otfuse is {ratio:.2f}x GroupQueryAttention (goal >= 1.0x)")
        elif o:
            failures.append(f"S={s}: otfuse did not run: {o.get('error')}")
        print(f"{s:>6} | {cell(u):>18} | {cell(g):>18} | {cell(o):>18} | {vs_u:>10} | {vs_g:>7} | {cpu_g:>10}")
    # O(S) memory: the working memory of a run (RSS growth) may grow at most ~linearly with S.
    sizes = sorted(growth)
    if len(sizes) >= 2:
        small, large = sizes[0], sizes[-1]
        allowed = max(growth[small], 1.0) * (large / small) * 1.5 + 64
        print(f"otfuse RSS growth while running: " + ", ".join(f"S={s}: {growth[s]:.0f} MiB" for s in sizes)
              + f" (linear bound at S={large}: {allowed:.0f} MiB)")
        if growth[large] > allowed:
            failures.append(f"otfuse working memory grows faster than O(S): {growth}")
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(f"loadavg at the end: {machine['loadavg_end']}")
    for f in failures:
        print("GOAL FAILED:", f)
    if args.json:
        Path(args.json).write_text(json.dumps({"machine": machine, "results": results, "failures": failures},
                                              indent=2) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
