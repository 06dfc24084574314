"""Inputs as they come → chunks of whole records, each chunk knowing where its records come from.

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

Everything streams: jsonl in blocks cut at line ends, a .json array element by element (each a
line to its chunk, as a jsonl line), parquet one row group at a time (only the
columns asked for), Arrow one record batch at a time; memory does not grow with the file. Each
record keeps its number in its file counting from 1 (the line of a jsonl file, the position in a
.json array, the row of a parquet or Arrow file), and a parquet row also its row group and its
row in that group. Arrow rows become the dicts a jsonl line of the same record parses to: a null
column, or a null field of a struct at any depth, is taken as absent, since Arrow gives every row
each key that any row has (null where it lacks one) and cannot tell an absent key from a null one;
a struct's keys come in the schema's order.

Inputs are pinned: a file whose size is not the size `expand` listed, before or after it is read,
or that ends before that size is read, stops the run with an error naming it.

Chunk boundaries depend only on the input and `chunk_bytes`, never on the worker count. With a
`Shard` a run reads a contiguous 1/N of the records of all inputs: the inputs, in order, are laid
end to end as one range of on-disk bytes cut into N equal parts, and every unit — a line of an
uncompressed jsonl file, a parquet row group, any other file whole — belongs to the part holding
its first byte. Shards 0..N-1 read back to back are exactly the unsharded run's records.
"""

from __future__ import annotations

import bz2
import glob
import gzip
import itertools
import json
import lzma
import os
import re
import stat
import sys
import zlib
from dataclasses import dataclass, field
from typing import Iterator

from ..errors import InputFileError, RecordError
from .records import Record

DEFAULT_CHUNK_BYTES = 4 << 20
TAIL_SPANS = 16  # see `_spans`

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


# -- expanding the command line -------------------------------------------------------------------
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


# -- chunks ---------------------------------------------------------------------------------------
@dataclass
class Chunk:
    """Whole records of one file: jsonl lines (`data`) or Arrow rows (`table`)."""

    path: str
    first: int | None  # number (from 1) of the chunk's first record in its file (a span: see below)
    data: bytes | None = None  # whole lines, newline-separated
    table: object = None  # a pyarrow Table
    row_group: int | None = None  # parquet: the row group of the rows ...
    group_first: int = 1  # ... and the number of its first row in the file
    input_bytes: int = 0  # how far this chunk moved through the file as it lies on disk
    # A plain jsonl file's lines that start in bytes [start, stop), read by the process that handles
    # the chunk, so the one that plans the chunks never touches the text. It numbers them from 1;
    # whoever knows the lines before (`pipeline`) numbers them in the file. `first` is given only for
    # the first span of a file or shard part (None: the line after the previous span's).
    span: tuple[int, int] | None = None
    file_size: int = 0  # a span's file size when the inputs were listed
    lines: int = field(init=False, default=0)  # records met by `records()`, unreadable ones included
    rows: int = field(init=False, default=0)  # the table's rows, kept apart: see __post_init__

    def __post_init__(self) -> None:
        # A table of no column (a file lacking every column the step reads) loses its row count when
        # pickled to a worker; its rows are still records, each lacking those keys.
        if self.table is not None:
            self.rows = self.table.num_rows

    def records(self) -> Iterator[Record]:
        """Every record of the chunk, in order; an unreadable one carries its error."""
        if self.table is not None:
            self.lines = self.rows
            yield from self._rows()
            return
        if self.span is not None and self.data is None:
            self.data = self._read_span()
        lines = self.data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        if b"\r" in self.data:  # checked once a chunk: most chunks hold none, and this loop is hot
            lines = [line.rstrip(b"\r") for line in lines]
        self.lines = len(lines)
        for number, line in enumerate(lines, start=1 if self.span is not None else self.first):
            yield Record.from_line(number, line)

    def _read_span(self) -> bytes:
        """The whole lines that start in the span: a line belongs to the span holding its first byte."""
        start, stop = self.span
        with open(self.path, "rb") as f:
            if start == 0:
                data = f.read(stop)
            else:
                # From the byte before the span: the first line starting in it follows a newline.
                # Only the span is read, so a line longer than many spans costs each span its own bytes.
                f.seek(start - 1)
                data = f.read(stop - start + 1)
                data = data[data.find(b"\n") + 1:] if b"\n" in data else b""
            if data and not data.endswith(b"\n"):
                data += f.readline()  # the last line starts in the span and ends beyond it
            size = os.fstat(f.fileno()).st_size
        if size != self.file_size:
            raise InputFileError(f"{self.path}: changed while it was read ({self.file_size:,} bytes when the inputs "
                                 f"were listed, {size:,} now); run again once it is complete")
        return data

    def _rows(self) -> Iterator[Record]:
        table = self.table
        size = table.nbytes // max(1, self.rows)
        try:
            rows = table.to_pylist() if table.num_columns else [{}] * self.rows
        except UnicodeDecodeError:  # written by a tool that did not check: find the rows one by one
            rows = [_row(table, i) for i in range(self.rows)]
        nested = _holds_struct(table.schema)
        for number, row in enumerate(rows, start=self.first):
            if isinstance(row, RecordError):
                yield Record(number, {}, None, size, row)
            else:
                record = {k: _without_nulls(v) if nested else v for k, v in row.items() if v is not None}
                yield Record(number, record, record, size)

    def location(self, number: int) -> dict:
        """Where record `number` is, beyond its file and number (parquet: the row group and row)."""
        if self.row_group is None:
            return {}
        return {"row_group": self.row_group, "row_in_group": number - self.group_first}


class LineNumbers:
    """Where the records of chunks met in reading order are in their files. A span's records are
    numbered from 1 by whoever read its lines; the first span of a file (or of a shard's part) knows
    its first line, and each other span follows the one before it."""

    def __init__(self) -> None:
        self.line = 1

    def shift(self, first: int | None, span: bool, lines: int) -> int:
        """What to add to a chunk's record numbers (0 but for spans); `lines`: the records it held."""
        if not span:
            return 0
        self.line = first if first is not None else self.line
        shift = self.line - 1
        self.line += lines
        return shift


def _holds_struct(schema) -> bool:
    """Whether a column's type is or holds a struct (a list of structs, a struct in a struct ...)."""
    from pyarrow.types import is_struct  # loaded already: the schema is pyarrow's

    types = [f.type for f in schema]
    while types:
        t = types.pop()
        if is_struct(t):
            return True
        types += [t.field(i).type for i in range(t.num_fields)]
    return False


def _without_nulls(value):
    """A value read from Arrow without the null fields of its structs (dicts). Arrow gives a struct
    column every key any row has, null in the rows that lack it; a null the record wrote itself
    cannot be told apart, so both go, as a null column does. A null in a list is the record's own."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _row(table, i: int):
    try:
        return table.slice(i, 1).to_pylist()[0]
    except UnicodeDecodeError as exc:
        return RecordError("invalid-utf8", f"invalid UTF-8 in the row ({exc.reason})")


def read_chunks(sources: list[InputFile], chunk_bytes: int = DEFAULT_CHUNK_BYTES, shard: Shard | None = None,
                columns: list[str] | None = None) -> Iterator[Chunk]:
    """`columns`: the keys the step uses (None: all); parquet and Arrow files read only those."""
    for source, part in shard_parts(sources, shard):
        _check_size(source)
        try:
            try:
                yield from _READERS[source.kind](source, part, chunk_bytes, columns)
            except Exception:
                _check_size(source)  # a file that changed while read is why a reader broke: that is said
                raise
            _check_size(source)
        except gzip.BadGzipFile:
            raise InputFileError(f"{source.path}: not a gzip file, though its name ends in .gz") from None
        except EOFError:
            raise InputFileError(f"{source.path}: the {source.compression} data ends early (a truncated or partly "
                                 "copied file)") from None
        except (zlib.error, lzma.LZMAError) as exc:
            raise InputFileError(f"{source.path}: corrupt {source.compression} data ({exc})") from None
        except OSError as exc:
            if source.compression != "bzip2" or exc.errno is not None:  # bz2's "Invalid data stream"
                raise
            raise InputFileError(f"{source.path}: corrupt {source.compression} data ({exc})") from None
        except Exception as exc:
            # zstandard's and pyarrow's errors, without importing them for runs that never use them
            if type(exc).__name__ in ("ZstdError", "ArrowInvalid", "ArrowIOError", "ArrowTypeError"):
                raise InputFileError(f"{source.path}: not readable as {source.compression or source.kind} "
                                     f"({exc})") from None
            raise


def _check_size(source: InputFile) -> None:
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


def _check_read_whole(source: InputFile, read: int) -> None:
    """After reading a whole file to its end: InputFileError unless `read`, the bytes read from disk
    (compressed ones for a compressed file), is its size when the inputs were listed."""
    if source.path != STDIN and read != source.size:
        raise InputFileError(f"{source.path}: {read:,} bytes read to its end, but it had {source.size:,} when the "
                             "inputs were listed: it changed while it was read; run again once it is complete")


# -- shards ---------------------------------------------------------------------------------------
def shard_parts(sources: list[InputFile], shard: Shard | None) -> Iterator[tuple[InputFile, object]]:
    """Each source with the part of it to read: None for all of it; for a shard, a byte range
    (start, stop) of an uncompressed jsonl file, a list of row groups of a parquet file."""
    if shard is None:
        yield from ((source, None) for source in sources)
        return
    if any(s.path == STDIN for s in sources):
        raise ValueError("--shard cannot split standard input")
    total = sum(s.size for s in sources)
    low, high = total * shard.index // shard.count, total * (shard.index + 1) // shard.count
    base = 0
    for source in sources:
        start, stop = base, base + source.size
        base = stop
        if source.splittable:
            if start < high and low < stop:  # lines starting in [low, high)
                yield source, (max(low, start) - start, min(high, stop) - start)
        elif source.kind == "parquet":
            groups = [g for g, offset in enumerate(_row_group_offsets(source.path)) if low <= start + offset < high]
            if groups:
                yield source, groups
        elif low <= start < high or (start == stop == total == high):
            yield source, None


def _row_group_offsets(path: str) -> list[int]:
    """Where each row group begins in the file: its first column chunk's first page."""
    metadata = _parquet(path).metadata
    offsets = []
    for g in range(metadata.num_row_groups):
        column = metadata.row_group(g).column(0)
        offsets.append(column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset)
    return offsets


# -- the readers, by kind -------------------------------------------------------------------------
class _Counted:
    """A binary file that counts what was read from it (compressed bytes, for progress)."""

    def __init__(self, f) -> None:
        self.f, self.count = f, 0

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.count += len(data)
        return data

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


def _open_stream(source: InputFile):
    """(decompressed binary stream, counter of on-disk bytes read)."""
    if source.path == STDIN:
        raw = _Counted(sys.stdin.buffer)
        return raw, raw
    raw = _Counted(open(source.path, "rb"))
    if source.compression == "gzip":
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw
    if source.compression == "xz":
        return lzma.LZMAFile(raw), raw
    if source.compression == "bzip2":
        return bz2.BZ2File(raw), raw
    if source.compression == "zstd":
        return _ZstdReader(raw), raw
    return raw, raw


def _jsonl_chunks(source: InputFile, part, chunk_bytes: int, columns=None) -> Iterator[Chunk]:
    if source.splittable:  # the only kind a shard splits inside: `part` is None below
        yield from _spans(source, part, chunk_bytes)
        return
    stream, counter = _open_stream(source)
    with stream:
        line, consumed = 1, 0
        # The start of a line not yet ended, in the blocks read so far: only each new block is
        # searched for a line end and the pieces are joined once, so a line of any length costs
        # time linear in it, whatever the chunk size.
        pending: list[bytes] = []
        while block := stream.read(chunk_bytes):
            cut = block.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a chunk: keep reading
                pending.append(block)
                continue
            data = b"".join(pending) + block[:cut] if pending else block[:cut]
            pending = [block[cut:]] if cut < len(block) else []
            yield Chunk(source.path, line, data, input_bytes=counter.count - consumed)
            consumed = counter.count
            line += data.count(b"\n")
        _check_read_whole(source, counter.count)
    if pending:
        yield Chunk(source.path, line, b"".join(pending), input_bytes=counter.count - consumed)


def _spans(source: InputFile, part, chunk_bytes: int) -> Iterator[Chunk]:
    """A plain jsonl file (or a shard's part of it) as spans of `chunk_bytes`, read where they are
    processed. Only a part that starts inside the file needs reading here: its first line's number."""
    start, stop = (0, source.size) if part is None else part
    first = 1
    if start > 0:
        with open(source.path, "rb") as f:
            first = _seek_line(f, start)
    begin = start
    while begin < stop:
        # Spans shrink over the part's last TAIL_SPANS spans of full size, down to 1/8 of it: the
        # workers then end together, none of them left with a whole span when the others are done.
        size = min(chunk_bytes, max(chunk_bytes // 8, (stop - begin) // TAIL_SPANS))
        end = min(begin + max(1, size), stop)
        yield Chunk(source.path, first if begin == start else None, span=(begin, end), file_size=source.size,
                    input_bytes=end - begin)
        begin = end


class _ZstdReader:
    """A .zst stream of one or more frames. (zstandard's own stream reader ends quietly at a frame cut
    short, so a truncated file would read as a shorter, valid one; this one raises EOFError.)"""

    def __init__(self, raw) -> None:
        import zstandard

        self.raw, self.new = raw, zstandard.ZstdDecompressor().decompressobj
        self.frame, self.started, self.buffer = self.new(), False, b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buffer) < n:
            block = self.raw.read(1 << 20)
            if not block:
                if self.started and not self.frame.eof:
                    raise EOFError
                break
            while block:
                self.started = True
                self.buffer += self.frame.decompress(block)
                block = b""
                if self.frame.eof:  # the next frame starts in what is left
                    block, self.frame, self.started = self.frame.unused_data, self.new(), False
        data, self.buffer = (self.buffer, b"") if n < 0 else (self.buffer[:n], self.buffer[n:])
        return data

    def close(self) -> None:
        self.raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _seek_line(f, start: int) -> int:
    """Move `f` to the first line that begins at or after byte `start`; that line's number."""
    if start == 0:
        return 1
    newlines, remaining = 0, start - 1
    while remaining > 0:
        block = f.read(min(remaining, 1 << 24))
        newlines += block.count(b"\n")
        remaining -= len(block)
    if f.read(1) != b"\n":  # inside a line, which belongs to the part holding its first byte
        f.readline()
    return newlines + 2


def _json_array_chunks(source: InputFile, part, chunk_bytes: int, columns=None) -> Iterator[Chunk]:
    """A .json array streamed: each element's own bytes are a record's line, parsed in the workers as
    a jsonl line is (numbered by its position in the array)."""
    stream, counter = _open_stream(source)
    with stream:
        first, lines, size, consumed = 1, [], 0, 0
        try:
            for index, element in enumerate(json_array_elements(stream.read, min(chunk_bytes, 1 << 20)), start=1):
                lines.append(element)
                size += len(element) + 1
                if size >= chunk_bytes:
                    yield Chunk(source.path, first, b"\n".join(lines) + b"\n", input_bytes=counter.count - consumed)
                    first, lines, size, consumed = index + 1, [], 0, counter.count
        except NotAnArray as exc:
            raise InputFileError(f"{source.path}: not a JSON array of records ({exc})") from None
        _check_read_whole(source, counter.count)
    if lines:
        yield Chunk(source.path, first, b"\n".join(lines) + b"\n", input_bytes=counter.count - consumed)


class NotAnArray(ValueError):
    pass


_STRUCTURE = re.compile(rb'[][{}",]')
_WHITESPACE = b" \t\r\n"


def json_array_elements(read, block: int = 1 << 20) -> Iterator[bytes]:
    """The bytes of each element of the JSON array that `read(n)` returns in pieces, in order, each
    on one line (a line break between tokens is whitespace; inside a string, where JSON allows none,
    it becomes a carriage return, which is no more allowed there). Elements are found by brackets
    and strings alone, not parsed: the workers parse them, and refuse what is not JSON as a record.
    NotAnArray when the whole is no array: another top level, an empty element, a missing `]`."""
    buf, offset, pos = _array_start(read, block)  # offset: bytes of the input dropped before buf
    start = pos  # the current element's first byte
    depth = count = 0
    while True:
        match = _STRUCTURE.search(buf, pos)
        if match is not None and buf[match.start()] == 0x22:  # a string: skipped whole
            end = _string_end(buf, match.end())
            if end:
                pos = end
                continue
            match, pos = None, match.start()  # it goes on past the buffer
        if match is None:  # more to read
            more = read(max(block, len(buf) - start))  # doubling: an element longer than a block costs no more
            if not more:
                raise NotAnArray(f"it ends inside the array, at byte {offset + len(buf)}: a truncated file?")
            buf, offset, pos = buf[start:] + more, offset + start, pos - start
            start = 0
            continue
        char, pos = buf[match.start()], match.end()
        if char in b"[{":
            depth += 1
        elif depth:  # inside an element: a comma is its own
            if char in b"]}":
                depth -= 1
        elif char in b",]":
            element = buf[start:match.start()].strip(_WHITESPACE)
            if element:
                count += 1
                yield element.replace(b"\n", b"\r") if b"\n" in element else element
            elif char == 0x2C or count:  # `[,`, `,,` or `,]`; `[]` is an empty array
                raise NotAnArray(f"an empty element before byte {offset + pos} (a stray comma?)")
            start = pos
            if char == 0x5D:  # the closing bracket: nothing may follow
                rest = buf[pos:]
                while not rest.strip(_WHITESPACE) and (more := read(block)):
                    rest = more
                if rest.strip(_WHITESPACE):
                    raise NotAnArray(f"more follows the array's closing bracket at byte {offset + pos}")
                return
        else:
            raise NotAnArray(f"an unmatched {chr(char)!r} at byte {offset + pos}")


def _array_start(read, block: int) -> tuple[bytes, int, int]:
    """(the first bytes read, how many were dropped before them, where the array's first element
    may begin): past a byte order mark and whitespace, the `[`; NotAnArray where there is none."""
    buf, offset = read(block), 0
    while len(buf) < 3 and (more := read(block)):
        buf += more
    if buf.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
        buf, offset = buf[3:], 3
    while not buf.strip(_WHITESPACE) and (more := read(block)):
        buf, offset = more, offset + len(buf)
    pos = len(buf) - len(buf.lstrip(_WHITESPACE))
    if buf[pos:pos + 1] != b"[":
        raise NotAnArray(f"it starts with {buf[pos:pos + 20]!r}" if buf[pos:] else "it is empty")
    return buf, offset, pos + 1


def _string_end(buf: bytes, i: int) -> int:
    """Where the string whose text starts at `i` ends (after its closing quote); 0 when not in `buf`."""
    while (quote := buf.find(b'"', i)) >= 0:
        k = quote
        while buf[k - 1] == 0x5C:  # an odd number of backslashes before a quote escapes it
            k -= 1
        if (quote - k) % 2 == 0:
            return quote + 1
        i = quote + 1
    return 0


def _parquet(path: str):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:
        if not _pyarrow_error(exc):
            raise
        raise InputFileError(f"{path}: not readable as parquet ({_one_line(exc)})") from None


def _one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())  # pyarrow's reasons may span lines (thrift's)


def _pyarrow_error(exc: Exception) -> bool:
    """Whether `exc` is pyarrow's own word on the data (a corrupt page, a file cut short): its IO
    errors are OSErrors of no errno, which would be told as '[Errno None] None'; a real OS error
    (a disk failing, a file removed) has an errno and is told as such."""
    import pyarrow as pa

    return isinstance(exc, pa.ArrowException) or (isinstance(exc, OSError) and exc.errno is None)


def _parquet_chunks(source: InputFile, groups, chunk_bytes: int, columns: list[str] | None) -> Iterator[Chunk]:
    pf = _parquet(source.path)
    metadata = pf.metadata
    firsts = [1]
    for g in range(metadata.num_row_groups):
        firsts.append(firsts[-1] + metadata.row_group(g).num_rows)
    if columns is not None:  # a column the file lacks is every record lacking that key
        columns = [c for c in columns if c in pf.schema_arrow.names]
    for g in range(metadata.num_row_groups) if groups is None else groups:
        try:
            table = pf.read_row_group(g, columns=columns)
        except Exception as exc:
            if not _pyarrow_error(exc):
                raise
            raise InputFileError(f"{source.path}: row group {g} (counting from 0; rows {firsts[g]:,} to "
                                 f"{firsts[g + 1] - 1:,}): not readable as parquet ({_one_line(exc)})") from None
        group = metadata.row_group(g)
        on_disk = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        for first, piece in _slices(table, chunk_bytes):
            yield Chunk(source.path, firsts[g] + first, table=piece, row_group=g, group_first=firsts[g],
                        input_bytes=on_disk * piece.num_rows // max(1, table.num_rows))


def _arrow_chunks(source: InputFile, part, chunk_bytes: int, columns: list[str] | None) -> Iterator[Chunk]:
    import pyarrow as pa

    # Read, not memory-mapped: a mapped file cut short while read would end the process (SIGBUS)
    # where a read gives an error naming the file.
    with pa.OSFile(source.path) as f:
        batches = _told(source.path, _arrow_batches(pa, f, source.size))
        names = next(batches).names
        keep = None if columns is None else [c for c in columns if c in names]
        first, pieces, size, done = 1, [], 0, 0
        for batch, position in batches:
            batch = batch if keep is None else batch.select(keep)
            pieces.append(batch)
            size += batch.nbytes
            if size >= chunk_bytes:
                table = pa.Table.from_batches(pieces)
                yield Chunk(source.path, first, table=table, input_bytes=position - done)
                first, pieces, size, done = first + table.num_rows, [], 0, position
        if pieces:
            yield Chunk(source.path, first, table=pa.Table.from_batches(pieces), input_bytes=source.size - done)


def _arrow_batches(pa, f, size: int):
    """The schema of an Arrow IPC file or stream, then each record batch with how far into the file
    it ends. Both formats: the file format (Feather v2, `pyarrow.ipc.new_file`) begins with its magic
    and is read batch by batch from its footer; the stream format (`datasets` caches) in order."""
    if f.read(6) == b"ARROW1":
        reader = pa.ipc.open_file(f)
        yield reader.schema
        count = reader.num_record_batches
        for i in range(count):  # where a batch lies is in the footer: progress counts batches
            yield reader.get_batch(i), size * (i + 1) // count
        return
    f.seek(0)
    reader = pa.ipc.open_stream(f)
    yield reader.schema
    for batch in reader:
        yield batch, f.tell()


def _told(path: str, batches):
    """`_arrow_batches`, pyarrow's errors told as the file's and the batch's (`_pyarrow_error`)."""
    read = -1  # the schema comes first
    try:
        for item in batches:
            yield item
            read += 1
    except Exception as exc:
        if not _pyarrow_error(exc):
            raise
        where = f"record batch {read} (counting from 0): " if read >= 0 else ""
        raise InputFileError(f"{path}: {where}not readable as arrow ({_one_line(exc)})") from None


def _slices(table, chunk_bytes: int):
    """(offset, rows) pieces of about `chunk_bytes`, cut by row count alone (deterministic)."""
    rows = table.num_rows
    per = max(1, rows * chunk_bytes // table.nbytes) if table.nbytes > chunk_bytes else max(rows, 1)
    for offset in range(0, rows, per):
        yield offset, table.slice(offset, per)


_READERS = {"jsonl": _jsonl_chunks, "json": _json_array_chunks, "parquet": _parquet_chunks, "arrow": _arrow_chunks}


# -- how many records ---------------------------------------------------------------------------
PROBE_BYTES = 1 << 20


def estimated_records(source: InputFile) -> int | None:
    """About how many records `source` holds: exact for parquet and Arrow (their metadata), from the
    records in its first PROBE_BYTES (decompressed) for jsonl and .json; None for standard input.
    The certificate sizes its sample by it (`certify.sample`): deterministic, read in milliseconds."""
    if source.path == STDIN:
        return None
    try:
        if source.kind == "parquet":
            return _parquet(source.path).metadata.num_rows
        if source.kind == "arrow":
            import pyarrow as pa

            with pa.OSFile(source.path) as f:
                return sum(batch.num_rows for batch, _ in itertools.islice(_arrow_batches(pa, f, source.size), 1, None))
        stream, counter = _open_stream(source)
        with stream:
            if source.kind == "json":
                elements = json_array_elements(stream.read, 1 << 16)
                found = sum(1 for _ in itertools.takewhile(lambda _: counter.count < PROBE_BYTES, elements))
                found += counter.count < PROBE_BYTES  # the element that ended the count, if any
            else:
                data = stream.read(PROBE_BYTES)
                found = data.count(b"\n") + (bool(data) and not data.endswith(b"\n"))
            return max(1, round(found * source.size / max(1, counter.count)))
    except Exception:  # an unreadable file: the run itself says why, naming it
        return None
