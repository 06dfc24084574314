"""`qwen-data verify --certify N`: the first N records a pretraining prefix was made from, encoded
again by today's reference library (HF tokenizers, `text.reference`) and compared with the ids the
prefix holds for them, so an upgrade of the libraries is one command from being known safe.

Documents follow the inputs' records in order, less the records set aside (PREFIX.rejects.jsonl),
so the inputs must still be there and unchanged (their pins in the manifest). The outcome is added
to the manifest's certificate as a `recheck`; a recheck that found a mismatch makes `qwen-data
train` refuse the prefix until `--allow-uncertified`. SFT prefixes are not rechecked: their
documents are packed rows and windows of samples, which this does not map back to records yet.
"""

from __future__ import annotations

import json
import os
import time

import numpy as np

from ..formats.layouts import layout_of
from ..formats.manifest import Manifest, describe_input, input_entry, pins_differ
from ..formats.outputs import atomic_file
from ..inputs.readers import LineNumbers, expand, read_chunks
from ..text.reference import TextReference, difference, versions
from ..text.tokenizer import TokenizerNotFound, directory_of


def recheck(prefix: str, count: int) -> list[str]:
    """Problems found (none: the first `count` records equal the reference's ids); the outcome is
    recorded in PREFIX.json unless the records could not be read."""
    manifest = Manifest.read(prefix)
    if manifest.kind != "pretrain":
        return [f"{prefix}: --certify rechecks pretraining prefixes; an SFT prefix's rows do not map back to its "
                "records here yet (its certificate was taken while it was made)"]
    try:
        reference = TextReference(directory_of(manifest.tokenizer), manifest.tokenizer["flavour"],
                                  manifest.special_tokens or "text")
    except TokenizerNotFound as exc:
        return [f"{prefix}: {exc}"]
    problems = _inputs_unchanged(prefix, manifest)
    rejected = _rejected(prefix, manifest, problems)
    if problems:
        return problems
    documents = layout_of(manifest).open(prefix)
    checked, found = 0, None
    try:
        for where, number, text in _kept_records(manifest, rejected):
            if checked == count:
                break
            ours = documents.document(number)[0]
            theirs = reference.encode(text)[0] + [manifest.eod_id]
            checked += 1
            if not np.array_equal(ours, theirs):
                found = f"{where}: {difference(ours, theirs)}"
                break
    except ValueError as exc:
        return [f"{prefix}: --certify: {exc}"]
    _record(prefix, manifest, checked, found)
    return [f"{prefix}: certify: {found}"] if found else []


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


def _rejected(prefix: str, manifest: Manifest, problems: list[str]) -> set[tuple[str, int]]:
    """(file, record number) of every record set aside: their records made no document."""
    if not manifest.rejects.get("count"):
        return set()
    path = prefix + ".rejects.jsonl"
    if not os.path.isfile(path):
        problems.append(f"{prefix}: --certify needs {path} (which records made no document), and it is gone")
        return set()
    with open(path, encoding="utf-8") as f:
        return {(os.path.abspath(entry["file"]), entry["record"]) for entry in map(json.loads, f)}


def _kept_records(manifest: Manifest, rejected: set[tuple[str, int]]):
    """(file:line, document number, text) of every record that made a document, in order."""
    sources = expand([entry["path"] for entry in manifest.inputs])
    document, numbers = 0, LineNumbers()
    for chunk in read_chunks(sources, columns=[manifest.text_key]):
        records = list(chunk.records())
        shift = numbers.shift(chunk.first, chunk.span is not None, chunk.lines)
        path = os.path.abspath(chunk.path)
        for record in records:
            if (path, record.number + shift) in rejected:
                continue
            if record.error is not None or not isinstance((record.value or {}).get(manifest.text_key), str):
                raise ValueError(f"{chunk.path}:{record.number + shift} made a document but cannot be read now")
            yield f"{chunk.path}:{record.number + shift}", document, record.value[manifest.text_key]
            document += 1


def _record(prefix: str, manifest: Manifest, checked: int, found: str | None) -> None:
    """The recheck, added to the manifest's certificate (written whole, atomically)."""
    certificate = dict(manifest.certificate or {})
    certificate.setdefault("rechecks", []).append({
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "records_checked": checked, "mismatches": int(found is not None),
        "reference": versions("tokenizers"), **({"mismatch": found} if found else {})})
    manifest.certificate = certificate
    with atomic_file(prefix + ".json") as f:
        f.write(manifest.text())
