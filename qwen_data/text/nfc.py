"""Which texts may not be in NFC, found at a bit test a character (`_native.nfc_suspects`).

A code point is stable when NFC leaves it as it is alone, its canonical combining class is 0 (nothing is
reordered around it) and no composition takes it as its second part (the second of a canonical
decomposition pair, or a Hangul medial vowel or final consonant, which compose by rule): then a text of
stable code points only is its own NFC, as nothing in it decomposes for good, moves or composes. Only the
other texts are asked of Python's `unicodedata` (~1.2 ns a character, a tenth of a worker's time on a
corpus of non-Latin text). The bits come from the same `unicodedata` tables (~0.6 s to derive, once a
machine: kept in the cache folder under the tables' version, checked by their sha256 before use).
tests/data/test_nfc.py compares the answers with `unicodedata.is_normalized`.
"""

from __future__ import annotations

import functools
import os
import unicodedata

import numpy as np

from .._native import nfc_suspects
from .cache import cache_dir, cached_array

CODE_POINTS = 0x110000
RULE = 1  # the derivation's version, in the cached file's name: a changed rule never reads an older rule's bits
HANGUL_SECOND = (*range(0x1161, 0x1176), *range(0x11A8, 0x11C3))  # medial vowels and final consonants (LV, LVT)


def suspects(texts: list[str]) -> list[int]:
    """The indices of `texts` that may not be in NFC (the others are)."""
    return nfc_suspects(texts, stable_bits())


@functools.lru_cache(maxsize=1)
def stable_bits() -> np.ndarray:
    """A bit a code point, 1 where it is stable (see the module's docstring), least significant first."""
    return cached_array(os.path.join(cache_dir(), f"nfc-stable-{unicodedata.unidata_version}-{RULE}.npy"),
                        f"Python's unicodedata {unicodedata.unidata_version}", _derived,
                        lambda bits: bits.dtype == np.uint8 and bits.shape == (CODE_POINTS // 8,))


def _derived() -> np.ndarray:
    seconds = set(HANGUL_SECOND)
    for c in range(CODE_POINTS):
        parts = unicodedata.decomposition(chr(c)).split()
        if len(parts) == 2 and not parts[0].startswith("<"):  # canonical, a pair: its second composes
            seconds.add(int(parts[1], 16))
    stable = np.ones(CODE_POINTS, dtype=bool)
    for c in range(CODE_POINTS):
        ch = chr(c)
        if 0xD800 <= c < 0xE000 or c in seconds or unicodedata.combining(ch) or \
                not unicodedata.is_normalized("NFC", ch):
            stable[c] = False
    if not stable[:0x300].all():  # `nfc_suspects` takes every code point below U+0300 as stable
        raise RuntimeError(f"unicodedata {unicodedata.unidata_version}: a code point below U+0300 is not "
                           "stable under NFC")
    return np.packbits(stable, bitorder="little")
