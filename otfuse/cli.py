"""The ``otfuse`` command line: ``otfuse MODEL -o OUT`` fuses; ``diff`` and ``info`` are subcommands.

Exit codes: 0 success (also when nothing matched: a note says so and the output is an unchanged
copy), 1 ``diff``/``--verify`` found outputs outside tolerance (``--verify``: nothing is written),
2 a problem with the input or the command line (one line on stderr: ``otfuse: error: ...``),
3 an internal error (a bug in otfuse).
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from otfuse.domain import VERSION
from otfuse.errors import InternalError, OtfuseError

EXIT_MISMATCH = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3


def _families() -> list[str]:
    from otfuse.fusions import FAMILIES

    return list(FAMILIES)


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _debug() -> bool:
    return os.environ.get("OTFUSE_DEBUG", "") not in ("", "0")


class OtfuseGroup(click.Group):
    """A group whose default command is ``fuse`` and whose errors are single lines.

    ``otfuse model.onnx -o out.onnx`` is routed to ``otfuse fuse model.onnx -o out.onnx``: any
    first argument that is neither a subcommand nor a group option (--help, --version) starts a
    ``fuse`` command line.
    """

    default_command = "fuse"

    def parse_args(self, ctx, args):
        if not args:
            click.echo(ctx.get_help())
            ctx.exit(0)
        if args[0] not in self.commands and args[0] not in (*ctx.help_option_names, "--version"):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    def format_options(self, ctx, formatter):
        # The default command's options belong on the front page: most runs use only them.
        super().format_options(ctx, formatter)
        fuse_ctx = click.Context(self.commands[self.default_command], info_name=self.default_command, parent=ctx)
        rows = [p.get_help_record(fuse_ctx) for p in fuse_ctx.command.get_params(fuse_ctx)]
        with formatter.section("Fuse options (otfuse MODEL ...)"):
            formatter.write_dl([r for r in rows if r and not r[0].startswith("-h")])

    def main(self, args=None, prog_name="otfuse", **extra):
        extra.pop("standalone_mode", None)  # we always handle errors ourselves (CliRunner passes it)
        try:
            rv = super().main(args, prog_name=prog_name, standalone_mode=False, **extra)
            code = rv if isinstance(rv, int) else 0
        except click.exceptions.Exit as e:
            code = e.exit_code
        except click.ClickException as e:
            code = _error(e.format_message() + _usage_hint(e), EXIT_USAGE)
        except click.Abort:
            code = _error("interrupted", 130)
        except InternalError as e:
            if _debug():
                traceback.print_exc()
            print(f"otfuse: internal error: {_one_line(e)}", file=sys.stderr)
            code = EXIT_INTERNAL
        except OtfuseError as e:
            if _debug():
                traceback.print_exc()
            code = _error(str(e), EXIT_USAGE)
        except Exception as e:
            if _debug():
                traceback.print_exc()
            msg = f"{type(e).__name__}: {_one_line(e)} (run with OTFUSE_DEBUG=1 for a traceback)"
            print(f"otfuse: internal error: {_one_line(msg)}", file=sys.stderr)
            code = EXIT_INTERNAL
        sys.stdout.flush()
        sys.stderr.flush()  # a block-buffered stderr (a pipe, click 8.1's test runner) loses the line otherwise
        sys.exit(code)


def _error(message: str, code: int) -> int:
    print(f"otfuse: error: {_one_line(message)}", file=sys.stderr)
    return code


def _usage_hint(e: click.ClickException) -> str:
    ctx = getattr(e, "ctx", None)
    if isinstance(e, click.UsageError) and ctx is not None:
        return f" (see '{ctx.command_path} --help')"
    return ""


def _console() -> Console:
    # Pipes and CI logs get a wide fixed width so tensor names are not folded.
    columns = os.environ.get("COLUMNS", "")
    width = None if sys.stdout.isatty() else int(columns) if columns.isdigit() else 120
    return Console(width=width, highlight=False)


def _split_families(ctx, param, values) -> list[str] | None:
    names = [n.strip() for v in values for n in v.split(",") if n.strip()]
    known = _families()
    for name in names:
        if name not in known:
            raise click.BadParameter(f"unknown family '{name}' (choose from {', '.join(known)})", ctx, param)
    return names or None


def _dims_option(f):
    f = click.option("--seed", type=int, default=0, show_default=True, help="Seed for generated inputs.")(f)
    return click.option("--dims", metavar="NAME=INT,...",
                        help="Sizes for symbolic input dims, e.g. batch=2,seq=64 (defaults: batch=1, seq=16, others 1).")(f)


@click.group(
    cls=OtfuseGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="""\b
Examples:
  otfuse model.onnx -o model_fused.onnx            fuse everything fusible
  otfuse model.onnx -o out.onnx --only norm        fuse only normalisations
  otfuse model.onnx -o out.onnx --verify           fuse, then check outputs match
  otfuse model.onnx                                dry run: report what would be fused
  otfuse diff model.onnx out.onnx --dims batch=2,seq=64 --per-fusion
  otfuse diff model.onnx out.onnx --provider cann  fused model on the NPU (CANN EP), original on CPU
  otfuse info
  otfuse verify-ops --device npu model_fused.onnx  fused ops vs torch_npu on an Ascend NPU

Run a fused model with otfuse.InferenceSession (Python), which registers the custom-op library.
Exit codes: 0 ok (also when nothing matched), 1 outputs outside tolerance (--verify: nothing
written), 2 bad input or usage, 3 internal error.""",
)
@click.version_option(VERSION, "--version", prog_name="otfuse", message="%(prog)s %(version)s")
def cli():
    """Fuse transformer subgraphs of an exported ONNX model into otfuse custom ops.

    'otfuse MODEL -o OUT' is short for 'otfuse fuse MODEL -o OUT'; its options are listed below.
    Check the result with 'otfuse diff', which runs both models on the same inputs.
    """


@cli.command("fuse")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("-o", "--output", type=click.Path(path_type=Path),
              help="Where to write the fused model (atomically; external data is kept beside it). "
                   "Without -o nothing is written: a dry run that reports what would be fused.")
@click.option("--report", type=click.Path(path_type=Path), help="Write the fuse report (counts, near misses) as JSON.")
@click.option("--only", multiple=True, callback=_split_families, metavar="FAMILY",
              help=f"Fuse only these pattern families (repeatable or comma-separated): {', '.join(_families())}. "
                   "Default: all (with --target ort or onnx all but norm_linear, which they have no op for).")
@click.option("--skip", multiple=True, callback=_split_families, metavar="FAMILY",
              help="Do not fuse these families (--skip norm_linear: the projections stay MatMul / Gemm nodes).")
@click.option("--data", "data_mode", type=click.Choice(["copy", "link"]), default="copy", show_default=True,
              help="External data for an output in another folder: copy it (reflink or sparse copy) or "
                   "hard-link it (instant; onnx.load then refuses both models while the link exists).")
@click.option("--verify", is_flag=True, help="After fusing, compare the fused model with the original (as 'otfuse diff').")
@click.option("--target", type=click.Choice(["otfuse", "ort", "onnx"]), default="otfuse", show_default=True,
              help="Whose ops to write: otfuse's (run with the otfuse library), ONNX Runtime's contrib ops, or "
                   "standard ONNX opset-23 ops (both run in stock onnxruntime; sites they cannot express stay "
                   "as they were, listed as near misses).")
@_dims_option
@click.option("-v", "--verbose", is_flag=True, help="List the near misses.")
def fuse_command(model, output, report, only, skip, data_mode, verify, target, dims, seed, verbose):
    """Fuse MODEL and write the result to OUT (-o)."""
    from otfuse.pipeline import VerificationFailed, fuse
    from otfuse.run.feeds import parse_dims

    if verify and output is None:
        raise click.UsageError("--verify needs -o OUT (the model to verify)")
    dims = parse_dims(dims)  # before fusing: a typo should not cost a whole fuse
    console = _console()
    outcomes = []

    def verify_staged(original: Path, staged: Path) -> bool:
        # Runs on the staged file, before anything is renamed into place.
        from otfuse.verify.diff import diff

        outcomes.append(diff(original, staged, dims=dims, seed=seed))
        return outcomes[-1].ok

    try:
        result = fuse(model, output, only=only, skip=skip, report_path=report, data_mode=data_mode,
                      verify=verify_staged if verify else None, target=target)
    except VerificationFailed as e:
        _print_fuse_report(console, model, e.report, verbose)
        _print_diff(console, outcomes[-1])
        print(f"otfuse: error: {_one_line(e)}", file=sys.stderr)
        return EXIT_MISMATCH
    _print_fuse_report(console, model, result, verbose)
    if verify and outcomes:
        _print_diff(console, outcomes[-1])
    return 0


def _print_fuse_report(console: Console, model: Path, report, verbose: bool) -> None:
    target = report.output_path or "(dry run: nothing written; pass -o OUT)"
    console.print(f"{model} -> {target}", soft_wrap=True)
    table = Table()
    table.add_column("fused op" if report.target == "otfuse" else f"site (written in target {report.target})")
    table.add_column("count", justify="right")
    for op_type, count in sorted(report.fusions.items(), key=lambda kv: (-kv[1], kv[0])):
        table.add_row(op_type, str(count))
    table.add_section()
    table.add_row("total", str(sum(report.fusions.values())))
    console.print(table)
    for body, fused in report.bodies.items():  # counted in the table too
        ops = ", ".join(f"{count} {op}" for op, count in fused.items())
        console.print(f"in {body}: {ops}", soft_wrap=True, markup=False)
    misses = len(report.near_misses)
    hint = "" if verbose or not misses else " (-v lists them)"
    console.print(f"nodes {report.nodes_before} -> {report.nodes_after}, {report.seconds:.2f} s, "
                  f"{misses} near miss{'es' if misses != 1 else ''}{hint}")
    for note in report.notes:
        console.print(f"note: {note}", soft_wrap=True, markup=False)
    if verbose:
        for miss in report.near_misses:
            instead = f" (fused as {miss['fused_as']} instead)" if miss.get("fused_as") else ""
            console.print(f"  near miss: {miss.get('pattern')} at {miss.get('location')}: {miss.get('reason')}{instead}")


@cli.command("diff")
@click.argument("original", type=click.Path(path_type=Path))
@click.argument("fused", type=click.Path(path_type=Path))
@click.option("--inputs", type=click.Path(path_type=Path), help="Inputs as .npz (one array per graph input); default: generated.")
@_dims_option
@click.option("--rtol", type=float, help="Relative tolerance for every output (default: per dtype, docs/ops.md).")
@click.option("--atol", type=float, help="Absolute tolerance for every output (default: per dtype).")
@click.option("--per-fusion", is_flag=True, help="Also compare every fused node's outputs and name the first that diverges.")
@click.option("--json", "json_path", type=click.Path(path_type=Path), help="Write the result as JSON.")
@click.option("--provider", type=click.Choice(["cpu", "cann"]), default="cpu", show_default=True,
              help="Where FUSED runs: otfuse's CPU kernels, or the CANN EP with its Ascend kernels (falls back "
                   "to CPU with a warning when onnxruntime-cann, CANN or the NPU is missing). ORIGINAL runs on CPU.")
@click.option("--device-id", type=int, default=0, show_default=True, help="NPU index (--provider cann).")
@click.option("--ort-opt", "opt_level", type=click.Choice(["disabled", "basic", "extended", "all"]),
              default="disabled", show_default=True,
              help="ONNX Runtime's graph optimisation level, the same for both models.")
def diff_command(original, fused, inputs, dims, seed, rtol, atol, per_fusion, json_path, provider, device_id,
                 opt_level):
    """Run ORIGINAL and FUSED on the same inputs and compare the outputs.

    Both run at the same ORT graph optimisation level (--ort-opt; default: as written), so ORT's
    own rewrites cannot pass for otfuse's. An element passes when |fused - original| <= atol +
    rtol * |original|, with the tolerances of the type each output was computed in. Exit 0 when
    every output is within tolerance, 1 when one is not. Either may be the original, an otfuse
    model (run with the otfuse library) or an --target ort/onnx model (run in stock onnxruntime,
    as a model without otfuse ops always is).
    """
    import warnings

    from otfuse.run.feeds import parse_dims
    from otfuse.verify.diff import diff

    if json_path is not None and not json_path.parent.is_dir():
        raise OtfuseError(f"--json {json_path}: directory {json_path.parent} does not exist")
    providers = [("CANNExecutionProvider", {"device_id": device_id})] if provider == "cann" else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        outcome = diff(original, fused, inputs=inputs, dims=parse_dims(dims), rtol=rtol, atol=atol,
                       seed=seed, per_fusion=per_fusion, providers=providers, opt_level=opt_level)
    for w in caught:  # the CPU fallback of --provider cann: one line, before the tables
        print(f"otfuse: warning: {_one_line(w.message)}", file=sys.stderr)
    console = _console()
    if provider == "cann":
        console.print(f"fused model ran on: {', '.join(outcome.fused_providers)}", soft_wrap=True, markup=False)
    _print_diff(console, outcome, per_fusion=per_fusion)
    if json_path is not None:
        _write_json(json_path, outcome.to_dict())
    return 0 if outcome.ok else EXIT_MISMATCH


def _result(row) -> str:
    return "[green]PASS[/]" if row.ok else "[bold red]FAIL[/]"


def _outputs_table(rows) -> Table:
    table = Table(title="outputs (original vs fused)", title_justify="left")
    table.add_column("output", overflow="fold")  # never truncate a tensor name
    table.add_column("dtype")
    table.add_column("shape")
    for name in ("max abs", "max rel", "cosine", "rtol / atol", "bad elems"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("result")
    for r in rows:
        table.add_row(r.name, r.dtype, "x".join(map(str, r.shape)) or "scalar", f"{r.max_abs:.3g}",
                      f"{r.max_rel:.3g}", f"{r.cosine:.6f}", f"{r.rtol:g} / {r.atol:g}",
                      f"{r.mismatches}/{r.size}", _result(r))
    return table


def _fusions_table(rows) -> Table:
    # Lean: node names are long and the tolerances are those of the outputs table.
    table = Table(title="fused nodes, in graph order", title_justify="left")
    for name in ("fused node", "op", "tensor"):
        table.add_column(name, overflow="fold")
    for name in ("max abs", "max rel", "bad elems"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("result")
    for r in rows:
        table.add_row(r.node, r.op_type, r.name, f"{r.max_abs:.3g}", f"{r.max_rel:.3g}",
                      f"{r.mismatches}/{r.size}", _result(r))
    return table


def _print_diff(console: Console, outcome, per_fusion: bool = False) -> None:
    console.print(f"ORT graph optimisations: {outcome.opt_level} (both models)", soft_wrap=True, markup=False)
    console.print(_outputs_table(outcome.outputs))
    for r in outcome.outputs:
        if r.note:
            console.print(f"  {r.name}: {r.note}")
    if per_fusion:
        if outcome.fusions:
            console.print(_fusions_table(outcome.fusions))
        else:
            console.print("no otfuse nodes whose outputs the original also computes")
        if outcome.unmatched:
            console.print(f"not compared (the original has no tensor of that name): {', '.join(outcome.unmatched)}")
        first = outcome.first_divergence
        if first is not None:
            console.print(f"first divergence: node '{first.node}' ({first.op_type}), tensor '{first.name}'")
    if outcome.ok:
        console.print(f"PASS: all {len(outcome.outputs)} output(s) within tolerance")
    else:
        console.print(f"FAIL: outside tolerance: {', '.join(outcome.failing_outputs)}")


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise OtfuseError(f"cannot write {path}: {e.strerror or e}") from None


@cli.command("info")
def info_command():
    """Show versions and whether the custom-op library loads."""
    import onnx
    import onnxruntime

    from otfuse.run.session import library_status

    path, loads, message = library_status()
    console = _console()
    console.print(f"otfuse       {VERSION}")
    console.print(f"python       {sys.version.split()[0]}")
    console.print(f"onnx         {onnx.__version__}")
    console.print(f"onnxruntime  {onnxruntime.__version__} ({', '.join(onnxruntime.get_available_providers())})")
    console.print(f"library      {path or 'not found'}")
    console.print(f"loads        {'yes' if loads else 'no'}{'' if loads else ': ' + message}")
    if loads:
        from otfuse.run.library import describe_isa, isa_report

        console.print(f"kernels      {describe_isa(isa_report(path))}", soft_wrap=True, markup=False)
    from otfuse.run.ascend import backends

    console.print("backends:")
    for backend in backends():
        line = f"  {backend.name:<17} {'yes' if backend.available else 'no ':<4} {backend.detail}"
        console.print(line, soft_wrap=True, markup=False)


@cli.command("verify-ops")
@click.argument("model", type=click.Path(path_type=Path))
@click.option("--device", type=click.Choice(["npu"]), required=True,
              help="Where to run each fused op's vendor counterpart (npu: torch_npu on an Ascend NPU).")
@click.option("--device-id", type=int, default=0, show_default=True, help="NPU index.")
@_dims_option
def verify_ops_command(model, device, device_id, dims, seed):
    """Run every fused op of MODEL on the device (torch_npu) and on otfuse's CPU kernels.

    Inputs are random, with the shapes MODEL really produces (one CPU run, sizes from --dims).
    Exit 0 when all match (or when torch_npu is not installed: nothing to check here), 1 when
    one does not.
    """
    from rich.markup import escape

    from otfuse.run.feeds import parse_dims
    from otfuse.verify.ops_on_npu import DeviceUnavailable, verify_ops

    console = _console()
    try:
        checks = verify_ops(model, dims=parse_dims(dims), seed=seed, device_id=device_id)
    except DeviceUnavailable as e:
        console.print(f"skipped: {e}", soft_wrap=True, markup=False)
        return 0
    table = Table(title=f"{model}: fused ops on {device} vs otfuse CPU kernels", title_justify="left")
    for name in ("op", "nodes", "inputs", "output", "max abs", "max rel", "bad elems", "result"):
        table.add_column(name, overflow="fold")
    for check in checks:
        case = check.case
        nodes = escape(f"{len(case.nodes)} ({case.nodes[0]}{', ...' if len(case.nodes) > 1 else ''})")
        inputs = escape(case.describe())
        if check.error:
            error = f"[bold red]ERROR[/] {escape(check.error)}"
            table.add_row(case.op, nodes, inputs, "-", "-", "-", "-", error)
        for i, r in enumerate(check.outputs):
            first = (case.op, nodes, inputs) if i == 0 else ("", "", "")
            table.add_row(*first, r.name, f"{r.max_abs:.3g}", f"{r.max_rel:.3g}", f"{r.mismatches}/{r.size}", _result(r))
    console.print(table)
    bad = [c for c in checks if not c.ok]
    console.print(f"{'FAIL' if bad else 'PASS'}: {len(checks) - len(bad)}/{len(checks)} distinct op(s) match")
    return EXIT_MISMATCH if bad else 0


def main(args=None):
    cli.main(args, prog_name="otfuse")


if __name__ == "__main__":
    main()
