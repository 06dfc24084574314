"""Reading input files into chunks of whole records, each chunk knowing its first line number.

The main process only cuts files into ~`chunk_bytes` pieces at line ends (cheap); workers parse
and tokenize whole chunks, so no per-record traffic crosses process boundaries. Chunk boundaries
depend only on the input and `chunk_bytes`, never on the worker count, so output is identical for
any number of workers.

`.jsonl` and `.jsonl.gz` stream. A `.json` file holding one array of records (how many SFT
datasets ship) is loaded whole and re-cut into one record per line; its record numbers are then
the record's 1-based position in the array.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import zlib
from dataclasses import dataclass
from typing import Iterator

import orjson

from .errors import InputFileError, RecordError

DEFAULT_CHUNK_BYTES = 4 << 20


@dataclass
class Chunk:
    path: str
    first_line: int  # 1-based number of the first line (record) in `data`
    data: bytes  # whole lines, newline-separated

    def lines(self) -> Iterator[tuple[int, bytes]]:
        """(line number, line without its newline), blank lines included."""
        lines = self.data.split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        for offset, line in enumerate(lines):
            yield self.first_line + offset, line.rstrip(b"\r")


def check_inputs(paths: list[str]) -> None:
    for path in paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{path}: no such input file")
        if not path.endswith((".jsonl", ".jsonl.gz", ".json", ".json.gz")):
            raise ValueError(f"{path}: expected .jsonl, .jsonl.gz or .json")


def read_chunks(paths: list[str], chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[Chunk]:
    for path in paths:
        try:
            if path.endswith((".json", ".json.gz")):
                yield from _json_array_chunks(path, chunk_bytes)
            else:
                yield from _jsonl_chunks(path, chunk_bytes)
        except gzip.BadGzipFile:
            raise InputFileError(f"{path}: not a gzip file, though its name ends in .gz") from None
        except EOFError:
            raise InputFileError(f"{path}: the gzip data ends early (a truncated or partly copied file)") from None
        except zlib.error as exc:
            raise InputFileError(f"{path}: corrupt gzip data ({exc})") from None


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _jsonl_chunks(path: str, chunk_bytes: int) -> Iterator[Chunk]:
    line = 1
    rest = b""
    with _open(path) as f:
        while True:
            block = f.read(chunk_bytes)
            if not block:
                break
            data = rest + block
            cut = data.rfind(b"\n") + 1
            if cut == 0:  # one line longer than a chunk: keep reading
                rest = data
                continue
            rest = data[cut:]
            yield Chunk(path, line, data[:cut])
            line += data.count(b"\n", 0, cut)
    if rest:
        yield Chunk(path, line, rest)


def _json_array_chunks(path: str, chunk_bytes: int) -> Iterator[Chunk]:
    with _open(path) as f:
        try:
            records = json.load(f)
        except (ValueError, UnicodeDecodeError) as exc:
            raise InputFileError(f"{path}: not a JSON array of records ({exc})") from None
    if not isinstance(records, list):
        raise InputFileError(f"{path}: top level is {type(records).__name__}, expected an array of records")
    first, lines, size = 1, [], 0
    for index, record in enumerate(records, start=1):
        line = json.dumps(record, ensure_ascii=False).encode("utf-8", "surrogatepass")
        lines.append(line)
        size += len(line) + 1
        if size >= chunk_bytes:
            yield Chunk(path, first, b"\n".join(lines) + b"\n")
            first, lines, size = index + 1, [], 0
    if lines:
        yield Chunk(path, first, b"\n".join(lines) + b"\n")


def parse_line(line: bytes) -> dict:
    """One jsonl line to a record, or RecordError naming what is wrong with it."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError:
        # orjson is the fast path; the standard parser decides what exactly is wrong (and accepts
        # what orjson refuses but JSON allows, e.g. an escaped lone surrogate, rejected later).
        record = _parse_line_slowly(line)
    if not isinstance(record, dict):
        raise RecordError("not-an-object", f"a JSON {type(record).__name__}, expected an object")
    return record


def _parse_line_slowly(line: bytes):
    if not line.strip():
        raise RecordError("blank-line", "blank line")
    try:
        return json.loads(line)
    except UnicodeDecodeError as exc:
        raise RecordError("invalid-utf8", f"invalid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise RecordError("invalid-json", f"not JSON ({exc})") from None


def reject_entry(chunk: Chunk, line_no: int, line: bytes, error: RecordError) -> dict:
    """A line of PREFIX.rejects.jsonl: where, why, and the record itself so it can be fixed.

    `record` is the record's number in its file counting from 1: the line number in a jsonl file
    (every line is a record, blank ones included), the position in a .json array."""
    return {
        "file": chunk.path,
        "record": line_no,
        "reason": error.reason,
        "message": str(error),
        "raw": line.decode("utf-8", "backslashreplace"),
    }


class TooManyRejects(RuntimeError):
    pass


class EmptyOutput(RuntimeError):
    """A run that would write no document: a prefix megatron-core cannot even open."""


def empty_output(prefix: str, rejects: "RejectLog") -> EmptyOutput:
    why = (f"all {rejects.count:,} records were rejected, by reason {rejects.summary()['by_reason']}"
           if rejects.count else "the input holds no records")
    return EmptyOutput(f"{prefix}: nothing to write ({why}); no output was written")


class RejectLog:
    """Writes rejected records to PREFIX.rejects.jsonl, counts them by reason, shows the first few."""

    SHOWN = 5

    def __init__(self, path: str, max_rejects: int | None = None) -> None:
        self.path = path
        self.max_rejects = max_rejects
        self.by_reason: dict[str, int] = {}
        self.count = 0
        self._file = open(path, "w", encoding="utf-8")

    def add(self, entries: list[dict]) -> None:
        for entry in entries:
            self._file.write(json.dumps(entry, ensure_ascii=False) + "\n")
            self.by_reason[entry["reason"]] = self.by_reason.get(entry["reason"], 0) + 1
            self.count += 1
            if self.count <= self.SHOWN:
                print(f"rejected {entry['file']}:{entry['record']}: {entry['message']}", file=sys.stderr)
        if self.max_rejects is not None and self.count > self.max_rejects:
            raise TooManyRejects(
                f"more than --max-rejects {self.max_rejects} rejected records; last: "
                f"{entries[-1]['file']}:{entries[-1]['record']}: {entries[-1]['message']}"
            )

    def close(self) -> None:
        self._file.close()
        if self.count > self.SHOWN:
            print(f"... and {self.count - self.SHOWN:,} more rejected records", file=sys.stderr)

    def summary(self) -> dict:
        return {"count": self.count, "by_reason": dict(sorted(self.by_reason.items()))}
