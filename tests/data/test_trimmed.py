"""A small run's reference: HF's tokenizer cut down to the texts of a batch (`certify.trimmed`) gives
the whole tokenizer's ids, loads none of it, and its cached tables are checked before use."""

import json
import os
import subprocess
import sys

import pytest
from multilingual import corpus

from qwen_data.certify import reference, trimmed
from qwen_data.certify.reference import TextReference
from qwen_data.text.tokenizer import resolve_tokenizer_dir

DIRECTORY = resolve_tokenizer_dir(None)[1]
PATH = os.path.join(DIRECTORY, "tokenizer.json")


@pytest.fixture
def not_held(monkeypatch, tmp_path):
    """This process without the whole reference (the test session holds it) and with its own cache."""
    monkeypatch.setattr(reference, "_LOADED", {})
    monkeypatch.setattr(trimmed, "_TABLES", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


@pytest.mark.parametrize("policy", ["parse", "safe", "text"])
def test_the_cut_tokenizer_encodes_as_the_whole_one(policy, monkeypatch, tmp_path):
    texts = corpus(300, seed=7)
    whole = TextReference(DIRECTORY, "qwen2.5", policy).encode_batch(texts)
    monkeypatch.setattr(reference, "_LOADED", {})
    monkeypatch.setattr(trimmed, "_TABLES", {})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    cut = TextReference(DIRECTORY, "qwen2.5", policy, trim=True)
    assert [cut.encode_batch(texts[k:k + 25]) for k in range(0, len(texts), 25)] == \
        [whole[k:k + 25] for k in range(0, len(texts), 25)]
    assert not reference.holds(PATH)  # the whole tokenizer was never loaded


def test_words_the_cut_was_not_given_are_encoded_otherwise(not_held):
    # what the test above relies on: a table cut for some texts is too small for others
    cut = trimmed.tables(PATH).tokenizer(["Hello world"])
    whole = reference._hf_tokenizer(PATH)
    word = " internationalization"
    assert cut.encode(word).ids != whole.encode(word).ids


def test_a_damaged_cache_of_the_tables_is_named_and_rebuilt(not_held, capfd):
    trimmed.tables(PATH)
    (cache,) = [p for p in (os.path.join(os.environ["XDG_CACHE_HOME"], "qwen-data", name)
                            for name in os.listdir(os.path.join(os.environ["XDG_CACHE_HOME"], "qwen-data")))
                if p.endswith(".reference-tables.npz")]
    with open(cache, "r+b") as f:
        f.seek(os.path.getsize(cache) // 2)
        f.write(b"\0\1\2\3")
    trimmed._TABLES.clear()
    texts = ["A damaged cache is never used.", "<|im_start|>user\nhi<|im_end|>"]
    ids = TextReference(DIRECTORY, "qwen2.5", "parse", trim=True).encode_batch(texts)
    assert cache in capfd.readouterr().err
    assert ids == [reference._hf_tokenizer(PATH).encode(t, add_special_tokens=False).ids for t in texts]


def test_a_one_document_run_is_certified_without_loading_the_whole_reference(tmp_path):
    data = tmp_path / "one.jsonl"
    data.write_text(json.dumps({"text": "Hello world, a short document. <|endoftext|> and café"}) + "\n")
    probe = ("import sys, runpy\n"
             "from qwen_data.certify import reference\n"
             "def refused(path):\n"
             "    raise AssertionError('the whole reference was loaded')\n"
             "reference._hf_tokenizer = refused\n"
             "sys.argv = ['qwen-data', 'pretrain', sys.argv[1], '-o', sys.argv[2], '--quiet']\n"
             "runpy.run_module('qwen_data', run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", probe, str(data), str(tmp_path / "o" / "d")],
                          capture_output=True, text=True, env=os.environ | {"XDG_CACHE_HOME": str(tmp_path / "c")})
    assert done.returncode == 0, done.stderr
    with open(tmp_path / "o" / "d.json", encoding="utf-8") as f:
        found = json.load(f)["certificate"]
    assert found["certified"] is True and found["records_checked"] == 1
