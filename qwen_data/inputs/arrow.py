"""Arrow IPC files (stream or file format: `datasets` caches, Feather v2) record batch by record
batch, and what parquet shares with them: pyarrow's errors told as the file's, tables cut in slices."""

from __future__ import annotations

from typing import Iterator

from ..errors import InputFileError
from .chunks import Chunk
from .files import InputFile


def one_line(exc: Exception) -> str:
    return " ".join(str(exc).split())  # pyarrow's reasons may span lines (thrift's)


def pyarrow_error(exc: Exception) -> bool:
    """Whether `exc` is pyarrow's own word on the data (a corrupt page, a file cut short): its IO
    errors are OSErrors of no errno, which would be told as '[Errno None] None'; a real OS error
    (a disk failing, a file removed) has an errno and is told as such."""
    import pyarrow as pa

    return isinstance(exc, pa.ArrowException) or (isinstance(exc, OSError) and exc.errno is None)


def arrow_chunks(source: InputFile, part, chunk_bytes: int, columns: list[str] | None) -> Iterator[Chunk]:
    import pyarrow as pa

    # Read, not memory-mapped: a mapped file cut short while read would end the process (SIGBUS)
    # where a read gives an error naming the file.
    with pa.OSFile(source.path) as f:
        batches = _told(source.path, arrow_batches(pa, f, source.size))
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


def arrow_batches(pa, f, size: int):
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
    """`arrow_batches`, pyarrow's errors told as the file's and the batch's (`pyarrow_error`)."""
    read = -1  # the schema comes first
    try:
        for item in batches:
            yield item
            read += 1
    except Exception as exc:
        if not pyarrow_error(exc):
            raise
        where = f"record batch {read} (counting from 0): " if read >= 0 else ""
        raise InputFileError(f"{path}: {where}not readable as arrow ({one_line(exc)})") from None


def slices(table, chunk_bytes: int):
    """(offset, rows) pieces of about `chunk_bytes`, cut by row count alone (deterministic)."""
    rows = table.num_rows
    per = max(1, rows * chunk_bytes // table.nbytes) if table.nbytes > chunk_bytes else max(rows, 1)
    for offset in range(0, rows, per):
        yield offset, table.slice(offset, per)
