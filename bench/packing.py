"""Packing (`qwen_data.formats.packing`) on tests/data/test_packing.py's realistic SFT lengths: best fit all at once,
window after window as `sft --pack` packs, and next-fit in input order (`--packing next-fit`); time, rows and fill.

    python3 bench/packing.py [--samples 1000000] [--capacity 4096]
"""

import argparse
import os
import sys
import time

import measure  # first: this checkout's qwen_data
from qwen_data.formats.packing import next_fit, pack, window_plans

sys.path.insert(1, os.path.join(measure.REPO_ROOT, "tests", "data"))
from test_packing import realistic_sft_lengths  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=4096)
    args = parser.parse_args()
    cap = args.capacity
    lengths = realistic_sft_lengths(args.samples, capacity=cap)
    tokens = int(lengths.sum())
    print(f"{len(lengths):,} samples, {tokens:,} tokens, mean {lengths.mean():.0f}; capacity {cap}: "
          f"at least {-(-tokens // cap):,} rows")
    ways = {"best fit, all at once": lambda: [pack(lengths, cap)],
            "best fit, window by window": lambda: [plan for _, plan in window_plans(lengths, "best-fit", cap)],
            "next-fit in input order": lambda: [next_fit(lengths, cap)]}
    for name, plans in ways.items():
        start = time.perf_counter()
        rows = sum(plan.rows for plan in plans())
        print(f"{name:27} {time.perf_counter() - start:6.3f} s  {rows:,} rows  fill {tokens / rows / cap:.4%}")


if __name__ == "__main__":
    main()
