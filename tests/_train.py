"""Helpers of the train-stage tests: qwen-data prefixes read straight from their bytes (own
parser, independent of megatron-core's reader and of train/data.py)."""

from __future__ import annotations

import struct

import numpy as np

EOD = 151643


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
