"""Megatron indexed dataset writer (MMIDIDX version 1), numpy only.

Layout (read by megatron-core's `IndexedDataset` unchanged):
  PREFIX.bin  tokens back to back.
  PREFIX.idx  header b"MMIDIDX\\x00\\x00", <Q version 1, <B dtype code, <Q sequence count,
              <Q document count (+1), then int32 sequence lengths, int64 byte offsets of each
              sequence, int64 document indices (0, then each document's end sequence index).

A document holds one or more sequences: pretraining writes one sequence per document, packed
SFT writes one document per packed row whose sequences are its samples.

The per-sequence lengths and document ends stream to side files while tokens are written, so
memory stays flat however large the corpus; `finalize` assembles the index from them. The writer
hashes both files as it writes them (`digests`: sha256 of the .idx, the .bin's joinable hash of
`formats.digest`), so a fingerprint of the data never re-reads it.
`read_index` reads an index back as megatron-core does, checking its header and size; `check` also
checks its entries against each other and against the .bin before a reader relies on them, and
`check_same_index` that a loss mask has its ids' very index.
"""

from __future__ import annotations

import hashlib
import os
import queue
import struct
import threading
import weakref
from dataclasses import dataclass

import numpy as np

from .digest import BinDigest, join

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
# magic, version, dtype code, sequence count, document index count (documents + 1)
_HEADER = struct.Struct("<9sQBQQ")

# Megatron's DType codes.
DTYPE_CODES = {
    np.dtype(np.uint8): 1,
    np.dtype(np.int8): 2,
    np.dtype(np.int16): 3,
    np.dtype(np.int32): 4,
    np.dtype(np.int64): 5,
    np.dtype(np.float64): 6,
    np.dtype(np.float32): 7,
    np.dtype(np.uint16): 8,
}

_CHUNK = 1 << 20  # index entries handled at a time in finalize
# The content hash of .idx files (a .bin's: `formats.digest`): with SHA-NI, sha256 is the fastest hashlib offers on one core
# (about twice blake2b), so hashing while writing costs the pipelines next to nothing.
new_hash = hashlib.sha256


def token_dtype(vocab_size: int) -> np.dtype:
    """The dtype Megatron picks for a vocabulary: uint16 below 65,500 ids, else int32."""
    return np.dtype(np.uint16) if vocab_size < 65500 else np.dtype(np.int32)


class IndexedDatasetWriter:
    """Streams documents into `bin_path` and writes the matching index at `idx_path`."""

    def __init__(self, bin_path: str, idx_path: str, dtype, hashed: bool | str = True,
                 resumed: str | None = None) -> None:
        """`hashed`: hash each batch's bytes as it is written, for `digests` (tests', baselines' writers;
        False: data staged on its way elsewhere; "given": each batch comes with its bytes' joinable hash,
        joined here, no byte read: a run's writers).
        `resumed`: go on after what the files (`files`) hold, whose .bin bytes have this joinable
        hash (a run resumed from its journal, `run.journal`; hashed "given" only)."""
        self.dtype = np.dtype(dtype)
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {self.dtype} has no Megatron code")
        self.bin_path, self.idx_path = bin_path, idx_path
        # written through at once (other processes write placed batches); never O_APPEND, under which Linux
        # puts a pwrite at the file's end (`write_at`)
        self._bin = open(bin_path, "r+b" if resumed is not None else "wb", buffering=0)
        self._bin.seek(0, os.SEEK_END)
        mode = "ab" if resumed is not None else "wb"
        self._lengths = open(idx_path + ".lengths", mode)
        self._doc_ends = open(idx_path + ".docends", mode)
        self._bin_hash = BinDigest() if hashed is True else None
        self._idx_hash, self._given = new_hash(), [] if hashed == "given" else None
        if resumed is not None and self._given is None:
            raise ValueError("only a writer given its batches' hashes resumes")
        if resumed is not None:
            self._given.append(resumed)
        self.sequences = self._lengths.tell() // 4
        self.documents = self._doc_ends.tell() // 8
        self.tokens = self._bin.tell() // self.dtype.itemsize

    @staticmethod
    def files(bin_path: str, idx_path: str) -> list[str]:
        """The files a writer appends to as it goes (the index is made from the last two at the end)."""
        return [bin_path, idx_path + ".lengths", idx_path + ".docends"]

    def flush(self) -> None:
        """Everything added so far handed to the kernel (a killed process's writes then outlive it)."""
        self._lengths.flush()
        self._doc_ends.flush()

    def journaled(self, digest: str) -> dict[str, str | None]:
        """`flush`, then each file appended to (`files`) with the joinable hash of what the last batch
        added to it, for `run.journal`: the .bin's as given (`digest`), None for the index's side files
        (the journal reads those few bytes back)."""
        self.flush()
        bin_path, lengths, ends = self.files(self.bin_path, self.idx_path)
        return {bin_path: digest, lengths: None, ends: None}

    def sequence_lengths(self) -> np.ndarray:
        """Every sequence's length written so far (a resumed run's included), from the side file."""
        self.flush()
        return np.fromfile(self.files(self.bin_path, self.idx_path)[1], dtype=np.int32).astype(np.int64)

    def add_document(self, tokens, sequence_lengths=None) -> None:
        """One document; `sequence_lengths` splits it into sequences (default: one)."""
        tokens = np.asarray(tokens)
        lengths = [len(tokens)] if sequence_lengths is None else sequence_lengths
        self.add_batch(tokens, np.asarray(lengths), np.asarray([len(lengths)]))

    def add_batch(self, tokens, sequence_lengths, sequences_per_document=None, digest: str | None = None) -> None:
        """Many documents at once: `tokens` is all their sequences back to back.

        `sequences_per_document` defaults to one sequence per document; `digest`: the joinable hash
        of the bytes `tokens` are written as (a writer made with hashed="given" takes one a batch).
        """
        data = self._indexed(tokens, sequence_lengths, sequences_per_document, digest)
        _write_all(self._bin, data)
        if self._bin_hash is not None:
            self._bin_hash.update(data)

    def place(self, tokens, sequence_lengths, digest: str) -> tuple[np.ndarray, int]:
        """`add_batch` but for its tokens' bytes, which another process writes: → (those bytes as the
        .bin holds them, where in the .bin they go). A writer that places batches writes none itself
        (`write_at` writes one here), so each batch's bytes are wherever its writer puts them, in any
        order, at the offsets handed out here in order."""
        if self._given is None:
            raise ValueError("only a writer given its batches' hashes places them (it reads no byte back)")
        offset = self.tokens * self.dtype.itemsize
        return self._indexed(tokens, sequence_lengths, None, digest), offset

    def reserve(self, sequence_lengths, sequences_per_document, digest: "str | Pending") -> int:
        """`add_batch`'s index entries alone, for tokens another process writes from its own source
        (packed rows, `layouts.Rows`): → where in the .bin their bytes go (as `place`). `digest`: their
        joinable hash, or a `Pending` one that process fills in once it has written them."""
        if self._given is None:
            raise ValueError("only a writer given its batches' hashes reserves room (it reads no byte back)")
        offset = self.tokens * self.dtype.itemsize
        lengths = np.asarray(sequence_lengths, dtype=np.int64)
        self._index(lengths, sequences_per_document, digest, int(lengths.sum()))
        return offset

    def _indexed(self, tokens, sequence_lengths, sequences_per_document, digest: str | None) -> np.ndarray:
        """A batch counted and put in the index (`add_batch`); → its tokens as the .bin holds them."""
        tokens = np.asarray(tokens)
        lengths = np.asarray(sequence_lengths, dtype=np.int64)
        if int(lengths.sum()) != len(tokens):
            raise ValueError("sequence lengths do not add up to the token count")
        if tokens.size and tokens.dtype != self.dtype:
            info = np.iinfo(self.dtype)
            if tokens.min() < info.min or tokens.max() > info.max:
                raise ValueError(f"token id outside {self.dtype}")
        self._index(lengths, sequences_per_document, digest, len(tokens))
        return np.ascontiguousarray(tokens, dtype=self.dtype)  # written as it is, no copy

    def _index(self, lengths: np.ndarray, sequences_per_document, digest: str | None, tokens: int) -> None:
        """A batch of `tokens` tokens counted and put in the index."""
        if (digest is None) != (self._given is None):
            raise ValueError("a writer made with hashed='given' takes each batch's digest, and only it")
        if lengths.size and (lengths.min() < 0 or lengths.max() > np.iinfo(np.int32).max):
            raise ValueError("sequence length outside int32")
        if sequences_per_document is None:
            per_doc = np.ones(len(lengths), dtype=np.int64)
        else:
            per_doc = np.asarray(sequences_per_document, dtype=np.int64)
            if int(per_doc.sum()) != len(lengths):
                raise ValueError("sequences per document do not add up to the sequence count")
        if self._given is not None:
            self._given.append(digest)
        self._lengths.write(lengths.astype(np.int32).tobytes())
        self._doc_ends.write((self.sequences + np.cumsum(per_doc)).astype(np.int64).tobytes())
        self.sequences += len(lengths)
        self.documents += len(per_doc)
        self.tokens += tokens

    def write_at(self, data: np.ndarray, offset: int) -> None:
        """A placed batch's bytes (`place`) written by this process."""
        pwrite_all(self._bin.fileno(), memoryview(data).cast("B"), offset)

    def finalize(self) -> None:
        """Close the data file and write the index."""
        for f in (self._bin, self._lengths, self._doc_ends):
            f.close()
        itemsize = self.dtype.itemsize
        with open(self.idx_path, "wb") as f:
            idx = _Hashed(f, self._idx_hash)
            idx.write(_HEADER.pack(INDEX_HEADER, INDEX_VERSION, DTYPE_CODES[self.dtype], self.sequences, self.documents + 1))
            _copy_file(self._lengths.name, idx)
            offset = 0
            for lengths in _read_chunks(self._lengths.name, np.int32):
                bytes_ = lengths.astype(np.int64) * itemsize
                pointers = offset + np.cumsum(bytes_) - bytes_
                idx.write(pointers.tobytes())
                offset += int(bytes_.sum())
            idx.write(np.zeros(1, dtype=np.int64).tobytes())
            _copy_file(self._doc_ends.name, idx)
        os.remove(self._lengths.name)
        os.remove(self._doc_ends.name)

    @property
    def digests(self) -> tuple[str, str]:
        """(.idx, .bin) content hashes, hex; valid after `finalize`."""
        if self._given is None:
            return self._idx_hash.hexdigest(), self._bin_hash.hexdigest()
        given = [d.value if isinstance(d, Pending) else d for d in self._given]
        if None in given:
            raise RuntimeError("a batch placed in the .bin was never written (its hash never came)")
        return self._idx_hash.hexdigest(), join(given)

    def abort(self, remove=os.remove) -> None:
        """Close and remove everything written so far (`remove`: how, each path there)."""
        for f in (self._bin, self._lengths, self._doc_ends):
            f.close()
        for path in (self.bin_path, self.idx_path, self._lengths.name, self._doc_ends.name):
            if os.path.exists(path):
                remove(path)


class Pending:
    """The joinable hash of a batch another process writes and hashes (`IndexedDatasetWriter.reserve`),
    filled in once it says so."""

    value: str | None = None


# SFT data is two datasets with one index: the ids at PREFIX, the uint8 loss mask at PREFIX.lossmask.
MASK_SUFFIX = ".lossmask"
CHANNELS = ("", MASK_SUFFIX)  # a prefix's datasets, in order (its manifest's digests): the ids', the mask's


class MaskedWriter:
    """Token ids and their loss mask, written as two datasets with the identical index."""

    @staticmethod
    def files(prefix: str) -> list[str]:
        return [prefix + channel + ext for channel in CHANNELS for ext in (".bin", ".idx")]

    def __init__(self, paths: list[str], dtype, hashed: bool | str = True,
                 resumed: tuple[str, str] | None = None) -> None:
        """`paths`: where to write `files(prefix)`, in that order; `resumed`: the joinable hashes of
        the ids' and the mask's .bin bytes a killed run wrote (`IndexedDatasetWriter`)."""
        ids_bin, ids_idx, mask_bin, mask_idx = paths
        ids_resumed, mask_resumed = resumed or (None, None)
        self.ids = IndexedDatasetWriter(ids_bin, ids_idx, dtype, hashed, resumed=ids_resumed)
        self.mask = IndexedDatasetWriter(mask_bin, mask_idx, np.uint8, hashed, resumed=mask_resumed)

    def add_batch(self, ids, mask, sequence_lengths, sequences_per_document=None,
                  digests: tuple[str, str] | None = None) -> None:
        """`digests`: the joinable hashes of `ids` and `mask` as written (a writer made with hashed="given")."""
        ids_digest, mask_digest = digests or (None, None)
        self.ids.add_batch(ids, sequence_lengths, sequences_per_document, digest=ids_digest)
        self.mask.add_batch(mask, sequence_lengths, sequences_per_document, digest=mask_digest)

    def finalize(self) -> None:
        self.ids.finalize()
        self.mask.finalize()

    def abort(self, remove=os.remove) -> None:
        self.ids.abort(remove)
        self.mask.abort(remove)

    @property
    def digests(self) -> list[tuple[str, str]]:
        return [self.ids.digests, self.mask.digests]


def pwrite_all(fd: int, view: memoryview, offset: int) -> None:
    """All of `view` written at `offset` of the file `fd` (a write may take less than it is given)."""
    while view:
        written = os.pwrite(fd, view, offset)
        view, offset = view[written:], offset + written


def _write_all(f, data: np.ndarray) -> None:
    """All of `data` to the unbuffered file `f` (a raw write may take less than it is given)."""
    view = memoryview(data).cast("B")
    while view:
        view = view[f.write(view):]


# A file read back to be hashed (`integrity`, `merge`) is read this much at a time: a block that stays in the
# core's cache between the copy out of the page cache and the hash reading it (16 MiB blocks went through
# memory twice).
HASH_BLOCK = 1 << 20


class Behind:
    """Calls run in order by a thread of their own, started at the first one: the caller goes on
    while they run. `pause` waits for them and ends the thread (the next `submit` starts another);
    `pause_threads` pauses every one of the process before it forks, so a worker is never forked
    beside one (`workers.ordered_map`'s `before_fork`). The first error a call raises is raised by
    `pause` (and by every `submit` after it); the calls after it are skipped."""

    _live: "weakref.WeakSet[Behind]" = weakref.WeakSet()

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        # Held by `submit` and by `pause` until its thread has ended: a call of another `Behind` may submit
        # here while this process pauses every one (`pause_threads`), and its call must neither go to a
        # queue that is no longer read nor start a thread beside the one still ending.
        self._lock = threading.Lock()
        Behind._live.add(self)

    def submit(self, call, *args) -> None:
        """`call(*args)` behind."""
        if self._error is not None:
            raise self._error
        with self._lock:
            if self._thread is None:
                self._queue = queue.SimpleQueue()
                self._thread = threading.Thread(target=self._run, args=(self._queue,), daemon=True)
                self._thread.start()
            self._queue.put((call, args))

    def _run(self, todo: queue.SimpleQueue) -> None:
        while (item := todo.get()) is not None:
            call, args = item
            try:
                if self._error is None:
                    call(*args)
            except BaseException as exc:  # raised by the caller's next pause or submit
                self._error = exc

    def pause(self) -> None:
        """Wait for every call submitted and end the thread; the first error raised, if any."""
        with self._lock:
            if self._thread is not None:
                self._queue.put(None)
                self._thread.join()
                self._thread = self._queue = None
        if self._error is not None:
            raise self._error

    @property
    def running(self) -> bool:
        return self._thread is not None

    def close(self, failed: bool = False) -> None:
        """`pause`, and this one is done; `failed`: its calls' error is not wanted."""
        try:
            self.pause()
        except BaseException:
            if not failed:
                raise
        finally:
            Behind._live.discard(self)


def pause_threads() -> None:
    """End the thread of every `Behind` of this process (each starts again at its next call), until
    none runs: a call of one may submit to another."""
    while running := [behind for behind in list(Behind._live) if behind.running]:
        for behind in running:
            behind.pause()


class _Hashed:
    """A file opened for writing that hashes what goes through it."""

    def __init__(self, file, digest) -> None:
        self.file, self.digest = file, digest

    def write(self, data) -> None:
        self.digest.update(data)
        self.file.write(data)


def join_indexes(indexes: list["Index"], idx_path: str, dtype) -> tuple[str, tuple[int, int, int]]:
    """The index of the indexes' datasets back to back, written at idx_path as `IndexedDatasetWriter.finalize`
    writes it (a chunk at a time); → its `new_hash` and its (documents, sequences, tokens)."""
    dtype = np.dtype(dtype)
    sequences = sum(index.sequences for index in indexes)
    documents = sum(index.documents for index in indexes)
    digest = new_hash()
    with open(idx_path, "wb") as f:
        out = _Hashed(f, digest)
        out.write(_HEADER.pack(INDEX_HEADER, INDEX_VERSION, DTYPE_CODES[dtype], sequences, documents + 1))
        for index in indexes:
            for lengths in index.length_chunks():
                out.write(lengths.tobytes())
        offset = 0  # bytes of the sequences so far
        for index in indexes:
            for lengths in index.length_chunks():
                nbytes = lengths.astype(np.int64) * dtype.itemsize
                out.write((offset + np.cumsum(nbytes) - nbytes).tobytes())
                offset += int(nbytes.sum())
        out.write(np.zeros(1, dtype=np.int64).tobytes())
        first = 0  # sequences so far
        for index in indexes:
            for start in range(1, index.documents + 1, _CHUNK):
                ends = np.asarray(index.document_indices[start:start + _CHUNK], dtype=np.int64)
                out.write((first + ends).tobytes())
            first += index.sequences
    return digest.hexdigest(), (documents, sequences, offset // dtype.itemsize)


def fill(f, view) -> int:
    """Read into `view` until it is full or the file ends; bytes read."""
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            break
        done += n
    return done



class IndexFormatError(ValueError):
    """An .idx file that is not a well-formed MMIDIDX v1 index; the message names the file."""


@dataclass
class Index:
    """An .idx file as megatron-core reads it; the arrays are read-only memmaps (nothing loaded)."""

    path: str
    dtype: np.dtype
    lengths: np.ndarray  # int32, tokens of each sequence
    pointers: np.ndarray  # int64, byte offset of each sequence in the .bin
    document_indices: np.ndarray  # int64, 0 then each document's end sequence index

    @property
    def sequences(self) -> int:
        return len(self.lengths)

    @property
    def documents(self) -> int:
        return len(self.document_indices) - 1

    def length_chunks(self):
        """The sequence lengths (int32), _CHUNK at a time, read from the file rather than the memmap,
        whose pages would stay resident: memory stays flat however long the index."""
        with open(self.path, "rb") as f:
            f.seek(_HEADER.size)
            for start in range(0, self.sequences, _CHUNK):
                yield np.fromfile(f, np.int32, min(_CHUNK, self.sequences - start))


def read_index(idx_path: str) -> Index:
    """Open `idx_path`; IndexFormatError unless header, dtype code, counts and file size agree."""
    size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as f:
        raw = f.read(_HEADER.size)
    if len(raw) < _HEADER.size or raw[: len(INDEX_HEADER)] != INDEX_HEADER:
        raise IndexFormatError(f"{idx_path}: not a Megatron MMIDIDX index (bad header)")
    _, version, code, sequences, doc_count = _HEADER.unpack(raw)
    if version != INDEX_VERSION:
        raise IndexFormatError(f"{idx_path}: index version {version}, expected {INDEX_VERSION}")
    dtype = next((dt for dt, c in DTYPE_CODES.items() if c == code), None)
    if dtype is None:
        raise IndexFormatError(f"{idx_path}: unknown dtype code {code}")
    expected = _HEADER.size + sequences * (4 + 8) + doc_count * 8
    if doc_count < 1 or size != expected:
        raise IndexFormatError(f"{idx_path}: {size} bytes, but its header's {sequences} sequences and "
                               f"{doc_count} document indices make {expected}: truncated or corrupt")

    def array(dt, count, offset):
        if count == 0:  # np.memmap refuses empty arrays
            return np.zeros(0, dt)
        return np.memmap(idx_path, dt, "r", offset=offset, shape=(count,))

    lengths = array(np.int32, sequences, _HEADER.size)
    pointers = array(np.int64, sequences, _HEADER.size + 4 * sequences)
    document_indices = array(np.int64, doc_count, _HEADER.size + 12 * sequences)
    return Index(idx_path, dtype, lengths, pointers, document_indices)


def check(idx_path: str, bin_path: str) -> Index:
    """`read_index`, then what megatron-core takes on trust (a negative length makes its epoch count
    loop forever): every length at least 0; each pointer the sum of the lengths before it (in bytes,
    from 0); document indices from 0, never decreasing, ending at the sequence count; and the lengths'
    sum filling the .bin exactly. IndexFormatError naming the file and the first bad entry; read a
    chunk at a time, so memory stays flat however long the index."""
    index = read_index(idx_path)
    n, itemsize = index.sequences, index.dtype.itemsize
    offset = 0  # bytes of the sequences so far
    with open(idx_path, "rb") as f:
        for start in range(0, n, _CHUNK):
            count = min(_CHUNK, n - start)
            f.seek(_HEADER.size + 4 * start)
            lengths = np.fromfile(f, np.int32, count).astype(np.int64)
            f.seek(_HEADER.size + 4 * n + 8 * start)
            pointers = np.fromfile(f, np.int64, count)
            if lengths.min() < 0:
                i = int(np.argmax(lengths < 0))
                raise IndexFormatError(f"{idx_path}: sequence {start + i} has length {lengths[i]}: corrupt index")
            ends = offset + np.cumsum(lengths * itemsize)
            expected = ends - lengths * itemsize
            if not np.array_equal(pointers, expected):
                i = int(np.argmax(pointers != expected))
                raise IndexFormatError(f"{idx_path}: sequence {start + i} starts at byte {pointers[i]}, the lengths "
                                       f"before it end at byte {expected[i]}: corrupt index")
            offset = int(ends[-1])
        last = 0
        f.seek(_HEADER.size + 12 * n)
        for start in range(0, index.documents + 1, _CHUNK):
            ends = np.fromfile(f, np.int64, min(_CHUNK, index.documents + 1 - start))
            if start == 0 and ends[0] != 0:
                raise IndexFormatError(f"{idx_path}: document indices start at {ends[0]}, not 0: corrupt index")
            steps = np.diff(ends, prepend=last)
            if steps.min() < 0:
                i = int(np.argmax(steps < 0))
                raise IndexFormatError(f"{idx_path}: document index {start + i} ({ends[i]}) is below the one before "
                                       "it: corrupt index")
            last = int(ends[-1])
    if last != n:
        raise IndexFormatError(f"{idx_path}: the documents end at sequence {last}, the index holds {n}: corrupt index")
    size = os.path.getsize(bin_path)
    if size != offset:
        raise IndexFormatError(f"{bin_path}: {size:,} bytes, but the lengths in {idx_path} add up to {offset:,} "
                               f"({offset // itemsize:,} tokens of {itemsize} bytes): the two do not belong together")
    return index


def check_same_index(ids: Index, mask: Index) -> None:
    """IndexFormatError, naming both files and the first entry that differs, unless the loss mask's
    index describes the very sequences and documents of the ids' (equal lengths and document indices;
    the pointers follow from the lengths, `check`). Compared a chunk at a time."""
    for label, a, b in (("sequence lengths", ids.lengths, mask.lengths),
                        ("document indices", ids.document_indices, mask.document_indices)):
        if len(a) != len(b):
            raise IndexFormatError(f"{mask.path}: {len(b)} {label}, {ids.path} has {len(a)}: not the same index")
        for start in range(0, len(a), _CHUNK):
            mine, theirs = np.asarray(a[start:start + _CHUNK]), np.asarray(b[start:start + _CHUNK])
            if not np.array_equal(mine, theirs):
                i = start + int(np.argmax(mine != theirs))
                raise IndexFormatError(f"{mask.path}: {label} differ from {ids.path} at entry {i}: not the same index")


def bin_tokens(bin_path: str, dtype) -> np.ndarray:
    """A .bin's values as a read-only memmap (nothing loaded); the one place a .bin is mapped."""
    if os.path.getsize(bin_path) == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype)
    return np.memmap(bin_path, dtype, "r")


def read_tokens(f, dtype, start: int, count: int) -> np.ndarray:
    """`count` values of the .bin open as `f` from value `start`, read rather than mapped: each of a few thousand
    scattered reads of a mapping faults in the kernel's read-ahead window (128 KB here) and keeps it resident in
    the process (a certified 1 GB SFT run's read-back held ~0.8 GB so). Fewer values where the file ends first."""
    dtype = np.dtype(dtype)
    raw = os.pread(f.fileno(), max(0, count) * dtype.itemsize, start * dtype.itemsize)
    return np.frombuffer(raw, dtype, len(raw) // dtype.itemsize)


def _read_chunks(path: str, dtype):
    with open(path, "rb") as f:
        while True:
            raw = f.read(_CHUNK * np.dtype(dtype).itemsize)
            if not raw:
                return
            yield np.frombuffer(raw, dtype=dtype)


def _copy_file(path: str, out) -> None:
    with open(path, "rb") as f:
        while True:
            raw = f.read(1 << 24)
            if not raw:
                return
            out.write(raw)
