"""The CLI's ``--target``: the ort/onnx model is written, verified and diffed in stock onnxruntime,
with otfuse's library out of reach (``OTFUSE_LIBRARY`` pointing nowhere)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import onnx
import pytest
from fixtures import fixture_path

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args, cwd: Path, library: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    if not library:
        env["OTFUSE_LIBRARY"] = str(cwd / "no_such_library.so")
    return subprocess.run([sys.executable, "-m", "otfuse.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("target", ["ort", "onnx"])
def test_target_model_is_verified_and_diffed_without_the_library(tmp_path, target):
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    done = run_cli(fixture_path("llama"), "-o", out, "--target", target, "--report", report, "--verify",
                   cwd=tmp_path, library=False)
    assert done.returncode == 0, done.stderr
    data = json.loads(report.read_text())
    assert data["target"] == target and sum(data["fusions"].values()) == 9  # SwiGLU's 2 too
    # the 5 norms among them: norm_linear, which the target has no op for, is not a default here
    assert "norm_linear" not in data["families"] and sum(v for k, v in data["fusions"].items() if "Norm" in k) == 5
    domains = {n.domain for n in onnx.load(out).graph.node}
    assert "otfuse" not in domains and (("com.microsoft" in domains) == (target == "ort"))
    diffed = run_cli("diff", fixture_path("llama"), out, "--dims", "batch=2,seq=5", cwd=tmp_path, library=False)
    assert diffed.returncode == 0, diffed.stderr


def test_unknown_target_is_a_usage_error(tmp_path):
    done = run_cli(fixture_path("llama"), "-o", tmp_path / "o.onnx", "--target", "tvm", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_an_input_holding_otfuse_ops_the_target_cannot_express_exits_2(tmp_path):
    """A target model never needs otfuse's library: norm_linear's ops (no target maps them) in the
    input fail the run in one line, exit code 2, nothing written."""
    fused = tmp_path / "llama_nl.onnx"
    assert run_cli(fixture_path("llama"), "-o", fused, "--only", "norm,norm_linear", cwd=tmp_path).returncode == 0
    done = run_cli(fused, "-o", tmp_path / "out.onnx", "--target", "ort", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "must not need otfuse's library" in done.stderr
    assert "fuse the unfused model with --target ort instead" in done.stderr  # a default-fused model does this
    assert not (tmp_path / "out.onnx").exists()
