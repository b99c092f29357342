"""``--target ort`` / ``--target onnx`` on every committed fixture: the output has no otfuse op,
runs in stock onnxruntime (no otfuse library), reproduces the original (also with a left-padded
mask), and every site the default target fuses is written in the target's ops or listed with the
reason the target cannot express it (``REFUSED``: the expected refusals, strict)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from fixtures import fixture_entries, fixture_path

import otfuse
from otfuse.errors import OtfuseError
from otfuse.rewriter.model_io import load_model
from otfuse.run.feeds import make_feeds

ENTRIES = fixture_entries()
TARGETS = ("ort", "onnx")

# (fixture, target) -> the reason every refused site gives (each site of the fixture that the
# target leaves unfused or fuses only partly says this).
REFUSED: dict[tuple[str, str], str] = {}

_DEFAULT_SITES: dict[str, int] = {}


def _default_sites(name: str) -> int:
    """How many sites the otfuse target fuses (a dry run)."""
    if name not in _DEFAULT_SITES:
        _DEFAULT_SITES[name] = sum(otfuse.fuse(fixture_path(name)).fusions.values())
    return _DEFAULT_SITES[name]


def _padded_feeds(path) -> dict[str, np.ndarray] | None:
    """Feeds with the first batch row's first two mask positions padded out (None: no 2-D mask)."""
    model = load_model(path).model
    try:
        feeds = make_feeds(model, dims={"batch": 2, "seq": 7}, seed=1)
    except OtfuseError:  # static shapes, or other dim names
        feeds = make_feeds(model, seed=1)
    masks = [k for k, v in feeds.items() if "mask" in k and v.ndim == 2 and v.shape[0] > 1 and v.shape[1] > 2]
    if not masks:
        return None
    for k in masks:
        feeds[k] = feeds[k].copy()
        feeds[k][0, :2] = 0
    return feeds


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(ENTRIES))
def test_target_model_runs_in_stock_ort_and_matches(tmp_path, name, target):
    out = tmp_path / f"{name}_{target}.onnx"
    report = otfuse.fuse(fixture_path(name), out, target=target)
    model = onnx.load(out)
    assert not [n.op_type for n in model.graph.node if n.domain == "otfuse"]
    assert "otfuse" not in {o.domain for o in model.opset_import}
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # stock ORT, no library

    refused = [m for m in report.near_misses if m["reason"].startswith(f"target {target} cannot express")]
    strict = refused
    expected = REFUSED.get((name, target))
    assert all(expected and expected in m["reason"] for m in strict), [m["reason"] for m in strict]
    assert bool(strict) == bool(expected), (name, target, report.fusions)
    whole = [m for m in refused if not m.get("fused_as")]
    assert sum(report.fusions.values()) + len(whole) == _default_sites(name), (report.fusions, refused)

    assert otfuse.diff(fixture_path(name), out).ok
    feeds = _padded_feeds(fixture_path(name))
    fp16 = "fp16" in name  # ORT's fp16 original averages padded rows differently (docs/ops.md, Attention)
    if feeds is not None and not fp16:
        result = otfuse.diff(fixture_path(name), out, inputs=feeds)
        assert result.ok, [row.to_dict() for row in result.outputs]
