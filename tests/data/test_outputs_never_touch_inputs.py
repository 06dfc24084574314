"""No run writes over what it reads or over a file that is not its own, and inputs are pinned.

Every command that writes (pretrain, sft, merge, blend) is refused before it writes anything when an
output is an input (by name, through `..`, a symbolic or a hard link) or an existing file that is
not its own earlier output (another prefix's file, a prefix of another kind, a user's file); it
replaces its own earlier output. Shards read from another version of an input are refused by
`merge` and shown by `verify`.
"""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from _helpers import chats, copy_prefix, corpus, pretrain, sft

from qwen_data.cli import main


def snapshot(directory) -> dict:
    """Every file under `directory` with its bytes: what a refused run must leave as it was."""
    found = {}
    for root, _, names in os.walk(directory):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = f.read()
    return found


def refused(capsys, argv: list[str], *named: str) -> None:
    assert main(argv) == 2, argv
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    for text in named:
        assert text in err, (text, err)


@pytest.fixture
def data(tmp_path):
    """A corpus, a JSON array of chats, and a pretrain and an SFT prefix made from them."""
    text = corpus(tmp_path / "c.jsonl", seed=1, documents=30, longest=12)
    records = [json.loads(line) for line in open(chats(tmp_path / "chats.jsonl", seed=2, count=12, longest=8))]
    array = tmp_path / "records.json"
    array.write_text(json.dumps(records))
    return {"text": text, "records": str(array), "p": pretrain([text], tmp_path / "out" / "p"),
            "s": sft([array], tmp_path / "out" / "s")}


def test_no_output_is_an_input(tmp_path, data, capsys):
    """By name, through `..`, a symbolic link or a hard link: the input is left as it was, and the
    refusal names the output and the input."""
    text, records, p, s = data["text"], data["records"], data["p"], data["s"]
    (tmp_path / "d").mkdir()
    os.symlink(text, tmp_path / "soft.json")
    os.link(text, tmp_path / "hard.json")
    before = snapshot(tmp_path)
    cases = [
        (["sft", records, "-o", str(tmp_path / "records")], records),
        (["sft", records, "-o", records], records),
        (["sft", records, "-o", str(tmp_path / "d" / ".." / "records")], records),
        (["pretrain", text, "-o", str(tmp_path / "soft")], text),
        (["pretrain", text, "-o", str(tmp_path / "hard")], text),
        (["merge", p, "-o", p], p + ".bin"),
        (["blend", p, "-o", p + ".json"], p + ".json"),
        (["blend", s, "-o", s + ".txt"], s + ".json"),
    ]
    for argv, input_named in cases:
        refused(capsys, [argv[0], *(["--quiet"] if argv[0] != "blend" else []), *argv[1:]],
                f"over the input {input_named}")
        assert snapshot(tmp_path) == before, argv


@pytest.mark.parametrize("case", ["lossmask of an SFT prefix", "prefix of another kind", "user's file",
                                  "blend over a prefix", "blend over a user's file", "merge over another prefix"])
def test_no_output_replaces_a_foreign_file(tmp_path, data, capsys, case):
    text, records, p, s = data["text"], data["records"], data["p"], data["s"]
    (tmp_path / "out" / "user.json").write_text('{"mine": true}\n')
    user = str(tmp_path / "out" / "user")
    argv, named = {
        "lossmask of an SFT prefix": (["pretrain", "--quiet", text, "-o", s + ".lossmask"],
                                      [f"{s}.lossmask.bin is a file of the sft prefix {s}"]),
        "prefix of another kind": (["sft", "--quiet", records, "-o", p], [f"{p}.bin is a file of the pretrain prefix {p}"]),
        "user's file": (["pretrain", "--quiet", text, "-o", user], [f"{user}.json exists and is not an earlier output"]),
        "blend over a prefix": (["blend", p, "-o", s], [f"{s}.json is the manifest of the sft prefix {s}"]),
        "blend over a user's file": (["blend", p, "-o", user + ".txt"], [f"{user}.json exists"]),
        "merge over another prefix": (["merge", "--quiet", p, "-o", s], [f"{s}.bin is a file of the sft prefix {s}", "not an earlier pretrain"]),
    }[case]
    before = snapshot(tmp_path)
    refused(capsys, argv, *named)
    assert snapshot(tmp_path) == before


def test_a_run_replaces_its_own_earlier_output(tmp_path, data):
    """Pretrain (one key and several), sft, merge and blend run again over what they wrote."""
    text, records, p, s = data["text"], data["records"], data["p"], data["s"]
    several = tmp_path / "keys.jsonl"
    several.write_text('{"text": "a river", "title": "stone"}\n' * 3 + '{"text": "x", "broken": \n')  # a reject:
    for _ in range(2):  # the run's own rejects file, beside its two prefixes k_text and k_title
        pretrain([text], p)
        sft([records], s)
        pretrain([several], tmp_path / "out" / "k", "--text-key", "text,title")
        assert main(["merge", "--quiet", p, p, "-o", str(tmp_path / "out" / "m")]) == 0
        assert main(["blend", p, "-o", str(tmp_path / "out" / "b.json")]) == 0
    assert os.path.exists(tmp_path / "out" / "k.rejects.jsonl")


def test_input_pins(tmp_path):
    """Size, mtime and a hash of the size and both ends; a change at either end shows even at the
    same size and mtime. Entries without pins (older manifests) compare equal on what they have."""
    from qwen_data.formats.manifest import PIN_BYTES, input_entry, pins_differ

    path = tmp_path / "big.jsonl"
    content = bytearray(os.urandom(3 * PIN_BYTES + 5))
    path.write_bytes(content)
    entry = input_entry(str(path))
    ends = hashlib.sha256(f"{len(content)}\n".encode() + content[:PIN_BYTES] + content[-PIN_BYTES:]).hexdigest()
    assert entry == {"path": str(path), "bytes": len(content), "mtime_ns": os.stat(path).st_mtime_ns,
                     "ends_sha256": ends}
    for position in (0, len(content) - 1):
        changed = bytearray(content)
        changed[position] ^= 1
        path.write_bytes(changed)
        os.utime(path, ns=(entry["mtime_ns"], entry["mtime_ns"]))
        assert pins_differ(entry, input_entry(str(path))) == ["ends_sha256"]
    assert pins_differ({"path": str(path), "bytes": len(content)}, input_entry(str(path))) == []


@pytest.mark.corrupts_outputs  # shard 0's input changed after it was made: verify reports it
def test_shards_of_a_changed_input_are_refused(tmp_path, capsys):
    """An input rewritten at the same size between shard runs: merge refuses, naming the input and
    the shards; verify reports the stale shard. Shards of one version merge, with or without pins."""
    from qwen_data.tools.verify import verify

    source = corpus(tmp_path / "c.jsonl", seed=4, documents=40, longest=12)
    s0 = pretrain([source], tmp_path / "s0", "--shard", "0/2")
    s1 = pretrain([source], tmp_path / "s1", "--shard", "1/2")
    assert main(["merge", "--quiet", s1, s0, "-o", str(tmp_path / "whole")]) == 0

    def unpinned(m):  # as manifests written before pins: path and size only
        m["inputs"] = [{"path": i["path"], "bytes": i["bytes"]} for i in m["inputs"]]

    old = [copy_prefix(prefix, prefix + "_old", unpinned) for prefix in (s0, s1)]
    assert main(["merge", "--quiet", *old, "-o", str(tmp_path / "whole_old")]) == 0
    assert verify(s0) == []
    stat = os.stat(source)
    content = open(source, "rb").read()
    with open(source, "wb") as f:  # same size; the same mtime too: only the content pin tells
        f.write(content.replace(b"data", b"DATA", 1) if b"data" in content else content[::-1])
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    s0 = pretrain([source], tmp_path / "s0", "--shard", "0/2")  # pinned again, as before s1 was
    new1 = pretrain([source], tmp_path / "new1", "--shard", "1/2")
    refused(capsys, ["merge", "--quiet", s0, s1, "-o", str(tmp_path / "m")], f"{source} changed between the shards",
            s0, s1)
    assert not os.path.exists(tmp_path / "m.json")
    assert main(["merge", "--quiet", s0, new1, "-o", str(tmp_path / "m")]) == 0
    problems = verify(s1)
    assert len(problems) == 1 and f"input {source} changed since this shard read it" in problems[0], problems
