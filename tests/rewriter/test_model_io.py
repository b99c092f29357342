"""Models whose weights live in external data files: fusing reads no weight bytes, writes a model
whose external data resolves next to it, never touches the input, and fails cleanly (one error,
nothing left behind) on missing or truncated data and on an unwritable output folder.

The 13 GB version of this (a LLaMA-7B-shaped model) is bench/fuse_large_model.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnx
import pytest
from fusions.norm.graphs import rms_norm
from graphs import F32, GraphBuilder
from onnx import TensorProto, numpy_helper

import otfuse
from otfuse.errors import ModelLoadError, OutputWriteError
from otfuse.rewriter import output_paths
from otfuse.rewriter.model_io import external_info, is_external, load_model

HIDDEN = 64
DATA = "model.onnx.data"
# The norm -> MatMul pairs become Norm + Linear nodes (weights still never read); the last norm
# feeds no projection and stays an AddRMSNorm.
EXPECTED = {"AddRMSNorm": 1, "AddRMSNormLinear": 1, "RMSNormLinear": 1}  # the default families


def three_norm_model() -> onnx.ModelProto:
    """x -> RMSNorm -> MatMul -> (x +) -> RMSNorm -> MatMul -> (+) -> RMSNorm: 1 RMSNorm, 2 AddRMSNorm."""
    b = GraphBuilder()
    rng = np.random.default_rng(3)
    h = b.input("x", F32, ["batch", "seq", HIDDEN])
    for i in range(3):
        n = rms_norm(b, h, HIDDEN, weight=(1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32))
        if i < 2:
            w = b.const((rng.standard_normal((HIDDEN, HIDDEN)) / 8).astype(np.float32), "proj")
            h = b.node("Add", [h, b.node("MatMul", [n, w])], base="residual")
    b.nodes[-1].output[0] = "y"
    b.output("y", F32, ["batch", "seq", HIDDEN])
    return b.model()


def externalize(model: onnx.ModelProto, folder: Path, *, base_offset: int = 0,
                file_size: int | None = None, align: int = 64,
                inline_below: int = 0) -> tuple[Path, Path]:
    """Save ``model`` into ``folder`` with its initializers in one external data file.

    Tensors of fewer than ``inline_below`` bytes stay in the proto (exporters keep scalars and
    axes inline; ORT needs a ReduceMean's axes inline to infer shapes). The others are written at
    ``base_offset`` onwards; the file is then extended to ``file_size`` with truncate, so
    everything before ``base_offset`` is a hole (a sparse file, nothing allocated).
    """
    folder.mkdir(parents=True, exist_ok=True)
    data_path, model_path = folder / DATA, folder / "model.onnx"
    offset = base_offset
    moved = []
    with open(data_path, "wb") as handle:
        for tensor in model.graph.initializer:
            raw = numpy_helper.to_array(tensor).tobytes()
            if len(raw) < inline_below:
                moved.append(tensor)
                continue
            offset = -(-offset // align) * align
            handle.seek(offset)
            handle.write(raw)
            ext = TensorProto(name=tensor.name, data_type=tensor.data_type, dims=tensor.dims,
                              data_location=TensorProto.EXTERNAL)
            for key, value in (("location", DATA), ("offset", str(offset)), ("length", str(len(raw)))):
                entry = ext.external_data.add()
                entry.key, entry.value = key, value
            moved.append(ext)
            offset += len(raw)
        if file_size is not None:
            handle.truncate(max(file_size, offset))
    del model.graph.initializer[:]
    model.graph.initializer.extend(moved)
    model_path.write_bytes(model.SerializeToString())
    return model_path, data_path


def snapshot(*paths: Path) -> dict:
    return {str(p): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns) for p in paths}


def read_tensor(tensor: onnx.TensorProto, folder: Path) -> np.ndarray:
    """An external tensor's value, read independently of otfuse."""
    info = external_info(tensor)
    dtype = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)
    with open(folder / info["location"], "rb") as handle:
        handle.seek(int(info.get("offset", 0)))
        raw = handle.read(int(info["length"]))
    return np.frombuffer(raw, dtype=dtype).reshape(tuple(tensor.dims))


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


@pytest.fixture
def external_model(tmp_path):
    model = three_norm_model()
    values = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    model_path, data_path = externalize(model, tmp_path / "in", inline_below=128)
    return model_path, data_path, values


# -- the happy path ------------------------------------------------------------------------------
def test_fuse_into_another_folder_copies_the_data_and_leaves_the_input_alone(tmp_path, external_model):
    # The cwd is not the model's folder: validation must resolve external data against the model.
    model_path, data_path, values = external_model
    before = snapshot(model_path, data_path)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    output = out_dir / "fused.onnx"

    report = otfuse.fuse(model_path, output)

    assert report.fusions == EXPECTED
    assert snapshot(model_path, data_path) == before
    copied = out_dir / DATA
    assert copied.is_file() and not os.path.samefile(copied, data_path)
    assert copied.read_bytes() == data_path.read_bytes()
    assert os.stat(data_path).st_nlink == 1  # onnx refuses multiply-linked data: keep the input loadable
    onnx.load(model_path, load_external_data=True)
    onnx.load(output, load_external_data=True)
    assert sorted(p.name for p in out_dir.iterdir()) == sorted([DATA, "fused.onnx"])  # no temp files

    fused = load_model(output).model  # every reference resolves next to the output
    assert sorted(n.op_type for n in fused.graph.node if n.domain == "otfuse") == \
        sorted(op for op, count in EXPECTED.items() for _ in range(count))
    external = [t for t in fused.graph.initializer if is_external(t)]
    assert len(external) == 3 + 2  # three norm weights and two projections, still on disk
    for tensor in external:  # the data reached through the output folder is the original weight
        original = values[tensor.name].reshape(-1)
        np.testing.assert_array_equal(read_tensor(tensor, out_dir).reshape(-1), original)
    for node in fused.graph.node:
        if node.domain == "otfuse":  # the fused nodes read the norm weights from the file
            assert node.input[-1] in {t.name for t in external}


def test_link_mode_hard_links_the_data(tmp_path, external_model):
    model_path, data_path, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    otfuse.fuse(model_path, out_dir / "fused.onnx", data_mode="link")
    assert os.path.samefile(out_dir / DATA, data_path)


def _library_available() -> bool:
    from otfuse.run.session import find_library

    return find_library()[0] is not None


@pytest.mark.skipif(not _library_available(), reason="the otfuse custom-op library is not built")
def test_ort_runs_the_fused_model_through_the_copied_data(tmp_path, external_model):
    model_path, _, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    otfuse.fuse(model_path, out_dir / "fused.onnx")
    result = otfuse.diff(model_path, out_dir / "fused.onnx", dims={"batch": 2, "seq": 5})
    assert result.ok, result.to_dict()


# -- bad inputs -----------------------------------------------------------------------------------
def test_missing_external_data_names_the_file(tmp_path, external_model):
    model_path, data_path, _ = external_model
    data_path.unlink()
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ModelLoadError, match=DATA.replace(".", r"\.")) as info:
        otfuse.fuse(model_path, out_dir / "fused.onnx")
    assert "missing" in str(info.value)
    assert list(out_dir.iterdir()) == []


def test_truncated_external_data_is_a_load_error(tmp_path, external_model):
    model_path, data_path, _ = external_model
    size = data_path.stat().st_size
    with open(data_path, "r+b") as handle:
        handle.truncate(size - 100)  # the last tensor now ends past the end of the file
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    with pytest.raises(ModelLoadError, match="truncated") as info:
        otfuse.fuse(model_path, out_dir / "fused.onnx")
    assert DATA in str(info.value) and str(size - 100) in str(info.value)
    assert list(out_dir.iterdir()) == []


# -- unwritable outputs ---------------------------------------------------------------------------
def test_output_folder_that_does_not_exist(tmp_path, external_model):
    model_path, data_path, _ = external_model
    before = snapshot(model_path, data_path)
    missing = tmp_path / "nope" / "deeper"
    with pytest.raises(OutputWriteError, match="does not exist"):
        otfuse.fuse(model_path, missing / "fused.onnx")
    assert not (tmp_path / "nope").exists()
    assert snapshot(model_path, data_path) == before
    assert os.stat(data_path).st_nlink == 1


@contextlib.contextmanager
def read_only_folder(path: Path):
    """``path`` made unwritable, even for root (chattr +i) where permission bits do not bind."""
    path.mkdir()
    immutable = False
    if os.geteuid() == 0:
        if shutil.which("chattr") is None or subprocess.run(
                ["chattr", "+i", str(path)], capture_output=True).returncode != 0:
            pytest.skip("running as root and cannot make a folder immutable (chattr +i)")
        immutable = True
    else:
        path.chmod(0o555)
    try:
        try:
            (path / ".probe").touch()
        except OSError:
            pass
        else:
            pytest.skip("cannot make a read-only folder here")
        yield path
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


def test_output_folder_not_writable(tmp_path, external_model):
    model_path, data_path, _ = external_model
    before = snapshot(model_path, data_path)
    with read_only_folder(tmp_path / "ro") as out_dir:
        with pytest.raises(OutputWriteError):
            otfuse.fuse(model_path, out_dir / "fused.onnx")
        assert list(out_dir.iterdir()) == []
    assert snapshot(model_path, data_path) == before
    assert os.stat(data_path).st_nlink == 1


def test_failure_after_linking_leaves_nothing_behind(tmp_path, external_model, monkeypatch):
    """The last step (renaming the temp file into place) fails: the temp file and the linked data
    file are removed again, and the error is one OutputWriteError."""
    model_path, data_path, _ = external_model
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    def refuse(src, dst):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(output_paths.os, "replace", refuse)
    with pytest.raises(OutputWriteError, match="Permission denied"):
        otfuse.fuse(model_path, out_dir / "fused.onnx")
    assert list(out_dir.iterdir()) == []
    assert os.stat(data_path).st_nlink == 1


# -- a big sparse data file -----------------------------------------------------------------------
SPARSE_SIZE = 3 * 2**30


def test_three_gigabyte_sparse_data_file_is_never_read(tmp_path):
    """The tensors sit at the end of a 3 GiB sparse file: fusing reads a few KB, not gigabytes."""
    model = three_norm_model()
    base = SPARSE_SIZE - 2**20  # every tensor within the last MiB
    model_path, data_path = externalize(model, tmp_path / "in", base_offset=base, file_size=SPARSE_SIZE)
    allocated = data_path.stat().st_blocks * 512
    if allocated > 64 * 2**20:
        pytest.skip(f"this filesystem does not keep sparse files ({allocated} bytes allocated)")
    assert data_path.stat().st_size == SPARSE_SIZE
    out_dir = tmp_path / "out"
    out_dir.mkdir()

    start = rchar()
    report = otfuse.fuse(model_path, out_dir / "fused.onnx")
    read = rchar() - start

    assert report.fusions == EXPECTED
    assert read < 16 * 2**20, f"fusing read {read} bytes of a {SPARSE_SIZE}-byte data file"
    assert data_path.stat().st_blocks * 512 == allocated  # nothing materialised or copied
    linked = out_dir / DATA
    assert linked.stat().st_size == SPARSE_SIZE
    assert linked.stat().st_blocks * 512 <= allocated
    fused = load_model(out_dir / "fused.onnx").model
    offsets = [int(external_info(t)["offset"]) for t in fused.graph.initializer if is_external(t)]
    assert offsets and min(offsets) >= base
