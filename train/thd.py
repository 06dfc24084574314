"""Packed rows as Transformer Engine's THD stream, in the fixed form a CUDA graph replays.

TE's THD attention takes a micro-batch's b rows of s tokens as one stream of b·s tokens and
`cu_seqlens`, the starts of the samples in it (then b·s). The loader gives each row's starts,
padded with s ([b, s + 1], data.boundaries); `stream_starts` joins them.

Eagerly (`attention.thd_mask`) the count of samples is rounded up to a power of two, so TE and
cuDNN meet a handful of shapes. A captured graph (graphs.py) reads a buffer of a size fixed at its
capture, which each replay's micro-batch refills in place: `fixed_count` is that size,
`fill_fixed` writes a micro-batch's starts into it, empty samples at the end (starts of b·s).
The longest sample is taken as s. A micro-batch of more samples than a graph's count goes to the
graph of a larger count (`fixed_count` of its own count: a graph class each), never into a buffer
too short for it: `fill_fixed` refuses it.

The count: at least ROW_SAMPLES a row, a power of two, at least MIN_SAMPLES. Qwen2.5 chats packed
to rows of 4096 (the 0.5B records' SFT data, 335 rows) hold 2-25 samples a row, 9-36 a micro-batch
of 4 (13 the median): 64 holds every one of them with room. Empty samples cost little: on an H200
TE's THD attention with 64 took 0.848 ms of GPU time a call (forward + backward, 0.5B's shape),
0.830 with the exact count (bench/results/gpu/2026-11-30g-te-thd.md). A larger class is the last
count times GROWTH, up to b·s (every token a sample), so a run meets few of them.

No torch here: the numbers are numpy's, the tensors' memory is the caller's.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

ROW_SAMPLES = 16  # samples a row the smallest class holds
MIN_SAMPLES = 64  # the smallest class, whatever the micro batch
GROWTH = 4  # each larger class holds this many times the last


def stream_starts(cu_seqlens: np.ndarray) -> np.ndarray:
    """[b, s + 1] rows' sample starts, each padded with s → the starts of the samples of the b rows
    read as one stream of b·s tokens (int64, in order, without the end b·s)."""
    b, s = cu_seqlens.shape[0], cu_seqlens.shape[1] - 1
    starts = np.asarray(cu_seqlens)[:, :-1].astype(np.int64)
    return (starts + s * np.arange(b, dtype=np.int64)[:, None])[starts < s]


def fixed_count(samples: int, b: int, s: int) -> int:
    """The fixed sample count of the graph class for a micro-batch of `samples` samples in `b` rows
    of `s` tokens: the smallest class (see the module's docstring) that holds them."""
    if not 0 < samples <= b * s:
        raise ValueError(f"{samples} samples in {b} rows of {s} tokens")
    count = max(MIN_SAMPLES, 1 << (ROW_SAMPLES * b - 1).bit_length())
    while count < samples:
        count *= GROWTH
    return min(count, b * s)


def fill_fixed(cu_seqlens: np.ndarray, out: np.ndarray) -> Optional[int]:
    """Write the stream's starts of the rows of `cu_seqlens` ([b, s + 1]) into `out` ([count + 1]
    int32, in place), then b·s to its end (empty samples); → the samples, or None where `out` is
    too short for them (`out` left as it was)."""
    b, s = cu_seqlens.shape[0], cu_seqlens.shape[1] - 1
    starts = stream_starts(cu_seqlens)
    if len(starts) >= len(out):
        return None
    out[: len(starts)] = starts
    out[len(starts):] = b * s
    return len(starts)
