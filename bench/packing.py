"""Packing (`qwen_data.formats.packing`) on tests/data/test_packing.py's realistic SFT lengths: best fit all at once,
window after window as `sft --pack` packs, and next-fit in input order (`--packing next-fit`); time, rows and fill.

    python3 bench/packing.py [--samples 1000000] [--capacity 4096]
"""

import argparse
import importlib.util
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from qwen_data.formats.packing import next_fit, pack, window_plans  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=1_000_000)
    parser.add_argument("--capacity", type=int, default=4096)
    args = parser.parse_args()
    spec = importlib.util.spec_from_file_location("tests", os.path.join(ROOT, "tests", "data", "test_packing.py"))
    tests = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tests)
    lengths = tests.realistic_sft_lengths(args.samples, capacity=args.capacity)
    tokens = int(lengths.sum())
    print(f"{len(lengths):,} samples, {tokens:,} tokens, mean {lengths.mean():.0f}; capacity {args.capacity}: "
          f"at least {-(-tokens // args.capacity):,} rows")
    cap = args.capacity
    ways = {"best fit, all at once": lambda: [pack(lengths, cap)],
            "best fit, window by window": lambda: [plan for _, plan in window_plans(lengths, "best-fit", cap)],
            "next-fit in input order": lambda: [next_fit(lengths, cap)]}
    for name, plans in ways.items():
        start = time.perf_counter()
        rows = sum(plan.rows for plan in plans())
        print(f"{name:27} {time.perf_counter() - start:6.3f} s  {rows:,} rows  fill {tokens / rows / cap:.4%}")


if __name__ == "__main__":
    main()
