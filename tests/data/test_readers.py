"""Corpora as they come: every reader gives the bytes the jsonl of the same records gives; a run
cut into shards and merged gives the bytes of one run; LLaMA-Factory dataset_info entries read
without conversion."""

import gzip
import json
import lzma
import os
import random
import shutil
import subprocess
import sys

import pytest
from _helpers import REPO_ROOT, chats, corpus, manifest, pretrain, read_jsonl, same_data, sft, write_jsonl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")
zstandard = pytest.importorskip("zstandard")


def arrow_table(records):
    # pa.array infers the columns of all records (Table.from_pylist and Dataset.from_list: the first one's)
    return pa.Table.from_struct_array(pa.array(records))


def write_parquet(path, records, row_group_size=50):
    pq.write_table(arrow_table(records), path, row_group_size=row_group_size)
    return str(path)


def write_compressed(path, source):
    data = open(source, "rb").read()
    if str(path).endswith(".zst"):
        # two frames: a reader must go on past the first
        half = data.index(b"\n", len(data) // 2) + 1
        c = zstandard.ZstdCompressor()
        data = c.compress(data[:half]) + c.compress(data[half:])
    else:
        data = (gzip.compress if str(path).endswith(".gz") else lzma.compress)(data)
    open(path, "wb").write(data)
    return str(path)


def saved_dataset(path, records):
    import datasets

    datasets.Dataset(datasets.table.InMemoryTable(arrow_table(records))).save_to_disk(str(path))
    return str(path)


def variants(tmp_path, source):
    """The same records as every kind of input qwen-data reads."""
    records = read_jsonl(source)
    split = tmp_path / "folder"
    split.mkdir()
    for i, part in enumerate((records[:40], records[40:41], records[41:])):
        write_jsonl(split / f"part-{i:02d}.jsonl", part)
    return {
        "gz": [write_compressed(tmp_path / "c.jsonl.gz", source)],
        "zst": [write_compressed(tmp_path / "c.jsonl.zst", source)],
        "xz": [write_compressed(tmp_path / "c.jsonl.xz", source)],
        "json array": [_json_array(tmp_path / "c.json", records)],
        "parquet": [write_parquet(tmp_path / "c.parquet", records)],
        "save_to_disk": [saved_dataset(tmp_path / "saved", records)],
        "directory": [str(split)],
        "glob": [str(split / "part-*.jsonl")],
    }


def _json_array(path, records):
    path.write_text(json.dumps(records, ensure_ascii=False), encoding="utf-8")
    return str(path)


def test_every_reader_gives_the_jsonl_bytes_pretrain(tmp_path):
    source = corpus(tmp_path / "c.jsonl", seed=3, documents=300, longest=60)
    reference = pretrain([source], tmp_path / "ref")
    for name, inputs in variants(tmp_path, source).items():
        out = pretrain(inputs, tmp_path / name.replace(" ", "_"), "--chunk-mb", "0.004")
        same_data(reference, out)
        assert manifest(out)["documents"] == 300, name


def test_every_reader_gives_the_jsonl_bytes_sft(tmp_path):
    # alpaca and chat records in one file: in parquet the columns one kind lacks are null
    source = chats(tmp_path / "c.jsonl", seed=4, count=160, longest=30)
    reference = sft([source], tmp_path / "ref", "--seq-length", "512", "--pack")
    for name, inputs in variants(tmp_path, source).items():
        out = sft(inputs, tmp_path / name.replace(" ", "_"), "--seq-length", "512", "--pack", "--chunk-mb", "0.004")
        same_data(reference, out, ("", ".lossmask"))


def test_every_spelling_of_a_readable_name_is_read_and_the_rest_named(tmp_path, capsys):
    """Directories and globs read names in any case, .ndjson, every compression; what they skip (hidden files
    and folders too) is said."""
    import bz2

    source = corpus(tmp_path / "c.jsonl", seed=12, documents=70, longest=20)
    records = read_jsonl(source)
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "a.JSONL", records[:10])
    write_jsonl(folder / "b.ndjson", records[10:20])
    os.rename(write_compressed(folder / "c.jsonl.gz", write_jsonl(tmp_path / "c", records[20:30])), folder / "c.jsonl.GZ")
    (folder / "d.Jsonl.bz2").write_bytes(bz2.compress(open(write_jsonl(tmp_path / "d", records[30:40]), "rb").read()))
    write_compressed(folder / "e.ndjson.zst", write_jsonl(tmp_path / "e", records[40:50]))
    _json_array(folder / "f.JSON", records[50:55])
    (folder / "g.json.xz").write_bytes(lzma.compress(json.dumps(records[55:60]).encode()))
    write_parquet(folder / "h.Parquet", records[60:70])
    for name in ("README.md", ".part.jsonl", "i.parquet.gz"):
        (folder / name).write_text("not read")
    (folder / ".cache").mkdir()
    write_jsonl(folder / ".cache" / "j.jsonl", records[:5])  # a tool's own copy
    reference = pretrain([source], tmp_path / "ref")
    capsys.readouterr()
    for n, inputs in enumerate(([folder], [f"{folder}/*"])):
        same_data(reference, pretrain(inputs, tmp_path / f"out{n}"))
        err = capsys.readouterr().err
        assert "README.md" in err and "i.parquet.gz" in err and "skipped" in err, err
        assert (".part.jsonl" in err) == (".cache/" in err) == (inputs == [folder])  # a glob's * matches no hidden name


def test_json_array_elements_are_what_json_loads_reads(tmp_path):
    """The .json splitter, fed in pieces of every small size, against json.loads on strings full of
    brackets, commas, quotes and escapes, nested values, indented or not; broken arrays refused."""
    import io

    from qwen_data.inputs.json_array import NotAnArray, json_array_elements

    rng = random.Random(13)
    atoms = ["", "a", "]", "[", ",", "{", "}", '"', "\\", '\\"', "é", "数据", "\n", "\u2028", "\U0001F600"]

    def value(depth=0):
        r = rng.random()
        if depth > 3 or r < 0.4:
            return "".join(rng.choice(atoms) for _ in range(rng.randint(0, 6)))
        if r < 0.6:
            return [value(depth + 1) for _ in range(rng.randint(0, 3))]
        if r < 0.8:
            return {value(9): value(depth + 1) for _ in range(rng.randint(0, 3))}
        return rng.choice([1, -2.5e10, True, None, False])

    for _ in range(200):
        text = json.dumps([value() for _ in range(rng.randint(0, 6))], ensure_ascii=rng.random() < 0.5,
                          indent=rng.choice([None, 2]))
        for block in (1, 2, 3, 7, 64):
            elements = list(json_array_elements(io.BytesIO(text.encode()).read, block))
            assert [json.loads(e) for e in elements] == json.loads(text) and all(b"\n" not in e for e in elements)
    for broken in (b"", b"{}", b'"x"', b"[1,]", b"[,1]", b"[1,,2]", b"[1", b'["ab', b"[1] x", b"[1]]", b"[}", b"[1] [2]"):
        for block in (1, 64):
            with pytest.raises(NotAnArray):
                list(json_array_elements(io.BytesIO(broken).read, block))


def test_json_array_streams_and_its_bad_elements_are_rejects(tmp_path):
    from qwen_data.inputs.files import expand
    from qwen_data.inputs.readers import read_chunks

    records = [{"text": f"document {i} " * 20} for i in range(2000)]
    path = _json_array(tmp_path / "big.json", records)
    first = next(read_chunks(expand([path]), chunk_bytes=1 << 14))
    assert first.input_bytes < os.path.getsize(path) / 4, "the whole file was read for the first chunk"
    (tmp_path / "mixed.json").write_text('[{"text": "a"},\n {"text": tru}, 5, {"text": "b"}]')
    out = pretrain([tmp_path / "mixed.json"], tmp_path / "out")
    assert manifest(out)["documents"] == 2
    assert [(r["record"], r["reason"]) for r in read_jsonl(f"{out}.rejects.jsonl")] == [(2, "invalid-json"),
                                                                                       (3, "not-an-object")]


def test_standard_input(tmp_path):
    source = corpus(tmp_path / "c.jsonl", seed=5, documents=50, longest=30)
    reference = pretrain([source], tmp_path / "ref")
    with open(source, "rb") as f:
        subprocess.run([sys.executable, "-m", "qwen_data.cli", "pretrain", "-", "-o", str(tmp_path / "stdin"),
                        "--quiet", "--workers", "1"], stdin=f, check=True, cwd=REPO_ROOT, capture_output=True)
    same_data(reference, tmp_path / "stdin")
    assert manifest(tmp_path / "stdin")["inputs"] == [{"path": "-", "bytes": 0}]


@pytest.mark.slow  # imports `datasets` and builds its dataset builder: ~6 s
def test_a_dataset_in_the_hub_cache_by_name(tmp_path):
    """hf:NAME reads the files `huggingface-cli download --repo-type dataset NAME` left in the cache."""
    source = corpus(tmp_path / "c.jsonl", seed=6, documents=120, longest=30)
    records = read_jsonl(source)
    reference = pretrain([source], tmp_path / "ref")
    repo = tmp_path / "home" / "hub" / "datasets--acme--web"
    snapshot = repo / "snapshots" / ("a" * 40) / "data"
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    write_parquet(snapshot / "train-00000-of-00002.parquet", records[:70])
    write_parquet(snapshot / "train-00001-of-00002.parquet", records[70:])
    write_parquet(snapshot / "validation-00000-of-00001.parquet", records[:5])
    env = {**os.environ, "HF_HOME": str(tmp_path / "home")}
    command = [sys.executable, "-m", "qwen_data.cli", "pretrain", "--quiet", "--workers", "1"]
    subprocess.run(command + ["hf:acme/web", "-o", str(tmp_path / "hub")], env=env, check=True, cwd=REPO_ROOT)
    same_data(reference, tmp_path / "hub")
    subprocess.run(command + ["hf:acme/web", "--hf-split", "validation", "-o", str(tmp_path / "valid")], env=env,
                   check=True, cwd=REPO_ROOT)
    assert manifest(tmp_path / "valid")["documents"] == 5
    missing = subprocess.run(command + ["hf:acme/nothing", "-o", str(tmp_path / "x")], env=env, cwd=REPO_ROOT,
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "not in the local Hugging Face cache" in missing.stderr


def test_a_dataset_dict_split_that_is_not_there_is_named_with_those_there(tmp_path, capsys):
    import datasets

    from qwen_data.cli import main

    split = datasets.Dataset(datasets.table.InMemoryTable(arrow_table([{"text": "a"}])))
    datasets.DatasetDict({"train": split, "test": split}).save_to_disk(str(tmp_path / "dd"))
    capsys.readouterr()
    for args, says in ((["--hf-split", "validation"], "no split 'validation' in this datasets DatasetDict (its splits: "
                                                      "train, test): choose one with --hf-split"),
                       ([], "a datasets DatasetDict (its splits: train, test): choose one with --hf-split")):
        assert main(["pretrain", "--quiet", str(tmp_path / "dd"), *args, "-o", str(tmp_path / "out")]) == 2
        assert says in capsys.readouterr().err
    assert manifest(pretrain([tmp_path / "dd"], tmp_path / "test", "--hf-split", "test"))["documents"] == 1


def test_parquet_rejects_name_the_row_group_and_row(tmp_path):
    from qwen_data.cli import main

    records = [{"text": f"document {i}"} for i in range(30)]
    records[23]["text"] = "   "
    path = write_parquet(tmp_path / "c.parquet", records, row_group_size=10)
    assert main(["pretrain", "--quiet", "--workers", "1", path, "-o", str(tmp_path / "out")]) == 0
    (reject,) = read_jsonl(tmp_path / "out.rejects.jsonl")
    assert (reject["file"], reject["record"], reject["row_group"], reject["row_in_group"]) == (path, 24, 2, 3)
    assert reject["reason"] == "empty-text" and json.loads(reject["raw"]) == {"text": "   "}


@pytest.mark.parametrize("name, says", [("cut.jsonl.zst", "ends early"), ("cut.jsonl.xz", "ends early"),
                                        ("bad.parquet", "not readable as parquet")])
def test_broken_compressed_and_parquet_files_are_named(tmp_path, capsys, name, says):
    from qwen_data.cli import main

    source = corpus(tmp_path / "c.jsonl", seed=7, documents=2000, longest=40)
    whole = write_compressed(tmp_path / ("whole" + name[3:]), source) if not name.endswith(".parquet") else None
    data = open(whole, "rb").read() if whole else b"PAR1 this is not parquet PAR1"
    (tmp_path / name).write_bytes(data[: len(data) // 2] if whole else data)
    assert main(["pretrain", "--quiet", "--workers", "1", str(tmp_path / name), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert str(tmp_path / name) in err and says in err, err
    assert not os.path.exists(tmp_path / "out.json")


def write_arrow(path, records):
    table = arrow_table(records)
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=7)
    return str(path)


def every_kind(tmp_path, name, records):
    """`records` as a file (or folder) of each kind of input, `name`: the start of its name."""
    return [write_jsonl(tmp_path / f"{name}.jsonl", records), _json_array(tmp_path / f"{name}.json", records),
            write_parquet(tmp_path / f"{name}.parquet", records, 10), write_arrow(tmp_path / f"{name}.arrow", records),
            saved_dataset(tmp_path / f"{name}_saved", records)]


def rejects_by_file(prefix):
    by_file = {}
    for entry in read_jsonl(f"{prefix}.rejects.jsonl"):
        by_file[entry["file"]] = by_file.get(entry["file"], 0) + 1
    return by_file


def test_every_record_read_is_written_or_rejected_pretrain(tmp_path):
    """Files of every kind that lack the text column (a table of no column once read) or lack it in
    some records: each record is a document or a reject naming it, in workers and in this process."""
    from qwen_data.run import pipeline
    from qwen_data.steps.pretrain import PretrainConfig, Tokenize

    mixed = [{"text": f"doc {i}"} if i % 3 else {"body": f"other {i}"} for i in range(25)]
    lacking = [{"body": f"no text {i}"} for i in range(23)]
    inputs = every_kind(tmp_path, "mixed", mixed) + every_kind(tmp_path, "lacking", lacking)
    written = sum("text" in r for r in mixed) * 5
    in_workers = pretrain(inputs, tmp_path / "workers", "--chunk-mb", "0.0001")
    pipeline.run(Tokenize(PretrainConfig(inputs=inputs, output_prefix=str(tmp_path / "here"), workers=0, quiet=True)))
    for out in (in_workers, tmp_path / "here"):
        m = manifest(out)
        assert (m["documents"], m["rejects"]["count"]) == (written, 5 * (25 + 23) - written), out
        by_file = rejects_by_file(out)
        for path in inputs:
            expected = 23 if "lacking" in path else 25 - sum("text" in r for r in mixed)
            assert sum(n for f, n in by_file.items() if f == path or f.startswith(path + "/")) == expected, (out, path)
        for entry in read_jsonl(f"{out}.rejects.jsonl"):
            row = not entry["file"].endswith((".jsonl", ".json"))  # parquet, Arrow: say column
            assert (entry["reason"], entry["message"]) == ("missing-key", "no 'text' column, or null in it" if row
                                                           else "no 'text' key"), entry


def test_every_record_read_is_written_or_rejected_sft(tmp_path):
    """SFT reads only the columns a dataset_info entry maps: a file lacking them is all rejects."""
    good = [{"q": f"question {i}", "a": f"answer {i}"} for i in range(12)]
    lacking = [{"prompt": f"question {i}", "answer": f"answer {i}"} for i in range(9)]
    inputs = every_kind(tmp_path, "good", good) + every_kind(tmp_path, "lacking", lacking)
    info = tmp_path / "dataset_info.json"
    info.write_text(json.dumps({"qa": {"file_name": "good.jsonl", "columns": {"prompt": "q", "response": "a"}}}))
    out = sft(inputs, tmp_path / "out", "--dataset-info", f"{info}:qa")
    m = manifest(out)
    assert (m["documents"], m["rejects"]["count"]) == (5 * 12, 5 * 9)
    assert sum(n for f, n in rejects_by_file(out).items() if "lacking" in f) == 5 * 9


# -- shards and merge ------------------------------------------------------------------------------
def mixed_inputs(tmp_path, make):
    """One corpus as three inputs of different kinds: a jsonl file, a parquet file of several row
    groups, a gzip file; shard boundaries fall inside the first two."""
    records = read_jsonl(make(tmp_path / "all.jsonl"))
    records.insert(17, "{not json")
    third = len(records) // 3
    return [write_jsonl(tmp_path / "a.jsonl", records[:third]),
            write_parquet(tmp_path / "b.parquet", [r for r in records[third:2 * third] if isinstance(r, dict)], 20),
            write_jsonl(tmp_path / "c.jsonl.gz", records[2 * third:])]


def run_sharded(tmp_path, run, inputs, n, extra):
    from qwen_data.cli import main

    shards = [run(inputs, tmp_path / f"shard{k}of{n}", "--shard", f"{k}/{n}", *extra) for k in range(n)]
    random.Random(n).shuffle(shards)  # merge puts shards in order itself
    assert main(["merge", "--quiet", *shards, "-o", str(tmp_path / f"merged{n}")]) == 0
    return tmp_path / f"merged{n}"


@pytest.mark.parametrize("kind", ["pretrain", "sft", "sft packed", "sft packed in windows"])
def test_shards_merged_equal_one_run(tmp_path, monkeypatch, kind):
    if kind == "sft packed in windows":  # rows written window by window as the run goes: a few rows a window
        monkeypatch.setattr("qwen_data.formats.packing.PACK_WINDOW", 700)
    if kind == "pretrain":
        inputs = mixed_inputs(tmp_path, lambda p: corpus(p, seed=8, documents=240, longest=40))
        run, extra, channels = pretrain, [], ("",)
    else:
        inputs = mixed_inputs(tmp_path, lambda p: chats(p, seed=9, count=150, longest=25))
        run, channels = sft, ("", ".lossmask")
        extra = ["--seq-length", "300"] + (["--pack"] if kind.startswith("sft packed") else [])
    one = run(inputs, tmp_path / "one", *extra)
    if kind == "sft packed in windows":  # and any workers and chunks give the same rows
        same_data(one, run(inputs, tmp_path / "two", *extra, "--workers", "2", "--chunk-mb", "0.002"), channels)
    for n in (1, 3, 7):
        merged = run_sharded(tmp_path, run, inputs, n, extra)
        same_data(one, merged, channels)
        a, b = manifest(one), manifest(merged)
        for field in ("documents", "sequences", "tokens", "rejects", "inputs", "sft", "special_token_records"):
            assert a.get(field) == b.get(field), (n, field)
        assert open(f"{one}.rejects.jsonl").read() == open(f"{merged}.rejects.jsonl").read()
    shard = manifest(tmp_path / "shard2of3")
    assert shard["shard"] == {"index": 2, "count": 3} and "shard" not in manifest(merged)
    if kind.startswith("sft packed"):
        assert shard["sft"]["packed"] is False and shard["sft"]["pack_on_merge"] is True


def test_shards_of_byte_spans_merge_into_one_run_and_a_gap_is_refused(tmp_path, capsys):
    """The Ray executor's parts (`run.ray.cuts`: the last ones smaller) are shards given as spans of the
    inputs' bytes: merged, one run's bytes; spans leaving bytes out (or taking them twice) are refused."""
    from qwen_data.cli import main
    from qwen_data.inputs.files import Shard
    from qwen_data.run import pipeline
    from qwen_data.run.ray import cuts
    from qwen_data.steps.pretrain import PretrainConfig, Tokenize

    inputs = mixed_inputs(tmp_path, lambda p: corpus(p, seed=12, documents=300, longest=40))
    one = pretrain(inputs, tmp_path / "one")
    total = sum(os.path.getsize(p) for p in inputs)
    at = cuts(total, 2, 7)
    assert len(at) == 8 and at[0] == 0 and at[-1] == total and cuts(total, 3, 8) is None
    sizes = [b - a for a, b in zip(at, at[1:])]
    # the last round a quarter of the first parts' size, the parts before it shrinking by half (1 - 1/tasks)
    assert all(abs(s - 4 * sizes[-1]) <= 4 for s in sizes[:4]) and abs(sizes[4] - 2 * sizes[-1]) <= 4, sizes
    assert abs(sizes[5] - sizes[6]) <= 1, sizes

    def shard(k, spans, name):
        config = PretrainConfig(inputs=inputs, output_prefix=str(tmp_path / f"{name}{k}"), quiet=True,
                                shard=Shard(k, len(spans), span=spans[k]))
        pipeline.run(Tokenize(config))
        return config.output_prefix

    parts = [shard(k, list(zip(at, at[1:])), "p") for k in range(7)]
    assert manifest(parts[6])["shard"] == {"index": 6, "count": 7, "span": [at[6], at[7]]}
    assert main(["merge", "--quiet", *reversed(parts), "-o", str(tmp_path / "merged")]) == 0
    same_data(one, tmp_path / "merged", ("",))
    assert manifest(one)["documents"] == manifest(tmp_path / "merged")["documents"]
    gap = [(0, at[1]), (at[1], at[2]), (at[2] + 100, total)]
    holed = [shard(k, gap, "g") for k in range(3)]
    assert main(["merge", "--quiet", *holed, "-o", str(tmp_path / "m")]) == 2
    assert "do not start where the shard before it stopped" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "m.json")


def test_merge_refuses_what_would_not_be_one_run(tmp_path, capsys):
    from qwen_data.cli import main

    source = corpus(tmp_path / "c.jsonl", seed=10, documents=60, longest=20)
    s0, s1, s2 = (pretrain([source], tmp_path / f"s{k}", "--shard", f"{k}/3") for k in range(3))
    other = pretrain([source], tmp_path / "other", "--shard", "1/3", "--eod-token", "<|im_end|>")
    packed = sft([chats(tmp_path / "chats.jsonl", seed=1, count=20, longest=10)], tmp_path / "packed",
                 "--seq-length", "256", "--pack")
    cases = [([s0, s2], "each of 0/3 .. 2/3 exactly once"), ([s0, s1, s1, s2], "exactly once"),
             ([s0, other, s2], "made differently: eod_id"), ([packed, packed], "is packed"),
             ([s0, s1, s2, pretrain([source], tmp_path / "whole")], "is not a shard")]
    for prefixes, says in cases:
        assert main(["merge", "--quiet", *prefixes, "-o", str(tmp_path / "m")]) == 2
        err = capsys.readouterr().err
        assert says in err, err
        assert not os.path.exists(tmp_path / "m.json")


# -- LLaMA-Factory dataset_info.json ---------------------------------------------------------------
def test_dataset_info_entries_read_without_conversion(tmp_path):
    """An alpaca entry with its own column names and a sharegpt entry with its own tags give the
    bytes their canonical records give."""
    rng = random.Random(11)
    words = "river stone light cloud 数据 garden".split()

    def text(n):
        return " ".join(rng.choice(words) for _ in range(rng.randint(1, n)))

    alpaca = [{"instruction": text(8), "input": text(4) if i % 2 else "", "output": text(12),
               "system": text(5), "history": [[text(4), text(4)]] if i % 3 == 0 else []} for i in range(30)]
    sharegpt = [{"conversations": [{"from": "system", "value": text(5)}] * (i % 2) + [
        {"from": "human", "value": text(6)}, {"from": "gpt", "value": text(9)},
        {"from": "human", "value": text(6)}, {"from": "gpt", "value": text(9)}]} for i in range(30)]
    data = tmp_path / "data"
    data.mkdir()
    write_jsonl(data / "qa.jsonl", [{"question": r["instruction"], "context": r["input"], "answer": r["output"],
                                    "sys_prompt": r["system"], "past": r["history"], "system": "ignored: unmapped"}
                                   for r in alpaca])
    tags = {"human": "user", "gpt": "bot", "system": "sys"}
    write_jsonl(data / "dialogs.jsonl", [{"dialog": [{"role": tags[m["from"]], "text": m["value"]}
                                                     for m in r["conversations"]]} for r in sharegpt])
    (data / "dataset_info.json").write_text(json.dumps({
        "qa": {"file_name": "qa.jsonl", "columns": {"prompt": "question", "query": "context", "response": "answer",
                                                    "system": "sys_prompt", "history": "past"}},
        "dialogs": {"file_name": "dialogs.jsonl", "formatting": "sharegpt", "columns": {"messages": "dialog"},
                    "tags": {"role_tag": "role", "content_tag": "text", "user_tag": "user",
                             "assistant_tag": "bot", "system_tag": "sys"}},
    }))
    for name, records in (("qa", alpaca), ("dialogs", sharegpt)):
        reference = sft([write_jsonl(tmp_path / f"{name}.jsonl", records)], tmp_path / f"{name}_ref")
        out = sft([], tmp_path / name, "--dataset-info", f"{data / 'dataset_info.json'}:{name}")
        same_data(reference, out, ("", ".lossmask"))
        assert manifest(out)["documents"] == 30
    # --columns renames only what it names
    renamed = write_jsonl(tmp_path / "renamed.jsonl", [{"prompt": r["instruction"], "input": r["input"],
                                                       "answer": r["output"]} for r in alpaca])
    plain = sft([write_jsonl(tmp_path / "plain.jsonl", [{k: r[k] for k in ("instruction", "input", "output")}
                                                        for r in alpaca])], tmp_path / "plain")
    same_data(plain, sft([renamed], tmp_path / "cols", "--columns", "instruction=prompt,output=answer"),
              ("", ".lossmask"))
    shutil.rmtree(data)


def test_spans_hold_each_line_once_where_it_starts(tmp_path, monkeypatch):
    """A plain jsonl file's spans (`Chunk._read_span`): the lines starting in each, whole, so the spans
    together give every line once, in order; lines longer than many spans and scanned in small blocks
    included."""
    from qwen_data.inputs import chunks

    monkeypatch.setattr(chunks, "SKIP_BLOCK", 3)
    rng, path = random.Random(7), tmp_path / "lines.jsonl"
    for trial in range(400):
        data = bytes(rng.choice(b"ab\n" if trial % 2 else b"abcdefgh\n") for _ in range(rng.randint(0, 80)))
        path.write_bytes(data)
        cuts = sorted({0, len(data), *(rng.randint(0, len(data)) for _ in range(rng.randint(0, 6)))})
        starts = [0] + [k + 1 for k, byte in enumerate(data) if byte == ord("\n") and k + 1 < len(data)]
        for a, b in zip(cuts, cuts[1:]):
            chunk = chunks.Chunk(path=str(path), first=None)
            chunk.span, chunk.file_size = (a, b), len(data)
            mine = [s for s in starts if a <= s < b]
            expected = data[mine[0]:next((s for s in starts if s >= b), len(data))] if mine else b""
            assert chunk._read_span() == expected, (data, a, b)


def test_native_lines_split_as_bytes_split_does():
    """A chunk's lines are cut by `_native.lines` (memchr): the pieces bytes.split(b"\\n") gives, empty ones and
    the last included, whatever bytes surround the newlines."""
    from qwen_data._native import lines

    rng = random.Random(5)
    cases = [b"", b"\n", b"a", b"a\n", b"\n\n", b"ab\r\ncd", bytes(range(256)) * 3]
    cases += [bytes(rng.choice(b"ab\n\r\x00\xff") for _ in range(rng.randrange(300))) for _ in range(500)]
    for data in cases:
        assert lines(data) == data.split(b"\n"), data
    assert lines(memoryview(b"x\ny")) == [b"x", b"y"]


def test_a_plain_jsonl_files_records_are_estimated_from_all_of_it(tmp_path, monkeypatch):
    """The certificate sizes its sample by `estimated_records`: a file whose first MiB holds short records and the
    rest long ones (sorted, say) is counted (a small one) or estimated from reads spread over it (a large one),
    not from its start (which counted ~9x the records here: the sample would have checked a ninth of the
    3,000 it is sized for)."""
    from qwen_data.inputs import readers
    from qwen_data.inputs.files import expand
    from qwen_data.inputs.readers import estimated_records

    path = tmp_path / "sorted.jsonl"
    with open(path, "w") as f:
        for k in range(40_000):
            f.write(json.dumps({"text": "x" * 20}) + "\n")  # ~1.2 MB of short records
        for k in range(12_000):
            f.write(json.dumps({"text": "y" * 800}) + "\n")  # ~9.8 MB of long ones
    actual = 52_000
    assert estimated_records(expand([str(path)])[0]) == actual
    with open(path, "a") as f:
        f.write('{"text": "a last line without its newline"}')
    assert estimated_records(expand([str(path)])[0]) == actual + 1
    (tmp_path / "empty.jsonl").write_bytes(b"")  # counted as one: never the unknown size of standard input
    assert estimated_records(expand([str(tmp_path / "empty.jsonl")])[0]) == 1
    monkeypatch.setattr(readers, "COUNTED_BYTES", 1 << 20)  # as a file past it is read
    assert 0.9 * actual <= estimated_records(expand([str(path)])[0]) <= 1.1 * actual


def test_a_part_s_first_line_is_numbered_by_the_newlines_before_it(tmp_path):
    """`_native.newlines` (what `--shard` and Ray count to number a part's first line) against bytes.count, over
    ranges that start and end anywhere, cross its buffer's size, and run past the file's end; and `_seek_line`
    at every byte of a small file."""
    from qwen_data._native import newlines
    from qwen_data.inputs.jsonl import _seek_line

    rng = random.Random(3)
    data = bytes(rng.choice(b"ab\n\r{}") for _ in range(3 << 20))
    path = tmp_path / "lines.jsonl"
    path.write_bytes(data)
    with open(path, "rb") as f:
        for _ in range(200):
            start = rng.randrange(len(data) + 1)
            stop = rng.choice([start + rng.randrange(40), rng.randrange(start, len(data) + 10), len(data) + 5])
            assert newlines(f.fileno(), start, stop) == data.count(b"\n", start, stop), (start, stop)
        assert newlines(f.fileno(), 5, 5) == 0 and newlines(f.fileno(), 7, 3) == 0
    small = b'{"text": "a"}\n\n{"text": "bc"}\n{"text": "d"}\n'
    (tmp_path / "small.jsonl").write_bytes(small)
    with open(tmp_path / "small.jsonl", "rb") as f:
        for start in range(1, len(small) + 1):
            number = _seek_line(f, start)
            first = small.index(b"\n", start - 1) + 1  # the first line that begins at or after `start`
            assert (number, f.tell()) == (small.count(b"\n", 0, first) + 1, first), start
    with pytest.raises(OSError):
        newlines(-1, 0, 10)


def test_a_shard_told_the_newlines_before_it_numbers_its_lines_as_one_that_counts_them(tmp_path):
    """`Shard.newlines_before` (counted for it by the Ray executor, `counted_until` saying up to where) gives
    every shard of a run over several files the line numbers of a shard that counts the newlines itself; a
    count that is off shifts them (so the count told is the one used)."""
    from qwen_data.inputs.files import Shard, expand
    from qwen_data.inputs.readers import counted_until, read_chunks

    rng = random.Random(5)
    paths = []
    for name in "ab":
        lines = [json.dumps({"text": "x" * rng.randrange(1, 300)}) for _ in range(400)]
        paths.append(str(tmp_path / f"{name}.jsonl"))
        with open(paths[-1], "w") as f:
            f.write("\n".join(lines) + "\n")
    sources = expand(paths)

    def firsts(shard):
        return [(c.path, c.first, c.span) for c in read_chunks(sources, 4096, shard)]

    for count in (1, 2, 7):
        for k in range(count):
            where = counted_until(sources, Shard(k, count))
            if where is None:  # (only the first shard starts at a file's start here)
                assert k == 0
                continue
            path, end = where
            with open(path, "rb") as f:
                before = f.read(end).count(b"\n")
            assert firsts(Shard(k, count, newlines_before=before)) == firsts(Shard(k, count))
            shifted = firsts(Shard(k, count, newlines_before=before + 3))
            assert shifted[0][1] == firsts(Shard(k, count))[0][1] + 3
