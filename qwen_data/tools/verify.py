"""`qwen-data verify PREFIX…`: re-read a prefix as a reader would and prove it is what its manifest says.

Checked, for `PREFIX.bin/.idx` (and SFT's `PREFIX.lossmask.bin/.idx`):
  - the manifest is there and names a kind, dtype, vocabulary size, eod/pad ids, counts, fingerprint;
  - each index is well formed (header, dtype code, size), is the manifest's dtype, its pointers are the
    running byte offsets of its lengths, its document indices run monotonically from 0 to the sequence
    count, and its counts (documents, sequences, tokens) and the .bin size are the manifest's;
  - the loss-mask channel has the ids' index (same lengths and documents), and holds only 0 and 1;
  - every id is below the vocabulary size (SFT: or the pad id), and pad positions are never trained;
  - pretrain: one sequence per document, each ending with the manifest's eod id;
  - SFT unpacked: one sample per document, no pad id at all, none over --seq-length;
    SFT packed: every document is a row of exactly seq_length tokens, its samples then at most one
    pad-only sequence, and pad ids nowhere else;
  - SFT in the pai layout (`qwen_data.formats.pai`, no loss-mask channel): every document is one sequence of
    2 x seq_length values; its ids are vocabulary ids with each sample's last one stored as -1 - id,
    then only pad ids; at least one sample per row (exactly one unpacked); every label is -100 or the
    next id of the same sample, -100 at a sample's last position and on padding; every sample trains
    at least one label;
  - the fingerprint recomputed from the files is the manifest's, and so are the SFT statistics.

The .bin files are streamed in blocks and the index arrays read in chunks from memmaps, so memory
stays flat whatever the size. Problems are plain sentences naming the file; none means the prefix is ok.
"""

from __future__ import annotations

import os
from contextlib import nullcontext

import numpy as np

from ..formats.indexed import MASK_SUFFIX, IndexFormatError, file_digest, new_hash, read_index
from ..formats.manifest import Manifest, fingerprint, load, problems as manifest_problems
from ..formats.pai import IGNORE

BLOCK_BYTES = 1 << 24  # .bin bytes read at a time
CHUNK = 1 << 20  # index entries checked at a time
SHOWN = 5  # offending positions named in one problem


def verify(prefix: str) -> list[str]:
    """The problems of `prefix` as sentences; an empty list means it is ok."""
    where = f"{prefix}.json"
    try:
        data = load(prefix)
    except FileNotFoundError as exc:
        return [str(exc)]
    except (OSError, ValueError) as exc:  # unreadable file, bad JSON
        message = str(exc)
        return [message if message.startswith(prefix) else f"{where}: unreadable manifest: {message}"]
    problems = manifest_problems(data, where)
    if problems:
        return problems
    manifest = Manifest.from_json(data, where)
    channels = [(prefix, np.dtype(manifest.dtype))]
    if manifest.layout == "mask":
        channels.append((prefix + MASK_SUFFIX, np.dtype(np.uint8)))
    indexes = []
    for name, dtype in channels:
        index = _open_channel(name, dtype, manifest, problems)
        if index is None:
            return problems
        indexes.append(index)
    # `sound`: the indexes and .bin sizes agree, so the data can be read by document and row.
    sound = all([_check_index(index, problems) for index in indexes])
    sound = sound and _check_sizes(prefix, indexes, manifest, problems)
    if sound and len(indexes) == 2:
        sound = _same_index(indexes[0], indexes[1], problems)
    sound = sound and _check_layout(indexes[0], manifest, problems)
    stats = _stream(indexes, manifest, sound, problems)
    _check_fingerprint(prefix, indexes, stats, manifest, problems)
    if manifest.kind == "sft" and sound:
        _check_sft_stats(prefix, indexes[0], stats, manifest, problems)
    return problems


# ---------------------------------------------------------------------------------------------
# The indexes


def _open_channel(name: str, dtype: np.dtype, manifest: Manifest, problems: list[str]):
    """The channel's index if its files are there and it reads; counts checked against the manifest."""
    missing = [name + s for s in (".bin", ".idx") if not os.path.isfile(name + s)]
    if missing:
        problems.extend(f"{path}: missing" for path in missing)
        return None
    try:
        index = read_index(name + ".idx")
    except (IndexFormatError, OSError) as exc:
        problems.append(str(exc))
        return None
    if index.dtype != dtype:
        problems.append(f"{index.path}: dtype {index.dtype.name}, expected {dtype.name}")
        return None
    for label, count in (("documents", index.documents), ("sequences", index.sequences)):
        if count != getattr(manifest, label):
            problems.append(f"{index.path}: {count} {label}, the manifest {getattr(manifest, label)}")
    return index


def _chunks(array, overlap: int = 0):
    """(start, array[start:start + CHUNK + overlap]) for every CHUNK, as plain int64 arrays."""
    for start in range(0, max(len(array) - overlap, 0), CHUNK):
        yield start, np.asarray(array[start: start + CHUNK + overlap], dtype=np.int64)


def _check_index(index, problems: list[str]) -> bool:
    """Lengths ≥ 0, pointers the running byte offsets of the lengths, document indices 0 → sequences."""
    itemsize = index.dtype.itemsize
    offset = 0
    for start, lengths in _chunks(index.lengths):
        if (lengths < 0).any():
            i = start + int(np.argmax(lengths < 0))
            problems.append(f"{index.path}: sequence {i} has a negative length {lengths[i - start]}")
            return False
        nbytes = lengths * itemsize
        expected = offset + np.cumsum(nbytes) - nbytes
        pointers = np.asarray(index.pointers[start: start + len(lengths)])
        if not np.array_equal(pointers, expected):
            i = int(np.argmax(pointers != expected))
            problems.append(f"{index.path}: sequence {start + i} starts at byte {pointers[i]}, but the lengths "
                            f"before it put it at {expected[i]}")
            return False
        offset += int(nbytes.sum())
    docs = index.document_indices
    if docs[0] != 0 or docs[-1] != index.sequences:
        problems.append(f"{index.path}: document indices run from {docs[0]} to {docs[-1]}, "
                        f"not from 0 to the sequence count {index.sequences}")
        return False
    for start, chunk in _chunks(docs, overlap=1):
        if (np.diff(chunk) < 0).any():
            d = start + int(np.argmax(np.diff(chunk) < 0))
            problems.append(f"{index.path}: document indices decrease after document {d}")
            return False
    return True


def _same_index(ids, mask, problems: list[str]) -> bool:
    """The loss mask must describe the very same sequences and documents as the ids."""
    for label, a, b in (("sequence lengths", ids.lengths, mask.lengths),
                        ("document indices", ids.document_indices, mask.document_indices)):
        if len(a) != len(b):
            problems.append(f"{mask.path}: {len(b)} {label}, {ids.path} has {len(a)}: not the same index")
            return False
        for start, chunk in _chunks(a):
            other = np.asarray(b[start: start + len(chunk)], dtype=np.int64)
            if not np.array_equal(chunk, other):
                i = start + int(np.argmax(chunk != other))
                problems.append(f"{mask.path}: {label} differ from {ids.path} at entry {i}: not the same index")
                return False
    return True


def _tokens(index) -> int:
    """Tokens the index describes (its pointers are checked to be the running offsets)."""
    if not index.sequences:
        return 0
    return int(index.pointers[-1]) // index.dtype.itemsize + int(index.lengths[-1])


def _check_sizes(prefix: str, indexes, manifest: Manifest, problems: list[str]) -> bool:
    ok = True
    for index in indexes:
        bin_path = index.path[: -len(".idx")] + ".bin"
        tokens, size = _tokens(index), os.path.getsize(bin_path)
        if size != tokens * index.dtype.itemsize:
            problems.append(f"{bin_path}: {size} bytes, but {index.path} describes {tokens} tokens of "
                            f"{index.dtype.itemsize} bytes ({tokens * index.dtype.itemsize} bytes): truncated or extended")
            ok = False
    tokens = _tokens(indexes[0])
    if tokens != manifest.tokens:
        problems.append(f"{prefix}.json: {manifest.tokens} tokens, but {indexes[0].path} describes {tokens}")
    return ok


def _check_layout(index, manifest: Manifest, problems: list[str]) -> bool:
    """What the kind promises about documents and sequences (index only)."""
    name = index.path
    if manifest.layout == "pai":
        width = 2 * manifest.seq_length
        for start, chunk in _chunks(index.document_indices, overlap=1):
            if (np.diff(chunk) != 1).any():
                d = start + int(np.argmax(np.diff(chunk) != 1))
                problems.append(f"{name}: row {d} holds {chunk[d - start + 1] - chunk[d - start]} sequences, "
                                "expected one per document in the pai layout")
                return False
        for start, lengths in _chunks(index.lengths):
            if (lengths != width).any():
                r = start + int(np.argmax(lengths != width))
                problems.append(f"{name}: row {r} holds {lengths[r - start]} values, not 2 x sft.seq_length = {width}")
                return False
        return True
    if manifest.kind == "pretrain" or not manifest.packed:
        unit = "document" if manifest.kind == "pretrain" else "sample"
        for start, chunk in _chunks(index.document_indices, overlap=1):
            if (np.diff(chunk) != 1).any():
                d = start + int(np.argmax(np.diff(chunk) != 1))
                problems.append(f"{name}: document {d} holds {chunk[d - start + 1] - chunk[d - start]} sequences, "
                                f"expected one {unit} per document")
                return False
        for start, lengths in _chunks(index.lengths):
            if (lengths == 0).any():
                problems.append(f"{name}: {unit} {start + int(np.argmax(lengths == 0))} is empty")
                return False
            limit = manifest.seq_length
            if manifest.kind == "sft" and limit and (lengths > limit).any():
                s = start + int(np.argmax(lengths > limit))
                problems.append(f"{name}: sample {s} has {lengths[s - start]} tokens, over sft.seq_length {limit}")
                return False
        return True
    seq_length, itemsize, total = manifest.seq_length, index.dtype.itemsize, _tokens(index)
    n = index.sequences
    for start, chunk in _chunks(index.document_indices, overlap=1):
        # token offset of each document boundary: its first sequence's pointer, or the end
        starts = np.asarray(index.pointers[np.minimum(chunk, n - 1)]) // itemsize if n else 0
        at = np.where(chunk < n, starts, total)
        sizes = np.diff(at)
        if (sizes != seq_length).any():
            d = int(np.argmax(sizes != seq_length))
            problems.append(f"{name}: packed row {start + d} holds {sizes[d]} tokens, not sft.seq_length {seq_length}")
            return False
    for start, lengths in _chunks(index.lengths):
        if (lengths == 0).any():
            problems.append(f"{name}: sequence {start + int(np.argmax(lengths == 0))} is empty")
            return False
    return True


# ---------------------------------------------------------------------------------------------
# The data, streamed


class _DocumentEnds:
    """Token end of each document, in order, handed out block by block (pretrain: one sequence each)."""

    def __init__(self, index) -> None:
        self._chunks = _chunks(index.lengths)
        self._ends = np.zeros(0, np.int64)
        self._offset = 0  # tokens before the pending ends' chunk
        self.first = 0  # number of the first pending document

    def upto(self, limit: int) -> tuple[int, np.ndarray]:
        """(first document number, ends ≤ limit) not yet handed out."""
        first, parts = self.first, []
        while True:
            k = int(np.searchsorted(self._ends, limit, side="right"))
            parts.append(self._ends[:k])
            self.first += k
            if k < len(self._ends):
                self._ends = self._ends[k:]
                break
            _, lengths = next(self._chunks, (None, None))
            if lengths is None:
                self._ends = np.zeros(0, np.int64)
                break
            self._ends = self._offset + np.cumsum(lengths)
            self._offset = int(self._ends[-1])
        return first, np.concatenate(parts)


class _Stats:
    def __init__(self) -> None:
        self.bin_digests: list = []
        self.trained = 0
        self.pad_tokens = 0
        self.pad_sequences = 0
        self.samples = 0  # pai layout: counted from the rows' end marks
        self.sample_tokens = 0


def _fill(f, view) -> int:
    """Read into `view` until it is full or the file ends; bytes read."""
    done = 0
    while done < len(view):
        n = f.readinto(view[done:])
        if not n:
            break
        done += n
    return done


def _stream(indexes, manifest: Manifest, sound: bool, problems: list[str]) -> _Stats:
    """Hash both .bin files and check every token, block by block. Layout checks need `sound` indexes."""
    ids_index = indexes[0]
    ids_path = ids_index.path[: -len(".idx")] + ".bin"
    mask_path = indexes[1].path[: -len(".idx")] + ".bin" if len(indexes) == 2 else None
    kind, packed, seq_length = manifest.kind, manifest.packed, manifest.seq_length
    vocab, eod, pad = manifest.vocab_size, manifest.eod_id, manifest.pad_id
    pai = manifest.layout == "pai"
    block = max(BLOCK_BYTES // ids_index.dtype.itemsize, 1)
    if packed or pai:
        row = 2 * seq_length if pai else seq_length
        block = max(block // row, 1) * row  # whole rows
    ids_buf = np.empty(block, ids_index.dtype)
    mask_buf = np.empty(block, np.uint8)
    found = _Found()
    stats = _Stats()
    hashes = [new_hash(), new_hash()]
    ends = _DocumentEnds(ids_index) if kind == "pretrain" and sound else None
    position = 0  # tokens before this block
    with open(ids_path, "rb") as ids_f, (open(mask_path, "rb") if mask_path else nullcontext()) as mask_f:
        while True:
            got = _fill(ids_f, memoryview(ids_buf).cast("B"))
            got_mask = _fill(mask_f, memoryview(mask_buf)) if mask_path else 0
            if not got and not got_mask:
                break
            hashes[0].update(memoryview(ids_buf).cast("B")[:got])
            hashes[1].update(memoryview(mask_buf)[:got_mask])
            ids, mask = ids_buf[: got // ids_buf.itemsize], mask_buf[:got_mask]
            if pai:
                if sound:
                    _check_pai_rows(ids, position // (2 * seq_length), manifest, stats, found)
                position += len(ids)
                continue
            _check_ids(ids, position, vocab, pad if packed else None, found)
            if mask_path:
                is_pad = ids == pad
                _check_mask(ids, mask, is_pad, position, packed, stats, found)
                if sound and packed:
                    _check_rows(ids_index, is_pad, position, seq_length, stats, found)
            if ends is not None:
                first, doc_ends = ends.upto(position + len(ids))
                last = ids[doc_ends - 1 - position]
                wrong = np.flatnonzero(last != eod)
                found.add("eod", first + wrong, last[wrong])
            position += len(ids)
    stats.bin_digests = [h.hexdigest() for h in hashes]
    _report(found, ids_path, mask_path, manifest, problems)
    return stats


def _report(found: "_Found", ids_path: str, mask_path: str | None, manifest: Manifest, problems: list[str]) -> None:
    vocab, eod, pad, packed = manifest.vocab_size, manifest.eod_id, manifest.pad_id, manifest.packed
    names = {"vocab": (ids_path, f"ids outside the vocabulary (0..{vocab - 1})"
                       + (f" other than the pad id {pad}" if packed else ""), "token", "id"),
             "eod": (ids_path, f"documents not ending with the eod id {eod}", "document", "last id"),
             "unpacked-pad": (ids_path, f"pad ids {pad} in unpacked data (its samples are stored unpadded)",
                              "token", "id"),
             "mask-value": (mask_path, "loss-mask values other than 0 and 1", "token", "value"),
             "pad-trained": (mask_path, f"pad positions (id {pad}) trained (mask 1)", "token", "id"),
             "row-pad": (ids_path, "packed rows with pad ids outside one trailing pad-only sequence", "row", "pad ids"),
             "row-empty": (ids_path, "packed rows with no sample, only pad", "row", "pad ids"),
             "pai-id": (ids_path, f"pai rows with ids outside the vocabulary (0..{vocab - 1}) or the pad id {pad} "
                                  "inside a sample", "row", "id"),
             "pai-pad": (ids_path, f"pai rows whose ids after the last sample are not all the pad id {pad}",
                         "row", "id"),
             "pai-empty": (ids_path, "pai rows with no sample (no id stored as -1 - id)", "row", "samples"),
             "pai-samples": (ids_path, "unpacked pai rows holding more than one sample", "row", "samples"),
             "pai-label": (ids_path, f"pai rows with a label neither {IGNORE} nor the next id of the same sample",
                           "row", "label"),
             "pai-untrained": (ids_path, f"pai rows with a sample whose every label is {IGNORE}", "row", "samples")}
    for key, (path, what, unit, value) in names.items():
        problems.extend(found.sentences(key, path, what, unit, value))


class _Found:
    """Offences by kind: a count and the first few (position, value)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.shown: dict[str, list] = {}

    def add(self, key: str, where, values) -> None:
        if len(where):
            self.counts[key] = self.counts.get(key, 0) + len(where)
            shown = self.shown.setdefault(key, [])
            shown.extend(zip(np.asarray(where[: SHOWN - len(shown)]).tolist(),
                             np.asarray(values[: SHOWN - len(shown)]).tolist()))

    def sentences(self, key: str, path: str, what: str, unit: str, value: str) -> list[str]:
        if key not in self.counts:
            return []
        listed = ", ".join(f"{unit} {w} ({value} {v})" for w, v in self.shown[key])
        more = ", …" if self.counts[key] > len(self.shown[key]) else ""
        return [f"{path}: {what}, {self.counts[key]} in all: {listed}{more}"]


def _check_ids(ids, position: int, vocab: int, pad: int | None, found: _Found) -> None:
    if not len(ids):
        return
    if ids.min() >= 0 and ids.max() < vocab:  # the usual case, two fast passes
        return
    bad = (ids < 0) | (ids >= vocab)
    if pad is not None:
        bad &= ids != pad
    where = np.flatnonzero(bad)
    found.add("vocab", position + where, ids[where])


def _check_mask(ids, mask, is_pad, position: int, packed: bool, stats: _Stats, found: _Found) -> None:
    if len(mask) and mask.max() > 1:
        where = np.flatnonzero(mask > 1)
        found.add("mask-value", position + where, mask[where])
    stats.trained += int(np.count_nonzero(mask))
    pads = int(np.count_nonzero(is_pad))
    stats.pad_tokens += pads
    if not pads:
        return
    if not packed:
        where = np.flatnonzero(is_pad)
        found.add("unpacked-pad", position + where, ids[where])
    n = min(len(ids), len(mask))
    trained_pad = np.flatnonzero(is_pad[:n] & (mask[:n] != 0))
    found.add("pad-trained", position + trained_pad, ids[trained_pad])


def _check_rows(index, is_pad, position: int, seq_length: int, stats: _Stats, found: _Found) -> None:
    """Packed rows: pad ids exactly fill the last sequence of a row ending in pad, nowhere else."""
    rows = is_pad.reshape(-1, seq_length)
    first = position // seq_length
    last_sequence = np.asarray(index.document_indices[first + 1: first + 1 + len(rows)], dtype=np.int64) - 1
    ends_in_pad = rows[:, -1]
    pad_length = np.where(ends_in_pad, np.asarray(index.lengths[last_sequence], dtype=np.int64), 0)
    expected = np.arange(seq_length) >= (seq_length - pad_length)[:, None]
    wrong = np.flatnonzero((rows != expected).any(axis=1))
    found.add("row-pad", first + wrong, np.count_nonzero(rows[wrong], axis=1))
    empty = np.flatnonzero(pad_length >= seq_length)
    found.add("row-empty", first + empty, pad_length[empty])
    stats.pad_sequences += int(np.count_nonzero(ends_in_pad))


def _check_pai_rows(values, first: int, manifest: Manifest, stats: _Stats, found: _Found) -> None:
    """Whole pai-layout rows (`qwen_data.formats.pai`), first row number `first`, checked all at once."""
    width, vocab, pad = manifest.seq_length, manifest.vocab_size, manifest.pad_id
    rows = values.reshape(-1, 2 * width).astype(np.int64)
    stored, labels = rows[:, :width], rows[:, width:]
    marks = stored < 0
    tokens = np.where(marks, -1 - stored, stored)
    samples = marks.sum(axis=1)
    # Samples fill the row up to just after its last end mark; padding follows.
    data_end = np.where(samples > 0, width - np.argmax(marks[:, ::-1], axis=1), 0)
    in_data = np.arange(width) < data_end[:, None]
    numbers = first + np.arange(len(rows))

    def add(key, bad, values):
        where = np.flatnonzero(bad)
        found.add(key, numbers[where], values[where])

    bad_id = in_data & ((tokens >= vocab) | (tokens == pad))
    add("pai-id", bad_id.any(axis=1), tokens[np.arange(len(rows)), np.argmax(bad_id, axis=1)])
    bad_pad = ~in_data & (stored != pad)
    add("pai-pad", bad_pad.any(axis=1), stored[np.arange(len(rows)), np.argmax(bad_pad, axis=1)])
    add("pai-empty", samples == 0, samples)
    if not manifest.packed:
        add("pai-samples", samples > 1, samples)
    # A label may be trained where the next position holds the same sample's next id.
    may_train = np.zeros_like(marks)
    may_train[:, :-1] = in_data[:, 1:] & ~marks[:, :-1]
    next_ids = np.zeros_like(tokens)
    next_ids[:, :-1] = tokens[:, 1:]
    trained = labels != IGNORE
    bad_label = trained & ~(may_train & (labels == next_ids))
    add("pai-label", bad_label.any(axis=1), labels[np.arange(len(rows)), np.argmax(bad_label, axis=1)])
    # Trained labels per sample: samples are numbered in row order, each from its first position.
    sample_of = np.cumsum(samples)[:, None] - samples[:, None] + np.cumsum(marks, axis=1) - marks
    per_sample = np.bincount(sample_of[in_data], weights=trained[in_data], minlength=int(samples.sum()))
    row_of_sample = np.repeat(np.arange(len(rows)), samples)
    untrained = np.bincount(row_of_sample[per_sample == 0], minlength=len(rows))
    add("pai-untrained", untrained > 0, untrained)
    stats.samples += int(samples.sum())
    stats.sample_tokens += int(data_end.sum())
    stats.pad_tokens += int(width * len(rows) - data_end.sum())
    stats.trained += int(trained.sum())


# ---------------------------------------------------------------------------------------------
# Against the manifest


def _check_fingerprint(prefix: str, indexes, stats: _Stats, manifest: Manifest, problems: list[str]) -> None:
    digests = [(file_digest(index.path), bin_digest) for index, bin_digest in zip(indexes, stats.bin_digests)]
    recomputed = fingerprint(digests)
    if recomputed != manifest.fingerprint:
        files = ", ".join(f"{i.path[:-4]}.bin/.idx" for i in indexes)
        problems.append(f"{prefix}.json: fingerprint {manifest.fingerprint[:16]}… is not the data's "
                        f"{recomputed[:16]}…: {files} changed after the manifest was written, or the manifest was edited"
                        + (" (or it was written by qwen-data < 0.2, whose fingerprints did not cover the .bin "
                           "contents: rewrite it)" if _version(manifest) < (0, 2) else ""))


def _version(manifest: Manifest) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(manifest.qwen_data_version).split(".")[:2])
    except ValueError:
        return (0,)


def _check_sft_stats(prefix: str, index, stats: _Stats, manifest: Manifest, problems: list[str]) -> None:
    sft = manifest.sft
    if manifest.layout == "pai":
        expected = {"trained_tokens": stats.trained, "samples": stats.samples, "sample_tokens": stats.sample_tokens,
                    "pad_tokens": stats.pad_tokens}
    else:
        samples = index.sequences - stats.pad_sequences if manifest.packed else index.documents
        expected = {"trained_tokens": stats.trained, "samples": samples,
                    "sample_tokens": _tokens(index) - stats.pad_tokens}
    if manifest.packed:
        expected.update(rows=index.documents, pad_tokens=stats.pad_tokens)
    for key, value in expected.items():
        if key in sft and sft[key] != value:
            problems.append(f"{prefix}.json: sft.{key} is {sft[key]!r}, the data holds {value}")
