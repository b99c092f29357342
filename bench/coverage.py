#!/usr/bin/env python
"""Coverage: what fraction of the RoPE, attention, norm and residual-norm sites of a folder of
exported models otfuse fuses, next to OpenVINO's CPU plugin on the same models.

    python bench/coverage.py /work/corpus                        # every model with a sidecar .json
    python bench/coverage.py models/fixtures/matrix              # the committed matrix (manifest.json)
    python bench/coverage.py /work/corpus --only llama/ --json coverage.json --no-openvino
    python bench/coverage.py DIR --otfuse /path/to/venv/bin/otfuse   # an installed otfuse instead

The expected sites come from each model's sidecar (`expected`, counted on the torch model by
models/sites.py). otfuse runs as its CLI (`otfuse MODEL -o OUT --report R`): by default this
checkout's CLI inside this process (no interpreter start per model), or the `--otfuse` executable,
one process per model. Fused sites are read from the
report: attention = Attention + RopeAttention; rope = RopeAttention + RotaryEmbeddingQK +
RotaryEmbedding / 2; norm = every norm op (residual or not, with or without the Linear);
residual_norm = AddRMSNorm + AddLayerNorm (+ their Linear forms). Every near miss and every
internal error (exit 3) is collected and grouped; the sites a model misses are charged to the
near-miss classes of the family that missed them (split evenly), or to "no near miss reported".

OpenVINO: `compile_model(read_model(MODEL), "CPU", {INFERENCE_PRECISION_HINT: f32})`, and its
fused nodes counted in `get_runtime_model()` by layerType: RoPE (one per rotated tensor: 2 per
site), ScaledDotProductAttention / ScaledAttn / SDPA and Snippets `Subgraph`s holding a Softmax
(its tokenised MHA), RMS, MVN (its LayerNorm). It has no fused
residual norm, so that column is otfuse's alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import machine_info, use_checkout  # noqa: E402

KINDS = ("rope", "attention", "norm", "residual_norm")
FAMILY_OF_KIND = {"rope": ("rope", "attention"), "attention": ("attention",), "norm": ("norm",),
                  "residual_norm": ("norm",)}
NORM_OPS = ("RMSNorm", "AddRMSNorm", "LayerNorm", "AddLayerNorm")
OV_KINDS = {"rope": ("RoPE",), "attention": ("ScaledDotProductAttention", "ScaledAttn", "SDPA", "MHA"),
            "norm": ("RMS", "MVN", "LayerNorm", "RMSNorm")}
OTFUSE_TIMEOUT = 300


@dataclass
class Result:
    name: str
    expected: dict[str, int]
    fused: dict[str, int] = field(default_factory=dict)
    ov: dict[str, int] | None = None
    ov_error: str | None = None
    error: str | None = None  # exit 3 (internal error) or another failure of the otfuse run
    near_misses: list[dict] = field(default_factory=list)
    costs: dict[str, float] = field(default_factory=dict)  # failure class -> sites missed


def fused_sites(fusions: dict[str, int]) -> dict[str, int]:
    get = fusions.get
    norms = sum(get(op, 0) + get(f"{op}Linear", 0) for op in NORM_OPS)
    residual = sum(get(op, 0) + get(f"{op}Linear", 0) for op in ("AddRMSNorm", "AddLayerNorm"))
    return {
        "rope": get("RopeAttention", 0) + get("RotaryEmbeddingQK", 0) + get("RotaryEmbedding", 0) // 2,
        "attention": get("Attention", 0) + get("RopeAttention", 0),
        "norm": norms,
        "residual_norm": residual,
    }


def find_models(folder: Path) -> list[tuple[str, Path, dict]]:
    """(name, model path, expected) from the sidecars, or from a manifest listing them."""
    manifest = folder / "manifest.json"
    found = []
    if manifest.exists():
        entries = json.loads(manifest.read_text()).get("models", {})
        for name, entry in entries.items():
            path = folder / entry["file"]
            if path.exists():
                found.append((name, path, entry["expected"]))
        if found:
            return found
    for sidecar in sorted(folder.rglob("*.json")):
        model = sidecar.with_suffix(".onnx")
        if model.exists():
            entry = json.loads(sidecar.read_text())
            if "expected" in entry:
                found.append((str(model.relative_to(folder).with_suffix("")), model, entry["expected"]))
    return found


def materialise(model: Path, folder: Path) -> Path:
    """A runnable copy of a packed matrix model (models/matrix_pack.py): `<variant>.onnx.gz` is
    unpacked into `folder` with its family's `weights.bin` beside it. Plain .onnx: returned as is."""
    if model.suffix != ".gz":
        return model
    target = folder / model.name.removesuffix(".gz")
    target.write_bytes(gzip.decompress(model.read_bytes()))
    shutil.copyfile(model.parent / "weights.bin", folder / "weights.bin")
    return target


def cli_in_process(args: list[str]) -> tuple[int, str]:
    """This checkout's `otfuse` CLI in this process (no interpreter start per model): exit code, stderr."""
    import contextlib
    import io

    use_checkout()
    from otfuse.cli import main as otfuse_main

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            otfuse_main(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
    return code, err.getvalue()


def print_table(header: list[str], rows: list[list[str]]) -> None:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    for i, row in enumerate([header, *rows]):
        print("  ".join(f"{str(c):<{w}}" if j == 0 else f"{str(c):>{w}}" for j, (c, w) in enumerate(zip(row, widths))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


def run_otfuse(command: str | None, model: Path, result: Result, workdir: Path) -> None:
    """`otfuse MODEL -o OUT --report R`: the given executable, or this checkout's CLI in process."""
    report = workdir / "report.json"
    report.unlink(missing_ok=True)
    args = [str(model), "-o", str(workdir / "fused.onnx"), "--report", str(report)]
    if command is None:
        returncode, stderr = cli_in_process(args)
    else:
        try:
            done = subprocess.run([command, *args], capture_output=True, text=True, timeout=OTFUSE_TIMEOUT)
        except subprocess.TimeoutExpired:
            result.error = f"timeout: otfuse ran over {OTFUSE_TIMEOUT} s"
            return
        returncode, stderr = done.returncode, done.stderr
    stderr = " ".join(stderr.split())
    if returncode == 3:
        result.error = stderr.removeprefix("otfuse: ").split(" (run with OTFUSE_DEBUG")[0]
    elif report.exists():
        data = json.loads(report.read_text())
        result.fused = fused_sites(data.get("fusions", {}))
        result.near_misses = data.get("near_misses", [])
    elif returncode != 0:
        result.error = f"exit {returncode}: {stderr[:300]}"


def ov_layer_kind(rt_info) -> str:
    """The runtime node's layerType; a Snippets `Subgraph` that swallowed a Softmax is the CPU
    plugin's tokenised MHA (what it makes of an SDPA it does not run as ScaledAttn): `MHA`."""
    kind = rt_info["layerType"].astype(str)
    if kind == "Subgraph" and "originalLayersNames" in rt_info.keys():
        if "Softmax" in rt_info["originalLayersNames"].astype(str):
            return "MHA"
    return kind


def run_openvino(model: Path, result: Result) -> None:
    try:
        import openvino as ov
    except ImportError:
        result.ov_error = "openvino is not installed"
        return
    try:
        core = ov.Core()
        compiled = core.compile_model(core.read_model(str(model)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
        types = Counter(ov_layer_kind(op.get_rt_info()) for op in compiled.get_runtime_model().get_ops())
    except Exception as exc:  # a model OpenVINO cannot read or compile: its failure, reported
        result.ov_error = f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
        return
    result.ov = {kind: sum(types[t] for t in names) for kind, names in OV_KINDS.items()}
    result.ov["rope"] //= 2  # one RoPE node per rotated tensor


_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")
_NODE = re.compile(r"\((?:/|node_|val_)[^()]*\)")  # "(/model/.../Add_1)": a node named in passing
_NUMBER = re.compile(r"(?<![\w.])-?\d+(\.\d+)?(e-?\d+)?")


def failure_class(text: str) -> str:
    """Near misses that differ only in tensor names and numbers are one class."""
    return _NUMBER.sub("N", _NODE.sub("(…)", _QUOTED.sub("'…'", text))).strip()


def charge(result: Result) -> None:
    """Charge each missed site to the failure classes that explain it."""
    result.costs = {}
    if result.error:
        result.costs[f"internal error: {failure_class(result.error)}"] = float(sum(result.expected[k] for k in KINDS))
        return
    for kind in KINDS:
        missed = max(0, result.expected[kind] - min(result.fused.get(kind, 0), result.expected[kind]))
        if not missed:
            continue
        families = FAMILY_OF_KIND[kind]
        reasons = sorted({f"[{m.get('family')}] {m.get('pattern')}: {failure_class(str(m.get('reason')))}"
                          for m in result.near_misses if m.get("family") in families})
        if kind == "residual_norm" and result.fused.get("norm", 0) >= result.expected["norm"]:
            reasons = [r for r in reasons if "Add" in r] or reasons  # plain norm fused, the Add was not
        if not reasons:
            reasons = [f"[{kind}] no near miss reported"]
        for reason in reasons:
            result.costs[reason] = result.costs.get(reason, 0.0) + missed / len(reasons)
    for kind in KINDS:
        if result.fused.get(kind, 0) > result.expected[kind]:
            key = f"[{kind}] more sites fused than the model has ({result.fused[kind]} > {result.expected[kind]})"
            result.costs[failure_class(key)] = 0.0


def pct(num: int, den: int) -> str:
    return f"{100.0 * num / den:.0f}%" if den else "-"


def summarise(results: list[Result], show_models: bool) -> dict:
    totals = {k: [0, 0, 0, 0] for k in KINDS}  # expected, otfuse, ov expected (ov ran), ov fused
    rows = []
    for r in results:
        cells = [r.name]
        for kind in KINDS:
            exp = r.expected[kind]
            got = min(r.fused.get(kind, 0), exp)
            totals[kind][0] += exp
            totals[kind][1] += got
            ov = None
            if r.ov is not None and kind in OV_KINDS:
                ov = min(r.ov[kind], exp)
                totals[kind][2] += exp
                totals[kind][3] += ov
            cells.append(f"{got}/{exp}" + (f" ({ov})" if ov is not None else ""))
        cells.append("ERROR" if r.error else "")
        rows.append(cells)
    header = ["model", *[f"{k} otfuse (ov)" for k in KINDS], ""]
    if show_models:
        print_table(header, rows)
    summary = [[kind, str(t[0]), pct(t[1], t[0]), pct(t[3], t[2]) if kind in OV_KINDS else "n/a"]
               for kind, t in totals.items()]
    print()
    print_table(["site kind", "sites", "otfuse fused", "OpenVINO fused"], summary)
    return {kind: {"sites": t[0], "otfuse": t[1], "openvino_sites": t[2], "openvino": t[3]}
            for kind, t in totals.items()}


def group_failures(results: list[Result], limit: int) -> list[dict]:
    groups: dict[str, dict] = defaultdict(lambda: {"sites": 0.0, "models": 0, "example": None, "text": None})
    texts = {}
    for r in results:
        for m in r.near_misses:
            texts.setdefault(f"[{m.get('family')}] {m.get('pattern')}: {failure_class(str(m.get('reason')))}",
                             (str(m.get("reason")), r.name))
        if r.error:
            texts.setdefault(f"internal error: {failure_class(r.error)}", (r.error, r.name))
        for cls, sites in r.costs.items():
            g = groups[cls]
            g["sites"] += sites
            g["models"] += 1
            g["example"] = g["example"] or r.name
    out = []
    for cls, g in sorted(groups.items(), key=lambda kv: (-kv[1]["sites"], kv[0])):
        text, example = texts.get(cls, (cls, g["example"]))
        out.append({"class": cls, "sites": round(g["sites"], 1), "models": g["models"], "example_model": example,
                    "example_text": text})
    print(f"\nFailure classes by sites missed (top {limit}; near misses charged to the family that missed):")
    for item in out[:limit]:
        print(f"  {item['sites']:6.1f} sites, {item['models']:3d} models  {item['class']}")
        print(f"         e.g. {item['example_model']}: {item['example_text'][:400]}")
    ov_errors = Counter(failure_class(r.ov_error) for r in results if r.ov_error)
    if ov_errors:
        print("\nOpenVINO could not compile:")
        for text, n in ov_errors.most_common(limit):
            print(f"  {n:3d} models  {text}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path)
    parser.add_argument("--only", nargs="+", metavar="TEXT", help="models whose name contains one of these")
    parser.add_argument("--otfuse", help="an otfuse executable, run per model (default: this checkout's CLI in process)")
    parser.add_argument("--no-openvino", action="store_true", help="skip the OpenVINO peer")
    parser.add_argument("--json", type=Path, help="write every result as JSON")
    parser.add_argument("--top", type=int, default=25, help="failure classes to list")
    parser.add_argument("--quiet", action="store_true", help="totals only, no per-model table")
    parser.add_argument("--cache", type=Path, help="keep results here (JSON) and reuse those of unchanged models "
                        "(same path, size and mtime): a grown corpus costs only its new models")
    parser.add_argument("--cached-only", action="store_true", help="report the models in --cache only (merge "
                        "the caches of several runs over parts of a folder, then print their totals)")
    opts = parser.parse_args(argv)
    if not opts.folder.is_dir():
        print(f"coverage: error: {opts.folder} is not a folder", file=sys.stderr)
        return 2
    models = [m for m in find_models(opts.folder) if not opts.only or any(t in m[0] for t in opts.only)]
    if not models:
        print(f"coverage: error: no model with expected sites under {opts.folder}", file=sys.stderr)
        return 2
    facts = machine_info()
    print(f"{facts['date']}, CPU {facts['cpu_model']}, nproc {facts['nproc']}, Python {facts['python']}")
    cache = json.loads(opts.cache.read_text()) if opts.cache and opts.cache.exists() else {}
    results = []
    for i, (name, path, expected) in enumerate(models, 1):
        stamp = f"{path.stat().st_size}:{path.stat().st_mtime_ns}:{opts.no_openvino}"
        if cache.get(name, {}).get("stamp") == stamp:
            results.append(Result(**{k: v for k, v in cache[name].items() if k != "stamp"}))
            charge(results[-1])  # the classes as this version of the bench groups them
            continue
        if opts.cached_only:
            continue
        print(f"[{i}/{len(models)}] {name}", file=sys.stderr, flush=True)
        result = Result(name, {k: int(expected.get(k, 0)) for k in KINDS})
        # A folder per model: the matrix's variants share one weights.bin, which otfuse copies beside OUT.
        with tempfile.TemporaryDirectory(prefix="otfuse-coverage-") as tmp:
            (Path(tmp) / "in").mkdir()
            (Path(tmp) / "out").mkdir()
            model = materialise(path, Path(tmp) / "in")
            run_otfuse(opts.otfuse, model, result, Path(tmp) / "out")
            if not opts.no_openvino:
                run_openvino(model, result)
        charge(result)
        results.append(result)
        if opts.cache:
            cache[name] = {**result.__dict__, "stamp": stamp}
            opts.cache.write_text(json.dumps(cache))
    totals = summarise(results, not opts.quiet)
    failures = group_failures(results, opts.top)
    errors = sum(1 for r in results if r.error)
    print(f"\n{len(results)} models, {errors} otfuse errors, "
          f"{sum(1 for r in results if r.ov_error)} OpenVINO failures")
    if opts.json:
        opts.json.write_text(json.dumps({"totals": totals, "failures": failures,
                                         "models": [r.__dict__ for r in results]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
