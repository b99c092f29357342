"""``--target ort`` / ``--target onnx`` over the export matrix (models/fixtures/matrix) and the
contrib-op fixtures (models/fixtures/contrib), as test_fixtures.py does for the committed
fixtures: the output holds no otfuse op, builds in stock onnxruntime (no otfuse library), diffs
clean against the original, and every site the default target fuses is written in the target's
ops or listed with the reason the target cannot express it (``REFUSED``, strict).

Slow (two fuses and a diff per variant and target, ~500 runs): ``-m "not slow"`` leaves it out."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest

import otfuse
from fusions.test_contrib_ops import CONTRIB_ENTRIES, materialise
from models.test_export_matrix import COVERAGE, ENTRIES, MATRIX, XFAIL, dims_for

pytestmark = pytest.mark.slow
TARGETS = ("ort", "onnx")

# (variant, target) -> the reason every refused site of that variant gives.
REFUSED: dict[tuple[str, str], str] = {
    # ALiBi's bias is added in float32 by otfuse's op, in float16 by the target ops
    ("bloom/dynamo_nopos_dyn.fp16", "ort"): "ALiBi on float16 attention",
    ("bloom/dynamo_nopos_dyn.fp16", "onnx"): "ALiBi on float16 attention",
}


def _variants() -> list:
    keys = [("matrix", key) for key in sorted(ENTRIES) if key not in XFAIL]  # XFAIL: not fused by otfuse either
    return keys + [("contrib", key) for key in sorted(CONTRIB_ENTRIES)]


def _source(kind: str, key: str, folder) -> tuple:
    if kind == "matrix":
        entry = ENTRIES[key]
        return COVERAGE.materialise(MATRIX / entry["file"], folder), entry
    return materialise(key, folder), CONTRIB_ENTRIES[key]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("kind,key", _variants(), ids=lambda v: str(v))
def test_variant_in_target_runs_in_stock_ort_and_matches(tmp_path, kind, key, target):
    (tmp_path / "in").mkdir()
    src, entry = _source(kind, key, tmp_path / "in")
    default = otfuse.fuse(src)  # a dry run: the sites the otfuse target fuses
    out = tmp_path / f"{target}.onnx"
    report = otfuse.fuse(src, out, target=target)
    model = onnx.load(out, load_external_data=False)
    assert not [n.op_type for n in model.graph.node if n.domain == "otfuse"]
    assert "otfuse" not in {o.domain for o in model.opset_import}
    ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])  # stock ORT, no library

    refused = [m for m in report.near_misses if m["reason"].startswith(f"target {target} cannot express")]
    expected = REFUSED.get((key, target))
    assert all(expected and expected in m["reason"] for m in refused), [m["reason"] for m in refused]
    whole = [m for m in refused if not m.get("fused_as")]
    assert sum(report.fusions.values()) + len(whole) == sum(default.fusions.values()), (report.fusions, refused)

    result = otfuse.diff(src, out, dims=dims_for(entry))
    assert result.ok, [row.to_dict() for row in result.outputs]
