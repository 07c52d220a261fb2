"""Parquet inputs: one unit per row group, read column-wise (the text column, and the id column if any).

Remote files (`hf://datasets/...`, s3://, https://) are read with as few requests as the format allows, so
that a node does not flood the Hub or a bucket:

- the footer is read once per file by the coordinator while planning (`read_plans` reads many files'
  footers on threads; `spans` and `first_fields` then ask nothing), and once per file per worker: a worker
  keeps its last `MAX_OPEN_FILES` files open (`_open`), so the row groups of one file that reach it in
  several units reuse one footer;
- a row group is read with `pre_buffer=True`, only its text and id columns: pyarrow coalesces the column
  chunks it needs into a few large ranged reads (chunks less than 8 KiB apart become one read), and the
  file is opened with fsspec's `cache_type="none"` so each of those is exactly one request, with no
  read-ahead of columns that are not needed;
- a transient failure (`formats.remote.transient`: 5xx, 408, 429, resets, timeouts) reopens the file and
  reads the row group again, after a jittered backoff, at most `remote.RETRIES` times; the coordinator's
  footer read, a file's first contact, is retried as a manifest's is (`remote.with_retries`), and what still
  fails is one line.

A row group is sliced into blocks of about BLOCK_BYTES of text without copying it. A text column that is not
of string type is read row by row, each row a bad record saying what it holds (or a string kept as is).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

import fsspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from dataflow.debug import cause
from dataflow.errors import DataflowError, InputError
from dataflow.formats import arrays, remote
from dataflow.formats.remote_errors import explain, first_line, read_failed
from dataflow.sources.kind import PARQUET, InputKind, TextFields, text_fields
from dataflow.sources.records import (BLOCK_BYTES, Block, Record, Span, block_of, checked, id_column, id_text,
                                      not_text, null_errors, one_array)

if TYPE_CHECKING:
    import pyarrow.parquet as pq

    from dataflow.sources.records import Unit

MAX_OPEN_FILES = 4  # Parquet files a worker keeps open (each: one handle and its parsed footer)
FOOTER_THREADS = 16  # footers the coordinator reads at once while planning
MAX_PLANS = 100_000  # files whose plan (row counts, columns) the coordinator remembers

# url -> (its `_identity`, its listed size, its spans, its columns): filled while planning, in the coordinator
_plans: OrderedDict[str, tuple[Any, int | None, list[Span], list[str]]] = OrderedDict()
# url -> (pid, what the file was when opened, the open handle, its ParquetFile): a worker's open files
_open: OrderedDict[str, tuple[int, Any, Any, "pq.ParquetFile"]] = OrderedDict()
_lock = threading.Lock()
T = TypeVar("T")


def _local(url: str) -> bool:
    return "://" not in url or url.startswith(("file://", "local://"))


def _identity(url: str) -> Any:
    """What tells one version of a local file from the next (its size and mtime: one stat). None for a remote
    file: asking would cost a request; the coordinator's listed size stands in for it while planning."""
    if _local(url):
        st = os.stat(url.split("://", 1)[-1])
        return st.st_size, st.st_mtime_ns
    return None


def _open_file(url: str) -> tuple[Any, "pq.ParquetFile"]:
    """The file opened for ranged reads: fsspec's `cache_type="none"` makes each read pyarrow asks for one
    request of exactly its bytes (no read-ahead), and `pre_buffer` lets pyarrow coalesce a row group's reads."""
    import pyarrow.parquet as pq

    fs, path = fsspec.core.url_to_fs(url)
    handle = fs.open(path, "rb", cache_type="none")
    try:
        return handle, pq.ParquetFile(handle, pre_buffer=True)
    except BaseException as e:
        handle.close()
        if isinstance(e, (pa.ArrowInvalid, OSError)) and not isinstance(e, FileNotFoundError) \
                and not remote.transient(e):
            raise InputError(f"{url}: not a readable Parquet file ({first_line(e)}); check the file, or give it the "
                             f"extension of what it holds (.jsonl, .txt)") from None
        raise


def _plan(url: str, size: int | None) -> tuple[list[Span], list[str]]:
    """One span per row group (each with the file's row number of its first row), and the file's columns;
    the footer is read once per version of the file (`_identity` and listed size; `size` None: any size)."""
    identity = _identity(url)
    with _lock:
        known = _plans.get(url)
    if known is not None and known[0] == identity and size in (None, known[1]):
        return known[2], known[3]
    meta, names = _footer(url)
    out, row, groups = [], 0, max(meta.num_row_groups, 1)
    for g in range(meta.num_row_groups):
        out.append(Span(row, g, g + 1, (size or 0) // groups))
        row += meta.row_group(g).num_rows
    with _lock:
        _plans[url] = (identity, size, out, names)
        _plans.move_to_end(url)
        while len(_plans) > MAX_PLANS:
            _plans.popitem(last=False)
    return out, names


def _footer(url: str) -> tuple["pq.FileMetaData", list[str]]:
    """The file's footer (row groups) and columns. A remote footer is the file's first contact: retried on
    transient failures as a manifest is (`remote.with_retries`: a 503, a read cut short); what still fails
    is one line."""
    def read() -> tuple["pq.FileMetaData", list[str]]:
        handle, pf = _open_file(url)
        with handle:
            return pf.metadata, list(pf.schema_arrow.names)

    if _local(url):
        return read()
    try:
        return remote.with_retries(url, read)
    except DataflowError:
        raise
    except Exception as e:  # noqa: BLE001  (the backends' own types: aiohttp's, botocore's, ...)
        raise explain(url, e) or read_failed(url, e) from cause(e)


def read_plans(files: list[str], sizes: list[int], threads: int = FOOTER_THREADS) -> None:
    """Read the footers of many Parquet files on `threads` threads (planning thousands of remote files one
    footer at a time waits one round trip after another); `spans` then answers from what was read."""
    todo = [(f, s) for f, s in zip(files, sizes) if f.lower().endswith(".parquet")]
    if len(todo) > 1:
        with ThreadPoolExecutor(min(threads, len(todo)), thread_name_prefix="dataflow-footers") as pool:
            list(pool.map(lambda fs: _plan(*fs), todo))


def spans(file: str, size: int, unit_bytes: int = 0) -> list[Span]:
    """One span per row group, each with the file's row number of its first row (whatever `unit_bytes`)."""
    return _plan(file, size)[0]


def first_fields(url: str) -> list[str] | None:
    """The file's columns (None when it is not Parquet: the reader says so with the file's name)."""
    try:
        return _plan(url, None)[1]
    except InputError:
        return None


def unit_blocks(unit: "Unit", text: TextFields | str, id_field: str, size: int = BLOCK_BYTES) -> Iterator[Block]:
    """The rows of the unit's row groups, in blocks of about BLOCK_BYTES of text (`size` is JSONL's)."""
    fields = text_fields(text)
    for table in read_groups(unit.file, fields, id_field, unit.start, unit.end):
        yield from table_blocks(table, fields, id_field)


def read_groups(url: str, text: TextFields | str, id_field: str, first: int, stop: int | None) -> Iterator[pa.Table]:
    """Row groups [first, stop) of a Parquet file, with the text columns (and the id column when present)."""
    fields = text_fields(text)
    names = _with_retries(url, lambda: _opened(url).schema_arrow.names)
    for name in fields.names:
        if name not in names:
            raise InputError(f"{url}: no column {name!r} (columns: {', '.join(names)})")
    columns = fields.columns(id_field, id_field in names)
    groups = _with_retries(url, lambda: _opened(url).num_row_groups)
    for g in range(first, groups if stop is None else stop):
        yield _with_retries(url, lambda: _opened(url).read_row_group(g, columns=columns))


def _opened(url: str) -> "pq.ParquetFile":
    """This process's open `url` (its footer read once), kept among its last `MAX_OPEN_FILES` files. A local
    file that changed since is opened again; an entry made by another process (before a fork) is not used."""
    identity = _identity(url)
    entry = _open.get(url)
    if entry is not None and entry[:2] == (os.getpid(), identity):
        _open.move_to_end(url)
        return entry[3]
    _forget(url)
    handle, pf = _open_file(url)
    _open[url] = (os.getpid(), identity, handle, pf)
    while len(_open) > MAX_OPEN_FILES:
        _forget(next(iter(_open)))
    return pf


def _forget(url: str) -> None:
    """Close this process's handle of `url`, if any (one inherited through a fork is only dropped)."""
    entry = _open.pop(url, None)
    if entry is not None and entry[0] == os.getpid():
        entry[2].close()


def _with_retries(url: str, read: Callable[[], T]) -> T:
    """`read()`, again on a reopened file after a transient failure of a remote read (a 429 from the Hub, a
    5xx, a reset), with backoff, at most `remote.RETRIES` attempts; other failures are raised at once."""
    for attempt in range(1, remote.RETRIES + 1):
        try:
            return read()
        except Exception as e:
            if isinstance(e, InputError) or _local(url) or attempt == remote.RETRIES or not remote.transient(e):
                raise
            _forget(url)
            remote.backoff(url, attempt, e)
    raise AssertionError("unreachable")


def table_blocks(table: pa.Table, text: TextFields | str, id_field: str) -> Iterator[Block]:
    """A table of records (a row group, a record batch) in blocks of about BLOCK_BYTES of text, the text
    fields of each record joined into its document."""
    fields = text_fields(text)
    columns = [one_array(table.column(name)) for name in fields.names]
    ids = one_array(table.column(id_field)) if id_field in table.column_names else pa.nulls(table.num_rows)
    if not all(pa.types.is_string(c.type) or pa.types.is_large_string(c.type) for c in columns):
        yield block_of(list(typed_records([c.to_pylist() for c in columns], ids.to_pylist(), fields)))
        return
    ids = id_column(ids)
    columns = [pc.cast(c, pa.string()) if pa.types.is_large_string(c.type) else c for c in columns]
    texts = fields.join(columns)
    sizes = np.cumsum(arrays.lengths(texts))
    cuts = np.searchsorted(sizes, np.arange(BLOCK_BYTES, int(sizes[-1]) if len(sizes) else 0, BLOCK_BYTES))
    bounds = [0, *sorted(set(int(c) + 1 for c in cuts)), len(texts)]
    errors = null_errors(columns, fields.names)
    for a, b in zip(bounds, bounds[1:]):
        if b > a:
            yield Block(texts.slice(a, b - a), ids.slice(a, b - a), errors.slice(a, b - a))


def typed_records(columns: list[list], ids: list, text: TextFields | str) -> Iterator[Record]:
    """Rows of text columns (one list of values per field) not all of string type: each row a bad record
    naming its first field that holds no string, or its document (the slow path)."""
    fields = text_fields(text)
    for index, (values, doc_id) in enumerate(zip(zip(*columns), ids)):
        doc_id = id_text(doc_id)
        bad = next(((name, v) for name, v in zip(fields.names, values) if not isinstance(v, str)), None)
        if bad is not None:
            yield Record(index, doc_id, None, not_text(*bad))
        else:
            yield checked(Record(index, doc_id, fields.separator.join(values)))


def derived_ids(unit: "Unit", block: Block, positions: np.ndarray) -> pa.Array:
    """`file:row`: each record's row in its file (a table's rows, counted from 0)."""
    rows = arrays.numbers(unit.first_row + positions)
    return pc.binary_join_element_wise(arrays.text_scalar(f"{unit.name}:"), pc.cast(rows, pa.string()),
                                       arrays.text_scalar(""))


KIND = InputKind(PARQUET, "row", 0, "columns", spans, first_fields, unit_blocks, derived_ids, read_plans)
