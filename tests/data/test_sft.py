"""`qwen-data sft` end to end against transformers' `apply_chat_template` and megatron-core's reader."""

import json
import os

import _conversations as gen
import numpy as np
import pytest
from _helpers import hf_chat_tokenizer as hf_tokenizer
from _helpers import hf_ids, write_jsonl

from qwen_data.cli import main
from qwen_data.text.conversations import to_conversation
from qwen_data.text.templates import SPAN_KINDS, TEMPLATE_SHA256, get_template, render_samples

PAD = 151654
CASES = {"qwen2": dict(tools=False, reasoning=False), "qwen2p5": dict(tools=True, reasoning=False),
         "qwen3": dict(tools=True, reasoning=True)}


@pytest.fixture(scope="module")
def indexed():
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset


def records_for(template, count, seed):
    convs = gen.conversations(seed, count, **CASES[template])
    return [{"messages": c.messages, **({"tools": c.tools} if c.tools else {})} for c in convs]


def sft(*args):
    # parse: literal special strings in content become control ids, exactly as apply_chat_template
    # gives them (the generated conversations hold such literals; the default policy is tested apart).
    return main(["sft", "--quiet", "--special-tokens", "parse", *map(str, args)])


def read(indexed, prefix):
    ids, mask = indexed(str(prefix)), indexed(str(prefix) + ".lossmask")
    assert (ids.sequence_lengths == mask.sequence_lengths).all()
    assert (ids.document_indices == mask.document_indices).all()
    assert ids.index.dtype == np.int32 and mask.index.dtype == np.uint8
    return ids, mask


def samples(indexed, prefix):
    ids, mask = read(indexed, prefix)
    return [ids[i].tolist() for i in range(len(ids))], [mask[i].tolist() for i in range(len(mask))]


def trained_char_spans(template, record, span):
    """Character spans of the trained segments (the segments themselves are tested against HF)."""
    sample, = render_samples(get_template(template), to_conversation(record), "rendered")
    spans, pos = [], 0
    for seg in sample.segments:
        if seg.kind in SPAN_KINDS[span] and seg.text:
            spans.append((pos, pos + len(seg.text)))
        pos += len(seg.text)
    return sample.text, spans


def mask_by_definition(template, record, span):
    """Tokens (HF's own offsets) that touch a trained character span."""
    text, spans = trained_char_spans(template, record, span)
    enc = hf_tokenizer(template)(text, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], [int(any(s < e2 and e > s2 for s2, e2 in spans)) for s, e in enc["offset_mapping"]]


@pytest.mark.parametrize("template", ["qwen2", "qwen2p5", "qwen3"])
def test_ids_equal_apply_chat_template_and_mask_follows_its_definition(tmp_path, indexed, template):
    records = records_for(template, 120, seed=11)
    src = write_jsonl(tmp_path / "c.jsonl", records)
    assert sft(src, "-o", tmp_path / "out", "--template", template, "--workers", 2) == 0
    ids, masks = samples(indexed, tmp_path / "out")
    assert len(ids) == len(records)
    for record, got_ids, got_mask in zip(records, ids, masks):
        assert got_ids == hf_ids(template, record)["input_ids"]
        want_ids, want_mask = mask_by_definition(template, record, "im_end_nl")
        assert want_ids == got_ids and got_mask == want_mask
        assert PAD not in got_ids
    manifest = json.load(open(tmp_path / "out.json"))
    assert manifest["kind"] == "sft" and manifest["pad_id"] == PAD and manifest["sft"]["template"] == template
    assert manifest["sft"]["template_sha256"] == TEMPLATE_SHA256[template]


@pytest.mark.parametrize("template,span", [("qwen2p5", "trl"), ("qwen3", "im_end_nl")])
def test_mask_equals_trl_generation_template(tmp_path, indexed, template, span):
    """Where TRL's `{% generation %}` templates train the same span, transformers' own assistant
    mask must equal ours token for token."""
    oracle = {"qwen2p5": "qwen2.5-instruct.assistant-mask.jinja", "qwen3": "qwen3.assistant-mask.jinja"}[template]
    records = records_for(template, 80, seed=12)
    src = write_jsonl(tmp_path / "c.jsonl", records)
    assert sft(src, "-o", tmp_path / "out", "--template", template, "--assistant-span", span) == 0
    ids, masks = samples(indexed, tmp_path / "out")
    compared = 0
    for record, got_ids, got_mask in zip(records, ids, masks):
        assert got_ids == hf_ids(template, record)["input_ids"]
        hf = hf_ids(template, record, oracle, assistant_mask=True)
        # TRL's Qwen3 training template keeps reasoning in earlier turns, so it renders some
        # multi-turn chats differently from the official one; compare masks where texts agree.
        if hf["input_ids"] == got_ids:
            assert got_mask == hf["assistant_masks"]
            compared += 1
    assert compared == len(records) if template == "qwen2p5" else compared >= 10


def test_packed_rows_are_exactly_n_and_hold_the_same_samples(tmp_path, indexed):
    records = records_for("qwen2p5", 150, seed=13)
    src = write_jsonl(tmp_path / "c.jsonl", records)
    n = 384
    assert sft(src, "-o", tmp_path / "plain", "--template", "qwen2p5") == 0
    assert sft(src, "-o", tmp_path / "packed", "--template", "qwen2p5", "--seq-length", n, "--pack") == 0
    plain_ids, plain_masks = samples(indexed, tmp_path / "plain")
    ids, mask = read(indexed, tmp_path / "packed")
    got = []
    for d in range(len(ids.document_indices) - 1):
        seqs = range(ids.document_indices[d], ids.document_indices[d + 1])
        assert sum(ids.sequence_lengths[s] for s in seqs) == n
        for s in seqs:
            tokens, m = ids[s].tolist(), mask[s].tolist()
            if PAD in tokens:  # the pad sequence: all pad, never trained, and last in its row
                assert set(tokens) == {PAD} and not any(m) and s == seqs[-1]
            else:
                got.append((tuple(tokens), tuple(m)))
    fitting = [(tuple(i), tuple(m)) for i, m in zip(plain_ids, plain_masks) if len(i) <= n]
    assert sorted(got) == sorted(fitting)
    manifest = json.load(open(tmp_path / "packed.json"))
    assert manifest["sft"]["packed"] and manifest["sft"]["rows"] == len(ids.document_indices) - 1
    assert manifest["rejects"]["count"] == len(plain_ids) - len(fitting)
    rejects = [json.loads(l) for l in open(tmp_path / "packed.rejects.jsonl")]
    assert all(r["reason"] == "too-long" and f"over --seq-length {n}" in r["message"] for r in rejects)
    assert not any(name.startswith("packed.unpacked") for name in os.listdir(tmp_path))


@pytest.mark.parametrize("layout", [["--pack"], ["--pack", "--packing", "next-fit"], ["--layout", "pai", "--pack"]])
def test_rows_laid_out_beside_the_workers_equal_rows_laid_out_in_one_process(tmp_path, monkeypatch, layout):
    """At several workers each window's rows (packed, Pai's) are laid out, written and (Pai's) hashed by a
    worker beside its tasks (`workers` errands), from the samples the workers staged, once they are
    there: the main process touches no id byte of them. The bytes are those of a run that lays out
    every row in one process, windows closing mid-run."""
    from qwen_data.formats import layouts, packing

    monkeypatch.setattr(packing, "PACK_WINDOW", 5000)  # windows close while the workers work
    writers = tmp_path / "writers"
    mapped = layouts._mapped

    def noted(*args, **kwargs):  # which process reads each window's samples (forked workers inherit it)
        with open(writers, "a") as f:
            f.write(f"{os.getpid()}\n")
        return mapped(*args, **kwargs)

    monkeypatch.setattr(layouts, "_mapped", noted)
    src = write_jsonl(tmp_path / "c.jsonl", records_for("qwen2p5", 150, seed=13))
    common = ["--template", "qwen2p5", "--seq-length", 384, *layout]
    assert sft(src, "-o", tmp_path / "one", *common, "--chunk-mb", 100) == 0  # one chunk: no worker
    assert sft(src, "-o", tmp_path / "spread", *common, "--workers", 2, "--chunk-mb", 0.002) == 0
    one, spread = (json.load(open(tmp_path / f"{name}.json")) for name in ("one", "spread"))
    assert spread["fingerprint"] == one["fingerprint"] and spread["sft"]["rows"] == one["sft"]["rows"] > 10
    assert spread["sft"]["trained_tokens"] == one["sft"]["trained_tokens"]
    pids = writers.read_text().split()  # the first run's windows here, every window of the second by a worker
    here = pids.count(str(os.getpid()))
    assert 0 < here < len(pids) and str(os.getpid()) not in pids[here:], pids
    assert not any(".unpacked" in name for name in os.listdir(tmp_path))


def test_rows_a_worker_cannot_write_fail_the_run_naming_the_file_and_leave_nothing(tmp_path, monkeypatch, capsys):
    """A window's rows written by a worker's errand: its error (a full disk) fails the run in one line that
    names the worker and the file, and no output is left looking complete."""
    import errno

    from qwen_data.formats import layouts, packing

    def full(fd, view, offset):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(packing, "PACK_WINDOW", 5000)  # windows close while the workers work
    monkeypatch.setattr(layouts, "pwrite_all", full)  # (the rows' writes only: the samples' are the workers')
    src = write_jsonl(tmp_path / "c.jsonl", records_for("qwen2p5", 150, seed=13))
    assert sft(src, "-o", tmp_path / "s", "--template", "qwen2p5", "--seq-length", 384, "--pack", "--workers", 2,
               "--chunk-mb", 0.002) == 2
    err = capsys.readouterr().err
    assert "running Rows.write: No space left on device" in err and str(tmp_path / "s.bin.tmp") in err, err[-500:]
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl"]


def test_truncate_keeps_a_consistent_prefix(tmp_path, indexed):
    records = records_for("qwen2p5", 60, seed=14)
    src = write_jsonl(tmp_path / "c.jsonl", records)
    assert sft(src, "-o", tmp_path / "plain") == 0
    assert sft(src, "-o", tmp_path / "cut", "--seq-length", 96, "--overlong", "truncate") == 0
    full = dict(enumerate(zip(*samples(indexed, tmp_path / "plain"))))
    cut_ids, cut_masks = samples(indexed, tmp_path / "cut")
    rejects = {json.loads(l)["record"] for l in open(tmp_path / "cut.rejects.jsonl")} if os.path.exists(tmp_path / "cut.rejects.jsonl") else set()
    kept = [i for i in range(len(records)) if i + 1 not in rejects]
    assert len(kept) == len(cut_ids)
    for i, ids, m in zip(kept, cut_ids, cut_masks):
        assert len(ids) <= 96 and ids == full[i][0][: len(ids)] and m == full[i][1][: len(ids)] and any(m)


def test_mask_policies_and_history_modes(tmp_path, indexed):
    record = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                           {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}]}
    src = write_jsonl(tmp_path / "c.jsonl", [record])
    results = {}
    for name, args in {"assistant": [], "last": ["--mask", "last"], "all": ["--mask", "all"],
                       "split": ["--history", "split"], "im_end": ["--assistant-span", "im_end"]}.items():
        assert sft(src, "-o", tmp_path / name, *args) == 0
        results[name] = samples(indexed, tmp_path / name)
    tok = hf_tokenizer("qwen2p5")
    decode = lambda ids, m: "".join(tok.decode([i]) for i, k in zip(ids, m) if k)
    (ids,), (m,) = results["assistant"]
    assert decode(ids, m) == "b<|im_end|>\nd<|im_end|>\n"
    (ids,), (m,) = results["last"]
    assert decode(ids, m) == "d<|im_end|>\n"
    (ids,), (m,) = results["all"]
    assert all(m)
    (ids,), (m,) = results["im_end"]
    assert decode(ids, m) == "b<|im_end|>d<|im_end|>"
    split_ids, split_masks = results["split"]
    assert [decode(i, k) for i, k in zip(split_ids, split_masks)] == ["b<|im_end|>\n", "d<|im_end|>\n"]
    assert split_ids[1] == results["assistant"][0][0]


def test_record_formats_render_as_their_messages(tmp_path, indexed):
    alpaca = {"instruction": "Translate", "input": "hello", "output": "bonjour", "system": "S",
              "history": [["hi", "salut"]]}
    sharegpt = {"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "r"}], "system": "S"}
    as_messages = [
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
                      {"role": "assistant", "content": "salut"}, {"role": "user", "content": "Translate\nhello"},
                      {"role": "assistant", "content": "bonjour"}]},
        {"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "q"},
                      {"role": "assistant", "content": "r"}]},
    ]
    json_array = tmp_path / "data.json"
    json_array.write_text(json.dumps([alpaca, sharegpt], ensure_ascii=False))
    assert sft(json_array, "-o", tmp_path / "out") == 0
    ids, _ = samples(indexed, tmp_path / "out")
    assert ids == [hf_ids("qwen2p5", r)["input_ids"] for r in as_messages]


def test_bad_records_are_set_aside_with_their_line(tmp_path, indexed):
    good = {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    lines = [
        json.dumps(good),
        "{not json",  # 2
        json.dumps({"foo": "bar"}),  # 3 unknown format
        json.dumps({"messages": [{"role": "assistant", "content": "a"}]}),  # 4 wrong order
        json.dumps({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]}),  # 5
        json.dumps({"messages": [{"role": "user", "content": 7}, {"role": "assistant", "content": "a"}]}),  # 6
        json.dumps({"instruction": "only an instruction"}),  # 7 missing output
        json.dumps({"messages": [{"role": "user", "content": "x " * 400}, {"role": "assistant", "content": "a"}]}),  # 8
        json.dumps({"messages": [{"role": "user", "content": "<|vision_pad|>"}, {"role": "assistant", "content": "a"}]}),  # 9
        json.dumps(good),
    ]
    src = write_jsonl(tmp_path / "c.jsonl", lines)
    assert sft(src, "-o", tmp_path / "out", "--seq-length", 128) == 0
    rejects = [json.loads(l) for l in open(tmp_path / "out.rejects.jsonl")]
    assert [r["record"] for r in rejects] == [2, 3, 4, 5, 6, 7, 8, 9]
    reasons = {r["record"]: r["reason"] for r in rejects}
    assert reasons[2] == "invalid-json" and reasons[8] == "too-long" and reasons[9] == "pad-token-in-data"
    assert all(r["file"] == src and r["message"] for r in rejects)
    assert len(samples(indexed, tmp_path / "out")[0]) == 2


def compositions_newer_than_the_tokenizer() -> list[str]:
    """The decomposed forms of the characters Python's NFC composes and the tokenizer's does not."""
    import unicodedata

    from qwen_data.text.tokenizer import QwenTokenizer

    normalize = QwenTokenizer.shared().normalize
    found = []
    for composed in map(chr, [*range(0xD800), *range(0xE000, 0x110000)]):
        parts = unicodedata.normalize("NFD", composed)
        if parts != composed and unicodedata.normalize("NFC", parts) == composed and normalize(parts) != composed:
            found.append(parts)
    return found


def combining_marks_by_age() -> dict[str, list[str]]:
    """Every character of canonical combining class != 0 (in the newest tables here: the `regex`
    module's), grouped by the Unicode version band that introduced it, as far as the tables at hand
    tell: in Unicode 3.2 (unicodedata.ucd_3_2_0); in the tokenizer's (HF `tokenizers`, Unicode 9:
    it reorders the mark); in Python's (unicodedata); newer still."""
    import unicodedata

    import regex

    from qwen_data.text.tokenizer import QwenTokenizer

    normalize = QwenTokenizer.shared().normalize
    everything = "".join(map(chr, [*range(0xD800), *range(0xE000, 0x110000)]))
    bands: dict[str, list[str]] = {}
    for mark in regex.findall(r"\P{ccc=0}", everything):
        if unicodedata.ucd_3_2_0.combining(mark):
            band = "3.2"
        elif normalize("\u0345" + mark) != "\u0345" + mark:  # U+0345 has the highest class, 240
            band = "4.0-9.0"
        elif unicodedata.combining(mark):
            band = f"10.0-{unicodedata.unidata_version}"
        else:
            band = "newer"
        bands.setdefault(band, []).append(mark)
    return bands


def test_combining_marks_of_every_age_give_hf_ids_and_mask(tmp_path, indexed):
    """Where Python's Unicode tables and the tokenizer's (older) ones normalize differently, the
    mask still follows the tokenizer: no sample is refused, ids and mask are HF's."""
    bands = combining_marks_by_age()
    assert len(bands) == 4 and all(len(marks) > 20 for marks in bands.values()), {b: len(m) for b, m in bands.items()}
    # Every mark of a band, 8 to a record: at the start of a segment, between a letter and a mark
    # it may keep from composing (o + U+1DF6 + U+0300), between marks of a higher and a lower class,
    # after a letter; in system, user and assistant turns.
    groups = [marks[i:i + 8] for marks in bands.values() for i in range(0, len(marks), 8)]
    records = [{"messages": [{"role": "system", "content": "".join(f"{m}s" for m in group[::-1])},
                             {"role": "user", "content": " ".join(f"o{m}\u0300 \u0345{m}\u0334" for m in group)},
                             {"role": "assistant", "content": " ".join(f"{m}e{m}\u0301 x{m}" for m in group)}]}
               for group in groups]
    pairs = compositions_newer_than_the_tokenizer()  # Dives Akuru's U+11938 with Python 3.11's tables
    assert pairs
    records.append({"messages": [{"role": "user", "content": " ".join(pairs)},
                                 {"role": "assistant", "content": "".join(pairs) + " a"}]})
    src = write_jsonl(tmp_path / "c.jsonl", records)
    assert sft(src, "-o", tmp_path / "out", "--workers", 1) == 0
    assert json.load(open(tmp_path / "out.json"))["rejects"]["count"] == 0
    ids, masks = samples(indexed, tmp_path / "out")
    assert len(ids) == len(records)
    for record, got_ids, got_mask in zip(records, ids, masks):
        assert got_ids == hf_ids("qwen2p5", record)["input_ids"]
        assert (got_ids, got_mask) == mask_by_definition("qwen2p5", record, "im_end_nl")


S = "\ud800"  # a lone surrogate: json.dumps escapes it, as a jsonl line from a careless tool holds it
USER, ASSISTANT = {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}
CALL = {"type": "function", "function": {"name": "f", "arguments": {"x": "1"}}}
TOOL = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}
SURROGATES = [  # (record, where the message says it is); every format, every string it reads
    ({"messages": [{"role": "system", "content": S}, USER, ASSISTANT]}, "message 0 content"),
    ({"messages": [{"role": "user", "content": "q" + S}, ASSISTANT]}, "message 0 content"),
    ({"messages": [USER, {"role": "assistant", "content": S + "a"}]}, "message 1 content"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": S}]}, ASSISTANT]}, "message 0 content"),
    ({"messages": [USER, {"role": "assistant", "content": "a", "reasoning_content": S}]}, "message 1 reasoning_content"),
    ({"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f" + S, "arguments": {}}}]},
        {"role": "tool", "content": "r"}, ASSISTANT]}, "message 1 tool_calls"),
    ({"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": '{"x": "' + S + '"}'}}]},
        {"role": "tool", "content": "r"}, ASSISTANT]}, "message 1 tool_calls"),
    ({"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "f", "arguments": {S: "1"}}}]},
        {"role": "tool", "content": "r"}, ASSISTANT]}, "message 1 tool_calls"),
    ({"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [CALL]},
                   {"role": "tool", "content": S}, ASSISTANT]}, "message 2 content"),
    ({"messages": [USER, ASSISTANT], "tools": [{**TOOL, "function": {**TOOL["function"], "description": S}}]}, "tools"),
    ({"instruction": S, "output": "a"}, "message 0 content"),
    ({"instruction": "i", "input": S, "output": "a"}, "message 0 content"),
    ({"instruction": "i", "output": S}, "message 1 content"),
    ({"instruction": "i", "output": "a", "system": S}, "message 0 content"),
    ({"instruction": "i", "output": "a", "history": [[S, "h"]]}, "message 0 content"),
    ({"instruction": "i", "output": "a", "history": [["h", S]]}, "message 1 content"),
    ({"conversations": [{"from": "human", "value": S}, {"from": "gpt", "value": "a"}]}, "message 0 content"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": S}]}, "message 1 content"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}], "system": S}, "message 0 content"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": json.dumps(
        {"name": "f", "arguments": {"x": S}})}, {"from": "observation", "value": "r"}, {"from": "gpt", "value": "a"}]},
     "message 1 tool_calls"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "function_call", "value": json.dumps(
        {"name": "f", "arguments": {}})}, {"from": "observation", "value": S}, {"from": "gpt", "value": "a"}]},
     "message 2 content"),
    ({"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}],
      "tools": json.dumps([{"name": "f", "description": S}])}, "tools"),
]


@pytest.mark.parametrize("template", ["qwen2p5", "qwen3"])
def test_lone_surrogates_are_rejected_in_every_string_of_every_format(tmp_path, indexed, template):
    """Each record is set aside by file and line, naming the string; the run goes on. A surrogate in a key
    no format reads, and an escaped backslash before "ud", are no reason to refuse a record; messages quoting a surrogate are written."""
    good = {"messages": [USER, ASSISTANT]}
    unread = {"messages": [USER, ASSISTANT], "id": S}
    backslash = {"messages": [{"role": "user", "content": "C:\\udir\\Ud"}, ASSISTANT]}
    bad_role = {"conversations": [{"from": "human" + S, "value": "q"}, {"from": "gpt", "value": "a"}]}
    bad_key = {"k" + S: "v"}  # named in the message: the rejects file escapes it
    lines = [json.dumps(record) for record in (good, *(record for record, _ in SURROGATES), unread, backslash, bad_role, bad_key)]
    src = write_jsonl(tmp_path / "c.jsonl", lines)
    assert sft(src, "-o", tmp_path / "out", "--template", template) == 0
    rejects = [json.loads(line) for line in open(tmp_path / "out.rejects.jsonl", encoding="utf-8")]
    assert [r["record"] for r in rejects] == list(range(2, len(SURROGATES) + 2)) + [len(SURROGATES) + 4, len(SURROGATES) + 5]
    for reject, (_, where) in zip(rejects, SURROGATES):
        assert reject["reason"] == "invalid-unicode" and reject["file"] == src
        assert reject["message"] == f"{where} holds a lone surrogate (not valid Unicode text)"
    assert rejects[-2]["reason"] == "unknown-role" and "\\ud800" in rejects[-2]["message"]
    assert rejects[-1]["reason"] == "unknown-format" and S in rejects[-1]["message"]
    ids, _ = samples(indexed, tmp_path / "out")
    assert ids == [hf_ids(template, record)["input_ids"] for record in (good, good, backslash)]


def test_a_surrogate_escaped_in_a_rows_json_string_is_rejected(tmp_path, indexed):
    """A parquet row's strings are UTF-8, but tool arguments given as a JSON string are read again, and
    their escapes can spell a lone surrogate: such a row is set aside as a jsonl line would be."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    call = {"type": "function", "function": {"name": "f", "arguments": json.dumps({"x": S})}}
    bad = {"messages": [USER, {"role": "assistant", "content": "", "tool_calls": [call]}]}
    good = {"messages": [USER, ASSISTANT]}
    pq.write_table(pa.Table.from_pylist([bad, good]), tmp_path / "c.parquet")
    assert sft(tmp_path / "c.parquet", "-o", tmp_path / "out", "--parse-tool-arguments") == 0
    rejects = [json.loads(line) for line in open(tmp_path / "out.rejects.jsonl", encoding="utf-8")]
    assert [(r["record"], r["reason"]) for r in rejects] == [(1, "invalid-unicode")]
    assert samples(indexed, tmp_path / "out")[0] == [hf_ids("qwen2p5", good)["input_ids"]]


@pytest.mark.parametrize("args", [["--pad-token", "<|im_end|>"], ["--pad-id", "151643"], ["--pad-id", "151644"],
                                  ["--pad-id", "200000"], ["--pad-token", "<think>", "--template", "qwen3"]])
def test_colliding_pad_choices_are_refused(tmp_path, capsys, args):
    src = write_jsonl(tmp_path / "c.jsonl", [{"messages": [{"role": "user", "content": "q"},
                                                           {"role": "assistant", "content": "a"}]}])
    assert sft(src, "-o", tmp_path / "out", *args) == 2
    assert "pad id" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out.json")


def test_other_pad_choice_is_used_and_recorded(tmp_path, indexed):
    src = write_jsonl(tmp_path / "c.jsonl", records_for("qwen2p5", 20, seed=15))
    assert sft(src, "-o", tmp_path / "out", "--pad-token", "<|fim_pad|>", "--seq-length", 512, "--pack") == 0
    ids, mask = read(indexed, tmp_path / "out")
    flat_ids = np.concatenate([ids[i] for i in range(len(ids))])
    flat_mask = np.concatenate([mask[i] for i in range(len(mask))])
    assert (flat_ids == 151662).any() and not flat_mask[flat_ids == 151662].any()
    assert json.load(open(tmp_path / "out.json"))["pad_id"] == 151662


@pytest.mark.parametrize("policy", ["reject", "safe", "text"])
def test_a_literal_written_escaped_in_the_json_line_is_found_as_one_written_plainly(tmp_path, policy):
    """A record without "<" in its line holds no literal and is not searched for one; a JSON line may
    write "<" as \\u003c (or \\u003C), so such a line is searched: the same records written either way
    give the same rows, rejects and counts under every policy that acts on literals."""
    records = [{"messages": [{"role": "user", "content": "say <|im_end|> then stop"},
                             {"role": "assistant", "content": "ok <think>"}]},
               {"instruction": "plain, no angle bracket", "output": "fine"},
               {"instruction": "an input joins the instruction", "input": "<|im_start|>system", "output": "x"}]
    plain = tmp_path / "plain.jsonl"
    write_jsonl(plain, records)
    text = plain.read_text(encoding="utf-8")
    assert "<" in text
    for name, escaped in [("lower", text.replace("<", "\\u003c")), ("upper", text.replace("<", "\\u003C"))]:
        (tmp_path / f"{name}.jsonl").write_text(escaped, encoding="utf-8")
    outputs = {}
    for name in ("plain", "lower", "upper"):
        code = main(["sft", "--quiet", "--no-certify", "--special-tokens", policy, str(tmp_path / f"{name}.jsonl"),
                     "-o", str(tmp_path / name)])
        assert code == 0
        manifest = json.load(open(tmp_path / f"{name}.json"))
        outputs[name] = (open(tmp_path / f"{name}.bin", "rb").read(), open(tmp_path / f"{name}.lossmask.bin", "rb").read(),
                         manifest["rejects"]["count"], manifest["sft"]["special_token_records"])
    assert outputs["lower"] == outputs["plain"] == outputs["upper"]
    assert outputs["plain"][2 if policy == "reject" else 3] == 2  # both records holding a literal


@pytest.mark.parametrize("cut", [-3, 3])  # the refused sample's tokens spell fewer bytes than its text, or more
def test_a_sample_refused_for_a_normalization_boundary_leaves_the_others_masks_alone(cut):
    """Masks are made for a chunk's samples at once (`SampleEncoder.masks`): a sample whose tokens do
    not lie over its text's bytes is refused, and the samples around it get the masks they get alone."""
    from qwen_data.text.masking import SampleEncoder
    from qwen_data.text.tokenizer import QwenTokenizer

    template = get_template("qwen2p5")
    conversations = [to_conversation({"messages": [{"role": "user", "content": f"question {k}"},
                                                   {"role": "assistant", "content": f"answer number {k}"}]})
                     for k in range(3)]
    samples = [s for c in conversations for s in render_samples(template, c, "rendered")]
    tokenizer = QwenTokenizer.shared()
    encoder = SampleEncoder(tokenizer)
    ids = [tokenizer.encode(s.text) for s in samples]
    alone = [encoder.masks([s], [i])[0] for s, i in zip(samples, ids)]
    text = samples[1].text
    ids[1] = tokenizer.encode(text[:cut] if cut < 0 else text + "x" * cut)  # as if NFC had joined a boundary
    found = encoder.masks(samples, ids)
    assert found[1].reason == "normalization-boundary"
    assert np.array_equal(found[0], alone[0]) and np.array_equal(found[2], alone[2])


def test_json_marks_are_the_substrings_they_stand_for():
    """`literals.json_marks` finds in one pass what the substring searches it replaced found: "<" or an
    escaped one (a literal may be there), a \\ud / \\uD escape (a lone surrogate may be), anywhere."""
    import random

    from qwen_data.text.literals import ESCAPES_SURROGATE, MAY_HOLD_LEAD, json_marks

    rng = random.Random(11)
    parts = [b"\\", b"u", b"d", b"D", b"003", b"c", b"C", b"<", b"x", b"\\u", b"\\u00", b"\\u003", b"\\ud8", b"\"\\"]
    for _ in range(100_000):
        data = b"".join(rng.choice(parts) for _ in range(rng.randint(0, 8)))
        lead = b"<" in data or b"\\u003c" in data or b"\\u003C" in data
        surrogate = b"\\ud" in data or b"\\uD" in data
        assert json_marks(data) == lead * MAY_HOLD_LEAD | surrogate * ESCAPES_SURROGATE, data
