"""Where the CANN runtime is, found the way the custom-op library finds it at kernel creation
(kernels/ascend/cann_runtime.h): same variables, same order, same files. Nothing is loaded here,
so ``otfuse info`` stays safe on any machine."""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass, field
from pathlib import Path

RUNTIME_LIBRARY = "libascendcl.so"
TENSOR_LIBRARY = "libnnopbase.so"
OPERATOR_LIBRARIES = ("libopapi_nn.so", "libopapi.so", "libopapi_transformer.so", "libopapi_math.so")
DEFAULT_DIRS = ("/usr/local/Ascend/cann/lib64", "/usr/local/Ascend/ascend-toolkit/latest/lib64")
PIN_VAR = "OTFUSE_CANN_LIB_DIR"
# The symbol only otfuse's CPU test double of the runtime (tests/fake_cann) exports; the kernels
# look for it with dlsym, this module for its name in the file (nothing gets loaded here).
TEST_DOUBLE_MARKER = b"otfuse_fake_cann_runtime"


@dataclass(frozen=True)
class CannRuntimeLocation:
    directory: Path | None  # the first directory holding libascendcl.so, or None
    origin: str = ""  # which variable (or default) named it
    libraries: tuple[str, ...] = ()  # the runtime files present there
    searched: tuple[str, ...] = field(default_factory=tuple)  # "dir (origin)" before it was found
    problem: str = ""  # why that directory cannot be used (incomplete), else ""

    @property
    def found(self) -> bool:
        return self.directory is not None and not self.problem

    @property
    def is_test_double(self) -> bool:
        """True for otfuse's CPU stand-in of the runtime (tests/fake_cann), not CANN."""
        if self.directory is None:
            return False
        return any(_exports_marker(self.directory / name) for name in self.libraries)

    def describe(self) -> str:
        if self.directory is None:
            return f"not found (looked in {', '.join(self.searched) or 'nothing'})"
        where = f"{self.directory} (from {self.origin})"
        if self.problem:
            return f"{where}: {self.problem}"
        kind = "otfuse's CPU test double, not CANN" if self.is_test_double else " ".join(self.libraries)
        return f"{where}: {kind}"


def _exports_marker(path: Path) -> bool:
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return data.find(TEST_DOUBLE_MARKER) >= 0
    except (OSError, ValueError):  # unreadable, or empty (mmap refuses size 0)
        return False


def candidate_dirs(environ=None) -> list[tuple[str, str]]:
    """(directory, origin) in search order."""
    env = os.environ if environ is None else environ
    pinned = env.get(PIN_VAR, "")
    if pinned:
        return [(pinned, f"${PIN_VAR}")]
    dirs = []
    for var in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME"):
        if env.get(var):
            dirs.append((f"{env[var]}/lib64", f"${var}/lib64"))
    dirs += [(d, "$LD_LIBRARY_PATH") for d in env.get("LD_LIBRARY_PATH", "").split(":") if d]
    dirs += [(d, "default location") for d in DEFAULT_DIRS]
    return dirs


def find_cann_runtime(environ=None) -> CannRuntimeLocation:
    """The CANN runtime the Ascend kernels would load in this environment."""
    searched = []
    for directory, origin in candidate_dirs(environ):
        path = Path(directory)
        if not (path / RUNTIME_LIBRARY).is_file():
            searched.append(f"{directory} ({origin})")
            continue
        present = tuple(n for n in (RUNTIME_LIBRARY, TENSOR_LIBRARY, *OPERATOR_LIBRARIES) if (path / n).is_file())
        problem = ""
        if TENSOR_LIBRARY not in present:
            problem = f"has {RUNTIME_LIBRARY} but no {TENSOR_LIBRARY}"
        elif not any(n in present for n in OPERATOR_LIBRARIES):
            problem = "has no aclnn operator library (libopapi_nn.so / libopapi.so)"
        return CannRuntimeLocation(path, origin, present, tuple(searched), problem)
    return CannRuntimeLocation(None, searched=tuple(searched))
