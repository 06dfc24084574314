"""A prefix's files read once against its manifest, for a reader about to trust them (the train stage,
before its first step): each file hashed into the manifest's `fingerprint` as `verify` computes it and,
in the same read, the ids a model reads from it (`DataLayout.first_outside`) checked to be below the
vocabulary size or the pad id. A .bin's joinable hash (`formats.digest`) is taken by ranges, the
ranges of every file read in threads at once (the hash and numpy let go of the GIL), then joined: a
prefix is read as fast as cores and storage allow, whatever the size of its files. A manifest written
before it (a sha256 of each .bin) has each .bin read whole by one thread. `verify` checks far more
(eods, masks, rows, counts) at ~0.5 GB/s on one core.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .digest import RANGE_BYTES, bin_hash, join
from .digest import sha256_of
from .indexed import HASH_BLOCK, read_index
from .layouts import layout_of
from .manifest import Manifest, fingerprint_problem

# Read, hashed and scanned at a time: a block that stays in the core's cache between the three.
BLOCK_BYTES = HASH_BLOCK


@dataclass(frozen=True)
class Checked:
    prefix: str
    bytes: int  # read
    problem: str | None  # the first thing wrong, one sentence naming the prefix; None: it is its manifest's data


@dataclass(frozen=True)
class _File:
    path: str
    dtype: np.dtype | None  # a .bin's; None: an index, hashed only
    row_values: int | None  # values a row of the layout holds, when every row holds as many
    # the layout's `first_outside` with the prefix's vocabulary and pad id; None: a loss mask, no ids
    scan: Callable[[np.ndarray], tuple[int, int] | None] | None = None
    joinable: bool = True  # its manifest records a joinable hash of it (`formats.digest`), not a sha256


def check_prefixes(prefixes: list[tuple[str, Manifest]], threads: int | None = None) -> list[Checked]:
    """Each (prefix, manifest) read and checked; files that are missing raise their OSError."""
    files = {prefix: _files(prefix, manifest) for prefix, manifest in prefixes}
    every = [(f, r) for found in files.values() for f in found for r in _ranges(f)]
    every.sort(key=lambda item: -item[1][1])  # the longest first
    with ThreadPoolExecutor(threads or max(1, min(os.cpu_count() or 1, len(every)))) as pool:
        done = dict(zip(every, pool.map(lambda item: _read(*item), every)))
    return [_verdict(prefix, manifest, [_joined(f, [done[f, r] for r in _ranges(f)]) for f in files[prefix]])
            for prefix, manifest in prefixes]


def _files(prefix: str, manifest: Manifest) -> list[_File]:
    """Each channel's .idx then .bin, ids first."""
    layout = layout_of(manifest)

    def scan(values: np.ndarray):
        return layout.first_outside(values, manifest.vocab_size, manifest.pad_id)

    found = []
    for k, (name, dtype) in enumerate(layout.channels(prefix, manifest.dtype)):
        found += [_File(name + ".idx", None, None),
                  _File(name + ".bin", dtype, layout.row_values, scan if k == 0 else None, manifest.digests is not None)]
    return found


def _ranges(file: _File) -> list[tuple[int, int]]:
    """(offset, bytes) of the parts of `file` read apart: whole rows, only for a joinable hash."""
    size = os.path.getsize(file.path)
    if file.dtype is None or not file.joinable:
        return [(0, size)]
    step = max(RANGE_BYTES // (file.dtype.itemsize * (file.row_values or 1)), 1) * file.dtype.itemsize * (file.row_values or 1)
    return [(start, min(step, size - start)) for start in range(0, size, step)] or [(0, 0)]


def _read(file: _File, part: tuple[int, int]) -> tuple[str, int, tuple[int, int] | None]:
    """(content hash, bytes read, (position, id) of the first id outside the vocabulary or None) of a
    part of a file (a .bin's position counted from the part's start)."""
    if file.dtype is None:
        return sha256_of(file.path), os.path.getsize(file.path), None
    row = file.row_values or 1
    buffer = np.empty(max(BLOCK_BYTES // file.dtype.itemsize // row, 1) * row, file.dtype)
    view = memoryview(buffer).cast("B")
    digest, position, size, first = bin_hash(file.joinable), 0, 0, None
    offset, end = part[0], part[0] + part[1]
    fd = os.open(file.path, os.O_RDONLY)
    try:
        while offset + size < end and (got := os.preadv(fd, [view[:end - offset - size]], offset + size)):
            digest.update(view[:got])
            values = buffer[: got // file.dtype.itemsize]
            if file.scan is not None and first is None:
                found = file.scan(values[: len(values) - len(values) % row])  # (whole rows: a cut file fails its hash)
                first = None if found is None else (position + found[0], found[1])
            position, size = position + len(values), size + got
    finally:
        os.close(fd)
    return digest.hexdigest(), size, first


def _joined(file: _File, parts: list[tuple[str, int, tuple[int, int] | None]]) -> tuple[str, int, tuple | None]:
    """A file's parts (`_read`) as one: hashes joined, the first id outside found at its place in the file."""
    if len(parts) == 1:
        return parts[0]
    first, before = None, 0
    for _, size, found in parts:
        if found is not None and first is None:
            first = (before + found[0], found[1])
        before += size // file.dtype.itemsize
    return join([digest for digest, _, _ in parts]), sum(size for _, size, _ in parts), first


def _verdict(prefix: str, manifest: Manifest, read: list[tuple[str, int, tuple | None]]) -> Checked:
    digests = [(read[k][0], read[k + 1][0]) for k in range(0, len(read), 2)]
    channels = [name for name, _ in layout_of(manifest).channels(prefix, manifest.dtype)]
    problem = fingerprint_problem(prefix, manifest, digests, channels)
    outside = read[1][2]
    if problem is None and outside is not None:
        position, value = outside
        problem = (f"{prefix}: document {_document_of(prefix + '.idx', position)} (counting from 0) holds id {value}, "
                   f"which its manifest does not allow (ids below its vocabulary size {manifest.vocab_size:,}, and "
                   f"the pad id {manifest.pad_id}): `qwen-data verify {prefix}` lists every one")
    return Checked(prefix, sum(size for _, size, _ in read), problem)


def _document_of(idx_path: str, position: int) -> int:
    """The document holding value `position` of the .bin (an index its fingerprint vouches for)."""
    index = read_index(idx_path)
    sequence = int(np.searchsorted(index.pointers, position * index.dtype.itemsize, side="right")) - 1
    return int(np.searchsorted(index.document_indices, sequence, side="right")) - 1
