"""``otfuse.fuse``: load -> canonicalise -> fuse families -> lower -> fuse bodies -> validate -> stage
-> verify -> commit.

Each selected family (``otfuse/fusions/``, in registry order) runs its passes; before them, the
canonicalisers it needs that have not run yet (``Family.canonicalise``, ``otfuse/canonicalise/``).
Then the same families and lowering run on every control-flow body (``otfuse/control_flow.py``).
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import onnx

from otfuse.control_flow import fuse_bodies
from otfuse.domain import OP_DOMAIN, VERSION
from otfuse.errors import OtfuseError, OutputWriteError
from otfuse.fusions import FAMILIES, select_families
from otfuse.rewriter.graph import forget_indexes
from otfuse.rewriter.model_io import LoadedModel, load_model, read_paths, stage_model
from otfuse.rewriter.output_paths import StagedFiles, check_disjoint
from otfuse.rewriter.passes import unique_sites
from otfuse.rewriter.sites import unfused_sites
from otfuse.targets.lowering import TARGETS, Ledger, lower, writes
from otfuse.verify.validation import validate_fused


@dataclass
class FuseReport:
    input_path: str
    output_path: str | None
    families: list[str]
    nodes_before: int  # every graph's nodes, control-flow bodies included
    nodes_after: int
    fusions: dict[str, int]
    seconds: float
    near_misses: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what the user should know (nothing fused, ...)
    otfuse_version: str = VERSION
    target: str = "otfuse"  # whose ops the fused sites are written in (otfuse/targets/)
    target_ops: dict[str, int] = field(default_factory=dict)  # ort/onnx: "domain.op" -> nodes written
    # Control-flow bodies: "If 'name' then_branch" -> fused ops there (also counted in ``fusions``).
    bodies: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def fused_count(self) -> int:
        return sum(self.fusions.values())

    def to_dict(self) -> dict:
        return asdict(self)


def fuse(model_path: str | os.PathLike, output_path: str | os.PathLike | None = None, *,
         only=None, skip=None, report_path: str | os.PathLike | None = None,
         data_mode: str = "copy", verify: Callable[[Path, Path], bool] | None = None,
         target: str = "otfuse") -> FuseReport:
    """Fuse the enabled pattern families of ``model_path``; write ``output_path`` and ``report_path``.

    All outputs are written, or none: each is staged under a temporary name beside its final
    path, ``verify(original, staged_model)`` (if given) runs on the staged model, and only then are
    they renamed into place. A failed ``verify`` raises ``VerificationFailed`` and leaves nothing.
    No path written may be a path read (the input or its data files), through links and ``..``.
    ``data_mode`` says how external data reaches an output in another folder: ``copy`` (reflink
    or sparse copy) or ``link`` (hard link). When nothing matched, the report says so in
    ``notes`` and an unchanged copy is still written (if an output was asked for).
    ``target``: ``otfuse`` (our ops), ``ort`` (ONNX Runtime's contrib ops) or ``onnx`` (standard
    opset-23 ops): the same analysis, each site then written in the target's ops where they compute
    exactly what it does, else left as the original wrote it (a near miss says why; otfuse/targets/).
    Without ``only``, a family the target has no op for (norm_linear under ort and onnx) does not run.
    Raises ``OtfuseError`` subclasses for bad input.
    """
    start = time.perf_counter()
    if target not in TARGETS:
        raise OtfuseError(f"unknown target {target!r} (known: {', '.join(TARGETS)})")
    try:  # by default, only the families whose ops the target writes
        families = select_families(only, skip, writable=lambda family: writes(target, family.emits))
    except ValueError as exc:
        raise OtfuseError(str(exc)) from None
    loaded = load_model(model_path)
    _check_output_paths(loaded, output_path, report_path)
    model = loaded.model  # our in-memory copy: the input file is never touched
    nodes_before = _node_count(model.graph)

    ledger = Ledger(model) if target != "otfuse" else None
    fusions, near_misses = fuse_families(model, families, loaded.base_dir,
                                         after_family=ledger.record if ledger else None)
    target_ops: dict[str, int] = {}
    notes: list[str] = []
    # An input already holding otfuse ops is lowered too: a target model never needs our library.
    if ledger is not None and (fusions or _fused_op_census(model)):
        lowered = lower(model, target, loaded.base_dir, lambda: load_model(model_path).model, ledger)
        fusions, target_ops = lowered.sites, dict(sorted(lowered.target_ops.items()))
        near_misses += lowered.near_misses
        if not fusions:  # every site went back: write the input as it was, not a reassembled copy
            model.CopyFrom(load_model(model_path).model)
            notes.append(f"no fused site is expressible in target {target} (the near misses say why)")

    inside = fuse_bodies(model, families, loaded.base_dir, fuse_families, target)
    fusions, near_misses = fusions + inside.fusions, near_misses + inside.near_misses
    for op, count in inside.target_ops.items():
        target_ops[op] = target_ops.get(op, 0) + count
    target_ops = dict(sorted(target_ops.items()))
    if inside.fusions:  # the main graph's sites all went back, but some in a body did not
        notes = [note for note in notes if not note.startswith("no fused site is expressible")]
    elif not fusions and not notes and any(m["pattern"].endswith(f"(target {target})") for m in inside.near_misses):
        notes.append(f"no fused site is expressible in target {target} (the near misses say why)")

    if fusions:
        _record_otfuse_version(model)
        notes += validate_fused(model, loaded, ort_ops=target == "ort")
    else:
        copy_note = "; the output is an unchanged copy" if output_path is not None else ""
        notes.append(f"no fusible subgraph found{copy_note}" if not notes else f"{notes.pop()}{copy_note}")
    report = FuseReport(
        input_path=str(model_path),
        output_path=str(output_path) if output_path is not None else None,
        families=families,
        nodes_before=nodes_before,
        nodes_after=_node_count(model.graph),
        fusions=dict(sorted(fusions.items())),
        seconds=0.0,
        near_misses=near_misses,
        notes=notes,
        target=target,
        target_ops=target_ops,
        bodies=inside.by_body,
    )
    _write_outputs(loaded, model, report, output_path, report_path, data_mode, verify, start)
    return report


class VerificationFailed(OtfuseError):
    """``verify`` rejected the fused model; nothing was written."""


def _check_output_paths(loaded: LoadedModel, output_path, report_path) -> None:
    written: dict[str, Path] = {}
    if output_path is not None:
        output_path = Path(output_path)
        written["output model"] = output_path
        out_dir = output_path.parent if str(output_path.parent) else Path(".")
        if out_dir.is_dir() and out_dir.resolve() != loaded.base_dir.resolve():
            written.update({f"copy of the data file {location!r}": out_dir / location
                            for location in sorted(loaded.external_files)})
    if report_path is not None:
        written["report"] = Path(report_path)
    for role in ("output model", "report"):
        path = written.get(role)
        if path is not None and str(path.parent) and not path.parent.is_dir():  # fail before fusing
            raise OutputWriteError(f"cannot write the {role} {str(path)!r}: its folder does not exist")
    check_disjoint(written, read_paths(loaded))


def _write_outputs(loaded: LoadedModel, model: onnx.ModelProto, report: FuseReport, output_path,
                   report_path, data_mode: str, verify, start: float) -> None:
    staged = StagedFiles()
    try:
        staged_model = None
        if output_path is not None:
            staged_model = stage_model(loaded, model, output_path, staged, data_mode)
        if verify is not None and staged_model is not None and report.fusions:
            if not verify(loaded.path, staged_model):
                failure = VerificationFailed(
                    "the fused model's outputs differ from the original's; nothing was written")
                failure.report = report
                raise failure
        report.seconds = round(time.perf_counter() - start, 4)
        if report_path is not None:
            staged.stage(Path(report_path), report_json(report).encode())
        staged.commit()
    except BaseException:
        staged.abort()
        raise


def fuse_families(model: onnx.ModelProto, families: list[str], base_dir: Path | None,
                  after_family: Callable[[str, onnx.ModelProto], None] | None = None) -> tuple[Counter, list[dict]]:
    """Canonicalise and fuse ``model`` in place with ``families`` (names, in the order given):
    (the otfuse ops it gained, the near misses tagged with their family). ``after_family(name,
    model)`` sees the graph after each family (a target's ledger of what later folds absorb)."""
    already_fused = _fused_op_census(model)
    found = []
    canonicalised: list = []
    try:
        for name in families:
            family = FAMILIES[name]
            # A canonicaliser runs once, before the first family that needs it: shape_reads must see
            # the rotations the rope family fused (it reads Shape through them).
            steps = [step for step in family.canonicalise if step not in canonicalised] + list(family.passes)
            canonicalised += family.canonicalise
            for step in steps:
                result = step.run(model, base_dir)
                found += [(name, miss) for miss in result.near_misses]
            if after_family is not None:
                after_family(name, model)
    finally:
        forget_indexes()  # the passes share an index while the graph is unchanged; not beyond
    final_nodes = {node.name for node in model.graph.node}
    near_misses = [dict(miss.to_dict(), family=family) for family, miss in unique_sites(found, final_nodes)]
    reported = {name for _, miss in found for name in miss.nodes} | {miss.location for _, miss in found}
    signatures = [(name, signature) for name in families for signature in FAMILIES[name].sites]
    near_misses += unfused_sites(model, signatures, reported)
    # Counted on the result: a later pass may absorb what an earlier one fused (RoPE into attention).
    return _fused_op_census(model) - already_fused, near_misses


def _fused_op_census(model: onnx.ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node if node.domain == OP_DOMAIN)


def _node_count(graph: onnx.GraphProto) -> int:
    return len(graph.node) + sum(_node_count(sub) for node in graph.node for a in node.attribute
                                 for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else a.graphs))


def _record_otfuse_version(model: onnx.ModelProto) -> None:
    # The passes already import the otfuse domain; record which otfuse wrote the model.
    if not any(p.key == "otfuse.version" for p in model.metadata_props):
        model.metadata_props.append(onnx.StringStringEntryProto(key="otfuse.version", value=VERSION))


def report_json(report: FuseReport) -> str:
    return json.dumps(report.to_dict(), indent=2) + "\n"


def write_report(report: FuseReport, report_path: str | os.PathLike) -> None:
    staged = StagedFiles()
    staged.stage(Path(report_path), report_json(report).encode())
    staged.commit()
