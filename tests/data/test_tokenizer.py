"""Our encoding equals Hugging Face `tokenizers` on the same files, for every flavour and policy."""

import json
import os

import numpy as np
import pytest
from _helpers import hf_plain_text, qwen25_tokenizer_folder
from multilingual import SPECIAL_LITERALS, corpus
from tokenizers import Tokenizer

from qwen_data.qwen import DEFAULT_PAD_ID
from qwen_data.text.tokenizer import (SPECIAL_POLICIES, QwenTokenizer, TokenizerConfig, TokenizerNotFound,
                                      bundled_tokenizer_dir)

TEXTS = corpus(600, seed=1)


def hf_reference(flavour: str) -> Tokenizer:
    """HF tokenizers on the bundled files, its added tokens cut to the flavour's set.

    The Qwen3 files are the genuine ones; Qwen2.5's and Qwen2's tokenizers are the same BPE with the
    first 22 and 3 added tokens.
    """
    with open(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    keep = {"qwen2": 3, "qwen2.5": 22, "qwen3": 26}[flavour]
    spec["added_tokens"] = spec["added_tokens"][:keep]
    return Tokenizer.from_str(json.dumps(spec))


def split(flat, lengths):
    return [a.tolist() for a in np.split(flat, np.cumsum(lengths)[:-1])] if len(lengths) else []


def test_corpus_covers_the_hard_cases():
    joined = "".join(TEXTS)
    for needle in ["的", "ا", "😀", "\u0301", "\u00a0", " " * 30, "def ", "<|im_end|>", "<think>"]:
        assert needle in joined


@pytest.mark.parametrize("backend", ["gigatoken", "hf"])
@pytest.mark.parametrize("flavour", ["qwen3", "qwen2.5", "qwen2"])
def test_parse_policy_matches_hf(flavour, backend):
    ours = QwenTokenizer(TokenizerConfig(flavour=flavour, backend=backend))
    hf = hf_reference(flavour)
    got = split(*ours.encode_batch(TEXTS, special="parse"))
    want = [e.ids for e in hf.encode_batch(TEXTS, add_special_tokens=False)]
    assert got == want
    assert split(*ours.encode_batch([t.encode() for t in TEXTS], special="parse")) == want  # as a jsonl line's


@pytest.mark.parametrize("backend", ["gigatoken", "hf"])
def test_text_policy_matches_hf_without_added_tokens(backend):
    ours = QwenTokenizer(TokenizerConfig(backend=backend))
    hf = Tokenizer.from_file(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"))
    got = split(*ours.encode_batch(TEXTS, special="text"))
    assert got == [hf_plain_text(hf, t) for t in TEXTS]


def test_batch_call_matches_hf(monkeypatch):
    """After BATCH_AFTER texts a tokenizer encodes through gigatoken's batch call; the tests
    above, text by text."""
    import qwen_data.text.tokenizer as tokenizer

    monkeypatch.setattr(tokenizer, "BATCH_AFTER", 0)
    ours = QwenTokenizer()
    hf = hf_reference("qwen3")
    got = split(*ours.encode_batch(TEXTS, special="parse"))
    assert got == [e.ids for e in hf.encode_batch(TEXTS, add_special_tokens=False)]


# Where NFC meets a literal: '>' then U+0338 composes to '≯' unless the '>' ends a literal kept as a
# control token; marks after and before literals; U+212A KELVIN SIGN, whose NFC is K, before one.
BOUNDARIES = ["<think>\u0338", "x>\u0338<|im_end|>\u0338y", "\u212a<think>e\u0301</think>\u0301",
              "<tool_call>\u0338\u0301", "e<|endoftext|>\u0301", "\u1e0b\u0323<|im_start|>\u00c5\u0323</tool_call>"]


@pytest.mark.parametrize("special", SPECIAL_POLICIES)
def test_every_policy_matches_hf_where_normalization_meets_a_literal(special):
    """gigatoken built from the rank file gets its texts in NFC, normalized between the literals the
    policy keeps, as HF normalizes them (`QwenTokenizer.gigatoken_input`)."""
    ours, hf = QwenTokenizer(), QwenTokenizer(TokenizerConfig(backend="hf"))
    assert ours._rank_file(), "the default backend is built from the rank file"
    texts = BOUNDARIES + TEXTS
    assert split(*ours.encode_batch(texts, special)) == split(*hf.encode_batch(texts, special))


@pytest.mark.slow  # builds the rank file from tokenizer.json: ~10 s
def test_qwen_files_build_gigatoken_from_a_rank_file(tmp_path, monkeypatch):
    """Qwen's tokenizer.json (Qwen3's; Qwen2.5's added tokens) gives a rank file from which gigatoken
    builds the BPE it builds from the file: the same vocabulary and merges in the same order. A file
    with other settings gives none, and gigatoken reads the file itself."""
    import gigatoken

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for folder in (bundled_tokenizer_dir(), qwen25_tokenizer_folder(tmp_path / "qwen2.5")):
        tok = QwenTokenizer(TokenizerConfig(name=folder))
        assert tok._rank_file(), folder
        ranked, whole = tok.backend("parse"), gigatoken.Tokenizer.from_json(tok._spec("parse"))
        assert ranked.vocab == whole.vocab and ranked.merges == whole.merges

    with open(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    spec["model"]["ignore_merges"] = True  # a word in the vocabulary is one token, whatever the merges
    other = tmp_path / "ignore-merges"
    other.mkdir()
    (other / "tokenizer.json").write_text(json.dumps(spec), encoding="utf-8")
    tok = QwenTokenizer(TokenizerConfig(name=str(other)))
    assert tok._rank_file() is None
    hf = Tokenizer.from_str(json.dumps(spec))
    got = split(*tok.encode_batch(TEXTS[:100], special="parse"))
    assert got == [e.ids for e in hf.encode_batch(TEXTS[:100], add_special_tokens=False)]


def test_derived_arrays_are_cached_by_content(tmp_path, monkeypatch):
    """What is derived from the tokenizer's files is built once and kept under their hash in
    $XDG_CACHE_HOME/qwen-data; a cache that cannot be written or read is only rebuilt."""
    import qwen_data.text.tokenizer as tokenizer

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    tok = QwenTokenizer()
    fresh = tok.token_byte_lengths()
    files = list((tmp_path / "cache" / "qwen-data").glob(f"{tok.sha256}-*/*.npy"))
    assert len(files) == 1
    monkeypatch.setattr(QwenTokenizer, "_token_byte_lengths", lambda self: pytest.fail("rebuilt"))
    assert np.array_equal(tok.token_byte_lengths(), fresh)  # from the file
    monkeypatch.undo()

    files[0].write_bytes(b"not an array")  # a broken file is rebuilt and replaced
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert np.array_equal(tok.token_byte_lengths(), fresh)
    assert np.array_equal(np.load(files[0]), fresh)

    unwritable = tmp_path / "a-file"  # (chmod cannot stop root from writing)
    unwritable.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(unwritable))
    assert tokenizer.cache_dir().startswith(str(unwritable))
    assert np.array_equal(tok.token_byte_lengths(), fresh)
    assert not list(tmp_path.glob("**/*.tmp"))


def _poisoned(tmp_path, monkeypatch, damage):
    """A tokenizer built on a cache in tmp_path whose files `damage(cache folder)` altered after
    their build; → (its ids of a text, the ids of a tokenizer without any cache file)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    text = "hello world, tokenizers."
    clean = QwenTokenizer()
    want = clean.encode(text).tolist()
    clean.token_byte_lengths()
    damage(tmp_path / "cache" / "qwen-data" / f"{clean.sha256}-{clean.vocab_size}")
    return QwenTokenizer(), text, want


def test_a_rank_file_with_two_pieces_swapped_is_rebuilt(tmp_path, monkeypatch, capsys):
    """Two pieces swapped in the derived rank file would give every later run wrong ids (verify,
    which reads only the data, says ok): its bytes are checked against their sha256 recorded at
    build time, and the file is rebuilt, named on stderr."""
    ids = QwenTokenizer().encode("hello world").tolist()

    def swap(folder):
        lines = (folder / "bpe.tiktoken").read_text().splitlines(keepends=True)
        (a, i), (b, j) = (lines[k].split() for k in ids[:2])
        lines[ids[0]], lines[ids[1]] = f"{b} {i}\n", f"{a} {j}\n"
        (folder / "bpe.tiktoken").write_text("".join(lines))

    tok, text, want = _poisoned(tmp_path, monkeypatch, swap)
    capsys.readouterr()
    assert tok.encode(text).tolist() == want
    err = capsys.readouterr().err
    assert "bpe.tiktoken did not match" in err and "tokenizer.json; rebuilt" in err and len(err.splitlines()) == 1
    assert QwenTokenizer().encode(text).tolist() == want and not capsys.readouterr().err  # rebuilt for good


def test_a_truncated_rank_file_and_a_flipped_array_byte_are_rebuilt(tmp_path, monkeypatch, capsys):
    def damage(folder):
        ranks = folder / "bpe.tiktoken"
        ranks.write_bytes(ranks.read_bytes()[: ranks.stat().st_size // 2])
        array = next(folder.glob("byte_lengths*.npy"))
        data = bytearray(array.read_bytes())
        data[-3] ^= 0x01  # (a length of the last ids: still an array of the right shape)
        array.write_bytes(bytes(data))

    tok, text, want = _poisoned(tmp_path, monkeypatch, damage)
    fresh = QwenTokenizer(TokenizerConfig(backend="hf"))._token_byte_lengths()
    capsys.readouterr()
    assert tok.encode(text).tolist() == want
    assert np.array_equal(tok.token_byte_lengths(), fresh)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "bpe.tiktoken did not match" in err[0] and "byte_lengths.npy did not match" in err[1]


def test_cached_added_tokens_are_checked(tmp_path, monkeypatch, capsys):
    """The added tokens (their ids decide what a literal becomes) are a derived file too."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    want = QwenTokenizer().added_tokens
    path = tmp_path / "cache" / "qwen-data" / f"{QwenTokenizer().sha256}.added_tokens.json"
    path.write_text(path.read_text().replace('"id": 151645', '"id": 151643'))
    capsys.readouterr()
    assert QwenTokenizer().added_tokens == want
    assert "added_tokens.json did not match" in capsys.readouterr().err


def test_flavour_decides_what_is_special():
    text = "a<think>b</think><|im_end|>"
    q3 = QwenTokenizer(TokenizerConfig(flavour="qwen3")).encode(text).tolist()
    q25 = QwenTokenizer(TokenizerConfig(flavour="qwen2.5")).encode(text).tolist()
    assert 151667 in q3 and 151667 not in q25
    assert q3[-1] == q25[-1] == 151645


def test_facts():
    tok = QwenTokenizer()
    assert tok.flavour == "qwen3" and tok.vocab_size == 151669 and tok.eod_id == 151643
    assert tok.token_id("<|im_end|>") == 151645 and tok.token_id("<|vision_pad|>") == DEFAULT_PAD_ID
    assert QwenTokenizer(TokenizerConfig(flavour="qwen2.5")).vocab_size == 151665
    for literal in SPECIAL_LITERALS[:11]:
        assert tok.find_special("x" + literal + "y") is not None
    assert tok.find_special("plain <|im_end text") is None
    # Every id's byte length, summed, is the UTF-8 length of the NFC text.
    import unicodedata

    lengths = tok.token_byte_lengths()
    for text in TEXTS[:100]:
        ids = tok.encode(text, special="text")
        assert lengths[ids].sum() == len(unicodedata.normalize("NFC", text).encode("utf-8"))


def test_local_directory_and_hub_cache(tmp_path, monkeypatch):
    local = tmp_path / "mytok"
    local.mkdir()
    for name in os.listdir(bundled_tokenizer_dir()):
        (local / name).write_bytes(open(os.path.join(bundled_tokenizer_dir(), name), "rb").read())
    tok = QwenTokenizer(TokenizerConfig(name=str(local)))
    assert tok.sha256 == QwenTokenizer().sha256
    assert tok.encode("hello world").tolist() == [14990, 1879]

    # A Hub name resolves only through the local cache; nothing is downloaded.
    cache = tmp_path / "hub"
    snap = cache / "models--Qwen--Qwen3-0.6B" / "snapshots" / "abc123"
    snap.mkdir(parents=True)
    for name in os.listdir(local):
        (snap / name).write_bytes((local / name).read_bytes())
    (cache / "models--Qwen--Qwen3-0.6B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text("abc123")
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hc

    monkeypatch.setattr(hc, "HF_HUB_CACHE", str(cache))
    tok = QwenTokenizer(TokenizerConfig(name="Qwen/Qwen3-0.6B"))
    assert tok.name == "Qwen/Qwen3-0.6B" and tok.sha256 == QwenTokenizer().sha256
    with pytest.raises(TokenizerNotFound, match="never downloads"):
        QwenTokenizer(TokenizerConfig(name="Qwen/Not-In-Cache"))


def test_a_shared_tokenizer_is_reused_until_its_text_budget_is_spent(monkeypatch):
    """Runs in one process share a built tokenizer, but not past SHARED_TEXT_BUDGET characters of
    encoded text: its backends' caches grow with that text."""
    import qwen_data.text.tokenizer as tokenizer

    first = tokenizer.QwenTokenizer.shared(tokenizer.TokenizerConfig())
    assert tokenizer.QwenTokenizer.shared(tokenizer.TokenizerConfig()) is first
    monkeypatch.setattr(tokenizer, "SHARED_TEXT_BUDGET", first.encoded + 10)
    first.encode_batch(["eleven char"])
    assert first.encoded > tokenizer.SHARED_TEXT_BUDGET
    renewed = tokenizer.QwenTokenizer.shared(tokenizer.TokenizerConfig())
    assert renewed is not first and renewed.encoded == 0
    assert tokenizer.QwenTokenizer.shared(tokenizer.TokenizerConfig()) is renewed


def test_native_utf8_is_each_texts_utf8():
    """The encoder is handed the texts' UTF-8 made by `_native.utf8` (ASCII runs several characters at a time):
    Python's own, for texts of every width and runs that end anywhere; None where one holds a lone surrogate
    (the str is then encoded, and refused, as before)."""
    import random

    from qwen_data._native import utf8

    rng = random.Random(11)
    pool = ["a", " ", "\u00e9", "\u00ff", "\u201c", "\u4e2d", "\U0001f600", "\n", "\x00"]
    texts = ["", "ascii only"] + ["".join(rng.choice(pool) if rng.random() < 0.3 else "x"
                                          for _ in range(rng.randrange(40))) for _ in range(3000)]
    # 2-byte texts mostly of non-ASCII runs (Arabic, Cyrillic), at the 2- and 3-byte boundaries
    dense = ["\u0627", "\u044f", "\u0080", "\u07ff", "\u0800", "\uffff", " ", "a", "\u4e2d"]
    texts += ["".join(rng.choice(dense) for _ in range(rng.randrange(1, 40))) for _ in range(3000)]
    assert utf8(texts) == [t.encode("utf-8") for t in texts]
    assert utf8(["fine", "a\ud800b"]) is None
    assert utf8(["\u0627\u0644\udfff\u0627"]) is None and utf8(["\u0627\u0644\ud800"]) is None
