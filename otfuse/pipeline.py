"""``otfuse.fuse``: load -> canonicalise -> match -> rewrite -> save -> validate."""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from otfuse import OP_DOMAIN, __version__
from otfuse.errors import ModelLoadError, NothingToFuse, OtfuseError, OutputWriteError
from otfuse.patterns import FAMILIES, select_families
from otfuse.rewriter.model_io import check_model, load_model, save_model
from otfuse.rewriter.passes import unique_sites


@dataclass
class FuseReport:
    input_path: str
    output_path: str | None
    families: list[str]
    nodes_before: int
    nodes_after: int
    fusions: dict[str, int]
    seconds: float
    near_misses: list[dict] = field(default_factory=list)
    otfuse_version: str = __version__

    @property
    def fused_count(self) -> int:
        return sum(self.fusions.values())

    def to_dict(self) -> dict:
        return asdict(self)


def fuse(model_path: str | os.PathLike, output_path: str | os.PathLike | None = None, *,
         only=None, skip=None, report_path: str | os.PathLike | None = None,
         data_mode: str = "copy") -> FuseReport:
    """Fuse the enabled pattern families of ``model_path``; write ``output_path`` atomically.

    ``data_mode`` says how external data reaches an output in another folder: ``copy``
    (reflink or sparse copy) or ``link`` (hard link). Raises ``OtfuseError`` subclasses for bad input. When nothing matched, an unchanged copy is
    still written (if an output was asked for) and ``NothingToFuse`` is raised, carrying the
    report as ``.report``.
    """
    start = time.perf_counter()
    try:
        families = select_families(only, skip)
    except ValueError as exc:
        raise OtfuseError(str(exc)) from None
    loaded = load_model(model_path)
    model = loaded.model  # our in-memory copy: the input file is never touched
    nodes_before = len(model.graph.node)

    already_fused = _fused_op_census(model)
    found = []
    for family in families:
        for family_pass in FAMILIES[family]:
            result = family_pass.run(model, loaded.base_dir)
            found += [(family, miss) for miss in result.near_misses]
    final_nodes = {node.name for node in model.graph.node}
    near_misses = [dict(miss.to_dict(), family=family) for family, miss in unique_sites(found, final_nodes)]
    # Counted on the result: a later pass may absorb what an earlier one fused (RoPE into attention).
    fusions = _fused_op_census(model) - already_fused

    if fusions:
        _record_otfuse_version(model)
        _validate(model, loaded.base_dir)
    report = FuseReport(
        input_path=str(model_path),
        output_path=str(output_path) if output_path is not None else None,
        families=families,
        nodes_before=nodes_before,
        nodes_after=len(model.graph.node),
        fusions=dict(sorted(fusions.items())),
        seconds=0.0,
        near_misses=near_misses,
    )
    if output_path is not None:
        save_model(loaded, model, output_path, data_mode)
    report.seconds = round(time.perf_counter() - start, 4)
    if report_path is not None:
        write_report(report, report_path)
    if not fusions:
        copy_note = f"; wrote an unchanged copy to {str(output_path)!r}" if output_path else ""
        error = NothingToFuse(f"no fusible subgraph found in {str(model_path)!r}{copy_note}")
        error.report = report
        raise error
    return report


def _fused_op_census(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node if node.domain == OP_DOMAIN)


def _record_otfuse_version(model: onnx.ModelProto) -> None:
    # The passes already import the otfuse domain; record which otfuse wrote the model.
    if not any(p.key == "otfuse.version" for p in model.metadata_props):
        model.metadata_props.append(onnx.StringStringEntryProto(key="otfuse.version", value=__version__))


def _validate(model: onnx.ModelProto, base_dir: Path) -> None:
    """A rewrite that produces an invalid model is our bug: refuse to write it."""
    try:
        check_model(model, base_dir)  # external data resolves against the model's folder, not the cwd
    except (onnx.checker.ValidationError, ModelLoadError) as exc:
        first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else "invalid model"
        raise OtfuseError(f"internal error: the fused model fails onnx.checker ({first_line}); "
                          "nothing was written") from None


def write_report(report: FuseReport, report_path: str | os.PathLike) -> None:
    path = Path(report_path)
    folder = path.parent if str(path.parent) else Path(".")
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "w") as handle:
            json.dump(report.to_dict(), handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except OSError as exc:
        raise OutputWriteError(f"cannot write the report {str(path)!r}: {exc.strerror or exc}") from None
