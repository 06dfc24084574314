"""`qwen-data verify` on prefixes written by the real CLIs: it passes on them, and each kind of damage
(to the data, the index or the manifest) makes it exit 1 with a problem naming the cause."""

import errno
import json
import os
from pathlib import Path

import numpy as np
import pytest
from _helpers import copy_prefix, data_fingerprint, manifest

from qwen_data.blend.build import BlendError
from qwen_data.blend.weights import weighed_blend
from qwen_data.cli import EXAMPLES, main
from qwen_data.formats.indexed import read_index
from qwen_data.tools.verify import verify as verify_prefix

EOD, PAD = 151643, 151654
SEQ = 256
CHATS = os.path.join(EXAMPLES, "chats.jsonl")
corrupts = pytest.mark.corrupts_outputs


@pytest.fixture(scope="module")
def prefixes(tmp_path_factory):
    d = tmp_path_factory.mktemp("verify")
    run = {"web": ["pretrain"], "unpacked": ["sft", CHATS], "packed": ["sft", CHATS, "--seq-length", SEQ, "--pack"],
           # a pad id above the tokenizer's ids, inside the embedding table: allowed, and only as padding
           "high_pad": ["sft", CHATS, "--seq-length", SEQ, "--pack", "--pad-id", 151900],
           "pai": ["sft", CHATS, "--seq-length", SEQ, "--layout", "pai"],
           "pai_packed": ["sft", CHATS, "--seq-length", SEQ, "--layout", "pai", "--pack"]}
    out = {}
    for name, args in run.items():
        out[name] = str(d / name)
        assert main([args[0], "--quiet", "--workers", "1", *map(str, args[1:]), "-o", out[name]]) == 0
    return out


def verify(capsys, *prefixes):
    rc = main(["verify", *prefixes])
    return rc, capsys.readouterr().out


def problems(capsys, prefix):
    """The problem lines `qwen-data verify` prints, after checking it exits 1."""
    rc, out = verify(capsys, prefix)
    assert rc == 1, out
    return [line[4:] for line in out.splitlines() if line.startswith("  - ")]


def refingerprint(prefix):
    """Make the manifest's fingerprint the data's again, so that only the other checks can object."""
    m = manifest(prefix)
    m.update(data_fingerprint(prefix))
    write(prefix, m)


def write(prefix, m):
    with open(prefix + ".json", "w", encoding="utf-8") as f:
        json.dump(m, f)


def test_passes_on_what_the_clis_write(prefixes, capsys):
    rc, out = verify(capsys, *prefixes.values())
    assert rc == 0, out
    for prefix in prefixes.values():
        m = manifest(prefix)
        assert f"{prefix}: ok ({m['documents']:,} documents, {m['tokens']:,} tokens)" in out
    # the fixtures hold what the checks are about: pad rows, and a pad id above the vocabulary
    for name in ("packed", "high_pad"):
        m = manifest(prefixes[name])
        ids = np.fromfile(prefixes[name] + ".bin", np.int32).reshape(-1, SEQ)
        assert m["sft"]["pad_tokens"] > 0 and (ids[:, -1] == m["pad_id"]).any()
    assert manifest(prefixes["high_pad"])["pad_id"] >= manifest(prefixes["high_pad"])["tokenizer"]["vocab_size"]


def test_index_reader_agrees_with_megatron_core(prefixes):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    for prefix in (prefixes["web"], prefixes["packed"], prefixes["packed"] + ".lossmask"):
        ours, theirs = read_index(prefix + ".idx"), IndexedDataset(prefix).index
        assert ours.dtype == theirs.dtype
        assert np.array_equal(ours.lengths, theirs.sequence_lengths)
        assert np.array_equal(ours.pointers, theirs.sequence_pointers)
        assert np.array_equal(ours.document_indices, theirs.document_indices)


@corrupts
def test_flipped_byte_in_bin_only_the_fingerprint_sees(prefixes, tmp_path, capsys):
    prefix = copy_prefix(prefixes["web"], str(tmp_path / "web"))
    ids = np.fromfile(prefix + ".bin", np.int32)
    ends = set(np.cumsum(read_index(prefix + ".idx").lengths) - 1)
    k = next(i for i, t in enumerate(ids) if i not in ends and (t ^ 1) < 150000)  # still an ordinary id
    with open(prefix + ".bin", "r+b") as f:
        f.seek(4 * k)
        f.write(bytes([int(ids[k]) & 0xFF ^ 1]))
    found = problems(capsys, prefix)
    assert len(found) == 1 and "fingerprint" in found[0] and f"{prefix}.bin no longer hashes" in found[0]


@corrupts
def test_flipped_byte_in_loss_mask(prefixes, tmp_path, capsys):
    prefix = copy_prefix(prefixes["unpacked"], str(tmp_path / "chat"))
    mask = np.fromfile(prefix + ".lossmask.bin", np.uint8)
    mask[int(np.argmax(mask == 1))] = 0  # a trained token untrained: still a valid mask
    mask.tofile(prefix + ".lossmask.bin")
    found = problems(capsys, prefix)
    assert any("fingerprint" in p and f"{prefix}.lossmask.bin no longer hashes" in p for p in found)
    assert any("sft.trained_tokens" in p for p in found)


@corrupts
@pytest.mark.parametrize("name", ["web", "packed"])
def test_truncated_bin(prefixes, tmp_path, capsys, name):
    prefix = copy_prefix(prefixes[name], str(tmp_path / name))
    size = os.path.getsize(prefix + ".bin")
    os.truncate(prefix + ".bin", size - 4)
    found = problems(capsys, prefix)
    assert any(p.startswith(f"{prefix}.bin: {size - 4} bytes") and "truncated" in p for p in found)


@corrupts
def test_swapped_idx(prefixes, tmp_path, capsys):
    prefix = copy_prefix(prefixes["unpacked"], str(tmp_path / "chat"))
    copy_prefix(prefixes["packed"], str(tmp_path / "packed"))
    os.replace(str(tmp_path / "packed.idx"), prefix + ".idx")
    found = problems(capsys, prefix)
    assert any(p.startswith(f"{prefix}.idx: ") and "the manifest" in p for p in found)
    assert any(p.startswith(f"{prefix}.bin: ") and "describes" in p for p in found)


@corrupts
def test_swapped_idx_of_the_same_size(prefixes, tmp_path, capsys):
    """Same counts, other lengths: only the index contents tell."""
    prefix = copy_prefix(prefixes["web"], str(tmp_path / "web"))
    lengths = read_index(prefix + ".idx").lengths
    from qwen_data.formats.indexed import IndexedDatasetWriter

    ids = np.fromfile(prefix + ".bin", np.int32)
    other = IndexedDatasetWriter(str(tmp_path / "other.bin"), str(tmp_path / "other.idx"), np.int32)
    shifted = np.array(lengths, np.int64)
    shifted[0], shifted[1] = shifted[0] + 1, shifted[1] - 1
    other.add_batch(ids, shifted)
    other.finalize()
    os.replace(str(tmp_path / "other.idx"), prefix + ".idx")
    found = problems(capsys, prefix)
    assert any("documents not ending with the eod id 151643" in p and "document 0 " in p for p in found)
    assert any("fingerprint" in p for p in found)


@corrupts
@pytest.mark.parametrize("field, value, cause", [
    ("tokens", lambda m: m["tokens"] + 1, "tokens, but"),
    ("documents", lambda m: m["documents"] - 1, "documents, the manifest"),
    ("eod_id", lambda m: 151645, "documents not ending with the eod id 151645"),
    ("fingerprint", lambda m: "0" + m["fingerprint"][1:], "fingerprint 0"),
    ("dtype", lambda m: "uint16", "dtype"),
])
def test_edited_manifest(prefixes, tmp_path, capsys, field, value, cause):
    prefix = copy_prefix(prefixes["web"], str(tmp_path / "web"), edit=lambda m: m.update({field: value(m)}))
    found = problems(capsys, prefix)
    assert any(cause in p for p in found), found


@corrupts
def test_edited_sft_manifest(prefixes, tmp_path, capsys):
    prefix = copy_prefix(prefixes["packed"], str(tmp_path / "packed"),
                         edit=lambda m: m["sft"].update(seq_length=SEQ // 2))
    assert any(f"packed row 0 holds {SEQ} tokens, not sft.seq_length {SEQ // 2}" in p for p in problems(capsys, prefix))


@corrupts
def test_last_token_not_eod(prefixes, tmp_path, capsys):
    prefix = copy_prefix(prefixes["web"], str(tmp_path / "web"))
    ids = np.fromfile(prefix + ".bin", np.int32)
    end = int(read_index(prefix + ".idx").lengths[:3].sum()) - 1  # document 2's eod
    assert ids[end] == EOD
    ids[end] = 13
    ids.tofile(prefix + ".bin")
    refingerprint(prefix)
    assert problems(capsys, prefix) == [
        f"{prefix}.bin: documents not ending with the eod id {EOD}, 1 in all: document 2 (last id 13)"]


@corrupts
def test_trained_pad(prefixes, tmp_path, capsys):
    prefix = copy_prefix(prefixes["packed"], str(tmp_path / "packed"))
    ids = np.fromfile(prefix + ".bin", np.int32)
    mask = np.fromfile(prefix + ".lossmask.bin", np.uint8)
    k = int(np.flatnonzero(ids == PAD)[0])
    mask[k] = 1
    mask.tofile(prefix + ".lossmask.bin")
    m = manifest(prefix)
    m["sft"]["trained_tokens"] += 1
    write(prefix, m)
    refingerprint(prefix)
    assert problems(capsys, prefix) == [
        f"{prefix}.lossmask.bin: pad positions (id {PAD}) trained (mask 1), 1 in all: token {k} (id {PAD})"]


@corrupts
@pytest.mark.parametrize("name, value, cause", [
    ("packed", PAD, "packed rows with pad ids outside one trailing pad-only sequence"),  # pad inside a sample
    ("unpacked", PAD, "pad ids 151654 in unpacked data"),
    ("unpacked", 151665, "ids outside the vocabulary (0..151664), 1 in all: token 1 (id 151665)"),
    ("high_pad", 151899, "ids outside the vocabulary (0..151664) other than the pad id 151900"),
])
def test_bad_ids(prefixes, tmp_path, capsys, name, value, cause):
    prefix = copy_prefix(prefixes[name], str(tmp_path / name))
    ids = np.fromfile(prefix + ".bin", np.int32)
    ids[1] = value
    ids.tofile(prefix + ".bin")
    refingerprint(prefix)
    assert any(cause in p for p in problems(capsys, prefix))


@corrupts
@pytest.mark.parametrize("damage, cause", [
    (lambda p: os.remove(p + ".json"), "no manifest"),
    (lambda p: open(p + ".json", "w").write("{not json"), "unreadable manifest"),
    (lambda p: open(p + ".json", "w").write("[1, 2]"), "unreadable manifest"),
    (lambda p: os.remove(p + ".lossmask.bin"), ".lossmask.bin: missing"),
    (lambda p: os.truncate(p + ".idx", 20), "not a Megatron MMIDIDX index"),
    (lambda p: os.truncate(p + ".idx", os.path.getsize(p + ".idx") - 8), "truncated or corrupt"),
])
def test_missing_or_unreadable_files_are_problems(prefixes, tmp_path, capsys, damage, cause):
    prefix = copy_prefix(prefixes["unpacked"], str(tmp_path / "chat"))
    damage(prefix)
    assert any(cause in p for p in problems(capsys, prefix))


@corrupts
def test_blend_reads_the_index_with_the_reader(prefixes, tmp_path):
    prefix = copy_prefix(prefixes["web"], str(tmp_path / "web"))
    os.truncate(prefix + ".idx", os.path.getsize(prefix + ".idx") - 8)
    with pytest.raises(BlendError, match="web.idx: .* truncated or corrupt"):
        weighed_blend([prefix])


@corrupts
def test_streams_in_blocks(prefixes, tmp_path, monkeypatch, capsys):
    """Blocks far smaller than the files (rows, documents and eods across block edges) change nothing."""
    import qwen_data.formats.layouts as layouts
    import qwen_data.tools.verify as v

    monkeypatch.setattr(v, "BLOCK_BYTES", 64)
    monkeypatch.setattr(layouts, "CHUNK", 3)
    for prefix in prefixes.values():
        assert v.verify(prefix) == []
    prefix = copy_prefix(prefixes["web"], str(tmp_path / "web"))
    ids = np.fromfile(prefix + ".bin", np.int32)
    ends = np.cumsum(read_index(prefix + ".idx").lengths) - 1
    ids[ends[[5, 17]]] = 13
    ids.tofile(prefix + ".bin")
    refingerprint(prefix)
    assert v.verify(prefix) == [
        f"{prefix}.bin: documents not ending with the eod id {EOD}, 2 in all: document 5 (last id 13), "
        "document 17 (last id 13)"]


def pai_rows(prefixes, tmp_path, name):
    """A copy of a pai-layout prefix and its rows, writable in place."""
    prefix = copy_prefix(prefixes[name], str(tmp_path / name))
    return prefix, np.memmap(prefix + ".bin", np.int32, "r+").reshape(-1, 2 * SEQ)


def first_trained(rows):
    """(row, position) of the first trained label."""
    r, i = np.argwhere(rows[:, SEQ:] != -100)[0]
    return int(r), int(i)


def break_pad_inside(rows):
    r, i = first_trained(rows)
    rows[r, i] = 151665


def break_vocab(rows):
    rows[0, 1] = 151700


def break_pad_run(rows):
    r = int(np.argmax((rows[:, :SEQ] == 151665).any(axis=1)))
    rows[r, SEQ - 1] = 0


def drop_end_marks(rows):
    rows[0, :SEQ] = np.where(rows[0, :SEQ] < 0, -1 - rows[0, :SEQ], rows[0, :SEQ])


def mark_mid_sample(rows):
    rows[0, 3] = -1 - rows[0, 3]


def wrong_label(rows):
    r, i = first_trained(rows)
    rows[r, SEQ + i] = 13


def label_across_samples(rows):
    """The label at a sample's last position set to the next sample's first id."""
    r = int(np.argmax((rows[:, :SEQ] < 0).sum(axis=1) > 1))
    end = int(np.flatnonzero(rows[r, :SEQ] < 0)[0])
    rows[r, SEQ + end] = rows[r, end + 1]


def untrain_a_sample(rows):
    r, _ = first_trained(rows)
    end = int(np.flatnonzero(rows[r, :SEQ] < 0)[0])
    rows[r, SEQ: SEQ + end + 1] = -100


@corrupts
@pytest.mark.parametrize("name, damage, cause", [
    ("pai", break_vocab, "pai rows with ids outside the vocabulary (0..151664) or the pad id 151665 inside a sample, "
                         "1 in all: row 0 (id 151700)"),
    ("pai_packed", break_pad_inside, "or the pad id 151665 inside a sample"),
    ("pai_packed", break_pad_run, "pai rows whose ids after the last sample are not all the pad id 151665, 1 in all"),
    ("pai", drop_end_marks, "pai rows with no sample (no id stored as -1 - id), 1 in all: row 0"),
    ("pai", mark_mid_sample, "unpacked pai rows holding more than one sample, 1 in all: row 0 (samples 2)"),
    ("pai_packed", wrong_label, "pai rows with a label neither -100 nor the next id of the same sample, 1 in all"),
    ("pai_packed", label_across_samples, "pai rows with a label neither -100 nor the next id of the same sample"),
    ("pai_packed", untrain_a_sample, "pai rows with a sample whose every label is -100, 1 in all"),
])
def test_pai_rows_damaged(prefixes, tmp_path, capsys, name, damage, cause):
    prefix, rows = pai_rows(prefixes, tmp_path, name)
    damage(rows)
    rows.flush()
    refingerprint(prefix)
    found = problems(capsys, prefix)
    assert any(cause in p for p in found), found


@corrupts
def test_pai_counts_and_row_width(prefixes, tmp_path, capsys):
    prefix = copy_prefix(prefixes["pai_packed"], str(tmp_path / "counts"), edit=lambda m: m["sft"].update(samples=1))
    assert problems(capsys, prefix) == [f"{prefix}.json: sft.samples is 1, the data holds "
                                        f"{manifest(prefixes['pai_packed'])['sft']['samples']}"]
    prefix = copy_prefix(prefixes["pai"], str(tmp_path / "width"), edit=lambda m: m["sft"].update(seq_length=SEQ // 2))
    assert f"{prefix}.idx: row 0 holds {2 * SEQ} values, not 2 x sft.seq_length = {SEQ}" in problems(capsys, prefix)


# -- merge checks what it copies -------------------------------------------------------------------
def _flip(path, position):
    with open(path, "r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 1]))


def _same_counts_other_lengths(prefix):
    """Sequences 0 and 1 given other lengths, the pointers moved to match: a well-formed index."""
    index = read_index(prefix + ".idx")
    lengths, pointers = np.array(index.lengths), np.array(index.pointers)
    lengths[0], lengths[1] = lengths[0] + 1, lengths[1] - 1
    pointers[1] += index.dtype.itemsize
    with open(prefix + ".idx", "r+b") as f:
        f.seek(int(index.lengths.offset))
        f.write(lengths.tobytes())
        f.write(pointers.tobytes())


@corrupts
@pytest.mark.parametrize("name, damage, cause", [
    ("web", lambda p: _flip(p + ".idx", os.path.getsize(p + ".idx") - 3), "document indices run from 0 to"),
    ("web", _same_counts_other_lengths, "hash to fingerprint"),
    ("web", lambda p: os.truncate(p + ".bin", os.path.getsize(p + ".bin") - 4), "truncated or extended"),
    ("web", lambda p: os.truncate(p + ".idx", os.path.getsize(p + ".idx") - 8), "truncated or corrupt"),
    ("unpacked", lambda p: _same_counts_other_lengths(p + ".lossmask"), "hash to fingerprint"),
    ("unpacked", lambda p: os.truncate(p + ".lossmask.bin", os.path.getsize(p + ".lossmask.bin") - 1),
     "truncated or extended"),
], ids=["idx", "idx-well-formed", "bin-truncated", "idx-truncated", "lossmask-idx-well-formed", "lossmask-truncated"])
def test_merge_refuses_a_changed_part_by_name(prefixes, tmp_path, capsys, name, damage, cause):
    """A part whose files are not what its manifest says is refused, naming it and the cause; the
    merged output is not written (a fresh fingerprint would vouch for the damaged data)."""
    whole = copy_prefix(prefixes[name], str(tmp_path / "whole"))
    part = copy_prefix(prefixes[name], str(tmp_path / "part"))
    damage(part)
    out = str(tmp_path / "m")
    assert main(["merge", "--quiet", whole, part, "-o", out]) == 2
    err = capsys.readouterr().err
    assert f"{part} was changed or damaged after it was made" in err and f"verify {part}" in err, err
    assert err.count(part) >= 3 and cause in err, err  # the file named, what is wrong, what to do
    assert not any(os.path.exists(out + suffix) for suffix in (".json", ".bin", ".idx", ".lossmask.bin"))
    assert main(["merge", "--quiet", whole, whole, "-o", out]) == 0  # undamaged, it merges


@corrupts
@pytest.mark.parametrize("name, channel, position", [("web", "", 4 * 7), ("unpacked", "", 4 * 3),
                                                     ("unpacked", ".lossmask", 5)],
                         ids=["bin", "sft-bin", "lossmask-bin"])
def test_a_part_whose_bin_changed_merges_into_an_output_verify_refuses(prefixes, tmp_path, name, channel, position):
    """A merge reads no part's .bin: the output's hash is the parts' recorded ones joined, so the
    changed bytes are never vouched for, and `verify` of the output names its file."""
    whole = copy_prefix(prefixes[name], str(tmp_path / "whole"))
    part = copy_prefix(prefixes[name], str(tmp_path / "part"))
    _flip(part + channel + ".bin", position)
    out = str(tmp_path / "m")
    assert main(["merge", "--quiet", whole, part, "-o", out]) == 0
    found = verify_prefix(out)
    assert any(f"{out}{channel}.bin no longer hashes" in p for p in found), found


@pytest.mark.parametrize("name", ["web", "unpacked"])
def test_a_merge_starts_from_the_parts_joined_before_it_only_where_they_are_its_first(prefixes, tmp_path, name):
    """`merge.Head` (the Ray executor's shards joined as they end): a merge takes the file of its first parts,
    channel by channel, and copies only the others, giving the whole run's bytes; a head holding other parts
    (not the first, or not in order) is set aside and every part copied, with the same result. A head that
    consumes its parts (Ray's) removes each .bin once copied and recorded (by `settle`, the removals run beside
    the copies), stays where it was (linked) for `restore` to put them back, and puts them back itself where it is
    set aside."""
    import shutil

    from qwen_data.formats.layouts import layout_of
    from qwen_data.formats.manifest import Manifest
    from qwen_data.run.merge import Head, merge, restore

    args = {"web": ["pretrain"], "unpacked": ["sft", CHATS]}[name]
    made = tmp_path / "parts"
    made.mkdir()
    for k in range(4):
        shard = str(made / f"s{k}")
        assert main([args[0], "--quiet", "--workers", "1", *args[1:], "--shard", f"{k}/4", "-o", shard]) == 0
    whole = prefixes[name]
    suffixes = [".bin", ".idx"] + ([".lossmask.bin", ".lossmask.idx"] if name == "unpacked" else [])
    cases = [("first", [0, 1, 2], False), ("all", [0, 1, 2, 3], False), ("not_first", [1, 2], False),
             ("swapped", [1, 0], False), ("consumed", [0, 1, 2], True), ("consumed_swapped", [1, 0], True)]
    for label, held, consume in cases:
        folder = tmp_path / f"{label}_parts"
        shutil.copytree(made, folder)
        shards = [str(folder / f"s{k}") for k in range(4)]
        channels = [[channel for channel, _ in layout_of(m).channels(shard, m.dtype)]
                    for shard, m in ((shard, Manifest.read(shard)) for shard in shards)]
        originals = {c: Path(c + ".bin").read_bytes() for part in channels for c in part}
        heads = [Head(str(tmp_path / f"{label}.{c}.head"), consume) for c in range(len(channels[0]))]
        for k in held:
            for c, head in enumerate(heads):
                head.add(channels[k][c])
        out = str(tmp_path / label)
        merge(shards, out, quiet=True, heads=heads)
        for head in heads:
            head.settle()
        for suffix in suffixes:
            with open(out + suffix, "rb") as f, open(whole + suffix, "rb") as expected:
                assert f.read() == expected.read(), f"{label}: {out}{suffix}"
        assert manifest(out)["fingerprint"] == manifest(whole)["fingerprint"], label
        assert verify_prefix(out) == []
        if label == "consumed":  # the parts held gone, the heads left for `restore`, which puts them back
            assert not any(os.path.exists(channels[k][c] + ".bin") for k in held for c in range(len(heads)))
            assert all(restore(head.path) == len(held) for head in heads)
        else:
            assert not any(os.path.exists(head.path) for head in heads), f"{label}: a head was left behind"
        assert {c: Path(c + ".bin").read_bytes() for c in originals} == originals, f"{label}: parts not put back"


@pytest.mark.parametrize("name", ["web", "unpacked"])
def test_merge_joins_many_shards_with_or_without_copy_file_range(prefixes, tmp_path, monkeypatch, name):
    """More shards than this host has cores, copied in the kernel or (a file system without
    copy_file_range) by reads and writes: the bytes and the fingerprint of the whole run (its .bin's
    hash the shards' joined)."""
    args = {"web": ["pretrain"], "unpacked": ["sft", CHATS]}[name]
    shards = [str(tmp_path / f"s{k}") for k in range(5)]
    for k, shard in enumerate(shards):
        assert main([args[0], "--quiet", "--workers", "1", *args[1:], "--shard", f"{k}/5", "--chunk-mb", "0.0005",
                     "-o", shard]) == 0
    assert len({manifest(shard)["fingerprint"] for shard in shards}) == 5, "the shards should differ"
    whole = prefixes[name]
    suffixes = [".bin", ".idx"] + ([".lossmask.bin", ".lossmask.idx"] if name == "unpacked" else [])
    for label, copy in (("kernel", os.copy_file_range), ("plain", None)):
        if copy is None:
            def copy(*args):
                raise OSError(errno.EXDEV, "Invalid cross-device link")
        monkeypatch.setattr(os, "copy_file_range", copy)
        out = str(tmp_path / label)
        assert main(["merge", "--quiet", *shards, "-o", out]) == 0
        for suffix in suffixes:
            with open(out + suffix, "rb") as f, open(whole + suffix, "rb") as expected:
                assert f.read() == expected.read(), f"{label}: {out}{suffix}"
        assert manifest(out)["fingerprint"] == manifest(whole)["fingerprint"], label
