"""The input-kind protocol: what each reader answers for its kind of file, and the text fields it reads.

Every kind of input (`jsonl.py`, `parquet.py`, `text.py`, `datasets_folder.py`) describes itself with one
`InputKind`: how its files are cut into units, what fields a file's first record has, how a unit is read as
blocks, how a record without an id is named, and the words a person reads about it (a record's place is a
`line` counted from 1 or a `row` counted from 0; its names are `fields` or `columns`). `registry.py` holds
them by name, so no caller asks "which kind is this?" itself.

`TextFields` is the parsed `--text-field`: one field, or several joined by a separator into one document.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

from dataflow.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from dataflow.sources.records import Block, Span, Unit

JSONL, PARQUET, TEXT, DATASETS = "jsonl", "parquet", "text", "datasets"
# a `datasets` folder's kind was called "arrow" before, the shard format's name too: still understood
FORMER_NAMES = {"arrow": DATASETS}
DEFAULT_SEPARATOR = "\n\n"  # between the fields of a record joined into one document: a paragraph break


@dataclass(frozen=True)
class TextFields:
    """The fields that hold a record's text, in order, and what goes between them (`title,text` ->
    title + separator + text). A record lacking one of them, or holding something other than a string in
    one, is a bad record naming that field, as with a single field."""

    names: tuple[str, ...] = ("text",)
    separator: str = DEFAULT_SEPARATOR

    def join(self, columns: "list[pa.Array]") -> "pa.Array":
        """The document texts of string columns, one per field (null where any field is null)."""
        if len(columns) == 1:
            return columns[0]
        import pyarrow as pa
        import pyarrow.compute as pc

        return pc.binary_join_element_wise(*columns, pa.scalar(self.separator, pa.string()))

    def columns(self, id_field: str, with_id: bool = True) -> list[str]:
        """The columns a reader reads: the text fields, then the id field (once, when it is not one of them)."""
        return list(self.names) + ([id_field] if with_id and id_field not in self.names else [])


def text_fields(text: "str | TextFields") -> TextFields:
    """A reader's text argument as `TextFields`: a plain string is one field of that name, commas and all
    (only `parse_text_fields`, the command line's parser, splits a list)."""
    return text if isinstance(text, TextFields) else TextFields((text,))


def parse_text_fields(value: str, separator: str = DEFAULT_SEPARATOR) -> TextFields:
    """`--text-field title,text` -> TextFields(("title", "text"), separator); one `ConfigError` line for an
    empty name or a name given twice."""
    names = tuple(name.strip() for name in value.split(","))
    if not all(names):
        raise ConfigError(f"--text-field {value!r}: an empty field name; name each field, separated by commas "
                          f"(e.g. --text-field title,text)")
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"--text-field {value!r} names {', '.join(map(repr, twice))} twice; name each field once")
    return TextFields(names, separator)


def separator_arg(value: str) -> str:
    r"""A separator as typed on a command line: `\n`, `\t`, `\r` and `\\` stand for what they name (a shell
    passes a real newline awkwardly), anything else is itself."""
    out, i = [], 0
    while i < len(value):
        pair = value[i:i + 2]
        if pair in ("\\n", "\\t", "\\r", "\\\\"):
            out.append({"\\n": "\n", "\\t": "\t", "\\r": "\r", "\\\\": "\\"}[pair])
            i += 2
        else:
            out.append(value[i])
            i += 1
    return "".join(out)


@dataclass(frozen=True)
class InputKind:
    """One kind of input file, as the run sees it (see the module)."""

    name: str
    position: str  # what a record's place in a file is called: "line" or "row"
    counted_from: int  # the first record's place: lines from 1, rows from 0
    fields_word: str  # what a record's names are called: "fields" or "columns"
    spans: "Callable[[str, int, int], list[Span]]"  # (file, size, unit_bytes): the file's units, in order
    first_fields: "Callable[[str], list[str] | None]"  # the first record's names (None: none to name)
    unit_blocks: "Callable[[Unit, TextFields, str, int], Iterator[Block]]"  # (unit, text, id field, block bytes)
    derived_ids: "Callable[[Unit, Block, np.ndarray], pa.Array]"  # ids named after each record's place
    read_ahead: "Callable[[list[str], list[int]], None] | None" = None  # many files' plans at once, while planning

    def place(self, record: int) -> dict[str, int]:
        """Where record `record` (counted from 0 in its file) is, as the error log says it: {"line": 8}."""
        return {self.position: record + self.counted_from}
