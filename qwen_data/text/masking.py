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

    def encode(self, samples: list[Sample]) -> list[tuple[np.ndarray, np.ndarray]]:
        """(ids int32, mask uint8) per sample; RecordError instances stand in for bad samples."""
        out = []
        for sample, ids in zip(samples, self._ids(samples)):
            try:
                out.append((ids, self.mask(sample, ids)))
            except RecordError as error:
                out.append(error)
        return out

    def _ids(self, samples: list[Sample]) -> list[np.ndarray]:
        """Every literal in a sample's text is a control id (as HF parses it), except in marked
        samples: there only the literals left in `marked_text` are, and the text between them is
        encoded as plain text, piece by piece, as HF encodes the pieces between added tokens."""
        tokenizer = self.tokenizer
        whole = [s.text for s in samples if s.marked_text is None]
        flat, counts = tokenizer.encode_batch(whole, special="parse")
        whole_ids = iter(np.split(flat, np.cumsum(counts)[:-1]) if len(counts) else [])
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

    def mask(self, sample: Sample, ids: np.ndarray) -> np.ndarray:
        if self.train_everything:
            return np.ones(len(ids), dtype=np.uint8)
        starts, ends, position = [], [], 0
        for segment in sample.segments:
            text = segment.text
            size = len(text) if text.isascii() else len(self._normalized(text).encode("utf-8"))
            if segment.turn in sample.trained_turns and segment.kind in self.trained_kinds and size:
                if starts and ends[-1] == position:  # adjacent trained segments form one span
                    ends[-1] = position + size
                else:
                    starts.append(position)
                    ends.append(position + size)
            position += size
        token_ends = np.cumsum(self._byte_lengths[ids])
        if len(ids) and token_ends[-1] != position:
            # NFC composed characters across a segment boundary: offsets are no longer exact.
            raise RecordError("normalization-boundary", "Unicode normalization joins text across a template boundary")
        token_starts = token_ends - self._byte_lengths[ids]
        span_ends = np.asarray(ends, dtype=np.int64)
        # The first span ending after a token's start is the only one it can overlap.
        j = np.searchsorted(span_ends, token_starts, side="right")
        hit = j < len(starts)
        trained = np.zeros(len(ids), dtype=bool)
        trained[hit] = np.asarray(starts, dtype=np.int64)[j[hit]] < token_ends[hit]
        return trained.astype(np.uint8)

    def _normalized(self, text: str) -> str:
        """`text` as the tokenizer normalizes it (NFC, by HF's older Unicode tables). Text already in
        NFC by Python's newer tables is in NFC by older ones too (they know fewer marks and
        compositions, so they reorder and compose less): only other text needs the slower normalizer."""
        return text if unicodedata.normalize("NFC", text) == text else self.tokenizer.normalize(text)
