"""How far fused float16 models sit from the float32 model they were converted from (issue 11,
item 10): for each committed matrix family with an onnxconverter-common ``.fp16`` variant
(``keep_io_types=True``), the float32 export, its float16 conversion as written, and that
conversion fused (all default families, then each family alone) run on the same inputs; the
error of each against the float32 model, and the float16 model's error as ONNX's reference
evaluator computes it (every op in float16, as the ONNX spec says) beside ORT's.

    python bench/fp16_accuracy.py [--families llama,gpt2] [--dims batch=2,seq=7] [--no-reference]

Not a test: it prints a table (docs/ops.md, "float16 models from onnxconverter-common").
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import otfuse  # noqa: E402
from coverage import materialise  # noqa: E402
from otfuse.run.feeds import make_feeds, parse_dims  # noqa: E402

MATRIX = REPO / "models" / "fixtures" / "matrix"
VARIANTS = {"all": None, "norm": ["norm"], "rope": ["rope"], "attention": ["attention"]}


def _run_ort(path: Path, feeds: dict) -> np.ndarray:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = otfuse.InferenceSession(str(path), sess_options=options)
    return session.run(None, feeds)[0].astype(np.float64)


def _run_reference(path: Path, feeds: dict) -> np.ndarray:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(onnx.load(str(path))).run(None, feeds)[0].astype(np.float64)


def _errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    diff = got - want
    return float(np.abs(diff).max()), float(np.sqrt(np.mean(diff ** 2)))


def measure(family: str, dims: dict, folder: Path, reference: bool) -> dict:
    entries = json.loads((MATRIX / "manifest.json").read_text())["models"]
    fp32 = materialise(MATRIX / entries[f"{family}/dynamo_pos_dyn"]["file"], folder)
    fp16 = materialise(MATRIX / entries[f"{family}/dynamo_pos_dyn.fp16"]["file"], folder)
    feeds = make_feeds(fp32, dims=dims, seed=0)
    want = _run_ort(fp32, feeds)
    rows = {"fp16 (ORT)": _errors(_run_ort(fp16, feeds), want)}
    if reference:
        try:
            rows["fp16 (reference evaluator)"] = _errors(_run_reference(fp16, feeds), want)
        except Exception as e:  # noqa: BLE001 - the evaluator lacks or breaks on some op
            print(f"{family}: ONNX's reference evaluator failed ({type(e).__name__}: {str(e)[:80]})")
    for name, only in VARIANTS.items():
        out = folder / f"fused_{name}.onnx"
        report = otfuse.fuse(fp16, out, only=only)
        label = f"fused {name} ({sum(report.fusions.values())} nodes)"
        rows[label] = _errors(_run_ort(out, feeds), want)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default="llama,mistral,qwen2,phi,gpt2,gpt_neox,gptj,bert,bloom")
    parser.add_argument("--dims", default="batch=2,seq=7")
    parser.add_argument("--no-reference", action="store_true", help="skip ONNX's reference evaluator (slow)")
    args = parser.parse_args()
    print(f"CPU: {platform.processor() or platform.machine()}; onnxruntime {ort.__version__}; onnx {onnx.__version__}")
    print("error of the first output vs the float32 export (max abs / RMS), and the ratio of the "
          "max abs to the float16 model's in ORT")
    entries = json.loads((MATRIX / "manifest.json").read_text())["models"]
    for family in args.families.split(","):
        key = f"{family}/dynamo_pos_dyn.fp16" if family != "bloom" else None
        if key is None or key not in entries:
            print(f"{family}: no dynamo_pos_dyn.fp16 variant in the matrix")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            rows = measure(family, parse_dims(args.dims), Path(tmp), not args.no_reference)
        base = rows["fp16 (ORT)"][0]
        print(f"\n{family}")
        for label, (max_abs, rms) in rows.items():
            print(f"  {label:<30} max abs {max_abs:.4g}  RMS {rms:.4g}  x{max_abs / base:.2f}")


if __name__ == "__main__":
    main()
