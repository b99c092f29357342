#!/usr/bin/env python
"""Contrib-op fixtures: onnxscript's ``optimize_for_ort`` (``.ofo``) and ORT's transformers
optimizer ``optimize_model`` (``.ortopt``) applied to committed export-matrix variants, packed
against the matrix's own weights (models/fixtures/contrib).

Run with the export venv (onnxscript): ``/work/venvs/export/bin/python models/optimize_for_ort.py``.
Each output graph is stored gzip-compressed as ``contrib/<family>/<variant>.<tool>.onnx.gz``; every
large initializer whose bytes the family's ``matrix/<family>/weights.bin`` already holds points
into that file (ONNX external data, location ``weights.bin``: the tests materialise the pair in a
temporary folder), anything new stays inline. ``contrib/manifest.json`` lists each fixture with
its source variant, the contrib ops it holds and the sites expected (the source's sidecar count).
BERT's ``.ofo`` (``com.microsoft.Attention`` with the q/k/v weights packed: their concatenation is
new, ~100 KB inline) was added with ``--merge --tools ofo bert/dynamo_pos_dyn``; ORT's
``optimize_model`` leaves BERT's attention unfused (and writes ``EmbedLayerNormalization``), so no
``.ortopt`` for it.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import onnx
from onnx import external_data_helper, numpy_helper

REPO = Path(__file__).resolve().parents[1]
MATRIX = REPO / "models" / "fixtures" / "matrix"
OUT = REPO / "models" / "fixtures" / "contrib"
MIN_EXTERNAL_BYTES = 1024
DEFAULT_VARIANTS = ("llama/dynamo_pos_dyn", "qwen2/dynamo_pos_dyn", "phi/dynamo_pos_dyn", "gpt_neox/dynamo_pos_dyn",
                    "gptj/dynamo_pos_dyn", "bloom/dynamo_nopos_dyn", "mistral/dynamo_pos_dyn")


def weight_index(family: str, manifest: dict) -> dict[str, tuple[int, int]]:
    """sha256 of a tensor's bytes -> (offset, length) in the family's weights.bin."""
    blob = (MATRIX / family / "weights.bin").read_bytes()
    index = {}
    for key, entry in manifest["models"].items():
        if not key.startswith(f"{family}/"):
            continue
        proto = onnx.load_from_string(gzip.decompress((MATRIX / entry["file"]).read_bytes()))
        for tensor in proto.graph.initializer:
            info = {kv.key: kv.value for kv in tensor.external_data}
            if "offset" in info:
                offset, length = int(info["offset"]), int(info["length"])
                index[hashlib.sha256(blob[offset:offset + length]).hexdigest()] = (offset, length)
    return index


def point_into(proto: onnx.ModelProto, index: dict) -> int:
    moved = 0
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        data = numpy_helper.to_array(tensor).tobytes()
        place = index.get(hashlib.sha256(data).hexdigest()) if len(data) >= MIN_EXTERNAL_BYTES else None
        if place is None:
            continue
        tensor.raw_data = data
        external_data_helper.set_external_data(tensor, location="weights.bin", offset=place[0], length=place[1])
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
        moved += 1
    return moved


def _materialise(entry: dict, folder: Path) -> Path:
    sys.path.insert(0, str(REPO / "bench"))
    from coverage import materialise  # noqa: E402

    return materialise(MATRIX / entry["file"], folder)


def optimise(key: str, entry: dict, folder: Path) -> onnx.ModelProto:
    """onnxscript's optimize_for_ort."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    model, _ = optimize_for_ort(ir.load(_materialise(entry, folder)))
    return ir.serde.serialize_model(model)


def ort_optimise(key: str, entry: dict, folder: Path) -> onnx.ModelProto:
    """ORT's transformers optimizer (``optimize_model``, its graph fusions only: opt_level 0), as a
    GPT-2-like decoder (BERT as ``bert``), with the variant's heads and hidden size."""
    from onnxruntime.transformers.optimizer import optimize_model

    path = _materialise(entry, folder)
    model_type = "bert" if entry["architecture"] == "bert" else "gpt2"
    model = optimize_model(str(path), model_type=model_type, num_heads=HEADS, hidden_size=HIDDEN, opt_level=0)
    out = folder / "ort_optimised.onnx"
    model.save_model_to_file(str(out))
    return onnx.load(out)


HEADS, HIDDEN = 4, 64  # every matrix family's config (models/export_matrix.py)
TOOLS = {"ofo": optimise, "ortopt": ort_optimise}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="*", default=list(DEFAULT_VARIANTS))
    parser.add_argument("--tools", default="ofo,ortopt", help="ofo (onnxscript), ortopt (ORT's optimize_model)")
    parser.add_argument("--merge", action="store_true",
                        help="keep the manifest's other entries (and their files) as they are")
    args = parser.parse_args(argv)
    manifest = json.loads((MATRIX / "manifest.json").read_text())
    out_manifest = json.loads((OUT / "manifest.json").read_text()) if args.merge else {"models": {}}
    for tool, key in ((t, k) for t in args.tools.split(",") for k in args.variants):
        entry, family = manifest["models"][key], key.split("/")[0]
        with tempfile.TemporaryDirectory() as tmp:
            proto = TOOLS[tool](key, entry, Path(tmp))
        for tensor in proto.graph.initializer:  # onnx_ir keeps untouched weights where they were
            info = {kv.key: kv.value for kv in tensor.external_data}
            if tensor.data_location == onnx.TensorProto.EXTERNAL and info.get("location") != "weights.bin":
                raise SystemExit(f"{key}: {tensor.name} points into {info.get('location')}")
        moved = point_into(proto, weight_index(family, manifest))
        data = proto.SerializeToString()
        target = OUT / family / f"{entry['variant']}.{tool}.onnx.gz"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        ops = collections.Counter(n.op_type for n in proto.graph.node
                                  if n.domain == "com.microsoft" or "LayerNormalization" in n.op_type)
        out_manifest["models"][f"{key}.{tool}"] = {
            "file": f"{family}/{target.name}", "source": key, "weights": f"matrix/{family}/weights.bin",
            "sha256": hashlib.sha256(data).hexdigest(), "contrib_ops": dict(sorted(ops.items())),
            "expected": {k: entry["expected"][k] for k in ("rope", "attention", "norm", "residual_norm")},
            "inputs": entry["inputs"]}
        print(f"{key}.{tool}: {len(data)} bytes ({target.stat().st_size} gz), {moved} tensors in weights.bin, {dict(ops)}")
    (OUT / "manifest.json").write_text(json.dumps(out_manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
