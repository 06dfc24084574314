"""Code points for which gigatoken's ids can differ from HF `tokenizers`', and fast tests for them.

The two backends read Unicode from tables of different ages:
  gigatoken  NFC from ICU4X (Unicode 17), the split regex's \\p{L}/\\p{N} from Unicode 17;
  HF         NFC from unicode-normalization-alignments (Unicode 9), the split regex in Oniguruma (Unicode 16).
So three kinds of code points get different ids:
  marks      combining marks assigned after Unicode 9: gigatoken knows their combining class and
             reorders them against neighbouring marks, HF leaves them in place (NKo U+07F3 U+07FD);
  pairs      the parts of canonical compositions added after Unicode 9 (Dives Akuru, Todhri,
             Tulu-Tigalari, Gurung Khema, Kirat Rai), and what they compose into: gigatoken
             composes them, HF does not;
  letters    letters and digits of Unicode 17 (CJK Extension J, Sidetic, Tolong Siki, Beria Erfe,
             Tai Yo, ...): \\p{L}/\\p{N} to gigatoken, punctuation to Oniguruma, so words split apart.
`QwenTokenizer` sends every text that holds one of them to HF `tokenizers`.

EXACT_RANGES is measured, not written by hand: tests/data/test_unicode_exact.py runs both backends on every
code point but surrogates, alone and between combining marks of several classes (NFC compared), after an
apostrophe and before a letter (the split compared, with a vocabulary that makes every split show in
the ids), and in every pair that a composition newer than the tables could join; the test fails when
a code point whose output differs is missing here. After upgrading `tokenizers` or gigatoken,
regenerate with `python3 tests/data/test_unicode_exact.py` (it prints the ranges to paste below) and run
that test.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from .._native import nfc_suspects

# (first, last) inclusive; see the module docstring.
EXACT_RANGES: tuple[tuple[int, int], ...] = (
    (0x007FD, 0x007FD),  # marks
    (0x0088F, 0x0088F),  # letters
    (0x00897, 0x0089F),  # marks
    (0x008CA, 0x008D3),  # marks
    (0x009FE, 0x009FE),  # marks
    (0x00C3C, 0x00C3C),  # marks
    (0x00C5C, 0x00C5C),  # letters
    (0x00CDC, 0x00CDC),  # letters
    (0x00D3B, 0x00D3C),  # marks
    (0x00EBA, 0x00EBA),  # marks
    (0x01715, 0x01715),  # marks
    (0x01ABF, 0x01ADD),  # marks
    (0x01AE0, 0x01AEB),  # marks
    (0x01DF6, 0x01DFA),  # marks
    (0x0A7CE, 0x0A7CF),  # letters
    (0x0A7D2, 0x0A7D2),  # letters
    (0x0A7D4, 0x0A7D4),  # letters
    (0x0A7F1, 0x0A7F1),  # letters
    (0x0A82C, 0x0A82C),  # marks
    (0x105C9, 0x105C9),  # pairs
    (0x105D2, 0x105D2),  # pairs
    (0x105DA, 0x105DA),  # pairs
    (0x105E4, 0x105E4),  # pairs
    (0x10940, 0x10959),  # letters
    (0x10D24, 0x10D27),  # marks
    (0x10D69, 0x10D6D),  # marks
    (0x10EAB, 0x10EAC),  # marks
    (0x10EC5, 0x10EC7),  # letters
    (0x10EFA, 0x10EFB),  # marks
    (0x10EFD, 0x10EFF),  # marks
    (0x10F46, 0x10F50),  # marks
    (0x10F82, 0x10F85),  # marks
    (0x11070, 0x11070),  # marks
    (0x1133B, 0x1133B),  # marks
    (0x11382, 0x11385),  # pairs
    (0x1138B, 0x1138B),  # pairs
    (0x1138E, 0x1138E),  # pairs
    (0x11390, 0x11391),  # pairs
    (0x113B8, 0x113B8),  # pairs
    (0x113BB, 0x113BB),  # pairs
    (0x113C2, 0x113C2),  # pairs
    (0x113C5, 0x113C5),  # pairs
    (0x113C7, 0x113C9),  # pairs
    (0x113CE, 0x113D0),  # marks
    (0x1145E, 0x1145E),  # marks
    (0x11839, 0x1183A),  # marks
    (0x11930, 0x11930),  # pairs
    (0x11935, 0x11935),  # pairs
    (0x11938, 0x11938),  # pairs
    (0x1193D, 0x1193E),  # marks
    (0x11943, 0x11943),  # marks
    (0x119E0, 0x119E0),  # marks
    (0x11A34, 0x11A34),  # marks
    (0x11A47, 0x11A47),  # marks
    (0x11A99, 0x11A99),  # marks
    (0x11D42, 0x11D42),  # marks
    (0x11D44, 0x11D45),  # marks
    (0x11D97, 0x11D97),  # marks
    (0x11DB0, 0x11DDB),  # letters
    (0x11DE0, 0x11DE9),  # letters
    (0x11F41, 0x11F42),  # marks
    (0x1611E, 0x16129),  # pairs
    (0x1612F, 0x1612F),  # marks
    (0x16D63, 0x16D63),  # pairs
    (0x16D67, 0x16D6A),  # pairs
    (0x16EA0, 0x16EB8),  # letters
    (0x16EBB, 0x16ED3),  # letters
    (0x16FF0, 0x16FF6),  # marks+letters
    (0x187F8, 0x187FF),  # letters
    (0x18D09, 0x18D1E),  # letters
    (0x18D80, 0x18DF2),  # letters
    (0x1E08F, 0x1E08F),  # marks
    (0x1E130, 0x1E136),  # marks
    (0x1E2AE, 0x1E2AE),  # marks
    (0x1E2EC, 0x1E2EF),  # marks
    (0x1E4EC, 0x1E4EF),  # marks
    (0x1E5EE, 0x1E5EF),  # marks
    (0x1E6C0, 0x1E6DE),  # letters
    (0x1E6E0, 0x1E6F5),  # marks+letters
    (0x1E6FE, 0x1E6FF),  # letters
    (0x2B73A, 0x2B73F),  # letters
    (0x2CEA2, 0x2CEAD),  # letters
    (0x323B0, 0x33479),  # letters
)


def needs_exact(text: str | bytes) -> bool:
    """Whether `text` (or its UTF-8) holds a code point of EXACT_RANGES (then only HF `tokenizers` gives HF's ids).

    QwenTokenizer asks it only about the rare texts whose ids have a token for which `token_spells_start`
    is true (`exact_texts`).
    """
    return bool(exact_texts([text]))


def exact_texts(texts: list[str | bytes]) -> list[int]:
    """The indices of `texts` (str, or their UTF-8) that hold a code point of EXACT_RANGES: a bit test a
    character in C (`_native.nfc_suspects` with those code points' bits 0). Python's re took ~70 ms a MB
    of a text in several scripts: most of a 58 MB document's time, its encoding a tenth of it."""
    return nfc_suspects(texts, _outside())


@functools.lru_cache(maxsize=1)
def _outside() -> np.ndarray:
    """A bit a code point, LSB first, 1 outside EXACT_RANGES (`nfc_suspects` takes every code point below
    U+0300 as 1 without looking: none of the table is)."""
    if min(first for first, _ in EXACT_RANGES) < 0x300:
        raise RuntimeError("EXACT_RANGES holds a code point below U+0300, which nfc_suspects never tests")
    bits = np.ones(0x110000, dtype=bool)
    for first, last in EXACT_RANGES:
        bits[first:last + 1] = False
    return np.packbits(bits, bitorder="little")


@functools.lru_cache(maxsize=None)
def _utf8_pieces() -> tuple[set[bytes], set[bytes], re.Pattern]:
    """The UTF-8 of every EXACT_RANGES character, its first bytes, and a pattern of its lead bytes.
    Built on first use (~15 ms): only deriving `QwenTokenizer._spelling_starts` asks."""
    whole, heads = set(), set()
    for first, last in EXACT_RANGES:
        for c in range(first, last + 1):
            u = chr(c).encode()
            whole.add(u)
            heads.update(u[:k] for k in range(1, len(u)))
    lead = re.compile(b"[" + b"".join(re.escape(bytes([b])) for b in sorted({u[0] for u in whole})) + b"]")
    return whole, heads, lead


def token_spells_start(token: bytes) -> bool:
    """Whether a byte-level token can spell the start of an EXACT_RANGES character in UTF-8: it
    holds one, or ends with the first bytes of one. Of the tokens of a text holding such a
    character, the one with its first byte is like that; few tokens are."""
    whole, heads, lead = _utf8_pieces()
    if not lead.search(token):
        return False
    return (any(token[-k:] in heads for k in (1, 2, 3))
            or any(token[j:j + n] in whole for n in (2, 3, 4) for j in range(len(token) - n + 1)))
