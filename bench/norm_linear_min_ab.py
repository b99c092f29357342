"""Min-of-N A/B of bench/norm_linear_ab.py's block: the unfused block, the fused one on a reference library
(MAIN_LIBRARY, e.g. main's build) and on OTFUSE_LIBRARY (custom-op route), and on OTFUSE_LIBRARY's plugin EP;
per M the sessions run round-robin ROUNDS times (order reversed every other round), every output checked
bit for bit against the reference library's. Prints unfused / fused by the minimum and by the 25th
percentile of each session's times (robust to another process's bursts on a shared machine, where
medians of paired ratios moved +-10%), and the two libraries' ratio (bench/README.md, "norm_linear,
65-256 rows, session 15"). Not a test.

    MAIN_LIBRARY=/tmp/main.so python bench/norm_linear_min_ab.py SHAPE fp32|fp16 ROUNDS M...
"""
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np
import norm_linear_ab as ab
import norm_linear as nl
import common  # noqa: E402

common.use_checkout()

shape, dtype_name, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
tokens = [int(t) for t in sys.argv[4:]]
ab.use_shape(shape)
dtype = np.float32 if dtype_name == "fp32" else np.float16
new_lib = os.environ["OTFUSE_LIBRARY"]
print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; CPU {common.cpu_identity()}; shape {shape} {nl.WIDTHS} {dtype_name}", flush=True)
with tempfile.TemporaryDirectory() as folder:
    src, base, fused = ab.write_block_models(Path(folder), dtype)
    names = ["unfused", "main", "new", "ep"]
    sess = [ab.session(base, 2, new_lib, {}), ab.session(fused, 2, os.environ["MAIN_LIBRARY"], {}),
            ab.session(fused, 2, new_lib, {}), ab.session(fused, 2, new_lib, {}, ep=True)]
    for m in tokens:
        feeds = nl.feeds_for(m, dtype)
        outs = [s.run(None, feeds) for s in sess]
        for o in outs[2:]:
            for a, b in zip(outs[1], o):
                assert np.array_equal(a, b), "new differs from main"
        times = [[] for _ in sess]
        for r in range(rounds):
            for i in (range(len(sess)) if r % 2 == 0 else reversed(range(len(sess)))):
                t0 = time.perf_counter(); sess[i].run(None, feeds); times[i].append(time.perf_counter() - t0)
        mins = [min(t) for t in times]
        q25 = [float(np.percentile(t, 25)) for t in times]
        line = f"{dtype_name} {shape} M={m}: unfused min {mins[0]*1e3:.2f} ms |"
        for i in range(1, len(sess)):
            line += f" {names[i]} {mins[0]/mins[i]:.3f}x (q25 {q25[0]/q25[i]:.3f}x) |"
        line += f" new/main min {mins[1]/mins[2]:.3f}x q25 {q25[1]/q25[2]:.3f}x"
        print(line, flush=True)
