"""Load and save models without ever pulling external weights into memory.

Loading reads only the protobuf (initializers stored as external data stay references) and checks
that every referenced data file exists and is long enough. Saving writes to a temporary file in the
output directory and renames it into place, so a failure never leaves a half-written model. An
output beside the input shares its external data files; elsewhere they are cloned/copied (or
hard-linked on request) by external_data.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import onnx
from google.protobuf.message import DecodeError

from otfuse.errors import ModelLoadError, OutputWriteError
from otfuse.rewriter.external_data import place_external_files
from otfuse.rewriter.output_paths import StagedFiles, check_disjoint

_PROTOBUF_LIMIT = 2**31 - 1


@dataclass
class LoadedModel:
    """A model proto whose external tensors are still references into ``base_dir``."""

    model: onnx.ModelProto
    path: Path
    external_files: set[str] = field(default_factory=set)

    @property
    def base_dir(self) -> Path:
        return self.path.parent


def iter_all_tensors(graph: onnx.GraphProto):
    """Every TensorProto the graph holds: initializers and tensor attributes, subgraphs' too."""
    yield from graph.initializer
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.TENSOR:
                yield attr.t
            elif attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_all_tensors(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_all_tensors(sub)


def external_info(tensor: onnx.TensorProto) -> dict[str, str]:
    return {entry.key: entry.value for entry in tensor.external_data}


def is_external(tensor: onnx.TensorProto) -> bool:
    return tensor.data_location == onnx.TensorProto.EXTERNAL


def _check_external_data(model: onnx.ModelProto, base_dir: Path) -> set[str]:
    """Return the referenced data files; raise if one is missing, escapes the folder or is short."""
    sizes: dict[str, int] = {}
    for tensor in iter_all_tensors(model.graph):
        if not is_external(tensor):
            continue
        info = external_info(tensor)
        location = info.get("location", "")
        if not location or os.path.isabs(location) or ".." in Path(location).parts:
            raise ModelLoadError(
                f"initializer {tensor.name!r} has an invalid external data location {location!r}"
            )
        if location not in sizes:
            data_path = base_dir / location
            if not data_path.is_file():
                raise ModelLoadError(
                    f"external data file {str(data_path)!r} (for initializer {tensor.name!r}) is missing"
                )
            sizes[location] = data_path.stat().st_size
        end = int(info.get("offset", 0)) + int(info.get("length", 0))
        if end > sizes[location]:
            raise ModelLoadError(
                f"external data file {location!r} is truncated: initializer {tensor.name!r} "
                f"needs bytes up to {end}, file has {sizes[location]}"
            )
    return set(sizes)


def check_model(model: onnx.ModelProto, base_dir: Path) -> None:
    """``onnx.checker`` on an in-memory model whose external tensors live in ``base_dir``.

    Given a proto, the checker looks for external data files relative to the current directory,
    so a model loaded from elsewhere fails it. It checks a copy instead in which each external
    initializer is described as a typed graph input; the references themselves (file present,
    offset + length inside it) are checked against ``base_dir`` as at load time. No weight bytes
    are read. Raises ``onnx.checker.ValidationError`` or ``ModelLoadError``.
    """
    external = [t for t in model.graph.initializer if is_external(t)]
    if not external:
        onnx.checker.check_model(model)
        return
    _check_external_data(model, base_dir)
    checkable = onnx.ModelProto()
    checkable.CopyFrom(model)
    kept = [t for t in checkable.graph.initializer if not is_external(t)]
    del checkable.graph.initializer[:]
    checkable.graph.initializer.extend(kept)
    declared = {i.name for i in model.graph.input}
    checkable.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in external if t.name not in declared
    )
    onnx.checker.check_model(checkable)


def load_model(path: str | os.PathLike) -> LoadedModel:
    """Parse ``path`` without loading external data; raise ModelLoadError with one clear line."""
    path = Path(path)
    if not path.exists():
        raise ModelLoadError(f"input model {str(path)!r} does not exist")
    if path.is_dir():
        raise ModelLoadError(f"input model {str(path)!r} is a directory, not an .onnx file")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except (DecodeError, RuntimeError, ValueError, UnicodeDecodeError) as exc:
        raise ModelLoadError(
            f"{str(path)!r} is not a valid ONNX model (truncated or not ONNX): {exc}".rstrip(": ")
        ) from None
    except OSError as exc:
        raise ModelLoadError(f"cannot read {str(path)!r}: {exc.strerror or exc}") from None
    if not model.HasField("graph") or (not model.graph.node and not model.graph.output):
        raise ModelLoadError(f"{str(path)!r} is not a valid ONNX model (it has no graph)")
    if not model.opset_import:
        raise ModelLoadError(f"{str(path)!r} is not a valid ONNX model (no opset imports)")
    external_files = _check_external_data(model, path.parent)
    return LoadedModel(model=model, path=path, external_files=external_files)


def data_destinations(loaded: LoadedModel, out_dir: Path) -> dict[str, Path]:
    """Where the input's external data files will be read from and, for an output in ``out_dir``,
    where they are placed (the same paths when the output sits beside the input)."""
    return {location: out_dir / location for location in sorted(loaded.external_files)}


def stage_model(loaded: LoadedModel, model: onnx.ModelProto, output_path: str | os.PathLike,
                staged: StagedFiles, data_mode: str = "copy") -> Path:
    """Write ``model`` under a temporary name beside ``output_path`` (``staged.commit`` renames it);
    external tensors keep their references. Beside the input, the output shares its data files;
    elsewhere they are copied or linked (``data_mode``, see external_data.py) and removed again
    by ``staged.abort``. Returns the temporary path, a loadable model."""
    output_path = Path(output_path)
    out_dir = output_path.parent if str(output_path.parent) else Path(".")
    if not out_dir.is_dir():
        raise OutputWriteError(f"output folder {str(out_dir)!r} does not exist")
    if output_path.exists() and output_path.is_dir():
        raise OutputWriteError(f"output path {str(output_path)!r} is a directory")
    if model.ByteSize() > _PROTOBUF_LIMIT:
        raise OutputWriteError(
            "the fused model is over 2 GB without external data; export the original with external data"
        )
    staged.created += place_external_files(loaded.external_files, loaded.base_dir, out_dir, data_mode)
    return staged.stage(output_path, model.SerializeToString())


def save_model(loaded: LoadedModel, model: onnx.ModelProto, output_path: str | os.PathLike,
               data_mode: str = "copy") -> Path:
    """Write ``model`` atomically to ``output_path`` (stage, then rename)."""
    output_path = Path(output_path)
    check_disjoint({"output model": output_path}, read_paths(loaded))
    staged = StagedFiles()
    try:
        stage_model(loaded, model, output_path, staged, data_mode)
        staged.commit()
    except BaseException:
        staged.abort()
        raise
    return output_path


def read_paths(loaded: LoadedModel) -> dict[str, Path]:
    """Every file a fuse reads: the model and its external data files."""
    paths = {"model": loaded.path}
    paths.update({f"external data file {location!r}": loaded.base_dir / location
                  for location in sorted(loaded.external_files)})
    return paths


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Inputs a caller must feed: graph inputs that are not also initializers (old IR lists both)."""
    init_names = {t.name for t in model.graph.initializer}
    return [vi for vi in model.graph.input if vi.name not in init_names]
