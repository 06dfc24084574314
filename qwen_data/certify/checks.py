"""What a run checks, and the certificate it writes: one checker per kind of data, built once per
run before the workers fork (`checks_for`), which the step's workers and the pipeline call.

  worker:   `spell_*` every document (or sample) it made (`spelling`), `picker` picks records (`sample`)
            and `item` hands over what it made of them;
  checking process (`run.certifier`): `load`, then `check` items against the reference libraries;
  main:     `read_back` the picked documents from the staged files before the commit, and
            `certificate` says what was checked, by what, and what it proves.

`certified` is true only when every document spelled its text, at least one record was checked
against the reference, and none differed.
"""

from __future__ import annotations

import base64
import json
import os
import pickle
import socket
from importlib import metadata
from multiprocessing.connection import Connection

import numpy as np

from ..formats.indexed import MaskedWriter, read_index, read_tokens
from .messages import NotMappable, RecordReading
from .reference import ChatReference, NotCertified, TextReference, difference, preload, reference_jinja, versions
from . import trimmed
from .sample import LONG_BYTES, Sampling, detection, numbers, ranges, window
from ..text.tokenizer import QwenTokenizer, TokenizerConfig
from .spelling import Speller, Spelling, normalized


class CertificateError(ValueError):
    """Our ids differ from the reference's (or from their text) for a record: the run stops."""


def checks_for(step, inputs: list[dict], estimates: list[int | None]):
    """The checker of a step (`steps.pretrain.Tokenize`, `steps.sft.ChatSamples`), prepared."""
    return _kind(step)(step, inputs, estimates)


def checkers(step, workers: int) -> int:
    """The checking processes a run of `workers` gets (`run.certifier`): each loads HF's tokenizer
    (~0.45 CPU s), so as few as keep up with the sample (a few thousand records) while the workers
    work; more only where a record costs more to check."""
    return max(1, workers // _kind(step).workers_per_checker)


def _kind(step):
    return ChatChecks if step.kind == "sft" else TextChecks


class _Checks:
    """What both kinds share: the sample, the checking process's side, the certificate."""

    libraries: tuple[str, ...]

    def __init__(self, step, inputs: list[dict], estimates: list[int | None]) -> None:
        self.tokenizer = step.tokenizer
        self.tokenizer_sha256, self.backend = step.tokenizer.sha256, step.tokenizer.config.backend
        self.tokenizer_config = step.tokenizer.config
        self.sampling = Sampling(inputs, estimates)
        self.uncertified: str | None = None

    def __getstate__(self) -> dict:
        # The checking process takes the reference's side only: the tokenizer and the spelling tables
        # are the workers' (forked, never pickled), and would cost megabytes through its pipe (whose
        # reader, still loading HF's tokenizer, held the run's start back ~0.15 s a process to read
        # them); a checking process that needs the table reads it from the cache itself (`spelling`).
        return {k: v for k, v in self.__dict__.items() if k not in ("tokenizer", "speller", "table")}

    @property
    def spelling(self):
        """The tokenizer's spelling table (`spelling.Spelling`): the workers', or, in a checking
        process, read from the tokenizer's cache (or made there) at its first use."""
        if getattr(self, "table", None) is None:
            self.table = Spelling.of(QwenTokenizer(self.tokenizer_config))
        return self.table

    def picker(self, path: str):
        """Whether a record of the file at `path` is picked (`sample.Sampling.picker`)."""
        return self.sampling.picker(path)

    def to_read_back(self, where: str, item: tuple, documents: int) -> list:
        """`read_back`'s entries for a picked record, its chunk's documents following `documents`."""
        return []

    def staged_files(self, prefixes: list[str]) -> list[tuple[str, str]]:
        """The (.bin, .idx) of each dataset `read_back` reads, by the final names the run writes."""
        return [(p + ".bin", p + ".idx") for p in prefixes]

    def certificate(self, counts: dict, records: int, fingerprint: str) -> dict:
        """What the run proved: `counts` summed over the run, and `records` it kept."""
        spelled, checked = counts.get("records_spelled", 0), counts.get("records_checked", 0)
        found = {"records_spelled": spelled, "records_checked": checked, "mismatches": 0,
                 **{k: v for k, v in counts.items() if k not in ("records_spelled", "records_checked", "lines")},
                 "records_kept": records, "sample": self.sampling.describe(), "detection": detection(checked, records),
                 "lines_checked": {path: ranges(lines) for path, lines in counts.get("lines", {}).items()},
                 "reference": versions(*self.libraries), "encoder": self._encoder(),
                 "tokenizer_sha256": self.tokenizer_sha256, "fingerprint": fingerprint, **self._own()}
        why = (self.uncertified or (f"{records - spelled:,} of {records:,} records were not spelled again"
                                    if spelled < records else None)
               or (None if checked else "no record was picked for the reference (a run of few records picks all; "
                                        "a shard may pick none: its merge can be certified)"))
        return {"certified": why is None, **({"why": why} if why else {}), **found}

    def _encoder(self) -> dict:
        backend = self.backend
        return {"qwen-data": metadata.version("qwen-data"), "backend": backend,
                backend: metadata.version("gigatoken" if backend == "gigatoken" else "tokenizers")}

    def _own(self) -> dict:
        return {}


# A run estimated to hold this many records or fewer checks each batch with HF's tokenizer cut down to
# its texts (`certify.trimmed`: a few ms where loading the whole takes ~0.4 s, more than such a run's work).
TRIM_RECORDS = 64


class TextChecks(_Checks):
    """Pretraining: each document's ids spell its text; picked records' ids (or a window of a long
    one's) equal HF tokenizers' on the same text, under the run's special-token policy."""

    libraries = ("tokenizers",)
    # HF encodes a window (~256 bytes) in ~0.3-0.5 ms: a sample's 1-2 CPU s, which one process checks while
    # 16 workers make 2 GB of text (a 16-core H200 host: 5.49-5.54 s against 5.66-5.68 s with two, whose
    # second tokenizer took the workers' cores; `bench/results/cpu/2026-11-30-pretrain-checkers.md`).
    workers_per_checker = 16

    def __init__(self, step, inputs, estimates) -> None:
        super().__init__(step, inputs, estimates)
        policy = step.config.special_tokens
        self.speller = Speller.shared(self.tokenizer, policy)
        self.reference = TextReference(self.tokenizer.directory, self.tokenizer.flavour, policy,
                                       trim=self.sampling.estimated <= TRIM_RECORDS)
        self.eod_id = step.eod_id

    def picked(self, keys: list[bytes], lines: bool = False) -> list[int]:
        """`picks` of a chunk's records at once, by their keys (`sample.record_key`; `lines`: their jsonl
        lines): their indices."""
        return self.sampling.picked(keys, lines)

    def item(self, number: int, position: int, documents: list[tuple[str, np.ndarray, str | None]]) -> tuple:
        """What the checking process takes of a picked record: per text key, the text checked
        (the whole text, or a window of a long one), our ids for it and where they lie in the
        document (`read_back`); eod included for a whole text."""
        return number, position, [checked_part(text, ours, self.sampling.seed, self.speller.table, as_encoded)
                                  for text, ours, as_encoded in documents]

    def to_read_back(self, where: str, item: tuple, documents: int) -> list:
        number, position, parts = item
        return [(where, k, documents + position, a, b, ours) for k, (_, ours, a, b) in enumerate(parts)]

    @staticmethod
    def item_json(item: tuple) -> list:
        """An item as a run's journal keeps it (`run.journal`), to be checked by the run that resumes."""
        number, position, parts = item
        # the ids as base64 of their int32 bytes: a JSON list of them cost a large run's main process ~0.5 s a GB
        return [number, position, [[text, base64.b64encode(np.ascontiguousarray(ours, dtype="<i4")).decode(), a, b]
                                   for text, ours, a, b in parts]]

    @staticmethod
    def item_from_json(value: list) -> tuple:
        number, position, parts = value
        return number, position, [(text, _ids_of(ours), a, b) for text, ours, a, b in parts]

    def load(self) -> None:
        self.reference.load()

    def check(self, items: list) -> tuple[dict, str | None]:
        parts = [(where, part) for where, (_, _, record) in items for part in record]
        encoded = self.reference.encode_batch([part[0] for _, part in parts])
        for (where, part), theirs in zip(parts, encoded):
            if found := compare_part(where, part, theirs, self.eod_id):
                return {}, found
        return {"records_checked": len(items), "lines": _lines(items)}, None


class ChatChecks(_Checks):
    """SFT: each sample's ids spell its rendered text and its mask is its structure's; picked
    records' samples equal the template's own Jinja rendered by jinja2 as transformers'
    apply_chat_template renders it, encoded by HF tokenizers."""

    libraries = ("jinja2", "tokenizers")
    # A record costs ~1 ms (its render, the window encoded): one process keeps up with 16 workers on 2 GB, and
    # where it falls behind at the end its helpers fork from it, sharing what it loaded. A second process loads
    # HF's tokenizer and the template again, on the workers' cores: on a 16-core host (2026-12-03c/checkers.jsonl)
    # one took medians of 5.90 s against 6.37 s (chats) and 6.78 s against 7.04 s (alpaca), and summed RSS
    # 3.6-3.8 GiB against up to 4.4 GiB.
    workers_per_checker = 16

    def __init__(self, step, inputs, estimates) -> None:
        super().__init__(step, inputs, estimates)
        config = self.config = step.config
        self.template = step.template
        self.speller = Speller.shared(self.tokenizer, "parse")
        self.table = self.speller.table  # (a checking process reads its own: `spelling`)
        self.structure = None if config.mask == "all" else {
            "span": config.assistant_span, "last_only": config.rendered_history != "rendered",
            "empty_think_is_prompt": config.enable_thinking is False}
        self.masked = 0  # records checked so far, in the checking process (MASKED)
        columns = config.columns
        # records --columns or --dataset-info read are checked from the record the column mapping made
        self.through_columns = columns is not None
        reading = RecordReading(columns.format if columns and columns.format else config.format,
                                config.input_separator, config.parse_tool_arguments)
        try:
            jinja = reference_jinja(self.template, self.tokenizer.directory, config.reference_template)
        except NotCertified as why:
            self.uncertified, self.reference = str(why), None
            return
        self.reference = ChatReference(self.tokenizer.directory, self.tokenizer.flavour, jinja,
                                       config.assistant_span, config.mask, config.enable_thinking, reading,
                                       config.rendered_history, config.special_tokens)

    def picker(self, path: str):
        return super().picker(path) if self.reference is not None else lambda record: False

    def to_read_back(self, where: str, item: tuple, documents: int) -> list:
        """A sample is one document, ids and mask, where the run writes them as they come (unpacked,
        or a shard's), one sequence of the packed rows (`documents`: the samples before its chunk's;
        the writer tells its sequence, `SFTWriter.placed`); Pai's rows store samples otherwise:
        `verify` checks their structure."""
        if self.config.lays_out_here and self.config.layout != "mask":
            return []
        named = (lambda k, n: f"{where} (sample {k + 1})" if n > 1 else where)
        _, count, samples = item[1]
        made = {k: (ids, mask) for k, ids, mask in samples}  # each written as a prefix of it (`_fit`)
        return [entry for k, index, kept in item[2] for entry in
                ((named(k, count), 0, documents + index, 0, kept, made[k][0][:kept]),
                 (named(k, count), 1, documents + index, 0, kept, made[k][1][:kept]))]

    @staticmethod
    def item_json(item: tuple) -> list | None:
        """An item as a run's journal keeps it (`run.journal`), to be checked by the run that resumes
        (which reads back no sample of it: the journal's hashes vouch for the reused bytes, so where
        its samples were written is not kept); None for a record JSON cannot give back as it is (a
        row holding dates or bytes): its chunk is then reused only once its answer is in the journal."""
        number, (source, count, samples), _ = item
        if isinstance(source, bytes):
            kept = {"line": base64.b64encode(source).decode()}
        else:
            try:
                if json.loads(json.dumps(source)) != source:
                    return None
            except (TypeError, ValueError):
                return None
            kept = {"value": source}
        return [number, kept, count, [[k, _array_json(ids), _array_json(mask)] for k, ids, mask in samples]]

    @staticmethod
    def item_from_json(value: list) -> tuple:
        number, kept, count, samples = value
        source = base64.b64decode(kept["line"]) if "line" in kept else kept["value"]
        return number, (source, count, [(k, _array_of(ids), _array_of(mask)) for k, ids, mask in samples]), []

    def staged_files(self, prefixes: list[str]) -> list[tuple[str, str]]:
        (prefix,) = prefixes
        ids_bin, ids_idx, mask_bin, mask_idx = MaskedWriter.files(prefix)
        return [(ids_bin, ids_idx), (mask_bin, mask_idx)]

    def load(self) -> None:
        self.reference.load()
        self.spelling  # noqa: B018 - read while the workers start

    def check(self, items: list) -> tuple[dict, str | None]:
        """Each picked record's samples (before truncation and packing) against the reference's,
        which it makes from the record itself (`ChatReference.record_samples`), literals under the
        run's policy; a record the reference cannot map is counted apart, never checked."""
        counts = dict.fromkeys(CHAT_COUNTS, 0)
        checked = []
        for where, (_, (source, count, samples), *_) in items:
            # masks by the reference's renders up to each turn for the first MASKED records only: the
            # structure check has every sample's mask; these renders are most of a record's cost
            self.masked += 1
            try:
                theirs = self.reference.record_samples(source, self.sampling.seed, self.masked <= MASKED)
            except NotMappable:
                counts["records_not_mappable"] += 1
                continue
            counts["records_checked"] += 1
            counts["records_through_columns"] += self.through_columns
            mismatch = compare_samples(where, count, samples, theirs, counts, table=self.spelling)
            if mismatch:
                return counts, mismatch
            checked.append((where, None))
        return {**counts, "lines": _lines(checked)}, None

    def _own(self) -> dict:
        return {"template_sha256": self.template.sha256, "mask_checked_by": self._mask_checked_by()}

    def _mask_checked_by(self) -> dict[str, str]:
        """What checked the loss mask: every sample in its worker; the picked ones by the reference."""
        every = ("every token trained (--mask all)" if self.structure is None else
                 "the mask the ChatML structure of its ids gives (certify.spelling.structure_mask), except samples "
                 "whose literals became control ids under --special-tokens parse")
        picked = (f"the reference's, for the first {MASKED} records checked (on the window of a long render): renders "
                  "of the record's messages up to each trained assistant turn, with and without the generation prompt "
                  "(never our masking code); the other picked samples, and those where a turn's render is not a "
                  "prefix of the whole (Qwen3 strips earlier reasoning), are masks_not_checked")
        return {"every_sample": every, "picked_samples": picked}


MASKED = 64  # records of a run whose masks the reference derives again (`ChatChecks.check`)
CHAT_COUNTS = ("records_checked", "samples_checked", "masks_not_checked", "records_not_mappable",
               "records_through_columns")


def compare_samples(where: str, count: int, samples: list, theirs: list, counts: dict, first: int = 0,
                    table=None) -> str | None:
    """The first difference between a record's samples, ours (`samples`: (k, ids, mask) of those of
    its `count` samples that were kept) and the reference's (`theirs`: (ids, mask or None, window or
    None) of every sample, `ChatReference.record_samples`), naming the record; None where they are
    equal. Masks are compared from token `first`. A sample the reference checked on a window (the
    text its whole render's ids spell, the window's first byte and end) is compared whole with what
    our ids spell (`table`: `spelling.Spelling`), and on the window as ids and mask."""
    if len(theirs) != count:
        return f"{where}: the reference makes {len(theirs)} samples of the record, ours {count}"
    for k, ours_ids, ours_mask in samples:
        ids, mask, cut = (*theirs[k], None)[:3]
        counts["samples_checked"] += 1
        counts["masks_not_checked"] += mask is None
        named = f"{where}: sample {k + 1} of {count}" if count > 1 else where
        if cut is not None:
            whole, start, stop = cut
            ours_ids = np.asarray(ours_ids)
            if not table.spells(whole, ours_ids):
                spelled, whole = table.spell(ours_ids), whole.encode("utf-8")
                at = next((i for i, (a, b) in enumerate(zip(spelled, whole)) if a != b), min(len(spelled), len(whole)))
                return (f"{named}: its ids spell other bytes than the template's render from byte {at:,}: "
                        f"{spelled[max(0, at - 20):at + 20]!r} where the render has {whole[max(0, at - 20):at + 20]!r}")
            starts = np.concatenate([[0], np.cumsum(table.lengths[ours_ids.astype(np.intp)])])
            a, b = (int(i) for i in np.searchsorted(starts, (start, stop)))
            if starts[a] != start or starts[b] != stop:
                return f"{named}: our ids cross the cut at byte {start if starts[a] != start else stop:,}, where HF's never do"
            ours_ids, ours_mask, first = ours_ids[a:b], ours_mask[a:b], max(0, first - a)
            named += f" (the window of its tokens {a:,}..{b:,})"
        if not np.array_equal(ours_ids, ids):
            return f"{named}: {difference(ours_ids, ids)}"
        if mask is not None and not np.array_equal(ours_mask[first:], mask[first:]):
            return f"{named}: {difference(ours_mask, mask, 'loss mask')}"
    return None


def checked_part(text: str, ours: np.ndarray, seed: int, table, as_encoded: str | bytes | None = None
                 ) -> tuple[str, np.ndarray, int, int]:
    """(text checked, our ids for it, where they lie in the document) of a document: the whole text
    (ids with the eod), or a window of a long one (`sample.window`), whose ids are found by the bytes
    each id spells (`table`: `spelling.Spelling`). `as_encoded`: the text as the tokenizer
    normalized it, where it did (not normalized again: a 58 MB record takes seconds)."""
    if len(text) <= LONG_BYTES // 4:  # short whatever its encoding: checked whole
        return text, np.array(ours), 0, len(ours)
    data = normalized(text).encode("utf-8") if as_encoded is None else \
        as_encoded if isinstance(as_encoded, bytes) else as_encoded.encode("utf-8")
    cut = window(data, seed)
    if cut is None:
        return text, np.array(ours), 0, len(ours)
    starts = np.concatenate([[0], np.cumsum(table.lengths[ours[:-1].astype(np.intp)])])
    a, b = (int(k) for k in np.searchsorted(starts, cut))
    if starts[a] != cut[0] or (b < len(starts) and starts[b] != cut[1]):
        # Our tokens cross a cut HF never crosses, or HF's tables normalized the text otherwise than
        # it was cut (`unicode_exact`): the whole text is checked, so the comparison says which.
        return text, np.array(ours), 0, len(ours)
    return data[cut[0]:cut[1]].decode("utf-8"), np.array(ours[a:b]), a, b


def compare_part(where: str, part: tuple, theirs: list[int], eod_id: int) -> str | None:
    """What differs between our ids of a checked part (`checked_part`) and the reference's."""
    _, ours, a, b = part
    whole = a == 0  # a window starts after a line's first byte, never at the document's start
    theirs = theirs + [eod_id] if whole else theirs
    if np.array_equal(ours, theirs):
        return None
    span = "" if whole else f" (the window of tokens {a:,}..{b:,})"
    return f"{where}{span}: {difference(ours, theirs)}"


def _ids_of(kept) -> np.ndarray:
    """Ids as a journal keeps them: base64 of int32 bytes, or a list (journals of qwen-data 0.4.0)."""
    if isinstance(kept, list):
        return np.asarray(kept, dtype=np.int32)
    return np.frombuffer(base64.b64decode(kept), dtype="<i4").astype(np.int32)


def _array_json(array: np.ndarray) -> list[str]:
    """An array as a journal keeps it: its dtype and base64 of its bytes."""
    array = np.ascontiguousarray(array)
    return [array.dtype.str, base64.b64encode(array).decode()]


def _array_of(kept: list[str]) -> np.ndarray:
    dtype, data = kept
    return np.frombuffer(base64.b64decode(data), dtype=np.dtype(dtype)).copy()


def _lines(items: list) -> dict[str, list[int]]:
    """The records of `items` ("file:line", ...), by file."""
    lines: dict[str, list[int]] = {}
    for where, _ in items:
        path, _, line = where.rpartition(":")
        lines.setdefault(path, []).append(int(line))
    return lines


def add_counts(counts: dict, checked: dict) -> None:
    """`checked` (a `check`'s counts) added to `counts`."""
    for name, value in checked.items():
        if name == "lines":
            for path, lines in value.items():
                counts.setdefault("lines", {}).setdefault(path, []).extend(lines)
        else:
            counts[name] = counts.get(name, 0) + value


def read_back(picked: list[tuple[str, int, int, int, int, np.ndarray]], files: list[tuple[str, str]]) -> None:
    """CertificateError unless each picked document's tokens, as the staged files hold them, are the
    ones its worker made: (where, dataset, document, first token, stop, ours) against `files`,
    each dataset's (.bin, .idx), read through the index as a reader would."""
    opened: dict[int, tuple] = {}
    try:
        for where, dataset, document, a, b, ours in picked:
            if dataset not in opened:
                index = read_index(files[dataset][1])
                opened[dataset] = (index, open(files[dataset][0], "rb"))
            index, f = opened[dataset]
            start = int(index.pointers[document]) // index.dtype.itemsize
            written = read_tokens(f, index.dtype, start + a, min(b, int(index.lengths[document])) - a)
            if not np.array_equal(written, ours):
                raise CertificateError(f"{where}: the written document differs from what was encoded: "
                                       f"{difference(written, ours)}")
    finally:
        for _, f in opened.values():
            f.close()


def join_certificates(parts: list[tuple[str, dict | None]], fingerprint: str) -> dict | None:
    """The certificate of parts merged into the data `fingerprint` names: every part's checks
    carried (`parts`), their counts summed; certified when every part spelled all its records, was
    checked by the same reference libraries, and at least one record was checked in all. ValueError
    naming a part whose certificate, or a recheck of it, records a mismatch: a merge never carries
    wrong data on under a clean certificate."""
    refuse_mismatches(parts)
    if all(part is None for _, part in parts):
        return None
    why = next((f"{prefix}: {part.get('why') if part else 'made before certificates were recorded'}"
                for prefix, part in parts if not _joinable(part)), None)
    counted = [part for _, part in parts if part]
    sums = {name: sum(part.get(name, 0) for part in counted) for name in counted[0]
            if isinstance(counted[0][name], int) and not isinstance(counted[0][name], bool)}
    lines: dict[str, list[int]] = {}
    for part in counted:
        for path, text in part.get("lines_checked", {}).items():
            lines.setdefault(path, []).extend(numbers(text))
    references = {json.dumps(part["reference"], sort_keys=True) for part in counted if part.get("records_checked")}
    if why is None and len(references) > 1:
        why = "the parts were checked by different versions of the reference libraries"
    if why is None and not sums.get("records_checked"):
        why = "no record of any part was picked for the reference"
    base = next((part for part in counted if part.get("records_checked")), counted[0])
    return {**base, "certified": why is None, **({"why": why} if why else {}), **sums,
            "lines_checked": {path: ranges(found) for path, found in lines.items()},
            "detection": detection(sums.get("records_checked", 0), sums.get("records_kept", 0)),
            "fingerprint": fingerprint,
            "parts": [{"prefix": prefix, **{k: (part or {}).get(k) for k in ("certified", "records_checked",
                                                                              "records_spelled", "fingerprint")},
                       "rechecks": len((part or {}).get("rechecks", []))} for prefix, part in parts]}


def refuse_mismatches(parts: list[tuple[str, dict | None]]) -> None:
    """ValueError naming the first of `parts` (prefix, certificate) whose certificate, or a recheck of it,
    records a mismatch."""
    for prefix, part in parts:
        for found in [part or {}] + list((part or {}).get("rechecks", [])):
            if found.get("mismatches"):
                raise ValueError(f"{prefix}: its certificate records ids that differ from the reference's "
                                 f"({found.get('mismatch', 'a mismatch')}): make that part again")


def _joinable(part: dict | None) -> bool:
    """Whether a part's certificate can join a certified merge: certified, or not only because
    none of its records was picked (a shard of few records)."""
    if not part or "records_spelled" not in part or "sample" not in part:
        return False
    return part.get("certified") or (part.get("records_checked") == 0 and part["why"].startswith("no record"))


_CHECKS = None  # the checking process's checker, once sent
_HELPERS: list = []  # its connections to the processes it forked once the run's workers were done ("helpers")
READY = "ready"  # the answer to "checks": loaded, checking from now on


def check_in_side(item) -> tuple[dict, str | None] | None:
    """In the checking process: derive the spelling table where the cache lacks it, load HF's tokenizer
    (or, `whole` false, the tables it is cut down from), take the checker (and load the rest of its
    reference), then check (items, or a chunk's items as its worker pickled them, `Certifier.add`).
    ("helpers", n), sent once the run's workers are done and this process is behind: n processes forked
    from it, sharing what it loaded, check a part of each batch after it beside it (on the cores the
    workers left)."""
    global _CHECKS
    if isinstance(item, tuple) and item[0] == "load":
        _, path, whole = item
        # On a fresh machine the run's main process would derive the spelling table itself, before its
        # workers start (~0.15 s); derived here first, while it derives its other tables, it is cached.
        try:
            Spelling.of(QwenTokenizer(TokenizerConfig(name=os.path.dirname(path))))
        except Exception:  # (a file the main process refuses: it says why, deriving the table itself)
            pass
        if whole:
            preload(path)
        else:  # a pretrain run's checks load the rest where they need it (`TextChecks.load`)
            trimmed.tables(path)
        return None
    if isinstance(item, tuple) and item[0] == "checks":
        _CHECKS = item[1]
        _CHECKS.load()
        return READY
    if isinstance(item, tuple) and item[0] == "helpers":
        _HELPERS.extend(_fork_helper() for _ in range(item[1]))
        return None
    if isinstance(item, tuple) and item[0] == "picked":  # a chunk's items as its worker pickled them
        _, path, shift, pickled = item
        item = [(f"{path}{value[0] + shift}", value) for value in pickle.loads(pickled)]
    return _check_beside_helpers(item) if _HELPERS else _CHECKS.check(item)


def _check_beside_helpers(items: list) -> tuple[dict, str | None]:
    """`items` cut in order into a part for this process and one for each helper, checked at once; the
    counts summed, and the first mismatch in the items' order."""
    parts = [items[k * len(items) // (len(_HELPERS) + 1):(k + 1) * len(items) // (len(_HELPERS) + 1)]
             for k in range(len(_HELPERS) + 1)]
    for helper, part in zip(_HELPERS, parts[1:]):
        helper.send_bytes(pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL))
    answers = [_CHECKS.check(parts[0])] + [pickle.loads(helper.recv_bytes()) for helper in _HELPERS]
    counts: dict = {}
    for checked, mismatch in answers:
        add_counts(counts, checked)
        if mismatch:
            return counts, mismatch
    return counts, None


def _fork_helper():
    """A process forked from this checking process that checks the parts it is sent until this one
    ends (its end of the socket closes). Its masks are not derived again (`ChatChecks.masked`): the
    records whose masks the reference derives stay this process's first MASKED."""
    ours, theirs = socket.socketpair()
    if os.fork():
        theirs.close()
        return Connection(ours.detach())
    ours.close()
    for other in _HELPERS:  # the earlier helpers' sockets: each ends once this process's end of it closes
        other.close()
    status = 0
    try:
        conn = Connection(theirs.detach())
        if hasattr(_CHECKS, "masked"):
            _CHECKS.masked = max(_CHECKS.masked, MASKED)
        while True:
            try:
                part = pickle.loads(conn.recv_bytes())
            except (EOFError, OSError):  # it ended (or was ended: the run failed)
                break
            conn.send_bytes(pickle.dumps(_CHECKS.check(part), protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException:
        import traceback

        traceback.print_exc()
        status = 1
    finally:
        os._exit(status)  # never back into the checking process's loop it was forked from
