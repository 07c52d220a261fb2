"""The readers of `dataflow tokenize`: input files -> work units -> blocks of records, one module per input kind.

The coordinator lists the inputs (`expand_inputs`, `input_kind`), asks each kind how its files are cut into
units (`spans`) and what fields a file's first record has (`first_record_fields`); a worker reads one unit
as blocks of consecutive records (`read_unit_blocks`). Everything a kind knows lives in its own module:

- `jsonl.py`: `.jsonl/.json/.ndjson`, byte ranges of a plain file, parsed in bulk by pyarrow;
- `parquet.py`: Parquet, one unit per row group;
- `text.py`: `.txt`, one document per file;
- `datasets_folder.py`: a Hugging Face `datasets` folder (`save_to_disk`), whole record batches per unit;
- `compressed.py`: any of them compressed (checked: a cut file is an error), and `pieces.py`, the
  coordinator's cut of one compressed JSONL stream into pieces for the workers, made by a process of its own
  that starts before the tokenizer loads (`cut_process.py`, `read_bundles`).

`listing.py` names files and kinds, and refuses what no reader reads before any work (`not_inputs.py`); `records.py` holds the `Block` every reader yields; Arrow arrays are
built through `dataflow.formats.arrays`, which never wakes pandas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from dataflow.sources import datasets_folder, jsonl, parquet, text
from dataflow.sources.compressed import read_errors
from dataflow.sources.cut_process import Reading, read_bundles
from dataflow.sources.listing import expand_inputs, input_kind, split_compression
from dataflow.sources.pieces import (compressed_file, expand, pieces, splits_into_pieces,
                                                workers_read_whole)
from dataflow.sources.records import BLOCK_BYTES, Block, Span

if TYPE_CHECKING:
    from dataflow.sources.records import Unit

__all__ = ["Block", "Reading", "Span", "compressed_file", "expand", "expand_inputs", "first_record_fields", "input_kind",
           "pieces", "read_bundles", "read_unit_blocks", "spans", "split_compression", "splits_into_pieces",
           "workers_read_whole"]

_KINDS = {"jsonl": jsonl, "parquet": parquet, "text": text, "arrow": datasets_folder}


def read_unit_blocks(unit: "Unit", text_field: str = "text", id_field: str = "id",
                     jsonl_block: int = BLOCK_BYTES) -> Iterator[Block]:
    """Every record of one work unit, in order, a block at a time (`jsonl_block` bytes of JSONL input: less for
    a reader of the first records only); a read error is one `InputError` line."""
    with read_errors(unit.file):
        if unit.kind == "jsonl":
            yield from jsonl.unit_blocks(unit, text_field, id_field, jsonl_block)
        else:
            yield from _KINDS[unit.kind].unit_blocks(unit, text_field, id_field)


def spans(file: str, kind: str, size: int, unit_bytes: int) -> list[Span]:
    """How one input file is cut into work units (in order), by its kind's reader."""
    if kind == "jsonl":
        return jsonl.spans(file, size, unit_bytes)
    if kind == "parquet":
        return parquet.spans(file, size)
    if kind == "arrow":
        return datasets_folder.spans(file, size, unit_bytes)
    return [Span(0, 0, None, size)]


def first_record_fields(url: str, kind: str) -> list[str] | None:
    """The fields of a file's first record (a Parquet file's columns); None when it has none to name
    (a text file, an empty file, or a first line that is not a JSON object: a bad record, counted later)."""
    if kind == "parquet":
        return parquet.first_fields(url)
    if kind == "jsonl":
        return jsonl.first_fields(url)
    if kind == "arrow":
        return datasets_folder.first_fields(url)
    return None
