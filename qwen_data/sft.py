"""SFT data: chat/instruction records → ChatML samples → ids + loss mask → indexed datasets.

  read_chunks (main) → to_conversation → render_samples → SampleEncoder (workers)
  → IndexedDatasetWriter ×2 (main: ids, and a uint8 loss mask with the identical index)
  → [--pack: best-fit rows of exactly --seq-length] → manifest

Unpacked, every sample is one document of one sequence, stored unpadded: readers pad it to their
sequence length with the pad id (mask 0). Packed, every document is one row of exactly N tokens:
its sequences are its samples, then one sequence of pad ids (mask 0) if the row is not full, so a
reader knows every boundary and samples never need to see each other.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from . import literals
from .conversations import FORMATS, to_conversation
from .errors import RecordError
from .indexed import IndexedDatasetWriter, token_dtype
from .masking import MASK_POLICIES, SampleEncoder
from .outputs import AtomicOutputs, base_manifest, fingerprint, write_json
from .packing import pack
from .progress import Progress
from .records import DEFAULT_CHUNK_BYTES, RejectLog, check_inputs, empty_output, parse_line, read_chunks, reject_entry
from .templates import HISTORY_MODES, SPAN_KINDS, TEMPLATE_NAMES, get_template, render_samples
from .qwen import (DEFAULT_PAD_ID, DEFAULT_PAD_TOKEN, EMBEDDING_ROWS_SMALL as MIN_EMBEDDING_ROWS, FIRST_ADDED_ID,
                   TEMPLATE_FLAVOURS, TEMPLATE_TOKENS)
from .tokenizer import SPECIAL_POLICIES, QwenTokenizer, TokenizerConfig
from .workers import ordered_map

TASKS_PER_WORKER = 16
MASK_SUFFIX = ".lossmask"


@dataclass
class SFTConfig:
    inputs: list[str]
    output_prefix: str
    template: str = "qwen2p5"
    format: str = "auto"
    seq_length: int | None = None
    pack: bool = False
    overlong: str = "drop"
    mask: str = "assistant"
    assistant_span: str = "im_end_nl"
    history: str = "rendered"
    enable_thinking: bool | None = None
    parse_tool_arguments: bool = False
    pad_id: int | None = None
    pad_token: str | None = None
    special_tokens: str = "safe"
    workers: int = 2
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    max_rejects: int | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    quiet: bool = False

    def __post_init__(self) -> None:
        choices = {"template": TEMPLATE_NAMES + ("auto",), "format": FORMATS, "overlong": ("drop", "truncate"),
                   "mask": MASK_POLICIES, "assistant_span": tuple(SPAN_KINDS), "history": HISTORY_MODES,
                   "special_tokens": SPECIAL_POLICIES}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}")
        if self.pack and not self.seq_length:
            raise ValueError("--pack needs --seq-length")
        if self.seq_length is not None and self.seq_length < 2:
            raise ValueError("--seq-length must be at least 2")
        if self.pad_id is not None and self.pad_token is not None:
            raise ValueError("give --pad-id or --pad-token, not both")
        if self.workers < 1:
            raise ValueError("--workers must be at least 1")
        if self.chunk_bytes < 1:
            raise ValueError("--chunk-mb must be above 0")


def resolve_pad_id(config: SFTConfig, tokenizer: QwenTokenizer) -> int:
    """The fixed pad id: never eod/eos/<|im_end|> or any token the templates write, inside every
    Qwen embedding table. (Data that would contain it is rejected sample by sample.)"""
    pad = config.pad_id if config.pad_id is not None else DEFAULT_PAD_ID
    if config.pad_token is not None:
        pad = tokenizer.token_id(config.pad_token, "--pad-token")
    for name in TEMPLATE_TOKENS:
        if tokenizer.added_tokens.get(name) == pad:
            raise ValueError(f"pad id {pad} is {name}, which the chat templates write: padding must never "
                             "look like real data (the model would never learn to stop). "
                             f"Default: {DEFAULT_PAD_ID} {DEFAULT_PAD_TOKEN}")
    if not 0 <= pad < MIN_EMBEDDING_ROWS:
        raise ValueError(f"pad id {pad} is outside the Qwen embedding tables (0..{MIN_EMBEDDING_ROWS - 1})")
    if pad < FIRST_ADDED_ID:
        raise ValueError(f"pad id {pad} is an ordinary token that text encodes to; choose an added token "
                         f"({FIRST_ADDED_ID}..{MIN_EMBEDDING_ROWS - 1}, default {DEFAULT_PAD_ID} {DEFAULT_PAD_TOKEN})")
    return pad


@dataclass
class ChunkResult:
    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray
    rejects: list[dict]
    records: int
    text_bytes: int
    truncated: int
    special_records: int  # records holding literals the special-token policy acts on


_worker: dict = {}


def _init_worker(config: SFTConfig, tokenizer: QwenTokenizer, template, encoder: SampleEncoder, pad_id: int) -> None:
    _worker.update(config=config, tokenizer=tokenizer, template=template, encoder=encoder, pad_id=pad_id)


def process_chunk(chunk) -> ChunkResult:
    config: SFTConfig = _worker["config"]
    tokenizer: QwenTokenizer = _worker["tokenizer"]
    history = "last" if config.mask == "last" else config.history
    policy = config.special_tokens
    pattern = tokenizer.acted_on(policy)
    samples, origins, rejects, records, text_bytes, special_records = [], [], [], 0, 0, 0
    for line_no, line in chunk.lines():
        try:
            record = parse_line(line)
            conversation = to_conversation(record, config.format, parse_tool_arguments=config.parse_tool_arguments)
            marker = None
            special = literals.find(conversation, pattern)
            if special:
                special_records += 1
                if policy == "reject":
                    raise RecordError("special-token", f"literal special token {special!r} in the conversation")
                if policy != "parse":
                    conversation, marker = literals.mark(conversation, pattern)
            rendered = render_samples(_worker["template"], conversation, history, enable_thinking=config.enable_thinking)
            if marker:
                rendered = [literals.unmark(sample, marker) for sample in rendered]
        except RecordError as error:
            rejects.append(reject_entry(chunk, line_no, line, error))
            continue
        records += 1
        text_bytes += len(line)
        samples.extend(rendered)
        origins.extend((line_no, line, k, len(rendered)) for k in range(len(rendered)))
    ids_out, mask_out, lengths, truncated = [], [], [], 0
    for (line_no, line, k, n), encoded in zip(origins, _worker["encoder"].encode(samples) if samples else []):
        try:
            if isinstance(encoded, RecordError):
                raise encoded
            ids, mask = encoded
            ids, mask, was_truncated = _fit(ids, mask, config, _worker["pad_id"])
        except RecordError as error:
            if n > 1:
                error = RecordError(error.reason, f"sample {k + 1} of {n}: {error}")
            rejects.append(reject_entry(chunk, line_no, line, error))
            continue
        truncated += was_truncated
        ids_out.append(ids)
        mask_out.append(mask)
        lengths.append(len(ids))
    rejects.sort(key=lambda r: r["record"])
    return ChunkResult(
        np.concatenate(ids_out) if ids_out else np.zeros(0, np.int32),
        np.concatenate(mask_out) if mask_out else np.zeros(0, np.uint8),
        np.asarray(lengths, dtype=np.int64),
        rejects, records, text_bytes, truncated, special_records,
    )


def _fit(ids: np.ndarray, mask: np.ndarray, config: SFTConfig, pad_id: int):
    if (ids == pad_id).any():
        raise RecordError("pad-token-in-data", f"the sample contains the pad id {pad_id}; choose another --pad-id")
    truncated = False
    if config.seq_length and len(ids) > config.seq_length:
        if config.overlong == "drop":
            raise RecordError("too-long", f"{len(ids)} tokens, over --seq-length {config.seq_length}")
        ids, mask, truncated = ids[: config.seq_length], mask[: config.seq_length], True
    if not mask.any():
        raise RecordError("no-trained-tokens", "no token of the sample is trained" +
                          (" after truncation" if truncated else ""))
    return ids, mask, truncated


class MaskedWriter:
    """Token ids and the loss mask, two indexed datasets with one index."""

    @staticmethod
    def files(prefix: str) -> list[str]:
        return [prefix + channel + ext for channel in ("", MASK_SUFFIX) for ext in (".bin", ".idx")]

    def __init__(self, outputs: AtomicOutputs, prefix: str, dtype) -> None:
        self.ids = IndexedDatasetWriter(outputs.tmp(prefix + ".bin"), outputs.tmp(prefix + ".idx"), dtype)
        self.mask = IndexedDatasetWriter(
            outputs.tmp(prefix + MASK_SUFFIX + ".bin"), outputs.tmp(prefix + MASK_SUFFIX + ".idx"), np.uint8
        )

    def add_batch(self, ids, mask, sequence_lengths, sequences_per_document=None) -> None:
        self.ids.add_batch(ids, sequence_lengths, sequences_per_document)
        self.mask.add_batch(mask, sequence_lengths, sequences_per_document)

    def finalize(self) -> None:
        self.ids.finalize()
        self.mask.finalize()

    def fingerprint(self) -> str:
        return fingerprint([self.ids.digests, self.mask.digests])


def write_packed(samples: MaskedWriter, lengths: np.ndarray, out: MaskedWriter, seq_length: int, pad_id: int):
    """Pack the finished unpacked samples into rows of exactly `seq_length`; returns the plan."""
    plan = pack(lengths, seq_length)
    ids = np.memmap(samples.ids.bin_path, dtype=samples.ids.dtype, mode="r") if len(lengths) else np.zeros(0)
    mask = np.memmap(samples.mask.bin_path, dtype=np.uint8, mode="r") if len(lengths) else np.zeros(0)
    starts = np.cumsum(lengths) - lengths
    sequence_lengths, per_row = plan.sequence_layout(lengths)
    row_starts = plan.row_starts
    rows_per_batch = 4096
    seq_cursor = 0
    for first in range(0, plan.rows, rows_per_batch):
        last = min(first + rows_per_batch, plan.rows)
        ids_parts, mask_parts = [], []
        for row in range(first, last):
            for s in plan.order[row_starts[row]: row_starts[row] + plan.row_sizes[row]]:
                ids_parts.append(ids[starts[s]: starts[s] + lengths[s]])
                mask_parts.append(mask[starts[s]: starts[s] + lengths[s]])
            pad = seq_length - plan.row_tokens[row]
            if pad:
                ids_parts.append(np.full(pad, pad_id, dtype=np.int32))
                mask_parts.append(np.zeros(pad, dtype=np.uint8))
        n_seq = int(per_row[first:last].sum())
        out.add_batch(np.concatenate(ids_parts), np.concatenate(mask_parts),
                      sequence_lengths[seq_cursor: seq_cursor + n_seq], per_row[first:last])
        seq_cursor += n_seq
    return plan


def run(config: SFTConfig) -> dict:
    start = time.monotonic()
    check_inputs(config.inputs)
    tokenizer_config = config.tokenizer
    if tokenizer_config.flavour is None and config.template in TEMPLATE_FLAVOURS:
        # A Qwen2.5 model's tokenizer has no <think> token: render for the template's own flavour.
        tokenizer_config = TokenizerConfig(tokenizer_config.name, TEMPLATE_FLAVOURS[config.template], tokenizer_config.backend)
    tokenizer = QwenTokenizer(tokenizer_config)
    template = get_template(config.template, tokenizer.directory)
    pad_id = resolve_pad_id(config, tokenizer)
    dtype = token_dtype(tokenizer.vocab_size)
    total_bytes = 0 if any(p.endswith(".gz") for p in config.inputs) else sum(map(os.path.getsize, config.inputs))
    progress = Progress(total_bytes, enabled=not config.quiet)
    prefix = config.output_prefix
    # Only the parse backend is built before forking: the text one, for the few samples with
    # literals that stay plain text, is built by a worker when it first meets one (in the main
    # process it would cost every run ~0.5 s and ~100 MB in each process).
    tokenizer.prepare("parse")
    encoder = SampleEncoder(tokenizer, config.assistant_span, config.mask)
    finals = MaskedWriter.files(prefix) + [prefix + ".json", prefix + ".rejects.jsonl"]
    if config.pack:
        finals += MaskedWriter.files(prefix + ".unpacked")
    with AtomicOutputs(finals) as outputs:
        samples = MaskedWriter(outputs, prefix + (".unpacked" if config.pack else ""), dtype)
        rejects = RejectLog(outputs.tmp(prefix + ".rejects.jsonl"), config.max_rejects)
        all_lengths, truncated, special_records = [], 0, 0
        results = ordered_map(
            process_chunk, read_chunks(config.inputs, config.chunk_bytes), config.workers,
            initializer=_init_worker, initargs=(config, tokenizer, template, encoder, pad_id),
            tasks_per_worker=TASKS_PER_WORKER,
        )
        for result in results:
            samples.add_batch(result.ids, result.mask, result.lengths)
            all_lengths.append(result.lengths)
            rejects.add(result.rejects)
            truncated += result.truncated
            special_records += result.special_records
            progress.update(result.records, result.text_bytes, len(result.ids))
        progress.close()
        rejects.close()
        if samples.ids.documents == 0:
            raise empty_output(prefix, rejects)
        samples.finalize()
        lengths = np.concatenate(all_lengths) if all_lengths else np.zeros(0, np.int64)
        out, sft_stats = samples, {}
        if config.pack:
            out = MaskedWriter(outputs, prefix, dtype)
            plan = write_packed(samples, lengths, out, config.seq_length, pad_id)
            out.finalize()
            for path in (samples.ids.bin_path, samples.ids.idx_path, samples.mask.bin_path, samples.mask.idx_path):
                outputs.discard(path[: -len(".tmp")])
            sft_stats = {"rows": plan.rows, "fill": round(plan.fill, 6), "pad_tokens": plan.pad_tokens}
        manifest = base_manifest("sft")
        manifest.update(
            tokenizer=tokenizer.identity(),
            eod_id=tokenizer.eod_id,
            pad_id=pad_id,
            dtype=dtype.name,
            documents=out.ids.documents,
            sequences=out.ids.sequences,
            tokens=out.ids.tokens,
            fingerprint=out.fingerprint(),
            sft={
                "template": template.name,
                "template_sha256": template.sha256,
                "format": config.format,
                "mask_policy": config.mask,
                "assistant_span": config.assistant_span,
                "history": "last" if config.mask == "last" else config.history,
                "enable_thinking": config.enable_thinking,
                "special_tokens": config.special_tokens,
                "special_token_records": special_records,
                "seq_length": config.seq_length,
                "overlong": config.overlong,
                "packed": config.pack,
                "samples": int(len(lengths)),
                "sample_tokens": int(lengths.sum()),
                "trained_tokens": int(np.asarray(np.memmap(out.mask.bin_path, np.uint8, "r")).sum()) if out.mask.tokens else 0,
                "truncated": truncated,
                **sft_stats,
            },
            inputs=[{"path": os.path.abspath(p), "bytes": os.path.getsize(p)} for p in config.inputs],
            rejects=rejects.summary(),
            wall_seconds=round(time.monotonic() - start, 3),
        )
        write_json(outputs.tmp(prefix + ".json"), manifest)
        if rejects.count == 0:
            outputs.discard(prefix + ".rejects.jsonl")
        outputs.commit(markers=[prefix + ".json"])
    return manifest
