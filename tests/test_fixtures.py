"""The committed ONNX fixtures (models/fixtures, made by models/export_fixtures.py) are sound:
they load, pass the checker, run in onnxruntime on CPU with finite outputs, and the manifest the
fusion tests compare against describes them exactly. No torch needed."""

from __future__ import annotations

import ast
import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

FIXTURES = Path(__file__).resolve().parent.parent / "models" / "fixtures"
MANIFEST = json.loads((FIXTURES / "manifest.json").read_text())
ENTRIES = MANIFEST["fixtures"]
NAMES = sorted(ENTRIES)

# Test sizes: batch 2, seq 7 (and a 5-token cache for the KV fixture).
DIMS = {"batch": 2, "seq": 7, "past_seq": 5}
DIMS["total_seq"] = DIMS["past_seq"] + DIMS["seq"]

ONNX_TO_NP = {"float32": np.float32, "float16": np.float16, "int64": np.int64, "bool": np.bool_}


@pytest.fixture(scope="module", params=NAMES)
def fixture(request):
    name = request.param
    entry = ENTRIES[name]
    path = FIXTURES / entry["file"]
    return name, entry, path, onnx.load(str(path))


def resolve_dim(dim: int | str) -> int:
    """A manifest dim: an int, a symbolic name, or an expression such as 'past_seq + seq'."""
    if isinstance(dim, int):
        return dim
    if dim in DIMS:
        return DIMS[dim]
    tree = ast.parse(dim, mode="eval")
    for node in ast.walk(tree):
        if not isinstance(node, (ast.Expression, ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Name, ast.Load, ast.Constant)):
            raise AssertionError(f"unexpected symbolic dim {dim!r}")
    return int(eval(compile(tree, "<dim>", "eval"), {"__builtins__": {}}, dict(DIMS)))


def make_feeds(entry: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    vocab = entry["config"]["vocab_size"]
    past = DIMS["past_seq"] if entry["kv_cache"] else 0
    feeds = {}
    for spec in entry["inputs"]:
        shape = [resolve_dim(d) for d in spec["shape"]]
        dtype = ONNX_TO_NP[spec["dtype"]]
        name = spec["name"]
        if name == "input_ids":
            value = rng.integers(0, vocab, size=shape, dtype=np.int64)
        elif name == "attention_mask":
            value = np.ones(shape, dtype=dtype)
        elif name == "position_ids":
            value = np.broadcast_to(np.arange(past, past + shape[1], dtype=np.int64), shape).copy()
        elif name.startswith("past_key_values."):
            value = (0.5 * rng.standard_normal(shape)).astype(dtype)
        else:
            raise AssertionError(f"{entry['file']}: no feed rule for input {name!r}")
        assert value.dtype == dtype, (name, value.dtype, dtype)
        feeds[name] = value
    return feeds


def value_infos(values) -> list[dict]:
    out = []
    for vi in values:
        tt = vi.type.tensor_type
        shape = [d.dim_param if d.HasField("dim_param") else int(d.dim_value) for d in tt.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type).name
        out.append({"name": vi.name, "dtype": dtype, "shape": shape})
    return out


def initializer_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


def scalar(inits: dict[str, np.ndarray], name: str) -> float | None:
    value = inits.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def structure_counts(model: onnx.ModelProto) -> dict[str, int]:
    """Same rules as graph_structure_counts in models/export_fixtures.py (see models/README.md)."""
    nodes = model.graph.node
    inits = initializer_values(model)
    producer = {out: n for n in nodes for out in n.output}
    ops = Counter(n.op_type for n in nodes)
    rms = 0
    for n in nodes:
        if n.op_type != "ReduceMean":
            continue
        pow_node = producer.get(n.input[0])
        if pow_node is None or pow_node.op_type != "Pow" or scalar(inits, pow_node.input[1]) != 2.0:
            continue
        src = producer.get(pow_node.input[0])
        if src is None or src.op_type != "Sub":
            rms += 1
    return {
        "rmsnorm": rms + ops["RMSNormalization"],
        "layernorm": ops["LayerNormalization"],
        "attention": ops["Softmax"] + ops["Attention"],
        "rotary_applications": ops["Neg"] + ops["RotaryEmbedding"],
    }


def norm_parameters(model: onnx.ModelProto) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """(node, scale, bias) for every norm: LayerNormalization / RMSNormalization inputs, or for a
    decomposed RMSNorm the constant of the `Mul` after `x * rsqrt` (through an optional Cast)."""
    nodes = model.graph.node
    inits = initializer_values(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)

    def only_consumer(name: str, op: str) -> onnx.NodeProto:
        users = consumers.get(name, [])
        assert len(users) == 1 and users[0].op_type == op, (name, [u.op_type for u in users], op)
        return users[0]

    found = []
    for n in nodes:
        if n.op_type in ("LayerNormalization", "RMSNormalization"):
            bias = inits[n.input[2]] if len(n.input) > 2 and n.input[2] else None
            found.append((n.name, inits[n.input[1]], bias))
        elif n.op_type == "Reciprocal":
            mul = only_consumer(n.output[0], "Mul")  # x * rsqrt
            nxt = consumers[mul.output[0]]
            if len(nxt) == 1 and nxt[0].op_type == "Cast":
                nxt = consumers[nxt[0].output[0]]
            assert len(nxt) == 1 and nxt[0].op_type == "Mul", (n.name, [u.op_type for u in nxt])
            weights = [inits[i] for i in nxt[0].input if i in inits]
            assert len(weights) == 1, nxt[0].name
            found.append((n.name, weights[0], None))
    return found


# ---------------------------------------------------------------------------------------------


def test_manifest_lists_exactly_the_committed_files():
    on_disk = sorted(p.name for p in FIXTURES.glob("*.onnx"))
    assert on_disk == sorted(e["file"] for e in ENTRIES.values())
    assert all(e["file"] == f"{name}.onnx" for name, e in ENTRIES.items())
    assert MANIFEST.get("failed", {}) == {}, MANIFEST["failed"]


def test_fixtures_stay_small():
    sizes = {p.name: p.stat().st_size for p in FIXTURES.glob("*.onnx")}
    assert max(sizes.values()) < 1_000_000, sizes
    assert sum(sizes.values()) < 8_000_000, sizes


def test_file_matches_manifest(fixture):
    name, entry, path, model = fixture
    data = path.read_bytes()
    assert len(data) == entry["size_bytes"]
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    opsets = {imp.domain or "ai.onnx": imp.version for imp in model.opset_import}
    assert opsets == entry["opset_imports"]
    assert opsets["ai.onnx"] == entry["opset"]
    assert value_infos(model.graph.input) == entry["inputs"]
    assert value_infos(model.graph.output) == entry["outputs"]
    ops = Counter(n.op_type for n in model.graph.node)
    assert dict(sorted(ops.items())) == entry["graph_op_counts"]


def test_self_contained_and_valid(fixture):
    name, entry, path, model = fixture
    for init in model.graph.initializer:
        assert init.data_location != onnx.TensorProto.EXTERNAL, init.name
    onnx.checker.check_model(model, full_check=True)


def test_dynamic_batch_and_sequence(fixture):
    name, entry, path, model = fixture
    for spec in entry["inputs"]:
        assert spec["shape"][0] == "batch", spec
    ids = next(s for s in entry["inputs"] if s["name"] == "input_ids")
    assert ids["shape"] == ["batch", "seq"]


def test_runs_in_onnxruntime_with_finite_outputs(fixture):
    name, entry, path, model = fixture
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    outputs = sess.run(None, make_feeds(entry))
    assert len(outputs) == len(entry["outputs"])
    for value, spec in zip(outputs, entry["outputs"]):
        assert list(value.shape) == [resolve_dim(d) for d in spec["shape"]], spec["name"]
        assert value.dtype == ONNX_TO_NP[spec["dtype"]], spec["name"]
        assert np.isfinite(value).all(), spec["name"]
        assert float(np.std(value.astype(np.float32))) > 1e-3, f"{spec['name']} is degenerate"


def test_structure_counts_match_manifest(fixture):
    name, entry, path, model = fixture
    expected = entry["expected"]
    counts = structure_counts(model)
    assert counts == entry["graph_counts"]
    for key, value in counts.items():
        assert value == expected[key], (key, value, expected[key])
    cfg = entry["config"]
    layers = cfg["num_layers"]
    assert expected["attention"] == layers
    assert expected["rmsnorm"] + expected["layernorm"] == expected["hidden_norms"] + expected["per_head_norms"]
    if cfg["position_encoding"] == "rope":
        assert expected["rotary_sites"] == layers and expected["rotary_applications"] == 2 * layers
    else:
        assert expected["rotary_sites"] == expected["rotary_applications"] == 0


def test_norm_weights_are_perturbed(fixture):
    """Every norm has its own scale, visibly away from 1 (and its bias away from 0), so a fusion
    that drops or swaps them changes the output."""
    name, entry, path, model = fixture
    norms = norm_parameters(model)
    expected = entry["expected"]
    assert len(norms) == expected["rmsnorm"] + expected["layernorm"]
    for node, scale, bias in norms:
        scale = scale.astype(np.float32)
        assert np.abs(scale - 1.0).max() > 0.05, f"{node}: scale ~ 1"
        if bias is not None:
            assert np.abs(bias.astype(np.float32)).max() > 0.05, f"{node}: bias ~ 0"
    distinct = {scale.astype(np.float32).tobytes() for _, scale, _ in norms}
    assert len(distinct) == len(norms), "norm scales shared between norms"
