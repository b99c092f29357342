"""Helpers shared by the benches: machine facts, per-process I/O and memory counters, tables.

Everything here reads Linux's /proc; on another OS the counters come back as ``None``.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import sys
import time
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


# ---- Machine references and measurement helpers (bench/norm_linear.py; reusable by any bench) ----

BENCH_DIR = Path(__file__).resolve().parent


# What bench/cpuid_mask.c hides from CPUID under OTFUSE_CPUID_MASK=avx2 (bench/as_avx2_machine.py);
# /proc/cpuinfo still lists them, so the benches drop them from what they report.
CPUID_MASKED_PREFIXES = ("avx512", "amx", "avx_vnni", "avx_ifma")


def cpuid_mask() -> str | None:
    """'avx2' when this process runs under bench/cpuid_mask.c, else None."""
    return os.environ.get("OTFUSE_CPUID_MASK") or None


def cpu_flags() -> set[str]:
    """The CPU's feature flags as this process's CPUID shows them (/proc/cpuinfo, minus what
    bench/cpuid_mask.c hides), empty when unknown."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                if cpuid_mask():
                    flags = {f for f in flags if not f.startswith(CPUID_MASKED_PREFIXES)}
                return flags
    except OSError:
        pass
    return set()


def cpu_identity() -> str:
    """'AMD EPYC (family 25, model 1): avx2 fma f16c; no avx512f', from /proc/cpuinfo."""
    fields = _read_cpuinfo_fields(("cpu family", "model"))
    flags = cpu_flags()
    wanted = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "avx512_fp16", "amx_tile")
    have = [f for f in wanted if f in flags]
    missing = [f for f in ("avx2", "fma", "f16c", "avx512f") if f not in flags]
    ident = ", ".join(f"{k.split()[-1]} {v}" for k, v in fields.items())
    masked = f" [CPUID masked to {cpuid_mask()} by bench/cpuid_mask.c]" if cpuid_mask() else ""
    return (f"{cpu_model()} ({ident}): {' '.join(have) or 'no AVX2'}" + (f"; no {' '.join(missing)}" if missing else "")
            + masked)


def _read_cpuinfo_fields(keys) -> dict[str, str]:
    out: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in keys and key not in out:
                out[key] = value.strip()
            if not line.strip() and out:
                break
    except OSError:
        pass
    return out


def otfuse_isa_path(library: str | None = None) -> str:
    """The micro-kernels otfuse's CPU kernels take in this process, as the library itself reports
    them (OtfuseIsaReport: per family, and the measured 512/256-bit FMA rate behind the choice);
    `library` defaults to otfuse.library_path()."""
    try:
        from otfuse.run.library import describe_isa, isa_report
        return describe_isa(isa_report(library))
    except Exception as e:  # no library built: the benches still print the rest
        return f"unknown (no library: {e})"


def build_tool(name: str) -> Path | None:
    """bench/<name>.c compiled (gcc -O2 -pthread) into a cache folder; None without a compiler."""
    return _compiled(name, "", ["-pthread", *(["-mavx2"] if name == "stream_read" else [])])


def build_preload(name: str) -> Path | None:
    """bench/<name>.c compiled as a shared object for LD_PRELOAD, cached like build_tool."""
    return _compiled(name, ".so", ["-shared", "-fPIC"], libs=["-ldl"])


def _compiled(name: str, suffix: str, flags: list[str], libs: list[str] = ()) -> Path | None:
    """bench/<name>.c built once per source mtime into $OTFUSE_CACHE_DIR/bench (or ~/.cache/otfuse)."""
    import shutil
    import subprocess
    source = BENCH_DIR / f"{name}.c"
    cache = Path(os.environ.get("OTFUSE_CACHE_DIR", Path.home() / ".cache" / "otfuse")) / "bench"
    out = cache / f"{name}-{int(source.stat().st_mtime)}{suffix}"
    if out.exists():
        return out
    compiler = shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        return None
    cache.mkdir(parents=True, exist_ok=True)
    result = subprocess.run([compiler, "-O2", *flags, str(source), "-o", str(out), *libs], capture_output=True, text=True)
    return out if result.returncode == 0 else None


class ReadPass:
    """bench/stream_read.c's pass in this process (ctypes) over a pool of `threads` threads, in turn
    over `chunks` regions of `nbytes` each (a 64-byte aligned buffer, every page touched): one
    region stays in L3 between passes where it fits, regions past the L3 in turn read from memory.
    run() reads the next region with the pool's helpers woken for the pass (they sleep between
    passes, as ORT's intra-op threads with spinning off) and returns its (wall, CPU) seconds;
    run_spinning(count) reads the next `count` regions with the helpers spinning meanwhile (no
    wake-up: the plain bandwidth) and returns their wall seconds. available is False without AVX2
    or a compiler. One pool per process: every ReadPass must use the same `threads`."""

    def __init__(self, threads: int, nbytes: int, chunks: int = 1):
        import ctypes

        import numpy as np
        floats = max(32 * threads, int(nbytes) // 4 // (32 * threads) * (32 * threads))
        self.chunks, self.next = chunks, 0
        library = (_compiled("stream_read", "-pool.so", ["-shared", "-fPIC", "-mavx2", "-pthread",
                                                         "-DSTREAM_READ_LIBRARY"])
                   if "avx2" in cpu_flags() else None)
        self.available = library is not None
        if not self.available:
            return
        lib = ctypes.CDLL(str(library))
        lib.stream_read_pass.restype = ctypes.c_double
        lib.stream_read_pass.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        if lib.stream_read_start(threads) != 0:
            raise RuntimeError(f"stream_read's pool runs another thread count than {threads}")
        self._lib, self._floats = lib, floats
        raw = np.empty(floats * chunks + 16, dtype=np.float32)
        start = (-raw.ctypes.data % 64) // 4
        self._buffer = raw[start:start + floats * chunks]
        self._buffer[:] = np.arange(self._buffer.size, dtype=np.float32) % 1024  # touch every page

    def _region(self, advance: bool = True) -> int:
        address = self._buffer.ctypes.data + self.next * self._floats * 4
        if advance:
            self.next = (self.next + 1) % self.chunks
        return address

    def run(self) -> tuple[float, float]:
        c0 = time.process_time()
        wall = self._lib.stream_read_pass(self._region(), self._floats)
        return wall, time.process_time() - c0

    def run_spinning(self, count: int) -> float:
        self._lib.stream_read_spin(1)
        try:
            # one pass untimed while the helpers wake up to spin (over the next region, read again next)
            self._lib.stream_read_pass(self._region(advance=False), self._floats)
            return sum(self._lib.stream_read_pass(self._region(), self._floats) for _ in range(count))
        finally:
            self._lib.stream_read_spin(0)


def read_bandwidth(threads: int, megabytes: int = 461, reps: int = 10) -> dict | None:
    """Memory read bandwidth (bench/stream_read.c): best and median GB/s of `reps` passes over a
    `megabytes` buffer with `threads` threads; None when it cannot be built (no AVX2 or compiler)."""
    import re
    import subprocess
    if "avx2" not in cpu_flags():
        return None
    exe = build_tool("stream_read")
    if exe is None:
        return None
    out = subprocess.run([str(exe), str(threads), str(megabytes), str(reps)], capture_output=True, text=True).stdout
    match = re.search(r"best ([\d.]+) GB/s .* median ([\d.]+) GB/s", out)
    return {"best": float(match.group(1)), "median": float(match.group(2))} if match else None


def fma_peak(threads: int) -> dict[int, float]:
    """GFLOP/s of independent FMA chains per vector width the CPU has (bench/fma_peak.c)."""
    import re
    import subprocess
    exe = build_tool("fma_peak")
    if exe is None:
        return {}
    out = subprocess.run([str(exe), str(threads)], capture_output=True, text=True).stdout
    return {int(bits): float(g) for bits, g in re.findall(r"(\d+)-bit FMA, \d+ thread\(s\): ([\d.]+) GFLOP/s", out)}


def cpu_busy_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (/proc/stat, all cores)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def timed_run(run) -> tuple[float, float, float]:
    """(seconds, cores everyone else used meanwhile, CPU seconds this process used) of one call."""
    import time
    c0, b0, t0 = os.times(), cpu_busy_seconds(), time.perf_counter()
    run()
    wall = time.perf_counter() - t0
    c1, b1 = os.times(), cpu_busy_seconds()
    mine = (c1.user - c0.user) + (c1.system - c0.system)
    return wall, max(0.0, (b1 - b0) - mine) / wall, mine


def side_by_side(runs: list, wanted: int, max_turns: int, contended: float = 0.25, rotate: bool = False) -> list[dict]:
    """Each callable once as a warm-up, then turns of one call each until `wanted` turns were clean
    (everyone else under `contended` cores during every call of the turn) or `max_turns` ran.
    `rotate`: turn t starts with callable t mod n (then t + 1, ...), so that no callable always runs
    in the same slot after the same other one (a slot's own bias: bench/README.md, "norm_linear,
    session 16: fp16").
    Per callable: the median of the clean turns (of all turns when none was clean), the counts,
    the median load of the others, and per kept turn the seconds and this process's CPU seconds
    (`walls`, `cpus`: the same turns for every callable, so that ratios can be taken per turn)."""
    import statistics
    for run in runs:
        run()
    turns = []
    while len(turns) < max_turns:
        first = len(turns) % len(runs) if rotate else 0
        order = list(range(first, len(runs))) + list(range(first))
        timed = {i: timed_run(runs[i]) for i in order}
        turns.append([timed[i] for i in range(len(runs))])
        if sum(all(o < contended for _, o, _ in turn) for turn in turns) >= wanted:
            break
    clean = [turn for turn in turns if all(o < contended for _, o, _ in turn)]
    kept = clean or turns
    results = []
    for i in range(len(runs)):
        walls = [turn[i][0] for turn in kept]
        results.append({"median": statistics.median(walls), "clean": len(clean), "turns": len(turns),
                        "others": statistics.median(turn[i][1] for turn in turns), "walls": walls,
                        "cpus": [turn[i][2] for turn in kept]})
    return results


def paired_ratio(base: dict, other: dict, key: str = "walls") -> float:
    """The median over turns of base's time / other's time in the same turn (side_by_side): the
    speed-up, robust to load that changes between turns. NaN when no turn has both times above
    zero (a run of a few microseconds reads 0 CPU seconds: give it --repeat)."""
    import statistics
    ratios = [b / o for b, o in zip(base[key], other[key]) if b > 0 and o > 0]
    return statistics.median(ratios) if ratios else float("nan")


def ort_session(path, threads: int, library: bool = True):
    """An ORT CPU session of the model at `path` (or serialized, as bytes) as the benches run them:
    `threads` intra-op threads that do not spin (sessions taking turns in one process would otherwise
    spin into each other's runs) and, with `library`, otfuse's custom ops."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if library:
        use_checkout()
        import otfuse
        options.register_custom_ops_library(otfuse.library_path())
    model = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])


def matmul_model(m: int, k: int, widths):
    """float32 ``a [m, k]`` times one constant ``[k, n]`` per n in ``widths`` (outputs y0, y1, ...):
    what ORT multiplies at its MatMul rate, weights prepacked."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    nodes, inits, outputs = [], [], []
    for i, n in enumerate(widths):
        inits.append(numpy_helper.from_array(rng.standard_normal((k, n), dtype=np.float32), f"w{i}"))
        nodes.append(helper.make_node("MatMul", ["a", f"w{i}"], [f"y{i}"]))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, [m, n]))
    graph = helper.make_graph(nodes, "matmuls", [helper.make_tensor_value_info("a", TensorProto.FLOAT, [m, k])],
                              outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    return model


def ort_matmul_gflops(m: int, k: int, widths, threads: int, runs: int = 5) -> float:
    """GFLOP/s of ORT's MatMul (MLAS, weights prepacked as constants) on [m, k] x [k, n] for each
    n in `widths`, float32, one session, median of `runs` after a warm-up: the machine's GEMM rate
    on the shapes a bench multiplies."""
    import statistics
    import tempfile
    import time

    import numpy as np
    import onnx

    model = matmul_model(m, k, widths)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "matmuls.onnx"
        onnx.save(model, path)
        del model
        session = ort_session(path, threads, library=False)
    feeds = {"a": np.random.default_rng(1).standard_normal((m, k), dtype=np.float32)}
    session.run(None, feeds)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        times.append(time.perf_counter() - t0)
    return 2.0 * m * k * sum(widths) / statistics.median(times) * 1e-9


_MEMORY_PROBE = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[4])
import common
def status():
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) / 1024
    return out
before = status()["VmRSS"]
session = common.ort_session(sys.argv[1], int(sys.argv[2]))
after = status()["VmRSS"]
session.run(None, dict(np.load(sys.argv[3])))
print(json.dumps({"created_mib": after - before, "peak_rss_mib": status()["VmHWM"]}))
"""


def session_memory(model_path, threads: int, feeds_path, env: dict | None = None) -> dict | None:
    """In a fresh Python (so nothing else is resident): the RSS growth of creating an ORT session
    of `model_path` with otfuse's library (its weights as ORT holds them, plus what kernels keep)
    and the process's peak RSS after one run on the feeds saved in `feeds_path` (np.savez), MiB."""
    import json
    import subprocess
    result = subprocess.run([sys.executable, "-c", _MEMORY_PROBE, str(model_path), str(threads), str(feeds_path),
                             str(BENCH_DIR)], capture_output=True, text=True, env={**child_env(), **(env or {})})
    if result.returncode != 0:
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])
