"""SFT data: chat/instruction records → ChatML samples → ids + loss mask → indexed datasets.

  readers (main) → ChatSamples.process (workers: to_conversation → render_samples → SampleEncoder)
  → MaskedWriter (main: ids, and a uint8 loss mask with the identical index)
  → [--pack: rows of exactly --seq-length] → [--layout pai: Pai-Megatron-Patch's rows] → manifest

The default layout ("mask"): unpacked, every sample is one document of one sequence, stored
unpadded: readers pad it to their sequence length with the pad id (mask 0). Packed, every document
is one row of exactly N tokens: its sequences are its samples, then one sequence of pad ids (mask 0)
if the row is not full, so a reader knows every boundary and samples never need to see each other.
`--layout pai` writes what Pai-Megatron-Patch's trainer reads instead (`qwen_data.formats.pai`);
`qwen_data.formats.layouts` says what each layout is.
Packing and the Pai layout lay a run's samples out in rows window by window as they come
(`packing.SampleWindows`); a shard leaves its samples as they are, and `merge` lays them out (`layouts.finish`).
A run that lays out rows stages its samples as they come (PREFIX.unpacked, written by the workers that
made them, journaled chunk by chunk, removed at the commit), and its rows are laid out from there
(`SFTWriter`): a row waits on samples of chunks to come, so a killed run resumes from the samples,
laying out again the rows they made.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from ..certify.spelling import SpellingError
from ..errors import RecordError
from ..formats.digest import piece_hashes, pieces_digest
from ..formats.indexed import Behind, IndexedDatasetWriter, MaskedWriter, token_dtype
from ..formats.layouts import UNPACKED, DataLayout, LaidOut, counts_of, sft_layout, staged_windows
from ..formats.manifest import LAYOUTS, Manifest, SFTSection
from ..formats.outputs import TMP_SUFFIX, AtomicOutputs
from ..formats.packing import DEFAULT_PACKING, PACKINGS, SampleWindows
from ..inputs.columns import ColumnMap
from ..inputs.chunks import Chunk
from ..inputs.records import Record, Rejects, check_unicode, reject_entry
from ..qwen import DEFAULT_PAD_ID, DEFAULT_PAD_TOKEN
from ..qwen import EMBEDDING_ROWS_SMALL as MIN_EMBEDDING_ROWS
from ..qwen import FIRST_ADDED_ID, MAX_SEQ_LENGTH, TEMPLATE_FLAVOURS, TEMPLATE_TOKENS
from ..run import pipeline
from ..run.journal import Placed, Resumed, joined
from ..run.pipeline import ChunkResult, RunConfig
from ..text import literals
from ..text.literals import ESCAPES_SURROGATE, MAY_HOLD_LEAD, json_marks
from ..text.conversations import FORMATS, to_conversation
from ..text.masking import MASK_POLICIES, SampleEncoder
from ..text.templates import HISTORY_MODES, SPAN_KINDS, TEMPLATE_NAMES, Sample, get_template
from ..text.tokenizer import QwenTokenizer, TokenizerConfig


@dataclass(kw_only=True)
class SFTConfig(RunConfig):
    template: str = "qwen2p5"
    format: str = "auto"
    seq_length: int | None = None
    pack: bool = False
    packing: str = DEFAULT_PACKING  # a key of packing.PACKINGS
    layout: str = "mask"
    overlong: str | None = None  # None: the layout's default, as the two below
    mask: str = "assistant"
    assistant_span: str | None = None
    input_separator: str | None = None  # between an alpaca instruction and its input
    history: str = "rendered"
    enable_thinking: bool | None = None
    parse_tool_arguments: bool = False
    pad_id: int | None = None
    pad_token: str | None = None
    special_tokens: str = "safe"
    columns: ColumnMap | None = None  # --columns / --dataset-info: the records' own column names
    reference_template: str | None = None  # the template's official Jinja file, for the certificate

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.layout not in LAYOUTS:
            raise ValueError(f"--layout must be one of {', '.join(LAYOUTS)}")
        for name, value in self.data_layout.defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, value)
        choices = {"template": TEMPLATE_NAMES + ("auto",), "format": FORMATS, "overlong": ("drop", "truncate"),
                   "mask": MASK_POLICIES, "assistant_span": tuple(SPAN_KINDS), "history": HISTORY_MODES,
                   "packing": tuple(PACKINGS)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"--{name.replace('_', '-')} must be one of {', '.join(allowed)}")
        if self.data_layout.needs_seq_length and not self.seq_length:
            raise ValueError(self.data_layout.needs_seq_length)
        if self.seq_length is not None and not 2 <= self.seq_length <= MAX_SEQ_LENGTH:
            raise ValueError(f"--seq-length must be at least 2 and at most {MAX_SEQ_LENGTH:,}")
        if self.pad_id is not None and self.pad_token is not None:
            raise ValueError("give --pad-id or --pad-token, not both")

    @property
    def data_layout(self) -> DataLayout:
        return sft_layout(self.layout, self.pack, self.seq_length)

    @property
    def lays_out_here(self) -> bool:
        """Whether this run lays out its samples in rows itself (packed, pai): a shard leaves them
        as they are, for `merge` to lay out all shards' samples as one run would."""
        return self.data_layout.lays_out_rows and self.shard is None

    @property
    def rendered_history(self) -> str:
        return "last" if self.mask == "last" else self.history


def resolve_pad_id(config: SFTConfig, tokenizer: QwenTokenizer) -> int:
    """The fixed pad id: never eod/eos/<|im_end|> or any token the templates write, inside every
    Qwen embedding table. (Data that would contain it is rejected sample by sample.)"""
    pad = config.pad_id
    if pad is None:
        pad = config.data_layout.default_pad_id(tokenizer.vocab_size)
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
class SampleBatch(ChunkResult):
    ids: np.ndarray
    mask: np.ndarray
    lengths: np.ndarray  # per sample
    truncated: int
    # The joinable hashes of `ids` and `mask` as written where the run writes the samples as they come,
    # and each sample's own (ids then mask, `digest.piece_hashes`): the rows a run lays out join these
    # in their order, so the process writing them reads none of their bytes to hash them. Made in the
    # worker, which hashes each byte once.
    digests: tuple[str, str] | None = None
    sample_hashes: tuple[np.ndarray, np.ndarray] | None = None
    trained: int = 0  # the mask's trained tokens, counted in the worker (the main process reads no mask byte)


def run(config: SFTConfig, progress=None) -> Manifest:
    return pipeline.run(ChatSamples(config), progress)[0]


class ChatSamples:
    """The SFT step: record → conversation → rendered samples → ids and loss mask."""

    kind = "sft"  # the manifests' kind
    shared_fields = ("ids", "mask")  # handed over in shared memory (`pipeline.Step`)

    def __init__(self, config: SFTConfig) -> None:
        self.config = config
        self.checks = None  # the certificate's checker (`certify.checks`), set by the pipeline

    def prepare(self) -> None:
        config = self.config
        tokenizer_config = config.tokenizer
        if tokenizer_config.flavour is None and config.template in TEMPLATE_FLAVOURS:
            # A Qwen2.5 model's tokenizer has no <think> token: render for the template's own flavour.
            tokenizer_config = TokenizerConfig(tokenizer_config.name, TEMPLATE_FLAVOURS[config.template],
                                               tokenizer_config.backend)
        self.tokenizer = QwenTokenizer.shared(tokenizer_config)
        self.template = get_template(config.template, self.tokenizer.directory)
        self.pad_id = resolve_pad_id(config, self.tokenizer)
        # Only the parse backend is built before forking: the text one, for the few samples with
        # literals that stay plain text, is built by a worker when it first meets one (in the main
        # process it would cost every run ~0.5 s and ~100 MB in each process).
        self.tokenizer.prepare("parse")
        self.encoder = SampleEncoder(self.tokenizer, config.assistant_span, config.mask)
        self.acted_on = self.tokenizer.acted_on(config.special_tokens)
        # Every literal begins with "<", and nothing but the record puts one in its conversation: a JSON
        # record without "<" (as itself or escaped) holds no literal, and is not searched for one (the
        # search of every string was ~8% of a worker's time; most records hold no "<").
        self.literals_lead = self.tokenizer.literal_lead == "<" and "<" not in config.input_separator

    def may_hold_literal(self, marks: int | None) -> bool:
        """Whether a record may hold a literal, by the `_native.json_marks` of its jsonl line or .json
        element (None: a row, which may)."""
        return not (self.literals_lead and marks is not None) or bool(marks & MAY_HOLD_LEAD)

    def prefixes(self) -> list[str]:
        return [self.config.output_prefix]

    def files(self) -> list[str]:
        """The mask layout's files whatever the layout (a Pai run removes an older run's loss mask),
        and where rows are laid out, the samples staged for a resume (`SFTWriter`)."""
        prefix = self.config.output_prefix
        staged = MaskedWriter.files(prefix + UNPACKED) if self.config.lays_out_here else []
        return MaskedWriter.files(prefix) + staged + [prefix + ".json"]

    def columns(self) -> list[str] | None:
        return self.config.columns.columns_read() if self.config.columns else None

    def process(self, chunk: Chunk) -> SampleBatch:
        batch, rejects = _Batching(self), Rejects(chunk)
        batch.chunk = chunk
        batch.picks = self.checks.picker(chunk.path) if self.checks is not None else None
        rejects.sift(chunk.records(), batch.render)
        rejects.sift(batch.encoded(), batch.fit)
        # The samples set aside came after every record set aside: back to record order (stable: a
        # record's samples stay in order).
        rejects.entries.sort(key=lambda r: r["record"])
        result = batch.result(rejects.entries)
        if self.checks is not None:
            result.misspelled, result.to_check = batch.misspelled, batch.to_check
            result.spelled = 0 if batch.misspelled else batch.records
        return result

    def _render_conversation(self, conversation, special: str | None) -> list[Sample]:
        """`special`: the first literal in it the special-token policy acts on."""
        policy = self.config.special_tokens
        if special and policy == "reject":
            raise RecordError("special-token", f"literal special token {special!r} in the conversation")
        return literals.render(self.template, conversation, self.acted_on if special and policy != "parse" else None,
                               self.config.rendered_history, self.config.enable_thinking)

    def open(self, outputs: AtomicOutputs, resumed: Resumed | None = None) -> "SFTWriter":
        return SFTWriter(self, outputs, resumed)

    def journaled(self) -> list[str]:
        """The staged files a run appends to chunk by chunk (`run.journal`): a killed run resumes. The
        samples as they come: the output itself, or where rows are laid out, PREFIX.unpacked."""
        ids_bin, ids_idx, mask_bin, mask_idx = (path + TMP_SUFFIX for path in MaskedWriter.files(self.samples_prefix))
        return IndexedDatasetWriter.files(ids_bin, ids_idx) + IndexedDatasetWriter.files(mask_bin, mask_idx)

    @property
    def samples_prefix(self) -> str:
        """Where a run writes its samples as they come (`journaled`)."""
        return self.config.output_prefix + (UNPACKED if self.config.lays_out_here else "")


class _Batching:
    """One chunk on its way to a SampleBatch: its records rendered to samples (each remembering its
    record), then the samples encoded and fitted to the run's settings."""

    def __init__(self, step: ChatSamples) -> None:
        self.step, self.config, columns = step, step.config, step.config.columns
        self.format = columns.format if columns and columns.format else self.config.format
        self.samples: list[Sample] = []
        # Per sample: its record's number and raw form (not the record: its parsed value is dropped as
        # soon as it is rendered, which spares memory and the garbage collector), k-th of n samples of it.
        self.origins: list[tuple[int, bytes | dict, int, int]] = []
        self.records = self.text_bytes = self.special_records = 0
        self.ids: list[np.ndarray] = []
        self.mask: list[np.ndarray] = []
        self.truncated = 0
        self.chunk: Chunk | None = None
        self.picks = None  # whether a record of the chunk is picked (`certify.checks`' picker; None: nothing checks)
        # The parity check: per sample of a picked record, (its record's number, k); per picked record,
        # (the record as the reference reads it, its sample count); then per record (number, (record,
        # count, [(k, our ids, our mask) of each sample encoded])).
        self.picked: dict[int, tuple[int, int]] = {}
        self.sources: dict[int, tuple] = {}
        self.to_check: list[tuple[int, tuple]] = []
        self.free: list[bool] = []  # per sample: literals made control ids, where the template's may stand
        self.written: dict[int, list] = {}  # picked record → (k, place among the chunk's samples, tokens kept)
        self.misspelled: tuple[int, str] | None = None

    def render(self, record: Record) -> None:
        """Raises RecordError for a record that makes no conversation, or one the templates refuse."""
        config, columns, value = self.config, self.config.columns, record.value
        picked = self.picks is not None and self.picks(record)
        if columns:
            value = columns.apply(value)
        source = _as_read(record, value, columns) if picked else None
        conversation = to_conversation(value, self.format, parse_tool_arguments=config.parse_tool_arguments,
                                       input_separator=config.input_separator)
        # A JSON string in a record (tools, tool arguments) is read again here and may spell a lone
        # surrogate, whatever read the record: rows are checked whole, lines that escape one too.
        marks = json_marks(record.raw) if isinstance(record.raw, bytes) else None
        if marks is None or marks & ESCAPES_SURROGATE:
            for where, text in conversation.strings():
                check_unicode(text, where)
        special = literals.find(conversation, self.step.acted_on) if self.step.may_hold_literal(marks) else None
        self.special_records += bool(special)
        rendered = self.step._render_conversation(conversation, special)
        self.records += 1
        self.text_bytes += record.size
        if picked:
            self.pick(record.number, source, len(rendered))
        self.samples.extend(rendered)
        self.free.extend([bool(special) and config.special_tokens == "parse"] * len(rendered))
        self.origins.extend((record.number, record.raw, k, len(rendered)) for k in range(len(rendered)))

    def pick(self, number: int, source, count: int) -> None:
        """A picked record's `count` samples, to be handed with the record itself (`source`) to the
        reference, which reads and renders it on its own (its literals under the run's policy)."""
        self.sources[number] = (source, count)
        for k in range(count):
            self.picked[len(self.samples) + k] = (number, k)

    def encoded(self) -> Iterator[_Encoded]:
        encodings = self.step.encoder.encode(self.samples) if self.samples else []
        if self.step.checks is not None:
            self._spell(encodings)
        checked: dict[int, list] = {}
        for position, ((number, raw, k, n), encoded) in enumerate(zip(self.origins, encodings)):
            if position in self.picked and not isinstance(encoded, RecordError):
                checked.setdefault(number, []).append((k, *encoded))
            yield _Encoded(number, raw, k, n, encoded)
        # (after the last sample is fitted) with where each picked sample kept lies among the chunk's
        self.to_check += [(number, (*self.sources[number], samples), self.written.get(number, []))
                          for number, samples in checked.items()]
        self.to_check.sort(key=lambda item: item[0])

    def _spell(self, encodings: list) -> None:
        """The certificate's first layer (`certify.spelling`) over every sample encoded."""
        kept = [k for k, e in enumerate(encodings) if not isinstance(e, RecordError)]
        checks = self.step.checks
        try:
            checks.speller.check_samples([self.samples[k].text for k in kept], [encodings[k] for k in kept],
                                         [self.free[k] for k in kept], checks.structure,
                                         [self.step.encoder.as_encoded[k] for k in kept])
        except SpellingError as wrong:
            origin = self.origins[kept[wrong.index]]
            sample = f"sample {origin[2] + 1} of {origin[3]}: " if origin[3] > 1 else ""
            self.misspelled = (origin[0], sample + str(wrong))

    def fit(self, sample: _Encoded) -> None:
        """Raises RecordError for a sample that does not fit the run's settings."""
        ids, mask, truncated = _fit(*sample.encoded, self.config, self.step.pad_id)
        if sample.number in self.sources:  # picked: read back from the written files (`certify.checks`)
            # what was kept of it is a prefix of the sample handed over (`_fit` cuts, never changes): its
            # length alone, where copies of the arrays doubled what a picked record costs to hand over
            self.written.setdefault(sample.number, []).append((sample.k, len(self.ids), len(ids)))
        self.truncated += truncated
        self.ids.append(ids)
        self.mask.append(mask)

    def result(self, rejects: list[dict]) -> SampleBatch:
        lengths = np.asarray([len(ids) for ids in self.ids], dtype=np.int64)
        ids = np.concatenate(self.ids) if self.ids else np.zeros(0, np.int32)
        mask = np.concatenate(self.mask) if self.mask else np.zeros(0, np.uint8)
        # (hashed as written, in the writer's dtype: the writer checks that every id fits it)
        written = ids.astype(token_dtype(self.step.tokenizer.vocab_size), copy=False)
        hashes = piece_hashes(written, lengths), piece_hashes(mask, lengths)
        digests = pieces_digest(hashes[0], lengths * written.itemsize), pieces_digest(hashes[1], lengths)
        return SampleBatch(rejects, self.records, self.text_bytes, int(lengths.sum()), self.special_records,
                           ids, mask, lengths, self.truncated, digests, hashes, int(mask.sum(dtype=np.int64)))


def _written_here(rows, landed) -> None:
    written = rows.write()
    if landed is not None:
        landed(written)


def _as_read(record: Record, value: dict, columns) -> bytes | dict:
    """A picked record as the reference reads it (`certify.messages.read_record`), taken before our
    parser sees it: its jsonl line, else a copy of its row or of the record --columns made of it."""
    if isinstance(record.raw, bytes) and not columns:
        return record.raw
    return copy.deepcopy(value)


class _Encoded:
    """One sample of a record (number, raw), the k-th of its n: its (ids, mask), or why the encoder
    could not make them."""

    __slots__ = ("number", "raw", "k", "n", "encoded", "error")

    def __init__(self, number: int, raw: bytes | dict, k: int, n: int, encoded) -> None:
        self.number = number
        self.raw = raw
        self.k = k
        self.n = n
        bad = isinstance(encoded, RecordError)
        self.encoded = None if bad else encoded
        self.error = encoded if bad else None

    def rejected(self, chunk: Chunk, error: RecordError) -> dict:
        """The record's reject line, naming the sample when the record has several."""
        if self.n == 1:
            return reject_entry(chunk, self.number, self.raw, error)
        error = RecordError(error.reason, f"sample {self.k + 1} of {self.n}: {error}")
        return reject_entry(chunk, self.number, self.raw, error) | {"sample": self.k + 1}


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


class SFTWriter:
    """Samples as they come, their ids and mask written where they belong by the workers that made
    them (`run.journal.Placed`): the output itself (the mask layout unpacked; a shard's, for `merge`),
    or, for a layout that lays out rows, PREFIX.unpacked, staged (journaled as unpacked ones are, so
    a resumed run lays out the rows of the samples it reuses again). Rows are placed here from the
    samples' lengths and hashes as windows close (`packing.SampleWindows`) and written, once the
    window's samples are staged, by a worker beside its tasks (`workers` errands), or behind this
    process's thread where none is left: this process touches no id byte of theirs."""

    def __init__(self, step: ChatSamples, outputs: AtomicOutputs, resumed: Resumed | None = None) -> None:
        """`resumed`: the chunks a killed run wrote, which the staged samples hold (`run.journal`);
        None where the run keeps no journal."""
        self.step, self.outputs = step, outputs
        config = step.config
        self.dtype = token_dtype(step.tokenizer.vocab_size)
        self.prefix = config.output_prefix
        reused = resumed is not None and bool(resumed.chunks)
        files = MaskedWriter.files(step.samples_prefix)
        self.samples = MaskedWriter([outputs.tmp(path) for path in files], self.dtype, hashed="given", resumed=(
            joined(resumed, outputs.staged(files[0])), joined(resumed, outputs.staged(files[2]))) if reused else None)
        self.workers = None  # the map whose workers write rows (`workers.ordered_map`'s, met in a result's placement)
        if config.lays_out_here:
            packing = config.packing if config.pack else None
            self.windows = SampleWindows(packing, config.seq_length)
            self.laid_out = LaidOut(outputs, self.prefix, config.layout, packing, config.seq_length, self.dtype,
                                    step.pad_id, (self.samples.ids.bin_path, self.samples.mask.bin_path))
            self.laying = Behind()  # rows written here: where no worker takes them (`_write`)
        self.in_order = Placed()  # the chunks of samples whose bytes their workers may still be writing
        self.lengths: list[np.ndarray] = []
        self.truncated = self.special_records = self.trained = 0
        if reused:
            self.lengths.append(self.samples.ids.sequence_lengths())
            self.truncated, self.special_records = resumed.total("truncated"), resumed.total("special_records")
            self.trained = resumed.total("trained")
            if config.lays_out_here:  # (the rows of the samples reused, laid out again as they were)
                self._lay_out(staged_windows(self.windows, self.samples.ids.bin_path, self.samples.mask.bin_path,
                                             self.dtype, self.lengths[0]))

    @property
    def documents(self) -> int:
        return sum(map(len, self.lengths))

    def placed(self, entries: list) -> list:
        """`certify.checks.read_back`'s entries, each sample's number among the run's (what
        `ChatChecks.to_read_back` gives) made its place in the files: in packed rows, its sequence."""
        if not self.step.config.lays_out_here:
            return entries
        return [(where, dataset, self.laid_out.sequence_of(sample), a, b, ours)
                for where, dataset, sample, a, b, ours in entries]

    def add(self, result: SampleBatch) -> None:
        lengths = result.lengths.copy()  # (a view of memory the next result reuses, as the arrays are)
        placement = getattr(result, "placement", None)  # (written by the worker that made them, where it still can)
        self.workers = placement.owner if placement is not None else self.workers
        ids, mask = self.samples.ids, self.samples.mask
        self.in_order.add(placement, [(ids, result.ids, lengths, result.digests[0]),
                                      (mask, result.mask, lengths, result.digests[1])], result.digests)
        if self.step.config.lays_out_here:
            self._lay_out(self.windows.add(lengths, result.sample_hashes))
        self.lengths.append(lengths)
        self.truncated += result.truncated
        self.special_records += result.special_records
        self.trained += result.trained

    def behind(self, call) -> None:
        """`call()` once the samples added so far are in their files (the journal vouches for
        those, not for the rows laid out from them)."""
        self.in_order.behind(call)

    def settle(self) -> None:
        """Wait for what runs behind (an interrupted run: its journal is closed next); its errors are
        not wanted."""
        if self.step.config.lays_out_here:
            self.laying.close(failed=True)
        self.in_order.settle()

    def ends(self) -> dict[str, int]:
        """Where the files of samples ended once the chunk being journaled was added (its workers
        write chunks' bytes as they come)."""
        return self.in_order.current.ends

    def flush(self) -> dict[str, str | None]:
        """The ids and the mask handed to the kernel; → each appended file with the joinable hash of
        what the chunk being journaled added to it (`run.journal`; called `behind`)."""
        ids_digest, mask_digest = self.in_order.current.digests
        return self.samples.ids.journaled(ids_digest) | self.samples.mask.journaled(mask_digest)

    def _lay_out(self, windows) -> None:
        """The windows that closed: their rows placed now, written once their samples are staged."""
        for window in windows:
            rows, landed = self.laid_out.place(*window)
            self.in_order.behind(functools.partial(self._write, rows, landed))

    def _write(self, rows, landed) -> None:
        """A window's rows written by a worker beside its tasks where one still takes them, else behind
        this thread; what writing them gives back `landed` here (`LaidOut.place`)."""
        if self.workers is None or not self.workers.errand(type(rows).write, rows, landed):
            self.laying.submit(_written_here, rows, landed)

    def ending(self) -> None:
        """Every sample is added: the last windows' rows placed while the workers can still write them."""
        if self.step.config.lays_out_here:
            self._lay_out(self.windows.close())

    def close(self) -> dict[str, Manifest]:
        config, step = self.step.config, self.step
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        section = self._section(lengths)
        self.in_order.close()
        if config.lays_out_here:
            self._lay_out(self.windows.close())
            self.laying.close()
            counts, section = self.laid_out.close(section, self.trained)
            self.samples.abort(self.outputs.remove_behind)  # (staged: the rows are written)
            for path in MaskedWriter.files(step.samples_prefix):
                self.outputs.discard(path)
        else:  # unpacked samples as written; a shard's are packed and laid out by `merge`
            self.samples.finalize()
            counts = counts_of(self.samples.ids, self.samples.digests)
            lays_out = config.data_layout.lays_out_rows
            section = section.replace(trained_tokens=self.trained, pack_on_merge=config.pack or None,
                                      packing=config.packing if config.pack else None,
                                      layout_on_merge=config.layout if lays_out else None)
        manifest = Manifest(kind="sft", tokenizer=step.tokenizer.identity(), eod_id=step.tokenizer.eod_id,
                            pad_id=step.pad_id, sft=section, **counts)
        return {self.prefix: manifest}

    def _section(self, lengths: np.ndarray) -> SFTSection:
        config, template = self.step.config, self.step.template
        return SFTSection(
            template=template.name, template_sha256=template.sha256, format=config.format,
            input_separator=config.input_separator, mask_policy=config.mask, assistant_span=config.assistant_span,
            history=config.rendered_history, enable_thinking=config.enable_thinking,
            special_tokens=config.special_tokens, special_token_records=self.special_records,
            seq_length=config.seq_length, overlong=config.overlong, samples=int(len(lengths)),
            sample_tokens=int(lengths.sum()), truncated=self.truncated,
        )
