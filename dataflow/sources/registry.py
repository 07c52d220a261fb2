"""Every input kind by name (`KINDS`), and what the run asks of a file or unit through its kind.

The coordinator and the workers never branch on a kind's name: they ask here, and here asks the kind's
`InputKind` (`kind.py`). A kind's former name (`arrow`, for a `datasets` folder) is still understood.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import pyarrow.compute as pc

from dataflow.sources import datasets_folder, jsonl, parquet, text
from dataflow.sources.compressed import read_errors
from dataflow.sources.kind import FORMER_NAMES, InputKind, TextFields, text_fields
from dataflow.sources.records import BLOCK_BYTES

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from dataflow.sources.records import Block, Span, Unit

KINDS: dict[str, InputKind] = {k.name: k for k in (jsonl.KIND, parquet.KIND, text.KIND, datasets_folder.KIND)}


def kind_of(name: str) -> InputKind:
    """The input kind named `name` (as `input_kind` names a file, or by its former name)."""
    return KINDS[FORMER_NAMES.get(name, name)]


def read_unit_blocks(unit: "Unit", text_field: "str | TextFields" = "text", id_field: str = "id",
                     jsonl_block: int = BLOCK_BYTES) -> "Iterator[Block]":
    """Every record of one work unit, in order, a block at a time (`jsonl_block` bytes of JSONL input: less for
    a reader of the first records only); `text_field`: one field's name, or the parsed `TextFields` of several
    joined; a read error is one `InputError` line."""
    with read_errors(unit.file):
        yield from kind_of(unit.kind).unit_blocks(unit, text_fields(text_field), id_field, jsonl_block)


def spans(file: str, kind: str, size: int, unit_bytes: int) -> "list[Span]":
    """How one input file is cut into work units (in order), by its kind's reader."""
    return kind_of(kind).spans(file, size, unit_bytes)


def first_record_fields(url: str, kind: str) -> list[str] | None:
    """The fields of a file's first record (a Parquet file's columns); None when it has none to name
    (a text file, an empty file, or a first line that is not a JSON object: a bad record, counted later)."""
    return kind_of(kind).first_fields(url)


def read_ahead(files: list[str], kinds: list[str], sizes: list[int]) -> None:
    """Let each kind read what its planning needs of many files at once (Parquet footers on threads),
    before `spans` asks file by file."""
    for kind in KINDS.values():
        if kind.read_ahead is not None:
            mine = [i for i, k in enumerate(kinds) if kind_of(k) is kind]
            kind.read_ahead([files[i] for i in mine], [sizes[i] for i in mine])


def place(kind: str, record: int) -> dict[str, int]:
    """Where record `record` (from 0) of a file of this kind is, as the error log writes it: `{"line": 8}`
    (JSONL, text: lines from 1) or `{"row": 7}` (Parquet, a `datasets` folder: rows from 0)."""
    return kind_of(kind).place(record)


def fields_word(kind: str) -> str:
    """What a record's names are called in this kind's files: "fields" (JSONL) or "columns" (tables)."""
    return kind_of(kind).fields_word


def default_ids(unit: "Unit", block: "Block", positions: "np.ndarray") -> "pa.Array":
    """The block's ids, a record that carries none named after its place, as its kind names it (`file@byte`,
    `file:row`, `file`): all known to the worker that reads the record, whatever the cut of the input."""
    ids = block.ids
    if not ids.null_count:
        return ids
    return pc.if_else(ids.is_null(), kind_of(unit.kind).derived_ids(unit, block, positions), ids)
