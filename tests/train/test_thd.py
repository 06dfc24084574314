"""Packed rows as Transformer Engine's THD stream in the fixed form a CUDA graph replays (train/thd.py):
the starts of every sample of the rows as one stream, empty samples to a fixed count, a micro-batch of
more samples refused by a form too short and given a larger graph class. numpy only: the fast tier."""

import numpy as np
import pytest

from qwen_data_train.thd import GROWTH, MIN_SAMPLES, fill_fixed, fixed_count, stream_starts


def rows(*starts_per_row, s=16) -> np.ndarray:
    """[b, s + 1] padded starts as the loader gives them (data.boundaries)."""
    out = np.full((len(starts_per_row), s + 1), s, dtype=np.int32)
    for row, starts in zip(out, starts_per_row):
        row[: len(starts)] = starts
    return out


def test_the_rows_are_one_stream_cut_at_every_sample():
    cu = rows([0, 5, 10], [0], [0, 8])
    assert stream_starts(cu).tolist() == [0, 5, 10, 16, 32, 40]


def test_the_fixed_form_is_padded_with_empty_samples_at_the_end():
    out = np.full(9, -1, dtype=np.int32)
    assert fill_fixed(rows([0, 5, 10], [0], [0, 8]), out) == 6
    assert out.tolist() == [0, 5, 10, 16, 32, 40, 48, 48, 48]
    assert fill_fixed(rows([0], [0], [0]), out) == 3  # fewer samples: the rest of the same buffer emptied
    assert out.tolist() == [0, 16, 32] + [48] * 6


def test_a_form_too_short_refuses_the_micro_batch_and_is_left_as_it_was():
    out = np.full(5, 7, dtype=np.int32)  # 4 samples at most
    assert fill_fixed(rows([0, 5, 10], [0], [0, 8]), out) is None
    assert out.tolist() == [7] * 5
    assert fill_fixed(rows([0, 5, 10], [0]), out) == 4  # exactly 4 fit
    assert out.tolist() == [0, 5, 10, 16, 32]


def test_refilled_in_place_the_buffer_keeps_its_memory():
    out = np.zeros(MIN_SAMPLES + 1, dtype=np.int32)
    where = out.__array_interface__["data"][0]
    for cu in (rows([0, 3]), rows([0, 1, 2], [0, 9])):
        fill_fixed(cu, out)
        assert out.__array_interface__["data"][0] == where and out.dtype == np.int32
    assert out[:6].tolist() == [0, 1, 2, 16, 25, 32] and (out[5:] == 32).all()


def test_the_fixed_count_holds_the_micro_batch_in_few_classes():
    b, s = 4, 4096
    assert fixed_count(1, b, s) == fixed_count(36, b, s) == MIN_SAMPLES == 64  # every 0.5B SFT micro-batch
    assert fixed_count(64, b, s) == 64 and fixed_count(65, b, s) == 64 * GROWTH
    assert fixed_count(8, 8, s) == 128  # 16 samples a row
    assert fixed_count(b * s, b, s) == b * s  # every token a sample: the largest class
    assert len({fixed_count(n, b, s) for n in range(1, b * s + 1)}) == 5  # 64, 256, 1024, 4096, 16384
    assert fixed_count(2, 1, 2) == 2  # never more than the tokens
    for bad in (0, b * s + 1):
        with pytest.raises(ValueError):
            fixed_count(bad, b, s)
