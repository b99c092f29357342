"""The kernel variants this CPU can run, as the library's own CPUID check sees them.

Not /proc/cpuinfo: where the two differ (a hypervisor that hides features, or bench/cpuid_mask.c,
which hides AVX-512 from CPUID to stand in for an AVX2-only machine) the library's view is the one
that decides which code runs, so it is the one that decides which variants a test can force."""

from __future__ import annotations

import functools
import os

from otfuse.run.library import isa_report

_KNOBS = ("OTFUSE_CPU_ISA", "OTFUSE_AVX512_RATE", "OTFUSE_ATTENTION_ISA", "OTFUSE_GEMM_ISA", "OTFUSE_ACTIVATION_ISA")


@functools.lru_cache(maxsize=None)
def cpu_isas() -> tuple[str, ...]:
    """'baseline', then 'avx2' (AVX2 + FMA + F16C) and 'avx512' (F, VL, BW, DQ) where the CPU has them."""
    saved = {k: os.environ.pop(k) for k in _KNOBS if k in os.environ}
    try:
        report = isa_report()
    finally:
        os.environ.update(saved)
    if "error" in report:
        raise RuntimeError(report["error"])
    found = ["baseline"]
    if report["norm"] == "avx2":  # the row kernels' default: AVX2 + FMA + F16C, else baseline
        found.append("avx2")
        if report["avx512"]:
            found.append("avx512")
    return tuple(found)
