"""The bytes qwen-data writes for the bundled examples, pinned.

A fingerprint is the sha256 of every byte of a prefix's .bin/.idx files (both channels for SFT), so
equal fingerprints mean byte-identical outputs. Pinned with qwen-data 0.2.0, before the pipelines
were rebuilt on one core: a refactor must leave them unchanged; a change that alters the data on
purpose updates them and says why.
"""

import json
import os
import shutil

import pytest

from qwen_data.cli import main

PINNED = {
    ("pretrain",): "7beda94a4f2654a02a9f80bfebc081608614617447f6e164df338d2e62da1fb0",
    ("sft", "--template", "qwen2p5"): "87fbca55639d76a6467fd30c16e6c55bcca82d0ce3aed24522c20c8d4025709a",
    ("sft", "--template", "qwen2p5", "--seq-length", "512", "--pack"):
        "6ae67c3432160a66971550d936e10c5e73fa797793fcf93adeca9e00f985d18d",
    ("sft", "--template", "qwen3"): "085c1187944731219593c4577b550fdfb2f09b3a790b80878b535977014c620b",
    ("sft", "--template", "qwen3", "--seq-length", "512", "--pack"):
        "7a5f2af484b734afe3b2cd08493d44658c6b4fd34c70ae2fb65ada154f5511f9",
}


@pytest.mark.parametrize("args", list(PINNED), ids=lambda a: "-".join(x.lstrip("-") for x in a))
def test_bundled_examples_give_the_pinned_bytes(tmp_path, args):
    assert main([args[0], "--quiet", "-o", str(tmp_path / "out"), *args[1:]]) == 0
    with open(tmp_path / "out.json", encoding="utf-8") as f:
        assert json.load(f)["fingerprint"] == PINNED[args]


@pytest.mark.corrupts_outputs  # a manifest edited to another flavour
def test_parts_made_with_a_copied_tokenizer_or_the_hf_backend_merge_into_one_runs_bytes(tmp_path, capsys):
    """A tokenizer is its files' content and flavour: not where the files lay, nor which backend encoded
    (both give the same ids). A merge that refuses names the field that differs and both values."""
    from _helpers import copy_prefix, corpus, manifest, pretrain

    from qwen_data.text.tokenizer import bundled_tokenizer_dir
    from qwen_data.tools.verify import verify

    copied = str(shutil.copytree(bundled_tokenizer_dir(), tmp_path / "tokenizer"))
    text = corpus(tmp_path / "c.jsonl", seed=5, documents=30, longest=30)
    shards = [pretrain([text], tmp_path / "s0", "--shard", "0/2", "--tokenizer", copied),
              pretrain([text], tmp_path / "s1", "--shard", "1/2", "--backend", "hf")]
    assert main(["merge", "--quiet", *shards, "-o", str(tmp_path / "m")]) == 0
    assert manifest(tmp_path / "m")["fingerprint"] == manifest(pretrain([text], tmp_path / "one"))["fingerprint"]
    assert verify(str(tmp_path / "m")) == []
    other = copy_prefix(shards[1], str(tmp_path / "q25"), lambda m: m["tokenizer"].update(flavour="qwen2.5"))
    capsys.readouterr()
    assert main(["merge", "--quiet", shards[0], other, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert f"{other} and {shards[0]} were made differently: tokenizer.flavour 'qwen2.5' vs 'qwen3'" in err, err
    assert not os.path.exists(tmp_path / "x.json")
