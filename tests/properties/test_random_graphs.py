"""Property: on any small graph around a pattern, otfuse never writes a wrong or invalid model.

For random graphs of every family (tests/properties/generators.py: random spellings, sizes,
dtypes, mutations, extra consumers, interior values as graph outputs, swapped commutative inputs,
input dims rewritten), the CLI ``otfuse MODEL -o OUT`` exits 0, or 2 with one ``otfuse: error:``
line, and never 3 (an internal error); a written model that fused anything passes
``onnx.checker`` (full check) and reproduces the original's outputs in ONNX Runtime within the
per-dtype tolerance, on random inputs.

Seeds are fixed: ``OTFUSE_PROPERTY_EXAMPLES`` (per family, default 40) sets how many graphs,
``OTFUSE_PROPERTY_SEED`` (default 0) where the seeds start. A failure names the seed and the
knobs drawn; ``generate(family, seed)`` rebuilds that graph."""

from __future__ import annotations

import os

import onnx
import pytest

import otfuse
from otfuse.cli import main
from properties.generators import FAMILIES, generate

EXAMPLES = int(os.environ.get("OTFUSE_PROPERTY_EXAMPLES", "40"))
FIRST_SEED = int(os.environ.get("OTFUSE_PROPERTY_SEED", "0"))
SEEDS = range(FIRST_SEED, FIRST_SEED + EXAMPLES)


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exited:
        main(args)
    return exited.value.code, capsys.readouterr().err


def _checker_error(path) -> str | None:
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as e:
        return str(e).strip().splitlines()[0]
    return None


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_otfuse_never_writes_a_wrong_model(family, seed, tmp_path, capsys):
    case = generate(family, seed)
    where = f"seed {seed}, {case.describe()}"
    src, dst = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(case.model, src)
    standard = _checker_error(src) is None
    # The generator's own bar: a valid model, but for '-1' input dims (paddle2onnx), which the
    # checker's shape inference rejects and ONNX Runtime runs.
    assert standard or case.knobs["dims"] == "minus_one", (_checker_error(src), where)

    code, err = run_cli([str(src), "-o", str(dst), "--only", ",".join(case.only)], capsys)
    assert code in (0, 2), f"exit {code}: {err.strip()} ({where})"
    if code == 2:
        assert err.startswith("otfuse: error: ") and err.count("\n") == 1, (err, where)
        assert not dst.exists(), where
        return
    fused = onnx.load(dst)
    if not any(node.domain == "otfuse" for node in fused.graph.node):
        return
    if standard:
        assert _checker_error(dst) is None, (_checker_error(dst), where)
    result = otfuse.diff(src, dst, inputs=case.feeds)
    assert result.ok, ([row.to_dict() for row in result.outputs if not row.ok], where)
