"""Bulk readers: a work unit -> blocks of consecutive records as Arrow arrays, no Python object per record.

JSONL is cut into blocks of whole lines and parsed by pyarrow's JSON reader (C++), reading only the text
and id fields. A block pyarrow cannot read exactly as `json.loads` would (a bad record, a blank line, a
lone surrogate, an id that is neither string nor integer, invalid UTF-8) is parsed again line by line
by `sources.parse_json_line`, so bad records are found, counted and explained exactly as before. Parquet
row groups become blocks by slicing; a text file is one block: its document, then its lines that are not
UTF-8 as bad records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.preprocess.compressed import read_errors
from dataflow.preprocess.sources import Record, open_decompressed, parse_json_line, read_parquet_groups, read_text

if TYPE_CHECKING:
    from dataflow.preprocess.plan import Unit

BLOCK_BYTES = 1 << 21  # input bytes per block: one engine call and one output record batch


@dataclass
class Block:
    """Consecutive records: `texts` (null for a bad record), `ids` (null when the input has none) and
    `errors` (why a record is bad; null for a good one), all of the same length; `positions`, where the
    records are not numbered one after the other (a text file's lines), gives each one's place in its unit;
    `starts`, for JSONL, the byte offset in its (decompressed) file where each record's line begins."""

    texts: pa.Array
    ids: pa.Array
    errors: pa.Array
    positions: np.ndarray | None = None
    starts: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.texts)


def block_of(records: list[Record], placed: bool = False) -> Block:
    """The slow path's records as a block (`placed`: at their own `index`, not one after the other)."""
    return Block(pa.array([r.text for r in records], pa.string()), pa.array([r.id for r in records], pa.string()),
                 pa.array([r.error for r in records], pa.string()),
                 np.array([r.index for r in records], dtype=np.int64) if placed else None)


def read_unit_blocks(unit: "Unit", text_field: str = "text", id_field: str = "id") -> Iterator[Block]:
    """Every record of one work unit, in order, a block at a time."""
    with read_errors(unit.file):
        if unit.data is not None:  # a piece of a compressed stream, decompressed by the main process
            yield from jsonl_blocks(unit.data, text_field, id_field, base=unit.start)
        elif unit.kind == "jsonl":
            with open_decompressed(unit.file, seek=unit.start > 0) as f:
                for pos, chunk in _placed_line_chunks(f, unit.start, unit.end):
                    yield from jsonl_blocks(chunk, text_field, id_field, base=pos)
        elif unit.kind == "parquet":
            for table in read_parquet_groups(unit.file, text_field, id_field, unit.start, unit.end):
                yield from _parquet_blocks(table, text_field, id_field)
        else:
            yield block_of(list(read_text(unit.file)), placed=True)


def _line_chunks(f: IO[bytes], start: int, end: int | None, size: int = BLOCK_BYTES) -> Iterator[bytes]:
    """Blocks of whole lines whose first byte lies in [start, end) (end None: to the end of the stream).

    Each line belongs to the unit its first byte lies in, so units cut anywhere give every line once."""
    return (chunk for _, chunk in _placed_line_chunks(f, start, end, size))


def _placed_line_chunks(f: IO[bytes], start: int, end: int | None, size: int = BLOCK_BYTES) \
        -> Iterator[tuple[int, bytes]]:
    """`_line_chunks`, each with the offset in the stream of its first byte."""
    pos = 0
    rest = b""
    if start > 0:
        first = _first_line_at(f, start, end, size)
        if first is None:
            return
        pos, rest = first
    while True:
        block = f.read(size)
        buf = rest + block if rest else block
        if not buf:
            return
        cut = buf.rfind(b"\n") + 1 if block else len(buf)
        if cut == 0:  # one line longer than a block: read on
            rest = buf
            continue
        chunk, rest = buf[:cut], buf[cut:]
        if end is not None and pos + len(chunk) >= end:
            last = chunk.find(b"\n", max(end - pos - 1, 0))
            yield pos, chunk[:len(chunk) if last < 0 else last + 1]
            return
        yield pos, chunk
        pos += len(chunk)
        if not block:
            return


def _first_line_at(f: IO[bytes], start: int, end: int | None, size: int) -> tuple[int, bytes] | None:
    """(where the first line beginning at or after `start` begins, the bytes read past that point), or None
    when no line begins in [start, end): the line running through `start` began in an earlier unit and
    reaches `end`, so it is all that unit's (the scan stops a block past `end`, not at that line's end)."""
    pos = start - 1
    f.seek(pos)
    while True:
        block = f.read(size)
        if not block:
            return None
        cut = block.find(b"\n")
        if cut >= 0:
            first = pos + cut + 1
            return None if end is not None and first >= end else (first, block[cut + 1:])
        pos += len(block)
        if end is not None and pos >= end:
            return None


def jsonl_blocks(data: bytes, text_field: str, id_field: str, size: int = BLOCK_BYTES, base: int = 0) \
        -> Iterator[Block]:
    """The records of whole JSONL lines in `data` (which starts at byte `base` of its file), BLOCK_BYTES of
    input at a time."""
    start = 0
    while start < len(data):
        stop = data.find(b"\n", min(start + size, len(data)) - 1)
        stop = len(data) if stop < 0 else stop + 1
        yield parse_jsonl(data[start:stop], text_field, id_field, base + start)
        start = stop


def parse_jsonl(chunk: bytes, text_field: str, id_field: str, base: int = 0) -> Block:
    """Whole JSONL lines as a block: pyarrow's reader when it reads them exactly, else line by line."""
    ends = np.flatnonzero(np.frombuffer(chunk, dtype=np.uint8) == 10)
    lines = len(ends) + (not chunk.endswith(b"\n"))
    block = _pyarrow_jsonl(chunk, text_field, id_field, lines)
    if block is not None:
        block.starts = base + np.concatenate([[0], ends + 1])[:lines].astype(np.int64)
        return block
    raws = chunk.splitlines(True)
    block = block_of([parse_json_line(raw, i, text_field, id_field) for i, raw in enumerate(raws)])
    block.starts = base + np.concatenate([[0], np.cumsum([len(raw) for raw in raws])])[:len(raws)].astype(np.int64)
    return block


def _pyarrow_jsonl(chunk: bytes, text_field: str, id_field: str, lines: int) -> Block | None:
    import pyarrow.json as pj

    for id_type in (pa.string(), pa.int64()):
        schema = pa.schema([(text_field, pa.string()), (id_field, id_type)])
        try:
            table = pj.read_json(pa.BufferReader(chunk),
                                 read_options=pj.ReadOptions(use_threads=False, block_size=len(chunk) + 1),
                                 parse_options=pj.ParseOptions(explicit_schema=schema,
                                                               unexpected_field_behavior="ignore"))
            table.validate(full=True)  # the reader does not check that strings are UTF-8
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # try integer ids; then json.loads, line by line
            continue
        if table.num_rows != lines:  # blank lines, or two objects on one line: json.loads says which
            return None
        texts = table.column(text_field).combine_chunks()
        ids = pc.cast(table.column(id_field).combine_chunks(), pa.string())
        return Block(texts, ids, _missing_errors(texts, f"missing field {text_field!r}"))
    return None


def _missing_errors(texts: pa.Array, reason: str) -> pa.Array:
    if not texts.null_count:
        return pa.nulls(len(texts), pa.string())
    return pc.if_else(texts.is_null(), pa.scalar(reason, pa.string()), pa.scalar(None, pa.string()))


def _parquet_blocks(table: pa.Table, text_field: str, id_field: str) -> Iterator[Block]:
    """A row group in blocks of about BLOCK_BYTES of text."""
    texts = table.column(text_field).combine_chunks()
    ids = table.column(id_field).combine_chunks() if id_field in table.column_names else pa.nulls(len(texts))
    if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
        from dataflow.preprocess.sources import parquet_records

        yield block_of(list(parquet_records(texts.to_pylist(), ids.to_pylist(), text_field)))
        return
    if pa.types.is_integer(ids.type) or pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type) \
            or pa.types.is_null(ids.type):
        ids = pc.cast(ids, pa.string())
    else:  # another type: str() of each value, as before
        ids = pa.array([None if v is None else str(v) for v in ids.to_pylist()], pa.string())
    texts = pc.cast(texts, pa.string()) if pa.types.is_large_string(texts.type) else texts
    sizes = np.cumsum(pc.fill_null(pc.binary_length(texts), 0).to_numpy(zero_copy_only=False))
    cuts = np.searchsorted(sizes, np.arange(BLOCK_BYTES, int(sizes[-1]) if len(sizes) else 0, BLOCK_BYTES))
    bounds = [0, *sorted(set(int(c) + 1 for c in cuts)), len(texts)]
    errors = _missing_errors(texts, f"field {text_field!r} is null, not a string")
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            yield Block(texts.slice(a, b - a), ids.slice(a, b - a), errors.slice(a, b - a))
