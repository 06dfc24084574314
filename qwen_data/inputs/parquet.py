"""Parquet files one row group at a time, only the columns a step reads."""

from __future__ import annotations

from typing import Iterator

from ..errors import InputFileError
from .arrow import one_line, pyarrow_error, slices
from .chunks import Chunk
from .files import InputFile


def parquet_file(path: str):
    import pyarrow.parquet as pq

    try:
        return pq.ParquetFile(path)
    except Exception as exc:
        if not pyarrow_error(exc):
            raise
        raise InputFileError(f"{path}: not readable as parquet ({one_line(exc)})") from None


def parquet_chunks(source: InputFile, groups, chunk_bytes: int, columns: list[str] | None) -> Iterator[Chunk]:
    pf = parquet_file(source.path)
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
            if not pyarrow_error(exc):
                raise
            raise InputFileError(f"{source.path}: row group {g} (counting from 0; rows {firsts[g]:,} to "
                                 f"{firsts[g + 1] - 1:,}): not readable as parquet ({one_line(exc)})") from None
        group = metadata.row_group(g)
        on_disk = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
        for first, piece in slices(table, chunk_bytes):
            yield Chunk(source.path, firsts[g] + first, table=piece, row_group=g, group_first=firsts[g],
                        input_bytes=on_disk * piece.num_rows // max(1, table.num_rows))


def row_group_offsets(path: str) -> list[int]:
    """Where each row group begins in the file: its first column chunk's first page."""
    metadata = parquet_file(path).metadata
    offsets = []
    for g in range(metadata.num_row_groups):
        column = metadata.row_group(g).column(0)
        offsets.append(column.dictionary_page_offset if column.has_dictionary_page else column.data_page_offset)
    return offsets
