"""A prefix read back as rows of samples, whatever its kind and layout: what `inspect`, `stats` and
the report show.

A row is one document of the prefix: a pretraining document, an unpacked SFT sample, or a packed
row (its samples, then a run of pad ids when it is not full). Each comes back as its token ids,
which of them are trained, and where its samples end. The files are read through the prefix's
layout (`DataLayout.open`). Nothing is loaded whole: indexes and data are memmaps, and
`length_chunks` streams.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..formats.layouts import layout_of
from ..formats.manifest import Manifest


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
        self.layout = layout_of(self.manifest)
        # Its indexes checked whole first: a corrupt entry is one clear error, not a failed slice.
        self.documents = self.layout.open(prefix)

    def __len__(self) -> int:
        return len(self.documents)

    @property
    def pad_id(self) -> int | None:
        return self.manifest.pad_id if self.manifest.kind == "sft" else None

    def row(self, i: int) -> Row:
        if not 0 <= i < len(self):
            raise ValueError(f"{self.prefix}: no row {i} (it has {len(self):,}, numbered from 0)")
        return Row(i, *self.layout.read_row(*self.documents.document(i), self.pad_id))

    def length_chunks(self):
        """The length of every sample (pretraining: of every document), padding left out, a chunk
        (an int array) at a time."""
        return self.documents.sample_lengths(self.pad_id)

    def sample_lengths(self) -> np.ndarray:
        """Every length of `length_chunks` in one array (for prefixes small enough to hold it)."""
        return np.concatenate([np.zeros(0, np.int64), *self.length_chunks()])
