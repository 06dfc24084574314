"""Deterministic packing of SFT samples into fixed-length rows.

`pack(lengths, capacity)` decides which samples share a row (best-fit decreasing); the caller
writes each row as one document whose sequences are its samples, then one pad sequence when the
row is not full. `next_fit` keeps the input order instead (Pai-Megatron-Patch packs that way), and
`one_per_row` is the plan of unpacked data. PACKINGS names the packing algorithms.

A run lays out rows as its samples come, window after window (`SampleWindows`, `next_window`): best fit
packs each PACK_WINDOW tokens of consecutive samples on their own, the others write every row
that can take no more samples. No pass over all samples is left for the end, where one process
would do it while the workers wait, and a merge of shards (`windows`) writes the same rows.

The algorithm is exact best-fit decreasing: samples are taken longest first (equal lengths in
index order) and each goes to the open row with the least free space that still holds it, a new
row when none does. Rows with equal free space are interchangeable for every later decision, so
the row count and the multiset of row loads equal those of the textbook item-by-item BFD.

Speed comes from never handling samples one by one in Python. Open rows live in buckets keyed by
their free space. All samples of one length `s` are placed together: walking the buckets upward
from `s`, every row of a bucket with free space `r` takes `r // s` of them (a row keeps being the
tightest fit until it has less than `s` left, since the tighter buckets were already used up),
so each bucket costs a few steps whatever its size. The dealing is C (`_native.best_fit_rows`):
done in Python, a loop a length, it cost a packed run's main thread ~0.7 s a GB of chats (a window
holds a few thousand lengths); the sorts around it are numpy's (bench/packing.py: 200k realistic
samples window by window 0.26 → 0.05 s).

Output order, chosen so packed data keeps the input's order (shuffled input stays shuffled,
curricula survive): rows are sorted by the smallest sample index they hold, and samples inside
a row by index.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np

from .._native import best_fit_rows, pack_rows
from .digest import pieces_digest


@dataclass(frozen=True)
class RowGroups:
    """Which samples share each row.

    `order` lists sample indices row after row; `row_sizes[i]` is how many of them row i holds,
    `row_tokens[i]` its real (non-pad) token count. Every row is `capacity` tokens once padded.
    """

    order: np.ndarray
    row_sizes: np.ndarray
    row_tokens: np.ndarray
    capacity: int

    @property
    def rows(self) -> int:
        return len(self.row_sizes)

    @property
    def tokens(self) -> int:
        """Real tokens, all rows together."""
        return int(self.row_tokens.sum())

    @property
    def pad_tokens(self) -> int:
        return self.rows * self.capacity - self.tokens

    @property
    def fill(self) -> float:
        """Real tokens / (rows x capacity); 0.0 for an empty plan (JSON has no NaN)."""
        return self.tokens / (self.rows * self.capacity) if self.rows else 0.0

    @cached_property
    def row_starts(self) -> np.ndarray:
        """Offset in `order` of each row's first sample (length rows + 1, last = len(order))."""
        starts = np.zeros(self.rows + 1, dtype=np.int64)
        np.cumsum(self.row_sizes, out=starts[1:])
        return starts

    def row(self, i: int) -> np.ndarray:
        """Sample indices of row i, in index order."""
        starts = self.row_starts
        return self.order[starts[i] : starts[i + 1]]

    def __iter__(self):
        """Each row's sample indices, row after row."""
        return iter(np.split(self.order, self.row_starts[1:-1])) if self.rows else iter(())

    def sequence_layout(self, lengths) -> tuple[np.ndarray, np.ndarray]:
        """Sequence lengths and sequences per document for `IndexedDatasetWriter.add_batch`.

        Each row contributes its samples' lengths (in `order`) then, if it is not full, one pad
        sequence of the remaining length. `lengths` are the same lengths `pack` was given.
        """
        lengths = np.asarray(lengths, dtype=np.int64)
        if len(lengths) != len(self.order) or (
            self.rows and not np.array_equal(
                np.add.reduceat(lengths[self.order], self.row_starts[:-1]), self.row_tokens
            )
        ):
            raise ValueError("these are not the lengths this plan was made from")
        pads, per_doc, is_sample = self._slots()
        out = np.empty(len(is_sample), dtype=np.int64)
        out[is_sample] = lengths[self.order]
        out[~is_sample] = pads[pads > 0]
        return out, per_doc

    def sample_sequences(self) -> np.ndarray:
        """Each sample's sequence among the rows' (`sequence_layout`), by the sample's index."""
        at = np.empty(len(self.order), dtype=np.int64)
        at[self.order] = np.flatnonzero(self._slots()[2])
        return at

    def _slots(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(each row's pad tokens, its sequences, whether each sequence of the rows is a sample)."""
        pads = self.capacity - self.row_tokens
        has_pad = pads > 0
        per_doc = self.row_sizes + has_pad
        is_sample = np.ones(int(per_doc.sum()), dtype=bool)
        is_sample[np.cumsum(per_doc)[has_pad] - 1] = False
        return pads, per_doc, is_sample


def pack(lengths, capacity: int) -> RowGroups:
    """Pack samples of the given token lengths into rows of `capacity` tokens.

    Raises ValueError naming the first sample whose length is not in 1..capacity.
    Same input, same plan, on any machine (integer arithmetic and stable sorts only).
    """
    lengths = _validated(lengths, capacity)
    n = len(lengths)
    if n == 0:
        return _plan(lengths, lengths, 0, capacity)
    by_size = np.argsort(-lengths, kind="stable")  # longest first, ties by index
    row_of_sorted = np.empty(n, dtype=np.int64)
    rows = best_fit_rows(np.ascontiguousarray(lengths[by_size]), int(capacity), row_of_sorted)  # (the buckets, in C)
    return _plan_in_input_order(lengths, by_size, row_of_sorted, rows, capacity)


def next_fit(lengths, capacity: int) -> RowGroups:
    """Samples in input order, a new row whenever the next one does not fit in the current row."""
    lengths = _validated(lengths, capacity)
    row_of = np.empty(len(lengths), dtype=np.int64)  # 0 rows for no samples
    row, used = -1, capacity
    for i, n in enumerate(lengths.tolist()):
        if used + n > capacity:
            row, used = row + 1, 0
        row_of[i], used = row, used + n
    return _plan(lengths, row_of, row + 1, capacity)


def one_per_row(lengths, capacity: int) -> RowGroups:
    lengths = _validated(lengths, capacity)
    return RowGroups(np.arange(len(lengths)), np.ones(len(lengths), np.int64), lengths, capacity)


PACKINGS = {"best-fit": pack, "next-fit": next_fit}
DEFAULT_PACKING = "best-fit"  # the fewest rows; a manifest from before `packing` was recorded was packed so
# Best fit packs the samples of this many tokens at a time (`next_window`): enough that only a
# window's last rows are short of full (realistic chats fill 99.97% of 4096-token rows, 99.99%
# packed all at once; tests/data/test_packing.py), little enough to hold (5 bytes a token, twice).
PACK_WINDOW = 1 << 23


def _plan_in_input_order(lengths, by_size, row_of_sorted, rows, capacity) -> RowGroups:
    row_of = np.empty_like(row_of_sorted)
    row_of[by_size] = row_of_sorted
    # Renumber rows by their smallest sample index: first appearances, scanning indices upward.
    _, first_sample = np.unique(row_of, return_index=True)
    renumber = np.empty(rows, dtype=np.int64)
    renumber[np.argsort(first_sample, kind="stable")] = np.arange(rows)
    return _plan(lengths, renumber[row_of], rows, capacity)


def _plan(lengths, row_of, rows, capacity) -> RowGroups:
    """The plan from each sample's row (rows numbered in output order)."""
    order = np.argsort(row_of, kind="stable")  # stable: index order inside each row
    row_sizes = np.bincount(row_of, minlength=rows).astype(np.int64)
    starts = np.zeros(rows, dtype=np.int64)
    np.cumsum(row_sizes[:-1], out=starts[1:])
    row_tokens = np.add.reduceat(lengths[order], starts) if rows else np.zeros(0, np.int64)
    return RowGroups(order, row_sizes, row_tokens, capacity)


def _validated(lengths, capacity) -> np.ndarray:
    if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
        raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError(f"lengths must be one-dimensional, got shape {array.shape}")
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.dtype.kind not in "iu":
        raise ValueError(f"lengths must be integers, got dtype {array.dtype}")
    array = array.astype(np.int64)
    bad = np.flatnonzero((array < 1) | (array > capacity))
    if bad.size:
        i = int(bad[0])
        problem = "is not positive" if array[i] < 1 else f"exceeds the row capacity {capacity}"
        raise ValueError(
            f"sample {i} has length {int(array[i])} and {problem}"
            f" ({bad.size} such sample{'s' if bad.size > 1 else ''})"
        )
    return array


def next_window(lengths: np.ndarray, packing: str | None, capacity: int, final: bool) -> RowGroups | None:
    """The plan of the next window of samples, from `lengths`: the samples not yet laid out, in
    input order (the window is the first `len(plan.order)` of them). None while samples still to
    come could change it; `final`: none will.

    Best fit packs each window of PACK_WINDOW tokens on its own (the fewest samples holding that
    many; the rest at the end), so rows are written as the samples come and memory stays flat.
    Next fit and one sample a row keep every row but the last open one as it is, and so take
    every row that is closed. Windows fall where the samples' lengths put them, so a run and a
    `merge` of its shards (which lays out all samples at once, `final`) write the same rows.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    if packing == "best-fit":
        ends = np.cumsum(lengths)
        if len(ends) and ends[-1] >= PACK_WINDOW:
            return pack(lengths[: int(np.searchsorted(ends, PACK_WINDOW)) + 1], capacity)
        return pack(lengths, capacity) if final else None
    plan = (PACKINGS[packing] if packing else one_per_row)(lengths, capacity)
    if final or packing is None or plan.rows < 2:
        return plan if final or packing is None else None
    closed, taken = plan.rows - 1, int(plan.row_starts[-2])  # all rows but the last, which may grow
    return RowGroups(plan.order[:taken], plan.row_sizes[:closed], plan.row_tokens[:closed], capacity)


class SampleWindows:
    """Samples as a run makes them, in order, by their lengths and hashes alone (their bytes are
    staged by the workers that made them); out come the windows of `next_window` as they close
    (`add`, then `close` for the last ones), each saying where its samples begin among all the
    samples' tokens: whoever writes its rows reads them from there (`layouts.Rows`)."""

    def __init__(self, packing: str | None, capacity: int) -> None:
        self.packing, self.capacity = packing, capacity
        self._lengths: list[np.ndarray] = []
        self._hashes: list[np.ndarray] = []  # per sample: its ids' and its mask's own hash (`digest.piece_hashes`)
        self._open = 0  # tokens of the samples not in a closed window
        self._first = 0  # where they begin among all the samples' tokens

    def add(self, lengths: np.ndarray, hashes: tuple[np.ndarray, np.ndarray]):
        """`hashes`: each sample's ids' and its mask's own hashes as written (`digest.piece_hashes`)."""
        self._lengths.append(np.array(lengths, np.int64))
        self._hashes.append(np.concatenate(hashes, axis=1))
        self._open += int(self._lengths[-1].sum())
        if self._open >= PACK_WINDOW:
            yield from self._windows(final=False)

    def close(self):
        yield from self._windows(final=True)

    def _windows(self, final: bool):
        """(first token, lengths, plan, hashes) of each window that is closed."""
        lengths = np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)
        hashes = np.concatenate(self._hashes) if self._hashes else np.zeros((0, 4), np.uint64)
        first = 0
        while first < len(lengths) and (plan := next_window(lengths[first:], self.packing, self.capacity, final)):
            n = len(plan.order)
            yield self._first, lengths[first: first + n], plan, hashes[first: first + n]
            first, self._first, self._open = first + n, self._first + plan.tokens, self._open - plan.tokens
        self._lengths, self._hashes = [lengths[first:]], [hashes[first:]]


def window_plans(lengths: np.ndarray, packing: str | None, capacity: int):
    """(samples, plan) of every window, with all samples at hand (a merge's), as `SampleWindows` gives them."""
    lengths = np.asarray(lengths, dtype=np.int64)
    first = 0
    while first < len(lengths):
        plan = next_window(lengths[first:], packing, capacity, final=True)
        yield lengths[first: first + len(plan.order)], plan
        first += len(plan.order)


def padded_rows(ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray, plan: RowGroups,
                pad_id: int, buffers: "RowBuffers | None" = None) -> tuple[np.ndarray, np.ndarray]:
    """The rows of `plan` from its samples laid back to back in input order, each padded to
    exactly its capacity: (ids, mask), rows back to back; a copy a sample, in C (`_native.pack_rows`,
    which lets the GIL go: a worker's errand packs while its tasks go on, `layouts.Rows`).
    `buffers`: where to put the rows (valid until their next use), instead of new arrays."""
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    width = plan.capacity
    out_ids, out_mask = (buffers or RowBuffers()).take(plan.rows * width, ids.dtype)
    pack_rows(np.ascontiguousarray(ids), np.ascontiguousarray(mask, dtype=np.uint8), starts, lengths,
              np.ascontiguousarray(plan.order, dtype=np.int64), np.ascontiguousarray(plan.row_sizes, dtype=np.int64),
              np.ascontiguousarray(plan.row_tokens, dtype=np.int64), width, pad_id, out_ids, out_mask)
    return out_ids, out_mask


def rows_digests(lengths: np.ndarray, plan: RowGroups, hashes: np.ndarray, itemsize: int,
                 pads: np.ndarray) -> tuple[str, str]:
    """The joinable hashes of `padded_rows`' (ids, mask) of `plan`, from its samples' own hashes
    (`hashes`: ids' then mask's, four a sample, `SampleWindows`) and `pads` (the hash of k pad ids,
    `digest.repeated_hashes`), never from their bytes: the pieces `padded_rows` joins, in its order,
    each row's samples then its padding (a mask's padding is zeros, whose hash is 0)."""
    rows, order = plan.rows, plan.order
    pad_at = plan.row_starts[1:] + np.arange(rows)  # each row's padding, after its samples
    is_pad = np.zeros(len(order) + rows, dtype=bool)
    is_pad[pad_at] = True
    pieces = np.empty((len(is_pad), 4), dtype=np.uint64)
    sizes = np.empty(len(is_pad), dtype=np.int64)
    pieces[~is_pad], sizes[~is_pad] = hashes[order], np.asarray(lengths, np.int64)[order]
    padding = plan.capacity - plan.row_tokens
    pieces[is_pad, :2], pieces[is_pad, 2:], sizes[is_pad] = pads[padding], 0, padding
    return pieces_digest(pieces[:, :2], sizes * itemsize), pieces_digest(pieces[:, 2:], sizes)


class RowBuffers:
    """Arrays a writer keeps from one window's rows to the next: new ones for every window would be
    tens of megabytes of fresh memory each time, faulted in page by page."""

    def __init__(self) -> None:
        self._ids: np.ndarray | None = None
        self._mask: np.ndarray | None = None

    def take(self, size: int, dtype) -> tuple[np.ndarray, np.ndarray]:
        if self._ids is None or len(self._ids) < size or self._ids.dtype != dtype:
            self._ids, self._mask = np.empty(size, dtype), np.empty(size, np.uint8)
        return self._ids[:size], self._mask[:size]
