"""Which texts may not be in NFC, found at a bit test a character (`_native.nfc_suspects`).

A code point is stable when NFC leaves it as it is alone, its canonical combining class is 0 (nothing is
reordered around it) and no composition takes it as its second part (the second of a canonical
decomposition pair, or a Hangul medial vowel or final consonant, which compose by rule): then a text of
stable code points only is its own NFC, as nothing in it decomposes for good, moves or composes. Only the
other texts are asked of Python's `unicodedata` (~1.2 ns a character, a tenth of a worker's time on a
corpus of non-Latin text). The bits come from the same `unicodedata` tables (derived with this module's
other tables in one pass, `_facts`, once a machine: kept in the cache folder under the tables' version,
checked by their sha256 before use).
tests/data/test_nfc.py compares the answers with `unicodedata.is_normalized`.
"""

from __future__ import annotations

import functools
import os
import unicodedata
from typing import NamedTuple

import numpy as np

from .._native import nfc as _nfc
from .._native import nfc_suspects, nfc_unsettled
from .cache import cache_dir, cached_array

CODE_POINTS = 0x110000
RULE = 1  # the derivation's version, in the cached file's name: a changed rule never reads an older rule's bits
HANGUL_SECOND = (*range(0x1161, 0x1176), *range(0x11A8, 0x11C3))  # medial vowels and final consonants (LV, LVT)


def suspects(texts: list[str]) -> list[int]:
    """The indices of `texts` that may not be in NFC (the others are)."""
    return nfc_suspects(texts, stable_bits())


def unsettled(texts: list[str]) -> list[int]:
    """The `suspects` that a finer check (`_native.nfc_unsettled`: canonical classes and the pairs
    that compose) cannot prove to be in NFC; the others are. Of a never-repeating corpus's suspects
    (Indic and Arabic texts, whose viramas and vowel signs are not stable alone) it proves most, where
    Python's check of each was 10% of a pretraining worker's instructions."""
    props, pairs = composition()
    return nfc_unsettled(texts, suspects(texts), props, pairs)


def normalize(text: str) -> str:
    """`unicodedata.normalize("NFC", text)`, from the same tables in C (`normalizing`: ~5.5 times faster on
    the texts `unsettled` leaves, 5.1 against 28.5 ms for 1.17M characters); by unicodedata itself where the
    text holds a surrogate."""
    found = _nfc(text, composition()[0], *normalizing())
    return unicodedata.normalize("NFC", text) if found is None else found


PROPS_END = 0x30000  # code points above hold no mark, nothing NFC or NFD changes (`_composition` checks)
NFC_MAYBE, NFC_NO, NFC_SPLITS = 0x100, 0x200, 0x400  # `_native.c`'s flags, above the combining class
COMPOSING_RULE = 1  # `_composition`'s version, in its cached file's name


@functools.lru_cache(maxsize=1)
def composition() -> tuple[np.ndarray, np.ndarray]:
    """(props, pairs) as `_native.nfc_unsettled` reads them: per code point below PROPS_END its
    canonical combining class and flags; each pair that composes as first << 21 | second, sorted. Derived
    from Python's unicodedata (`_facts`), kept in the cache folder as one array (pairs after the props)."""
    name = f"nfc-composing-{unicodedata.unidata_version}-{COMPOSING_RULE}.npy"
    packed = cached_array(os.path.join(cache_dir(), name),
                          f"Python's unicodedata {unicodedata.unidata_version}", _composition,
                          lambda a: a.dtype == np.uint8 and a.ndim == 1 and len(a) > 2 * PROPS_END
                          and (len(a) - 2 * PROPS_END) % 8 == 0)
    return packed[:2 * PROPS_END].view(np.uint16), packed[2 * PROPS_END:].view(np.uint64)


def _composition() -> np.ndarray:
    facts = _facts()
    props = np.zeros(PROPS_END, dtype=np.uint16)
    props[0xD800:0xE000] = NFC_NO
    for c, (combining, nfc_changes, nfd) in facts.changed.items():
        flags = combining | (NFC_NO if nfc_changes else 0) | (NFC_SPLITS if nfd is not None else 0)
        if c >= PROPS_END:
            raise RuntimeError(f"unicodedata {unicodedata.unidata_version}: U+{c:04X} is not a plain starter")
        props[c] = flags
    pairs = {(lead, vowel) for lead in range(0x1100, 0x1113) for vowel in range(0x1161, 0x1176)}  # Hangul LV
    pairs.update((first, second) for first, second, _, composes in facts.pairs if composes)
    for second in {second for _, second in pairs} | set(HANGUL_SECOND):  # (LV + T by rule: LV splits)
        props[second] |= NFC_MAYBE
    keys = np.array(sorted(first << 21 | second for first, second in pairs), dtype=np.uint64)
    return np.concatenate([props.view(np.uint8), keys.view(np.uint8)])


@functools.lru_cache(maxsize=1)
def stable_bits() -> np.ndarray:
    """A bit a code point, 1 where it is stable (see the module's docstring), least significant first."""
    return cached_array(os.path.join(cache_dir(), f"nfc-stable-{unicodedata.unidata_version}-{RULE}.npy"),
                        f"Python's unicodedata {unicodedata.unidata_version}", _derived,
                        lambda bits: bits.dtype == np.uint8 and bits.shape == (CODE_POINTS // 8,))


def _derived() -> np.ndarray:
    facts = _facts()
    stable = np.ones(CODE_POINTS, dtype=bool)
    stable[0xD800:0xE000] = False
    stable[[c for c, (combining, nfc_changes, _) in facts.changed.items() if combining or nfc_changes]] = False
    stable[[second for _, second, _, _ in facts.pairs]] = False  # the second of a canonical pair composes
    stable[list(HANGUL_SECOND)] = False
    if not stable[:0x300].all():  # `nfc_suspects` takes every code point below U+0300 as stable
        raise RuntimeError(f"unicodedata {unicodedata.unidata_version}: a code point below U+0300 is not "
                           "stable under NFC")
    return np.packbits(stable, bitorder="little")


NORMALIZING_RULE = 2  # `_normalizing`'s version, in its cached file's name
HANGUL = range(0xAC00, 0xAC00 + 11172)  # syllables: decomposed and composed by their rule in C


@functools.lru_cache(maxsize=1)
def normalizing() -> tuple[np.ndarray, ...]:
    """(dec_keys, dec_starts, dec_data, comp_keys, comp_values) as `_native.nfc` reads them: each code point
    NFD changes (Hangul syllables aside), sorted (uint64, as the composites' keys), its decomposition
    `dec_data[dec_starts[k]:dec_starts[k + 1]]`; each primary composite by its pair as first << 21 | second,
    sorted. Derived from Python's unicodedata (`_facts`), kept in the cache folder as one uint32 array (counts
    first)."""
    name = f"nfc-normalizing-{unicodedata.unidata_version}-{NORMALIZING_RULE}.npy"
    packed = cached_array(os.path.join(cache_dir(), name), f"Python's unicodedata {unicodedata.unidata_version}",
                          _normalizing, lambda a: a.dtype == np.uint32 and a.ndim == 1 and len(a) > 3
                          and len(a) == 3 + 3 * int(a[0]) + 1 + int(a[1]) + 3 * int(a[2]))
    n_dec, n_data, n_comp = (int(v) for v in packed[:3])
    parts = np.split(packed[3:], np.cumsum([2 * n_dec, n_dec + 1, n_data, 2 * n_comp]))
    return parts[0].view(np.uint64), parts[1], parts[2], parts[3].view(np.uint64), parts[4]


def _normalizing() -> np.ndarray:
    facts = _facts()
    keys, starts, data = [], [0], []
    for c, (_, _, nfd) in facts.changed.items():
        if nfd is None or c in HANGUL:
            continue
        if c >= PROPS_END or len(nfd) > 4:
            raise RuntimeError(f"unicodedata {unicodedata.unidata_version}: U+{c:04X} decomposes past the tables")
        keys.append(c)
        data += map(ord, nfd)
        starts.append(len(data))
    composites = {first << 21 | second: c for first, second, c, composes in facts.pairs if composes}
    pairs = sorted(composites)
    counts = np.array([len(keys), len(data), len(pairs)], np.uint32)
    return np.concatenate([counts, np.array(keys, np.uint64).view(np.uint32), np.array(starts, np.uint32),
                           np.array(data, np.uint32), np.array(pairs, np.uint64).view(np.uint32),
                           np.array([composites[k] for k in pairs], np.uint32)])


class _Facts(NamedTuple):
    changed: dict[int, tuple[int, bool, str | None]]  # code point → (combining class, NFC changes it, NFD or None)
    pairs: list[tuple[int, int, int, bool]]  # each canonical decomposition in two: (first, second, composite, composes)


@functools.lru_cache(maxsize=1)
def _facts() -> _Facts:
    """What the three tables are derived from, read from unicodedata in one pass (~0.3 s, once a machine:
    three passes over every code point took 0.72 s). Only assigned code points are asked: an unassigned
    or private-use one has no mark, no decomposition and is its own NFC and NFD; surrogates are the
    tables' own case. Each code point with a combining class, changed by NFC or by NFD, with what it is;
    each canonical decomposition into two, and whether NFC composes the two back (not an exclusion)."""
    changed, pairs = {}, []
    categories = map(unicodedata.category, map(chr, range(CODE_POINTS)))
    for c in [c for c, category in enumerate(categories) if category not in ("Cn", "Co", "Cs")]:
        ch = chr(c)
        combining, nfd = unicodedata.combining(ch), unicodedata.normalize("NFD", ch)
        nfc_changes = unicodedata.normalize("NFC", ch) != ch
        if nfd == ch and not combining and not nfc_changes:
            continue
        changed[c] = (combining, nfc_changes, None if nfd == ch else nfd)
        parts = unicodedata.decomposition(ch).split() if nfd != ch else []
        if len(parts) == 2 and not parts[0].startswith("<"):
            first, second = int(parts[0], 16), int(parts[1], 16)
            pairs.append((first, second, c, unicodedata.normalize("NFC", chr(first) + chr(second)) == ch))
    return _Facts(changed, pairs)
