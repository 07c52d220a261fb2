"""Text inputs (`.txt`, plain or compressed): one file, one document, its id the file's name.

A line that is not UTF-8 is left out of the document and comes as a bad record of its own, placed at that
line (from 0): one bad byte costs its line, not the file. A file none of whose lines can be kept gives no
document.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from dataflow.sources.compressed import open_decompressed
from dataflow.sources.records import Block, Record, block_of

if TYPE_CHECKING:
    from dataflow.sources.records import Unit


def unit_blocks(unit: "Unit", text_field: str, id_field: str) -> Iterator[Block]:
    """The file's document and its bad lines, as one block placed at their lines."""
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
