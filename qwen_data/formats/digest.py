"""The content hashes a manifest's fingerprint is made of: sha256 for an .idx, a joinable hash for a .bin.

A .bin's hash (scheme `p61x2`) treats its bytes b_0 .. b_{n-1} as the coefficients of a polynomial and
evaluates it at two fixed points modulo the prime 2^61 - 1, with n beside: "p61x2:n:h1:h2". The hash
of two byte strings back to back is the first's times X^len(second) plus the second's (`join`), so

- parts hash apart and join: a worker's, a range of a file hashed by a thread of `file_digest`, the
  shards a merge joins (their hashes, from their manifests, without reading a byte of their .bin);
- the hash depends on the bytes alone, never on how they were cut: one run, 16 workers and a merge
  of shards give the same hash for the same bytes.

What it proves: two different byte strings of one length agree on a point with a chance of at most
n / 2^61 (a difference is a nonzero polynomial of degree below n, which has at most n roots), so
both points by chance about (n / 2^61)^2: below 10^-20 for a 10 GB file. It is no defence against a
forger, who can solve for a collision (sha256 is; but one who can rewrite a .bin can rewrite its
manifest). Manifests written before it (no `digests`) hold a plain sha256 of each .bin, and still
verify (`bin_hash`).
"""

from __future__ import annotations

import hashlib
import os

import numpy as np

from .._native import poly, poly_each, poly_join

P = (1 << 61) - 1
# The points: the first 16 hex digits of sha256(b"qwen-data .bin hash, point k"), k = 1, 2, mod P
# (`_native.c` holds them too; a test holds the two equal).
POINTS = tuple(int(hashlib.sha256(f"qwen-data .bin hash, point {k}".encode()).hexdigest()[:16], 16) % P
               for k in (1, 2))
SCHEME = "p61x2"
DESCRIPTION = ("each channel's .idx sha256 and .bin p61x2 (its bytes a polynomial evaluated at two fixed points "
               "mod 2^61-1, with its length: parts join without being read), one line each, hashed by sha256")
RANGE_BYTES = 64 << 20  # a thread's share of a file `file_digest` hashes


class BinDigest:
    """The joinable hash of a .bin's bytes, fed as they are written (hashlib's update / hexdigest)."""

    def __init__(self) -> None:
        self.h, self.n = (0, 0), 0

    def update(self, data) -> None:
        view = memoryview(data).cast("B")
        self.h = poly(view, *self.h)
        self.n += len(view)

    def join_pieces(self, hashes: np.ndarray, sizes: np.ndarray) -> None:
        """Go on over pieces whose own hashes are known (`piece_hashes`: (h1, h2) a row), `sizes` bytes
        each, in that order, without a byte of them."""
        self.h = poly_join(np.ascontiguousarray(hashes, dtype=np.uint64), np.ascontiguousarray(sizes, dtype=np.int64),
                           *self.h)
        self.n += int(np.sum(sizes))

    def hexdigest(self) -> str:
        return f"{SCHEME}:{self.n}:{self.h[0]:016x}:{self.h[1]:016x}"


def digest_of(array) -> str:
    """The joinable hash of an array's bytes as they are written (a worker hashes what it hands over,
    so the process writing the files hashes none of it)."""
    digest = BinDigest()
    digest.update(array)
    return digest.hexdigest()


def piece_hashes(array: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The hash of each piece of `array`'s bytes on its own, pieces of `lengths` items back to back:
    (h1, h2) a row, uint64 (an SFT worker's samples, which the rows a run lays out join in their order)."""
    ends = np.cumsum(np.asarray(lengths, dtype=np.int64)) * array.itemsize
    data = memoryview(np.ascontiguousarray(array)).cast("B")
    return np.frombuffer(poly_each(data, ends), dtype=np.uint64).reshape(-1, 2)


def repeated_hashes(unit: bytes, most: int) -> np.ndarray:
    """The hash of `unit` repeated k times, for k from 0 to `most`: (h1, h2) a row (a row's padding)."""
    step, x = poly(unit, 0, 0), [pow(point, len(unit), P) for point in POINTS]
    out = np.zeros((most + 1, 2), dtype=np.uint64)
    h = [0, 0]
    for k in range(1, most + 1):
        h = [(a * b + c) % P for a, b, c in zip(h, x, step)]
        out[k] = h
    return out


def pieces_digest(hashes: np.ndarray, sizes: np.ndarray) -> str:
    """The joinable hash of pieces back to back, from their own hashes and sizes in bytes (`piece_hashes`)."""
    digest = BinDigest()
    digest.join_pieces(hashes, sizes)
    return digest.hexdigest()


def join(digests: list[str]) -> str:
    """The hash of the byte strings of `digests` back to back."""
    h, n = [0, 0], 0
    for digest in digests:
        part_n, part_h = _parsed(digest)
        h = [(a * pow(x, part_n, P) + b) % P for a, b, x in zip(h, part_h, POINTS)]
        n += part_n
    return f"{SCHEME}:{n}:{h[0]:016x}:{h[1]:016x}"


def _parsed(digest: str) -> tuple[int, tuple[int, int]]:
    scheme, n, h1, h2 = digest.split(":")
    if scheme != SCHEME:
        raise ValueError(f"{digest[:24]}…: not a {SCHEME} hash")
    return int(n), (int(h1, 16), int(h2, 16))


def is_joinable(digest: str) -> bool:
    return digest.startswith(SCHEME + ":")


def bin_hash(joinable: bool = True):
    """A fresh .bin hash: joinable, or the sha256 of manifests written before it."""
    return BinDigest() if joinable else hashlib.sha256()


def file_digest(path: str, joinable: bool = True, threads: int | None = None) -> str:
    """A .bin's hash (`joinable`: p61x2, by ranges hashed in threads at once, then joined; else sha256)."""
    size = os.path.getsize(path)
    if not joinable:
        return sha256_of(path)
    from concurrent.futures import ThreadPoolExecutor  # (not imported by a run: it hashes as it writes)

    ranges = [(start, min(RANGE_BYTES, size - start)) for start in range(0, size, RANGE_BYTES)] or [(0, 0)]
    fd = os.open(path, os.O_RDONLY)
    try:
        with ThreadPoolExecutor(threads or min(len(ranges), os.cpu_count() or 1)) as pool:
            return join(list(pool.map(lambda r: _range_digest(fd, *r), ranges)))
    finally:
        os.close(fd)


def sha256_of(path: str) -> str:
    """The sha256 of a whole file (an .idx, a manifest; a .bin of a manifest before 0.4), read in blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def _range_digest(fd: int, offset: int, size: int) -> str:
    digest, end = BinDigest(), offset + size
    while offset < end:
        block = os.pread(fd, min(end - offset, 1 << 22), offset)
        if not block:
            raise OSError(f"file ends at byte {offset:,}, {end:,} were expected")
        digest.update(block)  # (the hash lets go of the GIL)
        offset += len(block)
    return digest.hexdigest()
