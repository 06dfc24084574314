"""Tests for qwen_data.formats.packing: validity of every plan, exactness of the best-fit emulation,
determinism, edge cases, fill on realistic SFT lengths, and the layout megatron-core reads."""

from __future__ import annotations

import numpy as np
import pytest

from qwen_data.formats import packing
from qwen_data.formats.digest import piece_hashes
from qwen_data.formats.packing import PACKINGS, RowGroups, SampleWindows, next_fit, one_per_row, pack, padded_rows, window_plans

PAD_ID = 151654


def realistic_sft_lengths(n: int, capacity: int = 4096, seed: int = 0) -> np.ndarray:
    """Token lengths of n chat-templated SFT samples, a mix of three log-normals.

    Calibrated on published dataset sizes (bytes / examples on the Hugging Face dataset cards),
    at ~4 characters per Qwen token for English, plus ~30 tokens of chat-template markup:
      * 45% single-turn instructions, like Alpaca (47.8 MB / 52,002 examples with the text
        stored twice: ~360 characters, ~120 tokens) and Alpaca-GPT4 (88.6 MB / 52,002:
        ~760 characters, ~220 tokens): median 150, sigma 0.75 (mean ~200).
      * 35% multi-turn assistant chats, like UltraChat-200k train_sft (1,397 MB / 207,865,
        the first prompt stored twice: ~6,000 characters, ~1,500 tokens): median 1,200,
        sigma 0.65 (mean ~1,480).
      * 20% long-tailed real-user chats and code, like ShareGPT: median 700, sigma 1.1
        (mean ~1,280, p99 ~9,000 before the cut).
    Samples longer than `capacity` are dropped, as `--overlong drop` does. At capacity 4096 the
    result has median ~410, p90 ~1,900, p99 ~3,500, mean ~745 tokens.
    """
    rng = np.random.default_rng(seed)
    medians = np.array([150.0, 1200.0, 700.0])
    sigmas = np.array([0.75, 0.65, 1.1])
    kept, have = [], 0
    while have < n:
        kind = rng.choice(3, size=n, p=[0.45, 0.35, 0.20])
        draw = np.rint(medians[kind] * np.exp(sigmas[kind] * rng.standard_normal(n)))
        draw = draw[(draw >= 1) & (draw <= capacity)].astype(np.int64)
        kept.append(draw)
        have += len(draw)
    return np.concatenate(kept)[:n]


def assert_valid(plan: RowGroups, lengths, capacity: int) -> None:
    """Everything a consumer relies on, checked from scratch."""
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    assert plan.capacity == capacity
    assert np.array_equal(np.sort(plan.order), np.arange(n)), "every sample exactly once"
    assert plan.row_sizes.sum() == n and (plan.row_sizes >= 1).all()
    rows = list(plan)
    assert len(rows) == plan.rows
    loads = np.array([lengths[r].sum() for r in rows], dtype=np.int64)
    assert np.array_equal(loads, plan.row_tokens)
    assert (loads <= capacity).all(), "no row over capacity"
    assert plan.tokens == lengths.sum()
    assert plan.pad_tokens == plan.rows * capacity - lengths.sum()
    # Documented order: index order inside a row, rows by their smallest index.
    assert all((np.diff(r) > 0).all() for r in rows)
    assert (np.diff([r[0] for r in rows]) > 0).all()
    # Any-fit property of best fit: a row is opened only when the sample fits nowhere, so no two
    # rows could have been merged (at most one row is half empty).
    if plan.rows >= 2:
        two_lightest = np.sort(loads)[:2]
        assert two_lightest.sum() > capacity


def naive_best_fit_decreasing(lengths, capacity) -> list[int]:
    """Textbook BFD, one sample at a time; returns the sorted row loads."""
    free: list[int] = []
    for s in sorted(lengths, reverse=True):
        fits = [i for i, r in enumerate(free) if r >= s]
        if fits:
            free[min(fits, key=lambda i: free[i])] -= s
        else:
            free.append(capacity - s)
    return sorted(capacity - r for r in free)


def naive_first_fit_decreasing(lengths, capacity) -> int:
    """Textbook FFD; returns the row count."""
    free: list[int] = []
    for s in sorted(lengths, reverse=True):
        for i, r in enumerate(free):
            if r >= s:
                free[i] -= s
                break
        else:
            free.append(capacity - s)
    return len(free)


def next_fit_in_order(lengths, capacity) -> int:
    """Concatenate in input order, start a new row when the sample does not fit; row count."""
    rows, free = 0, 0
    for s in lengths:
        if s > free:
            rows, free = rows + 1, capacity
        free -= s
    return rows


def test_hand_worked_example():
    # Longest first: 8, 7, 5 open rows A, B, C (free 2, 3, 5); 4 -> C (5), 3 -> B (3),
    # 2 -> A (2), 1 -> C (1). Rows by smallest index: C {0,5,6}, B {1,4}, A {2,3}.
    plan = pack([5, 3, 8, 2, 7, 1, 4], 10)
    assert plan.order.tolist() == [0, 5, 6, 1, 4, 2, 3]
    assert plan.row_sizes.tolist() == [3, 2, 2]
    assert plan.row_tokens.tolist() == [10, 10, 10]
    assert plan.rows == 3 and plan.fill == 1.0 and plan.pad_tokens == 0


def test_same_input_same_plan_whatever_the_container():
    lengths = realistic_sft_lengths(5000, seed=3)
    reference = pack(lengths, 4096)
    for variant in (lengths.astype(np.int32), lengths.astype(np.uint16), lengths.tolist()):
        again = pack(variant, 4096)
        assert np.array_equal(again.order, reference.order)
        assert np.array_equal(again.row_sizes, reference.row_sizes)
    assert_valid(reference, lengths, 4096)


def test_order_of_input_changes_rows_but_not_their_loads():
    lengths = realistic_sft_lengths(3000, seed=4)
    shuffled = np.random.default_rng(0).permutation(len(lengths))
    a, b = pack(lengths, 4096), pack(lengths[shuffled], 4096)
    assert np.array_equal(np.sort(a.row_tokens), np.sort(b.row_tokens))


def test_empty_input():
    plan = pack([], 4096)
    assert plan.rows == 0 and plan.tokens == 0 and plan.pad_tokens == 0 and plan.fill == 0.0
    assert list(plan) == []
    seq, per_doc = plan.sequence_layout([])
    assert len(seq) == 0 and len(per_doc) == 0


def test_every_sample_exactly_capacity():
    plan = pack([64] * 5, 64)
    assert plan.order.tolist() == [0, 1, 2, 3, 4]
    assert plan.row_sizes.tolist() == [1] * 5
    assert plan.fill == 1.0 and plan.pad_tokens == 0


def test_one_sample():
    plan = pack([7], 4096)
    assert plan.order.tolist() == [0] and plan.row_sizes.tolist() == [1]
    assert plan.pad_tokens == 4089 and plan.fill == pytest.approx(7 / 4096)


def test_many_tiny_samples_fill_rows_completely():
    plan = pack(np.ones(10_000, dtype=np.int64), 4096)
    assert plan.row_sizes.tolist() == [4096, 4096, 1808]
    assert np.array_equal(plan.order, np.arange(10_000))
    assert_valid(plan, np.ones(10_000), 4096)


def test_capacity_one():
    plan = pack([1, 1, 1], 1)
    assert plan.row_sizes.tolist() == [1, 1, 1] and plan.fill == 1.0


@pytest.mark.parametrize(
    "lengths, capacity, message",
    [
        ([10, 0, 3], 16, "sample 1 has length 0"),
        ([10, 3, -2], 16, "sample 2 has length -2"),
        ([10, 17, 3, 40], 16, "sample 1 has length 17 and exceeds the row capacity 16 (2 such"),
        ([1.5, 2.0], 16, "integers"),
        ([[1, 2]], 16, "one-dimensional"),
        ([1, 2], 0, "capacity"),
        ([1, 2], True, "capacity"),
        ([1, 2], 4.0, "capacity"),
    ],
)
def test_bad_input_is_rejected_by_name(lengths, capacity, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        pack(lengths, capacity)


def test_matches_textbook_best_fit_and_never_loses_to_first_fit():
    """Random small inputs (fixed seed): the bucketed algorithm gives exactly the row loads of
    item-by-item BFD, so the grouping shortcut changes nothing. No theorem orders BFD and FFD in
    general, but on these 2,000 inputs (and 300,000 more tried while writing this) BFD never
    needs more rows than FFD; the next test shows an input where it needs fewer."""
    rng = np.random.default_rng(12345)
    for _ in range(2000):
        capacity = int(rng.integers(1, 48))
        n = int(rng.integers(0, 24))
        low = max(1, capacity // 8)
        lengths = rng.integers(low, max(low, capacity // 2 + 1) + 1, n).clip(1, capacity)
        plan = pack(lengths, capacity)
        assert_valid(plan, lengths, capacity)
        assert sorted(plan.row_tokens.tolist()) == naive_best_fit_decreasing(lengths.tolist(), capacity)
        assert plan.rows <= naive_first_fit_decreasing(lengths.tolist(), capacity)
        assert plan.rows >= -(-int(lengths.sum()) // capacity)  # the volume bound


def test_best_fit_plans_are_the_ones_earlier_versions_made():
    """The rows a packed run writes never change from one version to the next (a merge of shards made by two
    versions, a resumed run): the plans of realistic samples, all at once, at another capacity and window by
    window, hashed, are those of the Python dealer the C one replaced (`_native.best_fit_rows`)."""
    import hashlib

    lengths = realistic_sft_lengths(30000, capacity=4096)
    digest = hashlib.sha256()
    for plan in [pack(lengths, 4096), pack(np.minimum(lengths[:777], 1024), 1024)] + \
            [plan for _, plan in window_plans(np.concatenate([lengths] * 40), "best-fit", 4096)]:
        digest.update(plan.order.astype("<i8").tobytes())
        digest.update(plan.row_sizes.astype("<i8").tobytes())
    assert digest.hexdigest() == "9fb0e1ea1cc008e9906ff8b01f12097f0a0eb0b2642a4105946232057a70e8c8"


def test_best_fit_beats_first_fit_where_it_should():
    # FFD puts 5 in the first row that fits (17's, free 7), stranding 3 in a third row;
    # BFD puts it where it fits tightest (11+8's, free 5) and 4 + 3 then close 17's row.
    lengths = [17, 11, 8, 5, 4, 3]
    assert naive_first_fit_decreasing(lengths, 24) == 3
    plan = pack(lengths, 24)
    assert plan.rows == 2 and plan.fill == 1.0


def test_realistic_mix_fills_rows_at_4096():
    lengths = realistic_sft_lengths(100_000)
    assert 300 < np.median(lengths) < 600 and 3000 < np.percentile(lengths, 99) <= 4096
    plan = pack(lengths, 4096)
    assert_valid(plan, lengths, 4096)
    assert plan.fill >= 0.99
    # The threshold means something: packing in input order wastes far more.
    assert lengths.sum() / (next_fit_in_order(lengths, 4096) * 4096) < 0.9


def test_sequence_layout_appends_one_pad_sequence_to_rows_not_full():
    lengths = [6, 4, 9, 3, 10]
    plan = pack(lengths, 10)
    # Longest first: 10 fills a row, 9 opens one (free 1), 6 opens one (free 4), 4 -> it, 3 opens one.
    assert [r.tolist() for r in plan] == [[0, 1], [2], [3], [4]]
    seq, per_doc = plan.sequence_layout(lengths)
    assert seq.tolist() == [6, 4, 9, 1, 3, 7, 10]
    assert per_doc.tolist() == [2, 2, 2, 1]


def test_packed_rows_read_back_through_megatron_core(tmp_path):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from qwen_data.formats.indexed import IndexedDatasetWriter

    capacity = 512
    lengths = realistic_sft_lengths(300, capacity=capacity, seed=7)
    samples = [np.full(length, i + 1, dtype=np.int32) for i, length in enumerate(lengths)]
    plan = pack(lengths, capacity)
    rows = []
    for members, load in zip(plan, plan.row_tokens):
        rows += [samples[i] for i in members] + [np.full(capacity - load, PAD_ID, dtype=np.int32)]
    seq, per_doc = plan.sequence_layout(lengths)

    prefix = str(tmp_path / "packed")
    writer = IndexedDatasetWriter(prefix + ".bin", prefix + ".idx", np.int32)
    writer.add_batch(np.concatenate(rows), seq, per_doc)
    writer.finalize()

    dataset = IndexedDataset(prefix)
    documents = dataset.document_indices
    assert len(documents) == plan.rows + 1
    for row, members in enumerate(plan):
        first, end = documents[row], documents[row + 1]
        got = [dataset[k] for k in range(first, end)]
        assert sum(len(g) for g in got) == capacity
        for k, i in enumerate(members):
            assert np.array_equal(got[k], samples[i])
        if end - first > len(members):
            assert end - first == len(members) + 1 and (got[-1] == PAD_ID).all()


def test_sequence_layout_refuses_other_lengths():
    plan = pack([6, 4, 9, 3, 10], 10)
    with pytest.raises(ValueError, match="not the lengths"):
        plan.sequence_layout([6, 4, 9, 3])
    with pytest.raises(ValueError, match="not the lengths"):
        plan.sequence_layout([6, 4, 9, 3, 9])


def test_next_fit_keeps_input_order_and_opens_a_row_when_the_next_sample_does_not_fit():
    plan = next_fit([3, 4, 2, 5, 1, 6, 6], 6)
    assert [row.tolist() for row in plan] == [[0], [1, 2], [3, 4], [5], [6]]
    assert plan.row_tokens.tolist() == [3, 6, 6, 6, 6]
    rng = np.random.default_rng(3)
    lengths = rng.integers(1, 100, 5000)
    plan = next_fit(lengths, 100)
    assert plan.order.tolist() == list(range(5000))
    # No row could have taken the first sample of the next one.
    firsts = plan.row_starts[1:-1]
    assert (plan.row_tokens[:-1] + lengths[firsts] > 100).all()
    assert pack(lengths, 100).rows < plan.rows  # what best fit is for
    assert next_fit([], 8).rows == 0
    with pytest.raises(ValueError, match="exceeds the row capacity"):
        next_fit([3, 9], 8)


def test_one_per_row():
    plan = one_per_row([3, 8, 1], 8)
    assert [row.tolist() for row in plan] == [[0], [1], [2]]
    assert plan.pad_tokens == 12


# -- windows: rows written as the samples come --------------------------------------------------------
@pytest.mark.parametrize("method", ["best-fit", "next-fit", None])
def test_windows_fed_in_any_pieces_give_the_windows_of_all_samples_at_once(monkeypatch, method):
    """A run feeds `SampleWindows` chunk by chunk; a merge lays out all its shards' samples at once
    (`windows`): the windows, their plans and so the rows must be the same whatever the pieces, and
    each window says where its samples begin among all the samples' tokens (where the row writer reads
    them from the staged files) with their hashes."""
    monkeypatch.setattr(packing, "PACK_WINDOW", 5000)
    lengths = realistic_sft_lengths(400, capacity=1024, seed=3)
    ids = np.arange(lengths.sum(), dtype=np.int32)
    mask = (ids % 3 == 0).astype(np.uint8)
    hashes = piece_hashes(ids, lengths), piece_hashes(mask, lengths)
    at_once = list(window_plans(lengths, method, 1024))
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, len(lengths)), 40, replace=False))
    stream, fed = SampleWindows(method, 1024), []
    for a, b in zip([0, *cuts], [*cuts, len(lengths)]):
        fed += stream.add(lengths[a:b], (hashes[0][a:b], hashes[1][a:b]))
    fed += stream.close()
    def rows(plans):  # every row's samples, numbered over all samples
        out, first = [], 0
        for plan in plans:
            out += [tuple((row + first).tolist()) for row in plan]
            first += len(plan.order)
        return out

    assert rows(plan for *_, plan, _ in fed) == rows(plan for _, plan in at_once)
    assert len(at_once) > 3 if method == "best-fit" else len(fed) > 3  # several windows
    at = sample = 0
    for first, w_lengths, plan, w_hashes in fed:  # each window's samples where they begin, and their hashes
        n = len(plan.order)
        assert first == at and np.array_equal(w_lengths, lengths[sample:sample + n])
        assert np.array_equal(w_hashes, np.concatenate([piece_hashes(ids[at:at + plan.tokens], w_lengths),
                                                        piece_hashes(mask[at:at + plan.tokens], w_lengths)], axis=1))
        at, sample = at + plan.tokens, sample + n
    assert at == len(ids) and sample == len(lengths)
    if method == "best-fit":  # each window the fewest samples holding PACK_WINDOW tokens, the last what is left
        assert all(lengths.sum() >= 5000 and lengths[:-1].sum() < 5000 for lengths, _ in at_once[:-1])
    else:  # rows as packing all samples at once
        assert rows([(PACKINGS[method] if method else one_per_row)(lengths, 1024)]) == rows(p for _, p in at_once)


def test_best_fit_in_windows_fills_realistic_rows_at_4096():
    """The fill of best fit window by window, at the real window size, over several windows."""
    lengths = realistic_sft_lengths(100_000, capacity=4096, seed=1)
    plans = [plan for _, plan in window_plans(lengths, "best-fit", 4096)]
    assert len(plans) >= 4
    fill = sum(p.tokens for p in plans) / (sum(p.rows for p in plans) * 4096)
    assert fill >= 0.995, fill


def test_padded_rows_hold_each_rows_samples_in_order_then_padding():
    lengths = np.array([3, 5, 2, 4])
    ids = np.arange(1, 15, dtype=np.int32)
    mask = np.ones(14, np.uint8)
    plan = pack(lengths, 8)
    rows_ids, rows_mask = padded_rows(ids, mask, lengths, plan, PAD_ID)
    starts = np.cumsum(lengths) - lengths
    for r, row in enumerate(plan):
        expected = np.concatenate([ids[starts[s]:starts[s] + lengths[s]] for s in row])
        got = rows_ids[r * 8:(r + 1) * 8]
        assert np.array_equal(got[:len(expected)], expected) and (got[len(expected):] == PAD_ID).all()
        assert rows_mask[r * 8:(r + 1) * 8].sum() == len(expected)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16])
@pytest.mark.parametrize("method", ["best-fit", "next-fit", None])
def test_rows_are_hashed_from_their_samples_hashes_as_from_their_bytes(method, dtype):
    """A run hashes the rows it lays out from its samples' own hashes (`rows_digests`), never reading
    the rows: the hashes must be those of the rows' bytes, padding included, in any packing."""
    from qwen_data.formats.digest import digest_of, repeated_hashes
    from qwen_data.formats.packing import rows_digests

    lengths = np.append(realistic_sft_lengths(300, capacity=512, seed=7), 512)  # one row full, without padding
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 60000, int(lengths.sum())).astype(dtype)
    mask = rng.integers(0, 2, int(lengths.sum())).astype(np.uint8)
    plan = (PACKINGS[method] if method else one_per_row)(lengths, 512)
    assert plan.pad_tokens > 0 and (plan.row_tokens == 512).any()  # padded rows, and a full one
    hashes = np.concatenate([piece_hashes(ids, lengths), piece_hashes(mask, lengths)], axis=1)
    pad = PAD_ID if dtype is np.int32 else 65000  # (a small vocabulary's .bin is uint16)
    pads = repeated_hashes(np.array([pad], dtype).tobytes(), 512)
    rows_ids, rows_mask = padded_rows(ids, mask, lengths, plan, pad)
    assert rows_digests(lengths, plan, hashes, np.dtype(dtype).itemsize, pads) == (digest_of(rows_ids),
                                                                                   digest_of(rows_mask))
