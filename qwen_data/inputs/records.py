"""Records: parsing a jsonl line, and setting aside the records a run cannot use.

Where records come from (files, chunks, shards) is `files`, `chunks` and `readers`, as `Record`s; each step decides what
makes a record unusable (it raises RecordError), `Rejects.sift` is the one place such a record is
caught and set aside, and the run's `RejectLog` writes PREFIX.rejects.jsonl.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable, Iterable

import orjson

from ..errors import RecordError


def _parse_line_slowly(line: bytes):
    if not line.strip():
        raise RecordError("blank-line", "blank line")
    try:
        return json.loads(line)
    except UnicodeDecodeError as exc:
        raise RecordError("invalid-utf8", f"invalid UTF-8 ({exc.reason} at byte {exc.start})") from None
    except ValueError as exc:
        raise RecordError("invalid-json", f"not JSON ({exc})") from None
    except RecursionError:
        raise too_deep() from None


def too_deep() -> RecordError:
    """A record nested more deeply than Python's recursion limit lets its parser or a step's code
    walk: one bad record, not the end of the run."""
    return RecordError("too-deep", f"nested too deeply (beyond about {sys.getrecursionlimit()} levels) to be read")


class Record:
    """One record as read: its number in its file (from 1), its raw form (the jsonl line, or the row),
    its value (the dict a step reads; None when unreadable, or when `texts` holds what the step reads),
    its size in the input, and `error`: why it cannot be used, when it cannot even be read (bad JSON,
    invalid UTF-8 ...). `texts`: where a step asked for the string values under some keys and the line
    gave them as the parsers would (`Chunk.records`), those values as UTF-8 (bytes; a tuple of them for
    several keys), none of them empty or whitespace; no dict is made then."""

    # Slots: one is made per record of the input, on the hot path.
    __slots__ = ("number", "raw", "value", "size", "error", "may_hold_surrogate", "texts")

    def __init__(self, number: int, raw: bytes | dict, value: dict | None, size: int,
                 error: RecordError | None = None, may_hold_surrogate: bool = False,
                 texts: bytes | tuple[bytes, ...] | None = None) -> None:
        self.number = number
        self.raw = raw
        self.value = value
        self.size = size
        self.error = error
        # Whether a string of the record can be a lone surrogate: steps run `check_unicode` only
        # then, as checking every string of every record would cost more than the rest of sifting.
        self.may_hold_surrogate = may_hold_surrogate
        self.texts = texts

    @classmethod
    def from_line(cls, number: int, line: bytes) -> "Record":
        """A jsonl line as a record; one that is not a JSON object carries its error."""
        try:
            value, lenient = orjson.loads(line), False
        except orjson.JSONDecodeError:
            # orjson is the fast path, and it refuses lone surrogates, which JSON allows: only a line
            # the standard parser reads can hold one. That parser also says what is wrong with a line.
            try:
                value, lenient = _parse_line_slowly(line), True
            except RecordError as error:
                return cls(number, line, None, len(line), error)
        if not isinstance(value, dict):
            error = RecordError("not-an-object", f"a JSON {type(value).__name__}, expected an object")
            return cls(number, line, None, len(line), error)
        return cls(number, line, value, len(line), may_hold_surrogate=lenient)

    def rejected(self, chunk, error: RecordError) -> dict:
        return reject_entry(chunk, self.number, self.raw, error)

def check_unicode(text: str, where: str) -> None:
    """RecordError unless `text` is valid Unicode: no lone surrogate (a tokenizer cannot take one)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise RecordError("invalid-unicode", f"{where} holds a lone surrogate (not valid Unicode text)") from None


class Rejects:
    """The records of one chunk a step cannot use, as lines of PREFIX.rejects.jsonl (in record order
    as the step met them); the run's `RejectLog` counts them by reason and writes them."""

    def __init__(self, chunk) -> None:
        self.chunk = chunk
        self.entries: list[dict] = []

    def sift(self, items: Iterable, take: Callable[[Any], None]) -> None:
        """`take(item)` for every item (a `Record`, or a step's own item made from one: anything with
        `error` and `rejected(chunk, error)`); one that carries an error, or that `take` refuses by
        raising RecordError, is set aside instead. The one place a step's bad records are caught, so
        a step's own code is the happy path and raises for anything else."""
        entries, chunk = self.entries, self.chunk
        for item in items:
            if item.error is not None:
                entries.append(item.rejected(chunk, item.error))
                continue
            try:
                take(item)
            except RecordError as error:
                entries.append(item.rejected(chunk, error))
            except RecursionError:  # a step's code walking (or parsing a JSON string of) a deep record
                entries.append(item.rejected(chunk, too_deep()))


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
    try:
        return orjson.dumps(raw, default=str).decode()
    except orjson.JSONEncodeError:  # orjson writes at most 254 levels
        try:
            return json.dumps(raw, default=str, ensure_ascii=False)
        except RecursionError:
            return "(a row nested too deeply to be written here)"


def _json_line(entry: dict) -> str:
    """One rejects line. orjson writes a record's raw text ten times faster than json (a run whose
    records are too long rejects megabytes); it refuses lone surrogates, which json escapes."""
    try:
        return orjson.dumps(entry).decode() + "\n"
    except orjson.JSONEncodeError:
        return json.dumps(entry, ensure_ascii=False, separators=(",", ":")) + "\n"


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

    def __init__(self, path: str, max_rejects: int | None = None, resumed: dict[str, int] | None = None) -> None:
        """`resumed`: the rejects (by reason) a killed run wrote to `path`, which this one goes on from."""
        self.path = path
        self.max_rejects = max_rejects
        self.by_reason: dict[str, int] = dict(resumed or {})
        self.count = sum(self.by_reason.values())
        # backslashreplace: a lone surrogate of a record (quoted in a message) becomes its JSON escape
        self._file = open(path, "a" if resumed is not None else "w", encoding="utf-8", errors="backslashreplace")

    def add(self, entries: list[dict]) -> None:
        for entry in entries:
            self._file.write(_json_line(entry))
            self.by_reason[entry["reason"]] = self.by_reason.get(entry["reason"], 0) + 1
            self.count += 1
            if self.count <= self.SHOWN:
                print(f"rejected {entry['file']}:{entry['record']}: {entry['message']}", file=sys.stderr)
        if self.max_rejects is not None and self.count > self.max_rejects:
            raise TooManyRejects(
                f"more than --max-rejects {self.max_rejects} rejected records; last: "
                f"{entries[-1]['file']}:{entries[-1]['record']}: {entries[-1]['message']}"
            )

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
        if self.count > self.SHOWN:
            print(f"... and {self.count - self.SHOWN:,} more rejected records", file=sys.stderr)

    def summary(self) -> dict:
        return {"count": self.count, "by_reason": dict(sorted(self.by_reason.items()))}
