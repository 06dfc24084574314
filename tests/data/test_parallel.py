"""How work is spread over worker processes: spans read by the workers, results handed back in shared
memory, tasks given to whichever worker is free, workers replaced by their memory growth. Whatever
the spread, the output is the bytes of one worker and every record keeps its file:line."""

import json
import mmap
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
import pytest

from qwen_data.cli import main
from qwen_data.run.workers import ordered_map


@dataclass
class Result:
    ids: np.ndarray
    parts: list
    note: str


def make(n: int) -> Result:
    # sizes vary with n, so some results fit a small slot and some do not
    return Result(np.arange(n * 1000, dtype=np.int32) + n, [np.full(n, n, np.uint8), np.zeros(3, np.int64)], f"#{n}")


def test_results_in_shared_memory_equal_the_workers_and_big_ones_take_the_pipe():
    slot = 40_000  # bytes: results up to n = 9 fit, larger ones go through the pipe
    seen = 0
    # a result's arrays are views of its slot until the next result is asked for: checked at once
    for n, result in enumerate(ordered_map(make, range(20), 3, shared_fields=("ids", "parts"), slot_bytes=slot)):
        expected = make(n)
        assert result.note == expected.note
        assert np.array_equal(result.ids, expected.ids) and result.ids.dtype == np.int32
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(result.parts, expected.parts))
        in_slot = not result.ids.flags.writeable  # views of the slot are read-only; piped arrays are not
        assert in_slot == (n < 10), n
        seen += 1
    assert seen == 20


def test_workers_write_their_results_where_they_are_placed(tmp_path, monkeypatch):
    """Each result's array written by the worker that made it, at the offset the consumer hands out
    in order (the slot is held until it is written): the file is the arrays back to back, and this
    process wrote none of them (its own writes, patched once the workers were forked, are counted)."""
    from qwen_data.run import workers

    path = tmp_path / "out.bin"
    path.write_bytes(b"")
    expected, offset, here = [], 0, []
    for n, result in enumerate(ordered_map(make, range(12), 3, shared_fields=("ids", "parts"), slot_bytes=40_000)):
        monkeypatch.setattr(workers, "_write_range", lambda *args: here.append(args))
        placement = getattr(result, "placement", None)  # (n >= 10: through the pipe, written here)
        if placement is None:
            with open(path, "r+b") as f:
                f.seek(offset)
                f.write(result.ids.tobytes())
        else:
            placement.write([(str(path), result.ids, offset)])
        expected.append(make(n).ids.tobytes())
        offset += result.ids.nbytes
    assert path.read_bytes() == b"".join(expected)
    assert not here



@pytest.mark.parametrize("job", ["pretrain", "sft", "sft-packed"])
def test_a_run_s_workers_write_its_ids_and_masks_and_this_process_none(tmp_path, monkeypatch, job):
    """Pretraining's ids and SFT's samples (ids and loss mask; packed SFT's staged for its journal,
    the rows laid out here) are written by the workers that made them (`workers.Placement`): the
    bytes of a run in this process (one chunk, written here), and no `write_at` here (patched before
    the fork; the workers write through `_write_range`)."""
    from _helpers import chats, corpus, same_data
    from _oracles import oracle_dir
    from qwen_data.formats.indexed import IndexedDatasetWriter

    data = corpus(tmp_path / "c.jsonl", 5, 400, 60) if job == "pretrain" else chats(tmp_path / "c.jsonl", 5, 300, 40)
    sft = ["--template", "qwen2p5", "--reference-template", str(oracle_dir() / "qwen2.5-instruct.jinja")]
    args = [job[:3] if job != "pretrain" else job, data, "--quiet", *(sft if job != "pretrain" else []),
            *(["--pack", "--seq-length", "512"] if job == "sft-packed" else [])]
    assert main([*args, "-o", str(tmp_path / "one"), "--workers", "1", "--chunk-mb", "100"]) == 0
    here = []
    write_at = IndexedDatasetWriter.write_at
    monkeypatch.setattr(IndexedDatasetWriter, "write_at", lambda self, data, offset: (
        here.append(data.nbytes), write_at(self, data, offset)))
    assert main([*args, "-o", str(tmp_path / "two"), "--workers", "2", "--chunk-mb", "0.01"]) == 0
    same_data(tmp_path / "one", tmp_path / "two", ("",) if job == "pretrain" else ("", ".lossmask"))
    assert here == [] and os.path.exists(tmp_path / "two.journal") is False
    with open(tmp_path / "two.json", encoding="utf-8") as f:
        assert json.load(f)["certificate"]["certified"]


def failing_write(fd, arena, start, size, offset):
    if os.readlink(f"/proc/self/fd/{fd}").endswith("full.bin"):
        raise OSError(28, "No space left on device")
    os.pwrite(fd, arena[start:start + size], offset)


def test_a_worker_that_cannot_write_its_result_fails_the_map_naming_the_file(tmp_path, monkeypatch):
    """A result's arrays go to several files (SFT's ids and mask): the one that failed is named."""
    from qwen_data.run import workers

    monkeypatch.setattr(workers, "_write_range", failing_write)  # (the workers are forked after this)
    fine, full = tmp_path / "fine.bin", tmp_path / "full.bin"
    fine.write_bytes(b"")
    full.write_bytes(b"")
    with pytest.raises(workers.WorkerError, match=r"/full.bin: No space left on device"):
        for result in ordered_map(make, range(6), 2, shared_fields=("ids", "parts"), slot_bytes=40_000):
            result.placement.write([(str(fine), result.ids, 0), (str(full), result.parts[0], 0)])


def sleepy(n: int) -> tuple[int, float]:
    time.sleep(1.0 if n == 0 else 0.01)
    return n, time.monotonic()


def test_a_slow_task_holds_back_only_the_results_after_it():
    """Task 0 is slow: the other workers go on with the next tasks meanwhile. Only the one task queued
    behind it on its worker waits (handing out round-robin, every fourth task would)."""
    start = time.monotonic()
    got = list(ordered_map(sleepy, range(13), 4))
    assert [n for n, _ in got] == list(range(13))
    finished = sorted(t - start for n, t in got if n)
    assert finished[-2] < 0.9, f"fast tasks waited for the slow one: {finished}"


_kept: list = []


def hoard(n: int) -> int:
    # 8 MiB more resident memory a task, in new pages (malloc could reuse free heap the fork brought)
    block = mmap.mmap(-1, 8 << 20)
    block.write(b"x" * (8 << 20))
    _kept.append(block)
    return os.getpid()


def test_a_worker_that_grows_past_its_budget_is_replaced():
    pids = list(ordered_map(hoard, range(12), 2, worker_growth=20 << 20))
    assert len(pids) == 12 and len(set(pids)) > 2, "no worker was replaced"


def lines_with_bad_ones(path, count: int, bad: set) -> None:
    with open(path, "w", encoding="utf-8") as f:
        for i in range(1, count + 1):
            f.write("{not json\n" if i in bad else json.dumps({"text": f"record {i} " + "word " * (i % 50)}) + "\n")


@pytest.mark.parametrize("shard", [None, "2/3"])
def test_spans_number_every_record_in_its_file_and_give_one_workers_bytes(tmp_path, shard):
    """Workers read tiny spans (--chunk-mb 0.001: a line may start in one span and end in another,
    and spans may hold no line start at all) and number their lines from 1; the run numbers them
    in the file, so a reject says the line it is on."""
    src = tmp_path / "c.jsonl"
    bad = {1, 7, 300, 301, 999, 1200}
    lines_with_bad_ones(src, 1200, bad)
    extra = ["--shard", shard] if shard else []
    outs = []
    for workers, chunk in ((1, "64"), (3, "0.001")):
        out = tmp_path / f"w{workers}"
        assert main(["pretrain", str(src), "-o", str(out), "--workers", str(workers), "--chunk-mb", chunk,
                     "--quiet", *extra]) == 0
        with open(f"{out}.rejects.jsonl", encoding="utf-8") as f:
            rejected = [json.loads(line)["record"] for line in f]
        outs.append((out, rejected))
    (one, rejected_one), (many, rejected_many) = outs
    assert rejected_many == rejected_one
    if shard is None:
        assert rejected_many == sorted(bad)
    else:
        assert set(rejected_many) < bad and rejected_many
    for ext in (".bin", ".idx"):
        assert open(f"{one}{ext}", "rb").read() == open(f"{many}{ext}", "rb").read()


def test_a_file_that_changes_while_workers_read_it_fails_the_run(tmp_path, capsys):
    src = tmp_path / "c.jsonl"
    lines_with_bad_ones(src, 4000, set())
    from qwen_data.inputs.files import expand
    from qwen_data.inputs.readers import read_chunks

    chunks = read_chunks(expand([str(src)]), 4096)
    first = next(chunks)
    with open(src, "a", encoding="utf-8") as f:
        f.write(json.dumps({"text": "late"}) + "\n")
    from qwen_data.errors import InputFileError

    with pytest.raises(InputFileError, match="changed while it was read"):
        list(first.records())


def test_the_command_starts_no_blas_threads():
    # numpy's BLAS starts a spinning thread per core at import; the command does no linear algebra,
    # and on a many-core host those threads take the cores its workers start on
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    script = "import os, qwen_data.cli, numpy; print(len(os.listdir('/proc/self/task')))"
    threads = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert int(threads.stdout) == 1
