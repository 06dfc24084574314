"""`qwen-data pretrain` end to end, read back with megatron-core's own readers."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from tokenizers import Tokenizer

from multilingual import corpus
from qwen_data.cli import main
from qwen_data.formats.outputs import AtomicOutputs
from qwen_data.text.tokenizer import bundled_tokenizer_dir
from _helpers import hf_plain_text, write_jsonl

EOD = 151643
HF = Tokenizer.from_file(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"))
TEXTS = corpus(300, seed=2)


@pytest.fixture(scope="module")
def megatron_indexed():
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    return IndexedDataset


def run_cli(*args):
    return main(["pretrain", "--quiet", *map(str, args)])


def documents(indexed_cls, prefix):
    ds = indexed_cls(str(prefix))
    assert (ds.document_indices == np.arange(len(ds) + 1)).all()  # one sequence per document
    return [ds[i].tolist() for i in range(len(ds))]


@pytest.mark.parametrize("policy", ["text", "parse"])
def test_ids_equal_hf_and_megatron_reads_them(tmp_path, megatron_indexed, policy):
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS if t])
    assert run_cli(src, "-o", tmp_path / "out", "--workers", 2, "--special-tokens", policy) == 0
    if policy == "parse":
        want = [e.ids + [EOD] for e in HF.encode_batch([t for t in TEXTS if t], add_special_tokens=False)]
    else:
        want = [hf_plain_text(HF, t) + [EOD] for t in TEXTS if t]
    assert documents(megatron_indexed, tmp_path / "out") == want
    manifest = json.load(open(tmp_path / "out.json"))
    assert manifest["documents"] == len(want) and manifest["tokens"] == sum(map(len, want))
    assert manifest["eod_id"] == EOD and manifest["dtype"] == "int32" and manifest["special_tokens"] == policy
    added = [t["content"] for t in json.load(open(os.path.join(bundled_tokenizer_dir(), "tokenizer.json")))["added_tokens"]]
    assert manifest["special_token_records"] == sum(1 for t in TEXTS if t and any(a in t for a in added))
    assert not os.path.exists(tmp_path / "out.rejects.jsonl")


def test_reject_policy_sets_special_records_aside(tmp_path, megatron_indexed):
    # Structural literals (<|...|>) are refused; content tokens such as Qwen3's <think> keep their ids.
    texts = [{"text": "plain"}, {"text": "a <|im_start|> b"}, {"text": "x<think>"}, {"text": "<|endoftext|>"}]
    src = write_jsonl(tmp_path / "c.jsonl", texts)
    assert run_cli(src, "-o", tmp_path / "out", "--special-tokens", "reject") == 0
    assert documents(megatron_indexed, tmp_path / "out") == [
        hf_plain_text(HF, "plain") + [EOD], HF.encode("x<think>", add_special_tokens=False).ids + [EOD]]
    assert 151667 in HF.encode("x<think>", add_special_tokens=False).ids
    rejects = [json.loads(l) for l in open(tmp_path / "out.rejects.jsonl")]
    assert [(r["record"], r["reason"]) for r in rejects] == [(2, "special-token"), (4, "special-token")]


def test_output_bytes_do_not_depend_on_worker_count(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS if t] + ["not json"])
    outputs = []
    for workers in (1, 2, 8):
        prefix = tmp_path / f"w{workers}"
        assert run_cli(src, "-o", prefix, "--workers", workers, "--chunk-mb", 0.002) == 0
        outputs.append([open(f"{prefix}{ext}", "rb").read() for ext in (".bin", ".idx", ".rejects.jsonl")])
    assert outputs[0] == outputs[1] == outputs[2]


def test_every_bad_input_kind_is_rejected_with_its_line(tmp_path, megatron_indexed):
    path = tmp_path / "bad.jsonl"
    lines = [
        b'{"text": "good one"}',
        b'{"text": "broken',  # 2 not JSON
        b'{"other": "no text key"}',  # 3
        b'{"text": 42}',  # 4 non-string
        b'{"text": ""}',  # 5 empty
        b'{"text": "caf\xe9 latin-1"}',  # 6 invalid UTF-8
        b"",  # 7 blank
        b'["a", "list"]',  # 8 not an object
        b'{"text": "lone \\ud800 surrogate"}',  # 9
        b'{"text": "good two"}',
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert run_cli(path, "-o", tmp_path / "out") == 0
    rejects = [json.loads(l) for l in open(tmp_path / "out.rejects.jsonl")]
    assert [(r["record"], r["reason"]) for r in rejects] == [
        (2, "invalid-json"), (3, "missing-key"), (4, "not-a-string"), (5, "empty-text"), (6, "invalid-utf8"),
        (7, "blank-line"), (8, "not-an-object"), (9, "invalid-unicode"),
    ]
    assert all(r["file"] == str(path) and r["message"] and "raw" in r for r in rejects)
    manifest = json.load(open(tmp_path / "out.json"))
    assert manifest["rejects"]["count"] == 8 and manifest["documents"] == 2
    assert len(documents(megatron_indexed, tmp_path / "out")) == 2


def test_every_spelling_of_a_lone_surrogate_is_rejected_and_pairs_are_kept(tmp_path, megatron_indexed):
    """Only a line the standard parser reads can hold a lone surrogate (orjson refuses them), so only those
    lines' texts are checked (`Record.from_line`): 300 random spellings, each lone one rejected by line, the
    rest written as HF encodes them."""
    import random

    import orjson

    rng = random.Random(5)
    units = ["\\ud800", "\\udbff", "\\udc00", "\\uDFFF", "\\uD83D", "\\ude00", "\\ud83d\\ude00", "\\\\ud800",
             "\\u0041", "a", " ", "\\n", "\u00e9", "\\u00e9"]
    lines = [b'{"text": "%s", "n": %d}' % ("".join(rng.choices(units, k=rng.randint(1, 5))).encode(), n)
             for n in range(300)]
    texts = [json.loads(line)["text"] for line in lines]
    lone = [any(0xD800 <= ord(c) <= 0xDFFF for c in text) for text in texts]
    assert 50 < sum(lone) < 250
    for line, bad in zip(lines, lone):
        if bad:
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(line)
    path = tmp_path / "s.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert run_cli(path, "-o", tmp_path / "out", "--chunk-mb", 0.001) == 0
    blank = [text.isspace() for text in texts]
    rejects = [json.loads(line) for line in open(tmp_path / "out.rejects.jsonl")]
    assert [(r["record"], r["reason"]) for r in rejects] == [
        (n + 1, "invalid-unicode" if bad else "empty-text") for n, (bad, empty) in enumerate(zip(lone, blank)) if bad or empty]
    kept = [text for text, bad, empty in zip(texts, lone, blank) if not (bad or empty)]
    assert documents(megatron_indexed, tmp_path / "out") == [hf_plain_text(HF, text) + [EOD] for text in kept]


def test_max_rejects_fails_fast_and_leaves_nothing(tmp_path):
    src = write_jsonl(tmp_path / "c.jsonl", ['{"text": "ok"}', "bad", "bad", '{"text": "ok"}'])
    assert run_cli(src, "-o", tmp_path / "out", "--max-rejects", 1) == 2
    assert sorted(os.listdir(tmp_path)) == ["c.jsonl"]


def test_gzip_several_files_and_several_keys(tmp_path, megatron_indexed):
    a = write_jsonl(tmp_path / "a.jsonl.gz", [{"q": "question one", "a": "answer one"}])
    b = write_jsonl(tmp_path / "b.jsonl", [{"q": "question two", "a": "answer two"}, {"q": "orphan"}])
    assert run_cli(a, b, "-o", tmp_path / "qa", "--text-key", "q", "--text-key", "a") == 0
    q = documents(megatron_indexed, tmp_path / "qa_q")
    a_docs = documents(megatron_indexed, tmp_path / "qa_a")
    assert q == [hf_plain_text(HF, "question one") + [EOD], hf_plain_text(HF, "question two") + [EOD]]
    assert a_docs == [hf_plain_text(HF, "answer one") + [EOD], hf_plain_text(HF, "answer two") + [EOD]]
    rejects = [json.loads(l) for l in open(tmp_path / "qa.rejects.jsonl")]
    assert [(r["file"], r["record"], r["reason"]) for r in rejects] == [(b, 2, "missing-key")]


def test_gpt_dataset_through_blended_builder(tmp_path):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    src = write_jsonl(tmp_path / "c.jsonl", [{"text": t} for t in TEXTS if t])
    assert run_cli(src, "-o", tmp_path / "web") == 0
    manifest = json.load(open(tmp_path / "web.json"))

    class Tok:  # what GPTDataset needs of a tokenizer
        eod = manifest["eod_id"]
        pad = manifest["pad_id"]
        vocab_size = manifest["tokenizer"]["vocab_size"]
        unique_identifiers = {"fingerprint": manifest["fingerprint"]}

    config = GPTDatasetConfig(
        random_seed=1, sequence_length=64, blend=([str(tmp_path / "web")], None), split="100,0,0",
        tokenizer=Tok(), reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
        path_to_cache=str(tmp_path / "cache"),
    )
    train, _, _ = BlendedMegatronDatasetBuilder(GPTDataset, [20, None, None], lambda: True, config).build()
    stream = np.fromfile(tmp_path / "web.bin", dtype=np.int32)
    for i in range(len(train)):
        sample = train[i]
        tokens = sample["tokens"].numpy()
        assert tokens.shape == (64,)
        # Every sample is a window of the written token stream (documents are shuffled, so look it up).
        assert np.isin(tokens, stream).all()
        assert sample["loss_mask"][sample["labels"] == EOD].all()  # eod is trained, never taken for pad


def test_killed_run_leaves_no_complete_looking_prefix(tmp_path):
    big = write_jsonl(tmp_path / "big.jsonl", [{"text": t * 20} for t in TEXTS if t] * 6)
    prefix = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "qwen_data.cli", "pretrain", big, "-o", str(prefix), "--workers", "1",
         "--backend", "hf", "--chunk-mb", "0.05", "--quiet"],
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    )
    deadline = time.time() + 60
    while time.time() < deadline and not (os.path.exists(f"{prefix}.bin.tmp") and os.path.getsize(f"{prefix}.bin.tmp")):
        time.sleep(0.05)
    assert proc.poll() is None, "run finished before it could be killed: make the input bigger"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    for ext in (".bin", ".idx", ".json"):
        assert not os.path.exists(f"{prefix}{ext}")
    # The next run into the same prefix completes normally over the leftovers.
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": "hello"}])
    assert run_cli(small, "-o", prefix) == 0
    assert json.load(open(f"{prefix}.json"))["documents"] == 1
    assert not any(name.endswith(".tmp") for name in os.listdir(tmp_path))


def test_second_run_into_a_busy_prefix_refuses(tmp_path, capsys):
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "hello"}])
    holder = AtomicOutputs([str(tmp_path / "out.json")])
    try:
        assert run_cli(src, "-o", tmp_path / "out") == 2
        assert "another qwen-data run" in capsys.readouterr().err
    finally:
        holder.abort()
    assert run_cli(src, "-o", tmp_path / "out") == 0


SMALL_RUN = """
import json, sys
from qwen_data.cli import main
from qwen_data.text.tokenizer import QwenTokenizer
assert main(sys.argv[1:]) == 0
decoded = ["_json_text" in vars(t) for t in QwenTokenizer._built.values()]
print(json.dumps({"modules": sorted(sys.modules), "decoded": decoded}))
"""


def test_a_small_run_starts_with_only_what_it_uses(tmp_path):
    """Start-up is most of a small run's time (`bench/certify.py start` times one). Its one chunk is tokenized in the
    main process (no worker: multiprocess only for the certificate's checking process, which loads
    the reference beside it), neither sft's modules nor merge's thread pool are imported, and
    tokenizer.json is not decoded once its rank file and added tokens are cached."""
    src = write_jsonl(tmp_path / "one.jsonl", [{"text": "Hello world, a short document."}])
    command = [sys.executable, "-c", SMALL_RUN, "pretrain", "--quiet", str(src), "-o", str(tmp_path / "out")]
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    for extra in ([], [], ["--no-certify"]):  # the first run fills the cache
        done = subprocess.run(command + extra, capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout.splitlines()[-1])
    loaded = set(result["modules"])
    assert not loaded & {"multiprocess", "concurrent.futures", "qwen_data.text.masking", "qwen_data.text.templates"}
    assert result["decoded"] == [False]
