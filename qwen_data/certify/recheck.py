"""`qwen-data verify --certify N`: about N records a prefix was made from, picked across all of it
under a new seed (a shard's own records for a shard), encoded again by today's reference libraries
(`certify.reference`: HF tokenizers for pretraining; for SFT the template's Jinja rendered by jinja2
as transformers renders it, then HF tokenizers) and compared
with the ids (and loss mask) the prefix holds for them, so an upgrade of the libraries is one
command from being known safe.

Records make documents (pretraining) or samples (SFT, one per record or, with --history split, one
per assistant turn) in the inputs' order, less those set aside (PREFIX.rejects.jsonl names the
record, and the sample of a record that made several), so the inputs must still be there and
unchanged (their pins in the manifest). SFT samples lie in the rows in record order, except that
best fit packs each window of samples in an order of its own (`packing.next_window`): the rows of
such a window are put back in record order from the plan of the window's sample lengths, which our
encoder gives again (checked against the rows' own lengths). The outcome is added to the manifest's
certificate as a `recheck`; a recheck that found a mismatch makes `qwen-data train` refuse the
prefix until `--allow-uncertified`.
"""

from __future__ import annotations

import fcntl
import heapq
import json
import os
import time
from types import SimpleNamespace

import numpy as np

from ..formats.layouts import layout_of
from ..formats.manifest import Manifest, describe_input, input_entry, pins_differ
from ..formats.outputs import atomic_file
from ..formats.packing import next_window
from ..inputs.chunks import LineNumbers
from ..inputs.files import Shard, expand
from ..inputs.readers import read_chunks
from ..text import literals
from ..text.conversations import to_conversation
from ..text.masking import SampleEncoder
from ..text.templates import TEMPLATE_NAMES, get_template
from ..text.tokenizer import QwenTokenizer, TokenizerConfig, TokenizerNotFound, directory_of
from .checks import CHAT_COUNTS, checked_part, compare_part, compare_samples
from .messages import NotMappable, RecordReading
from .reference import ChatReference, NotCertified, TextReference, reference_jinja, versions
from .sample import ranges, record_hash
from .spelling import Spelling

CHAT_LIBRARIES = ("jinja2", "tokenizers")
# Settings of `qwen-data sft` that change how records read and the manifest does not record.
UNRECORDED = ("--columns", "--dataset-info", "--parse-tool-arguments")


def recheck(prefix: str, count: int, reference_template: str | None = None,
            seed: int | None = None) -> tuple[list[str], dict | None]:
    """(problems found, the recheck): none where about `count` records picked across the whole
    prefix equal the reference's. The recheck is recorded in PREFIX.json unless the records could not
    be read (None) or the prefix cannot be written (read-only storage: `recorded` false).
    `reference_template`: SFT's reference Jinja, as `sft --reference-template`. `seed`: which
    records (default: new ones each time)."""
    manifest = Manifest.read(prefix)
    try:
        directory = directory_of(manifest.tokenizer)
        if manifest.sft is not None:
            sft = manifest.sft
            jinja = reference_jinja(SimpleNamespace(name=sft.template, sha256=sft.template_sha256), directory,
                                    reference_template)
            reading = RecordReading(sft.format, "\n" if sft.input_separator is None else sft.input_separator)
            reference = ChatReference(directory, manifest.tokenizer["flavour"], jinja, sft.assistant_span,
                                      sft.mask_policy, sft.enable_thinking, reading, sft.history,
                                      sft.special_tokens or "safe")
        else:
            reference = TextReference(directory, manifest.tokenizer["flavour"], manifest.special_tokens or "text")
    except TokenizerNotFound as exc:
        return [f"{prefix}: {exc}"], None
    except NotCertified as why:
        return [f"{prefix}: --certify: not certified: {why}"], None
    problems = _inputs_unchanged(prefix, manifest)
    rejected = _rejected(prefix, manifest, problems)
    if problems:
        return problems, None
    compare = _compare_samples if manifest.sft is not None else _compare_documents
    picker = _Picker(count, seed)
    try:
        counts, found = compare(prefix, manifest, directory, reference, rejected, picker)
    except ValueError as exc:
        return [f"{prefix}: --certify: {exc}"], None
    counts |= {"seed": picker.seed, "rule": "the records whose record_hash(record, seed) is smallest"}
    done = _record(prefix, counts, found, CHAT_LIBRARIES if manifest.sft is not None else ("tokenizers",))
    return [f"{prefix}: certify: {found}"] if found else [], done


class _Picker:
    """Which records a recheck encodes again: the `count` whose hash under a seed of their own
    (`sample.record_hash`) is smallest (all of them where fewer), so they spread over the whole prefix (every input file;
    a shard's own records only) and a recheck checks exactly as many as asked."""

    def __init__(self, count: int, seed: int | None) -> None:
        self.count = count
        self.seed = int.from_bytes(os.urandom(4), "little") if seed is None else seed
        self.kept: list[tuple[int, int, tuple]] = []  # a heap of (-hash, position, what to check)

    def offer(self, path: str, record, position: int, what: tuple) -> None:
        entry = (-record_hash(path, record, self.seed), position, what)
        if len(self.kept) < self.count:
            heapq.heappush(self.kept, entry)
        elif entry[0] > self.kept[0][0]:
            heapq.heapreplace(self.kept, entry)

    def picked(self) -> list[tuple]:
        """What to check of each record picked, in the prefix's order."""
        return [what for _, _, what in sorted(self.kept, key=lambda entry: entry[1])]


def _compare_documents(prefix, manifest, directory, reference, rejected, picker) -> tuple[dict, str | None]:
    documents = layout_of(manifest).open(prefix)
    for k, (where, record, _) in enumerate(_records(manifest, rejected, [manifest.text_key])):
        picker.offer(where.rpartition(":")[0], record, k, (where, record, k))
    table = Spelling.of(QwenTokenizer.shared(TokenizerConfig(directory, manifest.tokenizer["flavour"])))
    checked, lines = 0, {}
    for where, record, k in picker.picked():
        text = record.value.get(manifest.text_key) if isinstance(record.value, dict) else None
        if not isinstance(text, str):
            raise ValueError(f"{where} made a document but cannot be read now")
        if k >= len(documents):
            raise ValueError(f"{where} made a document the prefix does not hold")
        part = checked_part(text, documents.document(k)[0], picker.seed, table)
        checked += 1
        path, _, line = where.rpartition(":")
        lines.setdefault(path, []).append(int(line))
        if found := compare_part(where, part, reference.encode(part[0])[0], manifest.eod_id):
            return {"records_checked": checked}, found
    return {"records_checked": checked, "lines_checked": {p: ranges(n) for p, n in lines.items()}}, None


def _compare_samples(prefix, manifest, directory, reference, rejected, picker) -> tuple[dict, str | None]:
    """The samples of the records `picker` picks, against the samples the reference makes of each
    record itself (cut as the run cut over-long samples); records the reference cannot map are
    counted apart, as the run's certificate counts them."""
    sft, ours = manifest.sft, _OurSamples(manifest, directory)
    stored = _stored_in_record_order(prefix, manifest, ours, rejected)
    counts = dict.fromkeys(CHAT_COUNTS, 0)
    first = 1 if sft.layout == "pai" else 0  # Pai's labels cannot train a sample's first token
    for position, (where, record, _, kept, made) in enumerate(_kept_samples(manifest, rejected)):
        held = [next(stored, None) for _ in kept]
        if held and held[-1] is None:
            raise ValueError(f"{where} made samples the prefix does not hold")
        picker.offer(where.rpartition(":")[0], record, position, (where, record, kept, made, held))
    lines: dict[str, list[int]] = {}
    for where, record, kept, made, held in picker.picked():
        path, _, line = where.rpartition(":")
        lines.setdefault(path, []).append(int(line))
        try:
            theirs = [_cut(ids, mask, sft) for ids, mask, _ in reference.record_samples(_as_read(record))]
        except NotMappable:
            counts["records_not_mappable"] += 1
            continue
        counts["records_checked"] += 1
        mismatch = compare_samples(where, made, [(k, *sample) for k, sample in zip(kept, held)], theirs, counts, first)
        if mismatch:
            return counts, mismatch
    return {**counts, "lines_checked": {p: ranges(n) for p, n in lines.items()}}, None


def _cut(ids, mask, sft):
    """A sample as the run cut it: truncated to --seq-length under --overlong truncate."""
    if sft.overlong == "truncate" and sft.seq_length:
        return ids[:sft.seq_length], None if mask is None else mask[:sft.seq_length]
    return ids, mask


def _as_read(record):
    """The record as the reference reads it: its line, or its row."""
    return record.raw if isinstance(record.raw, bytes) else record.value


def _kept_samples(manifest: Manifest, rejected: dict):
    """(file:line, record, our conversation of it, numbers (from 0) of its samples kept, the number
    of samples it made) of every record that made a sample kept, in order."""
    sft = manifest.sft
    for where, record, aside in _records(manifest, rejected, None):
        try:
            conversation = to_conversation(record.value, sft.format, input_separator=sft.input_separator)
        except ValueError as exc:
            raise ValueError(f"{where} made samples but cannot be read now: {exc}") from None
        made = len(conversation.assistant_indices) if sft.history == "split" else 1
        kept = [k for k in range(made) if k + 1 not in aside]
        if kept:
            yield where, record, conversation, kept, made


class _OurSamples:
    """What our own code makes of a record (`_stored_in_record_order` needs the lengths of a best-fit
    window's samples)."""

    def __init__(self, manifest: Manifest, directory: str) -> None:
        sft, self.manifest = manifest.sft, manifest
        used = [flag for flag in UNRECORDED if any(arg.split("=")[0] == flag for arg in manifest.command)]
        if used:
            raise ValueError(f"it was made with {used[0]}, which its manifest does not record: its records "
                             "cannot be read again as the run read them")
        self.tokenizer = QwenTokenizer.shared(TokenizerConfig(directory, manifest.tokenizer["flavour"],
                                                              manifest.tokenizer.get("backend", "gigatoken")))
        self.acted_on = self.tokenizer.acted_on(sft.special_tokens)
        self.template = get_template(sft.template if sft.template in TEMPLATE_NAMES else "auto", directory)

    def keeps_literals(self, conversation) -> bool:
        """Whether literals in it stay text (our renderer marks them, as the run did)."""
        return self.manifest.sft.special_tokens != "parse" and literals.find(conversation, self.acted_on) is not None

    def lengths(self, rejected: dict):
        """The length of every sample kept, record after record, as the run cut it."""
        sft = self.manifest.sft
        encoder = SampleEncoder(self.tokenizer, sft.assistant_span, sft.mask_policy)
        for where, _, conversation, kept, _ in _kept_samples(self.manifest, rejected):
            samples = literals.render(self.template, conversation,
                                      self.acted_on if self.keeps_literals(conversation) else None, sft.history,
                                      sft.enable_thinking)
            encoded = encoder.encode([samples[k] for k in kept])
            refused = next((e for e in encoded if isinstance(e, Exception)), None)
            if refused is not None:
                raise ValueError(f"{where}: our encoder now refuses a sample the run kept: {refused}")
            yield np.asarray([min(len(e[0]), sft.seq_length or len(e[0])) if sft.overlong == "truncate"
                              else len(e[0]) for e in encoded], np.int64)


def _stored_samples(prefix: str, manifest: Manifest):
    """(ids, loss mask) of every sample the prefix holds, row after row, its padding left out."""
    documents = layout_of(manifest).open(prefix)
    for d in range(len(documents)):
        tokens, trained, parts, _ = documents.layout.read_row(*documents.document(d), manifest.pad_id)
        for end, n in zip(np.cumsum(parts).tolist(), parts.tolist()):
            yield tokens[end - n:end], trained[end - n:end]


def _stored_in_record_order(prefix: str, manifest: Manifest, ours: _OurSamples, rejected: dict):
    """The prefix's samples in the order of the records that made them: a best-fit window's rows
    hold its samples in plan order (`RowGroups.order`), put back here."""
    stored, sft = _stored_samples(prefix, manifest), manifest.sft
    if not sft.packed or sft.packing != "best-fit":
        yield from stored
        return
    lengths, pending, more = ours.lengths(rejected), np.zeros(0, np.int64), True
    while more or len(pending):
        plan = next_window(pending, sft.packing, sft.seq_length, final=not more)
        if plan is None:
            step = next(lengths, None)
            more = step is not None
            pending = np.concatenate([pending, step]) if more else pending
            continue
        window = [None] * len(plan.order)
        for s in plan.order.tolist():
            window[s] = next(stored, None)
            if window[s] is None or len(window[s][0]) != pending[s]:
                raise ValueError("its packed rows are not the best-fit packing of the samples its records make "
                                 "today (our own encoder changed, or the rows were edited)")
        yield from window
        pending = pending[len(plan.order):]


def _records(manifest: Manifest, rejected: dict, columns: list[str] | None):
    """(file:line, record, numbers of its samples set aside) of every record not set aside whole, in
    order: of a shard's own records only, for a shard's prefix."""
    sources = expand([entry["path"] for entry in manifest.inputs])
    numbers = LineNumbers()
    shard = Shard.of_record(manifest.shard) if manifest.shard else None
    for chunk in read_chunks(sources, shard=shard, columns=columns):
        records = list(chunk.records())
        shift = numbers.shift(chunk.first, chunk.span is not None, chunk.lines)
        path = os.path.abspath(chunk.path)
        for record in records:
            where, aside = f"{chunk.path}:{record.number + shift}", rejected.get((path, record.number + shift), set())
            if aside is None:
                continue
            if record.error is not None:
                raise ValueError(f"{where} made data but cannot be read now")
            yield where, record, aside


def _inputs_unchanged(prefix: str, manifest: Manifest) -> list[str]:
    problems = []
    for recorded in manifest.inputs:
        path = recorded.get("path")
        if not path or not os.path.isfile(path):
            problems.append(f"{prefix}: --certify needs the inputs the prefix was made from: {path} is gone")
        elif pins_differ(recorded, now := input_entry(path)):
            problems.append(f"{prefix}: --certify needs the inputs as they were: {path} changed (then "
                            f"{describe_input(recorded)}, now {describe_input(now)})")
    return problems


def _rejected(prefix: str, manifest: Manifest, problems: list[str]) -> dict[tuple[str, int], set | None]:
    """(file, record number) of every record set aside → None (whole: it made no data), or the
    numbers (from 1) of its samples set aside."""
    if not manifest.rejects.get("count"):
        return {}
    path = prefix + ".rejects.jsonl"
    key = manifest.text_key
    if not os.path.isfile(path) and key and prefix.endswith("_" + key):
        path = prefix[:-len(key) - 1] + ".rejects.jsonl"  # a run of several --text-key keeps one file
    if not os.path.isfile(path):
        problems.append(f"{prefix}: --certify needs {path} (which records made no data), and it is gone")
        return {}
    rejected: dict[tuple[str, int], set | None] = {}
    with open(path, encoding="utf-8") as f:
        for entry in map(json.loads, f):
            key = (os.path.abspath(entry["file"]), entry["record"])
            if "sample" in entry and rejected.get(key, set()) is not None:
                rejected.setdefault(key, set()).add(entry["sample"])
            else:
                rejected[key] = None
    return rejected


def _record(prefix: str, counts: dict, found: str | None, libraries: tuple) -> dict:
    """The recheck, added to the manifest's certificate (written whole, atomically), under a lock
    and from the manifest read again inside it, so that concurrent rechecks lose none; where the
    prefix cannot be written (read-only storage), what would have been recorded is said instead."""
    recheck = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **counts, "mismatches": int(found is not None),
               "reference": versions(*libraries), **({"mismatch": found} if found else {})}
    try:
        with open(prefix + ".json.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            manifest = Manifest.read(prefix)
            manifest.certificate = dict(manifest.certificate or {})
            manifest.certificate.setdefault("rechecks", []).append(recheck)
            with atomic_file(prefix + ".json") as f:
                f.write(manifest.text())
    except OSError as exc:
        return {**recheck, "recorded": False, "why": f"{prefix}.json cannot be written ({exc.strerror or exc})"}
    return {**recheck, "recorded": True}
