"""The DiT block fixtures (models/fixtures/dit, made by models/dit_blocks.py) agree with their
manifest: each file exists, has the recorded size and sha256, stays under 100 KB, passes the
checker and runs in onnxruntime with finite outputs at two batch sizes. No torch needed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import onnx
import pytest

ort = pytest.importorskip("onnxruntime")

DIT = Path(__file__).resolve().parents[2] / "models" / "fixtures" / "dit"
ENTRIES = json.loads((DIT / "manifest.json").read_text())["fixtures"]


def test_every_onnx_file_is_in_the_manifest():
    assert sorted(p.name for p in DIT.glob("*.onnx")) == sorted(e["file"] for e in ENTRIES.values())


@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_fixture_matches_its_manifest_and_runs(name):
    entry = ENTRIES[name]
    data = (DIT / entry["file"]).read_bytes()
    assert len(data) == entry["size_bytes"] < 100 * 1024
    assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    model = onnx.load_from_string(data)
    onnx.checker.check_model(model, full_check=True)
    assert [i.name for i in model.graph.input] == [name for name, _ in entry["inputs"]]
    assert [o.name for o in model.graph.output] == entry["outputs"]
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    dynamic = any("batch" in dims for _, dims in entry["inputs"])
    for batch in (1, 3) if dynamic else (entry["inputs"][0][1][0],):  # a static fixture: its own batch
        feeds = {k: rng.standard_normal([batch if d == "batch" else d for d in dims]).astype(np.float32)
                 for k, dims in entry["inputs"]}
        for out in session.run(None, feeds):
            assert out.shape[0] == batch and np.isfinite(out).all()
