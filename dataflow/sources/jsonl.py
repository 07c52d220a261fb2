"""JSONL inputs (`.jsonl/.json/.ndjson`, plain or compressed): a unit's lines -> blocks, in bulk.

Lines are cut into blocks of whole lines and parsed by pyarrow's JSON reader (C++), reading only the text
and id fields. A block pyarrow cannot read exactly as `json.loads` would (a bad record, a null or missing
text, a lone surrogate, an id that is neither string nor integer, invalid UTF-8) is parsed again line by line
(`parse_json_line`), so bad records are found, counted and explained exactly as before. A blank line (empty,
or only whitespace) holds no record, as pyarrow's and `datasets`' JSON readers read it: it keeps its place
(null text, no error: no document, no bad record), so the lines after it keep their numbers.

An uncompressed file larger than a unit is cut into byte ranges; each line belongs to the unit its first
byte lies in, so units cut anywhere give every line once. A compressed file is one unit, cut into pieces
of its decompressed stream by the coordinator (`pieces.py`); a piece arrives as a spill file (or with its bytes).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
from typing import IO, TYPE_CHECKING, Iterator

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.formats import arrays
from dataflow.sources.compressed import open_decompressed
from dataflow.sources.kind import JSONL, InputKind, TextFields, text_fields
from dataflow.sources.listing import split_compression
from dataflow.sources.records import (BLOCK_BYTES, Block, Record, Span, block_of, checked, id_column, id_text,
                                      not_text, one_array)

if TYPE_CHECKING:
    from dataflow.sources.records import Unit

LINE_TAIL = 1 << 16  # bytes read past a unit's end at a time, to find where its last line ends
_JSON_WHITESPACE = np.array([9, 10, 13, 32], dtype=np.uint8)  # what a blank line may hold


def spans(file: str, size: int, unit_bytes: int) -> list[Span]:
    """Byte ranges of `unit_bytes` for an uncompressed file that can be entered anywhere; else the whole file."""
    fs, path = fsspec.core.url_to_fs(file)
    if split_compression(file)[1] is None and size > unit_bytes and _supports_ranges(fs, path):
        return [Span(0, start, min(start + unit_bytes, size), min(start + unit_bytes, size) - start)
                for start in range(0, size, unit_bytes)]
    return [Span(0, 0, None, size)]


def _supports_ranges(fs, path: str) -> bool:
    """Local and object stores seek; a plain HTTP server may not answer range requests."""
    if "http" not in fs.protocol:
        return True
    try:
        with fs.open(path, "rb", block_size=2) as f:
            f.seek(1)
            return len(f.read(1)) == 1
    except (ValueError, OSError):
        return False


def unit_blocks(unit: "Unit", text: TextFields | str, id_field: str, size: int = BLOCK_BYTES) -> Iterator[Block]:
    """The records of one unit, `size` bytes of input a block: a piece's bytes (in a spill file, or carried),
    or a byte range of the file."""
    fields = text_fields(text)
    if unit.spill:  # a piece of a compressed stream, decompressed by the main process into a file
        with _mapped(unit.spill) as data:
            yield from jsonl_blocks(data, fields, id_field, size, base=unit.start)
        return
    if unit.data is not None:
        yield from jsonl_blocks(unit.data, fields, id_field, size, base=unit.start)
        return
    with open_decompressed(unit.file, seek=unit.start > 0) as f:
        for pos, chunk in _placed_line_chunks(f, unit.start, unit.end, size):
            yield from jsonl_blocks(chunk, fields, id_field, size, base=pos)


@contextlib.contextmanager
def _mapped(path: str) -> Iterator[bytes | mmap.mmap]:
    """A local file's bytes, mapped (read in place: no copy); an empty file as b""."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            yield b""
            return
        mapped = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                           prot=mmap.PROT_READ)
    try:
        yield mapped
    finally:
        with contextlib.suppress(BufferError):  # a view still referenced somewhere: the collector closes it
            mapped.close()


def first_fields(url: str) -> list[str] | None:
    """The fields of the file's first record (blank lines before it hold none); None when there is none to
    name (an empty file, or a first record that is not a JSON object: a bad record, counted later)."""
    with open_decompressed(url) as f:  # read, not readline: a streamed HTTP file cannot seek back
        line = b""
        while b"\n" not in line and (block := f.read(1 << 16)):
            line = (line + block).lstrip(b" \t\r\n")
    line = line.split(b"\n", 1)[0]
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return list(obj) if isinstance(obj, dict) else None


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
        block = f.read(_read_size(pos + len(rest), end, size))
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


def _read_size(head: int, end: int | None, size: int) -> int:
    """Bytes to read at stream offset `head`: a block, but no more than the unit still needs (to `end`, and a
    little past it for the line that runs through `end`), so a small unit never reads a whole block."""
    return size if end is None else min(size, max(end - head, 0) + LINE_TAIL)


def _first_line_at(f: IO[bytes], start: int, end: int | None, size: int) -> tuple[int, bytes] | None:
    """(where the first line beginning at or after `start` begins, the bytes read past that point), or None
    when no line begins in [start, end): the line running through `start` began in an earlier unit and
    reaches `end`, so it is all that unit's (the scan stops a block past `end`, not at that line's end)."""
    pos = start - 1
    f.seek(pos)
    while True:
        block = f.read(_read_size(pos, end, size))
        if not block:
            return None
        cut = block.find(b"\n")
        if cut >= 0:
            first = pos + cut + 1
            return None if end is not None and first >= end else (first, block[cut + 1:])
        pos += len(block)
        if end is not None and pos >= end:
            return None


def jsonl_blocks(data: bytes | mmap.mmap, text: TextFields | str, id_field: str, size: int = BLOCK_BYTES,
                 base: int = 0) -> Iterator[Block]:
    """The records of whole JSONL lines in `data` (which starts at byte `base` of its file), BLOCK_BYTES of
    input at a time, each block read in place (an Arrow slice of `data`, not a copy)."""
    fields = text_fields(text)
    whole = pa.py_buffer(data)
    start = 0
    while start < len(data):
        stop = data.find(b"\n", min(start + size, len(data)) - 1)
        stop = len(data) if stop < 0 else stop + 1
        yield parse_jsonl(whole.slice(start, stop - start), fields, id_field, base + start)
        start = stop


def parse_jsonl(chunk: bytes | pa.Buffer, text: TextFields | str, id_field: str, base: int = 0) -> Block:
    """Whole JSONL lines as a block: pyarrow's reader when it reads them exactly, else line by line."""
    fields = text_fields(text)
    raw = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(raw == 10)
    lines = len(ends) + int(len(raw) == 0 or raw[-1] != 10)  # a last line without its newline counts
    block = _pyarrow_jsonl(chunk, fields, id_field, lines)
    if block is not None:
        block.starts = base + np.concatenate([[0], ends + 1])[:lines].astype(np.int64)
        return block
    raws = (chunk.to_pybytes() if isinstance(chunk, pa.Buffer) else chunk).splitlines(True)
    block = block_of([parse_json_line(raw, i, fields, id_field) for i, raw in enumerate(raws)])
    block.starts = base + np.concatenate([[0], np.cumsum([len(raw) for raw in raws])])[:len(raws)].astype(np.int64)
    return block


def _pyarrow_jsonl(chunk: bytes | pa.Buffer, text: TextFields, id_field: str, lines: int) -> Block | None:
    import pyarrow.json as pj

    for id_type in (pa.string(), pa.int64()):
        if id_type != pa.string() and id_field in text.names:  # the id is a text field: a string or a bad record
            break
        schema = pa.schema([(name, pa.string()) for name in text.names]
                           + [(name, id_type) for name in text.columns(id_field)[len(text.names):]])
        try:
            table = pj.read_json(pa.BufferReader(chunk),
                                 read_options=pj.ReadOptions(use_threads=False, block_size=len(chunk) + 1),
                                 parse_options=pj.ParseOptions(explicit_schema=schema,
                                                               unexpected_field_behavior="ignore"))
            table.validate(full=True)  # the reader does not check that strings are UTF-8
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):  # try integer ids; then json.loads, line by line
            continue
        columns = [one_array(table.column(name)) for name in text.names]
        if any(column.null_count for column in columns):  # a field missing or null: json.loads tells which
            return None
        texts = text.join(columns)
        ids = id_column(one_array(table.column(id_field)))
        if table.num_rows != lines:  # blank lines (which pyarrow skips), else two objects on one line
            at = _records_at(chunk, lines, table.num_rows)
            if at is None:
                return None  # json.loads says which line is wrong
            texts, ids = texts.take(at), ids.take(at)  # a blank line: neither text nor error
        return Block(texts, ids, pa.nulls(len(texts), pa.string()))
    return None


def _records_at(chunk: bytes | pa.Buffer, lines: int, records: int) -> pa.Array | None:
    """Which of the `records` pyarrow read each of the chunk's `lines` is (null for a blank line: empty or
    only JSON whitespace), when the lines that are not blank are exactly that many; else None."""
    raw = np.frombuffer(chunk, dtype=np.uint8)
    ends = np.flatnonzero(raw == 10)
    starts = np.concatenate([[0], ends + 1])[:lines]
    stops = np.concatenate([ends, [len(raw)]])[:lines]
    filled = np.concatenate([[0], np.cumsum(~np.isin(raw, _JSON_WHITESPACE))])
    held = (filled[stops] - filled[starts]) > 0
    if int(held.sum()) != records:
        return None
    index = np.cumsum(held) - 1
    return pa.array(index, pa.int64(), mask=~held)


def parse_json_line(raw: bytes, index: int, text: TextFields | str, id_field: str) -> Record:
    """One JSONL line as a record, or as a bad record saying why (the slow path, for blocks with one); a
    record of several text fields names the first one missing or not a string."""
    fields = text_fields(text)
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        if not raw.strip(b" \t\r\n"):  # a blank line holds no record: skipped, not a bad one
            return Record(index, None, None)
        return Record(index, None, None, f"invalid JSON ({e})")
    except RecursionError:
        return Record(index, None, None, "JSON nested too deeply to parse")
    if not isinstance(obj, dict):
        return Record(index, None, None, "not a JSON object")
    doc_id = id_text(obj.get(id_field))  # a number, true/false, an object: the id is its JSON text
    for name in fields.names:
        if name not in obj:
            return Record(index, doc_id, None, f"missing field {name!r}")
        if not isinstance(obj[name], str):  # null, a number, a list, ...: named
            return Record(index, doc_id, None, not_text(name, obj[name]))
    return checked(Record(index, doc_id, fields.separator.join(obj[name] for name in fields.names)))


def derived_ids(unit: "Unit", block: Block, positions: np.ndarray) -> pa.Array:
    """`file@byte`: where each record's line starts in its (decompressed) file."""
    return pc.binary_join_element_wise(arrays.text_scalar(f"{unit.name}@"),
                                       pc.cast(arrays.numbers(block.starts), pa.string()), arrays.text_scalar(""))


KIND = InputKind(JSONL, "line", 1, "fields", spans, first_fields, unit_blocks, derived_ids)
