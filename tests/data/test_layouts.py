"""Each layout reads back what it writes (`DataLayout.open`), and a loss mask is read only beside the
very index of its ids (`indexed.check_same_index`, the one check every reader and `verify` use).

Written here by the layouts' own writers from known samples, so the expected documents are the
samples themselves; no torch, no tokenizer.
"""

import json
import re

import numpy as np
import pytest

from _helpers import data_fingerprint, sft, write_jsonl
from qwen_data.formats import pai
from qwen_data.formats.digest import piece_hashes
from qwen_data.formats.indexed import IndexedDatasetWriter, IndexFormatError, MaskedWriter
from qwen_data.formats.layouts import DocumentLayout, MaskLayout, PackedMaskLayout, PaiLayout
from qwen_data.formats.outputs import AtomicOutputs
from qwen_data.formats.packing import next_fit, one_per_row
from qwen_data.run.merge import MergeError, merge
from qwen_data.tools.samples import Samples
from qwen_data.tools.verify import verify

S = 24  # seq_length
VOCAB = 1000
PAD = 999  # the mask layouts' pad id (no sample holds it)


def samples(seed=0, count=30):
    """(ids, loss mask) of samples 1..S tokens long."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(count):
        n = int(rng.integers(1, S + 1))
        out.append((rng.integers(0, PAD, n).astype(np.int32), rng.integers(0, 2, n).astype(np.uint8)))
    return out


def staged(path, items) -> MaskedWriter:
    """The samples as an unpacked run writes them (one per document), finalized."""
    w = MaskedWriter(MaskedWriter.files(path), np.int32, hashed=False)
    for ids, mask in items:
        w.add_batch(ids, mask, [len(ids)])
    w.finalize()
    return w


def laid_out(layout, prefix, items, plan, pad):
    """`items` staged, then written by `layout.rows` into the rows of `plan` from there, as a run
    places a window's rows (from the samples' hashes) and has them written (`write`)."""
    lengths = np.array([len(ids) for ids, _ in items])
    samples = staged(prefix + ".staged", items)
    hashes = np.concatenate([piece_hashes(np.concatenate([ids for ids, _ in items]), lengths),
                             piece_hashes(np.concatenate([mask for _, mask in items]), lengths)], axis=1)
    outputs = AtomicOutputs(MaskedWriter.files(prefix))
    rows = layout.rows(outputs, prefix, np.int32, pad)
    job, landed = rows.place((samples.ids.bin_path, samples.mask.bin_path), 0, lengths, plan, hashes)
    written = job.write()
    if landed is not None:
        landed(written)
    rows.close()
    outputs.commit(markers=[])


def rows_of(plan, items):
    """Each row's samples, in order."""
    return [[items[s] for s in plan.order[a:b]] for a, b in zip(plan.row_starts[:-1], plan.row_starts[1:])]


def equal(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        if e is None:
            assert g is None
        else:
            assert g.dtype == np.asarray(e).dtype and np.array_equal(g, e), (g, e)


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "read"])
def test_document_layout_reads_back_what_it_wrote(tmp_path, mmap):
    prefix = str(tmp_path / "web")
    docs = [ids for ids, _ in samples(1)]
    w = IndexedDatasetWriter(prefix + ".bin", prefix + ".idx", np.int32)
    for ids in docs:
        w.add_document(ids)
    w.finalize()
    documents = DocumentLayout().open(prefix, mmap=mmap)
    assert len(documents) == len(docs)
    for i, ids in enumerate(docs):
        equal(documents.document(i), (ids.astype(np.int64), None, np.array([len(ids)])))
    assert np.array_equal(documents.document_lengths, [len(ids) for ids in docs])
    with pytest.raises(IndexError, match=f"{prefix}: no document {len(docs)}"):
        documents.document(len(docs))


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "read"])
def test_mask_layout_reads_back_what_it_wrote(tmp_path, mmap):
    prefix = str(tmp_path / "chat")
    items = samples(2)
    staged(prefix, items)
    documents = MaskLayout(False, S).open(prefix, mmap=mmap)
    assert len(documents) == len(items)
    for i, (ids, mask) in enumerate(items):
        equal(documents.document(i), (ids.astype(np.int64), mask, np.array([len(ids)])))


@pytest.mark.parametrize("mmap", [True, False], ids=["mmap", "read"])
def test_packed_mask_layout_reads_back_its_rows(tmp_path, mmap):
    prefix, items = str(tmp_path / "packed"), samples(3)
    plan = next_fit(np.array([len(ids) for ids, _ in items]), S)
    laid_out(PackedMaskLayout(True, S), prefix, items, plan, PAD)
    documents = PackedMaskLayout(True, S).open(prefix, mmap=mmap)
    rows = rows_of(plan, items)
    assert len(documents) == len(rows) < len(items)
    padded = 0
    for r, row in enumerate(rows):
        fill = S - sum(len(ids) for ids, _ in row)
        padded += fill > 0
        ids = np.concatenate([ids for ids, _ in row] + [np.full(fill, PAD, np.int32)]).astype(np.int64)
        mask = np.concatenate([mask for _, mask in row] + [np.zeros(fill, np.uint8)])
        lengths = np.array([len(ids) for ids, _ in row] + ([fill] if fill else []))
        equal(documents.document(r), (ids, mask, lengths))
    assert padded and np.array_equal(documents.document_lengths, np.full(len(rows), S))


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_pai_layout_reads_back_its_samples(tmp_path, packed):
    """A pai row comes back decoded: its samples' ids, their mask (a sample's first token is never a
    target: the label before it is its own sample's end), the sample lengths, then the pad run's."""
    prefix, items, pad = str(tmp_path / "pai"), samples(4), pai.pad_id(VOCAB)
    lengths = np.array([len(ids) for ids, _ in items])
    plan = next_fit(lengths, S) if packed else one_per_row(lengths, S)
    layout = PaiLayout(packed, S)
    laid_out(layout, prefix, items, plan, pad)
    documents = layout.open(prefix)
    rows = rows_of(plan, items)
    assert len(documents) == len(rows) and (len(rows) < len(items)) == packed
    for r, row in enumerate(rows):
        fill = S - sum(len(ids) for ids, _ in row)
        ids = np.concatenate([ids for ids, _ in row] + [np.full(fill, pad, np.int32)]).astype(np.int64)
        mask = np.concatenate([np.concatenate([[0], mask[1:]]) for _, mask in row] + [np.zeros(fill)])
        lengths = np.array([len(ids) for ids, _ in row] + ([fill] if fill else []))
        equal(documents.document(r), (ids, mask.astype(np.uint8), lengths))
    assert np.array_equal(documents.document_lengths, np.full(len(rows), S))


# -- one index for the ids and their loss mask ------------------------------------------------------
def _regrouped(prefix, how):
    """The loss mask's index rewritten (its bytes kept, its .idx well formed): the sequences'
    lengths moved, one sequence fewer, or the sequences grouped into other documents."""
    mask = np.fromfile(prefix + ".lossmask.bin", np.uint8)
    index = MaskLayout(False, None).open(prefix).index
    lengths, per_document = np.array(index.lengths, np.int64), np.diff(index.document_indices)
    if how == "lengths":
        lengths[0], lengths[1] = lengths[0] + 1, lengths[1] - 1
    elif how == "count":  # the first document's first two sequences made one
        lengths = np.concatenate([[lengths[0] + lengths[1]], lengths[2:]])
        per_document[0] -= 1
    else:  # the second document's sequences given to the first
        per_document[0], per_document[1] = per_document[0] + per_document[1], 0
    w = IndexedDatasetWriter(prefix + ".lossmask.bin", prefix + ".lossmask.idx", np.uint8)
    w.add_batch(mask, lengths, per_document)
    w.finalize()


@pytest.mark.parametrize("how, differs", [("lengths", "sequence lengths differ from {ids} at entry 0"),
                                          ("count", "{fewer} sequence lengths, {ids} has {n}"),
                                          ("documents", "document indices differ from {ids} at entry 1")])
@pytest.mark.parametrize("layout", [MaskLayout(False, S), PackedMaskLayout(True, S)], ids=["unpacked", "packed"])
def test_a_mask_with_another_index_is_refused_naming_both(tmp_path, how, differs, layout):
    prefix = str(tmp_path / "chat")
    items = samples(5)
    if layout.packed:
        laid_out(layout, prefix, items, next_fit(np.array([len(ids) for ids, _ in items]), S), PAD)
    else:
        staged(prefix, items)
    n = layout.open(prefix).index.sequences
    _regrouped(prefix, how)
    with pytest.raises(IndexFormatError) as refused:
        layout.open(prefix)
    expected = f"{prefix}.lossmask.idx: " + differs.format(ids=f"{prefix}.idx", n=n, fewer=n - 1)
    assert expected in str(refused.value) and "not the same index" in str(refused.value)


@pytest.mark.corrupts_outputs
def test_every_reader_refuses_a_mask_with_another_index(tmp_path):
    """verify, the tools (`Samples`) and merge give the one check's sentence; merge even where the
    manifest's fingerprint vouches for the files (a writer that got it wrong)."""
    records = write_jsonl(tmp_path / "chats.jsonl", [{"instruction": f"say {w}", "output": f"{w} {w}"}
                                                     for w in ("one", "two", "three", "four")])
    prefix = sft([records], tmp_path / "chat")
    _regrouped(prefix, "documents")
    sentence = f"{prefix}.lossmask.idx: document indices differ from {prefix}.idx at entry 1: not the same index"
    with open(prefix + ".json", encoding="utf-8") as f:
        manifest = json.load(f)
    manifest.update(data_fingerprint(prefix))
    with open(prefix + ".json", "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    assert sentence in verify(prefix)
    with pytest.raises(IndexFormatError, match=re.escape(sentence)):
        Samples(prefix)
    with pytest.raises(MergeError, match=re.escape(sentence)):
        merge([prefix, prefix], str(tmp_path / "merged"), quiet=True)
