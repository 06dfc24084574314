"""bench/cores.py --continue: a file this host wrote since it booted is added to; one from another boot (another
host, or this one restarted: its ceilings and runs are not this call's) is refused."""

import json
import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..")


@pytest.fixture
def cores(monkeypatch):
    monkeypatch.syspath_prepend(BENCH)
    import cores
    yield cores
    sys.modules.pop("cores", None)


def test_continue_takes_this_boots_file_only(cores, tmp_path):
    info = cores.host()
    path = tmp_path / "cores.json"
    assert cores.earlier(str(path), info) == {}  # nothing yet: a start from nothing
    kept = {"host": info, "raw_mb_per_s": 50.0, "runs": [{"job": "pretrain", "workers": 1}]}
    path.write_text(json.dumps(kept))
    assert cores.earlier(str(path), info) == kept
    path.write_text(json.dumps(kept | {"host": info | {"boot_id": "another"}}))
    with pytest.raises(SystemExit, match="another host"):
        cores.earlier(str(path), info)


def test_continue_takes_the_same_corpora_only(cores):
    kept = {"path": "/c/text-8000.jsonl", "sft": {"sft-chat": {"path": "/c/chat-4000.jsonl"}}}
    sft = {"sft-alpaca": {"path": "/c/alpaca-4000.jsonl"}}
    assert cores.same_corpora(kept, {"path": "/c/text-8000.jsonl"}, sft) == kept["sft"] | sft
    with pytest.raises(SystemExit, match="text-8000"):  # the text the file's pretrain runs read is another
        cores.same_corpora(kept, {"path": "/c/text-200.jsonl"}, sft)
    with pytest.raises(SystemExit, match="chat-4000"):  # a job's SFT records are other records
        cores.same_corpora(kept, {"path": "/c/text-8000.jsonl"}, {"sft-chat": {"path": "/c/chat-2000.jsonl"}})
