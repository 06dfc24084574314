"""A prefix read back as rows of samples, whatever its kind and layout: what `inspect`, `stats` and
the report show.

A row is one document of the prefix: a pretraining document, an unpacked SFT sample, or a packed
row (its samples, then a run of pad ids when it is not full). Each comes back as its token ids,
which of them are trained, and where its samples end. Nothing is loaded whole: indexes and data
are memmaps, and `sample_lengths` streams.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from ..formats import pai
from ..formats.indexed import MASK_SUFFIX, read_index
from ..formats.manifest import Manifest

PAI_ROWS_AT_ONCE = 4096  # rows scanned at a time for their sample ends


@dataclass
class Row:
    index: int  # the document's number in the prefix
    tokens: np.ndarray  # int64 ids
    trained: np.ndarray  # bool: token t is a target whose loss counts
    samples: np.ndarray  # int64 lengths of the row's samples, in order
    padding: int  # pad ids after the samples

    def spans(self) -> list[tuple[int, int]]:
        """(start, end) of each sample in `tokens`."""
        ends = np.cumsum(self.samples)
        return list(zip((ends - self.samples).tolist(), ends.tolist()))


class Samples:
    """The rows of `prefix`, by number: `len(samples)`, `samples.row(i)`."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.manifest = Manifest.read(prefix)
        m = self.manifest
        self.index = read_index(prefix + ".idx")
        self._data = _memmap(prefix + ".bin", self.index.dtype)
        self._mask = None
        if m.layout == "mask":
            mask_index = read_index(prefix + MASK_SUFFIX + ".idx")
            if not np.array_equal(mask_index.lengths, self.index.lengths):
                raise ValueError(f"{prefix}: the ids and the loss mask have different indices "
                                 f"(run `qwen-data verify {prefix}`)")
            self._mask = _memmap(prefix + MASK_SUFFIX + ".bin", np.uint8)

    def __len__(self) -> int:
        return self.index.documents

    @property
    def pad_id(self) -> int | None:
        return self.manifest.pad_id if self.manifest.kind == "sft" else None

    def row(self, i: int) -> Row:
        if not 0 <= i < len(self):
            raise ValueError(f"{self.prefix}: no row {i} (it has {len(self):,}, numbered from 0)")
        first, last = (int(d) for d in self.index.document_indices[i:i + 2])
        lengths = np.asarray(self.index.lengths[first:last], np.int64)
        start = int(self.index.pointers[first]) // self.index.dtype.itemsize if last > first else 0
        values = np.asarray(self._data[start:start + int(lengths.sum())], np.int64)
        if self.manifest.layout == "pai":
            tokens, mask, parts = pai.split_row(values, self.manifest.seq_length)
            return self._row(i, tokens, mask.astype(bool), parts)
        if self._mask is None:  # pretraining: every token is a target
            return Row(i, values, np.ones(len(values), bool), lengths, 0)
        return self._row(i, values, self._mask[start:start + len(values)].astype(bool), lengths)

    def _row(self, i: int, tokens, trained, parts) -> Row:
        """A packed or pai row's last part is padding when it starts with the pad id (data never holds it)."""
        if len(parts) > 1 and tokens[len(tokens) - parts[-1]] == self.pad_id:
            return Row(i, tokens, trained, parts[:-1], int(parts[-1]))
        return Row(i, tokens, trained, parts, 0)

    def sample_lengths(self) -> np.ndarray:
        """The length of every sample (pretraining: of every document), padding left out."""
        m, index = self.manifest, self.index
        if m.layout == "pai":
            return self._pai_sample_lengths()
        lengths = index.lengths  # int32, as the index holds them: no copy of a large index
        if not m.packed or not len(lengths):
            return lengths
        # The last sequence of a row is its padding when its first id is the pad id.
        last = np.asarray(index.document_indices[1:], np.int64) - 1
        first_ids = self._data[np.asarray(index.pointers[last], np.int64) // index.dtype.itemsize]
        keep = np.ones(len(lengths), bool)
        keep[last[first_ids == m.pad_id]] = False
        return lengths[keep]

    def _pai_sample_lengths(self) -> np.ndarray:
        """Sample ends are the negative ids of the rows' first halves; scanned a block of rows at a time."""
        width = self.manifest.seq_length
        rows = self._data.reshape(-1, 2 * width) if len(self._data) else np.zeros((0, 2 * width), np.int32)
        out = []
        for first in range(0, len(rows), PAI_ROWS_AT_ONCE):
            ends = np.flatnonzero(rows[first:first + PAI_ROWS_AT_ONCE, :width].ravel() < 0)
            row, end = ends // width, ends % width + 1
            start = np.concatenate([[0], end[:-1]])
            start[np.concatenate([[True], row[1:] != row[:-1]])] = 0  # a row's first sample starts at 0
            out.append(end - start)
        return np.concatenate(out) if out else np.zeros(0, np.int64)


def _memmap(path: str, dtype) -> np.ndarray:
    if os.path.getsize(path) == 0:  # np.memmap refuses empty files
        return np.zeros(0, dtype)
    return np.memmap(path, dtype, "r")
