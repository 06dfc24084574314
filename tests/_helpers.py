"""Helpers the tests share (test modules never import each other)."""

from __future__ import annotations

import functools
import gzip
import json
import os
import random
import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_jsonl(path, records) -> str:
    """Records (dicts, or raw lines as strings) one per line; gzip when the name ends in .gz."""
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r, ensure_ascii=False)) + "\n")
    return str(path)


def manifest(prefix) -> dict:
    with open(str(prefix) + ".json", encoding="utf-8") as f:
        return json.load(f)



def read_jsonl(path) -> list:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def same_data(a, b, channels=("",)) -> None:
    """The prefixes hold the same bytes, channel by channel (e.g. "" and ".lossmask"), and say so."""
    for channel in channels:
        for ext in (".bin", ".idx"):
            with open(f"{a}{channel}{ext}", "rb") as x, open(f"{b}{channel}{ext}", "rb") as y:
                assert x.read() == y.read(), f"{a}{channel}{ext} differs from {b}{channel}{ext}"
    assert manifest(a)["fingerprint"] == manifest(b)["fingerprint"]

def copy_prefix(prefix, new, edit=None):
    """A copy of a prefix's files, its manifest optionally edited."""
    for suffix in (".bin", ".idx", ".lossmask.bin", ".lossmask.idx", ".json"):
        if os.path.exists(prefix + suffix):
            shutil.copyfile(prefix + suffix, new + suffix)
    if edit:
        m = manifest(new)
        edit(m)
        with open(new + ".json", "w", encoding="utf-8") as f:
            json.dump(m, f)
    return new


def edit_value(prefix, position, value, channel=""):
    """Value `position` of PREFIX.bin (int32 ids) or PREFIX.lossmask.bin (channel ".lossmask") set to `value`."""
    import numpy as np

    values = np.memmap(prefix + channel + ".bin", np.uint8 if channel else np.int32, "r+")
    values[position] = value
    values.flush()


def refingerprint(prefix):
    """The manifest's fingerprint made that of the files as they are now (an edit that hides itself)."""
    m = manifest(prefix)
    m.update(data_fingerprint(prefix))
    with open(prefix + ".json", "w", encoding="utf-8") as f:
        json.dump(m, f)


def data_fingerprint(prefix):
    """A manifest's fingerprint fields for the files of `prefix` as they are now."""
    from qwen_data.formats import digest
    from qwen_data.formats.manifest import fingerprinted

    channels = [prefix + c for c in ("", ".lossmask") if os.path.exists(prefix + c + ".bin")]
    return fingerprinted([(digest.sha256_of(c + ".idx"), digest.file_digest(c + ".bin")) for c in channels])


# -- small generated corpora and the CLI runs over them --------------------------------------------
WORDS = ("data model token river stone light cloud number garden window paper music "
         "北京 数据 模型 Grüße café naïve 東京 δεδομένα данные").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def corpus(path, seed, documents, longest):
    rng = random.Random(seed)
    return write_jsonl(path, [{"text": words(rng, rng.randint(1, longest))} for _ in range(documents)])


def chats(path, seed, count, longest):
    """Alpaca records and multi-turn chats of varied lengths."""
    rng = random.Random(seed)
    records = []
    for i in range(count):
        if i % 2:
            records.append({"instruction": words(rng, rng.randint(1, longest)), "input": "",
                            "output": words(rng, rng.randint(1, longest))})
        else:
            turns = []
            for _ in range(rng.randint(1, 3)):
                turns += [{"role": "user", "content": words(rng, rng.randint(1, longest))},
                          {"role": "assistant", "content": words(rng, rng.randint(1, longest))}]
            records.append({"messages": turns})
    return write_jsonl(path, records)


def pretrain(inputs, prefix, *extra):
    from qwen_data.cli import main

    assert main(["pretrain", "--quiet", "--workers", "1", *map(str, inputs), "-o", str(prefix), *extra]) == 0
    return str(prefix)


def sft(inputs, prefix, *extra):
    from qwen_data.cli import main

    assert main(["sft", "--quiet", "--workers", "1", *map(str, inputs), "-o", str(prefix), *map(str, extra)]) == 0
    return str(prefix)


# -- HF references -----------------------------------------------------------------------------
def hf_plain_text(hf, text: str) -> list[int]:
    """HF's own normalizer, pre-tokenizer and BPE model with no added-token matching: literal
    special strings are ordinary characters."""
    ids = []
    for piece, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(text)):
        ids.extend(t.id for t in hf.model.tokenize(piece))
    return ids


ADDED_TOKENS = {"qwen2": 3, "qwen2p5": 22, "qwen3": 26}


@functools.lru_cache(maxsize=None)
def hf_chat_tokenizer(template: str):
    """transformers' fast tokenizer on the bundled files, added tokens cut to the template's Qwen flavour."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from qwen_data.text.tokenizer import bundled_tokenizer_dir

    with open(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    spec["added_tokens"] = spec["added_tokens"][: ADDED_TOKENS[template]]
    return PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)))


def hf_ids(template: str, record: dict, oracle: str | None = None, assistant_mask=False):
    """`apply_chat_template(tokenize=True)` with the official template file of `template`."""
    import copy

    from _oracles import load_oracle
    from qwen_data.text.templates import ORACLE_FILES

    return hf_chat_tokenizer(template).apply_chat_template(
        copy.deepcopy(record["messages"]), tools=copy.deepcopy(record.get("tools")),
        chat_template=load_oracle(oracle or ORACLE_FILES[template]), tokenize=True, return_dict=True,
        return_assistant_tokens_mask=assistant_mask,
    )


def qwen25_tokenizer_folder(path) -> str:
    """A Qwen2.5 tokenizer folder made from the bundled (Qwen3) files: the added tokens cut to
    Qwen2.5's 22, in tokenizer.json and in tokenizer_config.json (which slow tokenizers read), and
    the official Qwen2.5 chat template. What a Qwen2.5-Instruct download holds, for tokenizing."""
    from qwen_data.text.tokenizer import bundled_tokenizer_dir

    source, path = bundled_tokenizer_dir(), Path(path)
    path.mkdir(parents=True, exist_ok=True)
    last = 151643 + ADDED_TOKENS["qwen2p5"]
    for name in ("vocab.json", "merges.txt"):
        shutil.copyfile(os.path.join(source, name), path / name)
    with open(os.path.join(source, "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["id"] < last]
    (path / "tokenizer.json").write_text(json.dumps(spec, ensure_ascii=False), encoding="utf-8")
    with open(os.path.join(source, "tokenizer_config.json"), encoding="utf-8") as f:
        config = json.load(f)
    config["added_tokens_decoder"] = {i: t for i, t in config["added_tokens_decoder"].items() if int(i) < last}
    kept = {t["content"] for t in config["added_tokens_decoder"].values()}
    config["additional_special_tokens"] = [t for t in config["additional_special_tokens"] if t in kept]
    oracles = REPO_ROOT.parent / "shared" / "oracles"
    config["chat_template"] = (oracles / "qwen2.5-instruct.jinja").read_text(encoding="utf-8")
    (path / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2), encoding="utf-8")
    return str(path)
