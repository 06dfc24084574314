"""HF's tokenizer cut down to what a few texts can reach: a small run's reference in milliseconds.

Loading all of tokenizer.json into HF `tokenizers` takes ~0.35-0.45 s, longer than a one-document
run's whole work. Byte-level BPE makes only tokens that are substrings of a pre-tokenized word, and
applies merges in their order alone. So HF's own BPE, given only the vocabulary entries that are
substrings of some texts' words and the merges that make them (in their order), encodes those texts
exactly as the whole tokenizer does: HF still normalizes, splits out added tokens, pre-tokenizes and
merges; only tables it would never consult are left out.

The tables (every piece, every merge as ids, the file without them) are read from tokenizer.json
once and kept in the tokenizer cache under the file's sha256, themselves checked by theirs
(`text.cache.checked_bytes`): ~50 ms to load. A tokenizer for a batch of a few documents is built in
~5 ms. A word the caller did not give would be encoded by too small a table: the reference gives
every piece it encodes (`TextReference.pieces`); a test holds the cut tokenizer to the whole one on
held-out text in every special-token policy.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Iterable

import numpy as np

from ..text.cache import cache_dir, checked_bytes, store

_TABLES: dict[str, "Tables | None"] = {}  # tokenizer.json's real path → its tables, once a process


class Tables:
    def __init__(self, shell: dict, pieces: list[str], ids: np.ndarray, merges: np.ndarray) -> None:
        """`shell`: tokenizer.json without its model's vocabulary and merges; `pieces[k]` has the id
        `ids[k]`; `merges`: (left id, right id, made id) a row, in merge order."""
        from tokenizers import Tokenizer

        self.shell, self.merges = shell, merges
        self.id_of = dict(zip(pieces, ids.tolist()))
        self.longest = max(map(len, pieces))
        self.piece_of = dict(zip(ids.tolist(), pieces))
        # the added tokens kept in the vocabulary at their ids: HF numbers an added token missing
        # from the model after the model's last id, which a cut vocabulary would move
        self.added = {token["content"]: token["id"] for token in shell.get("added_tokens", [])}
        self.base = Tokenizer.from_str(self._json({}, []))  # HF's normalizer, pre-tokenizer and added tokens

    def tokenizer(self, texts: Iterable[str]):
        """HF's tokenizer with the pieces and merges the words of `texts` can reach: it encodes each
        of `texts` as the whole one does (with added tokens split out first: the pieces between them)."""
        from tokenizers import Tokenizer

        normalizer, pre_tokenizer = self.base.normalizer, self.base.pre_tokenizer
        words: set[str] = set()
        for text in texts:
            text = normalizer.normalize_str(text) if normalizer is not None else text
            words.update(word for word, _ in pre_tokenizer.pre_tokenize_str(text))
        reached = {i for w in words for a in range(len(w)) for b in range(a + 1, min(len(w), a + self.longest) + 1)
                   if (i := self.id_of.get(w[a:b])) is not None}
        kept = self.merges[np.isin(self.merges[:, 2], np.fromiter(reached, np.int64, len(reached)))]
        vocab = {self.piece_of[i]: i for i in reached}
        return Tokenizer.from_str(self._json(vocab, [(self.piece_of[a], self.piece_of[b]) for a, b, _ in kept.tolist()]))

    def _json(self, vocab: dict[str, int], merges: list[tuple[str, str]]) -> str:
        spaced = any(" " in a or " " in b for a, b in merges)  # "a b" is the form every tokenizers version reads
        model = {**self.shell["model"], "vocab": {**self.added, **vocab},
                 "merges": [list(m) for m in merges] if spaced else [f"{a} {b}" for a, b in merges]}
        return json.dumps({**self.shell, "model": model})


def tables(tokenizer_json: str) -> Tables | None:
    """The tables of a BPE tokenizer.json, from the cache (built there the first time); None where its
    model is not a BPE this cut applies to (the caller loads the whole tokenizer)."""
    path = os.path.realpath(tokenizer_json)
    if path not in _TABLES:
        _TABLES[path] = _load(path)
    return _TABLES[path]


def _load(path: str) -> Tables | None:
    try:
        with open(path, "rb") as f:
            source = f.read()
    except OSError:  # the whole tokenizer's load says why
        return None
    cache = os.path.join(cache_dir(), f"{hashlib.sha256(source).hexdigest()}.reference-tables.npz")
    cached = checked_bytes(cache, path)
    if cached is not None:
        try:
            with np.load(io.BytesIO(cached), allow_pickle=False) as z:
                shell = json.loads(z["shell"].tobytes().decode("utf-8"))
                return Tables(shell, z["pieces"].tobytes().decode("utf-8").split("\n"), z["ids"], z["merges"])
        except (ValueError, KeyError, EOFError, OSError):
            pass
    found = _from_json(source)
    if found is None:
        return None
    shell, pieces, ids, merges = found

    def write(tmp: str) -> None:
        with open(tmp, "wb") as f:
            np.savez(f, shell=np.frombuffer(json.dumps(shell).encode("utf-8"), np.uint8),
                     pieces=np.frombuffer("\n".join(pieces).encode("utf-8"), np.uint8), ids=ids, merges=merges)

    store(cache, write)
    return Tables(shell, pieces, ids, merges)


def _from_json(source: bytes) -> tuple[dict, list[str], np.ndarray, np.ndarray] | None:
    whole = json.loads(source)
    model = whole.get("model") or {}
    vocab, merges = model.get("vocab"), model.get("merges")
    if model.get("type") != "BPE" or not isinstance(vocab, dict) or not vocab or not isinstance(merges, list) \
            or any("\n" in piece for piece in vocab) or model.get("dropout") or model.get("byte_fallback"):
        return None
    pairs = [m.split(" ", 1) if isinstance(m, str) else m for m in merges]
    try:
        rows = np.array([(vocab[a], vocab[b], vocab[a + b]) for a, b in pairs], dtype=np.int64).reshape(-1, 3)
    except KeyError:  # a merge making a piece outside the vocabulary: not a table this cut knows
        return None
    shell = {**whole, "model": {k: v for k, v in model.items() if k not in ("vocab", "merges")}}
    return shell, list(vocab), np.fromiter(vocab.values(), np.int64, len(vocab)), rows
