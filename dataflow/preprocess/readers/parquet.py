"""Parquet inputs: one unit per row group, read column-wise (the text column, and the id column if any).

A row group is sliced into blocks of about BLOCK_BYTES of text without copying it. A text column that is not
of string type is read row by row, each row a bad record saying what it holds (or a string kept as is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.errors import InputError
from dataflow.preprocess.readers import arrays
from dataflow.preprocess.readers.records import BLOCK_BYTES, Block, Record, Span, block_of, checked, missing_errors

if TYPE_CHECKING:
    from dataflow.preprocess.plan import Unit


def spans(file: str, size: int) -> list[Span]:
    """One span per row group, each with the file's row number of its first row."""
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(file)
    try:
        with fs.open(path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
    except (pa.ArrowInvalid, OSError) as e:
        if isinstance(e, FileNotFoundError):
            raise
        raise InputError(f"{file}: not a readable Parquet file ({e}); check the file, or give it the "
                         f"extension of what it holds (.jsonl, .txt)") from None
    out, row, groups = [], 0, max(meta.num_row_groups, 1)
    for g in range(meta.num_row_groups):
        out.append(Span(row, g, g + 1, size // groups))
        row += meta.row_group(g).num_rows
    return out


def first_fields(url: str) -> list[str] | None:
    """The file's columns (None when it is not Parquet: the reader says so with the file's name)."""
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as f:
        try:
            return list(pq.ParquetFile(f).schema_arrow.names)
        except Exception:
            return None


def unit_blocks(unit: "Unit", text_field: str, id_field: str) -> Iterator[Block]:
    """The rows of the unit's row groups, in blocks."""
    for table in read_groups(unit.file, text_field, id_field, unit.start, unit.end):
        yield from table_blocks(table, text_field, id_field)


def read_groups(url: str, text_field: str, id_field: str, first: int, stop: int | None) -> Iterator[pa.Table]:
    """Row groups [first, stop) of a Parquet file, with the text column (and the id column when present)."""
    import pyarrow.parquet as pq

    with fsspec.open(url, "rb") as f:
        try:
            pf = pq.ParquetFile(f)
        except Exception as e:  # pyarrow raises several types for a non-Parquet file
            raise InputError(f"{url}: not a readable Parquet file ({e})") from None
        names = pf.schema_arrow.names
        if text_field not in names:
            raise InputError(f"{url}: no column {text_field!r} (columns: {', '.join(names)})")
        columns = [text_field] + ([id_field] if id_field in names else [])
        for g in range(first, pf.num_row_groups if stop is None else stop):
            yield pf.read_row_group(g, columns=columns)


def table_blocks(table: pa.Table, text_field: str, id_field: str) -> Iterator[Block]:
    """A table of records (a row group, a record batch) in blocks of about BLOCK_BYTES of text."""
    texts = table.column(text_field).combine_chunks()
    ids = table.column(id_field).combine_chunks() if id_field in table.column_names else pa.nulls(len(texts))
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        yield block_of(list(typed_records(texts.to_pylist(), ids.to_pylist(), text_field)))
        return
    ids = id_strings(ids)
    texts = pc.cast(texts, pa.string()) if pa.types.is_large_string(texts.type) else texts
    sizes = np.cumsum(arrays.lengths(texts))
    cuts = np.searchsorted(sizes, np.arange(BLOCK_BYTES, int(sizes[-1]) if len(sizes) else 0, BLOCK_BYTES))
    bounds = [0, *sorted(set(int(c) + 1 for c in cuts)), len(texts)]
    errors = missing_errors(texts, f"field {text_field!r} is null, not a string")
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            yield Block(texts.slice(a, b - a), ids.slice(a, b - a), errors.slice(a, b - a))


def id_strings(ids: pa.Array) -> pa.Array:
    """An id column as strings: integers and strings cast in bulk, another type by str() of each value."""
    if pa.types.is_integer(ids.type) or pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type) \
            or pa.types.is_null(ids.type):
        return pc.cast(ids, pa.string())
    return arrays.strings([None if v is None else str(v) for v in ids.to_pylist()])


def typed_records(texts: list, ids: list, text_field: str) -> Iterator[Record]:
    """Rows of a text column that is not of string type: each one a bad record, or a string (the slow path)."""
    for index, (text, doc_id) in enumerate(zip(texts, ids)):
        doc_id = None if doc_id is None else str(doc_id)
        if not isinstance(text, str):
            kind = "null" if text is None else type(text).__name__
            yield Record(index, doc_id, None, f"field {text_field!r} is {kind}, not a string")
        else:
            yield checked(Record(index, doc_id, text))
