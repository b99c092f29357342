"""Norm + Linear A/B: the unfused block against fused sessions that differ in the library they load,
the environment their runs see, or the layout of the projection weights, side by side in one process
(bench/norm_linear.py's block, sessions and turns; see bench/README.md, "Norm + Linear"); --shape llama
takes issue 12's e2e model's widths instead (hidden 2048: one q/k/v node of 2048 + 512 + 512 columns).

    python bench/norm_linear_ab.py --dtype fp32 --tokens 512 2048 \
        --variant main=/tmp/main.so new= newT=,T=1 knob=,OTFUSE_GEMM_ISA=avx2

A variant is LABEL=LIBRARY[,KEY=VALUE...]: LIBRARY empty for OTFUSE_LIBRARY (the unfused session
always loads that one, for its norm kernels); T=1 stores every projection weight [N, K] (the
contract's `transposed = 1`, as an exporter's Gemm(transB = 1) would), T=0 every one [K, N] (as a
MatMul export has them), in that session's model; without T the session gets the layout the fusion
chose. EP=1 runs the *NormLinear nodes on the library's plugin EP (weights packed once,
kernels/cpu/norm_linear_ep.cc; ORT >= 1.24), the rest on the CPU EP. Any other KEY=VALUE is set in the environment before each of that session's runs (and unset
for the others'), so knobs read per call can be compared too. Knobs read when a kernel is created
(such as OTFUSE_GEMM_ISA) are set around the session's creation as well. Prints per M the unfused
time and, per variant, the median of per-turn unfused / variant ratios in wall and CPU time. Not a test.
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
import onnxruntime as ort
from onnx import numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
import norm_linear as nl  # noqa: E402

common.use_checkout()
import otfuse  # noqa: E402
import otfuse.run.session  # noqa: E402


# Block shapes (hidden, q, kv, ffn): the bench block's, and bench/e2e_llama.py's model (issue 12's).
# h768 / qwen2 / phi: the widths of bench/norm_linear_models.py's BERT / GPT-2 (hidden 768), Qwen2-0.5B-like
# and Phi-like (hidden 2048) models (as this block's q/k/v and gate/up nodes).
SHAPES = {"block": (nl.HIDDEN, nl.Q, nl.KV, nl.FFN), "llama": (2048, 2048, 512, 5632), "h768": (768, 768, 768, 3072),
          "qwen2": (896, 896, 128, 4864), "phi": (2048, 2048, 2048, 8192)}


_EP_LIBRARY: list[str] = []  # the library whose plugin EP this process registered


def add_plugin_ep(options: ort.SessionOptions, library: str) -> None:
    """The library's plugin EP (kernels/cpu/norm_linear_ep.cc) in front of the CPU EP (one library per
    process: every EP session runs the first library's kernels, so two EP variants of different
    libraries in one process would compare a library with itself; bench/README.md, "norm_linear at
    512 rows, session 20")."""
    if _EP_LIBRARY and os.path.realpath(_EP_LIBRARY[0]) != os.path.realpath(library):
        raise SystemExit(f"plugin EP of {library}: this process runs {_EP_LIBRARY[0]}'s (one per process)")
    if not any(d.ep_name == otfuse.run.session.EP_NAME for d in ort.get_ep_devices()):
        ort.register_execution_provider_library("otfuse_ab", library)
        _EP_LIBRARY.append(library)
    devices = [d for d in ort.get_ep_devices() if d.ep_name == otfuse.run.session.EP_NAME]
    options.add_provider_for_devices(devices, {})


def session(path: Path, threads: int, library: str, env: dict[str, str], ep: bool = False, profile: str = "",
            mem_pattern: bool = True) -> ort.InferenceSession:
    """A session of `path` with `library` (and its plugin EP when `ep`), created under the knobs in
    `env` (restored afterwards: a kernel reads them when it is created); `profile` turns on ORT's
    profiler with that file prefix."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_mem_pattern = mem_pattern
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    options.register_custom_ops_library(library)
    if ep:
        add_plugin_ep(options, library)
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        if ep:
            return ort.InferenceSession(str(path), options)
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def parse_variant(spec: str) -> tuple[str, str, dict[str, str], bool]:
    """LABEL=LIBRARY[,EP=1][,KEY=VALUE...] -> (label, library ("": the default one), the knobs to
    set around that session, whether the plugin EP runs it): every A/B bench's --variant."""
    label, rest = spec.split("=", 1)
    library, *pairs = rest.split(",")
    env = dict(pair.split("=", 1) for pair in pairs)
    return label, library, env, env.pop("EP", "0") == "1"


def env_runner(keys: list[str], repeat: int):
    """runner(session, env, feeds) -> a callable running the session `repeat` times under `env`
    (every other variant's knob in `keys` cleared first), returning the last outputs."""
    def runner(s, env, feeds):
        def run():
            for key in keys:
                os.environ.pop(key, None)
            os.environ.update(env)
            for _ in range(repeat - 1):
                s.run(None, feeds)
            return s.run(None, feeds)
        return run
    return runner


def layout_copy(fused: Path, out: Path, transposed: bool) -> None:
    """The fused model with every *NormLinear weight stored [N, K] (`transposed` = 1) or [K, N] (0)."""
    model = onnx.load(fused)
    inits = {init.name: init for init in model.graph.initializer}
    for node in model.graph.node:
        if not node.op_type.endswith("NormLinear"):
            continue
        widths = next(list(a.ints) for a in node.attribute if a.name == "out_features")
        weights = [name for name in node.input if name in inits and len(inits[name].dims) == 2][-len(widths):]
        flags = next((a for a in node.attribute if a.name == "transposed"), None)
        if flags is None:
            flags = onnx.helper.make_attribute("transposed", [0] * len(widths))
            node.attribute.append(flags)
        for i, name in enumerate(weights):
            if flags.ints[i] != int(transposed):
                array = numpy_helper.to_array(inits[name])
                inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(array.T), name))
        flags.ints[:] = [int(transposed)] * len(widths)
    onnx.save(model, out)


def use_shape(name: str) -> None:
    """Point bench/norm_linear.py's block at one of SHAPES."""
    nl.HIDDEN, nl.Q, nl.KV, nl.FFN = SHAPES[name]
    nl.WIDTHS = (nl.Q, nl.KV, nl.KV, nl.FFN, nl.FFN)


def write_block_models(folder: Path, dtype) -> tuple[Path, Path, Path]:
    """The block in `folder`: as exported, with its norms fused (the unfused baseline: MatMuls on
    ORT's CPU EP) and with norm_linear too."""
    src, base, fused = (folder / f"{n}.onnx" for n in ("block", "base", "fused"))
    onnx.save(nl.block_model(dtype), src)
    otfuse.fuse(src, base, only=["norm"])
    otfuse.fuse(src, fused, only=["norm", "norm_linear"])
    return src, base, fused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[512])
    parser.add_argument("--variant", nargs="+", required=True,
                        help="LABEL=LIBRARY[,KEY=VALUE...] (T=1: weights [N, K], T=0: [K, N])")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=7, help="clean turns wanted")
    parser.add_argument("--turns", type=int, default=9, help="turns at most")
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each session per turn (small M: CPU times long enough to compare)")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="block",
                        help="block: bench/norm_linear.py's (hidden 4096); llama: issue 12's e2e model (hidden 2048, "
                             "q/k/v 2048 + 512 + 512, gate/up 5632)")
    args = parser.parse_args()
    use_shape(args.shape)
    dtype = np.float32 if args.dtype == "fp32" else np.float16
    default_library = otfuse.library_path()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU {common.cpu_identity()}; "
          f"loadavg {open('/proc/loadavg').read().split()[:3]}; shape {args.shape} (hidden {nl.HIDDEN}, widths {nl.WIDTHS})",
          flush=True)
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        src, base, fused = write_block_models(folder, dtype)
        sessions = [("unfused", session(base, args.threads, default_library, {}), {})]
        for spec in args.variant:
            label, library, env, ep = parse_variant(spec)
            layout = env.pop("T", None)
            path = fused if layout is None else folder / f"fused_t{layout}.onnx"
            if not path.exists():
                layout_copy(fused, path, layout == "1")
            sessions.append((label, session(path, args.threads, library or default_library, env, ep), env))
        keys = sorted({key for _, _, env in sessions for key in env})
        runner = env_runner(keys, args.repeat)

        for m in args.tokens:
            feeds = nl.feeds_for(m, dtype)
            runs = [runner(s, env, feeds) for _, s, env in sessions]
            reference = runs[0]()
            diffs = [max(float(np.max(np.abs(a.astype(np.float32) - b.astype(np.float32))))
                         for a, b in zip(reference, run())) for run in runs[1:]]
            times = common.side_by_side(runs, args.runs, args.turns)
            base_t = times[0]
            line = (f"{args.dtype} M={m}: unfused {base_t['median'] * 1e3:.1f} ms, clean {base_t['clean']}/{base_t['turns']}, "
                    f"others {max(t['others'] for t in times):.2f} cores |")
            for (label, _, _), t, diff in zip(sessions[1:], times[1:], diffs):
                line += (f" {label} {t['median'] * 1e3:.1f} ms {common.paired_ratio(base_t, t):.3f}x "
                         f"(cpu {common.paired_ratio(base_t, t, 'cpus'):.3f}x, diff {diff:.2g}) |")
            print(line, flush=True)
    for key in keys:
        os.environ.pop(key, None)


if __name__ == "__main__":
    main()
