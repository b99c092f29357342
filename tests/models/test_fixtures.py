"""The committed ONNX fixtures (models/fixtures, made by models/export_fixtures.py) are sound:
they load, pass the checker, run in onnxruntime on CPU with finite outputs, and the manifest the
fusion tests compare against describes them exactly. No torch needed."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

ort = pytest.importorskip("onnxruntime")

FIXTURES = Path(__file__).resolve().parents[2] / "models" / "fixtures"


def _load_graph_counts():
    """models/graph_counts.py: the exporter's own counting rules (one copy), loaded by path."""
    path = FIXTURES.parent / "graph_counts.py"
    spec = importlib.util.spec_from_file_location("otfuse_models_graph_counts", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


graph_counts = _load_graph_counts()
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
    vocab = entry["config"]["vocab_size"]  # None for the modules written in models/ (rope3d)
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
        elif name == "hidden_states":
            value = rng.standard_normal(shape).astype(dtype)
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
    """Initializers and (TorchScript exports) Constant nodes' values."""
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            values.update({node.output[0]: numpy_helper.to_array(a.t) for a in node.attribute if a.name == "value"})
    return values


def scalar(inits: dict[str, np.ndarray], name: str) -> float | None:
    value = inits.get(name)
    return float(value.reshape(-1)[0]) if value is not None and value.size == 1 else None


def norm_parameters(model: onnx.ModelProto) -> list[tuple[str, np.ndarray, np.ndarray | None]]:
    """(node, scale, bias) for every norm: LayerNormalization / RMSNormalization inputs, or for a
    decomposed RMSNorm the constant of the `Mul` after `x * rsqrt` (through an optional Cast)."""
    nodes = model.graph.node
    inits = initializer_values(model)
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in nodes:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    producer = {out: n for n in nodes for out in n.output}

    def only_consumer(name: str, op: str) -> onnx.NodeProto:
        users = consumers.get(name, [])
        assert len(users) == 1 and users[0].op_type == op, (name, [u.op_type for u in users], op)
        return users[0]

    found = []
    for n in nodes:
        if n.op_type in ("LayerNormalization", "RMSNormalization"):
            bias = inits[n.input[2]] if len(n.input) > 2 and n.input[2] else None
            found.append((n.name, inits[n.input[1]], bias))
        elif n.op_type == "Reciprocal" or (n.op_type == "Div" and scalar(inits, n.input[0]) == 1.0 and
                                          getattr(producer.get(n.input[1]), "op_type", "") == "Sqrt" and
                                          [u.op_type for u in consumers.get(n.output[0], [])] == ["Mul"]):
            mul = only_consumer(n.output[0], "Mul")  # x * rsqrt (TorchScript: Div(1, Sqrt))
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
    if entry["architecture"] == "rope3d":  # static token grid: only batch is dynamic
        grid = entry["config"]["rotary"]["grid"]
        (spec,) = entry["inputs"]
        assert spec["shape"] == ["batch", int(np.prod(grid)), entry["config"]["hidden_size"]]
        return
    if entry["architecture"] in ("legacy_attention", "meta_rope"):  # models/*.py modules: static sequence
        (spec,) = entry["inputs"]
        assert spec["shape"][2:] == [entry["config"]["hidden_size"]] and isinstance(spec["shape"][1], int)
        return
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
    counts = graph_counts.graph_structure_counts(model)
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


# --- multi-axis ("3D") RoPE attention module (models/rope3d.py): rope3d, rope3d_torchscript ----

ROPE3D = sorted(name for name, e in ENTRIES.items() if e["architecture"] == "rope3d")


def constant_values(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    """Initializers and `Constant` node outputs (the TorchScript exporter uses the latter)."""
    values = initializer_values(model)
    for n in model.graph.node:
        if n.op_type == "Constant" and n.attribute[0].name == "value":
            values[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    return values


def rope3d_tables(rotary: dict) -> list[tuple[np.ndarray, np.ndarray]]:
    """(cos, sin) [S, section] per axis, float64: token positions frame-major over the grid, the
    default RoPE frequencies of each section, Concat(f, f)."""
    coords = np.stack(np.meshgrid(*(np.arange(n) for n in rotary["grid"]), indexing="ij"), -1).reshape(-1, 3)
    tables = []
    for axis, width in enumerate(rotary["sections"]):
        inv_freq = 1.0 / rotary["theta"] ** (np.arange(0, width, 2) / width)
        angle = coords[:, axis, None] * inv_freq[None, :]
        emb = np.concatenate([angle, angle], axis=-1)
        tables.append((np.cos(emb), np.sin(emb)))
    return tables


def rope3d_reference(entry: dict, model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    """The block in numpy (float64) from the graph's weights: q/k/v projections, multi-axis RoPE
    on q and k, softmax(q k^T / sqrt(d)) v, output projection."""
    inits = initializer_values(model)
    producer = {out: n for n in model.graph.node for out in n.output}
    weights = {}
    for n in model.graph.node:  # Add(MatMul(x, W), <proj>.bias), either operand order
        bias = next((i for i in n.input if i.endswith(".bias")), None) if n.op_type == "Add" else None
        if bias is None:
            continue
        (other,) = [i for i in n.input if i != bias]
        matmul = producer[other]
        assert matmul.op_type == "MatMul" and matmul.input[1] in inits, matmul.name
        weights[bias.removesuffix(".bias")] = (
            inits[matmul.input[1]].astype(np.float64), inits[bias].astype(np.float64))
    assert sorted(weights) == ["to_k", "to_out", "to_q", "to_v"], sorted(weights)

    cfg = entry["config"]
    heads, head_dim = cfg["num_heads"], cfg["head_dim"]
    batch, seq, hidden = x.shape
    x = x.astype(np.float64)

    def project(name, value):
        w, b = weights[name]
        return value @ w + b

    def split_heads(value):
        return value.reshape(batch, seq, heads, head_dim).transpose(0, 2, 1, 3)

    def rope(value):
        out, start = [], 0
        for cos, sin in rope3d_tables(cfg["rotary"]):
            width = cos.shape[-1]
            sec = value[..., start : start + width]
            x1, x2 = sec[..., : width // 2], sec[..., width // 2 :]
            out.append(sec * cos + np.concatenate([-x2, x1], axis=-1) * sin)
            start += width
        return np.concatenate(out, axis=-1)

    q = rope(split_heads(project("to_q", x)))
    k = rope(split_heads(project("to_k", x)))
    v = split_heads(project("to_v", x))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(head_dim)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    attn = (probs @ v).transpose(0, 2, 1, 3).reshape(batch, seq, hidden)
    return project("to_out", attn)


@pytest.fixture(scope="module", params=ROPE3D)
def rope3d_fixture(request):
    name = request.param
    entry = ENTRIES[name]
    return name, entry, onnx.load(str(FIXTURES / entry["file"]))


def test_rope3d_fixtures_present():
    assert ROPE3D == ["rope3d", "rope3d_torchscript"]
    assert ENTRIES["rope3d"]["exporter"].startswith("torch.onnx.export(dynamo=True")
    assert ENTRIES["rope3d_torchscript"]["exporter"].startswith("torch.onnx.export(dynamo=False")
    for name in ROPE3D:
        rotary = ENTRIES[name]["config"]["rotary"]
        assert rotary["style"] == "sections" and rotary["sections"] == [4, 6, 6]
        assert sum(rotary["sections"]) == rotary["rotary_dim"] == rotary["head_dim"] == 16
        expected = ENTRIES[name]["expected"]
        assert (expected["rotary_sites"], expected["rotary_applications"], expected["attention"]) == (1, 2, 1)


def test_rope3d_matches_numpy_reference(rope3d_fixture):
    name, entry, model = rope3d_fixture
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, 24, 64)).astype(np.float32)
        (out,) = sess.run(None, {"hidden_states": x})
        np.testing.assert_allclose(out, rope3d_reference(entry, model, x), rtol=1e-4, atol=1e-5)


def test_rope3d_exporters_agree():
    x = np.random.default_rng(7).standard_normal((2, 24, 64)).astype(np.float32)
    outs = [
        ort.InferenceSession(str(FIXTURES / ENTRIES[name]["file"]), providers=["CPUExecutionProvider"]).run(
            None, {"hidden_states": x})[0]
        for name in ROPE3D
    ]
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-5, atol=1e-6)


def test_rope3d_sections_as_documented(rope3d_fixture):
    """Per rotated tensor (q, then k): an outer Concat(axis=-1) of three section Adds; section i is
    Slice(x, start_i, end_i, axes=[3]) of the same head-transposed tensor, rotated as
    Add(Mul(sec, cos_i), Mul(Concat(Neg(sec[h:]), sec[:h]), sin_i)) with cos_i / sin_i constant
    [1, 1, 24, section] tables equal to the per-axis RoPE tables (see models/README.md)."""
    name, entry, model = rope3d_fixture
    values = constant_values(model)
    producer = {out: n for n in model.graph.node for out in n.output}
    tables = rope3d_tables(entry["config"]["rotary"])
    bounds = [(0, 4), (4, 10), (10, None)]

    def const(name):
        return values[name].reshape(-1).tolist()

    outer = [
        n for n in model.graph.node
        if n.op_type == "Concat" and len(n.input) == 3
        and all(i in producer and producer[i].op_type == "Add" for i in n.input)
    ]
    assert len(outer) == 2, [n.name for n in outer]
    sources = []
    for concat in outer:
        assert [a.i for a in concat.attribute if a.name == "axis"] == [-1]
        section_sources = set()
        for add_out, (start, end), (cos, sin) in zip(concat.input, bounds, tables):
            mul_cos, mul_sin = (producer[i] for i in producer[add_out].input)
            assert mul_cos.op_type == mul_sin.op_type == "Mul"
            section, cos_name = mul_cos.input
            rotated, sin_name = mul_sin.input
            np.testing.assert_allclose(values[cos_name], cos[None, None], atol=1e-6)
            np.testing.assert_allclose(values[sin_name], sin[None, None], atol=1e-6)
            sl = producer[section]
            assert sl.op_type == "Slice" and const(sl.input[3]) == [3] and const(sl.input[4]) == [1]
            assert const(sl.input[1]) == [start]
            assert const(sl.input[2]) == [end] if end is not None else const(sl.input[2])[0] >= 16
            section_sources.add(sl.input[0])
            neg_concat = producer[rotated]
            assert neg_concat.op_type == "Concat" and producer[neg_concat.input[0]].op_type == "Neg"
            half = producer[producer[neg_concat.input[0]].input[0]]  # Slice(sec, h, INT64_MAX)
            first = producer[neg_concat.input[1]]  # Slice(sec, 0, h)
            assert half.op_type == first.op_type == "Slice" and half.input[0] == first.input[0] == section
        assert len(section_sources) == 1  # the three sections cut from one tensor
        (source,) = section_sources
        assert producer[source].op_type == "Transpose"
        sources.append(source)
    assert len(set(sources)) == 2  # q and k
