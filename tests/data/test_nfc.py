"""`text.nfc`: a text it does not name as a suspect (or, of those, as unsettled) is in NFC, as
`unicodedata.is_normalized` says, for every way a text can fail to be: a code point NFC changes alone, a
mark out of order, a pair that composes (by table and, for Hangul, by rule), a mark after a character
NFD splits; and the tables it keeps are checked before use."""

import os
import random
import unicodedata

import numpy as np
import pytest

from qwen_data.text import nfc
from qwen_data.text.cache import cache_dir


def _pairs():
    """Every canonical composition pair (first, second), and Hangul's L+V and LV+T by rule."""
    pairs = []
    for c in range(nfc.CODE_POINTS):
        parts = unicodedata.decomposition(chr(c)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):
            pairs.append((chr(int(parts[0], 16)), chr(int(parts[1], 16))))
    return pairs + [("\u1100", "\u1161"), ("\uac00", "\u11a8"), ("\u1112", "\u1175"), ("\uc544", "\u11c2")]


def _as_utf8(namer):
    """The same question asked of the texts' UTF-8 (as the pretraining step hands jsonl texts over)."""
    return lambda texts: namer([t.encode("utf-8") for t in texts])


NAMERS = {"suspects": nfc.suspects, "unsettled": nfc.unsettled,
          "suspects of UTF-8": _as_utf8(nfc.suspects), "unsettled of UTF-8": _as_utf8(nfc.unsettled)}


def _not_normalized_named(texts, namer=nfc.suspects):
    named = set(namer(texts))
    return [t for k, t in enumerate(texts) if k not in named and not unicodedata.is_normalized("NFC", t)]


@pytest.mark.parametrize("namer", NAMERS)
def test_every_pair_that_composes_is_named(namer):
    texts = [f"x {first}{second} y" for first, second in _pairs()]
    assert len(texts) > 900
    assert _not_normalized_named(texts, NAMERS[namer]) == []
    if namer.startswith("suspects"):
        assert len(NAMERS[namer](texts)) == len(texts)  # each holds a second part


@pytest.mark.parametrize("namer", NAMERS)
def test_every_code_point_nfc_changes_or_moves_is_named(namer):
    changed = [chr(c) for c in range(0x300, nfc.CODE_POINTS) if not 0xD800 <= c < 0xE000
               and (not unicodedata.is_normalized("NFC", chr(c)) or unicodedata.combining(chr(c)))]
    assert len(changed) > 1000
    texts = [f"\u4e2d{c}\u0301a" for c in changed]  # after a base and before a mark: every width of str
    # and after a character NFD splits (a mark then reorders or composes with what it splits into)
    texts += [f"\u00e9{c}" for c in changed] + [f"\uac00{c}" for c in changed] + [f"\u1ec7{c}" for c in changed]
    assert _not_normalized_named(texts, NAMERS[namer]) == []
    assert len(nfc.suspects([f"\u4e2d{c}" for c in changed])) == len(changed)
    assert NAMERS[namer](texts) == NAMERS[namer.split()[0]](texts)  # str and UTF-8 answer alike


POOLS = ["abc xyz", "\u00e9\u00fc\u00df", "\u4e2d\u6587\u5b57", "\u041a\u0438\u0440", "\u0301\u0308\u0323\u0345",
         "\u1100\u1161\u11a8\uac00", "\u0dd9\u0dcf\u0dca", "\u212b\u2126\uf900", "\U0001f600\U00010348\U0001d15e",
         "\u201c\u201d\u2014", "\u0627\u0644\u0651\u064e",
         # Indic: viramas, vowel signs that are the second of a pair (Bengali, Tamil, Oriya), nuktas
         "\u0915\u094d\u0937\u093c\u093e", "\u09c7\u09be\u09d7\u0995\u09cd", "\u0bc6\u0bbe\u0b95\u0bcd",
         "\u0b47\u0b3e\u0b56\u0b15", "\u0e01\u0e38\u0e48\u0e33", "\u1ec7\u0323\u0302\u0065"]


@pytest.mark.parametrize("namer", NAMERS)
def test_random_texts_not_named_are_normalized(namer):
    rng = random.Random(7)
    texts = ["".join(rng.choice(rng.choice(POOLS)) for _ in range(rng.randint(1, 12))) for _ in range(30000)]
    assert _not_normalized_named(texts, NAMERS[namer]) == []
    named = set(NAMERS[namer](texts))
    stable = [t for k, t in enumerate(texts) if k not in named]
    assert len(stable) > 2000 and any(not t.isascii() for t in stable)  # the fast answer is given, and used
    assert NAMERS[namer](texts) == NAMERS[namer.split()[0]](texts)  # str and UTF-8 answer alike


def test_indic_and_arabic_texts_in_nfc_are_settled():
    """The point of the finer check: texts the bit test suspects for their viramas and vowel signs, in
    which NFC changes nothing, are proven so without Python's check."""
    texts = ["\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",  # Hindi
             "\u0bb5\u0ba3\u0b95\u0bcd\u0b95\u0bae\u0bcd \u0b89\u0bb2\u0b95\u0bae\u0bcd",  # Tamil
             "\u0986\u09ae\u09be\u09b0 \u09b8\u09cb\u09a8\u09be\u09b0 \u09ac\u09be\u0982\u09b2\u09be",  # Bengali
             "\u0627\u0644\u0652\u0639\u064e\u0631\u064e\u0628\u0650\u064a\u064e\u0651\u0629"]  # Arabic, marks in order
    assert all(unicodedata.is_normalized("NFC", t) for t in texts)
    assert nfc.suspects(texts) == [0, 1, 2, 3]
    assert nfc.unsettled(texts) == []
    assert nfc.unsettled(["\u09c7\u09be", "\u0627\u0651\u064e", "\u00e9\u0323", "\uac00\u11a8"]) == [0, 1, 2, 3]


def test_its_bits_are_checked_before_use(capsys):
    path = os.path.join(cache_dir(), f"nfc-stable-{unicodedata.unidata_version}-{nfc.RULE}.npy")
    nfc.stable_bits.cache_clear()
    good = nfc.stable_bits().copy()
    with open(path, "r+b") as f:  # the bit of U+0301 (a mark) set: texts holding it would be taken as NFC
        f.seek(-(nfc.CODE_POINTS // 8) + 0x301 // 8, os.SEEK_END)
        byte = f.read(1)[0]
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte | 1 << (0x301 % 8)]))
    nfc.stable_bits.cache_clear()
    try:
        assert np.array_equal(nfc.stable_bits(), good)
        assert "nfc-stable" in capsys.readouterr().err
        assert nfc.suspects(["e\u0301"]) == [0]
    finally:
        nfc.stable_bits.cache_clear()


@pytest.mark.parametrize("text", ["", "ascii", "caf\u00e9", "\u4e2d\u6587", "\U0001f600"])
def test_texts_in_nfc_of_every_width_are_not_suspects(text):
    assert nfc.suspects([text]) == []


def test_a_two_byte_text_is_suspect_wherever_its_unstable_character_stands():
    """2-byte texts are scanned eight characters a compare: a mark at any place (before, in, across and after
    the blocks) makes the text a suspect, and one holding only stable characters, above U+0300 too, is not."""
    for n in (7, 8, 9, 16, 17, 40):
        for at in range(n):
            text = ["a"] * n
            text[at] = "\u0301"
            assert nfc.suspects(["".join(text) + "\u201c"]) == [0], (n, at)
        assert nfc.suspects(["\u201c" + "b\u00e9\u4e2d\u2014" * n]) == []


def test_utf8_is_suspect_wherever_its_unstable_character_stands():
    """UTF-8 is scanned sixteen bytes a compare: a mark at any place (before, in, across and after the blocks)
    makes the text a suspect; stable characters of every UTF-8 length do not; bytes that are not UTF-8 are
    suspects, for the normalizing to say why."""
    for n in (1, 15, 16, 17, 31, 32, 33, 50):
        for at in range(n):
            text = ["\u00e9"] * n
            text[at] = "\u0301"
            assert nfc.suspects(["".join(text).encode()]) == [0], (n, at)
        assert nfc.suspects([("\u201c" + "b\u00e9\u4e2d\U0001f600" * n).encode()]) == []
    assert nfc.suspects([b"\xcc", b"a\xe2\x82", b"\xed\xa0\x80"]) == [0, 1, 2]
    assert nfc.unsettled([b"e\xcc\x81", b"\xe0\xa4\x95\xe0\xa5\x8d"]) == [0]


# -- nfc.normalize: NFC in C from the same tables, held to unicodedata ------------------------------------
def test_every_code_point_alone_and_after_a_starter_normalizes_as_unicodedata():
    """Each code point (surrogates aside: unicodedata's) alone and after "a": its decomposition, its class,
    its composition with what comes before."""
    wrong = [c for c in range(nfc.CODE_POINTS) if not 0xD800 <= c < 0xE000
             for text in (chr(c), "a" + chr(c) + "\u0301") if nfc.normalize(text) != unicodedata.normalize("NFC", text)]
    assert wrong == []


def test_every_pair_that_composes_normalizes_as_unicodedata_decomposed_and_reordered():
    """Each pair, as it is, decomposed, and with marks of other classes between and after (blocked or not)."""
    texts = []
    for first, second in _pairs():
        whole = unicodedata.normalize("NFD", first + second)
        texts += [first + second, whole, first + "\u0323" + second, first + "\u0301" + second + "\u0316",
                  first + "\u05b0" + second, unicodedata.normalize("NFD", first) + "\u0345" + second]
    assert [t for t in texts if nfc.normalize(t) != unicodedata.normalize("NFC", t)] == []


def test_random_texts_normalize_as_unicodedata():
    rng = random.Random(11)
    marks = [chr(c) for c in range(0x300, 0x370)] + ["\u0651", "\u064e", "\u0650", "\u0654", "\u0655", "\u093c",
                                                      "\u09be", "\u09d7", "\u0b3e", "\u0b56", "\u3099", "\u309a"]
    pools = POOLS + [marks, ["\u1100", "\u1161", "\u11a8", "\uac00", "\uc544", "\u11c2", "\u1175", "\u1112"]]
    texts = ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 16))) for _ in range(60000)]
    assert [t for t in texts if nfc.normalize(t) != unicodedata.normalize("NFC", t)] == []
    assert sum(unicodedata.normalize("NFC", t) != t for t in texts) > 20000  # (most of them change)


def test_a_surrogate_is_left_to_unicodedata():
    assert nfc.normalize("e\u0301\ud800") == unicodedata.normalize("NFC", "e\u0301\ud800")


def test_its_normalizing_tables_are_checked_before_use(capsys):
    """A damaged cache (a decomposition changed) is named and derived again, never used."""
    path = os.path.join(cache_dir(), f"nfc-normalizing-{unicodedata.unidata_version}-{nfc.NORMALIZING_RULE}.npy")
    nfc.normalizing.cache_clear()
    nfc.normalizing()
    with open(path, "r+b") as f:  # a code point of the first decomposition changed
        size = os.path.getsize(path)
        f.seek(size - 4 * (3 * len(nfc.normalizing()[4]) + len(nfc.normalizing()[2])))
        f.write(b"\x42\x00\x00\x00")  # (A → B: À would spell B\u0300)
    nfc.normalizing.cache_clear()
    try:
        assert nfc.normalize("\u00c0\u0301") == unicodedata.normalize("NFC", "\u00c0\u0301")
        assert "nfc-normalizing" in capsys.readouterr().err
    finally:
        nfc.normalizing.cache_clear()
