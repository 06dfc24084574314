"""A .json file holding one array of records, streamed element by element: each element's bytes
are a record's line, as a jsonl line is."""

from __future__ import annotations

import re
from typing import Iterator

from ..errors import InputFileError
from .chunks import Chunk
from .files import InputFile, check_read_whole
from .jsonl import open_stream


def json_array_chunks(source: InputFile, part, chunk_bytes: int, columns=None) -> Iterator[Chunk]:
    """A .json array streamed: each element's own bytes are a record's line, parsed in the workers as
    a jsonl line is (numbered by its position in the array)."""
    stream, counter = open_stream(source)
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
        check_read_whole(source, counter.count)
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
