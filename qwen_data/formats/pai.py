"""Pai-Megatron-Patch's SFT layout (its `build_idxmap_sft_dataset.py`), written and read here.

One int32 indexed dataset, one document of one sequence per row, 2 × seq_length values:

    [0, S)   tokens: the row's samples back to back, then pad ids to S. The last id of every
             sample is stored as -1 - id: Pai's trainer finds sample ends (where position ids
             restart) at the negative values, and takes -1 - v back before the embedding.
    [S, 2S)  labels, already shifted: labels[i] = tokens[i + 1] where that token is trained
             (mask[i + 1]), IGNORE elsewhere: the prompt, each sample's last position, padding.

Unpacked, a row holds one sample. Pai's trainer reads the two halves as they are, with
loss_mask = labels != IGNORE, so the pad id is never a target: any id inside the embedding table
is harmless. Values are negative, so the dtype is int32 whatever the vocabulary.
"""

from __future__ import annotations

import numpy as np

from .packing import RowGroups

IGNORE = -100  # a label that is not trained (torch's cross-entropy ignore_index)
DTYPE = np.dtype(np.int32)
ROWS_PER_BATCH = 4096  # rows scanned for their sample ends at a time
# Values of rows laid out at a time (`row_batches`): each takes ~20-40 bytes of temporaries (4,096 rows of 4096 at
# once: packed chats, 160 MB at 2 workers, peaked at 932 MiB summed, 622 MiB so).
LAID_OUT_VALUES = 1 << 20


def pad_id(vocab_size: int) -> int:
    """Pai's pad: it adds `<|extra_0|>` to the tokenizer, which gives it the first free id."""
    return vocab_size


def row_batches(ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray, plan: RowGroups, pad: int):
    """Samples (ids + loss mask, back to back in input order) as the rows of `plan`: (the first
    row's number, rows of 2 x capacity values), LAID_OUT_VALUES or a row at a time."""
    width = plan.capacity
    starts = np.cumsum(lengths) - lengths
    row_starts, batch = plan.row_starts, max(1, LAID_OUT_VALUES // (2 * width))
    for first in range(0, plan.rows, batch):
        last = min(first + batch, plan.rows)
        order = plan.order[row_starts[first]:row_starts[last]]
        yield first, _rows(np.concatenate([ids[starts[s]:starts[s] + lengths[s]] for s in order]),
                           np.concatenate([mask[starts[s]:starts[s] + lengths[s]] for s in order]),
                           lengths[order], plan.row_tokens[first:last], width, pad)


def trained_labels(rows: np.ndarray) -> int:
    """How many labels of rows (`row_batches`) are trained."""
    return int((rows[:, rows.shape[1] // 2:] != IGNORE).sum())


def _rows(ids: np.ndarray, mask: np.ndarray, lengths: np.ndarray, row_tokens: np.ndarray, width: int,
          pad: int) -> np.ndarray:
    """Rows of 2 × width values from samples laid back to back, row after row."""
    ids = ids.astype(np.int32)
    ends = np.cumsum(lengths) - 1
    labels = np.full(len(ids), IGNORE, np.int32)
    labels[:-1] = np.where(mask[1:] != 0, ids[1:], IGNORE)
    labels[ends] = IGNORE  # a sample's last token predicts nothing of its own sample
    tokens = ids.copy()
    tokens[ends] = -1 - ids[ends]
    rows = np.empty((len(row_tokens), 2 * width), np.int32)
    rows[:, :width], rows[:, width:] = pad, IGNORE
    row_of = np.repeat(np.arange(len(row_tokens)), row_tokens)
    column = np.arange(len(ids)) - np.repeat(np.cumsum(row_tokens) - row_tokens, row_tokens)
    rows[row_of, column], rows[row_of, column + width] = tokens, labels
    return rows


def split_row(row: np.ndarray, width: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One row read back: (token ids, loss mask with mask[t] = 1 when token t is trained, the
    sample lengths then the pad run's if any). The inverse of writing, for `verify` and readers."""
    stored, labels = np.asarray(row[:width], np.int64), np.asarray(row[width:], np.int64)
    tokens = np.where(stored < 0, -1 - stored, stored)
    mask = np.zeros(width, np.uint8)
    mask[1:] = labels[:-1] != IGNORE
    ends = np.flatnonzero(stored < 0) + 1
    bounds = np.concatenate([[0], ends, [width] if not len(ends) or ends[-1] < width else []])
    return tokens, mask, np.diff(bounds).astype(np.int64)


def sample_lengths(values: np.ndarray, width: int):
    """The length of every sample of the rows `values` holds, yielded a block of rows at a time:
    sample ends are the negative ids of the rows' first halves."""
    rows = values.reshape(-1, 2 * width) if len(values) else np.zeros((0, 2 * width), np.int32)
    for first in range(0, len(rows), ROWS_PER_BATCH):
        ends = np.flatnonzero(rows[first:first + ROWS_PER_BATCH, :width].ravel() < 0)
        row, end = ends // width, ends % width + 1
        start = np.concatenate([[0], end[:-1]])
        start[np.concatenate([[True], row[1:] != row[:-1]])] = 0  # a row's first sample starts at 0
        yield end - start
