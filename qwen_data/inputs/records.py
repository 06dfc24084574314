"""Records: parsing a jsonl line, and setting aside the records a run cannot use.

Where records come from (files, chunks, shards) is `readers`; each step decides what makes a record
unusable and hands it to `reject_entry`, and the run's `RejectLog` writes PREFIX.rejects.jsonl.
"""

from __future__ import annotations

import json
import sys

import orjson

from ..errors import RecordError


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


def reject_entry(chunk, number: int, raw: bytes | dict, error: RecordError) -> dict:
    """A line of PREFIX.rejects.jsonl: where, why, and the record itself so it can be fixed.

    `record` is the record's number in its file counting from 1: the line number in a jsonl file
    (every line is a record, blank ones included), the position in a .json array, the row of a
    parquet file (which also gets `row_group` and `row_in_group`, from 0 as parquet tools count)."""
    return {"file": chunk.path, "record": number, **chunk.location(number), "reason": error.reason,
            "message": str(error), "raw": _raw_text(raw)}


def _raw_text(raw: bytes | dict) -> str:
    """The line itself, or a row as JSON."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "backslashreplace")
    return orjson.dumps(raw, default=str).decode()


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
