"""The certificate's spelling loop (`_native.misspelled`) alone: this tree's C against another revision's, both
built into a temporary folder and loaded in this one process, run in turn over the same chunks (the bench text
encoded 500 documents at a time, as a worker holds them); ns a token, and this tree's / the other's.

    python3 bench/spelling.py --against HEAD~1 [--documents 30000] [--rounds 8]
"""

import argparse
import glob
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
import time

import numpy as np

import measure  # first: this checkout's qwen_data
import corpora
from qwen_data.certify.spelling import Speller
from qwen_data.text.tokenizer import QwenTokenizer

CHUNK = 500
# Entry as revisions before the barred ids' length laid it out: a byte saying whether a text may hold the id
ALLOWED_BYTE = np.dtype([("head", "<u8"), ("offset", "<u4"), ("length", "<u2"), ("allowed", "u1"), ("unused", "u1")])


def entries_for(source: str, speller: Speller) -> np.ndarray:
    """The table laid out as the C `source` reads it."""
    if "uint8_t allowed;" not in source:
        return speller.entries
    table = speller.table
    old = np.zeros(len(table.lengths), ALLOWED_BYTE)
    old["head"] = speller.entries.view("<u8")[::2]
    old["offset"], old["length"], old["allowed"] = table.starts[:-1], table.lengths, speller.may_hold
    return old.view(np.uint8)


def built(source: str, folder: str, name: str):
    """`misspelled` of the C `source`, compiled as the package builds it (`measure.build_native`) and loaded
    under `name`."""
    os.makedirs(folder)
    path = os.path.join(folder, "_native.c")
    with open(path, "w", encoding="utf-8") as f:
        f.write(source)
    out = os.path.join(folder, "_native" + sysconfig.get_config_var("EXT_SUFFIX"))
    measure.build_native(path, out, np.get_include())
    spec = importlib.util.spec_from_file_location(f"{name}._native", glob.glob(out)[0])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.misspelled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", default="HEAD", help="the git revision whose _native.c is the baseline")
    parser.add_argument("--text", help="a jsonl corpus (default: bench/corpora.py's text)")
    parser.add_argument("--documents", type=int, default=30000)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    with open(os.path.join(measure.REPO_ROOT, "qwen_data", "_native.c"), encoding="utf-8") as f:
        ours = f.read()
    theirs = subprocess.run(["git", "show", f"{args.against}:qwen_data/_native.c"], cwd=measure.REPO_ROOT,
                            check=True, capture_output=True, text=True).stdout
    with tempfile.TemporaryDirectory() as work:
        loops = {"ours": built(ours, os.path.join(work, "ours"), "ours"),
                 args.against: built(theirs, os.path.join(work, "theirs"), "theirs")}
        tokenizer = QwenTokenizer.shared()
        tokenizer.prepare("parse")
        speller = Speller(tokenizer, "parse")
        with open(args.text or corpora.text_corpus(), encoding="utf-8") as f:
            texts = [json.loads(line)["text"] for line, _ in zip(f, range(args.documents))]
        tables = {"ours": entries_for(ours, speller), args.against: entries_for(theirs, speller)}
        chunks = []
        for k in range(0, len(texts), CHUNK):
            ids, counts = tokenizer.encode_batch(texts[k:k + CHUNK])
            chunks.append((np.ascontiguousarray(ids, np.int32), np.ascontiguousarray(counts, np.int64),
                           tokenizer.as_encoded or [normalized for normalized in texts[k:k + CHUNK]]))
        tokens = sum(len(ids) for ids, _, _ in chunks)
        times = {name: [] for name in loops}
        for r in range(args.rounds):
            for name in (list(loops) if r % 2 else list(loops)[::-1]):  # the order flips every round
                loop, start = loops[name], time.perf_counter()
                for ids, counts, spelled in chunks:
                    if loop(ids, counts, spelled, tables[name], speller.table.flat, 0) != -1:
                        sys.exit(f"{name}: a document of the bench text does not spell")
                times[name].append((time.perf_counter() - start) / tokens * 1e9)
    best = {name: min(t) for name, t in times.items()}
    for name, t in times.items():
        print(f"{name:>12}: best {best[name]:.2f} ns a token, median {sorted(t)[len(t) // 2]:.2f} ({tokens:,} tokens)")
    print(f"ours / {args.against}: {best['ours'] / best[args.against]:.2f}")


if __name__ == "__main__":
    main()
