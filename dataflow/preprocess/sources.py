"""Readers that stream documents out of raw inputs through fsspec.

Listing inputs, opening them decompressed, and the per-record parsing that `blocks` falls back on for a
block with a bad record: a `Record` is a document, or a bad record with the reason it is bad (so that
the caller counts errors in input order and never depends on timing).
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Iterator

import fsspec

from dataflow.errors import ConfigError, InputError, InputNotFoundError
from dataflow.preprocess.compressed import decompressed, read_errors

if TYPE_CHECKING:
    import pyarrow as pa

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
INPUT_TYPES = ".jsonl/.json/.ndjson or .txt, optionally .gz/.zst/.bz2/.xz, or .parquet"


@dataclass
class Record:
    """One input record. `index` counts records from the start of its work unit (in a text file: the line a
    record starts at, from 0); `text` is None when the record is bad, and `error` says why; `id` is None when
    the input carries none."""

    index: int
    id: str | None
    text: str | None
    error: str | None = None


def split_compression(url: str) -> tuple[str, str | None]:
    """('data.jsonl', 'zstd') for 'data.jsonl.zst'."""
    for suffix, codec in COMPRESSION_SUFFIXES.items():
        if url.endswith(suffix):
            return url[: -len(suffix)], codec
    return url, None


def input_kind(url: str) -> str:
    base, _ = split_compression(url.lower())
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(".parquet"):
        return "parquet"
    if base.endswith(TEXT_SUFFIXES):
        return "text"
    raise InputNotFoundError(f"{url}: unsupported input type; expected {INPUT_TYPES}")


def expand_inputs(inputs: list[str]) -> list[str]:
    """Paths, globs, directories and URLs -> a sorted, de-duplicated list of input files."""
    files: list[str] = []
    for item in inputs:
        try:
            files += _expand_one(item)
        except (OSError, ValueError) as e:
            raise InputError(f"{item}: cannot list or open ({type(e).__name__}: {e})") from None
    seen, out = set(), []
    for f in files:
        if f not in seen:
            seen.add(f)
            out.append(f)
    return out


def _expand_one(item: str) -> list[str]:
    fs, _, paths = fsspec.get_fs_token_paths(item)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    found: list[str] = []
    if glob.has_magic(item):
        found = sorted(fs.glob(paths[0]) if len(paths) == 1 else paths)
    else:
        for p in paths:
            if fs.isdir(p):
                found += sorted(f for f in fs.find(p) if _is_input(f))
            elif fs.exists(p):
                found.append(p)
            else:
                raise InputNotFoundError(f"{item}: no such file or directory; check the path")
    if not found:
        raise InputNotFoundError(f"{item}: matched no input files; check the path or pattern (inputs: {INPUT_TYPES})")
    return [f if protocol in ("file", "local") else fs.unstrip_protocol(f) for f in found]


def _is_input(path: str) -> bool:
    try:
        input_kind(path)
        return not os.path.basename(path).startswith((".", "_"))
    except ConfigError:
        return False


@contextlib.contextmanager
def open_decompressed(url: str, seek: bool = False) -> Iterator[IO[bytes]]:
    """A buffered, line-iterable binary stream of the file's decompressed bytes. A compressed file that ends
    early, or any error reading it, is an `InputError` naming it (also when raised by the caller's reads).

    HTTP files are streamed (block_size=0) unless the caller must seek, which needs range requests.
    """
    _, codec = split_compression(url)
    streaming = url.startswith(("http://", "https://")) and not seek
    with read_errors(url), fsspec.open(url, "rb", **({"block_size": 0} if streaming else {})) as raw:
        if codec is None:
            yield raw
        else:
            with decompressed(raw, codec, url) as stream, io.BufferedReader(stream, buffer_size=1 << 20) as f:
                yield f


def first_record_fields(url: str, kind: str) -> list[str] | None:
    """The fields of a file's first record (a Parquet file's columns); None when it has none to name
    (a text file, an empty file, or a first line that is not a JSON object: a bad record, counted later)."""
    import pyarrow.parquet as pq

    if kind == "parquet":
        with fsspec.open(url, "rb") as f:
            try:
                return list(pq.ParquetFile(f).schema_arrow.names)
            except Exception:  # not Parquet: the reader says so with the file's name
                return None
    if kind != "jsonl":
        return None
    with open_decompressed(url) as f:  # read, not readline: a streamed HTTP file cannot seek back
        line = b""
        while b"\n" not in line and (block := f.read(1 << 16)):
            line += block
    line = line.split(b"\n", 1)[0]
    try:
        obj = json.loads(line)
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return list(obj) if isinstance(obj, dict) else None


def parse_json_line(raw: bytes, index: int, text_field: str, id_field: str) -> Record:
    """One JSONL line as a record, or as a bad record saying why (the slow path, for blocks with one)."""
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        reason = "empty line" if not raw.strip() else f"invalid JSON ({e})"
        return Record(index, None, None, reason)
    except RecursionError:
        reason = "JSON nested too deeply to parse"
        return Record(index, None, None, reason)
    if not isinstance(obj, dict):
        return Record(index, None, None, "not a JSON object")
    doc_id = obj.get(id_field)
    doc_id = None if doc_id is None else str(doc_id)
    text = obj.get(text_field)
    if text is None:
        return Record(index, doc_id, None, f"missing field {text_field!r}")
    if not isinstance(text, str):
        return Record(index, doc_id, None, f"field {text_field!r} is {type(text).__name__}, not a string")
    return _checked(Record(index, doc_id, text))


def _checked(rec: Record) -> Record:
    """Reject text that cannot be UTF-8 encoded (lone surrogates from JSON escapes)."""
    try:
        rec.text.encode("utf-8")
    except UnicodeEncodeError as e:
        return Record(rec.index, rec.id, None, f"undecodable text ({e.reason} at character {e.start})")
    return rec


def read_parquet_groups(url: str, text_field: str, id_field: str, first: int, stop: int | None) -> Iterator["pa.Table"]:
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


def parquet_records(texts: list, ids: list, text_field: str) -> Iterator[Record]:
    """Rows of a text column that is not of string type: each one a bad record, or a string (the slow path)."""
    for index, (text, doc_id) in enumerate(zip(texts, ids)):
        doc_id = None if doc_id is None else str(doc_id)
        if not isinstance(text, str):
            kind = "null" if text is None else type(text).__name__
            yield Record(index, doc_id, None, f"field {text_field!r} is {kind}, not a string")
        else:
            yield _checked(Record(index, doc_id, text))


def read_text(url: str) -> Iterator[Record]:
    """A text file as one document: the whole file, its id the file's name. A line that is not UTF-8 is left out
    of the document and comes as a bad record of its own, placed at that line (`index`, from 0): one bad byte
    costs its line, not the file. A file none of whose lines can be kept gives no document."""
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
