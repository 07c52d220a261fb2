"""Hugging Face `datasets` folders (`Dataset.save_to_disk`), read with pyarrow alone (no `datasets` import).

Such a folder holds Arrow IPC *stream* files `data-0000K-of-0000N.arrow`, a `state.json` whose `_data_files`
lists them in stored order, and a `dataset_info.json`. Its records are read in that order, a record batch at
a time, only the text and id columns, and become blocks like Parquet row groups (`parquet.table_blocks`).
A local file is cut into units of whole record batches (found by walking the memory-mapped stream, which
touches only the batches' headers); a remote one is one unit. A `DatasetDict` folder (`dataset_dict.json`
and one folder per split) is refused with one line naming its splits: tokenize one split at a time.
"""

from __future__ import annotations

import json
import posixpath
from typing import IO, TYPE_CHECKING, Iterator

import fsspec
import pyarrow as pa

from dataflow.errors import ConfigError, InputError
from dataflow.formats.remote_errors import first_line
from dataflow.sources import parquet
from dataflow.sources.kind import DATASETS, InputKind, TextFields, text_fields
from dataflow.sources.records import BLOCK_BYTES, Block, Span

if TYPE_CHECKING:
    from dataflow.sources.records import Unit

STATE = "state.json"
DICT = "dataset_dict.json"
METADATA = {STATE, DICT, "dataset_info.json"}
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"
SAVE_AGAIN = "the folder is incomplete or damaged; save it again with `save_to_disk`"


def data_files(fs: fsspec.AbstractFileSystem, folder: str) -> list[str]:
    """The Arrow files of a `save_to_disk` folder, in the order its state.json lists them. A file listed twice
    is read twice: `datasets.load_from_disk` reads such a folder so (save_to_disk never writes one)."""
    state_path = posixpath.join(folder, STATE)
    try:
        with fs.open(state_path, "rb") as f:
            entries = json.load(f)["_data_files"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise InputError(f"{state_path}: not a `datasets` state file ({type(e).__name__}: {first_line(e)}); "
                         f"{SAVE_AGAIN}") from None
    if not isinstance(entries, list):
        raise InputError(f"{state_path}: its _data_files is not a list of files; {SAVE_AGAIN}")
    listed = [_filename(state_path, entry) for entry in entries]
    files = [posixpath.join(folder, name) for name in listed]
    for name, path in zip(listed, files):
        if "/" in name or name in ("", ".", "..") or not fs.isfile(path):
            raise InputError(f"{state_path} lists {name!r}, which is not a file in {folder}; {SAVE_AGAIN}")
    if not files:
        raise InputError(f"{state_path} lists no data files; {SAVE_AGAIN}")
    return files


def _filename(state_path: str, entry: object) -> str:
    """One `_data_files` entry's file name: `{"filename": "data-00000-of-00001.arrow"}`."""
    name = entry.get("filename") if isinstance(entry, dict) else None
    if not isinstance(name, str):
        shown = json.dumps(entry, default=str)
        shown = shown if len(shown) <= 200 else shown[:197] + "..."
        raise InputError(f"{state_path} lists the data file {shown}, not {{\"filename\": NAME}} with a string NAME; "
                         f"{SAVE_AGAIN}")
    return name


def refuse_dict(fs: fsspec.AbstractFileSystem, folder: str) -> None:
    """A DatasetDict folder: say which splits it holds and how to tokenize one."""
    try:
        with fs.open(posixpath.join(folder, DICT), "rb") as f:
            splits = [str(s) for s in json.load(f)["splits"]]
    except (ValueError, KeyError, TypeError):
        splits = []
    example = posixpath.join(folder, splits[0] if splits else "train")
    raise ConfigError(f"{folder}: a `datasets` DatasetDict folder (splits: {', '.join(splits) or 'unknown'}); "
                      f"tokenize one split at a time, e.g. {example} (use --val-fraction for a val split)")


def spans(file: str, size: int, unit_bytes: int) -> list[Span]:
    """Units of whole record batches, at most `unit_bytes` of the file each (a larger batch alone)."""
    fs, _ = fsspec.core.url_to_fs(file)
    if not _is_local(fs):
        return [Span(0, 0, None, size)]
    out: list[Span] = []
    first = first_row = row = start = 0  # the open unit: its first batch, its first row, its first byte
    with _opened(file) as (source, reader):
        batch_start = source.tell()
        for n, batch in enumerate(_batches(file, reader, source)):
            batch_end = source.tell()
            if n > first and batch_end - start > unit_bytes:  # batch n would overflow the open unit
                out.append(Span(first_row, first, n, batch_start - start))
                first, first_row, start = n, row, batch_start
            row += batch.num_rows
            batch_start = batch_end
    out.append(Span(first_row, first, None, max(size - start, 0)))
    return out


def first_fields(url: str) -> list[str] | None:
    """The file's columns."""
    with _opened(url) as (_, reader):
        return list(reader.schema.names)


def unit_blocks(unit: "Unit", text: TextFields | str, id_field: str, size: int = BLOCK_BYTES) -> Iterator[Block]:
    """The records of the unit's record batches [start, end), the text and id columns only (`size` is JSONL's)."""
    fields = text_fields(text)
    with _opened(unit.file) as (source, reader):
        names = reader.schema.names
        for name in fields.names:
            if name not in names:
                raise InputError(f"{unit.file}: no column {name!r} (columns: {', '.join(names)}); pass "
                                 f"--text-field with the one that holds the text")
            kind = reader.schema.field(name).type
            if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
                raise InputError(f"{unit.file}: column {name!r} holds {kind}, not strings; pass --text-field "
                                 f"with a string column")
        columns = fields.columns(id_field, id_field in names)
        for n, batch in enumerate(_batches(unit.file, reader, source)):
            if unit.end is not None and n >= unit.end:
                return
            if n >= unit.start:
                yield from parquet.table_blocks(pa.Table.from_batches([batch.select(columns)]), fields, id_field)


class _opened:
    """(source, stream reader) of an Arrow stream file: memory-mapped when local, else through fsspec."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._file: IO[bytes] | None = None

    def __enter__(self) -> tuple[IO[bytes], pa.ipc.RecordBatchStreamReader]:
        fs, path = fsspec.core.url_to_fs(self.url)
        self._file = pa.memory_map(path, "r") if _is_local(fs) else fs.open(path, "rb")
        try:
            return self._file, pa.ipc.open_stream(self._file)
        except (pa.ArrowException, ValueError, OSError) as e:
            self._file.close()
            raise _damaged(self.url, e) from None

    def __exit__(self, *exc: object) -> None:
        if self._file is not None:
            self._file.close()


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return "file" in fs.protocol or "local" in fs.protocol


def _batches(url: str, reader: pa.ipc.RecordBatchStreamReader, source: IO[bytes]) -> Iterator[pa.RecordBatch]:
    """The stream's record batches; a damaged stream, or a local one cut between two batches (it lacks the
    end-of-stream marker every writer ends with), is one `InputError` line."""
    while True:
        try:
            yield reader.read_next_batch()
        except StopIteration:
            break
        except (pa.ArrowException, ValueError, OSError) as e:
            raise _damaged(url, e) from None
    if isinstance(source, pa.MemoryMappedFile) and source.size() >= 8:
        source.seek(source.size() - 8)
        if source.read(8) != END_OF_STREAM:
            raise InputError(f"{url}: the Arrow stream ends without its end marker, after {source.size()} bytes; "
                             f"{SAVE_AGAIN}")


def _damaged(url: str, e: Exception) -> InputError:
    return InputError(f"{url}: not a readable Arrow stream ({type(e).__name__}: {first_line(e)}); {SAVE_AGAIN}")


KIND = InputKind(DATASETS, "row", 0, "columns", spans, first_fields, unit_blocks, parquet.derived_ids)
