"""What otfuse writes never lands on what it reads, and is written all together or not at all
(issue 11, items 5-7): the input's data file named as the output, through symlinks, hard links and
``..``; the report on the input or the output; an unwritable report; a failed --verify."""

from __future__ import annotations

import os

import onnx
import pytest
from cli.test_cli import assert_one_error_line, run_cli
from rewriter.test_model_io import DATA, external_model, snapshot  # noqa: F401 - the fixture

import otfuse
from otfuse.errors import OutputWriteError
from otfuse.pipeline import VerificationFailed


def _outputs_that_hit_the_input(model_path, data_path, tmp_path):
    link_dir = tmp_path / "links"
    link_dir.mkdir()
    (link_dir / "to_model.onnx").symlink_to(model_path)
    (link_dir / "to_data").symlink_to(data_path)
    os.link(data_path, link_dir / "hard_data")
    return {
        "the data file": data_path,
        "the data file via ..": model_path.parent / "sub" / ".." / DATA,
        "a symlink to the model": link_dir / "to_model.onnx",
        "a symlink to the data file": link_dir / "to_data",
        "a hard link of the data file": link_dir / "hard_data",
    }


@pytest.mark.parametrize("target", ["the data file", "the data file via ..", "a symlink to the model",
                                    "a symlink to the data file", "a hard link of the data file"])
def test_an_output_on_the_input_is_refused_and_the_input_kept(tmp_path, external_model, target):
    model_path, data_path, _ = external_model
    (model_path.parent / "sub").mkdir()
    output = _outputs_that_hit_the_input(model_path, data_path, tmp_path)[target]
    before = snapshot(model_path, data_path)
    proc = run_cli(model_path, "-o", output, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_one_error_line(proc.stderr, "never overwrites what it reads")
    assert snapshot(model_path, data_path) == before


@pytest.mark.parametrize("report", ["input", "output", "data"])
def test_a_report_on_the_input_or_the_output_is_refused(tmp_path, external_model, report):
    model_path, data_path, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    output = out_dir / "fused.onnx"
    report_path = {"input": model_path, "output": output, "data": data_path}[report]
    before = snapshot(model_path, data_path)
    with pytest.raises(OutputWriteError):
        otfuse.fuse(model_path, output, report_path=report_path)
    assert snapshot(model_path, data_path) == before
    assert list(out_dir.iterdir()) == []


def test_an_unwritable_report_writes_no_model(tmp_path, external_model):
    model_path, _, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    proc = run_cli(model_path, "-o", out_dir / "fused.onnx", "--report", tmp_path / "no" / "dir" / "r.json",
                   cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert_one_error_line(proc.stderr, "r.json")
    assert list(out_dir.iterdir()) == []  # neither the model nor the copied data file


def test_verify_runs_on_the_staged_model_and_a_failure_writes_nothing(tmp_path, external_model):
    model_path, _, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    seen = []

    def reject(original, staged):
        # The staged model is complete and loadable (its data file already beside it).
        onnx.load(staged, load_external_data=True)
        seen.append(staged)
        return False

    with pytest.raises(VerificationFailed):
        otfuse.fuse(model_path, out_dir / "fused.onnx", report_path=out_dir / "r.json", verify=reject)
    assert seen and seen[0].parent == out_dir and seen[0].name != "fused.onnx"
    assert list(out_dir.iterdir()) == []


def test_verify_that_passes_writes_model_and_report(tmp_path, external_model):
    model_path, _, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    report = otfuse.fuse(model_path, out_dir / "fused.onnx", report_path=out_dir / "r.json",
                         verify=lambda original, staged: True)
    assert report.fusions
    assert sorted(p.name for p in out_dir.iterdir()) == sorted(["fused.onnx", "r.json", DATA])


def test_cli_verify_failure_exits_1_and_writes_nothing(tmp_path, external_model, monkeypatch):
    """The CLI's --verify on a real diff that fails: the tolerance is forced to zero on a
    fusion that reorders float sums, so the diff really finds a difference."""
    from cli_runner import cli_runner

    from otfuse.verify import diff as compare
    from otfuse.cli import cli

    model_path, _, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    real_diff = compare.diff
    monkeypatch.setattr(compare, "diff", lambda *a, **k: real_diff(*a, **dict(k, rtol=0.0, atol=0.0)))
    result = cli_runner().invoke(cli, [str(model_path), "-o", str(out_dir / "fused.onnx"), "--verify",
                                      "--report", str(out_dir / "r.json")])
    if result.exit_code == 0:
        pytest.skip("the fused kernels happen to be bit-identical to ORT here")
    assert result.exit_code == 1, result.output
    assert "nothing was written" in result.stdout + result.stderr  # click 8.2+ also mixes stderr into .output
    assert list(out_dir.iterdir()) == []
