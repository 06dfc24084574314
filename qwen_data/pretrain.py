"""Pretraining data: jsonl text → token ids + end-of-document → Megatron indexed dataset.

  read_chunks (main) → tokenize_chunk (workers) → IndexedDatasetWriter (main) → manifest

One document per record: the record's text tokens followed by the end-of-document id, which is
`<|endoftext|>` (151643) whatever the tokenizer's eos says (Megatron's own preprocess writes the
eos, `<|im_end|>` for Qwen instruct/Qwen3 tokenizers). With several `--text-key`s each key gets
its own dataset `PREFIX_{key}` (as Megatron's `--json-keys`), documents aligned: a record lacking
any key is rejected for all.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field

import numpy as np

from .errors import RecordError
from .indexed import IndexedDatasetWriter, token_dtype
from .outputs import AtomicOutputs, base_manifest, fingerprint, write_json
from .progress import Progress
from .records import DEFAULT_CHUNK_BYTES, RejectLog, check_inputs, empty_output, parse_line, read_chunks, reject_entry
from .qwen import DEFAULT_PAD_ID, EOD_TOKEN
from .tokenizer import SPECIAL_POLICIES, QwenTokenizer, TokenizerConfig
from .workers import ordered_map

# Workers restart after this many chunks (~64 MB of text): the tokenizer's pretoken cache grows with
# the text a worker has seen, and restarting bounds it, so peak memory does not grow with the corpus.
TASKS_PER_WORKER = 16


@dataclass
class PretrainConfig:
    inputs: list[str]
    output_prefix: str
    text_keys: list[str] = field(default_factory=lambda: ["text"])
    workers: int = 2
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    special_tokens: str = "text"
    eod_token: str = EOD_TOKEN
    max_rejects: int | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    quiet: bool = False

    def __post_init__(self) -> None:
        if self.special_tokens not in SPECIAL_POLICIES:
            raise ValueError(f"--special-tokens must be one of {SPECIAL_POLICIES}")
        if not self.text_keys or len(set(self.text_keys)) != len(self.text_keys):
            raise ValueError("--text-key: give one or more distinct keys")
        if self.workers < 1:
            raise ValueError("--workers must be at least 1")
        if self.chunk_bytes < 1:
            raise ValueError("--chunk-mb must be above 0")

    def prefixes(self) -> list[str]:
        if len(self.text_keys) == 1:
            return [self.output_prefix]
        return [f"{self.output_prefix}_{key}" for key in self.text_keys]


@dataclass
class ChunkResult:
    ids: list[np.ndarray]  # per text key: tokens of the chunk's documents, eod included
    lengths: list[np.ndarray]  # per text key: each document's length
    rejects: list[dict]
    records: int
    text_bytes: int
    special_records: int  # records holding literal added-token strings


_worker: dict = {}


def _init_worker(tokenizer: QwenTokenizer, config: PretrainConfig, eod_id: int) -> None:
    _worker.update(tokenizer=tokenizer, config=config, eod_id=eod_id)


def tokenize_chunk(chunk) -> ChunkResult:
    tokenizer: QwenTokenizer = _worker["tokenizer"]
    config: PretrainConfig = _worker["config"]
    keys = config.text_keys
    texts: list[list[str]] = [[] for _ in keys]
    rejects, text_bytes, special_records, records = [], 0, 0, 0
    for line_no, line in chunk.lines():
        try:
            record = parse_line(line)
            # A lone surrogate can only come from a \ud800-\udfff escape in the line.
            maybe_surrogate = b"\\ud" in line or b"\\uD" in line
            values = [_text_field(record, key, maybe_surrogate) for key in keys]
            special = next((s for v in values if (s := tokenizer.find_special(v, config.special_tokens))), None)
            if special:
                special_records += 1
                if config.special_tokens == "reject":
                    raise RecordError("special-token", f"literal special token {special!r} in text")
        except RecordError as error:
            rejects.append(reject_entry(chunk, line_no, line, error))
            continue
        records += 1
        text_bytes += len(line)
        for bucket, value in zip(texts, values):
            bucket.append(value)
    ids, lengths = [], []
    for bucket in texts:
        flat, counts = tokenizer.encode_batch(bucket, special=config.special_tokens)
        doc_ids, doc_lengths = append_eod(flat, counts, _worker["eod_id"])
        ids.append(doc_ids)
        lengths.append(doc_lengths)
    return ChunkResult(ids, lengths, rejects, records, text_bytes, special_records)


def _text_field(record: dict, key: str, maybe_surrogate: bool = True) -> str:
    if key not in record:
        raise RecordError("missing-key", f"no {key!r} key")
    value = record[key]
    if not isinstance(value, str):
        raise RecordError("not-a-string", f"{key!r} is a {type(value).__name__}, expected a string")
    if not value or value.isspace():
        raise RecordError("empty-text", f"{key!r} is empty" if not value else f"{key!r} holds only whitespace")
    if maybe_surrogate:
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate escaped in the JSON, e.g. "\ud800"
            raise RecordError("invalid-unicode", f"{key!r} holds a lone surrogate (not valid Unicode text)") from None
    return value


def append_eod(flat: np.ndarray, counts: np.ndarray, eod_id: int) -> tuple[np.ndarray, np.ndarray]:
    """Insert `eod_id` after every document of `flat` (documents of `counts` tokens each)."""
    n = len(counts)
    out = np.empty(len(flat) + n, dtype=np.int32)
    eod_positions = np.cumsum(counts) + np.arange(n)
    is_text = np.ones(len(out), dtype=bool)
    is_text[eod_positions] = False
    out[eod_positions] = eod_id
    out[is_text] = flat
    return out, counts + 1


def run(config: PretrainConfig) -> list[dict]:
    """Run the pipeline; returns the manifest of each output prefix."""
    start = time.monotonic()
    check_inputs(config.inputs)
    tokenizer = QwenTokenizer(config.tokenizer)
    eod_id = tokenizer.token_id(config.eod_token, "--eod-token")
    dtype = token_dtype(tokenizer.vocab_size)
    prefixes = config.prefixes()
    total_bytes = 0 if any(p.endswith(".gz") for p in config.inputs) else sum(map(os.path.getsize, config.inputs))
    progress = Progress(total_bytes, enabled=not config.quiet)
    special_records = 0
    tokenizer.prepare(config.special_tokens)
    rejects_path = config.output_prefix + ".rejects.jsonl"
    finals = [p + ext for p in prefixes for ext in (".bin", ".idx", ".json")] + [rejects_path]
    with AtomicOutputs(finals) as outputs:
        writers = [
            IndexedDatasetWriter(outputs.tmp(p + ".bin"), outputs.tmp(p + ".idx"), dtype) for p in prefixes
        ]
        rejects = RejectLog(outputs.tmp(rejects_path), config.max_rejects)
        results = ordered_map(
            tokenize_chunk,
            read_chunks(config.inputs, config.chunk_bytes),
            config.workers,
            initializer=_init_worker,
            initargs=(tokenizer, config, eod_id),
            tasks_per_worker=TASKS_PER_WORKER,
        )
        for result in results:
            for writer, ids, lengths in zip(writers, result.ids, result.lengths):
                writer.add_batch(ids, lengths)
            rejects.add(result.rejects)
            special_records += result.special_records
            progress.update(result.records, result.text_bytes, sum(len(i) for i in result.ids))
        progress.close()
        rejects.close()
        if writers[0].documents == 0:
            raise empty_output(config.output_prefix, rejects)
        for writer in writers:
            writer.finalize()
        manifests = []
        for prefix, key, writer in zip(prefixes, config.text_keys, writers):
            manifest = base_manifest("pretrain")
            manifest.update(
                tokenizer=tokenizer.identity(),
                eod_id=eod_id,
                eod_token=config.eod_token,
                # Recorded so train stages never mistake padding for the real end-of-document.
                pad_id=DEFAULT_PAD_ID,
                text_key=key,
                special_tokens=config.special_tokens,
                special_token_records=special_records,
                dtype=dtype.name,
                documents=writer.documents,
                sequences=writer.sequences,
                tokens=writer.tokens,
                fingerprint=fingerprint([writer.digests]),
                inputs=[{"path": os.path.abspath(p), "bytes": os.path.getsize(p)} for p in config.inputs],
                rejects=rejects.summary(),
                wall_seconds=round(time.monotonic() - start, 3),
            )
            outputs.tmp(prefix + ".json")
            write_json(prefix + ".json.tmp", manifest)
            manifests.append(manifest)
        if rejects.count == 0:
            outputs.discard(rejects_path)
        outputs.commit(markers=[p + ".json" for p in prefixes])
    return manifests
