"""otfuse: fuse transformer subgraphs of exported ONNX models into ONNX Runtime custom ops.

Data flow: load -> canonicalise -> match -> rewrite -> save -> validate
(``otfuse.fuse``, in ``otfuse/pipeline.py``), then run with the custom-op library (``otfuse.InferenceSession``) and prove
nothing changed (``otfuse.diff``).
"""

__version__ = "0.1.0"

OP_DOMAIN = "otfuse"
OP_DOMAIN_VERSION = 1

from otfuse._library import library_path  # noqa: E402
from otfuse.errors import OtfuseError  # noqa: E402


def __getattr__(name):
    # Heavier entry points are imported on first use so `import otfuse` stays cheap.
    if name == "InferenceSession":
        from otfuse.session import InferenceSession

        return InferenceSession
    if name in ("fuse", "FuseReport"):
        from otfuse import pipeline

        return getattr(pipeline, name)
    if name in ("diff", "DiffResult"):
        from otfuse import compare

        return getattr(compare, name)
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
