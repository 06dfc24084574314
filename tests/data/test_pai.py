"""`qwen-data sft --layout pai` against Pai-Megatron-Patch's own build_idxmap_sft_dataset.py.

Pai's script cannot run here (it needs transformers < 5 and its repository), so bench/pai.py ran it
on tests/fixtures/pai_alpaca.jsonl and recorded the sha256 of its files in tests/fixtures/pai_golden.json;
our output on the same records must hash the same. Its Qwen3Tokenizer pads with <|endoftext|>,
which qwen-data never pads with: there our bytes must equal Pai's once its pad id is put back in
the pad positions, and nowhere else.
"""

import hashlib
import json
import os

import numpy as np
import pytest

from _helpers import REPO_ROOT, manifest, qwen25_tokenizer_folder, sft, write_jsonl
from _oracles import oracle_dir
from qwen_data.formats import pai
from qwen_data.cli import main
from qwen_data.text.tokenizer import bundled_tokenizer_dir

DATA = REPO_ROOT / "tests" / "fixtures"
GOLDEN = json.loads((DATA / "pai_golden.json").read_text())
RECORDS = str(REPO_ROOT / GOLDEN["records"])
S = GOLDEN["seq_length"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    oracle_dir()  # the Qwen2.5 folder takes its template from shared/oracles
    return {"qwen3": bundled_tokenizer_dir(), "qwen2.5": qwen25_tokenizer_folder(tmp_path_factory.mktemp("q25"))}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("tokenizer", ["qwen2.5", "qwen3"])
@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_bytes_are_pai_scripts(tmp_path, folders, tokenizer, packed):
    cases = [c for c in GOLDEN["cases"] if c["tokenizer"] == tokenizer and c["packed"] == packed]
    assert cases
    prefix = sft([RECORDS], tmp_path / "pai", "--layout", "pai", "--seq-length", S, "--tokenizer", folders[tokenizer],
                 "--template", cases[0]["template"], *(["--pack", "--packing", "next-fit"] if packed else []))
    m = manifest(prefix)
    values = np.fromfile(prefix + ".bin", np.int32)
    for case in cases:
        assert m["rejects"]["count"] == case["left_out"]
        assert sha256(open(prefix + ".idx", "rb").read()) == case["idx_sha256"]
        rows = values.reshape(-1, 2 * S).copy()
        assert (rows[:, :S] == m["pad_id"]).any()  # the substitution below has something to act on
        rows[:, :S][rows[:, :S] == m["pad_id"]] = case["pai_pad_id"]
        assert sha256(rows.tobytes()) == case["bin_sha256"], case["pai_tokenizer_type"]
        # Only Pai's Qwen3Tokenizer pads with another id than ours.
        assert (case["pai_pad_id"] == m["pad_id"]) == (case["pai_tokenizer_type"] == "Qwen2Tokenizer")
    assert main(["verify", prefix]) == 0


def equivalent_mask_layout(tmp_path, records, *extra):
    """The mask layout with the settings --layout pai implies, and the pai layout itself."""
    rows = sft([records], tmp_path / "pai", "--layout", "pai", "--seq-length", S, *extra)
    mask = sft([records], tmp_path / "mask", "--seq-length", S, "--assistant-span", "turn", "--overlong", "truncate",
               "--input-separator", "", "--pad-id", manifest(rows)["pad_id"], *extra)
    return mask, rows


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
def test_rows_decode_to_the_mask_layouts_samples(tmp_path, packed):
    """Read with megatron-core's IndexedDataset, every row splits back into the samples, masks and
    padding the mask layout stores for the same records (its own contract is tested against HF)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    extra = ["--pack", "--packing", "next-fit"] if packed else []
    mask_prefix, pai_prefix = equivalent_mask_layout(tmp_path, RECORDS, *extra)
    ids, masks, rows = IndexedDataset(mask_prefix), IndexedDataset(mask_prefix + ".lossmask"), IndexedDataset(pai_prefix)
    assert len(rows) == len(rows.document_indices) - 1  # one sequence per document
    assert rows.index.dtype == np.int32 and set(rows.sequence_lengths.tolist()) == {2 * S}
    docs = ids.document_indices
    assert len(rows) == len(docs) - 1
    for d in range(len(rows)):
        tokens, mask, lengths = pai.split_row(rows[d], S)
        first, last = docs[d], docs[d + 1]
        want = np.concatenate([ids[i] for i in range(first, last)])
        want_mask = np.concatenate([masks[i] for i in range(first, last)])
        starts = np.cumsum(lengths) - lengths
        fill = S - len(want)
        want = np.concatenate([want, np.full(fill, manifest(pai_prefix)["pad_id"])])
        want_mask = np.concatenate([want_mask, np.zeros(fill, np.uint8)])
        want_mask[starts] = 0  # a sample's first token is never a target in a row of labels
        assert tokens.tolist() == want.tolist()
        assert mask.tolist() == want_mask.tolist()
        assert lengths.tolist() == ids.sequence_lengths[first:last].tolist() + ([fill] if fill else [])
    m, mm = manifest(pai_prefix), manifest(mask_prefix)
    assert m["sft"]["samples"] == mm["sft"]["samples"] and m["sft"]["sample_tokens"] == mm["sft"]["sample_tokens"]


def test_layout_defaults_and_overrides(tmp_path, capsys):
    records = write_jsonl(tmp_path / "r.jsonl", [
        {"instruction": "Name a colour.", "input": "Sky", "output": "Blue " * 40},
        {"instruction": "Say yes.", "output": "Yes."}])
    prefix = sft([records], tmp_path / "a", "--layout", "pai", "--seq-length", 64)
    s = manifest(prefix)["sft"]
    assert (s["layout"], s["overlong"], s["assistant_span"], s["input_separator"]) == ("pai", "truncate", "turn", "")
    assert s["truncated"] == 1 and manifest(prefix)["pad_id"] == 151665  # qwen2p5: 22 added tokens
    prefix = sft([records], tmp_path / "b", "--layout", "pai", "--seq-length", 64, "--overlong", "drop",
                 "--assistant-span", "im_end", "--input-separator", "\n", "--pad-id", 151654)
    m = manifest(prefix)
    s = m["sft"]
    assert (s["overlong"], s["assistant_span"], s["input_separator"], m["pad_id"]) == ("drop", "im_end", "\n", 151654)
    assert m["rejects"]["by_reason"] == {"too-long": 1}
    assert main(["verify", prefix]) == 0
    assert main(["sft", "--quiet", records, "-o", str(tmp_path / "c"), "--layout", "pai"]) == 2
    assert "--layout pai needs --seq-length" in capsys.readouterr().err


def test_a_pai_run_removes_an_older_loss_mask(tmp_path):
    records = write_jsonl(tmp_path / "r.jsonl", [{"instruction": "Hi", "output": "Hello."}])
    prefix = sft([records], tmp_path / "p", "--seq-length", 64)
    assert os.path.exists(prefix + ".lossmask.bin")
    sft([records], prefix, "--layout", "pai", "--seq-length", 64)
    assert not os.path.exists(prefix + ".lossmask.bin") and not os.path.exists(prefix + ".lossmask.idx")
    assert not os.path.exists(prefix + ".unpacked.bin")


@pytest.mark.parametrize("packing", ["best-fit", "next-fit"])
def test_shards_merge_into_one_runs_rows(tmp_path, capsys, packing):
    args = ["--layout", "pai", "--seq-length", S, "--pack", "--packing", packing]
    one = sft([RECORDS], tmp_path / "one", *args)
    parts = [sft([RECORDS], tmp_path / f"s{k}", *args, "--shard", f"{k}/3") for k in range(3)]
    assert not manifest(parts[0])["sft"]["packed"] and manifest(parts[0])["sft"]["layout_on_merge"] == "pai"
    assert main(["merge", "--quiet", *parts, "-o", str(tmp_path / "m")]) == 0
    for suffix in (".bin", ".idx"):
        assert open(one + suffix, "rb").read() == open(str(tmp_path / "m") + suffix, "rb").read()
    merged = manifest(tmp_path / "m")
    assert merged["sft"]["layout"] == "pai" and "layout_on_merge" not in merged["sft"]
    assert merged["fingerprint"] == manifest(one)["fingerprint"]
    assert main(["verify", str(tmp_path / "m")]) == 0
    unpacked = sft([RECORDS], tmp_path / "u", "--layout", "pai", "--seq-length", S)
    assert main(["merge", "--quiet", unpacked, unpacked, "-o", str(tmp_path / "x")]) == 2
    assert "is in the pai layout, which cannot be joined" in capsys.readouterr().err


def test_blend_weighs_real_tokens_and_refuses_mixed_layouts(tmp_path, capsys):
    mask_prefix, pai_prefix = equivalent_mask_layout(tmp_path, RECORDS)
    other = sft([RECORDS], tmp_path / "pai2", "--layout", "pai", "--seq-length", S)
    out = str(tmp_path / "blend")
    assert main(["blend", pai_prefix, other, "-o", out]) == 0
    sidecar = json.loads(open(out + ".qwen-data.json").read())
    assert sidecar["layout"] == "pai"
    assert sidecar["splits"]["train"][0]["tokens"] == manifest(pai_prefix)["sft"]["sample_tokens"]
    assert main(["blend", mask_prefix, pai_prefix, "-o", str(tmp_path / "mixed")]) == 2
    assert "SFT layout" in capsys.readouterr().err
