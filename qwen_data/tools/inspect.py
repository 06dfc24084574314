"""`qwen-data inspect`: rows of a prefix as text, with what is trained marked.

A row is cut into pieces of the same look: runs of tokens that are alike in being trained and in
being ordinary text, a marker (pad, end of document) or another added token. The pieces are the
decoded bytes of their ids, so the text is the template's exactly, newlines included; a piece of
pad ids is shown once with its count. The same pieces make the terminal's text (colour, or
`[[…]]` around trained tokens and `⟨…⟩` around each control id with `--plain`) and the report's HTML.
"""

from __future__ import annotations

import functools
import html
import json
from dataclasses import dataclass

import numpy as np

from ..qwen import BYTE_OF_CHAR, FIRST_ADDED_ID
from ..text.tokenizer import directory_of
from .samples import Row, Samples

TEXT, ADDED, PAD, EOD = "text", "added", "pad", "eod"  # what a piece is
OPEN, CLOSE = "[[", "]]"  # --plain: around trained tokens
# --plain: around each control id (added token, end of document, pad), so that the same characters
# written in the text (a literal "<|endoftext|>", tokenized as text) look different.
CONTROL = "⟨{}⟩"
_ANSI = {"trained": "\x1b[1;32m", PAD: "\x1b[2;35m", EOD: "\x1b[1;35m", ADDED: "\x1b[36m", "rule": "\x1b[2m",
         "id": "\x1b[2;33m", "reset": "\x1b[0m"}


class TokenText:
    """Ids → the bytes they stand for, by the tokenizer the data was made with (the manifest's)."""

    def __init__(self, identity: dict, vocab_size: int) -> None:
        from tokenizers import Tokenizer

        self.vocab_size = vocab_size  # ids from here on are none of the data's tokenizer's
        with open(f"{directory_of(identity)}/tokenizer.json", encoding="utf-8") as f:
            self._tokenizer = Tokenizer.from_str(f.read())
        self._decoder = BYTE_OF_CHAR
        self._cache: dict[int, bytes] = {}

    def bytes(self, token: int) -> bytes:
        if token not in self._cache:
            text = self._tokenizer.id_to_token(token) if token < self.vocab_size else None
            if text is None:
                value = f"<id {token}>".encode()  # outside the tokenizer: Pai's pad, one past its last id
            elif token >= FIRST_ADDED_ID:
                value = text.encode()
            else:
                value = bytes(self._decoder[c] for c in text)
            self._cache[token] = value
        return self._cache[token]

    def text(self, tokens) -> str:
        return b"".join(self.bytes(int(t)) for t in tokens).decode("utf-8", "replace")


@dataclass
class Piece:
    kind: str  # TEXT, ADDED, PAD or EOD
    trained: bool
    tokens: np.ndarray
    text: str  # decoded; a pad piece: one pad's text

    @property
    def count(self) -> int:
        return len(self.tokens)


def pieces(tokens: np.ndarray, trained: np.ndarray, decode: TokenText, pad_id: int | None,
           eod_id: int) -> list[Piece]:
    """`tokens` cut into runs of the same kind and training."""
    kinds = np.where(tokens >= FIRST_ADDED_ID, 1, 0)
    kinds[tokens == eod_id] = 2
    if pad_id is not None:
        kinds[tokens == pad_id] = 3
    names = (TEXT, ADDED, EOD, PAD)
    # Every added token is a piece of its own; text runs while kind and training stay the same.
    key = kinds * 2 + trained.astype(np.int64)
    cuts = np.flatnonzero((key[1:] != key[:-1]) | ((kinds[1:] == 1) & (kinds[:-1] == 1))) + 1
    out = []
    for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(tokens)]):
        kind = names[kinds[start]]
        run = tokens[start:end]
        out.append(Piece(kind, bool(trained[start]), run, decode.text(run[:1] if kind == PAD else run)))
    return out


# ---------------------------------------------------------------------------------------------
# A prefix's rows


@functools.lru_cache(maxsize=4)
def _token_text(identity: str, vocab_size: int) -> TokenText:
    """One TokenText per tokenizer (identity as JSON): `inspect --html` and a blend's report show
    several prefixes of one tokenizer, whose files are found, hashed and parsed once."""
    return TokenText(json.loads(identity), vocab_size)


class Inspector:
    """The rows of a prefix, decoded; `describe()` says what the prefix is in one line."""

    def __init__(self, prefix: str) -> None:
        self.samples = Samples(prefix)
        self.manifest = self.samples.manifest
        self.decode = _token_text(json.dumps(self.manifest.tokenizer, sort_keys=True), self.manifest.vocab_size)

    def __len__(self) -> int:
        return len(self.samples)

    def describe(self) -> str:
        m = self.manifest
        s = m.sft
        what = "pretraining documents" if s is None else (
            f"SFT, template {s.template}, {s.layout} layout, "
            + (f"packed rows of {s.seq_length}" if s.rows is not None else "one sample a row"))
        pad = f", pad {m.pad_id} {self.decode.text([m.pad_id])}" if m.kind == "sft" else ""
        return (f"{self.samples.prefix}: {what}; {_count(len(self), 'row')}, {m.tokens:,} tokens; "
                f"eod {m.eod_id} {self.decode.text([m.eod_id])}{pad}")

    def pieces(self, row: Row, start: int, end: int) -> list[Piece]:
        return pieces(row.tokens[start:end], row.trained[start:end], self.decode, self.samples.pad_id,
                      self.manifest.eod_id)

    def parts(self, row: Row) -> list[tuple[str, list[Piece]]]:
        """(title, pieces) of each sample of `row`, then of its padding."""
        spans = row.spans()
        out = []
        for n, (start, end) in enumerate(spans):
            title = (f"sample {n + 1} of {len(spans)}: " if len(spans) > 1 else "") + \
                f"{end - start:,} tokens, {int(row.trained[start:end].sum()):,} trained"
            out.append((title, self.pieces(row, start, end)))
        if row.padding:
            out.append((f"padding: {row.padding:,} tokens", self.pieces(row, len(row.tokens) - row.padding,
                                                                           len(row.tokens))))
        return out

    def row_title(self, row: Row) -> str:
        return (f"row {row.index}: {len(row.tokens):,} tokens, {_count(len(row.samples), 'sample')}, "
                f"{int(row.trained.sum()):,} trained" + (f", {row.padding:,} pad" if row.padding else ""))


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def choose_rows(count: int, indexes: list[int] | None, random: int | None, seed: int) -> list[int]:
    """--index N… or --random K (distinct rows, in order); the first row by default."""
    if random is not None:
        return sorted(np.random.default_rng(seed).choice(count, size=min(random, count), replace=False).tolist())
    return indexes if indexes else [0]


# ---------------------------------------------------------------------------------------------
# Terminal


def terminal(inspector: Inspector, rows: list[int], colour: bool, ids: bool) -> str:
    """The rows as text for a terminal: trained tokens in bold green (`colour`) or inside [[…]]."""
    out = [inspector.describe(), ""]
    style = (lambda name, text: f"{_ANSI[name]}{text}{_ANSI['reset']}") if colour else (lambda name, text: text)
    for i in rows:
        row = inspector.samples.row(i)
        out.append(style("rule", f"══ {inspector.row_title(row)} " + "═" * 20))
        for title, parts in inspector.parts(row):
            if len(row.samples) > 1 or row.padding:
                out.append(style("rule", f"── {title} " + "─" * 20))
            out.append(_terminal_text(parts, style, colour, inspector.decode, ids))
        out.append("")
    return "\n".join(out)


def _terminal_text(parts: list[Piece], style, colour: bool, decode: TokenText, ids: bool) -> str:
    text, trained = [], False
    control = (lambda t: t) if colour else CONTROL.format  # colour tells control ids apart by itself
    for p in parts:
        if not colour and p.trained != trained:
            text.append(OPEN if p.trained else CLOSE)
            trained = p.trained
        shown = _shown(p, decode, ids, lambda mark: style("id", mark), control)
        if colour:
            if p.kind != TEXT:
                shown = style(p.kind, shown)
            if p.trained:  # trained: bold green, around any marker's or id's own colour
                shown = style("trained", shown.replace(_ANSI["reset"], _ANSI["reset"] + _ANSI["trained"]))
        text.append(shown)
    if trained:
        text.append(CLOSE)
    return "".join(text)


def _shown(p: Piece, decode: TokenText, ids: bool, mark, control) -> str:
    """A piece's text as printed: pad runs as one pad and a count; each control id's text through
    `control`; with `ids`, each token's text then `mark("{id}")`, a newline written as \\n before the
    line break."""
    if p.kind == PAD:
        return f"{control(p.text)}×{p.count}" + (mark(f"{{{int(p.tokens[0])}}}") if ids else "")
    if not ids:
        return p.text if p.kind == TEXT else "".join(control(decode.text([t])) for t in p.tokens)
    # A token's own bytes may end inside a character: those bytes are shown as escapes.
    texts = [(decode.bytes(int(t)).decode("utf-8", "backslashreplace"), int(t)) for t in p.tokens]
    if p.kind != TEXT:
        texts = [(control(text), t) for text, t in texts]
    return "".join(text.replace("\n", "\\n") + mark(f"{{{t}}}") + "\n" * text.endswith("\n") for text, t in texts)


# ---------------------------------------------------------------------------------------------
# HTML (the report's sample viewer)


HTML_CLASSES = {"trained": "t", PAD: "pad", EOD: "eod", ADDED: "add"}


def html_row(inspector: Inspector, index: int) -> str:
    """One row as an HTML fragment: a heading, then each sample in a <pre> with trained text in
    <span class="t">; newlines inside trained text get a visible ↵."""
    row = inspector.samples.row(index)
    out = [f'<div class="row"><h3>{html.escape(inspector.row_title(row))}</h3>']
    for title, parts in inspector.parts(row):
        out.append(f'<div class="sample"><div class="bound">{html.escape(title)}</div><pre>')
        for p in parts:
            text = html.escape(f"{p.text}×{p.count}" if p.kind == PAD else p.text)
            if p.trained:
                text = text.replace("\n", '<span class="nl">↵</span>\n')
            if p.kind != TEXT:
                text = f'<span class="{HTML_CLASSES[p.kind]}">{text}</span>'
            out.append(f'<span class="t">{text}</span>' if p.trained else text)
        out.append("</pre></div>")
    out.append("</div>")
    return "".join(out)
