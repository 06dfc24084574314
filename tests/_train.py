"""Helpers of the train-stage tests: the train stage run as a user runs it, and qwen-data
prefixes read straight from their bytes (own parser, independent of megatron-core's reader and
of train/data.py)."""

from __future__ import annotations

import json
import os
import random
import re
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np

EOD = 151643


def torchrun(nproc: int) -> list[str]:
    """torchrun on a port of this test process's own (pytest-xdist workers run side by side)."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
            "--master-port", str(29400 + 250 * worker + os.getpid() % 250)]


# glibc hands every block over its mmap threshold back to the kernel when freed, and the next one of
# that size faults its pages in again. A CPU step allocates and frees tensors of tens to hundreds of
# MB (the output layer's chunk of [tokens, 151,936] logits and their gradient): with blocks kept in
# the heap a tiny model's step takes ~2-3x less time (most of it was the kernel's).
KEEP_FREED_MEMORY = {"MALLOC_MMAP_THRESHOLD_": str(2**32), "MALLOC_TRIM_THRESHOLD_": str(2**36)}


def run(command: list[str]) -> str:
    """Run a train-stage command (one thread per process); → its stdout. It prints no Python warning
    (megatron-core's notices are silenced unless QWEN_DATA_VERBOSE is set)."""
    env = {k: v for k, v in os.environ.items() if k != "QWEN_DATA_VERBOSE"}
    done = subprocess.run(command, env=dict(env, OMP_NUM_THREADS="1", **KEEP_FREED_MEMORY), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    warned = re.findall(r"^.*:\d+: \w*Warning: .*$", done.stderr, re.MULTILINE)  # FILE:LINE: CATEGORY: message
    assert not warned, "warnings on stderr:\n" + "\n".join(warned)
    return done.stdout


def run_train(args, log, nproc=1):
    """`qwen-data train ARGS` (torchrun -m qwen_data_train for several processes); → (the JSON log
    records but the last line's summary, stdout)."""
    if nproc == 1:
        command = [sys.executable, "-m", "qwen_data.cli", "train"]
    else:
        command = torchrun(nproc) + ["-m", "qwen_data_train"]
    stdout = run(command + list(args) + ["--log-json", str(log)])
    with open(log) as f:
        return [r for r in map(json.loads, f) if "summary" not in r], stdout


def run_convert(args, nproc=1) -> str:
    """`qwen-data convert ARGS` (torchrun -m qwen_data_train.convert for several processes)."""
    if nproc == 1:
        return run([sys.executable, "-m", "qwen_data.cli", "convert"] + list(args))
    return run(torchrun(nproc) + ["-m", "qwen_data_train.convert"] + list(args))


WORDS = ("data model token river stone light cloud number garden window paper music "
         "北京 数据 模型 Grüße café naïve 東京 δεδομένα данные").split()


def train_prefixes(d: Path) -> Path:
    """In folder `d`: pretraining prefixes web and code, a packed SFT prefix chat (rows of 256), and
    their blends pretrain_blend.json (web 0.7, code 0.3) and sft_blend.json, written by the CLI."""
    from qwen_data.cli import main as qwen_data

    from _helpers import write_jsonl

    rng = random.Random(7)
    words = lambda n: " ".join(rng.choice(WORDS) for _ in range(n))  # noqa: E731
    for name, docs in (("web", 300), ("code", 120)):
        src = write_jsonl(d / f"{name}.jsonl", [{"text": words(rng.randint(5, 120))} for _ in range(docs)])
        assert qwen_data(["pretrain", src, "-o", str(d / name), "--workers", "1", "--quiet"]) == 0
    chats = write_jsonl(d / "chats.jsonl", [
        {"messages": [{"role": "user", "content": words(rng.randint(2, 30))},
                      {"role": "assistant", "content": words(rng.randint(2, 40))}]} for _ in range(120)])
    assert qwen_data(["sft", chats, "-o", str(d / "chat"), "--template", "qwen2p5", "--seq-length", "256",
                      "--pack", "--workers", "1", "--quiet"]) == 0
    assert qwen_data(["blend", f"{d / 'web'}=0.7", f"{d / 'code'}=0.3", "-o", str(d / "pretrain_blend.json")]) == 0
    assert qwen_data(["blend", str(d / "chat"), "-o", str(d / "sft_blend.json")]) == 0
    return d


def raw_documents(prefix):
    """[[sequence array, ...] per document] straight from the files."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00"
    dtype = {1: np.uint8, 4: np.int32}[idx[17]]
    n, d = struct.unpack("<QQ", idx[18:34])
    lengths = np.frombuffer(idx, np.int32, n, 34)
    pointers = np.frombuffer(idx, np.int64, n, 34 + 4 * n)
    doc_index = np.frombuffer(idx, np.int64, d, 34 + 12 * n)
    values = np.fromfile(prefix + ".bin", dtype)
    itemsize = np.dtype(dtype).itemsize
    seqs = [values[p // itemsize: p // itemsize + n_] for p, n_ in zip(pointers, lengths)]
    return [seqs[a:b] for a, b in zip(doc_index[:-1], doc_index[1:])]


def docs_of(prefix):
    """Each document's tokens as one list."""
    return [np.concatenate(doc).tolist() for doc in raw_documents(prefix)]


def stream_check(sample, documents):
    """A GPTDataset window is documents back to back: cut after each end of document, the inner
    pieces are whole documents, the first ends one, the last begins one."""
    window = sample["tokens"].tolist() + sample["labels"].tolist()[-1:]
    pieces, current = [], []
    for t in window:
        current.append(t)
        if t == EOD:
            pieces.append(current)
            current = []
    if current:
        pieces.append(current)
    if len(pieces) == 1:
        n = len(window)
        assert any(d[i: i + n] == window for d in documents for i in range(len(d) - n + 1))
        return
    first, *inner, last = pieces
    assert any(d[len(d) - len(first):] == first for d in documents)
    assert all(piece in documents for piece in inner)
    assert any(d[: len(last)] == last for d in documents)
