"""The certificate's first layer: every document, in the worker that made it, spells its text.

Byte-level BPE gives every id one fixed byte string, so ids decode by table lookup and must give
back exactly the bytes of the text they were made from, as the tokenizer normalizes it (NFC). The
table is read from tokenizer.json's own vocabulary, never from the rank file the encoder runs on:
a corrupt derived file cannot vouch for itself. What spelling cannot see (ids that spell the same
bytes in other pieces, a BPE merge order gone wrong) is the reference sample's to find
(`certify.sample`).

SFT samples also keep the template's structure: their loss mask is derived again from the ids
alone (`structure_mask`: each `<|im_start|>assistant\\n` control token opens a span that ends
on the next `<|im_end|>` control token, cut as the run's --assistant-span says) and must equal the
mask the run made from its labelled segments.

Costs: each token's bytes written out once and the text compared with them, in C
(`_native.misspelled`, ~3.4-3.7 ns and ~21 instructions a token on a worker's chunks: `bench/spelling.py`,
callgrind); where a document fails, why is found in Python.
"""

from __future__ import annotations

import functools
import re
import unicodedata

import numpy as np

from ..qwen import BYTE_OF_CHAR, FIRST_ADDED_ID, IM_END_ID, IM_START_ID
from ..text import nfc
from ..text.cache import cached_array
from ..text.tokenizer import as_str, byte_level, model_vocab

from .._native import misspelled, structure_mask as _native_structure_mask

# `Spelling.entries`: one id of the table as `_native.c`'s Entry lays it out (16 bytes, one cache line's quarter)
ENTRY = np.dtype([("head", "<u8"), ("offset", "<u4"), ("length", "<u2"), ("unused", "<u2")])
BARRED = (0xFFFFFFFF, 0xFFFF)  # an id a text may not hold: offset and length past any table, so no text spells it
LOW_BYTES = np.array([(1 << (8 * n)) - 1 for n in range(9)], dtype=np.uint64)  # a word's low n bytes
BLOCK_TOKENS = 1 << 22  # ids decoded at a time: a 58 MB record is spelled in bounded memory


class SpellingError(ValueError):
    """A document's ids do not spell its text; `index` is its position in the batch checked."""

    def __init__(self, index: int, message: str) -> None:
        super().__init__(message)
        self.index = index


_LATIN1_AS_BYTE_LEVEL = {b: c for c, b in BYTE_OF_CHAR.items()}  # the other way: bytes written in the alphabet


class Spelling:
    """Per id its bytes: `flat[starts[i]:starts[i + 1]]`; added tokens spell their literal."""

    def __init__(self, starts: np.ndarray, flat: np.ndarray) -> None:
        self.starts, self.flat = starts, flat
        self.lengths = np.diff(starts)

    def __reduce__(self):
        return Spelling, (self.starts, self.flat)  # the rest is derived again where it is unpickled

    @classmethod
    def of(cls, tokenizer) -> "Spelling":
        """The table of a `QwenTokenizer`, kept in its cache folder under the files' hash (`starts` as
        bytes, then `flat`)."""
        n = tokenizer.vocab_size + 1

        def build() -> np.ndarray:
            table = cls.from_json(tokenizer._json_text, tokenizer.added_tokens, tokenizer.vocab_size)
            return np.concatenate([table.starts.view(np.uint8), table.flat])

        packed = cached_array(tokenizer._cache_path("spelling.npy"), tokenizer._file(), build,
                              lambda array: array.dtype == np.uint8 and array.ndim == 1 and len(array) >= 8 * n)
        return cls(packed[:8 * n].view(np.int64).copy(), packed[8 * n:].copy())

    @classmethod
    def from_json(cls, text: str, added: dict[str, int], vocab_size: int) -> "Spelling":
        """The table of tokenizer.json's text: its vocabulary's pieces by id, each as the bytes its
        characters stand for, and `added` (literal → id) as their UTF-8; ValueError for a piece
        outside byte-level BPE's alphabet."""
        spelled = [""] * vocab_size  # per id, its bytes as Latin-1 characters
        for piece, i in model_vocab(text).items():
            if i < vocab_size:
                spelled[i] = piece
        for content, i in added.items():
            spelled[i] = content.encode("utf-8").decode("latin-1").translate(_LATIN1_AS_BYTE_LEVEL)
        lengths = np.fromiter(map(len, spelled), dtype=np.int64, count=vocab_size)
        flat = byte_level(spelled)  # (at C speed: a byte at a time in Python took ~0.3 s, every first run on a machine)
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        return cls(starts, np.frombuffer(flat, dtype=np.uint8).copy())

    def entries(self, allowed: np.ndarray) -> np.ndarray:
        """The table as `_native.misspelled` reads it, 16 bytes an id (`Entry` there): its first 8
        bytes, where its bytes start in `flat`, and its length; `BARRED` for an id where `allowed[id]`
        is 0 (a text may not hold it). One token's check then reads one cache line of the table, where
        reading `starts`, `flat` and `allowed` apart took three."""
        entries = np.zeros(len(self.lengths), dtype=ENTRY)
        padded = np.concatenate([self.flat, np.zeros(8, np.uint8)])
        words = np.ndarray((len(self.flat),), "<u8", padded, strides=(1,))  # the 8 bytes from each byte on
        first = np.minimum(self.starts[:-1], len(self.flat) - 1)
        entries["head"] = words[first] & LOW_BYTES[np.minimum(self.lengths, 8)]
        barred = np.asarray(allowed) == 0
        entries["offset"] = np.where(barred, BARRED[0], self.starts[:-1])
        entries["length"] = np.where(barred, BARRED[1], self.lengths)
        return entries.view(np.uint8)

    @functools.cached_property
    def every_id(self) -> np.ndarray:
        """The entries with every id allowed anywhere (`spells`)."""
        return self.entries(np.ones(len(self.lengths), dtype=np.uint8))

    def spells(self, text: str, ids: np.ndarray) -> bool:
        """Whether `ids` spell exactly `text` as UTF-8."""
        return misspelled(np.ascontiguousarray(ids, dtype=np.int32), np.array([len(ids)], dtype=np.int64), [text],
                          self.every_id, self.flat, 0) < 0

    def spell(self, ids: np.ndarray) -> bytes:
        """The bytes `ids` stand for."""
        out = []
        for k in range(0, len(ids), BLOCK_TOKENS):
            block = ids[k:k + BLOCK_TOKENS].astype(np.intp)
            lengths = self.lengths[block]
            ends = np.cumsum(lengths)
            # each output byte: its token's first byte in the table, plus its place inside the token
            index = np.repeat(self.starts[block] - (ends - lengths), lengths) + np.arange(int(ends[-1]) if len(ends) else 0)
            out.append(self.flat[index].tobytes())
        return b"".join(out)


def normalized(text: str, literals: re.Pattern | None = None) -> str:
    """`text` as the tokenizer normalizes it before encoding (NFC); with `literals`, the pieces
    between them one by one, as HF normalizes the text between the added tokens it splits out."""
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return text
    if literals is None:
        return unicodedata.normalize("NFC", text)
    pieces = literals.split(text)
    return "".join(p if k % 2 else unicodedata.normalize("NFC", p) for k, p in enumerate(pieces))


_SPELLERS: dict = {}  # the tokenizer `Speller.shared` built for, and by policy its Speller


def normalized_all(texts: list[str]) -> list[str]:
    """Each of `texts` as `normalized` gives it; only those that may not be in NFC are asked (`text.nfc`:
    a bit test a character, then classes and composing pairs, where Python's own check of every text
    took a tenth of SFT's spelling)."""
    out = list(texts)
    for k in nfc.unsettled(out):
        out[k] = normalized(out[k])
    return out


class Speller:
    """What a worker checks of every document it made (built before the fork, shared)."""

    def __init__(self, tokenizer, policy: str) -> None:
        self.tokenizer = tokenizer
        self.table = Spelling.of(tokenizer)
        self.literals = tokenizer.special_re
        kept = tokenizer.kept_tokens(policy)
        # added ids a text may hold under the policy (the rest are plain text there)
        self.allowed = np.asarray(sorted(tokenizer.added_tokens[c] for c in kept), dtype=np.int32)
        # per id of the table, whether a document may hold it: ids spelling nothing never
        self.may_hold = (self.table.lengths > 0).astype(np.uint8)
        self.may_hold[FIRST_ADDED_ID:] = 0
        self.may_hold[self.allowed] = 1
        self.entries = self.table.entries(self.may_hold)

    @classmethod
    def shared(cls, tokenizer, policy: str) -> "Speller":
        """The one this process built for `tokenizer` (the same object: `QwenTokenizer.shared`) and `policy`:
        a Ray task runs many parts, each building its step's checks (the table read and its hash checked,
        ~4 ms a part)."""
        if _SPELLERS.get("tokenizer") is not tokenizer:
            _SPELLERS.clear()
            _SPELLERS["tokenizer"] = tokenizer
        if policy not in _SPELLERS:
            _SPELLERS[policy] = cls(tokenizer, policy)
        return _SPELLERS[policy]

    def first_misspelled(self, texts: list[str], ids: np.ndarray, counts: np.ndarray, first: int = 0) -> int:
        """The first of `texts` from `first` whose ids (`counts[k]` of `ids` each) do not spell it
        exactly or hold an id it may not; -1 where none."""
        if first >= len(texts):
            return -1
        return misspelled(np.ascontiguousarray(ids, dtype=np.int32), np.ascontiguousarray(counts, dtype=np.int64),
                          texts, self.entries, self.table.flat, first)

    def wrong_ids(self, ids: np.ndarray) -> np.ndarray:
        """The ids of `ids` a document may not hold (outside the table, spelling nothing, or control
        ids the policy keeps as text)."""
        outside = (ids < 0) | (ids >= len(self.may_hold))
        return ids[outside | (self.may_hold[np.where(outside, 0, ids)] == 0)]

    def check_texts(self, texts: list[str | bytes], ids: np.ndarray, counts: np.ndarray,
                    as_encoded: list[str] | list[bytes] | None = None) -> None:
        """SpellingError for the first text whose ids (`counts[k]` of `ids` each) do not spell it,
        or hold an added id the special-token policy keeps as text. `as_encoded`: the texts as the
        tokenizer normalized them for encoding, where it did (`QwenTokenizer.as_encoded`)."""
        spelled = as_encoded if as_encoded is not None else normalized_all([as_str(t) for t in texts])
        self._check(texts, spelled, ids, counts)

    def _check(self, texts: list[str], spelled: list[str], ids: np.ndarray, counts: np.ndarray) -> None:
        """SpellingError for the first of `texts` whose ids do not spell it as `spelled` has it, nor
        under any other normalization HF may apply (`differs`)."""
        ends, k = np.cumsum(counts), -1
        while (k := self.first_misspelled(spelled, ids, counts, k + 1)) >= 0:
            own = ids[ends[k] - counts[k]:ends[k]]
            wrong = self.wrong_ids(own)
            if len(wrong):
                what = ("the control id {}, which its special-token policy keeps as text" if wrong[0] >= FIRST_ADDED_ID
                        else "the id {}, which spells nothing") if 0 <= wrong[0] < len(self.may_hold) else \
                    "the id {}, outside the vocabulary"
                raise SpellingError(k, "holds " + what.format(int(wrong[0])))
            why = self.differs(as_str(texts[k]), own)
            if why:
                raise SpellingError(k, why)

    def check_samples(self, texts: list[str], encoded: list[tuple[np.ndarray, np.ndarray]], free: list[bool],
                      structure: dict, as_encoded: list[bytes | None] | None = None) -> None:
        """SpellingError for the first sample whose ids do not spell its rendered text, or whose loss
        mask is not the one its structure gives (`structure_mask`, with `structure`'s span, last_only
        and empty_think_is_prompt; None: every token trained). `free[k]`: sample k holds literals
        made control tokens (--special-tokens parse), which may stand where the template's do: its
        mask is not derived again. `as_encoded[k]`: sample k's text as the tokenizer took it, where it
        is known (`SampleEncoder.as_encoded`; the others are normalized here)."""
        if not texts:
            return
        ids = np.concatenate([e[0] for e in encoded])
        counts = np.fromiter((len(e[0]) for e in encoded), dtype=np.int64, count=len(encoded))
        known = as_encoded or [None] * len(texts)
        unknown = [k for k, spelled in enumerate(known) if spelled is None]
        as_spelled = list(known)
        for k, text in zip(unknown, normalized_all([texts[k] for k in unknown])):
            as_spelled[k] = text
        self._check(texts, as_spelled, ids, counts)
        ours, ends = np.concatenate([e[1] for e in encoded]), np.cumsum(counts)
        if structure is None:
            derived = np.ones(len(ids), dtype=np.uint8)
        else:
            derived = structure_mask(self.table, ids, ends, **structure)
        if np.array_equal(derived, ours) or all(free):
            return
        for k in range(len(texts)):
            a, b = ends[k] - counts[k], ends[k]
            if not free[k] and not np.array_equal(derived[a:b], ours[a:b]):
                at = int(np.flatnonzero(derived[a:b] != ours[a:b])[0])
                raise SpellingError(k, f"its loss mask differs from the one the template's structure gives at token "
                                       f"{at} (ours {int(ours[a + at])}, the structure's {int(derived[a + at])})")

    def differs(self, text: str, ids: np.ndarray) -> str | None:
        """Why `ids` do not spell `text` (None: they do), under every normalization HF may apply."""
        spelled = self.table.spell(ids)
        candidates = (lambda: normalized(text), lambda: normalized(text, self.literals),
                      lambda: self.tokenizer.normalize(text))
        for candidate in candidates:
            if spelled == candidate().encode("utf-8"):
                return None
        wanted = normalized(text).encode("utf-8")
        at = next((i for i, (a, b) in enumerate(zip(spelled, wanted)) if a != b), min(len(spelled), len(wanted)))
        return (f"its ids spell other bytes than its text from byte {at:,} ({len(spelled):,} spelled, "
                f"{len(wanted):,} in the text): {spelled[max(0, at - 20):at + 20]!r} where the text has "
                f"{wanted[max(0, at - 20):at + 20]!r}")


SPANS = ("im_end_nl", "im_end", "trl", "turn")  # --assistant-span's cuts, as _native numbers them


def structure_mask(table: Spelling, ids: np.ndarray, sample_ends: np.ndarray, span: str, last_only: bool,
                   empty_think_is_prompt: bool) -> np.ndarray:
    """The loss mask the template's structure gives samples laid end to end (`sample_ends`: each
    one's end, in tokens), from their ids alone, read through `table`: in a sample, each
    `<|im_start|>` control token spelling `<|im_start|>assistant\\n` opens a span that the sample's
    next `<|im_end|>` control token closes; `span` cuts it as --assistant-span does (im_end_nl: the
    content, `<|im_end|>` and the newline; im_end: without the newline; trl: with the newline before;
    turn: the whole turn); `last_only`: a sample's last span only; `empty_think_is_prompt`: an empty
    think block opening the content is left out. A token is trained when any of its bytes falls in a
    span. (In C, `_native.structure_mask`: one pass over the ids.)"""
    mask = _native_structure_mask(np.ascontiguousarray(ids, dtype=np.int32),
                                  np.ascontiguousarray(sample_ends, dtype=np.int64), table.starts, table.flat,
                                  IM_START_ID, IM_END_ID, SPANS.index(span), last_only, empty_think_is_prompt)
    return np.frombuffer(mask, dtype=np.uint8)
