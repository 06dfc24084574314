"""The certificate's second layer: which records the reference libraries encode again.

The rule, stated in every certificate: a record is picked when its hash (`record_hash`), seeded by
a hash of the inputs' pins, falls below `rate` × 2³²; its key is its jsonl line (or .json element)
as bytes, or `file:row` for a parquet or Arrow row, a key over 2 × KEY_BYTES standing as its first and
last KEY_BYTES and its length (so hashing costs a run per record, not per byte). So the pick depends on the record alone: every
input file and every shard picks from its own records, whatever --workers and --chunk-mb, and a
sharded run picks what one run would. `rate` is TARGET over the records the inputs are estimated
to hold (`readers.estimated_records`, deterministic), or 1 where they are fewer: about TARGET
records where the estimate holds, so that a fault hitting 0.1% of records is in the sample with a
chance of 95% and more (`detection`, from the records actually checked).

A record above LONG_BYTES is checked on a window of about WINDOW_BYTES (`window`), cut where the
tokenizer itself must cut, so the reference's cost grows with the bytes checked, never with a
record's length; a fault confined to one place of such a record is found where the window holds it.
"""

from __future__ import annotations

import hashlib
import json
import re
import zlib

import numpy as np

from .. import _native

TARGET = 3500  # records the reference is meant to check: 3,000 and more (1 - 0.999 ** 3000 = 0.95)
# A longer key is hashed as its first and last KEY_BYTES and its length: CRC-32 of every byte was 2.4% of
# a pretraining worker's instructions, and records that share both ends and their length are rare.
KEY_BYTES = 128
UNKNOWN_RECORDS = 1_000_000  # standard input's guess: it cannot be looked at before it is read
# HF encodes ~1-1.5 MB/s a core, ~50 times slower than the run: the reference checks about 256 bytes of a
# longer record, so that its whole cost is about a MB whatever the corpus (the sample's power is in
# records; a window cut where the pre-tokenizer cuts is exact at any size).
WINDOW_BYTES = 256  # of a record above LONG_BYTES, in bytes of its normalized text
LONG_BYTES = 2 * WINDOW_BYTES
# An SFT render is checked whole up to here: its reference mask comes from whole renders only, and its
# cost is the renders more than the window's encoding.
LONG_RENDER = 1024
# Where a piece of Qwen's pre-tokenizer must begin: after a newline before a letter (the letters' piece
# takes no newline before it), or at a space between two letters (a letter run ends before it; " word"
# is a piece). A letter here is what str.isalpha calls one, or a numeric that is not a decimal digit
# (², Ⅻ: a piece of its own after a newline or a space just the same): [^\W\d_] in a str pattern. NFC
# composes nothing across either cut (a newline and a space compose with nothing, and what follows is a
# starter), so the ids of the text on either side are the whole text's ids there (a test holds HF to it
# at every cut of real texts). Cuts before ASCII letters alone left a text in a script without them
# (Chinese, Japanese, Arabic) checked on a window of up to its whole length: 1.44 MB checked for 3,453
# records of the never-repeating corpus where these cuts give 0.96 MB (p99 3,241 -> 484 bytes a record).
_LETTER = r"[^\W\d_]"
CUT = re.compile(rf"(?<=\n)(?={_LETTER})|(?<={_LETTER})(?= {_LETTER})")
REGION = 1 << 12  # bytes of a long text's UTF-8 decoded at a time to look for a cut there


class Sampling:
    def __init__(self, inputs: list[dict], estimates: list[int | None]) -> None:
        pins = json.dumps(inputs, sort_keys=True).encode()
        self.seed = int.from_bytes(hashlib.sha256(pins).digest()[:4], "little")
        self.estimated = sum(UNKNOWN_RECORDS if e is None else e for e in estimates)
        self.rate = min(1.0, TARGET / max(1, self.estimated))
        self.below = int(self.rate * (1 << 32))

    def picker(self, path: str):
        """Whether a record of the file at `path` is picked, as a function of the record (called once a
        record: `record_hash` inlined for a line, where its layers of calls cost an SFT worker ~5 µs a record,
        a tenth of what the certificate adds to it)."""
        if self.rate >= 1.0:
            return lambda record: True
        seed, below, hashes = self.seed, self.below, _native.key_hashes

        def picks(record) -> bool:
            raw = record.raw
            if isinstance(raw, bytes):  # (`record_hash` of a line, a 32-bit seed: `key_hashes`)
                return int.from_bytes(hashes([raw], seed, KEY_BYTES), "little") < below
            return record_hash(path, record, seed) < below

        return picks

    def picked(self, keys: list[bytes], lines: bool = False) -> list[int]:
        """Which of the records of `keys` (`record_key`; `lines`: their jsonl lines) `picks` picks, by
        their index."""
        if self.rate >= 1.0:
            return list(range(len(keys)))
        return np.flatnonzero(record_hashes(keys, self.seed, lines) < self.below).tolist()

    def describe(self) -> dict:
        return {"rule": "fmix32(crc32(key, seed) ^ seed) < rate * 2**32; a record's key is its jsonl line or .json "
                        f"element as bytes, a parquet or Arrow row file:row; a key longer than {2 * KEY_BYTES} bytes "
                        f"is its first {KEY_BYTES} and last {KEY_BYTES} bytes and its length (8 bytes, little-endian)",
                "seed": self.seed, "rate": self.rate, "estimated_records": self.estimated,
                "window_bytes": WINDOW_BYTES, "long_bytes": LONG_BYTES, "long_render_chars": LONG_RENDER}


def record_key(path: str, record) -> bytes:
    """What a record is hashed by: its jsonl line (or .json element) as bytes, `file:row` for a row; a
    longer line its two ends and its length."""
    raw = record.raw
    if not isinstance(raw, bytes):
        return f"{path}:{record.number}".encode()
    if len(raw) <= 2 * KEY_BYTES:
        return raw
    return raw[:KEY_BYTES] + raw[-KEY_BYTES:] + len(raw).to_bytes(8, "little")


def record_hash(path: str, record, seed: int) -> int:
    """A record's 32-bit hash under `seed`: CRC-32 (GB/s, so every record can be hashed), whose
    values for records alike (lines that differ in a digit) lie close together, spread by
    MurmurHash3's finalizer, so that the records picked do not cluster. (Made in C, `key_hashes`,
    where the seed is 32 bits: this is its definition.)"""
    if isinstance(record.raw, bytes) and 0 <= seed < 1 << 32:
        return int.from_bytes(key_hashes([record.raw], seed, KEY_BYTES), "little")
    return _spread(zlib.crc32(record_key(path, record), seed) ^ seed)


def key_hashes(items: list[bytes], seed: int, cut: int = 0) -> bytes:
    """`record_hash` of each of `items` as little-endian uint32: keys (`record_key`), or with `cut`
    (KEY_BYTES) jsonl lines, each cut to its key here (`_native.key_hashes`; a 32-bit seed)."""
    return _native.key_hashes(items, seed, cut)


def record_hashes(keys: list[bytes], seed: int, lines: bool = False) -> np.ndarray:
    """`record_hash` of many records at once (a run's 32-bit seed), by their keys (`record_key`), or,
    `lines`, by their jsonl lines themselves."""
    return np.frombuffer(key_hashes(keys, seed, KEY_BYTES if lines else 0), "<u4").astype(np.uint64)


def _spread(h):
    """MurmurHash3's 32-bit finalizer, of an int or of a uint64 array of them (its constants and shifts
    taken in the array's type)."""
    h = ((h ^ (h >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    h = ((h ^ (h >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


def window(data: bytes | str, seed: int, long: int = LONG_BYTES) -> tuple[int, int] | None:
    """The bytes (or characters) [start, stop) of a long normalized text that the reference checks:
    WINDOW_BYTES or a little more from the first cut (`CUT`) at or after a point the seed picks, to
    the first cut after that (or the end); None where the text is short (`long` or less), or has no
    cut (checked whole)."""
    if len(data) <= long:
        return None
    start = _cut_at(data, 1 + seed % (len(data) - WINDOW_BYTES))
    if start is None:
        return None
    stop = _cut_at(data, start + WINDOW_BYTES)
    return start, len(data) if stop is None else stop


def _cut_at(data: bytes | str, at: int) -> int | None:
    """Where the first cut (`CUT`) at or after `at` lies (a character of a str, a byte of UTF-8),
    or None. UTF-8 is decoded a region at a time from a character before `at` (what the cut looks back
    at), each four times the last, so that finding a cut costs the bytes up to it, not the text's."""
    if isinstance(data, str):
        found = CUT.search(data, at)
        return None if found is None else found.start()
    at, size = _character_start(data, at), REGION
    begin = _character_start(data, max(0, at - 4))
    try:
        skip = len(data[begin:at].decode("utf-8"))  # `at` as a character of every region
    except UnicodeDecodeError:  # (not UTF-8: checked whole)
        return None
    while True:
        end = _character_start(data, at + size)
        try:
            text = data[begin:end].decode("utf-8")
        except UnicodeDecodeError:
            return None
        found = CUT.search(text, skip)
        if found is not None:
            return begin + len(text[:found.start()].encode("utf-8"))
        if end >= len(data):
            return None
        size *= 4


def _character_start(data: bytes, at: int) -> int:
    """The first byte at or after `at` that begins a UTF-8 character (len(data) past its end)."""
    at = min(at, len(data))
    while at < len(data) and 0x80 <= data[at] < 0xC0:
        at += 1
    return at


def detection(checked: int, records: int) -> dict[str, float]:
    """The chance that a fault hitting this share of the `records` is among the `checked` ones
    picked at random: what the sample's size proves (1 where every record was checked)."""
    if records and checked >= records:
        return dict.fromkeys(SHARES, 1.0)
    return {share: round(1 - (1 - float(share[:-1]) / 100) ** checked, 4) for share in SHARES}


SHARES = ("1%", "0.1%", "0.01%")


def ranges(numbers: list[int]) -> str:
    """Record numbers as `1-30,45,47-50`."""
    out, numbers = [], sorted(set(numbers))
    for k, n in enumerate(numbers):
        if k and n == numbers[k - 1] + 1:
            out[-1][1] = n
        else:
            out.append([n, n])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in out)


def numbers(text: str) -> list[int]:
    """`ranges`' text back as numbers."""
    found = []
    for part in filter(None, text.split(",")):
        a, _, b = part.partition("-")
        found += range(int(a), int(b or a) + 1)
    return found
