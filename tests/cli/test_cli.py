"""The otfuse command line, run as a real process (python -m otfuse.cli) and through click's
CliRunner: exit codes, exactly one stderr line per error, nothing left behind on failure."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from cli_runner import cli_runner
from fusions.norm.graphs import single_norm_model
from verify.test_diff import matmul_add_model, save

from otfuse import __version__, pipeline
from otfuse.cli import cli
from otfuse.errors import ModelLoadError
from otfuse.run.session import find_library

REPO = Path(__file__).resolve().parents[2]
HAVE_LIBRARY = find_library()[0] is not None


def run_cli(*args, cwd: Path) -> subprocess.CompletedProcess:
    # Same source tree as the in-process tests, whether or not the package is installed.
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    env.pop("OTFUSE_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "otfuse.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_one_error_line(stderr: str, contains: str = "", prefix: str = "otfuse: error: ") -> None:
    lines = stderr.splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith(prefix), stderr
    assert contains in lines[0], stderr
    assert "Traceback" not in stderr


@pytest.fixture
def norm_model(tmp_path) -> Path:
    return save(single_norm_model("rms", hidden=16), tmp_path / "model.onnx")


# --- fuse (the default command) ----------------------------------------------------------------


def test_fuse_is_the_default_command(tmp_path, norm_model):
    proc = run_cli("model.onnx", "-o", "model_fused.onnx", "--report", "report.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "RMSNorm" in proc.stdout and "nodes 7 -> 1" in proc.stdout
    fused = onnx.load(tmp_path / "model_fused.onnx")
    assert [n.op_type for n in fused.graph.node] == ["RMSNorm"]
    assert json.loads((tmp_path / "report.json").read_text())["fusions"] == {"RMSNorm": 1}


def test_explicit_fuse_subcommand_and_options_first(tmp_path, norm_model):
    result = cli_runner().invoke(cli, ["-o", str(tmp_path / "a.onnx"), str(norm_model), "--only", "norm"])
    assert result.exit_code == 0, result.output
    result = cli_runner().invoke(cli, ["fuse", str(norm_model), "-o", str(tmp_path / "b.onnx")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "a.onnx").exists() and (tmp_path / "b.onnx").exists()


def test_dry_run_writes_nothing(tmp_path, norm_model):
    result = cli_runner().invoke(cli, [str(norm_model)])
    assert result.exit_code == 0, result.output
    assert "dry run" in result.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx"]


def _write_bad_inputs(tmp_path: Path) -> dict[str, Path]:
    good = single_norm_model("rms", hidden=16)
    bad = {}
    bad["missing"] = tmp_path / "missing.onnx"
    bad["random bytes"] = tmp_path / "random.onnx"
    bad["random bytes"].write_bytes(np.random.default_rng(0).bytes(4096))
    bad["text file"] = tmp_path / "notes.onnx"
    bad["text file"].write_text("this is not a model\n")
    bad["truncated"] = tmp_path / "truncated.onnx"
    data = good.SerializeToString()
    bad["truncated"].write_bytes(data[: len(data) // 2])
    bad["external data missing"] = tmp_path / "ext.onnx"
    onnx.save(good, bad["external data missing"], save_as_external_data=True, location="ext.data", size_threshold=0)
    (tmp_path / "ext.data").unlink()
    bad["directory"] = tmp_path
    return bad


@pytest.mark.parametrize("case", ["missing", "random bytes", "text file", "truncated", "external data missing", "directory"])
def test_bad_input_model_is_one_line_exit_2(tmp_path, case):
    work = tmp_path / "work"
    work.mkdir()
    model = _write_bad_inputs(work)[case]
    before = sorted(p.name for p in work.iterdir())
    proc = run_cli(model, "-o", work / "out.onnx", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_one_error_line(proc.stderr)
    assert sorted(p.name for p in work.iterdir()) == before  # no output, no temp file


def _read_only_dir(tmp_path: Path) -> Path:
    if os.geteuid() == 0:  # root writes through permission bits; /proc is read-only for everyone
        return Path("/proc")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    return ro


@pytest.mark.parametrize("where", ["missing dir", "read-only dir"])
def test_unwritable_output_is_one_line_exit_2(tmp_path, norm_model, where):
    out_dir = tmp_path / "no" / "such" / "dir" if where == "missing dir" else _read_only_dir(tmp_path)
    proc = run_cli(norm_model, "-o", out_dir / "out.onnx", cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr)
    assert not (out_dir / "out.onnx").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "ro") == ["model.onnx"]


def test_nothing_to_fuse_exits_0_with_a_note(tmp_path):
    save(matmul_add_model(), tmp_path / "plain.onnx")
    proc = run_cli("plain.onnx", "-o", "out.onnx", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "note: no fusible subgraph found" in proc.stdout
    # pipeline contract: an unchanged copy is still written, so batch scripts get a model either way
    assert onnx.load(tmp_path / "out.onnx").graph == onnx.load(tmp_path / "plain.onnx").graph
    assert "total" in proc.stdout  # the summary (with near misses) is still shown


@pytest.mark.parametrize("args, message", [
    (["--only", "bogus"], "unknown family 'bogus'"),
    (["--skip", "norm,bogus"], "unknown family 'bogus'"),
    (["--no-such-option"], "No such option"),
    (["--verify"], "--verify needs -o"),
    (["-o", "x.onnx", "--verify", "--dims", "batch:2"], "bad --dims entry"),
])
def test_usage_errors_are_one_line(tmp_path, norm_model, args, message):
    result = cli_runner().invoke(cli, [str(norm_model), *args])
    assert result.exit_code == 2, result.output
    assert_one_error_line(result.stderr, message)
    assert not (tmp_path / "x.onnx").exists()


def test_otfuse_error_from_the_pipeline(tmp_path, norm_model, monkeypatch):
    def broken(*args, **kwargs):
        raise ModelLoadError("model.onnx: something the user can fix\nsecond line")

    monkeypatch.setattr(pipeline, "fuse", broken)
    result = cli_runner().invoke(cli, [str(norm_model), "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, "something the user can fix second line")


def test_unexpected_exception_is_internal_error_exit_3(tmp_path, norm_model, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(pipeline, "fuse", broken)
    monkeypatch.delenv("OTFUSE_DEBUG", raising=False)
    result = cli_runner().invoke(cli, [str(norm_model), "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 3
    assert result.stderr.strip() == (
        "otfuse: internal error: RuntimeError: boom (run with OTFUSE_DEBUG=1 for a traceback)")
    monkeypatch.setenv("OTFUSE_DEBUG", "1")
    result = cli_runner().invoke(cli, [str(norm_model), "-o", str(tmp_path / "o.onnx")])
    assert result.exit_code == 3 and "Traceback" in result.stderr


@pytest.mark.skipif(not HAVE_LIBRARY, reason="otfuse custom-op library not built")
def test_verify_passes_on_a_fused_norm(tmp_path, norm_model):
    proc = run_cli("model.onnx", "-o", "fused.onnx", "--verify", "--dims", "batch=2,seq=8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout


@pytest.mark.skipif(HAVE_LIBRARY, reason="checks the message shown while the library is missing")
def test_verify_without_library_says_so(tmp_path, norm_model):
    proc = run_cli("model.onnx", "-o", "fused.onnx", "--verify", cwd=tmp_path)
    assert proc.returncode == 2
    assert_one_error_line(proc.stderr, "custom-op library is not available")


# --- diff --------------------------------------------------------------------------------------


@pytest.fixture
def pair(tmp_path) -> tuple[Path, Path, Path]:
    a = save(matmul_add_model(), tmp_path / "a.onnx")
    same = save(matmul_add_model(), tmp_path / "same.onnx")
    perturbed = save(matmul_add_model(delta=0.5), tmp_path / "perturbed.onnx")
    return a, same, perturbed


def test_diff_identical_exit_0(tmp_path, pair):
    a, same, _ = pair
    proc = run_cli("diff", a, same, "--json", tmp_path / "d.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "FAIL" not in proc.stdout and proc.stderr == ""
    assert json.loads((tmp_path / "d.json").read_text())["ok"] is True


def test_diff_perturbed_exit_1_names_output(tmp_path, pair):
    a, _, perturbed = pair
    proc = run_cli("diff", a, perturbed, "--dims", "batch=2,seq=4", "--seed", "3", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL: outside tolerance: z, y" in proc.stdout
    assert proc.stderr == ""


def test_diff_tolerance_options(tmp_path, pair):
    a, _, perturbed = pair
    result = cli_runner().invoke(cli, ["diff", str(a), str(perturbed), "--atol", "1", "--rtol", "0"])
    assert result.exit_code == 0, result.output
    assert "1 / 0" not in result.stdout and "0 / 1" in result.stdout  # rtol / atol column


def test_diff_inputs_npz(tmp_path, pair):
    a, same, _ = pair
    np.savez(tmp_path / "good.npz", x=np.ones((1, 3, 8), np.float32))
    result = cli_runner().invoke(cli, ["diff", str(a), str(same), "--inputs", str(tmp_path / "good.npz")])
    assert result.exit_code == 0, result.output
    np.savez(tmp_path / "bad.npz", y=np.ones((1, 3, 8), np.float32))
    result = cli_runner().invoke(cli, ["diff", str(a), str(same), "--inputs", str(tmp_path / "bad.npz")])
    assert result.exit_code == 2
    assert_one_error_line(result.stderr, "lacks model input(s) x")


@pytest.mark.parametrize("case", ["mismatching inputs", "bad dims", "unknown dim", "missing model", "json dir"])
def test_diff_errors_exit_2(tmp_path, pair, case):
    a, same, _ = pair
    args = {
        "mismatching inputs": [a, save(matmul_add_model(input_name="h"), tmp_path / "h.onnx")],
        "bad dims": [a, same, "--dims", "batch=2;seq=4"],
        "unknown dim": [a, same, "--dims", "height=4"],
        "missing model": [a, tmp_path / "nope.onnx"],
        "json dir": [a, same, "--json", tmp_path / "nope" / "d.json"],
    }[case]
    proc = run_cli("diff", *args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_one_error_line(proc.stderr)
    assert not list(tmp_path.glob(".*otfuse-diff*"))


# --- info, help, version -----------------------------------------------------------------------


def test_help_version_info(tmp_path):
    proc = run_cli("--help", cwd=tmp_path)
    assert proc.returncode == 0
    for text in ("Examples:", "--only FAMILY", "--verify", "diff", "info", "otfuse model.onnx -o model_fused.onnx"):
        assert text in proc.stdout
    assert run_cli(cwd=tmp_path).stdout == proc.stdout  # no arguments: the same help, exit 0
    assert run_cli("--version", cwd=tmp_path).stdout.strip() == f"otfuse {__version__}"
    proc = run_cli("info", cwd=tmp_path)
    assert proc.returncode == 0 and "onnxruntime" in proc.stdout and "library" in proc.stdout
    assert ("loads        yes" in proc.stdout) == HAVE_LIBRARY
