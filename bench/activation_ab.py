#!/usr/bin/env python3
"""Two or more builds of the activation kernels side by side in one process: bench/activation_kernel.py's
models, inputs and stream_read, one session per library taking turns in each round, best of REPEAT.

ORT's intra-op pool threads spin after a run, and a spinning pool of one session takes the cores of
the next (measured: the second library of a pair ran 2-4x slower whichever it was), so every session
here has spinning off (session.intra_op.allow_spinning = 0).

    python bench/activation_ab.py THREADS REPEAT before.so after.so [...] -- gelu_erf:float16 silu:float32 ...
"""
import os
import sys
import tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parent))
import activation_kernel as ak  # noqa: E402
import numpy as np  # noqa: E402
from rope_kernel import BoundRun  # noqa: E402
import onnxruntime as ort  # noqa: E402
def session(model, threads, library):
    """rope_kernel.session without spinning pool threads (a spinning pool steals the other sessions' cores)."""
    o = ort.SessionOptions(); o.intra_op_num_threads = threads; o.inter_op_num_threads = 1
    o.add_session_config_entry("session.intra_op.allow_spinning", "0")
    o.register_custom_ops_library(library)
    return ort.InferenceSession(model.SerializeToString(), o, providers=["CPUExecutionProvider"])
args = sys.argv[1:]; cut = args.index("--")
threads, repeat, libs, cases = int(args[0]), int(args[1]), args[2:cut], args[cut + 1:]
shape = (8192, 5632)
print(ak.common.cpu_identity(), "ISA", os.environ.get("OTFUSE_ACTIVATION_ISA", "default"), ak.common.machine_info()["date"],
      "loadavg", open("/proc/loadavg").read().split()[:3], flush=True)
with tempfile.TemporaryDirectory() as folder:
    for case in cases:
        op, dtype = case.split(":")
        fused_model, _, names = ak.models(op, dtype, shape)
        rng = np.random.default_rng(len(op))
        feeds = {n: (rng.standard_normal(ak.input_shape(op, shape), dtype=np.float32) * 2).astype(dtype) for n in names}
        ys = [np.empty(shape, dtype) for _ in libs]
        runs = [BoundRun(session(fused_model, threads, lib), feeds, y) for lib, y in zip(libs, ys)]
        traffic = sum(a.nbytes for a in feeds.values()) + ys[0].nbytes
        stream = ak.StreamRead(threads, max(1, traffic // 10**6), Path(folder))
        for r in runs + runs: r()
        best = [1e9] * len(runs); cpu = [0] * len(runs); bw = 0
        for _ in range(repeat):
            for k, r in enumerate(runs):
                w, c = ak._timed(r)
                if w < best[k]: best[k], cpu[k] = w, c
            bw = max(bw, stream(3))
        ref = ak.reference_output(op, feeds, slice(0, 8))
        tol = 1e-4 if dtype == "float32" else 1e-2
        ok = [bool(np.all(np.abs(y[:8] - ref) <= tol + tol * np.abs(ref))) for y in ys]
        cells = "  ".join(f"{Path(l).stem} {b*1e3:6.1f} ms (cpu {c*1e3:5.1f}) {traffic/b/1e9/bw:5.0%}{'' if o else ' DIFFER'}"
                          for l, b, c, o in zip(libs, best, cpu, ok))
        print(f"{op:12} {dtype:8} read {bw:5.1f} GB/s  {cells}", flush=True)
print("loadavg after", open("/proc/loadavg").read().split()[:3])
