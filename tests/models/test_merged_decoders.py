"""optimum-onnx's merged decoders (models/merged_decoders.py): the whole decoder twice, inside an
``If`` on ``use_cache_branch``. Every site of both branches fuses, the counts per branch are those
of the torch decoder (the manifest's ``expected_per_branch``), ``otfuse diff`` is clean with and
without the cache, and the ``ort`` / ``onnx`` targets write valid models."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import onnx
import pytest

import otfuse
from bench.coverage import fused_sites

MERGED = Path(__file__).resolve().parents[2] / "models" / "fixtures" / "merged"
MANIFEST = json.loads((MERGED / "manifest.json").read_text())
NAMES = sorted(MANIFEST["fixtures"])
BRANCHES = ("If 'optimum::if' then_branch", "If 'optimum::if' else_branch")
DIMS = {"batch": 2, "seq": 5}


def unpacked(name: str, folder: Path) -> Path:
    entry = MANIFEST["fixtures"][name]
    data = gzip.decompress((MERGED / entry["file"]).read_bytes())
    assert hashlib.sha256(data).hexdigest() == entry["sha256"] and len(data) == entry["size_bytes"]
    path = folder / f"{name}.onnx"
    path.write_bytes(data)
    return path


def test_manifest_lists_every_file_and_nothing_failed():
    assert MANIFEST["failed"] == {}
    assert sorted(p.name for p in MERGED.glob("*.onnx.gz")) == sorted(e["file"] for e in MANIFEST["fixtures"].values())
    for entry in MANIFEST["fixtures"].values():
        assert entry["packed_bytes"] < 300 * 1024
        assert max(entry["ort_vs_torch_max_abs"].values()) <= 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_both_branches_fuse_every_site_and_diff_is_clean(tmp_path, name):
    src = unpacked(name, tmp_path)
    assert [n.op_type for n in onnx.load(src).graph.node] == ["If"]  # every site is in a branch
    dst = tmp_path / f"{name}_fused.onnx"
    report = otfuse.fuse(src, dst)
    expected = MANIFEST["fixtures"][name]["expected_per_branch"]
    assert sorted(report.bodies) == sorted(BRANCHES)
    for label in BRANCHES:
        fused = report.bodies[label]
        assert fused_sites(fused)["norm"] == expected["norm"], (label, fused)  # *NormLinear included
        assert fused.get("Attention", 0) == expected["attention"], (label, fused)
        gelus = expected["activation"] if expected["activation_kind"] == "gelu" else 0
        assert fused.get("Gelu", 0) == gelus, (label, fused)
    assert report.fused_count == sum(sum(f.values()) for f in report.bodies.values())
    for miss in report.near_misses:  # each names its branch
        assert miss.get("body") in BRANCHES and miss["location"].startswith(miss["body"] + ": "), miss
    result = otfuse.diff(src, dst, dims=DIMS)
    assert result.branches == ["use_cache_branch=False"]
    assert result.ok, [row.to_dict() for row in result.outputs if not row.ok]


@pytest.mark.parametrize("target", ["ort", "onnx"])
@pytest.mark.parametrize("name", ["whisper", "t5"])
def test_targets_write_valid_merged_decoders(tmp_path, name, target):
    src = unpacked(name, tmp_path)
    dst = tmp_path / f"{name}_{target}.onnx"
    report = otfuse.fuse(src, dst, target=target)
    fused = onnx.load(dst)
    assert not any(o.domain == "otfuse" for o in fused.opset_import)
    assert sorted(report.bodies) == sorted(BRANCHES) and report.target_ops
    if target == "onnx":
        onnx.checker.check_model(fused, full_check=True)
        assert report.target_ops.get("ai.onnx.Attention") == 8
    result = otfuse.diff(src, dst, dims=DIMS)
    assert result.branches == ["use_cache_branch=False"]
    assert result.ok, [row.to_dict() for row in result.outputs if not row.ok]


def test_weights_in_external_data_are_read_from_outer_scope(tmp_path):
    # The branches read the shared weights from the main graph; with those weights in a data
    # file, a body's copy of them still points into that file (nothing is loaded whole).
    model = onnx.load(unpacked("t5", tmp_path))
    folder = tmp_path / "external"
    folder.mkdir()
    src = folder / "t5.onnx"
    onnx.save(model, src, save_as_external_data=True, all_tensors_to_one_file=True, location="t5.data",
              size_threshold=0)
    out = tmp_path / "fused"
    out.mkdir()
    report = otfuse.fuse(src, out / "t5.onnx")
    assert sorted(report.bodies) == sorted(BRANCHES)
    assert otfuse.diff(src, out / "t5.onnx", dims=DIMS).ok
