"""What the packed attention path computes on a causal / sliding-window band, against the useful
work bench/attention_paths.py counts (bench/README.md, "Session 12, window"). Pure arithmetic that
mirrors the kernel's tiling (kernels/cpu/attention_tiles/phases.inc, Attend; panel_gemms.inc,
KeyBand / PanelSpan): a task per 64 query rows, key tiles of 128 aligned to multiples of 128, the
16-key panels below the first row's window start skipped; on the tiles crossing the diagonal or
the window's lower edge the tile kernels skip, per row block of 14 rows (AVX-512; 6 on AVX2:
--row-block 6), the key panels (Q·Kᵀ) and the keys (P·V) no row of the block sees; the softmax runs over every column of a visited tile.

    python bench/attention_band_work.py                      # S = 2048, window S/4 and causal
    python bench/attention_band_work.py --s 4096 --window 1024 --row-block 6
"""

from __future__ import annotations

import argparse

PANEL = 16


def row_blocks(rows: int, block: int) -> list[tuple[int, int]]:
    full = [(r, block) for r in range(0, rows - rows % block, block)]
    return full + ([(rows - rows % block, rows % block)] if rows % block else [])


def qk_keys(k0: int, k1: int, n: int, pairs: bool) -> int:
    """Keys Q·Kᵀ computes for a row block seeing [k0, k1) of a tile of n keys (AVX-512: panels in
    pairs, a lone panel of a pair alone; AVX2: panel by panel)."""
    panels, done, p = (n + PANEL - 1) // PANEL, 0, 0
    while p < panels:
        pair = 2 if pairs and p + 2 <= panels else 1
        first, last = max(k0 // PANEL, p), min((k1 + PANEL - 1) // PANEL, p + pair)
        done += PANEL * (pair if last - first == pair else 1 if last > first else 0)
        p += pair
    return done


def tile_work(window: int, i0: int, rows: int, tile0: int, kv: tuple[int, int], args) -> dict:
    """One tile visit of the task at rows [i0, i0 + rows): pairs of Q·Kᵀ, P·V and softmax columns."""
    kv_begin, kv_end = kv
    skip = (kv_begin - tile0) // PANEL * PANEL if tile0 < kv_begin else 0
    j0, n = tile0 + skip, min(args.block_kv, kv_end - tile0) - skip
    edge = j0 + n - 1 > i0 or (window > 0 and j0 <= i0 + rows - 1 - window)
    lo = i0 - window + 1 - j0 if edge and window else -(1 << 40)
    hi = i0 + 1 - j0 if edge else 1 << 40
    out = {"qk": 0, "pv": 0, "softmax": rows * n, "edge": edge}
    for r, mr in row_blocks(rows, args.row_block):
        k0 = min(max(lo + r, 0), n)
        k1 = max(min(max(hi + r + mr - 1, 0), n), k0)
        out["qk"] += mr * qk_keys(k0, k1, n, args.row_block == 14)
        out["pv"] += mr * (k1 - k0)
    return out


def account(s: int, window: int, args) -> dict:
    total = {"useful": 0, "qk": 0, "pv": 0, "softmax": 0, "visits": 0, "edge visits": 0}
    for i0 in range(0, s, args.block_q):
        rows = min(args.block_q, s - i0)
        kv_begin, kv_end = (max(0, i0 - window + 1) if window else 0), min(s, i0 + rows)
        total["useful"] += sum(t + 1 - (max(0, t - window + 1) if window else 0) for t in range(i0, i0 + rows))
        first = kv_begin // args.block_kv * args.block_kv
        for tile0 in range(first, kv_end, args.block_kv):
            work = tile_work(window, i0, rows, tile0, (kv_begin, kv_end), args)
            for key in ("qk", "pv", "softmax"):
                total[key] += work[key]
            total["visits"] += 1
            total["edge visits"] += work["edge"]
    return total


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--s", type=int, default=2048)
    parser.add_argument("--window", type=int, nargs="+", help="windows to account (default S/4 and 0 = causal)")
    parser.add_argument("--block-q", type=int, default=64)
    parser.add_argument("--block-kv", type=int, default=128)
    parser.add_argument("--row-block", type=int, default=14)
    args = parser.parse_args(argv)
    for window in args.window or [args.s // 4, 0]:
        t = account(args.s, window, args)
        useful = t["useful"]
        print(f"S = {args.s}, {'window ' + str(window) if window else 'causal'}, tiles {args.block_q} x "
              f"{args.block_kv}, row blocks of {args.row_block}: {useful} visible pairs per head, "
              f"{t['visits']} tile visits ({t['edge visits']} on an edge)")
        print(f"  computed / useful: Q·Kᵀ {t['qk'] / useful:.4f}, P·V {t['pv'] / useful:.4f}, "
              f"FMAs {(t['qk'] + t['pv']) / (2 * useful):.4f}, softmax columns {t['softmax'] / useful:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
