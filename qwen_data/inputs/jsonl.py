"""jsonl files (and any input compressed): a plain file as spans of bytes cut at lines, read where
they are processed; a compressed one or standard input streamed in blocks cut at line ends."""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
import sys
from typing import Iterator

from .._native import newlines
from .chunks import Chunk
from .files import STDIN, InputFile, check_read_whole


TAIL_SPANS = 16  # see `_spans`


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


def open_stream(source: InputFile):
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


def jsonl_chunks(source: InputFile, part, chunk_bytes: int, columns=None) -> Iterator[Chunk]:
    if source.splittable:  # the only kind a shard splits inside: `part` is None below
        yield from _spans(source, part, chunk_bytes)
        return
    stream, counter = open_stream(source)
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
        check_read_whole(source, counter.count)
    if pending:
        yield Chunk(source.path, line, b"".join(pending), input_bytes=counter.count - consumed)


def _spans(source: InputFile, part, chunk_bytes: int) -> Iterator[Chunk]:
    """A plain jsonl file (or a shard's part of it) as spans of `chunk_bytes`, read where they are
    processed. Only a part that starts inside the file needs reading here: its first line's number."""
    start, stop, before = (0, source.size, None) if part is None else part
    first = 1
    if start > 0:
        with open(source.path, "rb") as f:
            first = _seek_line(f, start, before)
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


def newlines_in(path: str, begin: int, end: int) -> int:
    """The newlines in bytes [begin, end) of the file at `path` (what a shard's `newlines_before` sums)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        return newlines(fd, begin, end)
    finally:
        os.close(fd)


def _seek_line(f, start: int, before: int | None = None) -> int:
    """Move `f` to the first line that begins at or after byte `start`; that line's number (`before`: the
    newlines before byte start - 1, where they were counted already; else counted here, in C:
    `_native.newlines`)."""
    if start == 0:
        return 1
    found = newlines(f.fileno(), 0, start - 1) if before is None else before
    f.seek(start - 1)
    if f.read(1) != b"\n":  # inside a line, which belongs to the part holding its first byte
        f.readline()
    return found + 2
