"""Proving a fused model right: ``validation`` (is it a valid model, run by ``otfuse.fuse``),
``diff`` (``otfuse diff``: both models on the same inputs, per-dtype tolerances), ``interface``
(both take and give the same tensors), ``reference`` (numpy of every op in docs/ops.md) and
``ops_on_npu`` (``otfuse verify-ops``: each fused op on the NPU vs the CPU kernel). Imports
``run`` and the engine's model I/O, never a fusion family."""
