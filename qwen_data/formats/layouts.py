"""How a prefix's documents hold its data: one type per layout, saying which files it has, how
finished samples become its rows, how they are read back (`open`), and what `verify` checks of it.

  DocumentLayout    pretraining: one document of one sequence per record, its ids then eod
  MaskLayout        SFT unpacked: one sample per document, unpadded; a uint8 loss mask beside it
                    at PREFIX.lossmask with the identical index (readers pad to their length)
  PackedMaskLayout  SFT packed: one row of exactly seq_length tokens per document, its samples as
                    its sequences, then one sequence of pad ids (mask 0) when the row is not full
  PaiLayout         Pai-Megatron-Patch's rows (`pai`): 2 × seq_length values, ids then labels

`layout_of(manifest)` names the layout of a prefix; `LaidOut` places the rows of a layout that lays
them out (packed, pai) as windows of samples close, and what it gives writes them from the samples
staged at PREFIX.unpacked (`Rows`: a worker's errand in a run; `finish`: a merge's);
`layout.open(prefix)` gives its documents back (`StoredDocuments`), as every reader of ours takes them.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import mmap
from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar

import numpy as np

from ..qwen import DEFAULT_PAD_ID
from . import pai
from .indexed import (MASK_SUFFIX, Index, IndexedDatasetWriter, IndexFormatError, MaskedWriter, bin_tokens, check,
                      Pending, check_same_index, pwrite_all, read_tokens)
from .manifest import Manifest, SFTSection, fingerprinted
from .outputs import AtomicOutputs
from .digest import BinDigest, piece_hashes, repeated_hashes
from .packing import (DEFAULT_PACKING, RowBuffers, RowGroups, SampleWindows, padded_rows,
                      rows_digests)

CHUNK = 1 << 20  # index entries checked at a time

# Where a merge keeps the samples of its shards until `finish` writes the final rows (removed at the end).
UNPACKED = ".unpacked"


def chunks(array, overlap: int = 0):
    """(start, array[start:start + CHUNK + overlap]) for every CHUNK, as plain int64 arrays."""
    for start in range(0, max(len(array) - overlap, 0), CHUNK):
        yield start, np.asarray(array[start: start + CHUNK + overlap], dtype=np.int64)


def index_tokens(index: Index) -> int:
    """Tokens the index describes (its pointers are the running offsets of its lengths)."""
    if not index.sequences:
        return 0
    return int(index.pointers[-1]) // index.dtype.itemsize + int(index.lengths[-1])


@dataclass(frozen=True)
class Block:
    """A block of a prefix's data as `verify` streams it, with what the checks need to know."""

    ids: np.ndarray
    mask: np.ndarray  # empty where the layout has no loss-mask channel
    position: int  # tokens before this block
    index: Index  # the ids' index
    sound: bool  # the index and .bin sizes agree: rows and documents can be located
    manifest: Manifest


@dataclass(frozen=True)
class DataLayout:
    name: ClassVar[str | None] = None  # sft.layout in the manifest
    unit: ClassVar[str] = "document"  # what one document of the index is, in messages
    has_mask: ClassVar[bool] = False  # a loss-mask channel beside the ids
    pads: ClassVar[bool] = False  # pad ids lie in the ids channel
    lays_out_rows: ClassVar[bool] = False  # rows are laid out from windows of samples (a shard's: by `merge`, `finish`)
    described: ClassVar[str] = ""  # "packed", "in the pai layout": why shards of it cannot be joined
    width_in_format: ClassVar[bool] = False  # readers must know seq_length to read a row
    needs_seq_length: ClassVar[str | None] = None  # the refusal when seq_length is not given
    # Settings of `qwen-data sft` left unset take these: Pai's script truncates over-long samples,
    # trains the assistant turn from <|im_start|> on, joins an alpaca instruction and input with nothing.
    defaults: ClassVar[dict] = dict(overlong="drop", assistant_span="im_end_nl", input_separator="\n")
    packed: bool = False
    seq_length: int | None = None

    def default_pad_id(self, vocab_size: int) -> int:
        return DEFAULT_PAD_ID

    def channels(self, prefix: str, dtype) -> list[tuple[str, np.dtype]]:
        """(path prefix, dtype) of each indexed dataset the layout writes: ids first."""
        found = [(prefix, np.dtype(dtype))]
        return found + [(prefix + MASK_SUFFIX, np.dtype(np.uint8))] if self.has_mask else found

    @property
    def row_values(self) -> int | None:
        """Values in every document when all have the same size (whole rows are read at once)."""
        return None

    def open(self, prefix: str, mmap: bool = True) -> "StoredDocuments":
        """The documents of `prefix`, read back as this layout stores them (`StoredDocuments`)."""
        return StoredDocuments(self, prefix, mmap)

    def read_row(self, tokens: np.ndarray, mask: np.ndarray | None, lengths: np.ndarray, pad_id: int | None):
        """One document as `StoredDocuments.document` gives it: (token ids, trained flags, sample lengths,
        pad ids after the samples)."""
        if mask is None:  # every token is a target
            return tokens, np.ones(len(tokens), bool), lengths, 0
        return _split_pad(tokens, mask.astype(bool), lengths, pad_id)

    def sample_lengths(self, index: Index, data: np.ndarray, pad_id: int | None):
        """The length of every sample (pretraining: of every document), padding left out, yielded a
        chunk at a time: memory stays flat however many there are."""
        return index.length_chunks()

    def check_index(self, index: Index, problems: list[str]) -> bool:
        """What the layout promises of documents and sequences, from the index alone."""
        return _one_sequence_each(index, self.unit, "", problems) and _none_empty(index, self.unit, problems)

    def check_block(self, block: Block, found, stats) -> None:
        """Every value of one block of the data (`found.add(key, where, values)` records offences)."""

    def first_outside(self, values: np.ndarray, vocab: int, pad: int) -> tuple[int, int] | None:
        """(position among `values`, id) of the first id a model would read from these whole rows of
        stored values that is neither below `vocab` nor the pad id; None where there is none."""
        if not len(values) or (values.min() >= 0 and values.max() < vocab):  # the usual case, two fast passes
            return None
        bad = ((values < 0) | (values >= vocab)) & (values != pad)
        if not bad.any():
            return None
        first = int(np.argmax(bad))
        return first, int(values[first])

    def expected(self, index: Index, stats) -> dict:
        """The sft section's counts the data must agree with, by field name."""
        return {}


class DocumentLayout(DataLayout):
    """Pretraining data: every document ends with the eod id; every token is a target."""

    def check_block(self, block: Block, found, stats) -> None:
        _check_ids(block, None, found)
        if block.sound:
            stats.document_ends = stats.document_ends or _DocumentEnds(block.index)
            first, ends = stats.document_ends.upto(block.position + len(block.ids))
            last = block.ids[ends - 1 - block.position]
            wrong = np.flatnonzero(last != block.manifest.eod_id)
            found.add("eod", first + wrong, last[wrong])


class MaskLayout(DataLayout):
    name = "mask"
    unit = "sample"
    has_mask = True

    def rows(self, outputs: AtomicOutputs, prefix: str, dtype, pad_id: int) -> "_MaskRowWriter":
        return _MaskRowWriter(outputs, prefix, dtype, pad_id)

    def check_index(self, index: Index, problems: list[str]) -> bool:
        if not super().check_index(index, problems):
            return False
        limit = self.seq_length
        for start, lengths in chunks(index.lengths):
            if limit and (lengths > limit).any():
                s = start + int(np.argmax(lengths > limit))
                problems.append(f"{index.path}: sample {s} has {lengths[s - start]} tokens, over sft.seq_length {limit}")
                return False
        return True

    def check_block(self, block: Block, found, stats) -> None:
        _check_ids(block, None, found)
        is_pad = _check_mask(block, found, stats)
        where = np.flatnonzero(is_pad)
        found.add("unpacked-pad", block.position + where, block.ids[where])

    def expected(self, index: Index, stats) -> dict:
        return dict(trained_tokens=stats.trained, samples=index.documents,
                    sample_tokens=index_tokens(index) - stats.pad_tokens)


class PackedMaskLayout(MaskLayout):
    pads = lays_out_rows = True
    described = "packed"
    needs_seq_length = "--pack needs --seq-length"

    @property
    def row_values(self) -> int:
        return self.seq_length

    def sample_lengths(self, index: Index, data: np.ndarray, pad_id: int | None):
        for start, ends in chunks(index.document_indices[1:]):  # a chunk of rows: their end sequences
            first = int(index.document_indices[start])
            lengths = np.asarray(index.lengths[first:ends[-1]], np.int64)
            # The last sequence of a row is its padding when its first id is the pad id.
            last = ends - 1
            first_ids = data[np.asarray(index.pointers[last], np.int64) // index.dtype.itemsize]
            keep = np.ones(len(lengths), bool)
            keep[last[first_ids == pad_id] - first] = False
            yield lengths[keep]

    def check_index(self, index: Index, problems: list[str]) -> bool:
        seq_length, total, n = self.seq_length, index_tokens(index), index.sequences
        for start, chunk in chunks(index.document_indices, overlap=1):
            # token offset of each document boundary: its first sequence's pointer, or the end
            starts = np.asarray(index.pointers[np.minimum(chunk, n - 1)]) // index.dtype.itemsize if n else 0
            sizes = np.diff(np.where(chunk < n, starts, total))
            if (sizes != seq_length).any():
                d = int(np.argmax(sizes != seq_length))
                problems.append(f"{index.path}: packed row {start + d} holds {sizes[d]} tokens, "
                                f"not sft.seq_length {seq_length}")
                return False
        return _none_empty(index, "sequence", problems)

    def check_block(self, block: Block, found, stats) -> None:
        _check_ids(block, block.manifest.pad_id, found)
        is_pad = _check_mask(block, found, stats)
        if block.sound:
            _check_rows(block, is_pad, self.seq_length, found, stats)

    def expected(self, index: Index, stats) -> dict:
        return dict(trained_tokens=stats.trained, samples=index.sequences - stats.pad_sequences,
                    sample_tokens=index_tokens(index) - stats.pad_tokens, rows=index.documents,
                    pad_tokens=stats.pad_tokens)


class PaiLayout(DataLayout):
    name = "pai"
    unit = "row"
    pads = lays_out_rows = width_in_format = True
    described = "in the pai layout"
    needs_seq_length = "--layout pai needs --seq-length (its every row holds 2 x seq-length values)"
    defaults = dict(overlong="truncate", assistant_span="turn", input_separator="")

    def default_pad_id(self, vocab_size: int) -> int:
        return pai.pad_id(vocab_size)

    def rows(self, outputs: AtomicOutputs, prefix: str, dtype, pad_id: int) -> "_PaiRowWriter":
        return _PaiRowWriter(outputs, prefix, dtype, pad_id)

    @property
    def row_values(self) -> int:
        return 2 * self.seq_length

    def open(self, prefix: str, mmap: bool = True) -> "PaiRows":
        return PaiRows(self, prefix, mmap)

    def sample_lengths(self, index: Index, data: np.ndarray, pad_id: int | None):
        return pai.sample_lengths(data, self.seq_length)

    def check_index(self, index: Index, problems: list[str]) -> bool:
        width = self.row_values
        if not _one_sequence_each(index, "row", " in the pai layout", problems):
            return False
        for start, lengths in chunks(index.lengths):
            if (lengths != width).any():
                r = start + int(np.argmax(lengths != width))
                problems.append(f"{index.path}: row {r} holds {lengths[r - start]} values, "
                                f"not 2 x sft.seq_length = {width}")
                return False
        return True

    def check_block(self, block: Block, found, stats) -> None:
        if block.sound:
            _check_pai_rows(block, self, found, stats)

    def first_outside(self, values: np.ndarray, vocab: int, pad: int) -> tuple[int, int] | None:
        """A model reads the ids of each row's first half, each sample's last one stored as -1 - id
        (`pai.split_row`); its labels are those ids again, or IGNORE."""
        stored = values.reshape(-1, self.row_values)[:, : self.seq_length]
        tokens = np.where(stored < 0, -1 - stored, stored)
        bad = (tokens >= vocab) & (tokens != pad)
        if not bad.any():
            return None
        row, column = divmod(int(np.argmax(bad)), self.seq_length)
        return row * self.row_values + column, int(tokens[row, column])

    def expected(self, index: Index, stats) -> dict:
        rows = dict(rows=index.documents) if self.packed else {}
        return dict(trained_tokens=stats.trained, samples=stats.samples, sample_tokens=stats.sample_tokens,
                    pad_tokens=stats.pad_tokens, **rows)


def sft_layout(name: str, packed: bool, seq_length: int | None) -> DataLayout:
    """The layout of SFT data: `name` is sft.layout ("mask" or "pai")."""
    if name == PaiLayout.name:
        return PaiLayout(packed, seq_length)
    return PackedMaskLayout(True, seq_length) if packed else MaskLayout(False, seq_length)


def layout_of(manifest: Manifest) -> DataLayout:
    if manifest.sft is None:
        return DocumentLayout()
    return sft_layout(manifest.sft.layout, manifest.sft.packed, manifest.sft.seq_length)


# ---------------------------------------------------------------------------------------------
# Writing: windows of samples → the final rows (readers of rows: `PaiRows`, `StoredDocuments` below)


ROW_BYTES = 1 << 22  # of a window's rows laid out at a time by `Rows.write` (its memory; a window is ~40 MB)


@dataclass(frozen=True)
class Rows:
    """A window's packed rows (`PackedMaskLayout`, ids then mask), written by whoever runs `write`
    (a worker, beside its tasks, or the run's writer thread): laid out from its samples as the staged
    files hold them and written at the rows' places. Their index entries and hashes are the
    writer's, made from the samples' lengths and own hashes (`_MaskRowWriter.place`): no byte of the
    rows passes through the process that plans them."""

    samples: tuple[str, str]  # the staged samples' ids .bin and mask .bin (back to back, in input order)
    first: int  # the window's first token there
    lengths: np.ndarray  # its samples'
    plan: RowGroups
    dtype: str
    pad_id: int
    out: tuple[str, str]  # the rows' ids .bin and mask .bin ...
    at: tuple[int, int]  # ... and where in them the rows begin, in bytes

    def write(self) -> None:
        dtype, plan, width = np.dtype(self.dtype), self.plan, self.plan.capacity
        tokens = int(self.lengths.sum())
        batch = max(1, ROW_BYTES // (width * (dtype.itemsize + 1)))
        buffers, starts = RowBuffers(), plan.row_starts
        ids, mask = _staged(self.samples, self.first, tokens, dtype)
        with open(self.out[0], "r+b", buffering=0) as out_ids, open(self.out[1], "r+b", buffering=0) as out_mask:
            for a in range(0, plan.rows, batch):
                b = min(a + batch, plan.rows)
                part = RowGroups(plan.order[starts[a]:starts[b]], plan.row_sizes[a:b], plan.row_tokens[a:b], width)
                rows_ids, rows_mask = padded_rows(ids, mask, self.lengths, part, self.pad_id, buffers)
                _written(out_ids, rows_ids, self.at[0] + a * width * dtype.itemsize)
                _written(out_mask, rows_mask, self.at[1] + a * width)


@dataclass(frozen=True)
class PaiWindowRows:
    """A window's Pai rows (ids then labels, `pai`), laid out from the staged samples, written at their
    place and hashed by whoever runs `write` (their bytes are no join of the samples'): → their joinable
    hash and trained labels, for the writer (`_PaiRowWriter.place`'s `landed`)."""

    samples: tuple[str, str]
    first: int
    lengths: np.ndarray
    plan: RowGroups
    dtype: str  # the samples'
    pad_id: int
    out: str  # the rows' .bin ...
    at: int  # ... and where in it they begin, in bytes

    def write(self) -> tuple[str, int]:
        dtype, tokens = np.dtype(self.dtype), int(self.lengths.sum())
        ids, mask = _staged(self.samples, self.first, tokens, dtype)
        digest, trained, row_bytes = BinDigest(), 0, 2 * self.plan.capacity * pai.DTYPE.itemsize
        with open(self.out, "r+b", buffering=0) as out:
            for first, rows in pai.row_batches(ids, mask, self.lengths, self.plan, self.pad_id):
                digest.update(rows)
                _written(out, rows, self.at + first * row_bytes)
                trained += pai.trained_labels(rows)
        return digest.hexdigest(), trained


def _written(f, array: np.ndarray, offset: int) -> None:
    """`array`'s bytes at `offset` of the file `f`; an OSError names the file (a worker's errand says it)."""
    try:
        pwrite_all(f.fileno(), memoryview(array).cast("B"), offset)
    except OSError as error:
        raise OSError(error.errno, error.strerror, f.name) from None


def _staged(samples: tuple[str, str], first: int, tokens: int, dtype) -> tuple[np.ndarray, np.ndarray]:
    """A window's `tokens` ids and mask from token `first` of the staged samples' files (ids .bin, mask .bin)."""
    return (_mapped(samples[0], first * np.dtype(dtype).itemsize, tokens, dtype),
            _mapped(samples[1], first, tokens, np.uint8))


def _mapped(path: str, offset: int, count: int, dtype) -> np.ndarray:
    """`count` items of `dtype` of the file at `path` from byte `offset`, mapped read-only (the staged
    samples, from the page cache the workers just wrote them to: never copied in whole); unmapped
    once the array is let go."""
    dtype = np.dtype(dtype)
    start = offset - offset % mmap.ALLOCATIONGRANULARITY
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), offset - start + count * dtype.itemsize, prot=mmap.PROT_READ, offset=start)
    return np.frombuffer(mapped, dtype, count, offset - start)


class _MaskRowWriter:
    """Rows of ids and loss mask, each padded to its capacity (`MaskLayout`), hashed from their
    samples' own hashes (`packing.rows_digests`) and written by whoever runs their `Rows`."""

    def __init__(self, outputs: AtomicOutputs, prefix: str, dtype, pad_id: int) -> None:
        self.data = MaskedWriter([outputs.tmp(path) for path in MaskedWriter.files(prefix)], dtype, hashed="given")
        self.pad_id, self.dtype = pad_id, np.dtype(dtype)
        self._pads: np.ndarray | None = None  # the hash of k pad ids, k up to a row's capacity

    def place(self, samples: tuple[str, str], first: int, lengths: np.ndarray, plan: RowGroups,
              hashes: np.ndarray) -> tuple[Rows, None]:
        """The rows of `plan` in the index, their hashes made from the samples' (`hashes`: ids' then
        mask's, `packing.SampleWindows`); → what writes them, from the samples as staged at
        `samples` from token `first` (and nothing to do with what it gives back)."""
        if self._pads is None or len(self._pads) <= plan.capacity:
            self._pads = repeated_hashes(np.array([self.pad_id], self.dtype).tobytes(), plan.capacity)
        ids_digest, mask_digest = rows_digests(lengths, plan, hashes, self.dtype.itemsize, self._pads)
        sequences, per_doc = plan.sequence_layout(lengths)
        at = (self.data.ids.reserve(sequences, per_doc, ids_digest),
              self.data.mask.reserve(sequences, per_doc, mask_digest))
        return Rows(samples, first, lengths, plan, self.dtype.str, self.pad_id,
                    (self.data.ids.bin_path, self.data.mask.bin_path), at), None

    def close(self) -> dict:
        self.data.finalize()
        return counts_of(self.data.ids, self.data.digests)


class _PaiRowWriter:
    """Rows of ids then labels (`PaiLayout`), each hashed where it is written (`PaiWindowRows`); the
    loss-mask channel of an older run goes."""

    def __init__(self, outputs: AtomicOutputs, prefix: str, dtype, pad_id: int) -> None:
        self.data = IndexedDatasetWriter(outputs.tmp(prefix + ".bin"), outputs.tmp(prefix + ".idx"), pai.DTYPE,
                                         hashed="given")
        self.pad_id, self.dtype = pad_id, np.dtype(dtype)
        self._trained: list[int] = []  # each window's (landed in this process's thread or its writer's)
        for path in MaskedWriter.files(prefix)[2:]:
            outputs.leave_out(path)

    def place(self, samples: tuple[str, str], first: int, lengths: np.ndarray, plan: RowGroups,
              hashes: np.ndarray) -> tuple[PaiWindowRows, object]:
        """The rows of `plan` in the index (one sequence of 2 x capacity values each); → what writes
        them, and what takes what it gives back (their hash, their trained labels)."""
        pending = Pending()
        at = self.data.reserve(np.full(plan.rows, 2 * plan.capacity), None, pending)
        return PaiWindowRows(samples, first, lengths, plan, self.dtype.str, self.pad_id, self.data.bin_path, at), \
            functools.partial(self._landed, pending)

    def _landed(self, pending: Pending, written: tuple[str, int]) -> None:
        pending.value, trained = written
        self._trained.append(trained)

    @property
    def trained(self) -> int:
        return sum(self._trained)

    def close(self) -> dict:
        self.data.finalize()
        return counts_of(self.data, [self.data.digests])


class LaidOut:
    """The rows of a layout that lays them out, placed as windows of samples close
    (`packing.SampleWindows`) from samples staged at `samples` (ids .bin, mask .bin), in the layout
    named; each window's rows are written by whoever runs what `place` gives (`write`), once the
    window's samples are in those files."""

    def __init__(self, outputs: AtomicOutputs, prefix: str, layout_name: str, packing: str | None,
                 seq_length: int, dtype, pad_id: int, samples: tuple[str, str]) -> None:
        self.layout_name, self.packing, self.seq_length, self.samples = layout_name, packing, seq_length, samples
        self.writer = sft_layout(layout_name, packing is not None, seq_length).rows(outputs, prefix, dtype, pad_id)
        self.rows = self.tokens = 0
        # Where each sample went, where its layout keeps samples as sequences (mask, packed): per
        # window (its first sample, its first sequence, its samples' sequences from there).
        self.sequences = self.samples_placed = 0
        self._placed: list[tuple[int, int, np.ndarray]] = []
        self.sequenced = layout_name == "mask" and packing is not None

    def place(self, first: int, lengths: np.ndarray, plan: RowGroups, hashes: np.ndarray):
        """A closed window (`packing.SampleWindows`): its rows placed; → (what writes them, `write`, anywhere;
        what takes what that gives back here, None where nothing)."""
        rows = self.writer.place(self.samples, first, lengths, plan, hashes)
        self.rows += plan.rows
        self.tokens += plan.tokens
        if self.sequenced:
            self._placed.append((self.samples_placed, self.sequences, plan.sample_sequences()))
            self.sequences += int(plan.row_sizes.sum() + (plan.row_tokens < plan.capacity).sum())
        self.samples_placed += len(plan.order)
        return rows

    def sequence_of(self, sample: int) -> int:
        """The sequence of the rows holding sample `sample` (counting every sample laid out from 0)."""
        k = bisect.bisect_right([first for first, _, _ in self._placed], sample) - 1
        first, sequence, placed = self._placed[k]
        return sequence + int(placed[sample - first])

    def close(self, section: SFTSection, trained: int) -> tuple[dict, SFTSection]:
        """The manifest's counts, and `section` with what was laid out (nothing left to merge), once
        every window's rows are written; `trained`: the samples' trained tokens (packed rows train
        what their samples do; Pai's rows count their labels)."""
        counts = self.writer.close()
        if isinstance(self.writer, _PaiRowWriter):
            trained = self.writer.trained
        capacity = self.rows * self.seq_length
        rows = dict(packing=self.packing, rows=self.rows,
                    fill=round(self.tokens / capacity if capacity else 0.0, 6)) if self.packing else {}
        return counts, section.replace(layout=self.layout_name, packed=self.packing is not None,
                                       trained_tokens=trained, pad_tokens=capacity - self.tokens,
                                       pack_on_merge=None, layout_on_merge=None, **rows)


HASHED_TOKENS = 1 << 23  # of staged samples read at a time to hash them (`staged_windows`)


def staged_windows(windows, ids_path: str, mask_path: str, dtype, lengths: np.ndarray):
    """The windows of samples already staged (`ids_path`, `mask_path`: a merge's, a resumed run's),
    fed to `windows` (`packing.SampleWindows`) with their hashes, made from their bytes a window's
    worth at a time (memory stays flat)."""
    ends = np.cumsum(lengths)
    with open(ids_path, "rb") as ids, open(mask_path, "rb") as mask:
        first = 0
        while first < len(lengths):
            last = max(first + 1, int(np.searchsorted(ends, ends[first] + HASHED_TOKENS)))
            part, tokens = lengths[first:last], int(lengths[first:last].sum())
            yield from windows.add(part, (piece_hashes(np.fromfile(ids, dtype, tokens), part),
                                          piece_hashes(np.fromfile(mask, np.uint8, tokens), part)))
            first = last


def finish(outputs: AtomicOutputs, prefix: str, samples: MaskedWriter, lengths: np.ndarray, section: SFTSection,
           pad_id: int) -> tuple[dict, SFTSection]:
    """Lay out the samples a merge gathered at PREFIX.unpacked (removed here) as the shards' `section`
    left them to it: in its layout_on_merge (else its layout), packed where pack_on_merge (by its
    packing, else the default) into rows of its seq_length, window after window as a run lays them
    out. `LaidOut.close`'s counts and section."""
    layout_name = section.layout_on_merge or section.layout
    packing = (section.packing or DEFAULT_PACKING) if section.pack_on_merge else None
    dtype = samples.ids.dtype
    laid_out = LaidOut(outputs, prefix, layout_name, packing, section.seq_length, dtype, pad_id,
                       (samples.ids.bin_path, samples.mask.bin_path))
    windows = SampleWindows(packing, section.seq_length)
    staged = staged_windows(windows, samples.ids.bin_path, samples.mask.bin_path, dtype, lengths)
    for window in itertools.chain(staged, windows.close()):  # windows follow each other
        rows, landed = laid_out.place(*window)
        written = rows.write()
        if landed is not None:
            landed(written)
    for path in MaskedWriter.files(prefix + UNPACKED):
        outputs.discard(path)
    return laid_out.close(section, section.trained_tokens)


def counts_of(data: IndexedDatasetWriter, digests: list[tuple[str, str]]) -> dict:
    """The manifest's fields of finished data: its first channel's dtype and counts, the
    fingerprint of all its channels."""
    return dict(dtype=data.dtype.name, documents=data.documents, sequences=data.sequences, tokens=data.tokens,
                **fingerprinted(digests))


# ---------------------------------------------------------------------------------------------
# Reading back


class StoredDocuments:
    """The documents of a prefix (`DataLayout.open`): `len(documents)`, and `documents.document(i)`
    → (token ids as int64, the loss mask as uint8 or None where the layout has none, the sequence
    lengths as int64), the rows of a packed layout padding included.

    Megatron's own bytes, read here by our index reader: every index is checked whole first
    (`indexed.check`), and the loss mask's against the ids' (`indexed.check_same_index`), so no read
    relies on entries a damaged file would give. Values are read a document at a time, from memmaps
    or (`mmap` False, megatron-core's `mmap_bin_files`) by plain reads."""

    def __init__(self, layout: DataLayout, prefix: str, mmap: bool = True) -> None:
        self.layout, self.prefix, self.mmap = layout, prefix, mmap
        self.index = check(prefix + ".idx", prefix + ".bin")
        (_, dtype), *mask = layout.channels(prefix, self.index.dtype)
        self._channels = [(prefix + ".bin", dtype)]
        for name, mask_dtype in mask:
            mask_index = check(name + ".idx", name + ".bin")
            if mask_index.dtype != mask_dtype:
                raise IndexFormatError(f"{mask_index.path}: dtype {mask_index.dtype.name}, expected {mask_dtype.name}")
            check_same_index(self.index, mask_index)
            self._channels.append((name + ".bin", mask_dtype))
        self._maps = [bin_tokens(path, dt) for path, dt in self._channels] if mmap else None

    def __len__(self) -> int:
        return self.index.documents

    @cached_property
    def document_lengths(self) -> np.ndarray:
        """Tokens of every document as `document` gives them (int64)."""
        ends = np.concatenate([[0], np.cumsum(self.index.lengths, dtype=np.int64)])
        docs = self.index.document_indices
        return ends[docs[1:]] - ends[docs[:-1]]

    def document(self, i: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray]:
        if not 0 <= i < len(self):
            raise IndexError(f"{self.prefix}: no document {i} (it has {len(self):,}, numbered from 0)")
        first, last = (int(d) for d in self.index.document_indices[i:i + 2])
        lengths = np.asarray(self.index.lengths[first:last], np.int64)
        # A document's sequences lie back to back: one read from its first sequence.
        start = int(self.index.pointers[first]) // self.index.dtype.itemsize if last > first else 0
        values, *mask = (self._read(c, start, int(lengths.sum())) for c in range(len(self._channels)))
        return values.astype(np.int64), (mask[0] if mask else None), lengths

    def _read(self, channel: int, start: int, count: int) -> np.ndarray:
        if self._maps is not None:
            return np.asarray(self._maps[channel][start:start + count])
        path, dtype = self._channels[channel]
        with open(path, "rb") as f:
            return read_tokens(f, dtype, start, count)

    def sample_lengths(self, pad_id: int | None):
        """The length of every sample (pretraining: of every document), padding left out, a chunk at
        a time (`DataLayout.sample_lengths`)."""
        path, dtype = self._channels[0]
        return self.layout.sample_lengths(self.index, bin_tokens(path, dtype), pad_id)


class PaiRows(StoredDocuments):
    """The rows of a pai-layout prefix, each handed out decoded as the mask layout stores a row
    (`pai.split_row`: its end marks and shifted labels undone): `seq_length` tokens, their loss mask,
    the sample lengths then the pad run's. Every row is checked to be 2 x seq_length values first."""

    def __init__(self, layout: PaiLayout, prefix: str, mmap: bool = True) -> None:
        super().__init__(layout, prefix, mmap)
        problems: list[str] = []
        if not layout.check_index(self.index, problems):
            raise IndexFormatError(problems[0])

    @cached_property
    def document_lengths(self) -> np.ndarray:
        return np.full(len(self), self.layout.seq_length, np.int64)

    def document(self, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        values, _, _ = super().document(i)
        return pai.split_row(values, self.layout.seq_length)


def _split_pad(tokens, trained, parts, pad_id: int):
    """A row's last part is padding when it starts with the pad id (data never holds it)."""
    if len(parts) > 1 and tokens[len(tokens) - parts[-1]] == pad_id:
        return tokens, trained, parts[:-1], int(parts[-1])
    return tokens, trained, parts, 0


# ---------------------------------------------------------------------------------------------
# Checks (verify)


def check_offsets(index: Index, problems: list[str]) -> bool:
    """Lengths ≥ 0, pointers the running byte offsets of the lengths, document indices 0 → sequences."""
    itemsize = index.dtype.itemsize
    offset = 0
    for start, lengths in chunks(index.lengths):
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
    for start, chunk in chunks(docs, overlap=1):
        if (np.diff(chunk) < 0).any():
            d = start + int(np.argmax(np.diff(chunk) < 0))
            problems.append(f"{index.path}: document indices decrease after document {d}")
            return False
    return True


def _one_sequence_each(index: Index, unit: str, where: str, problems: list[str]) -> bool:
    for start, chunk in chunks(index.document_indices, overlap=1):
        if (np.diff(chunk) != 1).any():
            d = start + int(np.argmax(np.diff(chunk) != 1))
            expected = f"one per document{where}" if unit == "row" else f"one {unit} per document"
            problems.append(f"{index.path}: {unit if unit == 'row' else 'document'} {d} holds "
                            f"{chunk[d - start + 1] - chunk[d - start]} sequences, expected {expected}")
            return False
    return True


def _none_empty(index: Index, unit: str, problems: list[str]) -> bool:
    for start, lengths in chunks(index.lengths):
        if (lengths == 0).any():
            problems.append(f"{index.path}: {unit} {start + int(np.argmax(lengths == 0))} is empty")
            return False
    return True


class _DocumentEnds:
    """Token end of each document, in order, handed out block by block (one sequence each)."""

    def __init__(self, index: Index) -> None:
        self._chunks = chunks(index.lengths)
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


def _check_ids(block: Block, pad: int | None, found) -> None:
    ids, vocab = block.ids, block.manifest.vocab_size
    if not len(ids) or (ids.min() >= 0 and ids.max() < vocab):  # the usual case, two fast passes
        return
    bad = (ids < 0) | (ids >= vocab)
    if pad is not None:
        bad &= ids != pad
    where = np.flatnonzero(bad)
    found.add("vocab", block.position + where, ids[where])


def _check_mask(block: Block, found, stats) -> np.ndarray:
    """Mask values, trained pad positions; the block's pad positions."""
    ids, mask, position = block.ids, block.mask, block.position
    is_pad = ids == block.manifest.pad_id
    if len(mask) and mask.max() > 1:
        where = np.flatnonzero(mask > 1)
        found.add("mask-value", position + where, mask[where])
    stats.trained += int(np.count_nonzero(mask))
    pads = int(np.count_nonzero(is_pad))
    stats.pad_tokens += pads
    if pads:
        n = min(len(ids), len(mask))
        trained_pad = np.flatnonzero(is_pad[:n] & (mask[:n] != 0))
        found.add("pad-trained", position + trained_pad, ids[trained_pad])
    return is_pad


def _check_rows(block: Block, is_pad: np.ndarray, seq_length: int, found, stats) -> None:
    """Packed rows: pad ids exactly fill the last sequence of a row ending in pad, nowhere else."""
    index = block.index
    rows = is_pad.reshape(-1, seq_length)
    first = block.position // seq_length
    last_sequence = np.asarray(index.document_indices[first + 1: first + 1 + len(rows)], dtype=np.int64) - 1
    ends_in_pad = rows[:, -1]
    pad_length = np.where(ends_in_pad, np.asarray(index.lengths[last_sequence], dtype=np.int64), 0)
    expected = np.arange(seq_length) >= (seq_length - pad_length)[:, None]
    wrong = np.flatnonzero((rows != expected).any(axis=1))
    found.add("row-pad", first + wrong, np.count_nonzero(rows[wrong], axis=1))
    empty = np.flatnonzero(pad_length >= seq_length)
    found.add("row-empty", first + empty, pad_length[empty])
    stats.pad_sequences += int(np.count_nonzero(ends_in_pad))


def _check_pai_rows(block: Block, layout: PaiLayout, found, stats) -> None:
    """Whole pai-layout rows (`pai`), checked all at once."""
    width, vocab, pad = layout.seq_length, block.manifest.vocab_size, block.manifest.pad_id
    rows = block.ids.reshape(-1, 2 * width).astype(np.int64)
    stored, labels = rows[:, :width], rows[:, width:]
    marks = stored < 0
    tokens = np.where(marks, -1 - stored, stored)
    samples = marks.sum(axis=1)
    # Samples fill the row up to just after its last end mark; padding follows.
    data_end = np.where(samples > 0, width - np.argmax(marks[:, ::-1], axis=1), 0)
    in_data = np.arange(width) < data_end[:, None]
    numbers = block.position // (2 * width) + np.arange(len(rows))

    def add(key, bad, values):
        where = np.flatnonzero(bad)
        found.add(key, numbers[where], values[where])

    bad_id = in_data & ((tokens >= vocab) | (tokens == pad))
    add("pai-id", bad_id.any(axis=1), tokens[np.arange(len(rows)), np.argmax(bad_id, axis=1)])
    bad_pad = ~in_data & (stored != pad)
    add("pai-pad", bad_pad.any(axis=1), stored[np.arange(len(rows)), np.argmax(bad_pad, axis=1)])
    add("pai-empty", samples == 0, samples)
    if not layout.packed:
        add("pai-samples", samples > 1, samples)
    # A label may be trained where the next position holds the same sample's next id.
    may_train = np.zeros_like(marks)
    may_train[:, :-1] = in_data[:, 1:] & ~marks[:, :-1]
    next_ids = np.zeros_like(tokens)
    next_ids[:, :-1] = tokens[:, 1:]
    trained = labels != pai.IGNORE
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
