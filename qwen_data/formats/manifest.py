"""PREFIX.json, the manifest: what a qwen-data dataset is and how it was made.

It is written last, so a prefix that has one is complete (see `outputs.AtomicOutputs`). `blend`,
`verify` and the train stage read datasets through it: the tokenizer, the eod and pad ids, the
dtype, the counts the index must agree with, and the fingerprint of the data's bytes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import sys
import time
from dataclasses import dataclass, field

from .. import __version__
from .digest import DESCRIPTION
from .indexed import DTYPE_CODES, MASK_SUFFIX, token_dtype

FORMAT = "qwen-data/1"
KINDS = ("pretrain", "sft")
# SFT layouts (sft.layout): "mask", ids + a loss-mask dataset beside them; "pai", Pai-Megatron-Patch's
# rows of ids then labels. `layouts` says what each is.
LAYOUTS = ("mask", "pai")


class ManifestError(ValueError):
    pass


def strip_suffix(path: str) -> str:
    """Accept a data file's name for its prefix (`out/web.bin` → `out/web`)."""
    for suffix in (MASK_SUFFIX + ".bin", MASK_SUFFIX + ".idx", ".bin", ".idx", ".json"):
        if path.endswith(suffix):
            return path[: -len(suffix)]
    return path


SAME = {"merge": "same"}  # a setting: equal in every part of a merge
SUM = {"merge": "sum"}  # a count: a merge adds the parts'
OPTIONAL = {"optional": True}  # left out of the file when unset


@dataclass(kw_only=True)
class SFTSection:
    """How SFT data was made and what it holds (the manifest's "sft" object)."""

    template: str | None = field(default=None, metadata=SAME)
    template_sha256: str | None = field(default=None, metadata=SAME)
    format: str | None = field(default=None, metadata=SAME)
    input_separator: str | None = field(default=None, metadata=SAME)
    mask_policy: str | None = field(default=None, metadata=SAME)
    assistant_span: str | None = field(default=None, metadata=SAME)
    history: str | None = field(default=None, metadata=SAME)
    enable_thinking: bool | None = field(default=None, metadata=SAME)
    special_tokens: str | None = field(default=None, metadata=SAME)
    special_token_records: int = field(default=0, metadata=SUM)
    seq_length: int | None = field(default=None, metadata=SAME)
    overlong: str | None = field(default=None, metadata=SAME)
    samples: int = field(default=0, metadata=SUM)
    sample_tokens: int = field(default=0, metadata=SUM)
    truncated: int = field(default=0, metadata=SUM)
    layout: str = field(default="mask", metadata=SAME)  # one of LAYOUTS (absent before layouts were named)
    packed: bool = field(default=False, metadata=SAME)
    trained_tokens: int = field(default=0, metadata=SUM)
    pad_tokens: int | None = field(default=None, metadata=OPTIONAL)
    packing: str | None = field(default=None, metadata=SAME | OPTIONAL)
    rows: int | None = field(default=None, metadata=OPTIONAL)
    fill: float | None = field(default=None, metadata=OPTIONAL)
    # What a shard leaves for `merge` to do: pack, lay out.
    pack_on_merge: bool | None = field(default=None, metadata=SAME | OPTIONAL)
    layout_on_merge: str | None = field(default=None, metadata=SAME | OPTIONAL)

    def replace(self, **changes) -> "SFTSection":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if not (f.metadata.get("optional") and getattr(self, f.name) is None)}

    @classmethod
    def from_json(cls, data: dict) -> "SFTSection":
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})  # later versions may add fields


def merge_fields(section_type, how: str) -> list[str]:
    """The fields of a manifest type (`Manifest`, `SFTSection`) a merge treats as `how` ("same", "sum")."""
    return [f.name for f in dataclasses.fields(section_type) if f.metadata.get("merge") == how]


@dataclass(kw_only=True)
class Manifest:
    kind: str = field(metadata=SAME)  # one of KINDS
    tokenizer: dict = field(metadata=SAME)  # QwenTokenizer.identity(): path, sha256, vocab_size, flavour ...
    eod_id: int = field(metadata=SAME)
    eod_token: str | None = field(default=None, metadata=SAME)  # pretrain: the token every document ends with
    pad_id: int = field(metadata=SAME)  # never data: SFT pads with it; recorded for pretrain so trainers never pad with eod
    text_key: str | None = field(default=None, metadata=SAME)  # pretrain
    special_tokens: str | None = field(default=None, metadata=SAME)  # pretrain: the policy for literal special tokens
    special_token_records: int | None = None  # pretrain: records that held such literals
    dtype: str = field(metadata=SAME)
    documents: int
    sequences: int
    tokens: int
    fingerprint: str  # see `fingerprint`
    # Each channel's (.idx, .bin) content hashes the fingerprint is made of (`formats.digest`): what a
    # merge joins without reading the parts' .bin. Absent before qwen-data 0.4, whose .bin hashes were
    # sha256 (they still verify).
    digests: list | None = None
    fingerprint_scheme: str | None = None  # `digest.DESCRIPTION`, where `digests` is given
    sft: SFTSection | None = None  # SFT: template, mask policy, packing and sample counts
    shard: dict | None = None  # {"index", "count"}: one part of a sharded run, to be joined by `merge`
    inputs: list[dict] = field(default_factory=list)  # `input_entry` of each input read, in order
    # The parity check of a sample of records against the reference libraries (`text.reference`):
    # {"certified": true, "records_checked", "mismatches", "reference" (versions), hashes ...} or
    # {"certified": false, "why"}; absent from manifests written before it.
    certificate: dict | None = None
    rejects: dict = field(default_factory=dict)
    wall_seconds: float = 0.0
    format: str = FORMAT
    qwen_data_version: str = __version__
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%dT%H:%M:%S%z"))

    @property
    def vocab_size(self) -> int:
        return self.tokenizer["vocab_size"]

    def to_json(self) -> dict:
        """The file's object: how it was made first, then what it is; absent parts left out."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        fields["sft"] = self.sft.to_json() if self.sft else None
        head = {name: fields.pop(name) for name in ("format", "kind", "qwen_data_version", "command", "created")}
        return head | {name: value for name, value in fields.items() if value is not None}

    def text(self) -> str:
        return json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n"

    def write(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(self.text())

    @classmethod
    def from_json(cls, data, where: str) -> "Manifest":
        found = problems(data, where)
        if found:
            raise ManifestError("; ".join(found))
        names = {f.name for f in dataclasses.fields(cls)}
        fields = {k: v for k, v in data.items() if k in names}  # later versions may add fields
        if fields.get("sft") is not None:
            fields["sft"] = SFTSection.from_json(fields["sft"])
        return cls(**fields)

    @classmethod
    def read(cls, prefix: str) -> "Manifest":
        return cls.from_json(load(prefix), f"{prefix}.json")


def load(prefix: str) -> dict:
    """PREFIX.json as JSON, unchecked (`verify` reports its problems one by one)."""
    path = prefix + ".json"
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{prefix}: no manifest {path} (not a qwen-data output, or an unfinished run)")
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except ValueError as exc:
            raise ManifestError(f"{path}: unreadable manifest: {exc}") from None


def problems(data, where: str) -> list[str]:
    """What is missing or wrong in a manifest's JSON, as sentences naming `where`."""
    if not isinstance(data, dict):
        return [f"{where}: unreadable manifest: not a JSON object"]
    if data.get("format") != FORMAT:
        return [f"{where}: not a {FORMAT} manifest"]
    found = []
    kind, dtype = data.get("kind"), data.get("dtype")
    tokenizer = data.get("tokenizer") if isinstance(data.get("tokenizer"), dict) else {}
    vocab_size = tokenizer.get("vocab_size")
    if kind not in KINDS:
        found.append(f"{where}: kind {kind!r} is neither 'pretrain' nor 'sft'")
    if dtype not in {dt.name for dt in DTYPE_CODES}:
        found.append(f"{where}: dtype {dtype!r} is not a Megatron dtype")
    for label, value in (("tokenizer.vocab_size", vocab_size), ("eod_id", data.get("eod_id")),
                         ("pad_id", data.get("pad_id"))):
        if not _is_count(value):
            found.append(f"{where}: {label} is {value!r}, not a non-negative integer")
    for name in ("documents", "sequences", "tokens"):
        if not _is_count(data.get(name)):
            found.append(f"{where}: {name} is {data.get(name)!r}, not a count")
    if not isinstance(data.get("fingerprint"), str):
        found.append(f"{where}: no fingerprint")
    if kind == "sft":
        found += _sft_problems(data.get("sft"), where)
    if found:
        return found
    if kind == "sft" and data["sft"].get("layout", "mask") == "pai":
        if dtype != "int32":
            found.append(f"{where}: dtype {dtype} in the pai layout, which is int32 (it stores negative values)")
    elif dtype != token_dtype(vocab_size).name:
        found.append(f"{where}: dtype {dtype} is not the one Megatron uses for a vocabulary of "
                     f"{vocab_size} ids ({token_dtype(vocab_size).name})")
    if data["eod_id"] >= vocab_size:
        found.append(f"{where}: eod id {data['eod_id']} is outside the vocabulary ({vocab_size} ids)")
    return found


def train_problems(prefix: str, kind: str, eod_id: int, pad_id: int) -> list[str]:
    """What makes any prefix untrainable (the train stage refuses it, whatever the run), as sentences
    naming the option that makes it otherwise: checked when a prefix is made, by `verify`, and by
    every reader of blend sources."""
    if pad_id == eod_id:
        option = "--eod-token" if kind == "pretrain" else "--pad-id or --pad-token"
        return [f"{prefix}: pad id equals the eod id {eod_id}: readers mask every pad id, so every real end "
                f"of document would be masked; make it with another {option}"]
    return []


def _sft_problems(sft, where: str) -> list[str]:
    if not isinstance(sft, dict):
        return [f"{where}: an SFT manifest without its sft section"]
    packed, seq_length = sft.get("packed", False), sft.get("seq_length")
    if not isinstance(packed, bool):
        return [f"{where}: sft.packed is {packed!r}, not true or false"]
    if seq_length is not None and (not _is_count(seq_length) or seq_length < 1):
        return [f"{where}: sft.seq_length is {seq_length!r}, not a length"]
    if packed and seq_length is None:
        return [f"{where}: packed SFT data without sft.seq_length"]
    layout = sft.get("layout", "mask")
    if layout not in LAYOUTS:
        return [f"{where}: sft.layout is {layout!r}, not one of {', '.join(LAYOUTS)}"]
    if layout == "pai" and seq_length is None:
        return [f"{where}: pai-layout data without sft.seq_length"]
    return []


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def fingerprinted(channels: list[tuple[str, str]]) -> dict:
    """A manifest's fields vouching for its data: the fingerprint, the hashes it is made of, their scheme."""
    return dict(fingerprint=fingerprint(channels), digests=[list(c) for c in channels], fingerprint_scheme=DESCRIPTION)


def fingerprint(channels: list[tuple[str, str]]) -> str:
    """Changes whenever the data does: a hash of each channel's (.idx, .bin) content hashes, in order.

    The pipelines pass `IndexedDatasetWriter.digests` (hashed while writing); `verify` recomputes
    them by streaming the files.
    """
    digest = hashlib.sha256()
    for idx_digest, bin_digest in channels:
        digest.update(f"{idx_digest} {bin_digest}\n".encode())
    return digest.hexdigest()


def fingerprint_problem(prefix: str, manifest: Manifest, digests: list[tuple[str, str]],
                        channels: list[str]) -> str | None:
    """The sentence saying that the files of `channels` (NAME of NAME.bin/.idx), whose content hashes
    are `digests`, are not the data the manifest's fingerprint names; None when they are."""
    recomputed = fingerprint(digests)
    recorded = [tuple(c) for c in manifest.digests] if manifest.digests is not None else None
    if recomputed == manifest.fingerprint and recorded in (None, digests):
        return None
    if recorded is not None and recomputed == fingerprint(recorded) != manifest.fingerprint:
        return f"{prefix}.json: fingerprint {manifest.fingerprint[:16]}… is not the one its own digests make: the manifest was edited"
    if recorded is not None and len(recorded) == len(digests):
        changed = [f"{name}{ext}" for name, ours, theirs in zip(channels, digests, recorded)
                   for ext, a, b in ((".idx", ours[0], theirs[0]), (".bin", ours[1], theirs[1])) if a != b]
        if changed:
            return (f"{prefix}.json: fingerprint {manifest.fingerprint[:16]}… is not the data's: {', '.join(changed)} "
                    f"no longer hash{'es' if len(changed) == 1 else ''} to the digests it is made of: changed after the manifest was "
                    "written")
    files = ", ".join(f"{name}.bin/.idx" for name in channels)
    return (f"{prefix}.json: fingerprint {manifest.fingerprint[:16]}… is not the data's "
            f"{recomputed[:16]}…: {files} changed after the manifest was written, or the manifest was edited"
            + (" (or it was written by qwen-data < 0.2, whose fingerprints did not cover the .bin "
               "contents: rewrite it)" if _version(manifest) < (0, 2) else ""))


def _version(manifest: Manifest) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in str(manifest.qwen_data_version).split(".")[:2])
    except ValueError:
        return (0,)


# Inputs are pinned: the manifest records what each input file was when the run began to read it, so
# that shards read from another version of a file are refused by `merge` (and shown by `verify`).
# The content pin hashes the size and the first and last PIN_BYTES: cheap for any size, it sees
# a file rewritten at the same size and mtime only where its ends changed. Manifests written before
# pins record "path" and "bytes" only; comparisons use the fields both entries have.
PIN_BYTES = 1 << 20
PINS = ("bytes", "mtime_ns", "ends_sha256")


def input_entry(path: str) -> dict:
    """A regular file's manifest record: absolute path, size, mtime and content pin. Anything else
    (a pipe, a device) is recorded by path and size alone: reading it to pin it would consume or block it."""
    entry: dict = {"path": os.path.abspath(path)}
    status = os.stat(path)
    if not stat.S_ISREG(status.st_mode):
        return entry | {"bytes": status.st_size}
    with open(path, "rb") as f:
        # size and mtime of the file opened, before its ends are read: a write in between shows
        # as a later mtime when it is pinned again
        status = os.fstat(f.fileno())
        digest = hashlib.sha256(f"{status.st_size}\n".encode())
        digest.update(f.read(PIN_BYTES))
        if status.st_size > PIN_BYTES:
            f.seek(max(status.st_size - PIN_BYTES, PIN_BYTES))
            digest.update(f.read(PIN_BYTES))
    return entry | {"bytes": status.st_size, "mtime_ns": status.st_mtime_ns, "ends_sha256": digest.hexdigest()}


def pins_differ(a: dict, b: dict) -> list[str]:
    """The pins recorded in both input entries that differ (none: the same file, as far as they tell)."""
    return [name for name in PINS if name in a and name in b and a[name] != b[name]]


def describe_input(entry: dict) -> str:
    """An input entry's pins, for a person: `1,234 bytes, modified 2025-01-02 03:04:05.678901234, ends 3fa9c2…`."""
    parts = []
    if "bytes" in entry:
        parts.append(f"{entry['bytes']:,} bytes")
    if "mtime_ns" in entry:
        seconds, nanoseconds = divmod(entry["mtime_ns"], 10**9)
        parts.append(f"modified {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(seconds))}.{nanoseconds:09d}")
    if "ends_sha256" in entry:
        parts.append(f"ends {entry['ends_sha256'][:12]}…")
    return ", ".join(parts) or "not pinned"
