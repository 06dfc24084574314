"""Inputs a hostile user gives: nested Arrow values that must equal their jsonl, Arrow's IPC file
format, directories with links, FIFOs and saved datasets, records nested beyond the parser's
recursion, lines far longer than a chunk, and files that change while they are read."""

import json
import os
import re
import subprocess
import sys

import pytest
from _helpers import corpus, manifest, pretrain, read_jsonl, same_data, sft, write_jsonl

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def arrow_table(records):
    # pa.array unifies the struct fields of all records: a key one record has, every other row gets as null
    return pa.Table.from_struct_array(pa.array(records))


def write_arrow(path, records, file_format=False):
    table = arrow_table(records)
    new = pa.ipc.new_file if file_format else pa.ipc.new_stream
    with new(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=2)
    return str(path)


def cli(*args, timeout=120):
    """qwen-data in its own process: a run that would block is ended, not waited on forever."""
    return subprocess.run([sys.executable, "-m", "qwen_data.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def tool_chats():
    """Tool schemas and tool-call arguments whose keys differ from record to record (each record's
    keys in the order the unified schema gives them: first seen first)."""
    weather = {"type": "function", "function": {
        "name": "weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
    clock = {"type": "function", "function": {
        "name": "clock",
        "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "where"},
                                                        "zone": {"type": "string"}}}}}

    def chat(tools, name, arguments, answer):
        return {"tools": tools, "messages": [
            {"role": "user", "content": f"Ask {name}"},
            {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                "name": name, "arguments": arguments}}]},
            {"role": "tool", "content": answer},
            {"role": "assistant", "content": f"It says {answer}."}]}

    return [chat([weather], "weather", {"city": "Paris"}, "sunny"),
            chat([clock], "clock", {"city": "Oslo", "units": "24h"}, "noon"),
            chat([weather, clock], "weather", {"days": 3}, "rain"),
            {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}]


def test_nested_arrow_values_equal_their_jsonl(tmp_path):
    """Parquet and Arrow (stream and file format) give the SFT ids and mask the jsonl of the same
    records gives: nulls Arrow added to structs for keys other rows have are not rendered."""
    records = tool_chats()
    reference = sft([write_jsonl(tmp_path / "c.jsonl", records)], tmp_path / "ref")
    pq.write_table(arrow_table(records), tmp_path / "c.parquet", row_group_size=2)
    inputs = {"parquet": tmp_path / "c.parquet", "stream": write_arrow(tmp_path / "s.arrow", records),
              "file": write_arrow(tmp_path / "f.arrow", records, file_format=True)}
    for name, path in inputs.items():
        out = sft([path], tmp_path / name)
        same_data(reference, out, ("", ".lossmask"))
        assert manifest(out)["documents"] == len(records), name


def test_arrow_ipc_file_format_and_feather_are_read(tmp_path):
    import pyarrow.feather as feather

    source = corpus(tmp_path / "c.jsonl", seed=5, documents=40, longest=20)
    records = read_jsonl(source)
    reference = pretrain([source], tmp_path / "ref")
    feather.write_feather(arrow_table(records), str(tmp_path / "c.feather"))  # Feather v2: the IPC file format
    for path in (write_arrow(tmp_path / "c.arrow", records, file_format=True), tmp_path / "c.feather"):
        out = pretrain([path], tmp_path / os.path.basename(path).replace(".", "_"), "--chunk-mb", "0.001")
        same_data(reference, out)


def test_directories_follow_links_skip_what_is_no_file_and_read_saved_datasets(tmp_path):
    """A linked folder is read (a link back up is not followed twice), a FIFO or socket is named and
    never opened, a save_to_disk folder is read as the dataset it is, as when given alone."""
    import socket

    import datasets

    records = read_jsonl(corpus(tmp_path / "c.jsonl", seed=9, documents=30, longest=20))
    outside = tmp_path / "outside"
    outside.mkdir()
    write_jsonl(outside / "b.jsonl", records[10:20])
    folder = tmp_path / "in"
    folder.mkdir()
    write_jsonl(folder / "a.jsonl", records[:10])
    os.symlink(outside, folder / "b_linked")
    os.symlink(folder, outside / "loop")  # in -> b_linked -> loop -> in
    datasets.Dataset(datasets.table.InMemoryTable(arrow_table(records[20:]))).save_to_disk(str(folder / "c_saved"))
    os.mkfifo(folder / "d.jsonl")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "e.jsonl"))
    reference = pretrain([write_jsonl(tmp_path / "all.jsonl", records)], tmp_path / "ref")
    try:
        run = cli("pretrain", "--quiet", "--workers", "1", folder, "-o", tmp_path / "out")
        assert run.returncode == 0, run.stderr
        same_data(reference, tmp_path / "out")
        assert f"{folder}/d.jsonl" in run.stderr and f"{folder}/e.jsonl" in run.stderr, run.stderr
        assert f"{folder}/b_linked/loop/" in run.stderr and "reached again through a link" in run.stderr, run.stderr
        given = cli("pretrain", "--quiet", folder / "d.jsonl", "-o", tmp_path / "fifo")
        assert given.returncode == 2 and f"{folder}/d.jsonl: not a regular file" in given.stderr, given.stderr
    finally:
        server.close()


def deep(levels):
    return "[" * levels + "]" * levels


def test_records_nested_beyond_recursion_are_rejects(tmp_path):
    """However deep a record (or a JSON string in it) is nested, it is one reject naming its line,
    in every reader and step; the run goes on."""
    from qwen_data.cli import main

    texts = [{"text": "first"}, {"text": "second"}]
    lines = [json.dumps(texts[0]), '{"text": "deep", "x": ' + deep(5000) + "}",
             '{"text": "deeper than orjson", "x": ' + deep(1500) + "}", json.dumps(texts[1])]
    chats = [{"instruction": "a", "output": "b"}, {"instruction": "c", "output": "d"}]
    chat_lines = [json.dumps(chats[0]), '{"instruction": "x", "output": "y", "z": ' + deep(5000) + "}",
                  json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                              "tools": deep(5000)}),
                  json.dumps({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
                              "tool_calls": [{"function": {"name": "f", "arguments": deep(5000)}}]}]}),
                  # read by orjson (1,000 levels), too deep for the code that walks and renders it
                  '{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", '
                  '"tool_calls": [{"function": {"name": "f", "arguments": ' + '{"a": ' * 1000 + "1" + "}" * 1000
                  + "}}]}]}",
                  json.dumps(chats[1])]
    for step, kept, rows in (("pretrain", texts, lines), ("sft", chats, chat_lines)):
        for name in ("c.jsonl", "c.json"):
            path = tmp_path / f"{step}_{name}"
            path.write_text("\n".join(rows) + "\n" if name.endswith("l") else "[" + ",\n".join(rows) + "]")
            out = tmp_path / f"{step}_{name.replace('.', '_')}"
            assert main([step, "--quiet", "--workers", "1", str(path), "-o", str(out),
                         *(["--parse-tool-arguments"] if step == "sft" else [])]) == 0
            rejects = read_jsonl(f"{out}.rejects.jsonl")
            assert [(r["file"], r["record"], r["reason"]) for r in rejects] == [
                (str(path), n, "too-deep") for n in range(2, len(rows))], rejects
            assert manifest(out)["documents"] == len(kept)


def test_a_line_far_longer_than_a_chunk_reads_in_linear_time(tmp_path):
    """A complexity guard, not a benchmark: a 20 MB line read in 1 KB blocks is ~20,000 blocks;
    joining and searching all that was read at every block took minutes, reading it once is far
    under a second. The generous limit stands for 'not quadratic'."""
    long = {"text": "x" * (20 << 20)}
    for name, write in (("long.jsonl", lambda p: write_jsonl(p, [long, {"text": "after"}])),
                        ("long.json", lambda p: p.write_text(json.dumps([long, {"text": "after"}])))):
        path = tmp_path / name
        write(path)
        script = ("import sys; from qwen_data.inputs.files import expand; from qwen_data.inputs.readers import read_chunks; "
                  "print(sum(1 for c in read_chunks(expand([sys.argv[1]]), 1024) for r in c.records() "
                  "if r.value is not None))")
        try:
            run = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True, text=True,
                                 timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{name}: a 20 MB line in 1 KB chunks was not read in 30 s")
        assert run.returncode == 0 and run.stdout.split() == ["2"], run.stderr


@pytest.mark.parametrize("name", ["c.jsonl", "c.jsonl.gz", "c.json", "c.parquet", "c.arrow"])
def test_an_input_that_changes_while_read_stops_the_run(tmp_path, name):
    """Cut short (at a record's end, so what is left still reads as valid) after its first chunk was
    read, or grown before it is read: an error naming the file, never a run on part of it."""
    import gzip

    from qwen_data.errors import InputFileError
    from qwen_data.inputs.files import expand
    from qwen_data.inputs.readers import read_chunks

    records = read_jsonl(corpus(tmp_path / "src.jsonl", seed=2, documents=3000, longest=30))
    path = tmp_path / name
    if name == "c.jsonl":
        write_jsonl(path, records)
    elif name == "c.jsonl.gz":  # one gzip member per 1000 records: a cut between two leaves valid gzip
        path.write_bytes(b"".join(gzip.compress("".join(json.dumps(r) + "\n" for r in records[i:i + 1000]).encode())
                                  for i in range(0, 3000, 1000)))
    elif name == "c.json":
        path.write_text(json.dumps(records))
    elif name == "c.parquet":
        pq.write_table(arrow_table(records), path, row_group_size=500)
    else:
        write_arrow(path, records)
    whole = path.read_bytes()
    if name == "c.jsonl.gz":
        cut = len(gzip.compress("".join(json.dumps(r) + "\n" for r in records[:1000]).encode()))
    elif name == "c.json":
        cut = len(json.dumps(records[:1000])) - 1
        whole = whole[:cut] + b"]"  # still an array, of the first 1000 records
        cut = len(whole)
    else:
        cut = len(whole) // 3
        cut = whole.index(b"\n", cut) + 1 if name == "c.jsonl" else cut
    path.write_bytes(json.dumps(records).encode() if name == "c.json" else whole)

    sources = expand([str(path)])
    chunks = read_chunks(sources, 1 << 12)
    next(chunks)
    with open(path, "r+b") as f:  # cut in place, as a writer truncating it does
        if name == "c.json":
            f.write(whole)
        f.truncate(cut)
    with pytest.raises(InputFileError, match=re.escape(str(path))):
        list(chunks)

    sources = expand([str(path)])
    with open(path, "ab") as f:
        f.write(b"\n")
    with pytest.raises(InputFileError, match=re.escape(f"{path}: changed while it was read")):
        list(read_chunks(sources, 1 << 12))


def corrupt_columnar(path, kind):
    """A parquet file whose second row group's data page has bytes flipped (its snappy data no longer
    decodes), or an Arrow stream or file cut in the middle of a record batch."""
    records = [{"text": f"record {i} " * 20} for i in range(2000)]
    if kind == "parquet":
        pq.write_table(arrow_table(records), path, row_group_size=500, compression="snappy")
        column = pq.ParquetFile(path).metadata.row_group(1).column(0)
        start = column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset
        middle = start + column.total_compressed_size // 2
        data = bytearray(path.read_bytes())
        data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
        path.write_bytes(bytes(data))
    else:
        path.write_bytes(open(write_arrow(path, records, file_format=kind == "arrow-file"), "rb").read()[:30000])


@pytest.mark.parametrize("kind", ["parquet", "arrow-stream", "arrow-file"])
def test_a_corrupt_columnar_file_is_one_line_naming_it(tmp_path, capsys, kind):
    """pyarrow's errors (an OSError of no errno) name the file, the row group and pyarrow's reason,
    not the outputs ('[Errno None] None'); nothing is written."""
    from qwen_data.cli import main

    path = tmp_path / ("bad.parquet" if kind == "parquet" else "bad.arrow")
    corrupt_columnar(path, kind)
    assert main(["pretrain", "--quiet", "--workers", "1", "--no-certify", str(path), "-o",
                 str(tmp_path / "o" / "X")]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "Errno" not in error and error.startswith(f"qwen-data pretrain: error: {path}: "), error
    if kind == "parquet":
        assert "row group 1" in error and "Corrupt snappy compressed data" in error, error
    assert not (tmp_path / "o").exists() or not os.listdir(tmp_path / "o")
