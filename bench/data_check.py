"""The train stage's check of its data (`qwen_data.formats.integrity`): seconds and GB/s over prefixes
as `bench/verify.py` builds them, warm, on one thread and on every core (one file is one thread).

    python3 bench/data_check.py                             # 2 pretrain prefixes of 100M tokens + 1 packed SFT
    python3 bench/data_check.py --workdir /tmp/qd-verify    # reuse bench/verify.py's prefixes there
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import verify as verify_bench  # noqa: E402  (bench/verify.py: its prefixes)


def prefixes(workdir: str, tokens: int, sft_tokens: int, seq_length: int) -> list[str]:
    made = []
    for name, kind, count, seed in (("pretrain", "pretrain", tokens, 0), ("pretrain_b", "pretrain", tokens, 1),
                                    ("sft", "sft", sft_tokens, 0)):
        prefix = os.path.join(workdir, f"{name}_{count}")
        if not os.path.exists(prefix + ".json"):
            verify_bench.build(prefix, kind, count, seq_length, seed)
        made.append(prefix)
    return made


def timed(checked: list[str], threads: int) -> tuple[float, int]:
    from qwen_data.formats.integrity import check_prefixes
    from qwen_data.formats.manifest import Manifest

    sources = [(p, Manifest.read(p)) for p in checked]
    start = time.perf_counter()
    results = check_prefixes(sources, threads)
    seconds = time.perf_counter() - start
    problems = [r.problem for r in results if r.problem]
    if problems:
        raise SystemExit("\n".join(problems))
    return seconds, sum(r.bytes for r in results)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=100_000_000, help="tokens of each pretrain prefix (int32)")
    parser.add_argument("--sft-tokens", type=int, default=32_000_000, help="packed SFT tokens (4 + 1 bytes each)")
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--workdir", default=None, help="keep the prefixes here and reuse them")
    args = parser.parse_args()
    workdir = args.workdir or tempfile.mkdtemp(prefix="qwen-data-bench-check-")
    os.makedirs(workdir, exist_ok=True)
    checked = prefixes(workdir, args.tokens, args.sft_tokens, args.seq_length)
    for path in (p + s for p in checked for s in verify_bench.SUFFIXES if os.path.exists(p + s)):
        with open(path, "rb", buffering=0) as f:  # warm the page cache
            while f.read(1 << 24):
                pass
    for threads in sorted({1, os.cpu_count() or 1}):
        seconds, size = min(timed(checked, threads) for _ in range(3))
        print(f"{len(checked)} prefixes, {size / 1e9:.2f} GB, {threads} thread{'s' * (threads > 1)}: "
              f"{seconds:.2f} s = {size / seconds / 1e9:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
