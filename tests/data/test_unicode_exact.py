"""gigatoken and HF `tokenizers` read Unicode from tables of different ages (qwen_data.text.unicode_exact says
which). Every code point where that changes the output must be in EXACT_RANGES, and QwenTokenizer's
default backend must give HF's ids on every text.

`find_differences()` is the judge, over the whole code space (surrogates aside), and also the table's
generator: `python3 tests/data/test_unicode_exact.py` prints EXACT_RANGES.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import random
import re
import sys
import unicodedata

import awkward as ak
import gigatoken
import numpy as np
import pytest
import regex
from tokenizers import Tokenizer

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[1:1] = [TESTS, os.path.dirname(TESTS)]  # run as a script: the tests' helpers and the repo

from multilingual import SPECIAL_LITERALS  # noqa: E402
from qwen_data.text.tokenizer import QwenTokenizer, bundled_tokenizer_dir  # noqa: E402
from qwen_data.text.unicode_exact import EXACT_RANGES, needs_exact  # noqa: E402

CODE_POINTS = np.array([c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF], dtype=np.int64)
# Between a mark of a higher and one of a lower canonical combining class, a character moves iff
# its own class is not 0: when only one backend knows its class, only that one reorders it. The
# last sandwich, low before high, moves only classes outside 7..220: classes that differ show too.
SANDWICHES = [("\u0345", "\u0334"),  # classes 240, 1
              ("\u035d", "\u094d"),  # 234, 9
              ("\u0301", "\u0327"),  # 230, 202
              ("\u093c", "\u0316")]  # 7, 220
# The character alone, then between the marks of each sandwich.
NORMALIZATION_PROBE = "{0} " + " ".join(f".{before}{{0}}{after}" for before, after in SANDWICHES)
# After an apostrophe, before a letter: a letter, a digit, a space, punctuation and an "'s"-style
# contraction each split this differently, and with the boundary model (below) the ids show how.
SPLIT_PROBE = "'{0}a"
CHUNK = 1024  # probes per text: both backends are fastest on long texts


def table() -> set[int]:
    return {c for a, b in EXACT_RANGES for c in range(a, b + 1)}


def tokenizer_json(keep=lambda token: True) -> str:
    """The bundled tokenizer.json (Qwen3's), keeping the added tokens `keep` accepts."""
    with open(os.path.join(bundled_tokenizer_dir(), "tokenizer.json"), encoding="utf-8") as f:
        spec = json.load(f)
    spec["added_tokens"] = [t for t in spec["added_tokens"] if keep(t["content"])]
    return json.dumps(spec)


def boundary_model_spec() -> str:
    """Qwen's tokenizer.json (NFC, split regex, byte level) with a model that shows every split.

    Its vocabulary is the 256 byte tokens plus, for each context character c and each byte b, the
    tokens cb and bc. Qwen's own merges hide most splits: "a" and a rare letter get the same ids
    whether the regex splits them or not, so a letter known to one backend only would pass unseen.
    Both backends rank merges by their order, which here is also the order of the ids.
    """
    spec = json.loads(tokenizer_json(lambda token: False))
    byte_tokens = {t: i for t, i in spec["model"]["vocab"].items() if i < 256}
    qwen = gigatoken.Tokenizer.from_json(json.dumps(spec))
    spelling = {qwen.decode([i])[0]: t for t, i in byte_tokens.items()}  # byte -> its byte-level character
    assert sorted(spelling) == list(range(256))
    vocab, merges = dict(byte_tokens), []
    for c in sorted({ord(c) for c in SPLIT_PROBE.format("") + "\n"}):  # around a probed character
        for b in range(256):
            for pair in ((spelling[c], spelling[b]), (spelling[b], spelling[c])):
                if pair[0] + pair[1] not in vocab:
                    vocab[pair[0] + pair[1]] = len(vocab)
                    merges.append(list(pair))
    spec["model"]["vocab"], spec["model"]["merges"] = vocab, merges
    return json.dumps(spec)


class Backends:
    """gigatoken and HF `tokenizers` on the boundary model: what each normalizes and splits."""

    def __init__(self) -> None:
        spec = boundary_model_spec()
        self.gt = gigatoken.Tokenizer.from_json(spec)
        self.hf = Tokenizer.from_str(spec)

    def gt_rows(self, texts: list[str]) -> list[np.ndarray]:
        encoded = self.gt.encode_batch(texts, parallel=True)
        flat = np.asarray(ak.flatten(encoded, axis=1))
        return np.split(flat, np.cumsum(np.asarray(ak.num(encoded, axis=1)))[:-1])

    def normalized_differ(self, texts: list[str]) -> list[bool]:
        """NFC output unequal (the ids of byte-level BPE spell the normalized text)."""
        ours = [self.gt.decode(row) for row in self.gt_rows(texts)]
        return [o != self.hf.normalizer.normalize_str(t).encode() for o, t in zip(ours, texts)]

    def ids_differ(self, texts: list[str]) -> list[bool]:
        theirs = self.hf.encode_batch_fast(texts, add_special_tokens=False)
        return [not np.array_equal(o, t.ids) for o, t in zip(self.gt_rows(texts), theirs)]


def fill(template: str, columns: list[np.ndarray], rows: slice) -> np.ndarray:
    """UTF-32 code units of one probe per row: `template` plus a newline, "{k}" filled from columns[k]."""
    parts = re.split(r"\{(\d)\}", template + "\n")  # text, column, text, column, ..., text
    n = len(columns[0][rows])
    pieces = []
    for k, part in enumerate(parts):
        if k % 2:
            pieces.append(columns[int(part)][rows].astype("<u4")[:, None])
        elif part:
            pieces.append(np.broadcast_to(np.array([ord(ch) for ch in part], dtype="<u4"), (n, len(part))))
    return np.hstack(pieces)


def differing(differ, template: str, *columns: np.ndarray) -> tuple[np.ndarray, list[str], list[str]]:
    """The rows of `columns` for which `differ` finds the backends unequal on `template` filled with
    them, and the texts that differed: chunks, and the probes inside them.

    Probes are compared CHUNK at a time, joined by newlines (a newline never composes, reorders or
    joins words with its neighbours, so a chunk differs iff one of its probes does), then one by one
    inside a chunk that differs.
    """
    starts = range(0, len(columns[0]), CHUNK)
    texts = [fill(template, columns, slice(s, s + CHUNK)).tobytes().decode("utf-32-le")[:-1] for s in starts]
    rows, chunks, probes_that_differ = [], [], []
    for start, text, bad in zip(starts, texts, differ(texts)):
        if bad:
            rows_of_chunk = fill(template, columns, slice(start, start + CHUNK))
            probes = [p[:-1].tobytes().decode("utf-32-le") for p in rows_of_chunk]
            hits = [k for k, b in enumerate(differ(probes)) if b]
            assert hits, "a chunk differs while none of its probes does: the newline is not a boundary"
            rows += [start + k for k in hits]
            chunks.append(text)
            probes_that_differ += [probes[k] for k in hits]
    return np.array(rows, dtype=np.int64), chunks, probes_that_differ


def composition_pairs() -> np.ndarray:
    """(first, second) pairs that a canonical composition newer than HF's tables could join.

    Unicode never composes two characters that were both assigned before a composition was added,
    so such a pair holds a character newer than Unicode 3.2 (the oldest table Python has; HF's is 9).
    Compositions stay inside a script's block, or join a known mark to a new letter (Todhri U+105C9 =
    U+105D2 U+0307): so all pairs inside each block of 128 code points that holds a newer character,
    and every newer character followed by every second half of a composition Python's unicodedata
    knows. `regex` (Unicode 17) says what is assigned; ideographs and Hangul syllables (composed by
    formula, the same in every version) are left out.
    """
    assigned = regex.compile(r"[^\p{Cn}\p{Cs}\p{Co}\p{Ideographic}\uac00-\ud7a3]")
    domain = np.array([c for c in CODE_POINTS.tolist() if assigned.match(chr(c))], dtype=np.int64)
    newer = np.array([unicodedata.ucd_3_2_0.category(chr(c)) == "Cn" for c in domain.tolist()])
    decompositions = (unicodedata.decomposition(chr(c)).split() for c in CODE_POINTS.tolist())
    seconds = np.array(sorted({int(d[1], 16) for d in decompositions if len(d) == 2 and not d[0].startswith("<")}))
    pairs = [np.stack(np.meshgrid(domain[newer], seconds, indexing="ij"), -1).reshape(-1, 2)]
    for block in np.unique(domain >> 7):
        members, new = domain[domain >> 7 == block], newer[domain >> 7 == block]
        if new.any():
            a, b = np.meshgrid(np.arange(len(members)), np.arange(len(members)), indexing="ij")
            keep = new[a] | new[b]
            pairs.append(np.stack([members[a[keep]], members[b[keep]]], -1))
    return np.concatenate(pairs)


def find_differences() -> tuple[dict[str, set[int]], list[str], list[str]]:
    """Every code point for which the backends' output differs, by kind, and the texts that differed
    (chunks, and the probes inside them).

    marks    NFC of NORMALIZATION_PROBE differs;
    letters  the split of SPLIT_PROBE differs;
    pairs    NFC of a composition pair differs: its halves and what gigatoken composes them into
             (QwenTokenizer looks for table characters in gigatoken's output first), those of them
             newer than Unicode 3.2 (U+0307 of Todhri's U+105D2 U+0307 is everywhere) or all if
             none is; none if a half is already a mark or letter (the text goes to HF for it).
    """
    backends = Backends()
    candidates = composition_pairs()
    runs = [differing(backends.normalized_differ, NORMALIZATION_PROBE, CODE_POINTS),
            differing(backends.ids_differ, SPLIT_PROBE, CODE_POINTS),
            differing(backends.normalized_differ, "{0}{1}", candidates[:, 0], candidates[:, 1])]
    (marks, _, _), (letters, _, _), (joined, _, _) = runs
    marks, letters = set(CODE_POINTS[marks].tolist()), set(CODE_POINTS[letters].tolist())
    pairs = set()
    for pair in candidates[joined].tolist():
        if not set(pair) & (marks | letters):
            composed = backends.gt.decode(backends.gt_rows(["".join(map(chr, pair))])[0]).decode()
            involved = set(pair) | set(map(ord, composed))
            pairs |= {c for c in involved if unicodedata.ucd_3_2_0.category(chr(c)) == "Cn"} or involved
    chunks, probes = [t for run in runs for t in run[1]], [t for run in runs for t in run[2]]
    return {"marks": marks, "letters": letters, "pairs": pairs}, chunks, probes


def as_ranges(code_points) -> list[tuple[int, int]]:
    ranges = []
    for c in sorted(code_points):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return [tuple(r) for r in ranges]


@functools.lru_cache(maxsize=None)
def hf_reference(special: str) -> Tokenizer:
    """HF `tokenizers` on the bundled (Qwen3) files: every added token parsed, or none ("text")."""
    return Tokenizer.from_str(tokenizer_json(lambda token: special == "parse"))


def hf_ids(special: str, texts: list[str]) -> list[list[int]]:
    return [e.ids for e in hf_reference(special).encode_batch(texts, add_special_tokens=False)]


def our_ids(tokenizer: QwenTokenizer, special: str, texts: list[str]) -> list[list[int]]:
    """Our ids of `texts`, which are also those of the texts handed as UTF-8 (as a jsonl line's are)."""
    ids, lengths = tokenizer.encode_batch(texts, special)
    as_utf8 = [t.encode("utf-8") if not re.search("[\ud800-\udfff]", t) else t for t in texts]
    again, again_lengths = tokenizer.encode_batch(as_utf8, special)
    assert np.array_equal(ids, again) and np.array_equal(lengths, again_lengths)
    return [a.tolist() for a in np.split(ids, np.cumsum(lengths)[:-1])] if texts else []


@functools.lru_cache(maxsize=None)
def fuzz_texts(n: int, seed: int) -> tuple[str, ...]:
    """Random strings of pieces: characters of every general category (Python's unicodedata over the
    whole code space), words of many scripts with combining marks, characters assigned after
    Python's tables (`regex` knows them), the table's own characters in context, whitespace runs,
    digits of many scripts, ZWJ emoji, contractions, ASCII and literal added tokens."""
    rng = random.Random(seed)
    by_category = collections.defaultdict(list)
    by_script = collections.defaultdict(list)  # first word of the name: LATIN, ARABIC, NKO, CJK ...
    assigned = regex.compile(r"\p{Assigned}")
    newer_than_python = []
    for c in CODE_POINTS.tolist():
        category = unicodedata.category(chr(c))
        by_category[category].append(c)
        if category[0] in "LMN":
            by_script[unicodedata.name(chr(c), "?").split()[0]].append(c)
        elif category == "Cn" and assigned.match(chr(c)):
            newer_than_python.append(c)
    categories = sorted(by_category)
    scripts = [s for s in by_script.values() if len(s) >= 10]
    marks = by_category["Mn"] + by_category["Mc"] + by_category["Me"]
    digits = [by_category["Nd"][k:k + 10] for k in range(0, len(by_category["Nd"]), 10)]
    spaces = by_category["Zs"] + by_category["Zl"] + by_category["Zp"] + [9, 10, 11, 12, 13, 0x85]
    emoji = [0x1F600, 0x1F469, 0x1F4BB, 0x1F44D, 0x1F1EF, 0x1F1F5, 0x1F3F3, 0x1F308, 0x2764, 0x1FAE8]
    exact = sorted(table())

    def chars(pool, k):
        return "".join(chr(rng.choice(pool)) for _ in range(k))

    def around(middle):  # next to a letter, digit, space, apostrophe or newline
        return rng.choice(["a", "1", " ", "'", "\n", ""]) + middle + rng.choice(["a", "1", " ", "'", ""])

    pieces = [  # (weight, piece)
        (3, lambda: chars(by_category[rng.choice(categories)], rng.randint(1, 3))),
        (4, lambda: "".join(chars(script, 1) + chars(rng.choice([script, marks]), rng.choice([0, 0, 1, 2]))
                            for script in [rng.choice(scripts)] for _ in range(rng.randint(1, 6)))),
        (1, lambda: chars(rng.choice(scripts), 1) + chars(marks, rng.randint(1, 4))),
        (1, lambda: around(chars(newer_than_python, rng.randint(1, 3)))),
        (0.4, lambda: around(chars(rng.choice(scripts), 1) + chars(rng.choice([exact, marks]), rng.randint(1, 3)))),
        (1, lambda: chars(spaces, rng.choice([1, 1, 2, 3, 17]))),
        (1, lambda: chars(rng.choice(digits), rng.randint(1, 8))),
        (1, lambda: "".join(chr(rng.choice(emoji)) + rng.choice(["", "\u200d", "\ufe0f", "\U0001F3FD"])
                            for _ in range(rng.randint(1, 3)))),
        (1, lambda: rng.choice(SPECIAL_LITERALS)),
        (0.5, lambda: rng.choice(["it's", "we'RE", "'ll", "'\u017f", "x'\u017fa", "'t", "I'D"])),
        (2, lambda: rng.choice(["the", "Hello", "x = 1;", "def f():", "   ", "42", "e.g.", "\t"])),
    ]
    weights, makers = zip(*pieces)
    return tuple(rng.choice(["", " ", "\n"]).join(make() for make in rng.choices(makers, weights, k=rng.randint(1, 4)))
                 for _ in range(n))


@pytest.fixture(scope="module")
def ours():
    return QwenTokenizer()  # the default backend


@pytest.fixture(scope="module")
def differences():
    return find_differences()


@pytest.mark.slow  # every code point probed against HF: ~18 s
def test_table_holds_every_code_point_whose_output_differs(differences):
    found, _, _ = differences
    assert found["marks"] and found["letters"] and found["pairs"], "the probes no longer find the known differences"
    missing = {kind: as_ranges(cps - table()) for kind, cps in found.items() if cps - table()}
    assert not missing, f"regenerate EXACT_RANGES (python3 tests/data/test_unicode_exact.py): missing {missing}"


@pytest.mark.slow  # the same probes as the test above
def test_every_text_that_differs_goes_to_hf(differences, ours):
    """The chunks and probes on which the backends differ: the default backend sends each to HF,
    and gives HF's (real) ids on the probes."""
    _, chunks, probes = differences
    assert chunks and all(needs_exact(t) for t in chunks + probes)
    assert our_ids(ours, "text", probes) == hf_ids("text", probes)


def test_needs_exact_is_the_table():
    expected = table()
    assert all(needs_exact(chr(c)) is (c in expected) for c in CODE_POINTS.tolist())
    for c in sorted(expected) + CODE_POINTS[::61].tolist():  # in texts of 1, 2 and 4 bytes a character
        hit = c in expected
        assert needs_exact(f"ab{chr(c)}cd") is needs_exact(f"é\u4e2d{chr(c)}") is needs_exact(f"\U0001F600{chr(c)}x") is hit
    assert not needs_exact("plain ASCII") and not needs_exact("中文, русский, العربية, हिन्दी 😀")


@pytest.mark.parametrize("special", ["text", "parse"])
def test_every_text_holding_a_table_character_goes_to_hf(ours, special):
    """The routing finds them from gigatoken's ids; with Qwen's merges most letters of the table
    give HF's ids anyway, so the ids alone cannot show a missed one."""
    texts = [probe.format(chr(c)) for c in sorted(table()) for probe in (NORMALIZATION_PROBE, SPLIT_PROBE, "{0}")]
    texts += ["plain text", "中文 русский"]
    backend = ours.backend(special)
    encoded = backend.encode_batch(ours.gigatoken_input(texts, special), parallel=False)
    ids, lengths = np.asarray(ak.flatten(encoded, axis=1), dtype=np.int32), np.asarray(ak.num(encoded, axis=1))
    assert ours.exact_rows(texts, ids, lengths, backend) == list(range(len(texts) - 2))
    assert our_ids(ours, special, texts) == hf_ids(special, texts)


def test_nko_dantayalan_gets_hf_ids(ours):
    """NKo U+07F3 then U+07FD (Unicode 11, class 220): gigatoken's NFC and Python's move U+07FD
    before U+07F3 (class 230), HF's does not."""
    texts = ["ߊ\u07f3\u07fd ߞߊ߲", "plain", "ߊ\u07f3\u07fd"]
    raw = ours.backend("text").encode(ours.gigatoken_input(texts[:1], "text")[0]).tolist()
    assert raw != hf_ids("text", texts[:1])[0], "gigatoken and HF agree on NKo now: the example shows nothing"
    for special in ("text", "parse"):
        assert our_ids(ours, special, texts) == hf_ids(special, texts)


@pytest.mark.slow  # every code point's NFC against HF's: ~8 s
def test_pythons_nfc_differs_from_hfs_only_on_table_characters(ours):
    """gigatoken built from a rank file gets its texts in NFC by Python's Unicode tables
    (`QwenTokenizer.gigatoken_input`). Wherever those normalize otherwise than HF's, the text holds a
    character of the table and goes to HF: every code point alone and between marks, and every pair
    a composition newer than HF's tables could join."""
    hf = Backends().hf.normalizer

    def differ(texts: list[str]) -> list[bool]:
        return [o != hf.normalize_str(t) for o, t in zip(ours.gigatoken_input(texts, "text"), texts)]

    # A code point Python's tables do not know, HF's older ones do not know either: both leave it be,
    # and it composes with nothing. So only those Python knows are probed.
    known = np.array([unicodedata.category(chr(c)) not in ("Cn", "Co") for c in range(0x110000)])
    pairs = composition_pairs()
    pairs = pairs[known[pairs].all(axis=1)]
    _, _, marks = differing(differ, NORMALIZATION_PROBE, CODE_POINTS[known[CODE_POINTS]])
    _, _, joined = differing(differ, "{0}{1}", pairs[:, 0], pairs[:, 1])
    assert marks and joined, "Python's tables and HF's agree everywhere: the test shows nothing"
    assert all(needs_exact(t) for t in marks + joined)


def test_nfc_writes_no_character_of_a_literal(ours):
    """`QwenTokenizer.gigatoken_input` normalizes the pieces between literals and joins them: gigatoken
    finds no other literal in them, as NFC writes no character that literals are made of where its
    input had none (it composes into non-ASCII characters, and no other decomposes into one)."""
    alphabet = set("".join(ours.added_tokens))
    others = [chr(c) for c in CODE_POINTS.tolist() if c > 127]
    made = [c for c, nfc in zip(others, ours.gigatoken_input(others, "parse")) if set(nfc) & alphabet]
    assert not made, [hex(ord(c)) for c in made]


@pytest.mark.slow  # 100,000 texts through HF: 10-15 s each
@pytest.mark.parametrize("special", ["text", "parse"])
def test_fuzz_default_backend_gives_hf_ids(ours, special):
    texts = list(fuzz_texts(100_000, seed=5))
    assert sum(map(needs_exact, texts)) > 1000, "the fuzz no longer holds the table's characters"
    assert our_ids(ours, special, texts) == hf_ids(special, texts)



def test_the_rows_holding_a_marked_id_are_those_numpy_finds():
    """`_native.rows_marked`, which picks the texts `exact_rows` searches, against numpy's reading."""
    from qwen_data._native import rows_marked

    rng = np.random.default_rng(8)
    marked = rng.random(1000) < 0.002
    for _ in range(50):
        lengths = rng.integers(0, 40, rng.integers(0, 30)).astype(np.int64)
        ids = rng.integers(0, 1000, int(lengths.sum())).astype(np.int32)
        row_of = np.repeat(np.arange(len(lengths)), lengths)
        expected = np.unique(row_of[marked[ids]])
        found = np.frombuffer(rows_marked(ids, lengths, marked.view(np.uint8)), dtype=np.int64)
        assert found.tolist() == expected.tolist()
    with pytest.raises(ValueError, match="outside the table"):
        rows_marked(np.array([5, 1000], dtype=np.int32), np.array([2], dtype=np.int64), marked.view(np.uint8))
    with pytest.raises(ValueError, match="more ids"):
        rows_marked(np.array([5], dtype=np.int32), np.array([2], dtype=np.int64), marked.view(np.uint8))


if __name__ == "__main__":
    found, _, _ = find_differences()
    everything = set().union(*found.values())
    print("EXACT_RANGES: tuple[tuple[int, int], ...] = (")
    for a, b in as_ranges(everything):
        kinds = "+".join(kind for kind, cps in found.items() if cps & set(range(a, b + 1)))
        print(f"    (0x{a:05X}, 0x{b:05X}),  # {kinds}")
    print(")")
    print(f"# {len(everything)} code points; " + ", ".join(f"{k} {len(v)}" for k, v in found.items())
          + f"; in the current table but not found: {len(table() - everything)}", file=sys.stderr)

