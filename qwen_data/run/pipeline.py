"""The pipeline core: reader → step → writer, with what every run owes done once.

    readers.read_chunks (main) → step.process (workers, results in input order; one chunk: main)
    → step's writer (main) → one manifest per dataset, committed last

A chunk of a plain jsonl file is only a span of bytes: the worker reads it. Results' bulk arrays
come back in shared memory (`workers`), so the main process moves no text and pickles no ids.

A step (`pretrain.Tokenize`, `sft.ChatSamples`) says which prefixes and files it writes, what a
worker makes of a chunk of records and how the results are written. `run` does the rest for any
step: input checks, the workers, progress, rejected records, refusing empty output, atomic outputs,
manifests and the commit. (`ray.run_on_ray` takes the same step, to run it as shards on a cluster.)
"""

from __future__ import annotations

import functools
import itertools
import json
import os
import pickle
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Iterator, Protocol

import orjson

from ..certify.checks import CertificateError, add_counts, checkers, checks_for, read_back
from ..errors import InputFileError
from ..formats.claims import check as check_outputs
from ..formats.claims import dataset_owner
from ..formats.indexed import CHANNELS, pause_threads
from ..formats.manifest import Manifest, input_entry
from ..formats.outputs import TMP_SUFFIX, AtomicOutputs
from ..inputs.chunks import DEFAULT_CHUNK_BYTES, Chunk, LineNumbers
from ..inputs.files import STDIN, InputFile, Shard, expand
from ..inputs.readers import estimated_records, read_chunks
from ..inputs.records import RejectLog, empty_output
from ..text.tokenizer import SPECIAL_POLICIES, TokenizerConfig, resolve_tokenizer_dir
from .certifier import NOTHING_WRITTEN, Certifier, in_parts
from .journal import Journal, Resumed, identity
from .prestart import large, take as take_prestarted
from .progress import Progress

# A worker is replaced once its resident memory has grown this much (its share of this budget, at
# least 64 MiB): the tokenizer's pretoken cache grows with the text a worker has seen, and replacing
# the worker bounds it, so peak memory does not grow with the corpus. A cache speeds the tokenizer
# up (repeated words), so the budget is shared out rather than fixed per worker.
WORKER_CACHES = 1536 << 20
# A worker hands its result's bulk arrays over in shared memory, in slots of this many bytes per
# byte of a chunk: int32 ids take at most 4 bytes a byte of text (one token per byte), plus a little
# for end-of-document and template tokens. A result that does not fit goes through the pipe.
SLOT_BYTES_PER_CHUNK_BYTE = 4
SLOT_MARGIN = 1 << 20
UNCERTIFIED = {"certified": False, "why": "--no-certify: no record was checked against the reference libraries"}
CHECKED_BY_CALLER = {"certified": False, "why": "the records picked were handed to the caller to check"}


@dataclass(kw_only=True)
class RunConfig:
    """What every pipeline takes besides its step's own settings."""

    inputs: list[str]  # as given: files, directories, globs, hf:NAME, - (see `inputs.files`)
    output_prefix: str
    hf_split: str | None = None
    shard: Shard | None = None  # this run's part of the inputs; its output is for `merge`
    workers: int = 2  # 0: in this process (a Ray task, which is itself the worker)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    special_tokens: str = "text"
    max_rejects: int | None = None
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    quiet: bool = False
    certify: bool = True  # the certificate: every document spelled, a sample against the reference (`certify`)
    # False: the records picked are not checked here but left in `step.picked` for the caller to check
    # (a Ray task's, checked by the driver with every shard's: `run.ray`); the manifests say so.
    check_here: bool = True

    def __post_init__(self) -> None:
        if self.special_tokens not in SPECIAL_POLICIES:
            raise ValueError(f"--special-tokens must be one of {SPECIAL_POLICIES}")
        if self.workers < 0:
            raise ValueError("--workers must be at least 1 (0: in this process)")
        if self.chunk_bytes < 1:
            raise ValueError("--chunk-mb must be above 0")

    @property
    def rejects_path(self) -> str:
        return self.output_prefix + ".rejects.jsonl"


@dataclass
class ChunkResult:
    """What a worker made of one chunk; a step's result adds its data."""

    rejects: list[dict]
    records: int  # records kept
    text_bytes: int  # their size in the input
    tokens: int
    special_records: int  # records holding literals the special-token policy acts on
    lines: int = field(init=False, default=0)  # the chunk's records, kept or not (set by `run`)
    # The certificate's part (`certify.checks`): the records whose documents were all spelled again,
    # (record number, why) of the first that was not, and what the step made of the records picked
    # for the reference, each an item whose first value is the record's number as the chunk numbers it.
    spelled: int = field(init=False, default=0)
    misspelled: tuple[int, str] | None = field(init=False, default=None)
    to_check: list = field(init=False, default_factory=list)
    picked_json: str | None = field(init=False, default=None)  # `to_check` as the journal keeps it
    # `to_check` pickled in the worker for the checking processes: the main process forwards the bytes, where
    # pickling the items again held its GIL (on a 16-core host, ~0.2 s of its threads a GB of chats); in parts
    # (`certifier.in_parts`), which `Certifier` hands out a few at a time
    picked_pickle: list[tuple[int, bytes]] | None = field(init=False, default=None)  # (records, pickled) a part


class Writer(Protocol):
    documents: int  # written so far

    def add(self, result: ChunkResult) -> None: ...

    def flush(self) -> dict[str, str | None]:
        """Each appended file handed to the kernel, with the joinable hash of what the last result
        added to it (None: the journal reads it back)."""

    def ends(self) -> dict[str, int]:
        """Where appended files ended once that result was added, for those that may hold more by
        the time its journal line is written (the others: their size then)."""

    def behind(self, call) -> None:
        """`call()` once everything added so far is written: in the writer's own thread where it
        writes behind this one (the journal's lines go there, after the bytes they vouch for)."""

    def settle(self) -> None:
        """Wait for what the writer runs behind; its errors are not wanted."""

    def close(self) -> dict[str, Manifest]:
        """Finish the files; the manifest of each dataset by its prefix (inputs, rejects and time
        are filled in by `run`)."""

    # A writer may also have `ending()`: called once every result is added, while the workers still take
    # its errands (`workers.ordered_map`'s `ending`: `SFTWriter` has its last rows written there).


class Step(Protocol):
    """Built from its config alone (`Step(config)`), at no cost: an executor asks it what it writes
    before anything runs, and one that runs shards elsewhere (Ray) builds each shard's step anew
    from the shard's config, where `run` prepares it."""

    config: RunConfig
    kind: str  # the manifests' kind: an existing prefix of another kind is never replaced
    # Fields of the step's results that hold its bulk numpy arrays (or lists of them): workers hand
    # them over in shared memory, read in place until the next result (a writer copies what it keeps).
    shared_fields: tuple[str, ...]
    # The certificate's checker (`certify.checks.checks_for`), set by `run` before the workers fork
    # (None: --no-certify); `process` spells every document with it and hands over picked records.
    checks: object | None

    def __init__(self, config: RunConfig) -> None: ...

    def prepare(self) -> None:
        """Build what processing needs (tokenizer, template), in the process that forks the workers."""

    def prefixes(self) -> list[str]:
        """The output prefixes, one dataset each: the manifests `run` returns, in this order."""

    def files(self) -> list[str]:
        """Every file the step writes, manifests included (declared up front: they are locked)."""

    def columns(self) -> list[str] | None:
        """The record keys the step reads (None: all); columnar inputs read only these."""

    def process(self, chunk: Chunk) -> ChunkResult:
        """Runs in a worker process. A bad record goes through `Rejects.sift` into the result's rejects."""

    def open(self, outputs: AtomicOutputs) -> Writer: ...


def run(step: Step, progress: Progress | None = None) -> list[Manifest]:
    """The manifest of each of `step.prefixes()`. `progress`: where to report (default: a display on
    stderr unless the config is quiet)."""
    start, config = time.monotonic(), step.config
    # The reference's process first, to load its libraries while this one prepares and works.
    early = []
    if config.certify and config.check_here:
        early = Certifier.early(os.path.join(resolve_tokenizer_dir(config.tokenizer.name)[1], "tokenizer.json"),
                                checkers(step, config.workers), whole=step.kind == "sft" or large(config.inputs))
    else:
        take_prestarted(None)  # nothing checks here: a checking process forked as the command started goes
    try:
        return _run(step, config, start, early, progress)
    finally:
        for side in early:
            side.end()


def _run(step: Step, config: RunConfig, start: float, early, progress: Progress | None) -> list[Manifest]:
    step.prepare()
    sources = expand(config.inputs, config.hf_split)
    inputs = input_list(sources)
    step.checks = checks_for(step, inputs, [estimated_records(s) for s in sources]) if config.certify else None
    if step.checks is not None and step.checks.uncertified:
        for side in early:  # no reference here (SFT without the template's Jinja): nothing to check
            side.end()
        early.clear()
    # A step whose writer appends chunk by chunk keeps a journal: a killed run resumes (`journal`).
    journaled = step.journaled() if config.check_here and hasattr(step, "journaled") and STDIN not in config.inputs \
        else None
    journal = Journal(config.output_prefix, identity(config, inputs)) if journaled is not None else None
    if journal is not None:  # a commit a killed run began is finished first, its files checked
        held = AtomicOutputs(step.files() + [config.rejects_path])
        try:
            if journal.finish_commit() is not None:
                for side in early:
                    side.end()
                return [Manifest.read(prefix) for prefix in step.prefixes()]
        finally:
            held.release()
    check_outputs(step.files() + [config.rejects_path], [s.path for s in sources if s.path != STDIN],
                  dataset_owner(step.prefixes(), step.kind))
    writer = None
    try:
        with AtomicOutputs(step.files() + [config.rejects_path], keep_on_interrupt=journal is not None) as outputs:
            resumed = journal.resumable([*journaled, config.rejects_path + TMP_SUFFIX],
                                        step.checks.item_from_json if step.checks is not None else None) \
                if journal else Resumed()
            writer = step.open(outputs, resumed) if journal else step.open(outputs)
            rejects = RejectLog(outputs.tmp(config.rejects_path), config.max_rejects,
                                _summed(resumed, "rejects") if resumed.chunks else None)
            if journal:
                journal.start(resumed)
            manifests = _written(step, config, sources, inputs, outputs, writer, rejects, progress, early,
                                 journal, resumed, start)
    except BaseException as stopped:
        if journal is not None:
            _stopped(journal, writer, isinstance(stopped, KeyboardInterrupt))
        raise
    if journal is not None:
        journal.remove()
    return list(manifests.values())


def _stopped(journal: Journal, writer: Writer | None, interrupted: bool) -> None:
    """A run that stops: interrupted (Ctrl-C, SIGTERM), its staged files and journal stay for the next
    run; failed, its journal goes. The writer's thread first writes what it holds (journal lines too)."""
    if writer is not None:
        writer.settle()
    if interrupted:
        journal.close()
    else:
        journal.remove()


def _written(step: Step, config: RunConfig, sources: list[InputFile], inputs: list[dict], outputs: AtomicOutputs,
             writer: Writer, rejects: RejectLog, progress: Progress | None, early, journal, resumed: Resumed,
             start: float) -> dict[str, Manifest]:
    """Every chunk written, the manifests made and everything committed; → the manifests."""
    total = sum(s.size for s in sources)
    if progress is None:
        low, high = (0, total) if config.shard is None else config.shard.stretch(total)
        progress = Progress(high - low, enabled=not config.quiet)
    checked = _consume(step, config, sources, writer, rejects, progress, early, journal, resumed)
    if writer.documents == 0 and config.shard is None:  # a shard may be empty; the merge may not
        raise empty_output(config.output_prefix, rejects)
    manifests = writer.close()
    if checked.read_back:  # the picked documents as written, before anything is committed
        files = step.checks.staged_files(list(manifests))
        entries = writer.placed(checked.read_back) if hasattr(writer, "placed") else checked.read_back
        read_back(entries, [(outputs.staged(b), outputs.staged(i)) for b, i in files])
    for prefix, manifest in manifests.items():
        manifest.inputs, manifest.rejects = inputs, rejects.summary()
        manifest.certificate = (
            UNCERTIFIED if not config.certify
            else {**CHECKED_BY_CALLER, "records_spelled": checked.counts.get("records_spelled", 0),
                  "records_kept": checked.records}
            if not config.check_here else step.checks.certificate(checked.counts, checked.records, manifest.fingerprint))
        manifest.shard = None if config.shard is None else config.shard.record()
        manifest.wall_seconds = round(time.monotonic() - start, 3)
        manifest.write(outputs.tmp(prefix + ".json"))
    if rejects.count == 0:
        outputs.discard(config.rejects_path)
    markers = [prefix + ".json" for prefix in manifests]
    if journal is not None:  # (each .bin's hash from its manifest, channel by channel)
        journal.committing(*outputs.commit_order(markers),
                           {prefix + channel + ".bin": digest for prefix, m in manifests.items()
                            for channel, (_, digest) in zip(CHANNELS, m.digests)})
    outputs.commit(markers=markers)
    return manifests


def _summed(resumed: Resumed, name: str) -> dict[str, int]:
    """The chunks' `name` counts (by key) added up."""
    total: dict[str, int] = {}
    for chunk in resumed.chunks:
        for key, n in chunk[name].items():
            total[key] = total.get(key, 0) + n
    return total


def input_list(sources: list[InputFile]) -> list[dict]:
    """The manifest's `inputs`: every file read, in order, pinned before it is read (`input_entry`)."""
    entries = []
    for source in sources:
        entry = {"path": STDIN, "bytes": 0} if source.path == STDIN else input_entry(source.path)
        if entry["bytes"] != source.size:  # what the run reads (its shards' bounds) is the size found first
            raise InputFileError(f"{source.path}: changed as the run began ({source.size:,} bytes, then "
                                 f"{entry['bytes']:,}): run again once it is written")
        entries.append(entry)
    return entries


@dataclass
class RunChecks:
    """What a run's certificate checked as it went (`_consume`)."""

    counts: dict = field(default_factory=dict)  # summed as `certify.checks.add_counts` sums them
    records: int = 0  # records kept
    read_back: list = field(default_factory=list)  # `certify.checks.read_back`'s entries


def _consume(step: Step, config: RunConfig, sources: list[InputFile], writer: Writer, rejects: RejectLog,
             progress: Progress, early, journal: Journal | None, resumed: Resumed) -> RunChecks:
    """Every chunk processed and written (after the chunks `resumed` reuses); what the certificate checked."""
    chunks = read_chunks(sources, config.chunk_bytes, config.shard, step.columns())
    chunks = itertools.islice(chunks, len(resumed.chunks), None)  # (chunks are planned the same every run)
    chunks, handed = _handed(chunks)
    head = list(itertools.islice(chunks, 2))
    chunks = itertools.chain(head, chunks)
    in_process = config.workers == 0 or len(head) < 2
    checks, checked = step.checks, RunChecks()
    certifier = None
    if checks is not None and not checks.uncertified:  # (without a reference, nothing is picked)
        certifier = Certifier(checks, early) if config.check_here else Certifier.keeping(step)
    numbers = LineNumbers()
    _replay(resumed, numbers, checked, progress, certifier, journal)
    try:
        results = _results(step, config, chunks, in_process, getattr(writer, "ending", None))
        for result in results:
            input_bytes, first, span, path = handed.popleft()
            shift = numbers.shift(first, span, result.lines)  # a worker numbered a span's lines from 1
            for entry in result.rejects:
                entry["record"] += shift
            batch = None
            if checks is not None:
                batch = _take_checks(checks, certifier, checked, result, f"{path}:", shift, writer.documents)
            writer.add(result)
            rejects.add(result.rejects)
            progress.update(result.records, result.text_bytes, result.tokens, input_bytes)
            if journal is not None:
                _journal(journal, writer, rejects, result, first, span, input_bytes, batch,
                         "[]" if batch is None else result.picked_json, [path, shift])
                # (the thread behind reads the answers as they are then: more may have come, never fewer)
                writer.behind(functools.partial(journal.answers, certifier.answered if certifier is not None else {}))
        progress.close()
        rejects.close()
        # A mismatch raises here, before anything is committed: the run leaves no output.
        if certifier is not None:
            add_counts(checked.counts, certifier.finish())
        return checked
    finally:
        if certifier is not None:
            certifier.end()


def _handed(chunks: Iterator[Chunk]) -> tuple[Iterator[Chunk], deque]:
    """`chunks`, each noted as it is handed out: (input bytes, first, span, path), in order."""
    handed: deque[tuple[int, int | None, bool, str]] = deque()

    def counted(chunks) -> Iterator[Chunk]:
        for chunk in chunks:
            handed.append((chunk.input_bytes, chunk.first, chunk.span is not None, chunk.path))
            yield chunk

    return counted(chunks), handed


def _replay(resumed: Resumed, numbers: LineNumbers, checked: RunChecks, progress: Progress,
            certifier: Certifier | None, journal: Journal | None) -> None:
    """What the chunks a run reuses wrote and checked, as its journal says, counted as if done here;
    their picked records whose check had not come back handed to `certifier` again."""
    for k, chunk in enumerate(resumed.chunks):
        numbers.shift(chunk["first"], chunk["span"], chunk["lines"])
        checked.records += chunk["records"]
        add_counts(checked.counts, {"records_spelled": chunk["spelled"], **resumed.answers.get(k, {})})
        progress.update(chunk["records"], chunk["text_bytes"], chunk["tokens"], chunk["input_bytes"])
        if chunk["picked"] and k not in resumed.answers and certifier is not None:
            path, shift = chunk["picked_at"]
            journal.awaiting(certifier.add([(f"{path}:{number + shift}", certifier.checks.item_from_json(item))
                                            for number, item in chunk["picked"]]), k)


def _journal(journal: Journal, writer: Writer, rejects: RejectLog, result: ChunkResult, first: int | None,
             span: bool, input_bytes: int, batch: int | None, picked: str | None, picked_at: list) -> None:
    """A chunk written, in the journal once its bytes are (`Writer.behind`): its counts, where its
    bytes end in each staged file and their hashes, and its records picked for the certificate
    (checked by the run that resumes where their answer is not in the journal), as JSON text the
    worker made (`picked_json`; None: they could not be kept), each [its number in the chunk, item];
    `picked_at`: [the input's path, what the chunk's numbers are shifted by]. The rejects' end is
    taken here, as this chunk's rejects are written: the next chunk's may follow before the line."""
    rejects.flush()
    rejects_end = os.path.getsize(rejects.path)
    reasons: dict[str, int] = {}
    for entry in result.rejects:
        reasons[entry["reason"]] = reasons.get(entry["reason"], 0) + 1
    entry = {"first": first, "span": span, "lines": result.lines, "records": result.records,
             "text_bytes": result.text_bytes, "tokens": result.tokens, "input_bytes": input_bytes,
             "special_records": result.special_records, "spelled": result.spelled, "rejects": reasons,
             "truncated": getattr(result, "truncated", 0),  # (SFT's samples cut to --seq-length)
             "trained": getattr(result, "trained", 0),  # (SFT's trained tokens)
             "picked_at": picked_at}

    def line() -> None:
        written = journal.written(writer.flush() | {rejects.path: None}, writer.ends() | {rejects.path: rejects_end})
        journal.chunk(entry | written, batch, picked)

    writer.behind(line)


def _take_checks(checks, certifier: Certifier, checked: RunChecks, result: ChunkResult, path: str, shift: int,
                 documents: int) -> int | None:
    """A result's part of the certificate: a document that did not spell its text stops the run; →
    the number of the batch of its picked records handed to the certifier (None: none picked)."""
    if result.misspelled is not None:
        number, why = result.misspelled
        raise CertificateError(f"{path}{number + shift}: {why}; {NOTHING_WRITTEN}")
    checked.counts["records_spelled"] = checked.counts.get("records_spelled", 0) + result.spelled
    checked.records += result.records
    if result.to_check:
        items = [(f"{path}{item[0] + shift}", item) for item in result.to_check]
        checked.read_back += [entry for where, item in items for entry in checks.to_read_back(where, item, documents)]
        return certifier.add(items, documents, (path, shift, result.picked_pickle))
    return None


def _results(step: Step, config: RunConfig, chunks: Iterator[Chunk], in_process: bool,
             ending=None) -> Iterator[ChunkResult]:
    """`ending`: the writer's, once every result is written, while the workers still take its errands."""
    work = functools.partial(_process, step)
    if in_process:
        # One chunk is processed here: forking a worker for it (and importing multiprocess) takes
        # longer than a small input's whole run.
        return map(work, chunks)
    from .workers import ordered_map

    # Forked workers inherit the step as it is (tokenizer built, template compiled): nothing is pickled.
    return ordered_map(work, chunks, config.workers, worker_growth=max(64 << 20, WORKER_CACHES // config.workers),
                       shared_fields=step.shared_fields,
                       slot_bytes=SLOT_BYTES_PER_CHUNK_BYTE * config.chunk_bytes + SLOT_MARGIN,
                       before_fork=pause_threads, ending=ending)


def _process(step: Step, chunk: Chunk) -> ChunkResult:
    result = step.process(chunk)
    result.lines = chunk.lines
    if result.to_check:
        result.picked_json = picked_json(step.checks, result.to_check)
        result.picked_pickle = [(len(part), pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
                                for part in in_parts(result.to_check)]
    return result


def picked_json(checks, items: list) -> str | None:
    """A chunk's picked records as its journal line keeps them, JSON text made in the worker (the
    process writing the journal only puts it in the line: encoding a run's ~3,500 SFT records, their
    samples' ids and masks, cost it ~0.5 s); None where one cannot be kept (`item_json`). orjson writes it
    at ~5 GB/s where json took ~0.5 (3,500 records' base64 arrays: ~0.14 CPU s), json still where orjson
    refuses a value (an integer past 64 bits in a row)."""
    kept = [[item[0], checks.item_json(item)] for item in items]
    if any(item is None for _, item in kept):
        return None
    try:
        return orjson.dumps(kept).decode()
    except TypeError:  # (orjson.JSONEncodeError is one)
        return json.dumps(kept)
