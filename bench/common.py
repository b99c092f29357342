"""Helpers shared by the benches: machine facts, per-process I/O and memory counters, tables.

Everything here reads Linux's /proc; on another OS the counters come back as ``None``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def use_checkout() -> None:
    """Benchmark the otfuse of this checkout, not whatever is installed."""
    root = str(REPO_ROOT)
    if root not in sys.path:
        sys.path.insert(0, root)


def child_env() -> dict[str, str]:
    """The environment for a child Python that must import this checkout's otfuse."""
    env = dict(os.environ)
    parts = [str(REPO_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    return env


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    return {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu_model": cpu_model(),
        "nproc": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _mem_total_gib(),
        "python": platform.python_version(),
        "kernel": platform.release(),
    }


def _mem_total_gib() -> float | None:
    status = _read_kv("/proc/meminfo")
    kib = status.get("MemTotal")
    return round(int(kib.split()[0]) / 2**20, 1) if kib else None


def _read_kv(path: str) -> dict[str, str]:
    try:
        text = Path(path).read_text()
    except OSError:
        return {}
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        out[key.strip()] = value.strip()
    return out


def proc_io() -> dict[str, int]:
    """This process's /proc/self/io counters (rchar = bytes passed through read-like syscalls)."""
    return {k: int(v) for k, v in _read_kv("/proc/self/io").items() if v.isdigit()}


def proc_memory_mib() -> dict[str, float | None]:
    """Current (VmRSS) and peak (VmHWM) resident set size of this process, in MiB."""
    status = _read_kv("/proc/self/status")

    def mib(key: str) -> float | None:
        value = status.get(key)
        return round(int(value.split()[0]) / 1024, 1) if value else None

    return {"rss_mib": mib("VmRSS"), "peak_rss_mib": mib("VmHWM")}


def file_sizes(path: str | os.PathLike) -> dict[str, int]:
    """Apparent size, bytes actually allocated on disk (st_blocks * 512), inode and link count."""
    st = os.stat(path)
    return {"apparent_bytes": st.st_size, "allocated_bytes": st.st_blocks * 512,
            "inode": st.st_ino, "nlink": st.st_nlink}


def human_bytes(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n} B"  # pragma: no cover


def print_table(rows: list[tuple[str, str]], title: str | None = None) -> None:
    width = max(len(k) for k, _ in rows)
    if title:
        print(title)
        print("-" * len(title))
    for key, value in rows:
        print(f"{key:<{width}}  {value}")
