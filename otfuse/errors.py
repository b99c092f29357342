"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""


class OtfuseError(Exception):
    """A problem with the user's input or environment, stated in one line (no traceback)."""


class ModelLoadError(OtfuseError):
    """The input is missing, not ONNX, truncated, or its external data is missing."""


class OutputWriteError(OtfuseError):
    """The output could not be written; nothing was left behind."""


class InternalError(OtfuseError):
    """otfuse produced something invalid (a bug in otfuse, exit code 3); nothing was written."""
