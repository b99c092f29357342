"""Bench (issue #12): where a sliding-window attention call's time goes, by fitting it over widths.

One causal Attention node (B = 1, 16 heads x 128, as bench/attention_paths.py builds it) is timed
at S query rows and keys for several window widths, in alternating turns in one process, and the
median CPU time per call is fitted as

    time = per_task * tasks + per_pair * visible (query, key) pairs

by least squares. `per_pair` is the cost that grows with the window (the tile GEMMs and the softmax
over the band); `per_task` is what every 64-row task pays whatever its width: packing its new keys,
loading its queries, storing its rows, and the band's two edges. At S = 2048 and window S/4 the
fixed part is the share of the call that no faster full tile can remove (bench/README.md,
"Attention, session 21").

    python bench/attention_window_fit.py                        # S = 2048, windows S/16 .. S/2
    python bench/attention_window_fit.py --size 8192 --fractions 0.0625 0.125 0.25
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path as FsPath

import numpy as np

sys.path.insert(0, str(FsPath(__file__).resolve().parent))
import attention_paths as paths  # noqa: E402
import common  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.0625, 0.125, 0.25, 0.5],
                        help="window widths as fractions of the size (at least two)")
    parser.add_argument("--turns", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--block-q", type=int, default=64, help="query rows per task (the library's tiles)")
    args = parser.parse_args(argv)
    if len(args.fractions) < 2:
        parser.error("--fractions needs two widths or more to fit a line")
    library = paths.our_library()
    print(f"{common.cpu_identity()}, threads {args.threads}; library {library}")
    print(paths.isa_line(library, None))
    cases = []
    for fraction in args.fractions:
        p = paths.Path(f"window {fraction:g}", causal=True, window=fraction)
        model, feeds = paths.build(p, args.size)
        sess = paths.session(model, args.threads, None, library)
        sess.run(None, feeds)
        cases.append((p, sess, feeds, []))
    # Each turn runs every width for about as long as the widest's one call.
    seconds = paths.one_call_seconds([lambda s=s, f=f: s.run(None, f) for _, s, f, _ in cases])
    calls = paths.equal_turn_calls(seconds)
    for turn in range(args.turns):
        order = list(zip(cases, calls))
        for (p, sess, feeds, times), n in order if turn % 2 == 0 else order[::-1]:
            c0 = time.process_time()
            for _ in range(n):
                sess.run(None, feeds)
            times.append((time.process_time() - c0) / n)
    tasks = paths.HEADS * ((args.size + args.block_q - 1) // args.block_q)
    pairs = np.array([paths.visible_pairs(p, args.size) * p.heads for p, *_ in cases], dtype=np.float64)
    medians = np.array([statistics.median(t) for *_, t in cases])
    fit = np.linalg.lstsq(np.stack([np.full_like(pairs, tasks), pairs], axis=1), medians, rcond=None)[0]
    per_task, per_pair = fit
    print(f"\nS = {args.size}, {tasks} tasks of {args.block_q} rows, median CPU time of {args.turns} turns")
    print(f"{'window':>8} {'pairs':>12} {'CPU ms':>9} {'GFLOP/s':>8} {'fixed share':>12}")
    for (p, *_), pair_count, median in zip(cases, pairs, medians):
        gflops = paths.useful_flops(p, args.size) / (median / args.threads) * 1e-9
        print(f"{paths.window_of(p, args.size):8d} {int(pair_count):12d} {median * 1e3:9.2f} {gflops:8.1f} "
              f"{per_task * tasks / median:12.1%}")
    print(f"fit: per task {per_task * 1e6:.2f} us CPU = {per_task / (per_pair * args.block_q * 128):.2f} full "
          f"{args.block_q} x 128 tiles; per pair {per_pair * 1e9:.3f} ns CPU")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
