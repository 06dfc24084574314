"""The inputs a command line names, as the `InputFile`s a run reads.

What an input may be (`expand` turns the command line into `InputFile`s, in this order):
- a file: `.jsonl` or `.ndjson`, `.json` (one array of records), either also compressed (`.gz`,
  `.zst`, `.xz`, `.bz2`); `.parquet`; `.arrow` or `.feather` (Arrow IPC, stream or file format:
  Hugging Face `datasets` cache files are streams, Feather v2 is the file format); names in any
  case (`.JSONL.GZ`); a FIFO, socket or device is refused (standard input reads a stream);
- `-`: jsonl on standard input;
- a directory: every such file under it, in sorted order of their paths, links to files and
  folders followed (each folder once: a link loop ends there); what is not read is named on stderr
  as skipped: hidden files and folders, files of other kinds, FIFOs, sockets and devices (never
  opened: that could wait forever). A Hugging Face `datasets` folder written by `save_to_disk`
  (`state.json`, or `dataset_dict.json` and a folder per split, chosen with `--hf-split`), given
  or found inside a directory, is read as that dataset;
- a glob (`data/*.parquet`), expanded in sorted order (what it matches that is not read, named);
- `hf:NAME` (`hf:NAME:CONFIG`): a dataset downloaded into the local Hugging Face Hub cache
  (`huggingface-cli download --repo-type dataset NAME`), never fetched: its data files for
  `--hf-split` (default train) are read as the files above.

Inputs are pinned: a file whose size is not the size `expand` listed, before or after it is read,
or that ends before that size is read, stops the run with an error naming it.
"""

from __future__ import annotations

import glob
import json
import os
import stat
import sys
from dataclasses import dataclass, field

from ..errors import InputFileError


# Names are matched in any case (.JSONL, .Parquet): the kind by the name's ending before any compression.
COMPRESSIONS = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".xz": "xz", ".bz2": "bzip2"}
KINDS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "json", ".parquet": "parquet", ".arrow": "arrow",
         ".feather": "arrow"}
COMPRESSIBLE = ("jsonl", "json")  # parquet and Arrow compress inside the file
READABLE = ".jsonl/.ndjson, .json (an array), either compressed (.gz, .zst, .xz, .bz2); .parquet, .arrow/.feather"
STDIN = "-"


@dataclass(frozen=True)
class InputFile:
    """One input file (or standard input) and how to read it."""

    path: str
    size: int  # on disk; 0 for standard input

    @property
    def kind(self) -> str:
        return "jsonl" if self.path == STDIN else kind_of(self.path)[0]

    @property
    def compression(self) -> str | None:
        return None if self.path == STDIN else kind_of(self.path)[1]

    @property
    def splittable(self) -> bool:
        """Whether a shard boundary may fall inside the file (at a line)."""
        return self.kind == "jsonl" and self.compression is None and self.path != STDIN


@dataclass(frozen=True)
class Shard:
    index: int  # 0-based
    count: int
    # The newlines before the line this shard starts at, in the file where it starts inside (None: the shard
    # counts them itself, reading the file up to there). Told by the Ray executor, which counts each file once
    # over all its shards (shards counting their own would read the file's start again and again). Not part of
    # what a shard is (its identity, its manifest), only of how it learns its first line's number.
    newlines_before: int | None = field(default=None, compare=False, repr=False)
    # The bytes of the inputs laid end to end that it takes, [start, stop), where they are not the index-th of
    # count equal stretches (`stretch`): the Ray executor makes its last parts smaller (`run.ray.cuts`).
    span: tuple[int, int] | None = None

    def stretch(self, total: int) -> tuple[int, int]:
        """[start, stop): the bytes it takes of inputs of `total` bytes laid end to end; a record is its shard's
        where its first byte is."""
        if self.span is not None:
            return self.span
        return total * self.index // self.count, total * (self.index + 1) // self.count

    def record(self) -> dict:
        """As a manifest records it (`of_record` reads it back)."""
        return {"index": self.index, "count": self.count} | ({} if self.span is None else {"span": list(self.span)})

    @classmethod
    def of_record(cls, record: dict) -> "Shard":
        span = record.get("span")
        return cls(record["index"], record["count"], span=None if span is None else (span[0], span[1]))

    @classmethod
    def parse(cls, text: str) -> "Shard":
        """`K/N`, K counting from 0."""
        try:
            k, n = (int(part) for part in text.split("/"))
        except ValueError:
            raise ValueError(f"{text!r} is not K/N (part K, counting from 0, of N parts), e.g. 0/8") from None
        if n < 1:
            raise ValueError(f"{text!r}: N, the number of parts, must be at least 1")
        if not 0 <= k < n:
            raise ValueError(f"{text!r}: K counts parts from 0, so it is 0..{n - 1} for N={n}")
        return cls(k, n)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def kind_of(path: str) -> tuple[str, str | None] | None:
    """(kind, compression) of a file by its name, or None when it is no input qwen-data reads."""
    stem, ending = os.path.splitext(path.lower())
    compression = COMPRESSIONS.get(ending)
    if compression is not None:
        stem, ending = os.path.splitext(stem)
    kind = KINDS.get(ending)
    if kind is None or (compression is not None and kind not in COMPRESSIBLE):
        return None
    return kind, compression


def expand(inputs: list[str], hf_split: str | None = None) -> list[InputFile]:
    """The files behind the inputs, in reading order; a clear error for anything unreadable."""
    if inputs.count(STDIN) > 1:
        raise InputFileError("standard input (-) is named more than once: it can be read once; give - once")
    paths: list[str] = []
    split_by: list[str] = []  # the inputs --hf-split chose a split of
    for text in inputs:
        paths += _expand_one(text, hf_split, split_by)
    if hf_split is not None and not split_by:
        raise InputFileError(f"--hf-split {hf_split}: none of the inputs has splits (it chooses the split of an "
                             "hf:NAME dataset or of a datasets DatasetDict folder): leave it out")
    if not paths:
        raise InputFileError("no input files")
    return [InputFile(p, 0 if p == STDIN else os.path.getsize(p)) for p in paths]


def _expand_one(text: str, hf_split: str | None, split_by: list[str]) -> list[str]:
    if text == STDIN:
        return [STDIN]
    if text.startswith("hf:"):
        split_by.append(text)
        return hub_dataset_files(text[3:], hf_split or "train")
    if os.path.isdir(text):
        return _directory_files(text, hf_split, split_by)
    if os.path.isfile(text):
        if kind_of(text) is None:
            raise InputFileError(f"{text}: not a kind of input qwen-data reads ({READABLE})")
        return [text]
    if os.path.exists(text):
        raise InputFileError(f"{text}: not a regular file (a FIFO, socket or device): to read a stream, "
                             f"pipe it to standard input (- < {text})")
    if glob.has_magic(text):
        files, skipped = [], _Skipped()
        for match in sorted(glob.glob(text, recursive=True)):
            if os.path.isdir(match):
                files += _directory_files(match, hf_split, split_by)
            elif not os.path.isfile(match):
                skipped.special.append(match)
            else:
                (files if kind_of(match) else skipped.other).append(match)
        skipped.tell(text)
        if not files:
            raise InputFileError(f"{text}: matches no readable input file ({READABLE})")
        return files
    raise FileNotFoundError(f"{text}: no such input file or directory")


def _directory_files(folder: str, hf_split: str | None, split_by: list[str]) -> list[str]:
    """The readable files under `folder`, in sorted order of their paths. Links to folders are
    followed, each folder read once (by device and inode: a link back up would loop); a `datasets`
    folder met on the way is read as that dataset, as when given alone; what is not read is named."""
    saved = saved_dataset_files(folder, hf_split, split_by)
    if saved is not None:
        return saved
    found: list[tuple[str, list[str]]] = []  # (where in the sorted order, its files in reading order)
    skipped, seen, folders = _Skipped(), set(), [folder]
    while folders:
        root = folders.pop()
        st = os.stat(root)
        if (st.st_dev, st.st_ino) in seen:
            skipped.again.append(root + os.sep)
            continue
        seen.add((st.st_dev, st.st_ino))
        for entry in os.scandir(root):
            path = entry.path
            try:
                st = os.stat(path)  # through a link
            except OSError:  # a broken link, or a name gone since it was listed
                skipped.special.append(path)
                continue
            is_dir = stat.S_ISDIR(st.st_mode)
            if entry.name.startswith("."):
                # hidden files and folders are editors' and tools' own (.DS_Store, .git, a download in progress)
                skipped.other.append(path + os.sep * is_dir)
            elif is_dir:
                saved = saved_dataset_files(path, hf_split, split_by)
                if saved is None:
                    folders.append(path)
                else:
                    found.append((path + os.sep, saved))
            elif not stat.S_ISREG(st.st_mode):  # opening a FIFO would wait for a writer forever
                skipped.special.append(path)
            elif kind_of(entry.name):
                found.append((path, [path]))
            else:
                skipped.other.append(path)
    skipped.tell(folder)
    if not found:
        raise InputFileError(f"{folder}: a directory holding no readable input file ({READABLE})")
    return [path for _, files in sorted(found) for path in files]


class _Skipped:
    """What a directory or glob holds that is not read, by why, named on stderr (never skipped silently)."""

    def __init__(self) -> None:
        self.other: list[str] = []  # hidden (folders end in /), or of no kind qwen-data reads
        self.special: list[str] = []  # FIFOs, sockets, devices, broken links
        self.again: list[str] = []  # folders reached a second time through a link

    def tell(self, where: str) -> None:
        for names, why in ((self.other, f"hidden or of no kind qwen-data reads ({READABLE})"),
                           (self.special, "not regular files (FIFOs, sockets, devices) or broken links"),
                           (self.again, "folders read already, reached again through a link")):
            if names:
                _tell_skipped(where, names, why)


def _tell_skipped(where: str, skipped: list[str], why: str, shown: int = 5) -> None:
    skipped = sorted(skipped)
    names = ", ".join(skipped[:shown]) + (f" and {len(skipped) - shown} more" if len(skipped) > shown else "")
    print(f"{where}: skipped {len(skipped)} name{'s' * (len(skipped) > 1)}, {why}: {names}", file=sys.stderr)


def saved_dataset_files(folder: str, hf_split: str | None, split_by: list[str]) -> list[str] | None:
    """The Arrow files of a `datasets` `save_to_disk` folder, or None when `folder` is not one; a
    DatasetDict's is added to `split_by`."""
    splits_file = os.path.join(folder, "dataset_dict.json")
    if os.path.isfile(splits_file):  # a DatasetDict: one saved Dataset per split
        split_by.append(folder)
        with open(splits_file, encoding="utf-8") as f:
            splits = json.load(f).get("splits", [])
        split = hf_split or (splits[0] if len(splits) == 1 else None)
        if split not in splits:
            what = f"no split {split!r} in this" if split else "a"
            raise InputFileError(f"{folder}: {what} datasets DatasetDict (its splits: {', '.join(splits) or 'none'}): "
                                 "choose one with --hf-split")
        folder = os.path.join(folder, split)
    state_file = os.path.join(folder, "state.json")
    if not os.path.isfile(state_file):
        return None
    with open(state_file, encoding="utf-8") as f:
        names = [entry["filename"] for entry in json.load(f).get("_data_files", [])]
    return [os.path.join(folder, name) for name in names]


def hub_dataset_files(name: str, split: str) -> list[str]:
    """The data files of `split` of a dataset in the local Hub cache, as `datasets` resolves them
    (README `configs`, or the usual file-name patterns); nothing is downloaded."""
    repo, _, config = name.partition(":")
    os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise InputFileError(f"hf:{name}: reading the Hugging Face cache needs huggingface_hub and datasets") from None
    try:
        folder = snapshot_download(repo, repo_type="dataset", local_files_only=True)
    except LocalEntryNotFoundError:
        raise InputFileError(f"hf:{name}: not in the local Hugging Face cache (nothing is downloaded at run time: "
                             f"`huggingface-cli download --repo-type dataset {repo}` first)") from None
    import datasets

    builder = datasets.load_dataset_builder(folder, config or None)
    data_files = builder.config.data_files or {}
    if split not in data_files:
        raise InputFileError(f"hf:{name}: no split {split!r} (splits: {', '.join(data_files) or 'none'}): "
                             "choose one with --hf-split")
    files = [str(p) for p in data_files[split]]
    unreadable = [p for p in files if kind_of(p) is None]
    if unreadable:
        raise InputFileError(f"hf:{name}: {unreadable[0]}: not a kind of input qwen-data reads ({READABLE})")
    return files


def check_size(source: InputFile) -> None:
    """InputFileError unless the file is still the size it had when the inputs were listed: a file
    rewritten, cut or grown while a run reads it would give records of no one version of it."""
    if source.path == STDIN:
        return
    try:
        size = os.stat(source.path).st_size
    except FileNotFoundError:
        raise InputFileError(f"{source.path}: removed while it was read") from None
    if size != source.size:
        raise InputFileError(f"{source.path}: changed while it was read ({source.size:,} bytes when the inputs "
                             f"were listed, {size:,} now); run again once it is complete")


def check_read_whole(source: InputFile, read: int) -> None:
    """After reading a whole file to its end: InputFileError unless `read`, the bytes read from disk
    (compressed ones for a compressed file), is its size when the inputs were listed."""
    if source.path != STDIN and read != source.size:
        raise InputFileError(f"{source.path}: {read:,} bytes read to its end, but it had {source.size:,} when the "
                             "inputs were listed: it changed while it was read; run again once it is complete")
