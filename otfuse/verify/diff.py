"""``otfuse diff``: run the original (as written) and the fused model on the same inputs and
compare every output, optionally every fused node's outputs too, to name the first fusion that
changed the numbers.

An element passes when ``|fused - original| <= atol + rtol * |original|``; NaNs must be at the
same positions and infinities must match exactly. Default tolerances per output dtype come from
docs/ops.md; integer and bool outputs must match exactly unless a tolerance is given.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import tempfile
import warnings
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx

from otfuse.domain import OP_DOMAIN
from otfuse.errors import ModelLoadError, OtfuseError
from otfuse.rewriter.graph import GraphIndex
from otfuse.rewriter.model_io import LoadedModel, load_model
from otfuse.run.feeds import check_feeds, input_specs, load_feeds, make_feeds
from otfuse.run.session import open_session, run, session_options
from otfuse.verify.interface import check_same_interface

# docs/ops.md "Numerical tolerances used by otfuse diff": (rtol, atol). Keep the two in sync
# (tests/verify/test_diff.py checks).
TOLERANCES = {
    "float32": (1e-4, 1e-4),
    "float16": (1e-2, 1e-2),
    "bfloat16": (5e-2, 5e-2),
}
# Not in the table: float64 is computed by stock ORT ops on both sides, so float32's bound is ample.
_FALLBACK_FLOAT = TOLERANCES["float32"]


@dataclass
class TensorDiff:
    """How one tensor differs. ``node``/``op_type`` are set for per-fusion rows."""

    name: str
    dtype: str
    shape: list
    max_abs: float
    max_rel: float
    cosine: float
    rtol: float
    atol: float
    mismatches: int  # elements outside tolerance (NaN-position mismatches included)
    size: int
    ok: bool
    note: str = ""
    node: str | None = None
    op_type: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass
class DiffResult:
    outputs: list[TensorDiff]
    fusions: list[TensorDiff] = field(default_factory=list)
    inputs: dict[str, str] = field(default_factory=dict)  # name -> "float32[1,16]"
    seed: int = 0
    # Outputs of fused nodes the original does not compute under that name (not compared).
    unmatched: list[str] = field(default_factory=list)
    # The execution providers of the fused model's session (the original always runs on CPU).
    fused_providers: list[str] = field(default_factory=list)
    opt_level: str = "disabled"  # ORT's graph optimisation level, the same for both models
    # The branch-selector settings run besides the generated inputs ("use_cache_branch=False");
    # their rows are named "<output> [<setting>]".
    branches: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(row.ok for row in self.outputs)

    @property
    def first_divergence(self) -> TensorDiff | None:
        """The first fused node (graph order) whose output is outside tolerance."""
        return next((row for row in self.fusions if not row.ok), None)

    @property
    def failing_outputs(self) -> list[str]:
        return [row.name for row in self.outputs if not row.ok]

    def to_dict(self) -> dict:
        first = self.first_divergence
        return {
            "ok": self.ok,
            "seed": self.seed,
            "inputs": self.inputs,
            "outputs": [row.to_dict() for row in self.outputs],
            "fusions": [row.to_dict() for row in self.fusions],
            "first_divergence": first.to_dict() if first else None,
            "unmatched": self.unmatched,
            "fused_providers": self.fused_providers,
            "ort_opt_level": self.opt_level,
            "branches": self.branches,
        }


def tolerance_for(dtype: np.dtype, rtol: float | None = None, atol: float | None = None) -> tuple[float, float]:
    """(rtol, atol): the user's when given, else the docs/ops.md default for the dtype."""
    dtype = np.dtype(dtype)
    if dtype.name in TOLERANCES:
        default = TOLERANCES[dtype.name]
    elif dtype.kind == "f":
        default = _FALLBACK_FLOAT
    else:
        default = (0.0, 0.0)  # integers, bools: exact
    return (default[0] if rtol is None else rtol, default[1] if atol is None else atol)


def compare_arrays(name: str, original: np.ndarray, fused: np.ndarray, rtol: float, atol: float) -> TensorDiff:
    dtype = np.dtype(original.dtype).name
    if original.shape != fused.shape or original.dtype != fused.dtype:
        return TensorDiff(name, dtype, list(fused.shape), float("inf"), float("inf"), 0.0, rtol, atol,
                          max(original.size, fused.size), original.size, False,
                          note=f"original is {dtype}{list(original.shape)}, fused is {fused.dtype.name}{list(fused.shape)}")
    if original.dtype == np.bool_ or original.dtype.kind in "OSU":
        o, f = original, fused
        same = o == f
        o = o.astype(np.float64) if o.dtype == np.bool_ else np.zeros(o.shape)
        f = f.astype(np.float64) if f.dtype == np.bool_ else (~same).astype(np.float64)
    else:
        o, f = original.astype(np.float64), fused.astype(np.float64)
        both_nan = np.isnan(o) & np.isnan(f)
        with np.errstate(invalid="ignore", over="ignore"):
            same = (o == f) | both_nan  # covers equal infinities, which a subtraction turns into NaN
            err = np.abs(f - o)
            # Finite errors only: for o=inf, f=-inf the bound atol + rtol*|o| is inf too.
            close = np.isfinite(err) & (err <= atol + rtol * np.abs(o))
        same = same | close
    mismatches = int(same.size - np.count_nonzero(same))

    finite = np.isfinite(o) & np.isfinite(f)
    err = np.abs(f[finite] - o[finite])
    max_abs = float(err.max()) if err.size else 0.0
    # Relative error where |original| > atol, so values near zero do not blow it up.
    ref = np.abs(o[finite])
    significant = ref > max(atol, np.finfo(np.float64).tiny)
    max_rel = float((err[significant] / ref[significant]).max()) if np.any(significant) else 0.0
    if not np.all(finite):
        non_finite = np.count_nonzero(~finite)
        note = f"{non_finite} non-finite element(s)"
    else:
        note = ""
    return TensorDiff(name, dtype, list(fused.shape), max_abs, max_rel, _cosine(o[finite], f[finite]),
                      rtol, atol, mismatches, int(same.size), mismatches == 0, note=note)


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    if na == 0 and nb == 0:
        return 1.0
    if na == 0 or nb == 0:
        return 0.0
    return float(np.dot(a.ravel(), b.ravel()) / (na * nb))


def diff(original, fused, *, inputs=None, dims=None, rtol=None, atol=None, seed=0, per_fusion=False,
         providers=None, opt_level: str = "disabled") -> DiffResult:
    """Compare ``fused`` against ``original`` (paths). ``inputs``: an .npz path, a dict of arrays,
    or None to generate them (``dims``, ``seed``; see ``otfuse.run.feeds``).

    Both models run at ONNX Runtime's graph optimisation level ``opt_level`` (``disabled``,
    ``basic``, ``extended``, ``all``; default: as written), so ORT's own rewrites apply to both
    sides or to neither. The default tolerance of an output is that of the type its value was
    computed in: a float32 output Cast from float16 (onnxconverter-common's ``keep_io_types``)
    is judged as float16.

    ``providers``: where the fused model runs (the original always runs on CPU, as written):
    None or "cpu" (otfuse's CPU kernels); "cann" (``otfuse.ascend_ep.create_session``: the CANN EP
    with otfuse's Ascend kernels, or its CPU fallback with a warning when onnxruntime-cann, CANN or
    the NPU is missing); or a list of ONNX Runtime providers, names or (name, options), where a
    leading ``CANNExecutionProvider`` goes through ``create_session`` with its options."""
    orig_loaded, fused_loaded = load_model(original), load_model(fused)  # weights stay on disk
    orig_model, fused_model = orig_loaded.model, fused_loaded.model
    check_same_interface(orig_model, fused_model)

    specs = input_specs(orig_model)
    if inputs is None:
        feeds = make_feeds(orig_model, dims=dims, seed=seed)
    elif isinstance(inputs, (str, os.PathLike)):
        feeds = load_feeds(inputs, specs)
    else:
        feeds = check_feeds(dict(inputs), specs)
    described = {k: f"{np.dtype(v.dtype).name}{list(v.shape)}" for k, v in feeds.items()}
    # Generated inputs take each control-flow branch a selector input picks (a merged decoder's
    # use_cache_branch): one run as generated, one per selector flipped.
    settings = [("", feeds)] + (branch_settings(orig_model, feeds) if inputs is None else [])

    output_names = [o.name for o in orig_model.graph.output]
    probes, unmatched = _fused_tensors(fused_model, orig_model) if per_fusion else ([], [])
    extra = [t for _, _, t in probes if t not in output_names]
    computed_in = _computed_types(orig_model, orig_loaded.base_dir)
    outputs, fusions, fused_providers = [], [], []
    with with_outputs(orig_loaded, extra) as orig_path, with_outputs(fused_loaded, extra) as fused_path:
        for setting, these in settings:
            got_orig, _ = _run(orig_path, original, these, output_names + extra, opt_level=opt_level,
                               library=uses_otfuse_ops(orig_model))
            got_fused, fused_providers = _run(fused_path, fused, these, output_names + extra, opt_level=opt_level,
                                              providers=providers, library=uses_otfuse_ops(fused_model))

            def row(name, **where):
                dtype = computed_in.get(name, got_orig[name].dtype)
                r, a = tolerance_for(dtype if got_orig[name].dtype.kind == "f" else got_orig[name].dtype, rtol, atol)
                shown = f"{name} [{setting}]" if setting else name
                return replace(compare_arrays(shown, got_orig[name], got_fused[name], r, a), **where)

            outputs += [row(name) for name in output_names]
            fusions += [row(tensor, node=node, op_type=op) for node, op, tensor in probes]
    return DiffResult(outputs=outputs, fusions=fusions, inputs=described, seed=seed, unmatched=unmatched,
                      fused_providers=fused_providers, opt_level=opt_level,
                      branches=[setting for setting, _ in settings[1:]])


def branch_selectors(model: onnx.ModelProto) -> list[str]:
    """The boolean graph inputs that are an ``If``'s condition as they are (optimum's
    ``use_cache_branch``): which branch runs is the caller's choice."""
    bools = {vi.name for vi in model.graph.input if vi.type.tensor_type.elem_type == onnx.TensorProto.BOOL}
    found = []
    for node in model.graph.node:
        if node.op_type == "If" and node.input and node.input[0] in bools and node.input[0] not in found:
            found.append(node.input[0])
    return found


def branch_settings(model: onnx.ModelProto, feeds: dict) -> list[tuple[str, dict]]:
    """(label, feeds) with each branch selector of ``model`` flipped, one at a time."""
    settings = []
    for name in branch_selectors(model):
        if name not in feeds or feeds[name].size != 1:
            continue
        flipped = dict(feeds)
        flipped[name] = np.logical_not(feeds[name])
        settings.append((f"{name}={bool(flipped[name].reshape(-1)[0])}", flipped))
    return settings


# Ops that move or reinterpret values without computing: a value's precision is that of their input.
_VALUE_PRESERVING = {"Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Transpose",
                     "Expand", "Slice", "Gather", "Concat"}


def _computed_types(model: onnx.ModelProto, base_dir: Path | None = None) -> dict[str, np.dtype]:
    """For each graph output, the narrowest float type on its chain of value-preserving ops back
    to the op that computed it (``Cast(to=float32)`` of a float16 value: float16). Types the model
    does not declare (no value_info: onnxsim, a stripped model) come from otfuse's dimension engine."""
    producer = {out: node for node in model.graph.node for out in node.output if out}
    elem_of = {info.name: info.type.tensor_type.elem_type
               for info in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output)}
    elem_of.update({t.name: t.data_type for t in model.graph.initializer})
    index: list[GraphIndex] = []

    def elem_type(name: str) -> int:
        if elem_of.get(name):
            return elem_of[name]
        if not index:
            index.append(GraphIndex(model, base_dir))  # built once, only when a type is missing
        return index[0].elem_type(name)

    found: dict[str, np.dtype] = {}
    for output in model.graph.output:
        widths, name = [], output.name
        for _ in range(64):  # a chain, not a search: the first input of each preserving op
            node = producer.get(name)
            if node is None or node.op_type not in _VALUE_PRESERVING or not node.input:
                break
            name = node.input[0]
            elem = elem_type(name)
            if elem in (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16):
                widths.append(elem)
        if widths:
            found[output.name] = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(
                onnx.TensorProto.BFLOAT16 if onnx.TensorProto.BFLOAT16 in widths else onnx.TensorProto.FLOAT16))
    return found


def _fused_tensors(fused_model: onnx.ModelProto, orig_model: onnx.ModelProto):
    """([(node name, op type, tensor)], [unmatched tensor]) for the outputs of the otfuse nodes, in
    graph order. Fused nodes keep the original tensor names, so normally nothing is unmatched."""
    in_original = {t for n in orig_model.graph.node for t in n.output}
    probes, unmatched = [], []
    for i, node in enumerate(fused_model.graph.node):
        if node.domain != OP_DOMAIN:
            continue
        for tensor in node.output:
            if tensor and tensor in in_original:
                probes.append((node.name or f"#{i}", node.op_type, tensor))
            elif tensor:
                unmatched.append(tensor)
    return probes, unmatched


@contextlib.contextmanager
def with_outputs(loaded: LoadedModel, names: list[str]):
    """Yield a path to the model with ``names`` added as graph outputs: a temporary copy next to
    the original (so its relative external-data paths resolve), removed afterwards. The caller's
    model and files are never modified."""
    path = loaded.path
    if not names:
        yield path
        return
    copy = onnx.ModelProto()
    copy.CopyFrom(loaded.model)
    for name in names:
        copy.graph.output.add().name = name  # no type: ORT infers it from the producing node
    data = copy.SerializeToString()  # weights stay external: this proto was loaded without them
    tmp = path.parent / f".{path.stem}.otfuse-diff-{secrets.token_hex(4)}.onnx"
    try:
        tmp.write_bytes(data)
    except OSError as e:
        if loaded.external_files:
            raise OtfuseError(
                f"--per-fusion needs a temporary copy of {path.name} in {path.parent} (its external data is "
                f"found relative to it), which is not writable: {e.strerror or e}"
            ) from None
        fd, name = tempfile.mkstemp(suffix=".onnx", prefix="otfuse-diff-")
        os.close(fd)
        tmp = Path(name)
        tmp.write_bytes(data)
    try:
        yield tmp
    finally:
        tmp.unlink(missing_ok=True)


def uses_otfuse_ops(model: onnx.ModelProto) -> bool:
    """Whether ``model`` needs otfuse's library; models without otfuse ops (the original, an
    ``ort``/``onnx``-target model) run in stock onnxruntime, as their users run them."""
    return _holds_otfuse_op(model.graph)


def _holds_otfuse_op(graph: onnx.GraphProto) -> bool:
    for node in graph.node:
        if node.domain == OP_DOMAIN:
            return True
        for attribute in node.attribute:
            subgraphs = [attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs
            if any(_holds_otfuse_op(sub) for sub in subgraphs):
                return True
    return False


def _open(path: Path, shown_as: Path, providers, *, opt_level: str, library: bool = True):
    """The session for ``path`` at ``opt_level``: on CPU, or where ``providers`` says."""
    if providers is None or providers == "cpu":
        return open_session(path, opt_level=opt_level, shown_as=shown_as, library=library)
    if providers == "cann":
        providers = ["CANNExecutionProvider"]
    if isinstance(providers, str):
        raise OtfuseError(f"providers must be 'cpu', 'cann' or a list of ONNX Runtime providers, got {providers!r}")
    providers = list(providers)
    first = providers[0] if providers else None
    name, options = first if isinstance(first, tuple) else (first, {})
    if name != "CANNExecutionProvider":
        return open_session(path, providers=providers, shown_as=shown_as, opt_level=opt_level, library=library)
    from otfuse.run import ascend

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        try:
            session = ascend.create_session(str(path), sess_options=session_options(opt_level), **dict(options))
        except OtfuseError:
            raise
        except Exception as e:  # noqa: BLE001  (any load failure: one line naming the file)
            raise ModelLoadError(f"{shown_as}: ONNX Runtime cannot load it: {' '.join(str(e).split())}") from None
    for w in caught:  # the CPU fallback's warning, naming the user's file rather than a temporary copy
        warnings.warn(str(w.message).replace(str(path), str(shown_as)), w.category, stacklevel=4)
    return session


def _run(path: Path, shown_as: Path, feeds, output_names, *, opt_level: str,
         providers=None, library: bool = True) -> tuple[dict[str, np.ndarray], list[str]]:
    session = _open(path, shown_as, providers, opt_level=opt_level, library=library)
    try:
        return run(session, feeds, output_names), list(session.get_providers())
    except OtfuseError:
        raise
    except Exception as e:
        shapes = ", ".join(f"{k} {np.dtype(v.dtype).name}{list(v.shape)}" for k, v in feeds.items())
        raise OtfuseError(
            f"running {shown_as} failed: {' '.join(str(e).split())} (inputs: {shapes}; set sizes with --dims)"
        ) from None
