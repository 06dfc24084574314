"""Rendered samples → token ids and a per-token loss mask.

A sample's text is tokenized whole, exactly as HF `apply_chat_template(..., tokenize=True)` does
(literal special-token strings in content become control tokens, as there). Tokenizing segment by
segment would not be exact: a cut inside plain text (`assistant\\n` | `\\n\\nHi`) changes the BPE.
So the mask comes from byte offsets: each token's bytes (byte-level BPE: known per id) are laid
over the segments' byte spans, and a token is trained when any of its bytes falls in a trained
span, as transformers' `return_assistant_tokens_mask` marks every token touching the span.

`mask[t] == 1` means token t is a trained target: the loss on predicting it counts.
"""

from __future__ import annotations

import unicodedata

import numpy as np

from ..errors import RecordError
from .templates import SPAN_KINDS, Sample
from .tokenizer import QwenTokenizer

MASK_POLICIES = ("assistant", "last", "all")


class SampleEncoder:
    def __init__(self, tokenizer: QwenTokenizer, span: str = "im_end_nl", mask: str = "assistant") -> None:
        if span not in SPAN_KINDS:
            raise ValueError(f"assistant span must be one of {sorted(SPAN_KINDS)}")
        if mask not in MASK_POLICIES:
            raise ValueError(f"mask must be one of {MASK_POLICIES}")
        self.tokenizer = tokenizer
        self.trained_kinds = SPAN_KINDS[span]
        self.train_everything = mask == "all"
        self._byte_lengths = tokenizer.token_byte_lengths()
        self.as_encoded: list[bytes | None] = []  # the last samples' texts as encoded (`_ids`)

    def encode(self, samples: list[Sample]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ids int32, mask uint8) per sample; RecordError instances stand in for bad samples."""
        ids = self._ids(samples)
        if self.train_everything:
            return [(one, np.ones(len(one), dtype=np.uint8)) for one in ids]
        return [mask if isinstance(mask, RecordError) else (one, mask)
                for one, mask in zip(ids, self.masks(samples, ids))]

    def _ids(self, samples: list[Sample]) -> list[np.ndarray]:
        """Every literal in a sample's text is a control id (as HF parses it), except in marked
        samples: there only the literals left in `marked_text` are, and the text between them is
        encoded as plain text, piece by piece, as HF encodes the pieces between added tokens."""
        tokenizer = self.tokenizer
        whole = [s.text for s in samples if s.marked_text is None]
        flat, counts = tokenizer.encode_batch(whole, special="parse")
        whole_ids = iter(np.split(flat, np.cumsum(counts)[:-1]) if len(counts) else [])
        as_encoded = iter(tokenizer.as_encoded or [None] * len(whole))
        # each sample's text as the tokenizer took it (NFC, UTF-8), for the certificate's spelling check
        # (None: a marked sample, encoded piece by piece, or a tokenizer that normalizes for itself)
        self.as_encoded = [next(as_encoded) if s.marked_text is None else None for s in samples]
        out = []
        for sample in samples:
            if sample.marked_text is None:
                out.append(next(whole_ids))
                continue
            pieces, controls, position = [], [], 0
            for match in tokenizer.special_re.finditer(sample.marked_text):
                pieces.append(sample.text[position:match.start()])
                controls.append(tokenizer.added_tokens[match.group(0)])
                position = match.end()
            pieces.append(sample.text[position:])
            flat, counts = tokenizer.encode_batch(pieces, special="text")
            parts = np.split(flat, np.cumsum(counts)[:-1])
            ids = [parts[0]]
            for control, part in zip(controls, parts[1:]):
                ids += [np.asarray([control], dtype=np.int32), part]
            out.append(np.concatenate(ids).astype(np.int32))
        return out

    def masks(self, samples: list[Sample], ids: list[np.ndarray]) -> list:
        """Each sample's mask (a RecordError where its tokens do not lie over its text's bytes), all
        samples' at once: their trained spans' bytes (within each sample's text), moved to where the
        sample's tokens lie among all the samples' tokens back to back; each span's first and last
        token found by one search, and the mask made as runs of 0 and 1 (a search of the spans for
        every token, or numpy's calls per sample, cost more than the rest of the encoding)."""
        span_starts, span_ends, span_sample, sizes = [], [], [], np.empty(len(samples), dtype=np.int64)
        for k, sample in enumerate(samples):
            position = 0
            for segment in sample.segments:
                text = segment.text
                size = len(text) if text.isascii() else len(self._normalized(text).encode("utf-8"))
                if size and segment.turn in sample.trained_turns and segment.kind in self.trained_kinds:
                    if span_ends and span_ends[-1] == position and span_sample[-1] == k:
                        span_ends[-1] = position + size  # adjacent trained segments form one span
                    else:
                        span_starts.append(position)
                        span_ends.append(position + size)
                        span_sample.append(k)
                position += size
            sizes[k] = position
        counts = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.concatenate(ids) if ids else np.zeros(0, np.int32)
        token_ends = np.cumsum(self._byte_lengths[flat])
        ends = np.cumsum(counts)
        bounds = np.concatenate([[0], token_ends])
        before = bounds[ends - counts]  # the bytes of the tokens before each sample's first
        spelled = bounds[ends] - before
        # The spans of samples whose tokens spell other bytes than their text (refused below) are left
        # out: moved among the tokens, they could reach into the next sample's.
        span_sample = np.asarray(span_sample, dtype=np.intp)
        kept = (spelled == sizes)[span_sample]
        shift = before[span_sample[kept]]
        starts = np.asarray(span_starts, dtype=np.int64)[kept] + shift
        stops = np.asarray(span_ends, dtype=np.int64)[kept] + shift
        # A token is trained when any of its bytes is: from the first token ending after a span's
        # start to the last one starting before its end (token t starts where token t-1 ends).
        first = np.searchsorted(token_ends, starts, side="right")
        last = np.minimum(np.searchsorted(token_ends, stops, side="left") + 1, len(flat))
        first[1:] = np.maximum(first[1:], last[:-1])  # a token touching two spans: one run of 1s
        last = np.maximum(last, first)
        runs = np.diff(np.concatenate([[0], np.column_stack([first, last]).ravel(), [len(flat)]]))
        trained = np.repeat(np.resize(np.array([0, 1], dtype=np.uint8), len(runs)), runs)
        out = np.split(trained, ends[:-1]) if len(ids) else []
        for k in np.flatnonzero((spelled != sizes) & (counts > 0)).tolist():
            # NFC composed characters across a segment boundary: offsets are no longer exact.
            out[k] = RecordError("normalization-boundary", "Unicode normalization joins text across a template boundary")
        return out

    def _normalized(self, text: str) -> str:
        """`text` as the tokenizer normalizes it (NFC, by HF's older Unicode tables). Text already in
        NFC by Python's newer tables is in NFC by older ones too (they know fewer marks and
        compositions, so they reorder and compose less): only other text needs the slower normalizer."""
        return text if unicodedata.normalize("NFC", text) == text else self.tokenizer.normalize(text)
