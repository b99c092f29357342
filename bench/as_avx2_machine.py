"""Runs a command as if on an AVX2-only CPU: AVX-512, AMX and AVX-VNNI hidden from CPUID for the
command and every process it starts (bench/cpuid_mask.c, through LD_PRELOAD). ORT's MLAS,
OpenVINO, numpy and otfuse then all take their AVX2 code, so a bench's ratios compare otfuse's
AVX2 path with ORT's AVX2 path on the same cores (issue 12: "the AVX2 path still meets the goals
against ORT on the same machine"). The cores stay this machine's: its caches, clocks and FMA ports.

    python bench/as_avx2_machine.py python bench/attention_paths.py --sizes 2048
    python bench/as_avx2_machine.py python bench/norm_linear.py --dtypes fp32

Exits 127 when the command cannot be run, 2 when the CPU or kernel has no CPUID faulting (`cpuid_fault` in /proc/cpuinfo).
"""

from __future__ import annotations

import os
import sys

import common


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    if "cpuid_fault" not in common.cpu_flags():
        print("as_avx2_machine: this CPU (or its hypervisor) offers no CPUID faulting", file=sys.stderr)
        return 2
    shim = common.build_preload("cpuid_mask")
    if shim is None:
        print("as_avx2_machine: could not build bench/cpuid_mask.c (no C compiler?)", file=sys.stderr)
        return 2
    env = dict(os.environ, OTFUSE_CPUID_MASK="avx2")
    env["LD_PRELOAD"] = " ".join(filter(None, [str(shim), env.get("LD_PRELOAD", "")]))
    try:
        os.execvpe(sys.argv[1], sys.argv[1:], env)
    except OSError as error:  # a command that is not there: one line, not a traceback
        print(f"as_avx2_machine: cannot run {sys.argv[1]!r}: {error.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(main())
