"""Text inputs (`.txt`, plain or compressed): one file, one document, its id the file's name.

A line that is not UTF-8 is left out of the document and comes as a bad record of its own, placed at that
line (from 0): one bad byte costs its line, not the file. A file none of whose lines can be kept gives no
document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

import numpy as np
import pyarrow as pa

from dataflow.formats import arrays
from dataflow.sources.compressed import open_decompressed
from dataflow.sources.kind import TEXT, InputKind, TextFields
from dataflow.sources.records import BLOCK_BYTES, Block, Record, Span, block_of

if TYPE_CHECKING:
    from dataflow.sources.records import Unit


def spans(file: str, size: int, unit_bytes: int) -> list[Span]:
    """The whole file: one document is one unit."""
    return [Span(0, 0, None, size)]


def first_fields(url: str) -> None:
    """A text file's document has no fields to name."""
    return None


def unit_blocks(unit: "Unit", text: TextFields | str, id_field: str, size: int = BLOCK_BYTES) -> Iterator[Block]:
    """The file's document and its bad lines, as one block placed at their lines (there are no fields)."""
    yield block_of(list(read_text(unit.file)), placed=True)


def read_text(url: str) -> Iterator[Record]:
    """The file's document (index 0), then a bad record for each line that is not UTF-8."""
    with open_decompressed(url) as f:
        raw = f.read()
    try:
        yield Record(0, None, raw.decode("utf-8"))
        return
    except UnicodeDecodeError:
        pass
    kept, bad = [], []
    for number, line in enumerate(raw.split(b"\n")):  # a line end is ASCII: no UTF-8 character spans one
        try:
            kept.append(line.decode("utf-8"))
        except UnicodeDecodeError as e:
            bad.append(Record(number, None, None, f"undecodable bytes (not UTF-8 at byte {e.start} of the line); "
                                                  f"the line is left out of the file's document"))
    if any(kept):
        yield Record(0, None, "\n".join(kept))
    yield from bad


def derived_ids(unit: "Unit", block: Block, positions: np.ndarray) -> pa.Array:
    """`file`: the file's one document is named after it."""
    return arrays.repeated(unit.name, len(block))


KIND = InputKind(TEXT, "line", 1, "fields", spans, first_fields, unit_blocks, derived_ids)
