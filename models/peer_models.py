#!/usr/bin/env python
"""Peer fixtures: the test models onnxscript's own rewriter ships (``onnxscript.rewriter.models``),
saved as ONNX under models/fixtures/peers, with and without onnxscript's ``optimize_for_ort``.

Run with the export venv: ``/work/export-venv/bin/python models/peer_models.py``.

The peer models are one-layer (phi4: two-layer) graphs of real model sizes (SmolLM-1.7B, Phi-2,
Phi-4, Whisper-tiny): their weights alone are 0.6 to 14 GB. The graphs are what matters here, so
each weight is stored as ONNX external data pointing into ``weights.bin``, a file that is not
committed: ``write_weights`` regenerates it (seeded normal values, the same bytes every time) or
writes it sparse (zeros, for fusing only). To build the graphs without allocating the weights,
``numpy.random.rand`` is replaced while a peer's ``make_model_with_random_weights`` runs by one
that returns a one-element marker and records the shape asked for; the markers are then swapped
for external tensors of that shape. The rotary test cases have no weights and are stored inline.

``.ofo`` models are the same graphs after ``optimize_for_ort`` (run on the regenerated weights),
what a user who ran onnxscript first brings; their untouched weights still point into the base
model's ``weights.bin`` at the same offsets. What onnxscript computed from a weight (its constant
folding transposes the projection weights) is found again as a permutation of one base weight and
stored in ``derived.bin`` (also regenerated: the manifest's ``derived`` recipes); anything else it
computed is small and stays inline, and a large tensor of no such recipe fails that model.

The test module (tests/models/test_peer_models.py) imports this file without onnxscript: only
``write_weights`` and ``materialise`` are used there, and they need numpy, onnx and otfuse's tensor
walk (``otfuse.rewriter.model_io``) alone.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import external_data_helper

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "models" / "fixtures" / "peers"
sys.path.insert(0, str(REPO))  # otfuse, also when run with the export venv
from otfuse.rewriter.model_io import iter_all_tensors  # noqa: E402
MODELS = "onnxscript.rewriter.models"
MARKER_BASE = 1_000_000.0  # exact in float32; no peer weight is drawn from rand() this large
ALIGN = 64

# name -> (module, function). The functions are the public makers each module
# ships for its own tests; their docstrings/comments say which real model the graph was taken from.
PEERS = {
    "smollm_1": ("_smollm_1", "make_model_with_random_weights"),
    "smollm_2": ("_smollm_2", "make_model_with_random_weights"),
    "phi2lm": ("_phi2lm", "make_model_with_random_weights"),
    "phi4lm": ("_phi4lm", "make_model_with_random_weights"),
    "whisper_encoder": ("_whisper_encoder", "make_model_with_random_weights"),
    "whisper_decoder": ("_whisper_decoder", "make_model_with_random_weights"),
    "bart_encoder": ("_bart_encoder", "make_model_with_random_weights"),
    "rotary_case_1": ("_rotary_embedding_models", "test_case_1"),
    "rotary_case_2": ("_rotary_embedding_models", "test_case_2"),
    "partial_rotary": ("_rotary_embedding_models", "partial_rotary_test_case"),
}
OFO_MAX_WEIGHT_BYTES = 2 * 2**30  # optimize_for_ort runs on the regenerated weights: phi4lm's 14 GB are skipped


@contextlib.contextmanager
def marker_rand(shapes: list[tuple[int, ...]]):
    """numpy.random.rand returning a one-element marker, each shape asked for recorded in `shapes`."""
    real = np.random.rand

    def fake(*shape):
        shapes.append(tuple(int(d) for d in shape))
        return np.full((1,) * len(shape), MARKER_BASE + len(shapes) - 1)

    np.random.rand = fake
    try:
        yield
    finally:
        np.random.rand = real


def _marker_index(tensor: onnx.TensorProto, count: int) -> int | None:
    if tensor.data_type not in (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE) or tensor.data_location:
        return None
    values = onnx.numpy_helper.to_array(tensor).ravel()
    if values.size != 1:
        return None
    index = values[0] - MARKER_BASE
    return int(index) if 0 <= index < count and index == int(index) else None


def externalise_markers(proto: onnx.ModelProto, shapes: list[tuple[int, ...]]) -> int:
    """Each marker tensor becomes an external tensor of its recorded shape in weights.bin; returns the
    file's size. Offsets follow the markers' order (the order the maker drew them)."""
    offset, placed = 0, {}
    for tensor in iter_all_tensors(proto.graph):
        index = _marker_index(tensor, len(shapes))
        if index is None:
            continue
        itemsize = 4 if tensor.data_type == onnx.TensorProto.FLOAT else 8
        length = int(np.prod(shapes[index], dtype=np.int64)) * itemsize
        placed.setdefault(index, []).append((tensor, length))  # one weight may feed two Constants
    for index in sorted(placed):
        for tensor, length in placed[index]:
            _point_at(tensor, shapes[index], offset, length)
        offset += -(-length // ALIGN) * ALIGN
    if len(placed) != len(shapes):
        raise SystemExit(f"{len(shapes) - len(placed)} markers not found in the graph")
    return offset


def _point_at(tensor: onnx.TensorProto, shape: tuple[int, ...], offset: int, length: int,
              location: str = "weights.bin") -> None:
    del tensor.dims[:]
    tensor.dims.extend(shape)
    tensor.ClearField("float_data")
    tensor.ClearField("double_data")
    tensor.raw_data = b"\0"  # set_external_data wants the field present
    external_data_helper.set_external_data(tensor, location=location, offset=offset, length=length)
    tensor.data_location = onnx.TensorProto.EXTERNAL
    tensor.ClearField("raw_data")


def external_tensors(proto: onnx.ModelProto) -> list[tuple[int, int, int]]:
    """(offset, length, data_type) of every tensor in weights.bin, by offset."""
    found = set()
    for tensor in iter_all_tensors(proto.graph):
        info = {kv.key: kv.value for kv in tensor.external_data}
        if tensor.data_location == onnx.TensorProto.EXTERNAL and info.get("location") == "weights.bin":
            found.add((int(info["offset"]), int(info["length"]), tensor.data_type))
    return sorted(found)


def write_weights(proto: onnx.ModelProto, path: Path, seed: int, sparse: bool = False) -> None:
    """weights.bin for a base peer model: seeded N(0, 0.05) values per tensor (the same bytes on every
    run), or zeros in a sparse file (enough to fuse; nothing is read)."""
    tensors = external_tensors(proto)
    size = max((o + n for o, n, _ in tensors), default=0)
    with open(path, "wb") as f:
        f.truncate(size)
        if sparse:
            return
        rng = np.random.default_rng(seed)
        for offset, length, data_type in tensors:
            dtype = np.float32 if data_type == onnx.TensorProto.FLOAT else np.float64
            f.seek(offset)
            for start in range(0, length // np.dtype(dtype).itemsize, 1 << 24):  # 64 MiB chunks
                count = min(1 << 24, length // np.dtype(dtype).itemsize - start)
                f.write((rng.standard_normal(count, dtype=np.float32) * 0.05).astype(dtype).tobytes())


def materialise(entry: dict, folder: Path, sparse: bool = False) -> Path:
    """A runnable copy of a peer fixture in `folder`: the graph and its (re)generated weights.bin."""
    base = onnx.load(OUT / entry["base_file"], load_external_data=False)
    if external_tensors(base):
        write_weights(base, folder / "weights.bin", entry["seed"], sparse=sparse)
    if entry.get("derived"):
        write_derived(entry["derived"], folder / "weights.bin", folder / "derived.bin")
    target = folder / Path(entry["file"]).name
    target.write_bytes((OUT / entry["file"]).read_bytes())
    return target


def build(name: str) -> onnx.ModelProto:
    import importlib

    import onnx_ir as ir

    module, function = PEERS[name]
    shapes: list[tuple[int, ...]] = []
    np.random.seed(0)  # the rotary cases draw inv_freq at import: the same graph every run
    maker = getattr(importlib.import_module(f"{MODELS}.{module}"), function)
    with marker_rand(shapes):
        made = maker()
    if hasattr(made, "get_onnx_model"):
        made = made.get_onnx_model()
    proto = made if isinstance(made, onnx.ModelProto) else ir.serde.serialize_model(made)
    if shapes:
        externalise_markers(proto, shapes)
    return proto


MIN_DERIVED_BYTES = 64 * 1024


def _base_weights(base: onnx.ModelProto, blob: np.ndarray) -> list[tuple[int, np.ndarray]]:
    found = {}
    for tensor in iter_all_tensors(base.graph):
        info = {kv.key: kv.value for kv in tensor.external_data}
        if tensor.data_location == onnx.TensorProto.EXTERNAL and int(info["length"]) >= MIN_DERIVED_BYTES:
            offset, length = int(info["offset"]), int(info["length"])
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
            found[offset] = blob[offset:offset + length].view(dtype).reshape(tuple(tensor.dims))
    return sorted(found.items())


def _recipe_for(value: np.ndarray, weights: list[tuple[int, np.ndarray]]) -> dict | None:
    import itertools

    for offset, source in weights:
        if source.dtype != value.dtype or sorted(source.shape) != sorted(value.shape):
            continue
        for perm in itertools.permutations(range(source.ndim)):
            moved = source.transpose(perm)
            if moved.shape == value.shape and np.array_equal(moved, value):
                return {"source_offset": offset, "source_shape": list(source.shape), "perm": list(perm),
                        "dtype": str(value.dtype)}
    return None


def pack_derived(proto: onnx.ModelProto, base: onnx.ModelProto, weights_path: Path) -> list[dict]:
    """Large inline tensors of ``proto`` that are a permutation of a base weight: pointed into
    derived.bin, their recipes returned (offset, length, source_offset, source_shape, perm, dtype)."""
    weights = _base_weights(base, np.memmap(weights_path, dtype=np.uint8, mode="r")) if weights_path.exists() else []
    recipes, offset = [], 0
    for tensor in iter_all_tensors(proto.graph):
        if tensor.data_location == onnx.TensorProto.EXTERNAL or len(tensor.raw_data) < MIN_DERIVED_BYTES:
            continue
        recipe = _recipe_for(onnx.numpy_helper.to_array(tensor), weights)
        if recipe is None:
            raise ValueError(f"{tensor.name}: {len(tensor.raw_data)} bytes onnxscript computed, of no base weight")
        length = len(tensor.raw_data)
        _point_at(tensor, tuple(tensor.dims), offset, length, location="derived.bin")
        recipes.append({"offset": offset, "length": length, **recipe})
        offset += -(-length // ALIGN) * ALIGN
    return recipes


def write_derived(recipes: list[dict], weights_path: Path, path: Path) -> None:
    blob = np.memmap(weights_path, dtype=np.uint8, mode="r")
    with open(path, "wb") as f:
        for recipe in recipes:
            dtype = np.dtype(recipe["dtype"])
            size = int(np.prod(recipe["source_shape"])) * dtype.itemsize
            source = np.frombuffer(blob[recipe["source_offset"]:recipe["source_offset"] + size], dtype=dtype)
            f.seek(recipe["offset"])
            f.write(np.ascontiguousarray(source.reshape(recipe["source_shape"]).transpose(recipe["perm"])).tobytes())


def optimise_for_ort(base: Path, seed: int) -> tuple[onnx.ModelProto, dict, list[dict]]:
    """onnxscript's optimize_for_ort on the base model with its weights regenerated."""
    import onnx_ir as ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        path = materialise({"base_file": base.name, "file": base.name, "seed": seed}, folder)
        model, counts = optimize_for_ort(ir.load(path))
        proto = ir.serde.serialize_model(model)
        for tensor in iter_all_tensors(proto.graph):  # onnx_ir keeps untouched weights where they were
            info = {kv.key: kv.value for kv in tensor.external_data}
            if tensor.data_location == onnx.TensorProto.EXTERNAL and info.get("location") != "weights.bin":
                raise ValueError(f"{tensor.name} points into {info.get('location')}")
        recipes = pack_derived(proto, onnx.load(base, load_external_data=False), folder / "weights.bin")
    return proto, {k: v for k, v in counts.items() if v}, recipes


def _versions() -> dict:
    import onnxruntime
    import onnxscript

    return {"onnxscript": onnxscript.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__}


def _input_spec(value: onnx.ValueInfoProto) -> dict:
    dims = value.type.tensor_type.shape.dim
    return {"name": value.name, "shape": [d.dim_param or d.dim_value for d in dims],
            "elem_type": value.type.tensor_type.elem_type}


def _save(proto: onnx.ModelProto, path: Path) -> str:
    data = proto.SerializeToString()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=list(PEERS))
    parser.add_argument("--no-ofo", action="store_true", help="skip optimize_for_ort")
    args = parser.parse_args(argv)
    OUT.mkdir(parents=True, exist_ok=True)
    manifest_path = OUT / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}, "failed": {}}
    expected = json.loads((OUT / "expected.json").read_text())  # counted by reading each graph (README)
    for name in args.only:
        module, function = PEERS[name]
        seed = 1000 + sorted(PEERS).index(name)
        started = time.time()
        proto = build(name)
        path = OUT / f"{name}.onnx"
        sha = _save(proto, path)
        weights = max((o + n for o, n, _ in external_tensors(proto)), default=0)
        common = {"source": f"onnxscript.rewriter.models.{module}.{function}", "versions": _versions(),
                  "seed": seed, "weights_bytes": weights, "base_file": path.name,
                  "inputs": [_input_spec(i) for i in proto.graph.input]}
        manifest["models"][name] = {**common, "file": path.name, "sha256": sha, "expected": expected[name]}
        print(f"{name}: {path.stat().st_size} bytes, weights {weights / 2**20:.1f} MiB ({time.time() - started:.0f} s)")
        if args.no_ofo:
            continue
        key = f"{name}.ofo"
        if weights > OFO_MAX_WEIGHT_BYTES:
            manifest["failed"][key] = (f"not made: optimize_for_ort would need the {weights / 2**30:.1f} GiB "
                                       f"of weights (limit {OFO_MAX_WEIGHT_BYTES / 2**30:.0f} GiB)")
            manifest["models"].pop(key, None)
            continue
        try:
            ofo, counts, recipes = optimise_for_ort(path, seed)
        except Exception as error:  # recorded, never dropped
            manifest["failed"][key] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
            manifest["models"].pop(key, None)
            continue
        ofo_path = OUT / f"{name}.ofo.onnx"
        contrib = sorted({n.op_type for n in ofo.graph.node if n.domain == "com.microsoft"})
        manifest["models"][key] = {**common, "file": ofo_path.name, "sha256": _save(ofo, ofo_path),
                                   "ofo_fusions": counts, "contrib_ops": contrib, "derived": recipes,
                                   "expected": expected.get(key, expected[name])}
        manifest["failed"].pop(key, None)
        print(f"{key}: {ofo_path.stat().st_size} bytes, {counts}")
    manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
