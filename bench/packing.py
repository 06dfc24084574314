"""Benchmark of qwen_data.formats.packing.pack against simple baselines run in the same process.

    python3 bench/packing.py [--samples 1000000] [--capacity 4096] [--ffd-subset 50000]

Lengths: tests/data/test_packing.py's realistic SFT mix. Baselines: next-fit in input order on all samples, a
plain first-fit-decreasing on a subset; then one window's `padded_rows` against a plain copy of its tokens.
"""

from __future__ import annotations

import argparse
import importlib.util
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from qwen_data.formats.packing import PACK_WINDOW, RowBuffers, next_fit, next_window, pack, padded_rows  # noqa: E402


def load_realistic_lengths():
    spec = importlib.util.spec_from_file_location("test_packing", ROOT / "tests" / "data" / "test_packing.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.realistic_sft_lengths


def first_fit_decreasing(lengths, capacity) -> int:
    free = np.empty(len(lengths), dtype=np.int64)
    rows = 0
    for s in np.sort(lengths)[::-1].tolist():
        fits = np.flatnonzero(free[:rows] >= s)
        if fits.size:
            free[fits[0]] -= s
        else:
            free[rows] = capacity - s
            rows += 1
    return rows


def timed(fn, *args, repeat=1):
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn(*args)
        best = min(best, time.perf_counter() - start)
    return best, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=4096)
    parser.add_argument("--ffd-subset", type=int, default=50_000)
    args = parser.parse_args()
    cap = args.capacity

    lengths = load_realistic_lengths()(args.samples, capacity=cap)
    tokens = int(lengths.sum())
    bound = -(-tokens // cap)
    p50, p90, p99 = np.percentile(lengths, [50, 90, 99])
    print(f"lengths: {len(lengths):,} samples, {tokens:,} tokens, mean {lengths.mean():.0f},"
          f" p50 {p50:.0f}, p90 {p90:.0f}, p99 {p99:.0f}, max {lengths.max()}; capacity {cap}")
    print(f"volume lower bound: {bound:,} rows")

    t_pack, plan = timed(pack, lengths, cap, repeat=3)
    print(f"pack (best-fit decreasing): {t_pack:.3f} s (best of 3), {plan.rows:,} rows,"
          f" fill {plan.fill:.6f}, pad {plan.pad_tokens:,} tokens,"
          f" rows / lower bound {plan.rows / bound:.6f}")

    t_next, next_plan = timed(next_fit, lengths, cap)
    next_rows = next_plan.rows
    next_fill = tokens / (next_rows * cap)
    print(f"baseline next-fit in input order: {t_next:.3f} s, {next_rows:,} rows, fill {next_fill:.6f}")
    print(f"  pack vs next-fit: time x{t_pack / t_next:.2f}, rows x{plan.rows / next_rows:.4f},"
          f" pad tokens x{plan.pad_tokens / (next_rows * cap - tokens):.4f}")

    subset = lengths[: args.ffd_subset]
    t_sub, sub_plan = timed(pack, subset, cap, repeat=3)
    t_ffd, ffd_rows = timed(first_fit_decreasing, subset, cap)
    print(f"subset of {len(subset):,}: pack {t_sub:.3f} s, {sub_plan.rows:,} rows;"
          f" naive first-fit decreasing {t_ffd:.3f} s, {ffd_rows:,} rows")
    print(f"  pack vs naive FFD: {t_ffd / t_sub:.1f}x faster, rows x{sub_plan.rows / ffd_rows:.4f}")

    stress = np.random.default_rng(1).integers(1, cap + 1, args.samples)
    t_stress, stress_plan = timed(pack, stress, cap)
    print(f"stress, {args.samples:,} lengths uniform in 1..{cap}: pack {t_stress:.3f} s,"
          f" {stress_plan.rows:,} rows, fill {stress_plan.fill:.6f}")
    lay_out_one_window(lengths, cap)


def lay_out_one_window(lengths, cap: int) -> None:
    window = next_window(lengths, "best-fit", cap, final=True)
    lengths = lengths[:len(window.order)]
    rng = np.random.default_rng(2)
    ids = rng.integers(0, 151643, int(lengths.sum()), dtype=np.int32)
    mask = rng.integers(0, 2, len(ids), dtype=np.uint8)
    buffers = RowBuffers()
    t_rows, _ = timed(padded_rows, ids, mask, lengths, window, 151654, buffers, repeat=5)
    out_ids, out_mask = buffers.take(window.rows * cap, ids.dtype)

    def copy() -> None:
        np.copyto(out_ids[:len(ids)], ids)
        np.copyto(out_mask[:len(mask)], mask)

    t_copy, _ = timed(copy, repeat=5)
    print(f"one window ({len(ids):,} tokens of {len(lengths):,} samples, PACK_WINDOW {PACK_WINDOW:,}): rows laid out in"
          f" {1000 * t_rows:.1f} ms, {t_rows / t_copy:.1f}x a plain copy of its tokens ({1000 * t_copy:.1f} ms)")


if __name__ == "__main__":
    main()
