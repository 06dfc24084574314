"""Chunks: whole records of one input file, each chunk knowing where its records come from (a file's
lines, read where the chunk is processed, or Arrow rows); what a step's workers are handed."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Iterator

from .._native import json_texts
from .._native import lines as split_lines
from ..errors import InputFileError, RecordError
from .records import Record


DEFAULT_CHUNK_BYTES = 4 << 20
SKIP_BLOCK = 1 << 16  # bytes read at a time to find where a line ends


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

    def records(self, texts: tuple[bytes, ...] | None = None) -> Iterator[Record]:
        """Every record of the chunk, in order; an unreadable one carries its error. `texts`: the keys
        (UTF-8) of the string values the step reads; a jsonl line that gives them all as the parsers
        would (`_native.json_texts`: a strict JSON object, each key once, its text not empty nor
        whitespace) becomes a record of those texts and no dict, the others are parsed."""
        if self.table is not None:
            self.lines = self.rows
            yield from self._rows()
            return
        # a span's bytes are read here and not kept: the lines hold them while the records are made
        data = self._read_span() if self.span is not None and self.data is None else self.data
        lines = split_lines(data)  # (data.split(b"\n"))
        if lines and lines[-1] == b"":
            lines.pop()
        if b"\r" in data:  # checked once a chunk: most chunks hold none, and this loop is hot
            lines = [line.rstrip(b"\r") for line in lines]
        del data
        self.lines = len(lines)
        first = 1 if self.span is not None else self.first
        if texts is None:
            for number, line in enumerate(lines, start=first):
                yield Record.from_line(number, line)
            return
        for number, line, read in zip(range(first, first + len(lines)), lines, json_texts(lines, texts)):
            yield Record.from_line(number, line) if read is None else Record(number, line, None, len(line), texts=read)

    def _read_span(self) -> bytes:
        """The whole lines that start in the span: a line belongs to the span holding its first byte.
        Where they begin and end is found first and they are read in one piece: no copy of the chunk
        is made to cut or extend it, and the lines around are scanned, never kept (a line longer than
        many spans costs each span its own bytes)."""
        start, stop = self.span
        with open(self.path, "rb") as f:
            # the first line starting in the span follows a newline at or after the byte before it
            begin = 0 if start == 0 else _after_newline(f, start - 1, stop)
            if begin >= stop:
                data = b""
            else:
                end = _after_newline(f, stop - 1)  # the end of the line holding the span's last byte
                f.seek(begin)
                data = f.read(end - begin)
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


def _after_newline(f, at: int, limit: int | None = None) -> int:
    """The offset after the first newline at or after `at` in the file `f` (its end where none), looked
    for in blocks up to `limit` (`limit` where none before it)."""
    f.seek(at)
    while limit is None or f.tell() < limit:
        block = f.read(SKIP_BLOCK if limit is None else min(SKIP_BLOCK, limit - f.tell()))
        if not block:
            break
        if (k := block.find(b"\n")) >= 0:
            return f.tell() - len(block) + k + 1
    return f.tell()
