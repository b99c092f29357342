"""norm_linear at one row (decode), W hot in the caches or cold: the same models as
bench/norm_linear_ab.py (--shape) or bench/norm_linear_models.py (--models-dir: a folder with
fused_with.onnx / fused_without.onnx), each session timed in two regimes in one process:

  hot   the session runs once untimed, then --hot runs back to back (median): W as the previous
        run left it in the caches (whole in L3 when the session's weights fit)
  cold  a --flush-mb buffer is read first (W evicted from L3), then one run: W from DRAM

    python bench/norm_linear_one_row.py --shape llama --variant custom= ort=,OTFUSE_NORM_LINEAR_GEMM=ort ep=,EP=1
    python bench/norm_linear_one_row.py --models-dir /work/nlmodels_work/gpt2 --variant custom= ep=,EP=1
    python bench/norm_linear_one_row.py --shape llama --variant custom= --profile    # per-node times (hot)

A variant is LABEL=LIBRARY[,KEY=VALUE...] as in bench/norm_linear_ab.py (EP=1: the plugin EP); a
LABEL starting with "dup" runs the unfused model again (the spread of the ratios).
Prints per regime and session the median time per run, the read rate of the weights (their bytes /
time) and the median over turns of unfused / variant (> 1: the variant is faster), beside
bench/stream_read.c's rate in the same run over a buffer the size of the weights (hot) and a
DRAM-sized one. With --profile: ORT's per-node times (hot runs) instead, summed by op type.
Not a test (bench/README.md, "norm_linear, session 16: one row").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import norm_linear as nl  # noqa: E402
import norm_linear_ab as ab  # noqa: E402

common.use_checkout()
import otfuse  # noqa: E402


def weight_bytes(path: Path) -> int:
    """Bytes of the model's 2-D float initializers (the projections' weights)."""
    model = onnx.load(str(path), load_external_data=False)
    return sum(int(np.prod(i.dims)) * 4 for i in model.graph.initializer
               if len(i.dims) == 2 and i.data_type == onnx.TensorProto.FLOAT and min(i.dims) >= 64)


def make_session(path: Path, threads: int, library: str, env: dict[str, str], ep: bool, profile: str = ""):
    # Without ORT's memory pattern: one-row runs of a fresh session plan no arena ahead.
    return ab.session(path, threads, library, env, ep, profile=profile, mem_pattern=False)


def node_times(profile_file: str, skip: int) -> dict[str, list[float]]:
    """Per node: its kernel times (us) of the runs after the first `skip`."""
    events = json.loads(Path(profile_file).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    start = runs[skip]["ts"] if len(runs) > skip else 0
    times: dict[str, list[float]] = {}
    for e in events:
        if e.get("cat") == "Node" and e.get("name", "").endswith("_kernel_time") and e["ts"] >= start:
            key = f"{e['args'].get('op_name', '?')}:{e['name'][:-len('_kernel_time')]}"
            times.setdefault(key, []).append(e["dur"])
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(ab.SHAPES), default="llama")
    parser.add_argument("--models-dir", type=Path, help="fused_with.onnx / fused_without.onnx (norm_linear_models.py)")
    parser.add_argument("--variant", nargs="+", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--turns", type=int, default=9)
    parser.add_argument("--hot", type=int, default=9, help="timed hot runs per session and turn")
    parser.add_argument("--flush-mb", type=int, default=700)
    parser.add_argument("--regimes", nargs="+", default=["hot", "cold"], choices=["hot", "cold"])
    parser.add_argument("--profile", action="store_true")
    args = parser.parse_args()
    library = otfuse.library_path()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        if args.models_dir:
            base, fused = args.models_dir / "fused_without.onnx", args.models_dir / "fused_with.onnx"
            vocab = 1000
            feeds = {"input_ids": np.random.default_rng(1).integers(0, vocab, (1, 1), dtype=np.int64),
                     "attention_mask": np.ones((1, 1), dtype=np.int64)}
            what = str(args.models_dir)
        else:
            ab.use_shape(args.shape)
            _, base, fused = ab.write_block_models(folder, np.float32)
            feeds = nl.feeds_for(1, np.float32)
            what = f"shape {args.shape} (hidden {nl.HIDDEN}, widths {nl.WIDTHS})"
        wbytes = weight_bytes(base)
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; CPU {common.cpu_identity()}; "
              f"{common.otfuse_isa_path(library)}; {what}; weights {wbytes / 1e6:.1f} MB; "
              f"loadavg {open('/proc/loadavg').read().split()[:3]}", flush=True)
        specs = [("unfused", library, {}, False)]
        for spec in args.variant:
            label, lib, env, ep = ab.parse_variant(spec)
            specs.append((label, lib or library, env, ep))
        profiles = folder / "prof"
        sessions = [make_session(base if label == "unfused" or label.startswith("dup") else fused, args.threads, lib, env, ep,
                                 str(profiles) + f"_{label}" if args.profile else "")
                    for label, lib, env, ep in specs]
        keys = sorted({key for _, _, env, _ in specs for key in env})

        def run(i):
            for key in keys:
                os.environ.pop(key, None)
            os.environ.update(specs[i][2])
            return sessions[i].run(None, feeds)

        reference = run(0)
        for i in range(1, len(specs)):
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(reference, run(i)))
            print(f"  {specs[i][0]}: providers {sessions[i].get_providers()[:1]}, max diff {diff:.2g}")
        if args.profile:
            for _ in range(args.turns):  # the sessions take turns, as in the timed regimes
                for i in range(len(specs)):
                    for _ in range(args.hot + 1):
                        run(i)
            for i, (label, *_rest) in enumerate(specs):
                times = node_times(sessions[i].end_profiling(), 1)
                by_op: dict[str, float] = {}
                for key, ts in times.items():
                    by_op[key.split(":")[0]] = by_op.get(key.split(":")[0], 0.0) + statistics.median(ts)
                total = sum(by_op.values())
                top = ", ".join(f"{op} {us:.0f}" for op, us in sorted(by_op.items(), key=lambda kv: -kv[1]))
                print(f"{label}: nodes {total:.0f} us/run | {top}")
                for key, ts in sorted(times.items(), key=lambda kv: -statistics.median(kv[1]))[:8]:
                    print(f"    {key} {statistics.median(ts):.0f} us (min {min(ts):.0f})")
            return
        flush = np.ones(args.flush_mb * 1_000_000 // 8, dtype=np.float64)
        stream = common.build_tool("stream_read")
        for regime in args.regimes:
            per = [[] for _ in specs]
            for _ in range(args.turns):
                for i in range(len(specs)):
                    if regime == "hot":
                        run(i)
                        times = []
                        for _ in range(args.hot):
                            t0 = time.perf_counter()
                            run(i)
                            times.append(time.perf_counter() - t0)
                        per[i].append(statistics.median(times))
                    else:
                        flush.sum()
                        t0 = time.perf_counter()
                        run(i)
                        per[i].append(time.perf_counter() - t0)
            mb = max(1, int(wbytes / 1e6)) if regime == "hot" else args.flush_mb
            ref = subprocess.run([str(stream), str(args.threads), str(mb), "20"], capture_output=True,
                                 text=True).stdout.strip() if stream else "n/a"
            line = f"{regime}: stream_read {ref} |"
            for i, (label, *_rest) in enumerate(specs):
                t = statistics.median(per[i])
                ratio = statistics.median(b / v for b, v in zip(per[0], per[i]))
                line += f" {label} {t * 1e3:.3f} ms {wbytes / t / 1e9:.1f} GB/s"
                line += " |" if i == 0 else f" {ratio:.3f}x |"
            print(line, flush=True)


if __name__ == "__main__":
    main()
