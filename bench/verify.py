"""`qwen-data verify` speed and memory on one core, against a plain sequential read of the same files.

    python3 bench/verify.py                      # ~400 MB pretrain prefix + ~170 MB packed SFT prefix
    python3 bench/verify.py --tokens 50e6 --repeat 3 --workdir /tmp/qd-verify

The prefixes are random ids laid out as the pipelines lay them out (`build`). Each measurement is a child
process pinned to one core, timed inside around the work alone; both run warm. Target: verify >= 200 MB/s.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import measure  # noqa: E402

SUFFIXES = (".bin", ".idx", ".lossmask.bin", ".lossmask.idx")


def files(prefix: str) -> list[str]:
    return [prefix + s for s in SUFFIXES if os.path.exists(prefix + s)]


def build(prefix: str, kind: str, tokens: int, seq_length: int, seed: int = 0) -> None:
    """A prefix of about `tokens` random tokens, laid out as the pipelines lay it out."""
    from qwen_data.formats.indexed import IndexedDatasetWriter, MaskedWriter, token_dtype
    from qwen_data.formats.manifest import Manifest, SFTSection, fingerprinted
    from qwen_data.formats.outputs import atomic_file
    from qwen_data.qwen import DEFAULT_PAD_ID
    from qwen_data.text.tokenizer import QwenTokenizer, TokenizerConfig

    tokenizer = QwenTokenizer(TokenizerConfig())
    dtype = token_dtype(tokenizer.vocab_size)
    rng = np.random.default_rng(seed)
    sft = None
    if kind == "pretrain":
        writer = IndexedDatasetWriter(prefix + ".bin", prefix + ".idx", dtype)
        while writer.tokens < tokens:
            lengths = rng.integers(1, 2000, 4096)
            batch = rng.integers(0, 151000, int(lengths.sum()), dtype=np.int32)
            batch[np.cumsum(lengths) - 1] = tokenizer.eod_id
            writer.add_batch(batch, lengths)
        writer.finalize()
        ids, digests = writer, [writer.digests]
    else:
        writer = MaskedWriter(MaskedWriter.files(prefix), dtype)
        sft = {"seq_length": seq_length, "packed": True, "samples": 0, "pad_tokens": 0, "trained_tokens": 0}
        while writer.ids.tokens < tokens:
            _packed_rows(writer, rng, seq_length, DEFAULT_PAD_ID, sft)
        writer.finalize()
        ids, digests = writer.ids, writer.digests
        sft.update(rows=ids.documents, sample_tokens=ids.tokens - sft["pad_tokens"])
    manifest = Manifest(kind=kind, tokenizer=tokenizer.identity(), eod_id=tokenizer.eod_id, pad_id=DEFAULT_PAD_ID,
                        dtype=dtype.name, documents=ids.documents, sequences=ids.sequences, tokens=ids.tokens,
                        **fingerprinted(digests), sft=SFTSection.from_json(sft) if sft else None)
    with atomic_file(prefix + ".json") as f:  # a prefix is reused only once complete
        f.write(manifest.text())


def _packed_rows(writer, rng, seq_length: int, pad: int, sft: dict, rows: int = 256) -> None:
    """Rows of seq_length: samples, then one pad-only sequence when the row is not full; counts into `sft`."""
    seq_lengths, per_row, tok_parts, mask_parts = [], [], [], []
    for _ in range(rows):
        row = [int(n) for n in rng.integers(64, seq_length // 3, 4)]
        while sum(row) > seq_length:
            row.pop()
        filled = sum(row)
        tok_parts.append(rng.integers(0, 151000, filled, dtype=np.int32))
        mask_parts.append(rng.integers(0, 2, filled, dtype=np.uint8))
        sft["samples"] += len(row)
        if filled < seq_length:
            row.append(seq_length - filled)
            tok_parts.append(np.full(seq_length - filled, pad, np.int32))
            mask_parts.append(np.zeros(seq_length - filled, np.uint8))
            sft["pad_tokens"] += seq_length - filled
        seq_lengths += row
        per_row.append(len(row))
    mask = np.concatenate(mask_parts)
    sft["trained_tokens"] += int(mask.sum())
    writer.add_batch(np.concatenate(tok_parts), mask, seq_lengths, per_row)


def child(work: str, prefix: str, cpu: int) -> None:
    """In the measured process: pin to one core, do the work, print its own timing as JSON."""
    os.sched_setaffinity(0, {cpu})
    from qwen_data.tools.verify import verify

    start = time.perf_counter()
    if work == "verify":
        problems = verify(prefix)
        if problems:
            raise SystemExit("verify found problems:\n" + "\n".join(problems))
    else:
        buf = bytearray(1 << 24)
        for path in files(prefix):
            with open(path, "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass
    print(json.dumps({"seconds": time.perf_counter() - start}))


def measure_work(work: str, prefix: str, cpu: int, repeat: int) -> tuple[float, int]:
    """(fastest seconds, peak RSS bytes of that run's process) over `repeat` runs."""
    best = None
    for _ in range(repeat):
        m = measure.run_measured([sys.executable, os.path.abspath(__file__), "--child", work, prefix, "--cpu", cpu],
                                 env=measure.python_env(), interval=0.01).check()
        seconds = json.loads(m.stdout.strip().splitlines()[-1])["seconds"]
        if best is None or seconds < best[0]:
            best = (seconds, m.peak_rss)
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=float, default=100e6, help="pretrain tokens (int32: 4 bytes each)")
    parser.add_argument("--sft-tokens", type=float, default=32e6, help="packed SFT tokens (4 + 1 bytes each)")
    parser.add_argument("--seq-length", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3, help="fastest of N runs counts")
    parser.add_argument("--cpu", type=int, default=None, help="core to pin to (default: the last one)")
    parser.add_argument("--workdir", default=None, help="keep the prefixes here and reuse them")
    parser.add_argument("--child", nargs=2, metavar=("WORK", "PREFIX"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    cpu = args.cpu if args.cpu is not None else max(os.sched_getaffinity(0))
    if args.child:
        child(args.child[0], args.child[1], cpu)
        return 0
    workdir = args.workdir or tempfile.mkdtemp(prefix="qwen-data-bench-verify-")
    os.makedirs(workdir, exist_ok=True)
    failed = False
    for kind, tokens in (("pretrain", args.tokens), ("sft", args.sft_tokens)):
        prefix = os.path.join(workdir, f"{kind}_{int(tokens)}")
        if not os.path.exists(prefix + ".json"):
            start = time.perf_counter()
            build(prefix, kind, int(tokens), args.seq_length)
            print(f"built {prefix} in {time.perf_counter() - start:.1f} s")
        size = sum(map(os.path.getsize, files(prefix)))
        read_s, read_rss = measure_work("read", prefix, cpu, args.repeat)
        verify_s, verify_rss = measure_work("verify", prefix, cpu, args.repeat)
        speed, baseline = size / verify_s / measure.MB, size / read_s / measure.MB
        failed |= speed < 200
        print(f"{kind:<8} {size / measure.MB:,.0f} MB on core {cpu}: verify {verify_s:.2f} s = {speed:,.0f} MB/s, "
              f"peak RSS {verify_rss / measure.MB:,.0f} MB | sequential read {read_s:.2f} s = {baseline:,.0f} MB/s, "
              f"peak RSS {read_rss / measure.MB:,.0f} MB | verify / read = {speed / baseline:.2f}"
              f"{'' if speed >= 200 else '  BELOW the 200 MB/s target'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
