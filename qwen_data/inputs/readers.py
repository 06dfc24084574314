"""Inputs → chunks of whole records: each format's reader (`jsonl`, `json_array`, `parquet`, `arrow`)
over the files a command line names (`files`), and a shard's part of them.

Everything streams: jsonl in blocks cut at line ends, a .json array element by element (each a
line to its chunk, as a jsonl line), parquet one row group at a time (only the
columns asked for), Arrow one record batch at a time; memory does not grow with the file. Each
record keeps its number in its file counting from 1 (the line of a jsonl file, the position in a
.json array, the row of a parquet or Arrow file), and a parquet row also its row group and its
row in that group. Arrow rows become the dicts a jsonl line of the same record parses to: a null
column, or a null field of a struct at any depth, is taken as absent, since Arrow gives every row
each key that any row has (null where it lacks one) and cannot tell an absent key from a null one;
a struct's keys come in the schema's order.

Chunk boundaries depend only on the input and `chunk_bytes`, never on the worker count. With a
`Shard` a run reads a contiguous 1/N of the records of all inputs: the inputs, in order, are laid
end to end as one range of on-disk bytes cut into N equal parts, and every unit — a line of an
uncompressed jsonl file, a parquet row group, any other file whole — belongs to the part holding
its first byte. Shards 0..N-1 read back to back are exactly the unsharded run's records.
"""

from __future__ import annotations

import gzip
import itertools
import lzma
import os
import zlib
from typing import Iterator

from ..errors import InputFileError
from .arrow import arrow_batches, arrow_chunks
from .chunks import DEFAULT_CHUNK_BYTES, Chunk
from .files import STDIN, InputFile, Shard, check_size
from .json_array import json_array_chunks, json_array_elements
from .jsonl import jsonl_chunks, open_stream
from .parquet import parquet_chunks, parquet_file, row_group_offsets


READERS = {"jsonl": jsonl_chunks, "json": json_array_chunks, "parquet": parquet_chunks, "arrow": arrow_chunks}


def read_chunks(sources: list[InputFile], chunk_bytes: int = DEFAULT_CHUNK_BYTES, shard: Shard | None = None,
                columns: list[str] | None = None) -> Iterator[Chunk]:
    """`columns`: the keys the step uses (None: all); parquet and Arrow files read only those."""
    for source, part in shard_parts(sources, shard):
        check_size(source)
        try:
            try:
                yield from READERS[source.kind](source, part, chunk_bytes, columns)
            except Exception:
                check_size(source)  # a file that changed while read is why a reader broke: that is said
                raise
            check_size(source)
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


def shard_parts(sources: list[InputFile], shard: Shard | None) -> Iterator[tuple[InputFile, object]]:
    """Each source with the part of it to read: None for all of it; for a shard, a byte range
    (start, stop, newlines before start or None) of an uncompressed jsonl file (only a shard's first part
    starts inside a file: `Shard.newlines_before` is that count, where known), a list of row groups of a
    parquet file."""
    if shard is None:
        yield from ((source, None) for source in sources)
        return
    if any(s.path == STDIN for s in sources):
        raise ValueError("--shard cannot split standard input")
    total = sum(s.size for s in sources)
    low, high = shard.stretch(total)
    base = 0
    for source in sources:
        start, stop = base, base + source.size
        base = stop
        if source.splittable:
            if start < high and low < stop:  # lines starting in [low, high)
                inside = low > start
                yield source, (max(low, start) - start, min(high, stop) - start,
                               shard.newlines_before if inside else None)
        elif source.kind == "parquet":
            groups = [g for g, offset in enumerate(row_group_offsets(source.path)) if low <= start + offset < high]
            if groups:
                yield source, groups
        elif low <= start < high or (start == stop == total == high):
            yield source, None


def counted_until(sources: list[InputFile], shard: Shard) -> tuple[str, int] | None:
    """Where `shard` starts inside a plain jsonl file: (its path, the byte its `newlines_before` counts up
    to: the one before the start); None where it starts at a file's start, or in a file of another kind."""
    for source, part in shard_parts(sources, shard):
        return (source.path, part[0] - 1) if source.splittable and part[0] > 0 else None
    return None


PROBE_BYTES = 1 << 20  # of a compressed file or .json, decompressed
COUNTED_BYTES = 64 << 20  # a plain jsonl file up to this size has its newlines counted, all of them
PROBES, PROBE_READ = 256, 32 << 10  # a larger one's are counted in as many reads of as many bytes, spread over it


def estimated_records(source: InputFile) -> int | None:
    """About how many records `source` holds: exact for parquet and Arrow (their metadata); a plain
    jsonl file's newlines, all of them up to COUNTED_BYTES, else at PROBES places spread over it (its
    first MB alone overestimated a corpus whose first records were short by 17%, and the sample fell
    short of the 3,000 records it is sized for: 2,974); a compressed jsonl or a .json file's records in
    its first PROBE_BYTES, decompressed; None for standard input. The certificate sizes its sample by
    it (`certify.sample`): deterministic, read in milliseconds. Kept in this process while the file is
    unchanged: a Ray task runs many parts of one file, each asking (~6 ms each time)."""
    if source.path == STDIN:
        return None
    try:
        stat = os.stat(source.path)
    except OSError:  # an unreadable file: the run itself says why, naming it
        return None
    key = (source.path, source.size, stat.st_size, stat.st_mtime_ns, stat.st_ino)
    if key not in _ESTIMATES:
        if len(_ESTIMATES) >= ESTIMATES_KEPT:
            _ESTIMATES.clear()
        _ESTIMATES[key] = _estimated(source)
    return _ESTIMATES[key]


ESTIMATES_KEPT = 1024  # files whose estimate a process keeps (`estimated_records`)
_ESTIMATES: dict[tuple, int | None] = {}


def _estimated(source: InputFile) -> int | None:
    if source.splittable:
        return _spread_estimate(source)
    try:
        if source.kind == "parquet":
            return parquet_file(source.path).metadata.num_rows
        if source.kind == "arrow":
            import pyarrow as pa

            with pa.OSFile(source.path) as f:
                return sum(batch.num_rows for batch, _ in itertools.islice(arrow_batches(pa, f, source.size), 1, None))
        stream, counter = open_stream(source)
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


def _spread_estimate(source: InputFile) -> int | None:
    """A plain jsonl file's lines: counted where it is small, else from the newlines of PROBES reads spread
    evenly over it (an estimate without bias; ±5% on the bench corpora)."""
    try:
        with open(source.path, "rb") as f:
            if source.size <= COUNTED_BYTES:
                lines = sum(block.count(b"\n") for block in iter(lambda: f.read(4 << 20), b""))
                unended = source.size > 0 and os.pread(f.fileno(), 1, source.size - 1) != b"\n"
                return max(1, lines + unended)
            step = (source.size - PROBE_READ) // (PROBES - 1)
            found = sum(os.pread(f.fileno(), PROBE_READ, k * step).count(b"\n") for k in range(PROBES))
    except OSError:  # an unreadable file: the run itself says why, naming it
        return None
    return max(1, round(found * source.size / (PROBES * PROBE_READ)))
