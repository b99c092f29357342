"""TEST DOUBLE of the CANN runtime (fake_ascendcl.cc): build it, point otfuse at it, read its log.

``build()`` compiles libfake_ascendcl.so with CMake once per test process into a temporary
directory and returns the ``lib64`` folder where it answers to libascendcl.so / libnnopbase.so /
libopapi.so. ``FakeCann`` is what the tests use: the environment that makes the Ascend kernels
load it, and the parsed call log.
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import onnxruntime as ort

SOURCE = Path(__file__).resolve().parent
FAKE_MODE_KEY = "otfuse.ascend_ep.fake_mode"


@functools.cache
def build() -> Path:
    """Build the test double (once per process); return its lib64 directory."""
    work = Path(tempfile.mkdtemp(prefix="otfuse-fake-cann-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    build_dir = work / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    # .ci/sanitize sets OTFUSE_SANITIZE: the double then carries the library's sanitizers too.
    sanitize = [f"-DOTFUSE_SANITIZE={os.environ['OTFUSE_SANITIZE']}"] if os.environ.get("OTFUSE_SANITIZE") else []
    for cmd in (["cmake", "-S", str(SOURCE), "-B", str(build_dir), *generator, *sanitize],
                ["cmake", "--build", str(build_dir)]):
        done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"building the fake CANN runtime failed: {' '.join(cmd)}\n{done.stdout}\n{done.stderr}")
    lib64 = build_dir / "lib64"
    assert (lib64 / "libascendcl.so").resolve().name == "libfake_ascendcl.so"
    return lib64


class FakeCann:
    """The environment of one test: OTFUSE_CANN_LIB_DIR at the double, its log in ``log``."""

    def __init__(self, lib64: Path, log: Path, monkeypatch):
        self.lib64 = lib64
        self.log = log
        self._monkeypatch = monkeypatch
        monkeypatch.setenv("OTFUSE_CANN_LIB_DIR", str(lib64))
        monkeypatch.setenv("OTFUSE_FAKE_CANN_LOG", str(log))
        monkeypatch.delenv("OTFUSE_FAKE_CANN_FAIL", raising=False)
        monkeypatch.delenv("OTFUSE_FAKE_CANN_SOC", raising=False)  # an Atlas A2 (Ascend910B3)

    def fail(self, function: str, status: int, message: str) -> None:
        """Make ``function`` return ``status`` with ``message`` for aclGetRecentErrMsg."""
        self._monkeypatch.setenv("OTFUSE_FAKE_CANN_FAIL", f"{function}={status}:{message}")

    def soc(self, name: str) -> None:
        """What aclrtGetSocName reports, e.g. "Ascend310P3" (Atlas inference products)."""
        self._monkeypatch.setenv("OTFUSE_FAKE_CANN_SOC", name)

    def calls(self, fn: str | None = None) -> list[dict]:
        if not self.log.exists():
            return []
        entries = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [e for e in entries if fn is None or e["fn"] == fn]

    def clear(self) -> None:
        self.log.unlink(missing_ok=True)


def fake_mode_options(library: str, threads: int = 1) -> ort.SessionOptions:
    """Session options whose otfuse norm ops run the Ascend kernels on CPU, against the double.
    The config entry must be set before the library is registered: it is read at registration."""
    options = ort.SessionOptions()
    options.add_session_config_entry(FAKE_MODE_KEY, "1")
    options.register_custom_ops_library(library)
    options.intra_op_num_threads = threads
    options.log_severity_level = 4
    return options
