"""norm_linear on other architectures: random-weight HF models (2 layers, batch 1) fused with
every family and with every family but norm_linear, timed side by side in one process on both CPU
routes of the *NormLinear nodes (see bench/README.md, "norm_linear default, session 14: other
architectures" and "session 15: LM heads and fp16").

    python bench/norm_linear_models.py --models bert gpt2 qwen2 --tokens 1 16 128 512 2048
    python bench/norm_linear_models.py --models gpt2 qwen2 phi --lm-head [--dtype fp16]
    python bench/norm_linear_models.py --models gpt2 qwen2 --lm-head --memory   # peak RSS per route

Models (base models, no LM head, by default; vocabulary 1000, which only sizes the embedding table;
HF's random init plus N(0, 0.02) on every parameter, so that biases are not zero):
  bert   BERT-base: hidden 768, 12 heads, FFN 3072, post-LN LayerNorm, biases
  gpt2   GPT-2 small: hidden 768, 12 heads, FFN 3072, pre-LN LayerNorm, Conv1D weights
  qwen2  Qwen2-0.5B-like: hidden 896, 14 heads / 2 KV heads, FFN 4864, RMSNorm
  phi    Phi-2-like: one LayerNorm feeding parallel attention and MLP, 32 heads, rotary on 32
         of each head (as Phi-2), hidden --phi-hidden (2048; Phi-2 has 2560), FFN 4x

--lm-head exports the *ForCausalLM models instead (gpt2, qwen2, phi; output: the logits of every
position), so the final norm + vocabulary projection is one more norm_linear site; the vocabulary
is the model's own (GPT-2 50257, Qwen2 151936, Phi-2 51200) unless --vocab. GPT-2 and Qwen2 tie
lm_head to the embedding table (as GPT-2 and Qwen2-0.5B do): one [vocab, hidden] initializer read
by the Gather and, transposed, by the projection; Phi's lm_head is its own, with a bias (as Phi-2).
--dtype fp16 exports model.half() (every weight, activation and output float16). Each variant
gets its own folder under --workdir (e.g. gpt2_lm_fp16).

Each model is exported once (torch.onnx.export(dynamo=True), in the export venv: --export-python or
$OTFUSE_EXPORT_PYTHON) into --workdir and fused twice with otfuse.fuse: "with" (every family) and
"without" (every family but norm_linear). Sessions, in this order each turn: "dup" (the without
model again: its ratio is the first slot's bias plus the spread), "without", "ep" (the with model
on otfuse.InferenceSession: the plugin EP packs the projection weights once), "custom" (the with
model on plain onnxruntime with the custom-op library: weights read in place, except a
`shared_weight` one, packed once), and with
--custom-library "customB" (the same on another build of the library: an A/B in the same turns);
--rotate starts each turn with the next session, so that none always runs in the same slot. All sessions:
--threads intra-op threads, no spinning, no memory pattern (as otfuse.InferenceSession). Prints per
length the medians of per-turn without / variant ratios (above 1: the variant is faster) and the
max abs diff of each variant's output against "without", relative to the largest |output| ("rel";
"OVER" when above the dtype's tolerance, TOLERANCE). Not a test.

--memory instead: each of without (custom-op route), ep, custom and custom_in_place (custom
with OTFUSE_NORM_LINEAR_SHARED_PACK=0: a tied table read in place) in a fresh Python: the RSS
growth of creating the session and the peak RSS after one run of --memory-tokens tokens, beside
the bytes of the model's initializers, so that a weight held twice shows (the plugin EP packs W
and ORT frees the initializer only when no other node reads it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

common.use_checkout()

VOCAB = 1000  # base models' vocabulary; the input ids are drawn below it for every model
LM_VOCAB = {"gpt2": 50257, "qwen2": 151936, "phi": 51200}  # --lm-head: each model's own
TOLERANCE = {"fp32": 1e-4, "fp16": 1e-2}  # max |with - without| / max |without|, per --dtype
OPSET = 20
ALL_FAMILIES = ["norm", "norm_linear", "rope", "attention", "activation"]
MAX_LENGTH = {"bert": 512}  # BERT's position table; the decoders get 4096
DEFAULT_EXPORT_PYTHON = os.environ.get("OTFUSE_EXPORT_PYTHON") or next(
    (p for p in ("/work/venvs/export/bin/python", "/work/export-venv/bin/python") if Path(p).exists()),
    "/work/venvs/export/bin/python")


# --------------------------------------------------------------------------------------------
# export (runs in the export venv)


def _config(name: str, phi_hidden: int, lm_head: bool, vocab: int):
    """(model class, config): the base model, or with lm_head its *ForCausalLM (GPT-2 and Qwen2
    tied to the embedding table, as GPT-2 and Qwen2-0.5B; Phi's own lm_head with a bias, as Phi-2)."""
    import transformers

    if name == "bert":
        return transformers.BertModel, transformers.BertConfig(
            hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=2,
            vocab_size=vocab, max_position_embeddings=512)
    if name == "gpt2":
        return (transformers.GPT2LMHeadModel if lm_head else transformers.GPT2Model), transformers.GPT2Config(
            n_embd=768, n_head=12, n_layer=2, n_positions=4096, vocab_size=vocab, tie_word_embeddings=True)
    if name == "qwen2":
        return (transformers.Qwen2ForCausalLM if lm_head else transformers.Qwen2Model), transformers.Qwen2Config(
            hidden_size=896, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
            num_hidden_layers=2, vocab_size=vocab, max_position_embeddings=4096, tie_word_embeddings=True)
    if name == "phi":
        return (transformers.PhiForCausalLM if lm_head else transformers.PhiModel), transformers.PhiConfig(
            hidden_size=phi_hidden, num_attention_heads=32, intermediate_size=4 * phi_hidden,
            num_hidden_layers=2, vocab_size=vocab, max_position_embeddings=4096,
            partial_rotary_factor=32 / (phi_hidden // 32), tie_word_embeddings=False)
    raise SystemExit(f"unknown model {name}")


def _export(name: str, out: str, spec: dict) -> None:
    import torch

    model_class, config = _config(name, spec["phi_hidden"], spec["lm_head"], spec["vocab"])
    dtype = torch.float16 if spec["dtype"] == "fp16" else torch.float32
    torch.manual_seed(0)
    model = model_class._from_config(config, attn_implementation="sdpa", dtype=dtype).eval()
    with torch.no_grad():  # HF's init zeroes biases (and the exporter then shares or drops them): perturb all
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))

    class Hidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def forward(self, input_ids, attention_mask):
            out = self.model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, return_dict=True)
            return out.logits if spec["lm_head"] else out.last_hidden_state

    ids = torch.randint(0, VOCAB, (1, 16), generator=torch.Generator().manual_seed(1))
    mask = torch.ones(1, 16, dtype=torch.int64)
    dyn = ({1: "seq"}, {1: "seq"})
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.onnx.export(Hidden(model).eval(), (ids, mask), dynamo=True,
                                    input_names=["input_ids", "attention_mask"],
                                    output_names=["logits" if spec["lm_head"] else "hidden"],
                                    dynamic_shapes=dyn, opset_version=OPSET, optimize=True, verbose=False)
    program.save(out)
    tied = spec["lm_head"] and model.get_output_embeddings().weight is model.get_input_embeddings().weight
    print(json.dumps({"model": name, **spec, "parameters": sum(p.numel() for p in model.parameters()),
                      "tied_lm_head": tied, "export_seconds": round(time.perf_counter() - start, 1)}))


# --------------------------------------------------------------------------------------------
# preparation and timing (this venv)


def export_spec(args, name: str) -> dict:
    vocab = args.vocab or (LM_VOCAB[name] if args.lm_head else VOCAB)
    return {"phi_hidden": args.phi_hidden, "lm_head": args.lm_head, "vocab": vocab, "dtype": args.dtype}


def model_folder(args, name: str) -> Path:
    """One folder per variant: the base fp32 models keep session 14's names (gpt2, phi2048)."""
    spec = export_spec(args, name)
    folder = f"phi{args.phi_hidden}" if name == "phi" else name
    if args.lm_head:
        folder += "_lm" if spec["vocab"] == LM_VOCAB[name] else f"_lm{spec['vocab']}"
    elif spec["vocab"] != VOCAB:
        folder += f"_v{spec['vocab']}"
    return args.workdir / (folder + ("_fp16" if args.dtype == "fp16" else ""))


def prepare(args, name: str) -> tuple[Path, Path]:
    """The export and its two fused models, made once per workdir."""
    import otfuse

    if args.lm_head and name == "bert":
        raise SystemExit("--lm-head: gpt2, qwen2 or phi (bert has no causal LM head)")
    folder = model_folder(args, name)
    folder.mkdir(parents=True, exist_ok=True)
    export = folder / "export.onnx"
    if not export.exists():
        subprocess.run([args.export_python, __file__, "_export", name, str(export),
                        json.dumps(export_spec(args, name))], check=True)
    name = folder.name
    paths = {}
    for variant, only in (("with", ALL_FAMILIES), ("without", [f for f in ALL_FAMILIES if f != "norm_linear"])):
        paths[variant] = folder / f"fused_{variant}.onnx"
        if not paths[variant].exists():
            report = otfuse.fuse(export, paths[variant], only=only)
            (folder / f"fused_{variant}.json").write_text(json.dumps(report.fusions))
        print(f"{name} {variant}: {json.loads((folder / f'fused_{variant}.json').read_text())}", flush=True)
    return paths["with"], paths["without"]


def norm_linear_shapes(path: Path) -> list[str]:
    """Each *NormLinear node as 'Op K=.. N=[..]' (K: its weights' shared dimension)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    dims = {init.name: list(init.dims) for init in model.graph.initializer}
    shapes = []
    for node in model.graph.node:
        if not node.op_type.endswith("NormLinear"):
            continue
        widths = next(list(a.ints) for a in node.attribute if a.name == "out_features")
        flags = next((list(a.ints) for a in node.attribute if a.name == "transposed"), [0] * len(widths))
        shared = next((list(a.ints) for a in node.attribute if a.name == "shared_weight"), [0] * len(widths))
        weights = [dims[n] for n in node.input if len(dims.get(n, [])) == 2][-len(widths):]
        k = {w[1] if t else w[0] for w, t in zip(weights, flags)}
        shapes.append(f"{node.op_type} K={'/'.join(map(str, sorted(k)))} N={widths} T={flags} shared={shared}")
    return shapes


def session(path: Path, threads: int, route: str, profile: str = "", library: str = ""):
    import onnxruntime as ort

    import otfuse

    options = ort.SessionOptions()
    if profile:
        options.enable_profiling = True
        options.profile_file_prefix = profile
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.enable_mem_pattern = False
    if route == "custom":
        options.register_custom_ops_library(library or otfuse.library_path())
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return otfuse.InferenceSession(str(path), options)


def feeds_for(m: int) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(m).integers(0, VOCAB, (1, m), dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones((1, m), dtype=np.int64)}


def measure(args, name: str) -> None:
    with_path, without_path = prepare(args, name)
    model, name = name, with_path.parent.name  # lines name the variant (gpt2_lm_fp16)
    for shape in norm_linear_shapes(with_path):
        print(f"  {name} node: {shape}")
    labels = ["dup", "without", "ep", "custom"]
    sessions = [session(without_path, args.threads, "custom"), session(without_path, args.threads, "custom"),
                session(with_path, args.threads, "ep"), session(with_path, args.threads, "custom")]
    if args.custom_library:  # the custom-op route on another build of the library, in the same turns
        labels.append("customB")
        sessions.append(session(with_path, args.threads, "custom", library=args.custom_library))
    print(f"  {name} providers: ep {sessions[2].get_providers()}, custom {sessions[3].get_providers()}", flush=True)
    for m in args.tokens:
        if m > MAX_LENGTH.get(model, 4096):
            continue
        feeds = feeds_for(m)
        outputs = [s.run(None, feeds)[0] for s in sessions]
        start = time.perf_counter()
        sessions[1].run(None, feeds)
        repeat = max(1, min(50, int(args.min_ms * 1e-3 / max(time.perf_counter() - start, 1e-6))))
        runs = [(lambda s=s: [s.run(None, feeds) for _ in range(repeat)]) for s in sessions]
        times = common.side_by_side(runs, args.runs, args.turns, rotate=args.rotate)
        base = times[1]
        line = (f"{name} M={m}: without {base['median'] / repeat * 1e3:.2f} ms (x{repeat}), "
                f"clean {base['clean']}/{base['turns']}, others {max(t['others'] for t in times):.2f} cores |")
        scale = float(np.max(np.abs(outputs[1].astype(np.float32))))
        for label, t, out in zip(labels, times, outputs):
            if label == "without":
                continue
            diff = float(np.max(np.abs(out.astype(np.float32) - outputs[1].astype(np.float32))))
            flag = " OVER" if diff > TOLERANCE[args.dtype] * scale else ""
            line += f" {label} {common.paired_ratio(base, t):.3f}x (diff {diff:.2g}, rel {diff / scale:.1g}{flag}) |"
        print(line, flush=True)


def node_times(profile_file: str, runs: int) -> dict[str, float]:
    """Milliseconds per run by op type and output widths ('Gemm->2304': ORT's per-node kernel
    times, the warm-up run dropped)."""
    events = [e for e in json.loads(Path(profile_file).read_text())
              if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    per_run = len(events) // (runs + 1)
    totals: dict[str, float] = {}
    for e in events[per_run:]:
        widths = "/".join(str(next(iter(o.values()))[-1]) for o in e["args"].get("output_type_shape", [])
                          if next(iter(o.values())))
        key = f"{e['args']['op_name']}->{widths}"
        totals[key] = totals.get(key, 0.0) + e["dur"] / 1e3 / runs
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def profile(args, name: str) -> None:
    """Per op type time of each session (one at a time: a rough split, not an A/B)."""
    with_path, without_path = prepare(args, name)
    prefix = args.workdir / "profiles" / with_path.parent.name
    prefix.mkdir(parents=True, exist_ok=True)
    for m in args.tokens:
        if m > MAX_LENGTH.get(name, 4096):
            continue
        feeds = feeds_for(m)
        for label, path, route in (("without", without_path, "custom"), ("ep", with_path, "ep"),
                                   ("custom", with_path, "custom")):
            s = session(path, args.threads, route, str(prefix / f"{label}_{m}"))
            for _ in range(args.runs + 1):
                s.run(None, feeds)
            times = node_times(s.end_profiling(), args.runs)
            top = ", ".join(f"{op} {ms:.3f}" for op, ms in list(times.items())[:8])
            print(f"{name} M={m} {label}: total {sum(times.values()):.3f} ms | {top}", flush=True)


def weight_bytes(path: Path) -> dict[str, float]:
    """MiB of the model's initializers, and of the largest one (the LM head's, if any), and
    whether a Gather reads that one too (a tied embedding)."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    sizes = {i.name: int(np.prod(i.dims)) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(i.data_type)).itemsize
             for i in model.graph.initializer}
    largest = max(sizes, key=sizes.get)
    gathered = any(n.op_type == "Gather" and n.input[0] == largest for n in model.graph.node)
    return {"initializers_mib": round(sum(sizes.values()) / 2**20, 1),
            "largest_mib": round(sizes[largest] / 2**20, 1), "largest_gathered": gathered}


def _memory_probe(path: str, route: str, threads: int, m: int) -> None:
    """(In a fresh Python) RSS growth of creating the session, and peak RSS after one run, MiB."""
    import onnxruntime  # noqa: F401  (its import is not the session's memory)

    import otfuse  # noqa: F401

    before = common.proc_memory_mib()["rss_mib"]
    s = session(Path(path), threads, route)
    created = common.proc_memory_mib()["rss_mib"]
    s.run(None, feeds_for(m))
    memory = common.proc_memory_mib()
    print(json.dumps({"created_mib": round(created - before, 1), "after_run_mib": round(memory["rss_mib"] - before, 1),
                      "peak_rss_mib": memory["peak_rss_mib"], "baseline_mib": before,
                      "providers": s.get_providers()}))


def memory(args, name: str) -> None:
    """Each route's session in its own process: does the fused model hold a weight twice?"""
    with_path, without_path = prepare(args, name)
    label = with_path.parent.name
    print(f"{label} initializers: {weight_bytes(with_path)} (with), {weight_bytes(without_path)} (without)", flush=True)
    for shape in norm_linear_shapes(with_path):
        print(f"  {label} node: {shape}")
    # custom_in_place: a shared_weight W_i read in place (not packed once at session creation)
    for variant, path, route, knob in (("without", without_path, "custom", "1"), ("ep", with_path, "ep", "1"),
                                       ("custom", with_path, "custom", "1"),
                                       ("custom_in_place", with_path, "custom", "0")):
        env = {**common.child_env(), "OTFUSE_NORM_LINEAR_SHARED_PACK": knob}
        result = subprocess.run([sys.executable, __file__, "_memory", str(path), route, str(args.threads),
                                 str(args.memory_tokens)], capture_output=True, text=True, env=env)
        line = result.stdout.strip().splitlines()[-1] if result.returncode == 0 else result.stderr.strip()[-400:]
        print(f"{label} M={args.memory_tokens} {variant}: {line}", flush=True)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_export":
        _export(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_memory":
        _memory_probe(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert", "gpt2", "qwen2"],
                        choices=["bert", "gpt2", "qwen2", "phi"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[1, 16, 128, 512, 2048])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=7, help="clean turns wanted")
    parser.add_argument("--turns", type=int, default=9, help="turns at most")
    parser.add_argument("--min-ms", type=float, default=30.0, help="small lengths: repeat runs to about this long")
    parser.add_argument("--phi-hidden", type=int, default=2048)
    parser.add_argument("--lm-head", action="store_true",
                        help="the *ForCausalLM models (gpt2, qwen2, phi): the final norm + vocabulary projection too")
    parser.add_argument("--vocab", type=int, default=0, help="vocabulary (default: 1000, with --lm-head the model's own)")
    parser.add_argument("--dtype", choices=sorted(TOLERANCE), default="fp32", help="fp16: the model exported half")
    parser.add_argument("--memory", action="store_true",
                        help="instead of the A/B: each route's session memory in a fresh process")
    parser.add_argument("--memory-tokens", type=int, default=16)
    parser.add_argument("--workdir", type=Path, default=Path("/work/nlmodels_work"))
    parser.add_argument("--export-python", default=DEFAULT_EXPORT_PYTHON)
    parser.add_argument("--rotate", action="store_true",
                        help="each turn starts with the next session (no session always in the same slot)")
    parser.add_argument("--custom-library", default="",
                        help="also time the custom-op route on this library build (customB; e.g. main's, for an A/B)")
    parser.add_argument("--prepare-only", action="store_true", help="export and fuse, no timing")
    parser.add_argument("--profile", action="store_true",
                        help="instead of the A/B: ORT's per-op-type times of each session, --runs runs")
    args = parser.parse_args()
    import otfuse

    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU {common.cpu_identity()}; "
          f"loadavg {open('/proc/loadavg').read().split()[:3]}; library {otfuse.library_path()}; "
          f"threads {args.threads}; otfuse ISA {common.otfuse_isa_path()}; dtype {args.dtype}; "
          f"lm_head {args.lm_head}", flush=True)
    for name in args.models:
        if args.prepare_only:
            prepare(args, name)
        elif args.profile:
            profile(args, name)
        elif args.memory:
            memory(args, name)
        else:
            measure(args, name)


if __name__ == "__main__":
    main()
