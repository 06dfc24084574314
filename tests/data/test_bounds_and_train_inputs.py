"""Numbers bounded while parsing, and what the train stage and the tools read: hand-written blends' weights,
whole indices (`indexed.check`), the names every command accepts, control ids told apart from text.
No torch, no megatron-core: the train stage's own reading of its data is `qwen_data.blend.read`."""

from __future__ import annotations

import json
import os
import struct

import numpy as np
import pytest
from _helpers import copy_prefix, edit_value, manifest, pretrain, refingerprint, sft, write_jsonl

from qwen_data.blend.files import BlendError, load_source
from qwen_data.blend.read import read_train_blend
from qwen_data.cli import COMMANDS, build_parser, main
from qwen_data.formats.indexed import IndexFormatError, check
from qwen_data.options import INT32_MAX
from qwen_data.qwen import MAX_SEQ_LENGTH
from qwen_data.tools.verify import verify as verify_problems
from qwen_data_train.config import TrainConfig, build_parser as train_parser, check_seq_length, convert_parser

HEADER = struct.calcsize("<9sQBQQ")


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("inputs")
    corpus = write_jsonl(d / "corpus.jsonl", [{"text": f"document {i} " * (i + 1)} for i in range(12)]
                         + [{"text": "a literal <|endoftext|> in the text"}])
    chats = write_jsonl(d / "chats.jsonl", [{"instruction": f"say {i}", "output": f"{i} " * (i + 2)} for i in range(8)])
    web = pretrain([corpus], d / "web")
    code = pretrain([corpus], d / "code")
    chat = sft([chats], d / "chat", "--seq-length", 64, "--pack")
    pai = sft([chats], d / "pai", "--seq-length", 64, "--layout", "pai")
    return {"dir": d, "web": web, "code": code, "chat": chat, "pai": pai}


def error_of(capsys, argv) -> str:
    """The one error line of a refused command line (argparse's exit, or main's 2)."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err
    return [line for line in err.splitlines() if "error:" in line][-1]


# -- every number bounded while parsing ------------------------------------------------------------
def _actions():
    """(parser name, option, type) of every option of every command line, the train stage's included."""
    parsers = {name: build_parser(name)._subparsers._group_actions[0].choices[name] for name in COMMANDS}
    parsers["train"] = train_parser()
    convert = convert_parser()
    parsers.update(convert._subparsers._group_actions[0].choices)
    for name, parser in parsers.items():
        for action in parser._actions:
            if action.option_strings and action.type is not None:
                yield name, action.option_strings[-1], action.type


def test_no_option_takes_an_unbounded_number():
    """A bare int/float type lets 0, negatives, NaN, inf and sizes no machine holds through to a traceback."""
    loose = [f"{name} {option}" for name, option, kind in _actions() if kind in (int, float)]
    assert not loose, loose


@pytest.mark.parametrize("argv, option, says", [
    (["sft", "--pack", "--seq-length", 3_000_000_000], "--seq-length", f"at most {MAX_SEQ_LENGTH:,}"),
    (["sft", "--pack", "--seq-length", 2_000_000_000], "--seq-length", f"at most {MAX_SEQ_LENGTH:,}"),
    (["sft", "--seq-length", 1], "--seq-length", "at least 2"),
    (["pretrain", "--chunk-mb", 100_000], "--chunk-mb", "at most 1,024"),
    (["pretrain", "--chunk-mb", "nan"], "--chunk-mb", "not a finite number"),
    (["pretrain", "--chunk-mb", 0], "--chunk-mb", "above 0"),
    (["pretrain", "--workers", 0], "--workers", "at least 1"),
    (["sft", "--workers", 100_000], "--workers", "at most 1,024"),
    (["sft", "--pad-id", -1], "--pad-id", "at least 0"),
    (["blend", "x", "--split", "0,0,0"], "--split", "train part must be positive"),
    (["blend", "x", "--temperature", "inf"], "--temperature", "must be a positive number"),
    (["stats", "x", "--train-iters", 0], "--train-iters", "at least 1"),
    (["train", "--data", "x", "--micro-batch-size", 0], "--micro-batch-size", "at least 1"),
    (["train", "--data", "x", "--seq-length", 99_999_999_999], "--seq-length", f"at most {INT32_MAX - 1:,}"),
    (["train", "--data", "x", "--split", "0,0,0"], "--split", "train part must be positive"),
    (["train", "--data", "x", "--split", "nan,1"], "--split", "non-negative numbers"),
    (["train", "--data", "x", "--lr", "nan"], "--lr", "not a finite number"),
    (["train", "--data", "x", "--num-workers", -1], "--num-workers", "at least 0"),
    (["train", "--data", "x", "--train-iters", 0], "--train-iters", "at least 1"),
])
def test_numbers_out_of_range_are_one_line_naming_the_option(capsys, argv, option, says):
    line = error_of(capsys, argv)
    assert f"argument {option}:" in line and says in line, line


def test_sft_seq_length_admits_every_qwen_context_and_says_its_bound():
    """Rows of billions of tokens are refused while parsing (a 2e9 --pack took 17.7 GB of memory and
    wrote 10 GB for 17 KB of tokens); Qwen2.5-1M's 1,010,000 positions are admitted, in every layout,
    and a pai row of 2 x the bound still fits an .idx length."""
    sft_parser = build_parser("sft")
    for layout in ("mask", "pai"):
        args = sft_parser.parse_args(["sft", "--pack", "--layout", layout, "--seq-length", str(MAX_SEQ_LENGTH)])
        assert args.seq_length == MAX_SEQ_LENGTH
    assert 1_010_000 <= MAX_SEQ_LENGTH and 2 * MAX_SEQ_LENGTH <= INT32_MAX
    assert f"at most {MAX_SEQ_LENGTH:,}" in " ".join(sft_parser._subparsers._group_actions[0].choices["sft"]
                                                      .format_help().split())


def test_train_seq_length_within_the_models_positions():
    assert TrainConfig.parse(["--data", "x", "--seq-length", "512"]).seq_length == 512
    check_seq_length(4096, 4096, "tiny")
    with pytest.raises(ValueError, match="beyond the 4,096 positions of tiny"):
        check_seq_length(4097, 4096, "tiny")


# -- hand-written Megatron blends: weights finite and above 0 --------------------------------------
@pytest.mark.parametrize("weight", ["nan", "-1", "0", "inf", "-0.5"])
def test_hand_written_blend_weights_are_refused_naming_the_file(data, tmp_path, capsys, weight):
    txt = tmp_path / "hand.txt"
    txt.write_text(f"{weight} {data['web']} 1 {data['code']}\n")
    per_split = tmp_path / "hand.json"
    per_split.write_text(json.dumps({"train": [weight, data["web"], "1", data["code"]], "valid": None,
                                     "test": None}))
    for path in (txt, per_split):
        with pytest.raises(BlendError, match=f"{path}.*weight .*{data['web']}.*finite number above 0"):
            read_train_blend(str(path))
    assert f"{txt}" in error_of(capsys, ["stats", txt])
    with pytest.raises(BlendError, match="finite number above 0"):
        read_train_blend([weight, data["web"], "1", data["code"]])


@pytest.mark.parametrize("fields, says", [
    ("0.7 {web} 0.3", "3 fields (0.7 {web} 0.3) do not pair as `weight prefix`: a weight without its prefix"),
    ("0.7 {web} {code} 0.3", "4 fields (0.7 {web} {code} 0.3) do not pair as `weight prefix`: '{code} 0.3' is "
                             "no such pair"),
])
def test_hand_written_blend_fields_that_do_not_pair_are_refused_naming_the_file(data, tmp_path, capsys, fields,
                                                                                 says):
    """Megatron reads a list that does not pair as prefixes alone: the weight was taken for a prefix
    and the refusal was 'no manifest 0.3.json'."""
    txt = tmp_path / "odd.txt"
    txt.write_text(fields.format(**data) + "\n")
    says = says.format(**data)
    with pytest.raises(BlendError) as info:
        read_train_blend(str(txt))
    assert str(info.value) == f"{txt}: {says}"
    assert error_of(capsys, ["stats", txt]) == f"qwen-data stats: error: {txt}: {says}"
    with pytest.raises(BlendError, match="do not pair as `weight prefix`"):
        read_train_blend(fields.format(**data).split())


def test_a_prefix_named_like_a_number_is_still_a_prefix(data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    copy_prefix(data["web"], "7")
    assert read_train_blend(["7", data["code"], data["web"]]).blend == (["7", data["code"], data["web"]], None)


# -- an index checked whole before anything relies on it -------------------------------------------
def _corrupt(prefix, kind):
    """Damage PREFIX.idx (or .bin) one way; the header stays valid."""
    with open(prefix + ".idx", "rb") as f:
        raw = bytearray(f.read())
    n = struct.unpack_from("<Q", raw, 9 + 8 + 1)[0]
    if kind == "negative length":  # the sum still fills the .bin: only the sign is wrong
        first, second = struct.unpack_from("<ii", raw, HEADER)
        struct.pack_into("<ii", raw, HEADER, -first, second + 2 * first)
    elif kind == "pointer":
        struct.pack_into("<q", raw, HEADER + 4 * n + 8, 2)
    elif kind == "document order":
        struct.pack_into("<q", raw, HEADER + 12 * n + 8 * 2, 0)
    elif kind == "short bin":
        with open(prefix + ".bin", "r+b") as f:
            f.truncate(os.path.getsize(prefix + ".bin") - 4)
    with open(prefix + ".idx", "wb") as f:
        f.write(raw)


@pytest.mark.corrupts_outputs
@pytest.mark.parametrize("kind, says", [("negative length", "sequence 0 has length -"),
                                        ("pointer", "sequence 1 starts at byte 2"),
                                        ("document order", "document index 2 .* is below"),
                                        ("short bin", "the lengths in .* add up to")])
def test_a_corrupt_index_is_one_clear_error_everywhere(data, tmp_path, capsys, kind, says):
    assert check(data["web"] + ".idx", data["web"] + ".bin").sequences > 2
    prefix = copy_prefix(data["web"], str(tmp_path / "bad"))
    _corrupt(prefix, kind)
    with pytest.raises(IndexFormatError, match=says):
        check(prefix + ".idx", prefix + ".bin")
    for argv in (["inspect", prefix], ["stats", prefix], ["inspect", prefix, "--html", tmp_path / "r.html"]):
        assert "bad" in error_of(capsys, argv)
    # The train stage reads its sources through load_source, before megatron-core sees them (a short .bin
    # is found there first by its manifest's count).
    says = "bad.bin holds" if kind == "short bin" else says
    with pytest.raises(BlendError, match=says):
        load_source(prefix)
    with pytest.raises(BlendError, match=says):
        read_train_blend(prefix)


# -- the train stage's check of every byte it will read (formats.integrity) --------------------------
def _checked(*prefixes):
    from qwen_data.formats.integrity import check_prefixes
    from qwen_data.formats.manifest import Manifest

    return check_prefixes([(p, Manifest.read(p)) for p in prefixes])


@pytest.mark.corrupts_outputs
def test_every_byte_is_checked_against_the_manifests_fingerprint(data, tmp_path):
    """One id changed (still in the vocabulary), one loss-mask byte flipped: the prefix is refused in
    one sentence naming it; the others, every byte of them read, are their manifests' data."""
    names = ("web", "chat", "pai")
    clean = _checked(*(data[n] for n in names))
    assert [c.problem for c in clean] == [None] * 3
    for checked, name in zip(clean, names):
        files = [f for f in os.listdir(data["dir"]) if f.startswith(name + ".") and f.endswith((".bin", ".idx"))]
        assert checked.bytes == sum(os.path.getsize(data["dir"] / f) for f in files) and len(files) in (2, 4)
    web, chat = copy_prefix(data["web"], str(tmp_path / "web")), copy_prefix(data["chat"], str(tmp_path / "chat"))
    edit_value(web, 5, int(np.memmap(web + ".bin", np.int32, "r")[5]) ^ 1)
    edit_value(chat, 3, 1 - int(np.memmap(chat + ".lossmask.bin", np.uint8, "r")[3]), channel=".lossmask")
    found = _checked(data["code"], web, chat)
    assert found[0].problem is None
    assert found[1].problem.startswith(f"{web}.json: fingerprint ") and "changed after the manifest" in found[1].problem
    assert f"{chat}.lossmask.bin no longer hashes" in found[2].problem


@pytest.mark.corrupts_outputs
@pytest.mark.parametrize("name, stored", [("web", 151_700), ("chat", 151_700), ("pai", -1 - 151_700), ("pai", -5)])
def test_an_id_outside_the_vocabulary_is_refused_naming_its_document(data, tmp_path, name, stored):
    """An id at or above the tokenizer's vocabulary size (a model's 151,936 embedding rows would take it
    silently) in document 3, its fingerprint made to match: refused naming the document. Packed rows:
    in the row's second sample; pai rows: stored as a sample's last id (-1 - id), or a value the model
    would read as id 4."""
    from qwen_data.formats.indexed import read_index

    prefix = copy_prefix(data[name], str(tmp_path / name))
    index = read_index(prefix + ".idx")
    sequence = index.document_indices[3] + (1 if name == "chat" else 0)
    position = int(index.pointers[sequence]) // 4 + 1
    edit_value(prefix, position, stored)
    refingerprint(prefix)
    problem = _checked(prefix)[0].problem
    if stored == -5:  # -1 - 4: id 4 with an end mark, a value a pai row may hold
        assert problem is None
        return
    m = manifest(prefix)
    vocab = m["tokenizer"]["vocab_size"]
    assert problem == (f"{prefix}: document 3 (counting from 0) holds id 151700, which its manifest does not allow "
                       f"(ids below its vocabulary size {vocab:,}, and the pad id {m['pad_id']}): "
                       f"`qwen-data verify {prefix}` lists every one")
    assert any(p for p in verify_problems(prefix))  # verify agrees


@pytest.mark.corrupts_outputs
def test_a_pad_id_is_allowed_where_the_layout_stores_it(data, tmp_path):
    """Packed rows end in pad ids; a pai row's pad (the vocabulary size, Pai's first free id) fills
    it: both pass, and a pad id beyond the vocabulary is only allowed as the pad."""
    assert _checked(data["chat"], data["pai"])[0].problem is None
    prefix = copy_prefix(data["pai"], str(tmp_path / "pai"), lambda m: m.update(pad_id=151_700))
    refingerprint(prefix)
    vocab = manifest(prefix)["tokenizer"]["vocab_size"]
    assert f"document 0 (counting from 0) holds id {vocab}," in _checked(prefix)[0].problem


# -- one spelling of a name for every command -------------------------------------------------------
def test_every_command_takes_the_same_names(data, tmp_path, capsys):
    web = copy_prefix(data["web"], str(tmp_path / "web"))
    code = copy_prefix(data["code"], str(tmp_path / "code"))
    os.makedirs(web + "/cache/GPTDataset_indices")  # what megatron-core's default cache left beside a prefix
    assert main(["blend", web, code, "-o", str(tmp_path / "per.json")]) == 0
    assert main(["blend", web + ".json", code + ".bin", "--split", "90,10,0", "-o", str(tmp_path / "cut.json")]) == 0
    assert not os.path.exists(tmp_path / "cut.json")  # a --split blend: only cut.txt and its sidecar
    capsys.readouterr()
    for name in (web, web + ".json", web + ".bin", web + ".idx"):
        assert main(["stats", name]) == 0 and f"{web}: pretrain" in capsys.readouterr().out
        assert main(["inspect", name, "--plain"]) == 0 and f"{web}: pretraining" in capsys.readouterr().out
        assert read_train_blend(name).sources[0].prefix == web
    for blend in ("per.json", "per.txt", "per.qwen-data.json", "cut.json", "cut.txt", "cut.qwen-data.json"):
        path = str(tmp_path / blend)
        assert main(["stats", path]) == 0, capsys.readouterr().err
        assert "blend of 2 train source(s)" in capsys.readouterr().out
        assert [s.prefix for s in read_train_blend(path).sources] == [web, code]
    assert main(["stats", str(tmp_path / "per.json"), "--html", str(tmp_path / "report.html")]) == 0
    assert main(["inspect", web, "--html", str(tmp_path / "web.html")]) == 0
    capsys.readouterr()
    assert "a directory, not a prefix" in error_of(capsys, ["stats", tmp_path])
    assert "no such blend file" in error_of(capsys, ["stats", tmp_path / "nothing.txt"])


# -- control ids shown apart from the same characters in text ---------------------------------------
def test_plain_inspect_marks_control_ids(data, capsys):
    assert main(["inspect", data["web"], "--plain", "--index", "12"]) == 0
    out = capsys.readouterr().out
    row = out.split("══\n", 1)[1]
    assert "a literal <|endoftext|> in the text⟨<|endoftext|>⟩" in row, row
    assert main(["inspect", data["chat"], "--plain", "--ids"]) == 0
    out = capsys.readouterr().out
    assert "⟨<|im_start|>⟩{151644}" in out and "⟨<|vision_pad|>⟩×" in out
    parser = build_parser("inspect")._subparsers._group_actions[0].choices["inspect"]
    assert "⟨<|endoftext|>⟩ is the id" in " ".join(parser.format_help().split())  # said in --help
