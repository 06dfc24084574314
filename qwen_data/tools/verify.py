"""`qwen-data verify PREFIX…`: re-read a prefix as a reader would and prove it is what its manifest says.

Checked, for `PREFIX.bin/.idx` (and SFT's `PREFIX.lossmask.bin/.idx`):
  - the manifest is there and names a kind, dtype, vocabulary size, eod/pad ids, counts, fingerprint;
  - nothing the train stage refuses in any prefix (`manifest.train_problems`: a pad id equal to the eod id);
  - each index is well formed (header, dtype code, size), is the manifest's dtype, its pointers are the
    running byte offsets of its lengths, its document indices run monotonically from 0 to the sequence
    count, and its counts (documents, sequences, tokens) and the .bin size are the manifest's;
  - the loss-mask channel has the ids' index (same lengths and documents), and holds only 0 and 1;
  - every id is below the vocabulary size (SFT: or the pad id), and pad positions are never trained;
  - pretrain: one sequence per document, each ending with the manifest's eod id;
  - SFT unpacked: one sample per document, no pad id at all, none over --seq-length;
    SFT packed: every document is a row of exactly seq_length tokens, its samples then at most one
    pad-only sequence, and pad ids nowhere else;
  - SFT in the pai layout (`qwen_data.formats.pai`, no loss-mask channel): every document is one sequence of
    2 x seq_length values; its ids are vocabulary ids with each sample's last one stored as -1 - id,
    then only pad ids; at least one sample per row (exactly one unpacked); every label is -100 or the
    next id of the same sample, -100 at a sample's last position and on padding; every sample trains
    at least one label;
  - the fingerprint recomputed from the files is the manifest's, and so are the SFT statistics;
  - a shard (`--shard K/N`, waiting for `merge`): every input it read that is still there is the file
    its manifest pinned (size, mtime, content of its ends): shards made from another version would
    repeat or lose records, and `merge` refuses them.

What each layout promises is checked by its type (`formats.layouts`); this module reads the files,
streams them and reports. The .bin files are streamed in blocks and the index arrays read in chunks from memmaps, so memory
stays flat whatever the size. Problems are plain sentences naming the file; none means the prefix is ok.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext

import numpy as np

from ..formats.digest import bin_hash
from ..formats.digest import file_digest, sha256_of
from ..formats.indexed import IndexFormatError, check_same_index, fill, read_index
from ..formats.layouts import Block, check_offsets
from ..formats.layouts import index_tokens as _tokens
from ..formats.layouts import layout_of
from ..formats.manifest import Manifest, describe_input, fingerprint_problem, input_entry, load, pins_differ
from ..formats.manifest import problems as manifest_problems
from ..formats.manifest import train_problems
from ..formats.pai import IGNORE

BLOCK_BYTES = 1 << 24  # .bin bytes read at a time
SHOWN = 5  # offending positions named in one problem


def verify(prefix: str) -> list[str]:
    """The problems of `prefix` as sentences; an empty list means it is ok."""
    where = f"{prefix}.json"
    try:
        data = load(prefix)
    except FileNotFoundError as exc:
        return [str(exc)]
    except (OSError, ValueError) as exc:  # unreadable file, bad JSON
        message = str(exc)
        return [message if message.startswith(prefix) else f"{where}: unreadable manifest: {message}"]
    problems = manifest_problems(data, where)
    if problems:
        return problems
    manifest = Manifest.from_json(data, where)
    problems += train_problems(prefix, manifest.kind, manifest.eod_id, manifest.pad_id)
    layout = layout_of(manifest)
    indexes = []
    for name, dtype in layout.channels(prefix, manifest.dtype):
        index = _open_channel(name, dtype, manifest, problems)
        if index is None:
            return problems
        indexes.append(index)
    # `sound`: the indexes and .bin sizes agree, so the data can be read by document and row.
    sound = all([check_offsets(index, problems) for index in indexes])
    sound = sound and _check_sizes(prefix, indexes, manifest, problems)
    if sound and len(indexes) == 2:
        sound = _same_index(indexes[0], indexes[1], problems)
    sound = sound and layout.check_index(indexes[0], problems)
    # The .bin files hashed by ranges in threads (joinable hashes) while the layout reads them once more
    # (from the page cache); a manifest before 0.4 has them hashed by sha256 in that one pass.
    joinable = manifest.digests is not None
    with ThreadPoolExecutor(1) as pool:
        hashed = [pool.submit(file_digest, index.path[:-4] + ".bin") for index in indexes] if joinable else []
        stats = _stream(indexes, manifest, layout, sound, problems, hashed=not joinable)
        if joinable:
            stats.bin_digests = [h.result() for h in hashed]
    _check_fingerprint(prefix, indexes, stats, manifest, problems)
    if sound:
        _check_sft_stats(prefix, layout.expected(indexes[0], stats), manifest, problems)
    if manifest.shard:
        _check_inputs(prefix, manifest, problems)
    return problems


# ---------------------------------------------------------------------------------------------
# The indexes


def _open_channel(name: str, dtype: np.dtype, manifest: Manifest, problems: list[str]):
    """The channel's index if its files are there and it reads; counts checked against the manifest."""
    missing = [name + s for s in (".bin", ".idx") if not os.path.isfile(name + s)]
    if missing:
        problems.extend(f"{path}: missing" for path in missing)
        return None
    try:
        index = read_index(name + ".idx")
    except (IndexFormatError, OSError) as exc:
        problems.append(str(exc))
        return None
    if index.dtype != dtype:
        problems.append(f"{index.path}: dtype {index.dtype.name}, expected {dtype.name}")
        return None
    for unit, count, recorded in (("documents", index.documents, manifest.documents),
                                  ("sequences", index.sequences, manifest.sequences)):
        if count != recorded:
            problems.append(f"{index.path}: {count} {unit}, the manifest {recorded}")
    return index


def _same_index(ids, mask, problems: list[str]) -> bool:
    try:
        check_same_index(ids, mask)
    except IndexFormatError as exc:
        problems.append(str(exc))
        return False
    return True


def _check_sizes(prefix: str, indexes, manifest: Manifest, problems: list[str]) -> bool:
    ok = True
    for index in indexes:
        bin_path = index.path[: -len(".idx")] + ".bin"
        tokens, size = _tokens(index), os.path.getsize(bin_path)
        if size != tokens * index.dtype.itemsize:
            problems.append(f"{bin_path}: {size} bytes, but {index.path} describes {tokens} tokens of "
                            f"{index.dtype.itemsize} bytes ({tokens * index.dtype.itemsize} bytes): truncated or extended")
            ok = False
    tokens = _tokens(indexes[0])
    if tokens != manifest.tokens:
        problems.append(f"{prefix}.json: {manifest.tokens} tokens, but {indexes[0].path} describes {tokens}")
    return ok


# ---------------------------------------------------------------------------------------------
# The data, streamed


class _Stats:
    def __init__(self) -> None:
        self.bin_digests: list = []
        self.trained = 0
        self.pad_tokens = 0
        self.pad_sequences = 0
        self.samples = 0  # pai layout: counted from the rows' end marks
        self.sample_tokens = 0
        self.document_ends = None  # pretraining: each document's end, handed out block by block


def _stream(indexes, manifest: Manifest, layout, sound: bool, problems: list[str], hashed: bool) -> _Stats:
    """Have the layout check every value of the .bin files, block by block (whole rows when its rows
    have one size), `hashed`: hashing them by sha256 too. Layout checks that locate rows need `sound`
    indexes."""
    ids_index = indexes[0]
    ids_path = ids_index.path[: -len(".idx")] + ".bin"
    mask_path = indexes[1].path[: -len(".idx")] + ".bin" if len(indexes) == 2 else None
    block = max(BLOCK_BYTES // ids_index.dtype.itemsize, 1)
    if layout.row_values:
        block = max(block // layout.row_values, 1) * layout.row_values
    ids_buf = np.empty(block, ids_index.dtype)
    mask_buf = np.empty(block, np.uint8)
    found = _Found()
    stats = _Stats()
    hashes = [bin_hash(joinable=False) for _ in range(2)]
    position = 0  # tokens before this block
    with open(ids_path, "rb") as ids_f, (open(mask_path, "rb") if mask_path else nullcontext()) as mask_f:
        while True:
            got = fill(ids_f, memoryview(ids_buf).cast("B"))
            got_mask = fill(mask_f, memoryview(mask_buf)) if mask_path else 0
            if not got and not got_mask:
                break
            if hashed:
                hashes[0].update(memoryview(ids_buf).cast("B")[:got])
                hashes[1].update(memoryview(mask_buf)[:got_mask])
            ids = ids_buf[: got // ids_buf.itemsize]
            layout.check_block(Block(ids, mask_buf[:got_mask], position, ids_index, sound, manifest), found, stats)
            position += len(ids)
    stats.bin_digests = [h.hexdigest() for h in hashes]
    _report(found, ids_path, mask_path, manifest, layout, problems)
    return stats


def _report(found: "_Found", ids_path: str, mask_path: str | None, manifest: Manifest, layout,
            problems: list[str]) -> None:
    vocab, eod, pad = manifest.vocab_size, manifest.eod_id, manifest.pad_id
    names = {"vocab": (ids_path, f"ids outside the vocabulary (0..{vocab - 1})"
                       + (f" other than the pad id {pad}" if layout.pads else ""), "token", "id"),
             "eod": (ids_path, f"documents not ending with the eod id {eod}", "document", "last id"),
             "unpacked-pad": (ids_path, f"pad ids {pad} in unpacked data (its samples are stored unpadded)",
                              "token", "id"),
             "mask-value": (mask_path, "loss-mask values other than 0 and 1", "token", "value"),
             "pad-trained": (mask_path, f"pad positions (id {pad}) trained (mask 1)", "token", "id"),
             "row-pad": (ids_path, "packed rows with pad ids outside one trailing pad-only sequence", "row", "pad ids"),
             "row-empty": (ids_path, "packed rows with no sample, only pad", "row", "pad ids"),
             "pai-id": (ids_path, f"pai rows with ids outside the vocabulary (0..{vocab - 1}) or the pad id {pad} "
                                  "inside a sample", "row", "id"),
             "pai-pad": (ids_path, f"pai rows whose ids after the last sample are not all the pad id {pad}",
                         "row", "id"),
             "pai-empty": (ids_path, "pai rows with no sample (no id stored as -1 - id)", "row", "samples"),
             "pai-samples": (ids_path, "unpacked pai rows holding more than one sample", "row", "samples"),
             "pai-label": (ids_path, f"pai rows with a label neither {IGNORE} nor the next id of the same sample",
                           "row", "label"),
             "pai-untrained": (ids_path, f"pai rows with a sample whose every label is {IGNORE}", "row", "samples")}
    for key, (path, what, unit, value) in names.items():
        problems.extend(found.sentences(key, path, what, unit, value))


class _Found:
    """Offences by kind: a count and the first few (position, value)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.shown: dict[str, list] = {}

    def add(self, key: str, where, values) -> None:
        if len(where):
            self.counts[key] = self.counts.get(key, 0) + len(where)
            shown = self.shown.setdefault(key, [])
            shown.extend(zip(np.asarray(where[: SHOWN - len(shown)]).tolist(),
                             np.asarray(values[: SHOWN - len(shown)]).tolist()))

    def sentences(self, key: str, path: str, what: str, unit: str, value: str) -> list[str]:
        if key not in self.counts:
            return []
        listed = ", ".join(f"{unit} {w} ({value} {v})" for w, v in self.shown[key])
        more = ", …" if self.counts[key] > len(self.shown[key]) else ""
        return [f"{path}: {what}, {self.counts[key]} in all: {listed}{more}"]


# ---------------------------------------------------------------------------------------------
# Against the manifest


def _check_fingerprint(prefix: str, indexes, stats: _Stats, manifest: Manifest, problems: list[str]) -> None:
    digests = [(sha256_of(index.path), bin_digest) for index, bin_digest in zip(indexes, stats.bin_digests)]
    problem = fingerprint_problem(prefix, manifest, digests, [index.path[:-4] for index in indexes])
    if problem:
        problems.append(problem)


def _check_sft_stats(prefix: str, expected: dict, manifest: Manifest, problems: list[str]) -> None:
    for key, value in expected.items():
        recorded = getattr(manifest.sft, key)
        if recorded is not None and recorded != value:
            problems.append(f"{prefix}.json: sft.{key} is {recorded!r}, the data holds {value}")


def _check_inputs(prefix: str, manifest: Manifest, problems: list[str]) -> None:
    """A shard's inputs are still the files it read. One no longer here (or never here: another node
    of a cluster) is not compared."""
    for recorded in manifest.inputs:
        path = recorded.get("path")
        if not isinstance(path, str) or not os.path.isfile(path):
            continue
        now = input_entry(path)
        if pins_differ(recorded, now):
            problems.append(f"{prefix}.json: input {path} changed since this shard read it (then "
                            f"{describe_input(recorded)}, now {describe_input(now)}): merged with shards made "
                            "from it now, records would be repeated or lost; make the shard again")
