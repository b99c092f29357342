"""The kernel tests again, as on an AVX2-only CPU: bench/cpuid_mask.c hides AVX-512, AMX and
AVX-VNNI from CPUID in a child pytest, so the library's own dispatch (not a forcing knob) picks
the AVX2 variants, and every test that decides what the CPU has must ask CPUID as the library
does (tests/cpu_isa.py). On a CPU without AVX-512 there is nothing to hide: the suite itself is
that machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cpu_isa import cpu_isas

REPO = Path(__file__).resolve().parents[2]


def _cpuid_faulting() -> bool:
    try:
        return any("cpuid_fault" in line.split() for line in open("/proc/cpuinfo") if line.startswith("flags"))
    except OSError:
        return False


@pytest.mark.skipif("avx512" not in cpu_isas(), reason="no AVX-512 to hide: this machine is the AVX2 case")
@pytest.mark.skipif(not _cpuid_faulting(), reason="no CPUID faulting on this CPU or hypervisor")
@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc to build bench/cpuid_mask.c")
def test_kernel_tests_pass_on_an_avx2_only_cpu(tmp_path):
    shim = tmp_path / "cpuid_mask.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(REPO / "bench" / "cpuid_mask.c"), "-o", str(shim), "-ldl"],
                   check=True)
    env = dict(os.environ, OTFUSE_CPUID_MASK="avx2", LD_PRELOAD=str(shim))
    probe = subprocess.run([sys.executable, "-c", "from otfuse.run.library import isa_report; print(isa_report())"],
                           env=env, capture_output=True, text=True, check=True).stdout
    assert "'avx512': False" in probe and "'attention': 'avx2'" in probe, probe
    tests = REPO / "tests" / "kernels"
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tests),
                          "--deselect", f"{tests / 'test_avx2_machine.py'}"],
                         env=env, cwd=REPO, capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr[-2000:]
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    assert " passed" in summary, summary
