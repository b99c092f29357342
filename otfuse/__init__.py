"""otfuse: fuse transformer subgraphs of exported ONNX models into ONNX Runtime custom ops.

Data flow: load -> canonicalise -> fuse families -> validate -> save (``otfuse.fuse``, in
``otfuse/pipeline.py``), then run with the custom-op library (``otfuse.InferenceSession``) and prove
nothing changed (``otfuse.diff``). This module is the package's face only: it re-exports, and
imports the heavier entry points on first use. The layers are in docs/architecture.md.
"""

from otfuse.domain import OP_DOMAIN, OP_DOMAIN_VERSION
from otfuse.domain import VERSION as __version__  # noqa: F401 - otfuse.__version__
from otfuse.errors import OtfuseError
from otfuse.run.library import library_path


def __getattr__(name):
    # Heavier entry points are imported on first use so `import otfuse` stays cheap.
    if name == "InferenceSession":
        from otfuse.run.session import InferenceSession

        return InferenceSession
    if name in ("fuse", "FuseReport"):
        from otfuse import pipeline

        return getattr(pipeline, name)
    if name in ("diff", "DiffResult"):
        from otfuse.verify import diff

        return getattr(diff, name)
    raise AttributeError(f"module 'otfuse' has no attribute {name!r}")


__all__ = [
    "OP_DOMAIN",
    "OP_DOMAIN_VERSION",
    "OtfuseError",
    "library_path",
    "InferenceSession",
    "fuse",
    "FuseReport",
    "diff",
    "DiffResult",
]
