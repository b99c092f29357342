"""Running models: ONNX Runtime sessions with the custom-op library (``session``, ``library``),
realistic inputs (``feeds``), and Ascend sessions on the CANN execution provider (``ascend``,
with ``cann_runtime`` finding the CANN runtime the library will load). Imports only the engine's
model I/O, ``errors`` and ``domain``."""
