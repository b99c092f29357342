"""Where the ONNX Runtime custom-op library (libotfuse_ops.so) is."""

from __future__ import annotations

import os
from importlib import metadata
from pathlib import Path

from otfuse.errors import OtfuseError

LIBRARY_NAME = "libotfuse_ops.so"
ENV_VAR = "OTFUSE_LIBRARY"


def _installed_copy() -> Path | None:
    # `python -m pytest` from a checkout imports the source tree, which has no .so; the
    # installed distribution (pip install .) still has one in its own otfuse/ folder.
    try:
        dist = metadata.distribution("otfuse")
    except metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(f"otfuse/{LIBRARY_NAME}"))
    return path if path.is_file() else None


def library_path() -> str:
    """Absolute path of the custom-op library, for ``SessionOptions.register_custom_ops_library``.

    Looks at $OTFUSE_LIBRARY, then in the ``otfuse`` package folder (where the build installs it),
    then in the installed distribution.
    """
    override = os.environ.get(ENV_VAR)
    if override:
        path = Path(override).expanduser()
        if not path.is_file():
            raise OtfuseError(f"{ENV_VAR}={override} is not a file")
        return str(path.resolve())
    beside = Path(__file__).resolve().parent.parent / LIBRARY_NAME  # otfuse/, not otfuse/run/
    if beside.is_file():
        return str(beside)
    installed = _installed_copy()
    if installed is not None:
        return str(installed.resolve())
    raise OtfuseError(
        f"{LIBRARY_NAME} not found (not in {Path(__file__).resolve().parent.parent} nor in an installed otfuse): "
        f"build it with `pip install .` or set {ENV_VAR}"
    )


def isa_report(path: str | None = None) -> dict:
    """Which kernel variant each family takes in this process, from the library itself
    (``OtfuseIsaReport``): ``avx512``, ``fma512_over_256`` (measured), ``avx512_full_rate`` and one
    entry per family (``attention``, ``gemm``, ``activation``, ``norm``, ``rotary``). A bad
    ``OTFUSE_*_ISA`` knob comes back as ``{"error": ...}``; a library without the entry point (an
    older build) as ``{"error": "..."}`` too. Raises OtfuseError only when no library is found."""
    import ctypes
    import json

    lib = ctypes.CDLL(path or library_path())
    try:
        entry = lib.OtfuseIsaReport
    except AttributeError:
        return {"error": "this library has no OtfuseIsaReport (built before it existed)"}
    entry.restype = ctypes.c_char_p
    return json.loads(entry().decode())


def describe_isa(report: dict) -> str:
    """One line of isa_report(): 'attention avx512, gemm avx512f, ...; AVX-512 full rate (...)'."""
    if "error" in report:
        return report["error"]
    families = ", ".join(f"{name} {report[name]}" for name in ("attention", "gemm", "activation", "norm", "rotary"))
    if not report["avx512"]:
        return families
    rate = "full" if report["avx512_full_rate"] else "half"
    batches = report.get("fma_batches", 1)
    again = f" in {batches} batches" if batches > 1 else ""
    return f"{families}; AVX-512 {rate} rate (512/256-bit FMA {report['fma512_over_256']}x measured{again})"
