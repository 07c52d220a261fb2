"""What readers take and hand on: the work `Unit` they read, `Block`s of consecutive records as Arrow arrays, and
the `Record` of the slow path.

A reader gives the worker blocks, never a Python object per record, where its input allows. A block that the
bulk path cannot read exactly (a bad record in it) is read again record by record as `Record`s, each a
document or a bad record with the reason it is bad, and turned back into a block (`block_of`), so that bad
records are counted in input order and never depend on timing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.formats import arrays

BLOCK_BYTES = 1 << 21  # input bytes per block: one engine call


@dataclass(frozen=True)
class Unit:
    index: int
    file: str
    kind: str  # jsonl | parquet | text
    name: str = ""  # the file's name in derived ids (relative to the inputs' common folder)
    first_row: int = 0  # Parquet: the file's row number of this unit's first row
    start: int = 0  # byte range for uncompressed JSONL; row-group range for Parquet
    end: int | None = None
    size: int = 0  # input bytes this unit covers (for progress)
    # a piece of a compressed JSONL stream (see readers/pieces.py): its number, its decompressed bytes (`start`: where
    # they begin in the decompressed stream) in a spill file the worker deletes or carried as `data`, whether
    # it is the stream's last, and how many compressed bytes were read up to its end
    piece: int = -1
    data: bytes | None = field(default=None, repr=False, compare=False)
    spill: str = ""
    last: bool = True
    read: int = 0
    skip: int = 0  # a compressed JSONL file sent whole to a worker: its pieces before this one are committed

    def without_data(self) -> "Unit":
        """This unit without the bytes of a piece (what travels back from a worker)."""
        return replace(self, data=None) if self.data is not None else self

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "data"}


@dataclass
class Record:
    """One input record. `index` counts records from the start of its work unit (in a text file: the line a
    record starts at, from 0); `text` is None when the record is bad, and `error` says why; `id` is None when
    the input carries none."""

    index: int
    id: str | None
    text: str | None
    error: str | None = None


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
    return Block(arrays.strings([r.text for r in records]), arrays.strings([r.id for r in records]),
                 arrays.strings([r.error for r in records]),
                 np.array([r.index for r in records], dtype=np.int64) if placed else None)


def checked(rec: Record) -> Record:
    """Reject text that cannot be UTF-8 encoded (lone surrogates from JSON escapes)."""
    try:
        rec.text.encode("utf-8")
    except UnicodeEncodeError as e:
        return Record(rec.index, rec.id, None, f"undecodable text ({e.reason} at character {e.start})")
    return rec


def not_text(field: str, value: Any) -> str:
    """Why a record whose text field is there holds no text, naming what it holds: `field 'text' is null, not
    a string` (JSON null, an Arrow null), `... is a number, not a string`, a list, an object, a boolean (a
    field that is not there at all is `missing field 'text'`, a reader's own reason)."""
    return f"field {field!r} is {value_kind(value)}, not a string"


def value_kind(value: Any) -> str:
    """A value's kind as JSON names it (`null`, `a number`, `a list`, ...), else its Python type's name."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    kinds = ((int, "a number"), (float, "a number"), (str, "a string"), ((list, tuple), "a list"), (dict, "an object"))
    return next((name for types, name in kinds if isinstance(value, types)), type(value).__name__)


def id_text(value: Any) -> str | None:
    """A record's id as stored: a string as it is, anything else by its JSON text (`true`, `{"k": "v"}`,
    `[1, 2]`; numbers as written, `7`, `2.5`), whichever reader it came from; a value JSON cannot hold (a
    date, bytes) by its str(), also inside a list or an object. None: the record has no id (one is derived)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, (bool, int, float, list, tuple, dict)):
        return str(value)
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError, RecursionError):  # keys JSON cannot hold, a structure that holds itself
        return str(value)


def one_array(column: pa.ChunkedArray) -> pa.Array:
    """A table's column as one array: its only chunk as it is (combine_chunks copies even one chunk: 0.6 CPU-s
    per GB of JSONL), else the chunks joined."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def id_column(ids: pa.Array) -> pa.Array:
    """An Arrow column of ids as strings, named as `id_text` names each value: strings and integers cast in
    bulk, booleans as `true`/`false`, any other type value by value."""
    kind = ids.type
    if pa.types.is_integer(kind) or pa.types.is_string(kind) or pa.types.is_large_string(kind) \
            or pa.types.is_null(kind):
        return pc.cast(ids, pa.string())
    if pa.types.is_boolean(kind):
        return pc.if_else(ids, arrays.text_scalar("true"), arrays.text_scalar("false"))
    return arrays.strings([id_text(v) for v in ids.to_pylist()])


def null_errors(columns: list[pa.Array], names: tuple[str, ...]) -> pa.Array:
    """Why each record read in bulk is bad, null for a good one: the first of its text fields (`names`, one
    column each) that is null, named (`field 'title' is null, not a string`)."""
    errors = pa.nulls(len(columns[0]), pa.string())
    for column, name in reversed(list(zip(columns, names))):  # the first field named wins: it is set last
        if column.null_count:
            errors = pc.if_else(column.is_null(), arrays.text_scalar(not_text(name, None)), errors)
    return errors


class Span(NamedTuple):
    """One work unit's share of a file, as a reader cuts it: `start`/`end` (a byte range of JSONL, a range of
    Parquet row groups or of record batches; end None: to the end), `first_row` (the file's row number of the
    span's first row, for ids named by row) and `size` (the input bytes it covers, for progress and bundling)."""

    first_row: int
    start: int
    end: int | None
    size: int
