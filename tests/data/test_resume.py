"""A pretrain or SFT run (unpacked, packed, Pai rows) killed (SIGKILL) and run again with the same
command goes on from its journal (`run.journal`) and ends with the bytes of a run never killed; what
it reuses is checked, never trusted.

Each kill is made deterministic by a child process that runs `qwen-data` with one function wrapped
to kill the process at its N-th call, in whichever thread makes it (a packed run stages its samples and
journals them behind its main thread): after a chunk's journal line (between chunks), half-way
through writing a chunk (the workers write the bytes the journal vouches for: pretraining's ids, SFT's
samples, unpacked or staged for the rows laid out from them; as a worker says a chunk's bytes are
written, its journal line not), and half-way
through the commit (which the next run finishes, once each file holds what the journal hashed).
"""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from _helpers import chats, corpus, manifest
from _oracles import oracle_dir

from qwen_data.cli import main
from qwen_data.formats import packing
from qwen_data.formats.layouts import UNPACKED
from qwen_data.run.workers import SLOTS

KILLER = """
import os, signal, sys
from qwen_data.cli import main
where, after = sys.argv[1], int(sys.argv[2])
calls = [0]

staged = os.environ["STAGED"] + "."  # the files the journal vouches for (not the rows laid out from them)

def killing(function):
    def wrapped(*args, **kwargs):
        if where == "mid-chunk" and hasattr(args[0], "name") and not os.path.basename(args[0].name).startswith(staged):
            return function(*args, **kwargs)  # (rows laid out behind: when they are written is the thread's)
        calls[0] += 1
        if where == "mid-chunk" and calls[0] == after:
            function(*args, **kwargs)  # the .bin written ...
            os.kill(os.getpid(), signal.SIGKILL)  # ... its index entries and journal line not
        result = function(*args, **kwargs)
        if where != "mid-chunk" and calls[0] == after:
            os.kill(os.getpid(), signal.SIGKILL)
        return result
    return wrapped

if where == "between-chunks":
    from qwen_data.run.journal import Journal
    Journal.chunk = killing(Journal.chunk)
elif where == "mid-chunk":  # the workers write what the journal vouches for, and say so (a run in this process: here)
    from qwen_data.formats import indexed
    from qwen_data.run import workers
    original = indexed._write_all
    indexed._write_all = killing(original)
    workers.Placement.written = killing(workers.Placement.written)
elif where == "sft-result":  # the N-th result an SFT run takes
    from qwen_data.steps import sft
    sft.SFTWriter.add = killing(sft.SFTWriter.add)
elif where == "commit":  # the N-th file renamed into place, the others not
    from qwen_data.formats import outputs
    commit = outputs.AtomicOutputs.commit

    def killing_commit(self, markers):
        os.replace = killing(os.replace)
        return commit(self, markers)

    outputs.AtomicOutputs.commit = killing_commit
sys.exit(main(sys.argv[3:]))
"""


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return corpus(tmp_path_factory.mktemp("resume") / "c.jsonl", seed=11, documents=6000, longest=300)


@pytest.fixture(scope="module")
def whole(text, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("whole") / "w")
    assert main(["pretrain", text, "-o", prefix, "--quiet", "--workers", "2", "--chunk-mb", "0.1"]) == 0
    return manifest(prefix)


def killed_then_resumed(args: list[str], prefix: str, where: str, after: int, whole: dict,
                        staged: str | None = None) -> dict:
    """`args` killed at `where` (at its `after`-th call), then run again as they are: the manifest of
    the run that resumed, which holds the bytes, counts and certificate of `whole` (a run never killed).
    `staged`: the prefix whose .bin the run journals (default `prefix`)."""
    killed = subprocess.run([sys.executable, "-c", KILLER, where, str(after), *args], capture_output=True, text=True,
                            env=os.environ | {"STAGED": os.path.basename(staged or prefix)})
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert not os.path.exists(prefix + ".json")
    with open(prefix + ".journal", encoding="utf-8") as f:
        chunks = [line for line in map(json.loads, f) if "files" in line]
    if where == "between-chunks":
        assert len(chunks) == after and any(chunk["picked"] for chunk in chunks)
    if where != "commit":  # what was written but not journaled is done again: a few chunks a worker at most
        bin_path = (staged or prefix) + ".bin.tmp"
        written, ends = os.path.getsize(bin_path), [chunk["files"][bin_path] for chunk in chunks]
        largest = max(np.diff([0, *ends]))
        # Counted in chunks (the run's 2 workers, SLOTS each: queued and finished), not as a share of this small
        # input: on a loaded 2-core machine ~6 chunks of ~33 were written but not journaled (19% of it).
        assert written - ends[-1] <= 2 * SLOTS * largest, (written, ends[-1], largest)
    assert main(args) == 0
    again = manifest(prefix)
    assert again["fingerprint"] == whole["fingerprint"] and again["digests"] == whole["digests"]
    for name in ("documents", "tokens", "rejects"):
        assert again[name] == whole[name]
    ours, theirs = again["certificate"], whole["certificate"]
    assert ours["certified"] and ours["records_checked"] == theirs["records_checked"]
    assert ours["lines_checked"] == theirs["lines_checked"]
    assert not [name for name in os.listdir(os.path.dirname(prefix))
                if name.endswith((".tmp", ".journal", ".lengths", ".docends"))]
    return again


@pytest.mark.parametrize("where, after", [("between-chunks", 5), ("mid-chunk", 9), ("commit", 2)])
def test_a_killed_run_resumes_to_the_same_bytes(text, whole, tmp_path, where, after):
    prefix = str(tmp_path / "p")
    killed_then_resumed(["pretrain", text, "-o", prefix, "--quiet", "--workers", "2", "--chunk-mb", "0.1"], prefix,
                        where, after, whole)


def test_picked_ids_in_a_journal_read_back_as_written_and_as_0_4_0_wrote_them():
    """The journal keeps a picked record's ids as base64 of their int32 bytes; a journal of qwen-data
    0.4.0 (a JSON list of them) still resumes."""
    from qwen_data.certify.checks import TextChecks

    ids = np.array([1, 2, 151643, 151_664], dtype=np.int32)
    kept = TextChecks.item_json((3, 1, [("hello", ids, 0, 4)]))
    assert isinstance(kept[2][0][1], str)
    for value in (json.loads(json.dumps(kept)), [3, 1, [["hello", ids.tolist(), 0, 4]]]):
        number, position, [(text, back, a, b)] = TextChecks.item_from_json(value)
        assert (number, position, text, a, b) == (3, 1, "hello", 0, 4)
        assert back.dtype == np.int32 and np.array_equal(back, ids)


@pytest.fixture(scope="module")
def chat_records(tmp_path_factory):
    return chats(tmp_path_factory.mktemp("resume-sft") / "c.jsonl", seed=5, count=3000, longest=40)


def _sft_args(records, prefix):
    return ["sft", records, "-o", prefix, "--quiet", "--workers", "2", "--chunk-mb", "0.05", "--template", "qwen2p5",
            "--seq-length", "256", "--overlong", "truncate",
            "--reference-template", str(oracle_dir() / "qwen2.5-instruct.jinja")]


@pytest.fixture(scope="module")
def whole_sft(chat_records, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("whole-sft") / "w")
    assert main(_sft_args(chat_records, prefix)) == 0
    return manifest(prefix)


@pytest.mark.parametrize("where, after", [("between-chunks", 4), ("mid-chunk", 11), ("commit", 3)])
def test_a_killed_sft_run_resumes_to_the_same_bytes(chat_records, whole_sft, tmp_path, where, after):
    prefix = str(tmp_path / "s")
    again = killed_then_resumed(_sft_args(chat_records, prefix), prefix, where, after, whole_sft)
    assert again["sft"] == whole_sft["sft"] and again["sft"]["truncated"] > 0
    # (counted by the workers, the resumed chunks' from the journal: the mask written holds as many)
    assert again["sft"]["trained_tokens"] == int(np.fromfile(prefix + ".lossmask.bin", np.uint8).sum()) > 0


@pytest.fixture(scope="module", params=[["--pack"], ["--pack", "--packing", "next-fit"], ["--layout", "pai", "--pack"]],
                ids=["best-fit", "next-fit", "pai"])
def rows_sft(request, chat_records, tmp_path_factory):
    """A run that lays out rows, and its manifest never killed. Best fit's windows are cut to a few
    chunks' samples here (PACK_WINDOW), so that rows are laid out, and staged samples wait, as in a
    large run."""
    prefix = str(tmp_path_factory.mktemp("whole-rows") / "w")
    extra = request.param
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(packing, "PACK_WINDOW", WINDOW)
        assert main([*_sft_args(chat_records, prefix), *extra]) == 0
    return extra, manifest(prefix)


WINDOW = 20_000  # tokens a best-fit window packs here (a few chunks' samples)
SMALL_WINDOWS = f"from qwen_data.formats import packing; " \
                f"packing.PACK_WINDOW = {WINDOW}\n"


@pytest.mark.parametrize("where, after", [("between-chunks", 7), ("mid-chunk", 13), ("commit", 2)])
def test_a_killed_run_that_lays_out_rows_resumes_to_the_same_bytes(chat_records, rows_sft, tmp_path, where, after,
                                                                  monkeypatch):
    """Packed (best fit, next fit) and Pai rows: the samples staged as they came are laid out again."""
    extra, whole = rows_sft
    prefix = str(tmp_path / "r")
    args = [*_sft_args(chat_records, prefix), *extra]
    monkeypatch.setattr(packing, "PACK_WINDOW", WINDOW)
    monkeypatch.setattr(sys.modules[__name__], "KILLER", SMALL_WINDOWS + KILLER)
    again = killed_then_resumed(args, prefix, where, after, whole, staged=prefix + UNPACKED)
    assert again["sft"] == whole["sft"] and again["sft"]["rows"] == whole["sft"]["rows"]


def test_picked_sft_records_in_a_journal_read_back_as_they_were():
    """A picked record's line and samples go through the journal as bytes and arrays (not where they
    were written: a resumed chunk is not read back); a row JSON cannot give back whole is not kept (its
    chunk is reused only once its answer is journaled)."""
    import datetime

    from qwen_data.certify.checks import ChatChecks

    ids, mask = np.array([151644, 872, 198], dtype=np.int32), np.array([0, 1, 1], dtype=np.uint8)
    item = (7, (b'{"messages": []}\n', 1, [(0, ids, mask)]), [(0, 12, ids[:2], mask[:2])])
    number, (source, count, [(k, a, m)]), written = ChatChecks.item_from_json(
        json.loads(json.dumps(ChatChecks.item_json(item))))
    assert (number, source, count, k, written) == (7, b'{"messages": []}\n', 1, 0, [])
    assert a.dtype == ids.dtype and np.array_equal(a, ids) and np.array_equal(m, mask) and m.dtype == np.uint8
    row = (7, ({"messages": [], "when": datetime.date(2026, 1, 1)}, 1, [(0, ids, mask)]), [])
    assert ChatChecks.item_json(row) is None
    assert ChatChecks.item_json((7, ({"messages": [], "n": 1}, 1, [(0, ids, mask)]), [])) is not None


def test_a_chunks_picked_records_as_journal_text_are_the_items_json():
    """`pipeline.picked_json` (orjson, json where orjson refuses a value) gives the items' JSON whatever writes it."""
    from qwen_data.certify.checks import ChatChecks
    from qwen_data.run.pipeline import picked_json

    ids, mask = np.array([151644, 872, 198], dtype=np.int32), np.array([0, 1, 1], dtype=np.uint8)
    line = (3, (b'{"messages": ["\\u00e9"]}\n', 1, [(0, ids, mask)]), [])
    row = (4, ({"messages": [], "n": 2 ** 70, "text": "\u00e9\u2028"}, 1, [(0, ids, mask)]), [])
    for items in ([line], [line, row]):
        expected = [[item[0], ChatChecks.item_json(item)] for item in items]
        assert json.loads(picked_json(ChatChecks, items)) == expected
    assert picked_json(ChatChecks, [(5, ({"x": float("nan")}, 1, []), [])]) is None


@pytest.mark.parametrize("answered, reused", [(False, 1), (True, 3)])
def test_picked_records_an_earlier_build_journaled_are_not_read_back(tmp_path, answered, reused):
    """An earlier build kept a chunk's picked records as [file:line, item], without `picked_at`: such a
    chunk is reused only once its check is in the journal (done again otherwise, never a failure)."""
    from qwen_data.certify.checks import TextChecks
    from qwen_data.run.journal import Journal, Resumed

    staged, prefix = str(tmp_path / "d.bin.tmp"), str(tmp_path / "d")
    journal = Journal(prefix, "run")
    journal.start(Resumed())
    item = TextChecks.item_json((7, 0, [("hello", np.array([1, 2], dtype=np.int32), 0, 2)]))
    for k in range(3):
        with open(staged, "ab") as f:
            f.write(bytes([k]) * 100)
        if k == 1:
            journal._line({"picked": [["f.jsonl:9", item]], **journal.written({staged: None})})
            journal.awaiting(k, k)
            journal.chunks += 1
        else:
            journal.chunk(journal.written({staged: None}), batch=k, picked="[]")
    if answered:
        journal.answers({1: {"records_checked": 1}})
    journal.close()
    resumed = Journal(prefix, "run").resumable([staged], TextChecks.item_from_json)
    assert len(resumed.chunks) == reused and os.path.getsize(staged) == 100 * reused


@pytest.mark.parametrize("answered, reused", [(False, 1), (True, 3)])
@pytest.mark.parametrize("unread", [None, [[9, [1, 2]]]])  # not kept; kept as no reader reads it
def test_a_chunk_whose_picked_records_do_not_read_back_is_reused_once_they_were_checked(tmp_path, answered, reused,
                                                                                         unread):
    from qwen_data.certify.checks import TextChecks
    from qwen_data.run.journal import Journal, Resumed

    staged, prefix = str(tmp_path / "d.bin.tmp"), str(tmp_path / "d")
    journal = Journal(prefix, "run")
    journal.start(Resumed())
    for k, picked in enumerate(([], unread, [])):
        with open(staged, "ab") as f:
            f.write(bytes([k]) * 100)
        journal.chunk(journal.written({staged: None}), batch=k, picked=None if picked is None else json.dumps(picked))
    if answered:
        journal.answers({1: {"records_checked": 1}})
    journal.close()
    assert len(Journal(prefix, "run").resumable([staged], TextChecks.item_from_json).chunks) == reused
    assert os.path.getsize(staged) == 100 * reused
