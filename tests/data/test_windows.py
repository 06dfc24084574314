"""Where the certificate's reference cuts a long text (`certify.sample.window`): only where HF's own
pre-tokenizer cuts, in every script, so that a window's ids are the whole text's ids there."""

import os
import random
import unicodedata

import pytest
from multilingual import corpus
from tokenizers import Tokenizer

from qwen_data.certify import sample
from qwen_data.text.bundled import bundled_tokenizer_dir

# Texts where a cut is near what NFC or the pre-tokenizer could join: marks after a newline or a space,
# jamo, numerics that are not digits, letters of every script on either side of both cuts.
EDGES = ["a\n\u0301b c\u0301 d", "x ² y\n²z", "가\n\u1100\u1161 \u1100\u1161", "word\n\u00e9t\u00e9 \u00e9t\u00e9",
         "Ⅻ a\nⅫ b", "a\u0345 b\n\u0345c", "e\u0301 f", "\u0915\u094d\u0937 \u0915", "中文\n中文 中文",
         "ا\u064b ب\nب", "\u3042\n\u3042 \u3042", "x\r\ny \t z", "ǅ ǅ\nǅ", "ß ſ\nﬁ", "'s\nit's 're\n're"]


def _texts() -> list[str]:
    rng = random.Random(1)
    pieces = corpus(300, seed=3, specials=False) + EDGES
    # joined with newlines and spaces, so that every script meets every other at both kinds of cut
    joined = [rng.choice(["\n", " ", "\n\n", " \n"]).join(rng.sample(pieces, 6)) for _ in range(200)]
    return [unicodedata.normalize("NFC", t) for t in pieces + joined]


@pytest.fixture(scope="module")
def hf():
    tokenizer = Tokenizer.from_file(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"))
    return lambda text: tokenizer.encode(text, add_special_tokens=False).ids


def test_every_cut_is_one_hf_makes(hf):
    rng, checked = random.Random(2), 0
    for text in _texts():
        whole = hf(text)
        cuts = [m.start() for m in sample.CUT.finditer(text)]
        for at in cuts if len(cuts) <= 12 else rng.sample(cuts, 12):
            assert hf(text[:at]) + hf(text[at:]) == whole, repr(text[max(0, at - 30):at + 30])
            checked += 1
    assert checked > 3000


@pytest.mark.parametrize("region", [sample.REGION, 5])
def test_utf8_is_cut_where_its_text_is(monkeypatch, region):
    """The UTF-8 of a text, decoded a region at a time (5 bytes: regions grown many times, their
    edges inside characters), gives the cut its text gives, from any byte."""
    monkeypatch.setattr(sample, "REGION", region)
    rng = random.Random(4)
    for text in _texts()[::3]:
        data = text.encode("utf-8")
        for at in rng.sample(range(len(data) + 1), min(len(data) + 1, 20)):
            characters = len(data[:at].decode("utf-8", "ignore"))  # the character at or after byte `at`
            characters += bool(at < len(data) and 0x80 <= data[at] < 0xC0)
            found = sample.CUT.search(text, characters)
            expected = None if found is None else len(text[:found.start()].encode("utf-8"))
            assert sample._cut_at(data, at) == expected, (repr(text[:80]), at)


def test_a_long_text_in_any_script_is_checked_on_a_window():
    rng = random.Random(5)
    for alphabet in ("中文的一是在不了有和人这", "ابتثجحخدذرزسشصضطظ", "あいうえおかきくけこ", "абвгдеёжзийклмн"):
        lines = ["".join(rng.choice(alphabet) for _ in range(rng.randint(20, 60))) for _ in range(400)]
        data = "\n".join(lines).encode("utf-8")
        for seed in range(20):
            start, stop = sample.window(data, seed)
            assert sample.WINDOW_BYTES <= stop - start <= sample.WINDOW_BYTES + 4 * 61, alphabet
            assert data[start - 1:start] == b"\n"
