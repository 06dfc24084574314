"""Pretraining data: jsonl text → token ids + end-of-document → Megatron indexed dataset.

  readers (main) → Tokenize.process (workers) → IndexedDatasetWriter per text key (main) → manifest

One document per record: the record's text tokens followed by the end-of-document id, which is
`<|endoftext|>` (151643) whatever the tokenizer's eos says (Megatron's own preprocess writes the
eos, `<|im_end|>` for Qwen instruct/Qwen3 tokenizers). With several `--text-key`s each key gets
its own dataset `PREFIX_{key}` (as Megatron's `--json-keys`), documents aligned: a record lacking
any key is rejected for all.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..errors import RecordError
from ..formats.digest import digest_of
from ..formats.indexed import IndexedDatasetWriter, token_dtype
from ..formats.manifest import Manifest, fingerprinted, train_problems
from ..formats.outputs import TMP_SUFFIX, AtomicOutputs
from ..inputs.chunks import Chunk
from ..inputs.records import Record, Rejects, check_unicode
from ..qwen import DEFAULT_PAD_ID, EOD_TOKEN
from ..run import pipeline
from ..run.journal import Placed, Resumed, joined
from ..run.pipeline import ChunkResult, RunConfig
from ..certify.sample import record_key
from ..certify.spelling import SpellingError
from ..text.tokenizer import QwenTokenizer, as_str


@dataclass(kw_only=True)
class PretrainConfig(RunConfig):
    text_keys: list[str] = field(default_factory=lambda: ["text"])
    eod_token: str = EOD_TOKEN

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.text_keys or len(set(self.text_keys)) != len(self.text_keys):
            raise ValueError("--text-key: give one or more distinct keys")


@dataclass
class Documents(ChunkResult):
    ids: list[np.ndarray]  # per text key: tokens of the chunk's documents, eod included
    lengths: list[np.ndarray]  # per text key: each document's length
    # per text key: the joinable hash of `ids` as the .bin holds them, taken in the worker that made
    # them (`formats.digest`): the writer joins them and hashes no byte itself
    digests: list[str]


def run(config: PretrainConfig, progress=None) -> list[Manifest]:
    """The manifest of each output prefix; `progress` as `pipeline.run` takes it."""
    return pipeline.run(Tokenize(config), progress)


class Tokenize:
    """The pretrain step: each record's text (per key) → its ids and the end-of-document id."""

    kind = "pretrain"  # the manifests' kind
    shared_fields = ("ids",)  # handed over in shared memory (`pipeline.Step`)

    def __init__(self, config: PretrainConfig) -> None:
        self.config = config
        self.checks = None  # the certificate's checker (`certify.checks`), set by the pipeline
        self.keys = tuple(key.encode("utf-8") for key in config.text_keys)  # as `Chunk.records` reads them

    def prepare(self) -> None:
        config = self.config
        self.tokenizer = QwenTokenizer.shared(config.tokenizer)
        self.eod_id = self.tokenizer.token_id(config.eod_token, "--eod-token")
        for problem in train_problems(config.output_prefix, "pretrain", self.eod_id, DEFAULT_PAD_ID):
            raise ValueError(problem)
        self.tokenizer.prepare(config.special_tokens)

    def prefixes(self) -> list[str]:
        """One dataset per text key: -o itself for one key, PREFIX_KEY for each of several."""
        config = self.config
        if len(config.text_keys) == 1:
            return [config.output_prefix]
        return [f"{config.output_prefix}_{key}" for key in config.text_keys]

    def files(self) -> list[str]:
        return [p + ext for p in self.prefixes() for ext in (".bin", ".idx", ".json")]

    def columns(self) -> list[str]:
        return self.config.text_keys

    def process(self, chunk: Chunk) -> Documents:
        texts, rejects = _Texts(self, chunk), Rejects(chunk)
        rejects.sift(chunk.records(self.keys), texts.add)
        # the records the reference checks, (number, position), picked all at once
        picked = [] if self.checks is None else [(texts.numbers[k], k)
                                                 for k in self.checks.picked(texts.hashed, texts.lines)]
        ids, lengths, encoded, misspelled = [], [], [], None
        for bucket in texts.by_key:
            flat, counts = self.tokenizer.encode_batch(bucket, special=self.config.special_tokens)
            encoded.append(self.tokenizer.as_encoded or [None] * len(bucket))  # (texts as normalized to encode)
            if self.checks is not None and misspelled is None:
                misspelled = self._spell(texts, bucket, flat, counts)
            doc_ids, doc_lengths = append_eod(flat, counts, self.eod_id)
            ids.append(doc_ids)
            lengths.append(doc_lengths)
        records = len(texts.by_key[0])
        dtype = token_dtype(self.tokenizer.vocab_size)
        result = Documents(rejects.entries, records, texts.text_bytes, sum(map(len, ids)), texts.special_records,
                           ids, lengths, [digest_of(doc_ids.astype(dtype, copy=False)) for doc_ids in ids])
        if self.checks is not None:
            result.misspelled, result.spelled = misspelled, 0 if misspelled else records
            ends = [np.cumsum(n) for n in lengths]
            result.to_check = [self.checks.item(number, k, [(as_str(bucket[k]), doc_ids[end[k] - n[k]:end[k]],
                                                             as_encoded[k])
                                                            for bucket, doc_ids, n, end, as_encoded
                                                            in zip(texts.by_key, ids, lengths, ends, encoded)])
                               for number, k in picked]
        return result

    def _spell(self, texts: "_Texts", bucket: list[str], flat: np.ndarray, counts: np.ndarray):
        """The certificate's first layer (`certify.spelling`): (record number, why) of the first
        document whose ids do not spell its text, or None."""
        try:
            self.checks.speller.check_texts(bucket, flat, counts, self.tokenizer.as_encoded)
        except SpellingError as wrong:
            return texts.numbers[wrong.index], str(wrong)
        return None

    def open(self, outputs: AtomicOutputs, resumed: Resumed | None = None) -> "PretrainWriter":
        return PretrainWriter(self, outputs, resumed)

    def journaled(self) -> list[str]:
        """The staged files a run appends to chunk by chunk (`run.journal`): a killed run resumes."""
        return [f for p in self.prefixes() for f in IndexedDatasetWriter.files(p + ".bin" + TMP_SUFFIX, p + ".idx" + TMP_SUFFIX)]


class PretrainWriter:
    """One indexed dataset per text key, documents aligned."""

    def __init__(self, step: Tokenize, outputs: AtomicOutputs, resumed: Resumed | None = None) -> None:
        """`resumed`: the chunks a killed run wrote, which the files hold (`run.journal`)."""
        self.step = step
        self.dtype = token_dtype(step.tokenizer.vocab_size)
        reused = resumed is not None and bool(resumed.chunks)
        self.writers = {
            p: IndexedDatasetWriter(outputs.tmp(p + ".bin"), outputs.tmp(p + ".idx"), self.dtype, hashed="given",
                                    resumed=joined(resumed, outputs.staged(p + ".bin")) if reused else None)
            for p in step.prefixes()
        }
        self.documents = next(iter(self.writers.values())).documents
        self.special_records = resumed.total("special_records") if reused else 0
        self.in_order = Placed()  # the chunks whose ids their workers may still be writing

    def flush(self) -> dict[str, str | None]:
        """Each appended file handed to the kernel; → the joinable hash of what the chunk being
        journaled (`behind`) added to each (None: the journal reads it back), for `run.journal`."""
        hashes = {}
        for writer, digest in zip(self.writers.values(), self.in_order.current.digests):
            hashes |= writer.journaled(digest)
        return hashes

    def ends(self) -> dict[str, int]:
        """Where each staged file ended once the chunk being journaled was added (later chunks' bytes
        may be in them already: the workers write theirs as they come)."""
        return self.in_order.current.ends

    def behind(self, call) -> None:
        """`call()` once the last chunk added is in the staged files, and every one before it."""
        self.in_order.behind(call)

    def settle(self) -> None:
        self.in_order.settle()

    def add(self, result: Documents) -> None:
        batches = list(zip(self.writers.values(), result.ids, result.lengths, result.digests))
        self.in_order.add(getattr(result, "placement", None), batches, result.digests)
        self.documents += result.records
        self.special_records += result.special_records

    def close(self) -> dict[str, Manifest]:
        config = self.step.config
        self.in_order.close()
        manifests = {}
        for (prefix, writer), key in zip(self.writers.items(), config.text_keys):
            writer.finalize()
            manifests[prefix] = Manifest(
                kind="pretrain", tokenizer=self.step.tokenizer.identity(), eod_id=self.step.eod_id,
                eod_token=config.eod_token, pad_id=DEFAULT_PAD_ID, text_key=key,
                special_tokens=config.special_tokens, special_token_records=self.special_records,
                dtype=self.dtype.name, documents=writer.documents, sequences=writer.sequences,
                tokens=writer.tokens, **fingerprinted([writer.digests]),
            )
        return manifests


class _Texts:
    """What `Tokenize` keeps of one chunk's records: per text key, the texts of the records it can
    use; their size in the input; how many hold literals the special-token policy acts on."""

    def __init__(self, step: Tokenize, chunk: Chunk) -> None:
        self.keys, self.policy = step.config.text_keys, step.config.special_tokens
        self.find_special = step.tokenizer.find_special
        self.by_key: list[list[str | bytes]] = [[] for _ in self.keys]  # (bytes: read from a line as UTF-8)
        self.text_bytes = self.special_records = 0
        self.chunk, self.checks = chunk, step.checks
        self.numbers: list[int] = []  # each kept record's number in the chunk
        # each kept record's line (a row's key, `sample.record_key`) for the reference's pick
        self.hashed: list[bytes] = []
        self.lines = chunk.table is None

    def add(self, record: Record) -> None:
        """Raises RecordError for a record without a usable text under every key."""
        policy = self.policy
        values = [_text_field(record, key, k) for k, key in enumerate(self.keys)]
        for value in values:
            if special := self.find_special(value, policy):
                self.special_records += 1
                if policy == "reject":
                    raise RecordError("special-token", f"literal special token {special!r} in text")
                break
        self.text_bytes += record.size
        if self.checks is not None:
            self.hashed.append(record.raw if self.lines else record_key(self.chunk.path, record))
        self.numbers.append(record.number)
        for bucket, value in zip(self.by_key, values):
            bucket.append(value)


def _text_field(record: Record, key: str, k: int) -> str | bytes:
    """The text of `record` under `key` (the step's k-th): its UTF-8 where `Chunk.records` read it from the
    line (and checked it there as below), else its str; RecordError where it is not one."""
    if record.texts is not None:
        return record.texts if isinstance(record.texts, bytes) else record.texts[k]
    if key not in record.value:
        # a row (parquet, Arrow) lacks the column, or holds null in it
        where = f"no {key!r} key" if isinstance(record.raw, bytes) else f"no {key!r} column, or null in it"
        raise RecordError("missing-key", where)
    value = record.value[key]
    if not isinstance(value, str):
        raise RecordError("not-a-string", f"{key!r} is a {type(value).__name__}, expected a string")
    if not value or value.isspace():
        raise RecordError("empty-text", f"{key!r} is empty" if not value else f"{key!r} holds only whitespace")
    if record.may_hold_surrogate:
        check_unicode(value, repr(key))
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
