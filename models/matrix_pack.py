"""Pack exported variants into the committed export matrix (models/fixtures/matrix).

Every variant of one family shares one content-addressed weights file, `<family>/weights.bin`:
each initializer of at least `MIN_EXTERNAL_BYTES` is stored there once by its bytes' sha256 (the
dynamo and TorchScript exports, onnxsim, onnxslim and ORT's optimised models hold the same weight
bytes under other names), and the variant's .onnx points into it (ONNX external data: location,
offset, length). Smaller tensors (shapes, scalars, tables) stay inline. The graphs are stored
gzip-compressed (`<variant>.onnx.gz`, mtime 0: reproducible bytes): a TorchScript graph of ~600
nodes is ~100 KB of names and Constant nodes that compress ~8x. `bench/coverage.py`'s
`materialise` writes a runnable `.onnx` + `weights.bin` pair from them. No torch needed.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import onnx
from onnx import external_data_helper, numpy_helper

MIN_EXTERNAL_BYTES = 1024
ALIGN = 64  # offsets aligned so that ORT can map the tensors
WEIGHTS = "weights.bin"


class WeightStore:
    """One family's weights file, built in memory: sha256 -> (offset, length)."""

    def __init__(self):
        self.blob = bytearray()
        self.index: dict[str, tuple[int, int]] = {}

    def put(self, data: bytes) -> tuple[int, int]:
        key = hashlib.sha256(data).hexdigest()
        if key not in self.index:
            self.blob.extend(b"\0" * (-len(self.blob) % ALIGN))
            self.index[key] = (len(self.blob), len(data))
            self.blob.extend(data)
        return self.index[key]


def externalise(proto: onnx.ModelProto, store: WeightStore) -> int:
    """Point every large initializer of `proto` into `store`; returns how many moved."""
    moved = 0
    for tensor in proto.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            raise ValueError(f"initializer {tensor.name!r} is already external")
        data = numpy_helper.to_array(tensor).tobytes()
        if len(data) < MIN_EXTERNAL_BYTES:
            continue
        offset, length = store.put(data)
        dims, dtype, name = list(tensor.dims), tensor.data_type, tensor.name
        tensor.Clear()
        tensor.name, tensor.data_type = name, dtype
        tensor.dims.extend(dims)
        tensor.raw_data = data  # set_external_data wants it; the bytes go to the store, not the proto
        external_data_helper.set_external_data(tensor, location=WEIGHTS, offset=offset, length=length)
        tensor.data_location = onnx.TensorProto.EXTERNAL
        tensor.ClearField("raw_data")
        moved += 1
    return moved


MANIFEST_KEYS = ("architecture", "model_type", "kind", "variant", "exporter", "opset", "position_ids", "shapes",
                 "chain", "attn_implementation", "seed", "inputs", "outputs", "expected", "notes", "versions")


def pack(entries: dict[str, dict], staging: Path, out: Path, failures: dict[str, str]) -> dict[str, Any]:
    """Write out/<family>/<variant>.onnx + out/<family>/weights.bin and out/manifest.json for
    `entries` (key "family/variant" -> sidecar) exported under `staging`."""
    for old in out.glob("*/"):  # noqa: the folder is ours: regenerated whole
        shutil.rmtree(old)
    out.mkdir(parents=True, exist_ok=True)
    manifest: dict[str, Any] = {"models": {}, "failed": dict(sorted(failures.items())), "weights": {}}
    families = sorted({key.split("/")[0] for key in entries})
    for family in families:
        store = WeightStore()
        folder = out / family
        folder.mkdir()
        for key in sorted(k for k in entries if k.split("/")[0] == family):
            entry = entries[key]
            proto = onnx.load(staging / entry["file"])
            externalise(proto, store)
            data = proto.SerializeToString()
            target = folder / f"{entry['variant']}.onnx.gz"
            target.write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
            manifest["models"][key] = {"file": f"{family}/{target.name}", "size_bytes": len(data),
                                       "sha256": hashlib.sha256(data).hexdigest(),
                                       **{k: entry.get(k) for k in MANIFEST_KEYS}}
        (folder / WEIGHTS).write_bytes(bytes(store.blob))
        manifest["weights"][family] = {"file": f"{family}/{WEIGHTS}", "size_bytes": len(store.blob),
                                       "tensors": len(store.index),
                                       "sha256": hashlib.sha256(store.blob).hexdigest()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"matrix: {len(manifest['models'])} models, {len(failures)} failed exports, {total / 2**20:.2f} MiB in {out}")
    return manifest
