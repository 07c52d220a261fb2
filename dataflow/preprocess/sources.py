"""Readers that stream documents out of raw inputs through fsspec.

Each reader yields `Record`s in input order: a document, or a bad record with the reason it is bad
(so that the caller counts errors in input order and never depends on timing). Nothing reads a whole
file into memory: JSONL and text are streamed, Parquet is read one row group at a time.
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
import fsspec.compression
import zstandard

from dataflow.errors import InputError

if TYPE_CHECKING:
    from dataflow.preprocess.plan import Unit

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}


@dataclass
class Record:
    """One input record. `index` counts records from the start of its work unit; `text` is None
    when the record is bad, and `error` says why; `id` is None when the input carries none."""

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
    raise InputError(f"{url}: unsupported input type; expected .jsonl/.json (optionally .gz/.zst), "
                     f".parquet or .txt (optionally .gz/.zst)")


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
                raise InputError(f"{item}: no such file or directory")
    if not found:
        raise InputError(f"{item}: matched no input files")
    return [f if protocol in ("file", "local") else fs.unstrip_protocol(f) for f in found]


def _is_input(path: str) -> bool:
    try:
        input_kind(path)
        return not os.path.basename(path).startswith((".", "_"))
    except InputError:
        return False


def read_unit(unit: "Unit", text_field: str = "text", id_field: str = "id") -> Iterator[Record]:
    """Every record of one work unit, in order."""
    try:
        if unit.kind == "jsonl":
            yield from _read_jsonl(unit.file, text_field, id_field, unit.start, unit.end)
        elif unit.kind == "parquet":
            yield from _read_parquet(unit.file, text_field, id_field, unit.start, unit.end)
        else:
            yield from _read_text(unit.file)
    except InputError:
        raise
    except (OSError, EOFError) as e:
        raise InputError(f"{unit.file}: cannot read ({type(e).__name__}: {e})") from None
    except Exception as e:  # zstandard and gzip raise their own error types for damaged streams
        if type(e).__module__.split(".")[0] in ("zstandard", "gzip", "zlib", "_compression"):
            raise InputError(f"{unit.file}: damaged compressed stream ({e})") from None
        raise


@contextlib.contextmanager
def _open(url: str, seek: bool = False) -> Iterator[IO[bytes]]:
    """A buffered, line-iterable binary stream of the file's decompressed bytes.

    HTTP files are streamed (block_size=0) unless the caller must seek, which needs range requests.
    """
    _, codec = split_compression(url)
    streaming = url.startswith(("http://", "https://")) and not seek
    with fsspec.open(url, "rb", **({"block_size": 0} if streaming else {})) as raw:
        if codec == "zstd":
            reader = zstandard.ZstdDecompressor().stream_reader(raw, read_across_frames=True)
            with io.BufferedReader(reader, buffer_size=1 << 20) as f:
                yield f
        elif codec is None:
            yield raw
        else:
            with fsspec.compression.compr[codec](raw, mode="rb") as f:
                yield f


def _read_jsonl(url: str, text_field: str, id_field: str, start: int, end: int | None) -> Iterator[Record]:
    """Lines whose first byte lies in [start, end)."""
    with _open(url, seek=start > 0) as f:
        pos = 0
        if start > 0:
            f.seek(start - 1)
            pos = start - 1
        lines = _lines(f)
        if start > 0:
            pos += len(next(lines, b""))  # skip the line that began in the previous unit
        index = 0
        for raw in lines:
            if end is not None and pos >= end:
                break
            pos += len(raw)
            yield _parse_json_line(raw, index, text_field, id_field)
            index += 1


def _lines(f: IO[bytes], chunk: int = 1 << 20) -> Iterator[bytes]:
    """Lines (with their newline) from a binary stream read in large chunks: works on streams that
    cannot seek back, as fsspec's readline needs to."""
    rest = b""
    while block := f.read(chunk):
        parts = (rest + block).split(b"\n")
        rest = parts.pop()
        for line in parts:
            yield line + b"\n"
    if rest:
        yield rest


def _parse_json_line(raw: bytes, index: int, text_field: str, id_field: str) -> Record:
    try:
        obj = json.loads(raw)
    except (UnicodeDecodeError, ValueError) as e:
        reason = "empty line" if not raw.strip() else f"invalid JSON ({e})"
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


def _read_parquet(url: str, text_field: str, id_field: str, first: int, stop: int | None) -> Iterator[Record]:
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
        index = 0
        for g in range(first, pf.num_row_groups if stop is None else stop):
            table = pf.read_row_group(g, columns=columns)
            texts = table.column(text_field).to_pylist()
            ids = table.column(id_field).to_pylist() if id_field in names else [None] * len(texts)
            for text, doc_id in zip(texts, ids):
                doc_id = None if doc_id is None else str(doc_id)
                if not isinstance(text, str):
                    kind = "null" if text is None else type(text).__name__
                    yield Record(index, doc_id, None, f"field {text_field!r} is {kind}, not a string")
                else:
                    yield _checked(Record(index, doc_id, text))
                index += 1


def _read_text(url: str) -> Iterator[Record]:
    """One document per text file: the file is the unit of the document, so it is read whole."""
    with _open(url) as f:
        raw = f.read()
    try:
        yield Record(0, None, raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        yield Record(0, None, None, f"undecodable bytes (not UTF-8 at byte {e.start})")
