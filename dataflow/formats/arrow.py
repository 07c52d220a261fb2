"""Arrow IPC shards: a `tokens: list<uint16|uint32>` column and an `id: string` column.

Record batches hold about `RECORD_BATCH_TOKENS` tokens so that one decompression serves many
samples. The schema metadata records each batch's document and token counts, so a reader can map a
token offset to its record batch from the footer alone, without decompressing anything.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import queue
import tempfile
import threading
from typing import Iterator

import numpy as np
import pyarrow as pa

from dataflow.errors import FormatError
from dataflow.formats import arrays
from dataflow.formats.arrow_ranges import HEAD_PREFIX, RANGES_KEY, head_length, ranges_text, ranges_width
from dataflow.formats.arrow_columns import LAYOUT_KEY, checked_columns, checked_layout, one_line
from dataflow.formats.hashing import sha256_local
from dataflow.formats.manifest import ShardInfo

RECORD_BATCH_TOKENS = 1 << 18  # 256K tokens (512 KB of uint16, ~350 KB as zstd): a remote reader fetches batches
SOURCE_KEY = b"dataflow.decoded_from"  # in a decoded copy: the sha256 of the compressed shard it came from


def arrow_type(dtype: str) -> pa.DataType:
    return pa.uint16() if dtype == "uint16" else pa.uint32()


def _ipc_options(compression: str, zstd_level: int | None) -> pa.ipc.IpcWriteOptions:
    codec = None
    if compression == "zstd":
        codec = pa.Codec("zstd", compression_level=zstd_level) if zstd_level is not None else "zstd"
    return pa.ipc.IpcWriteOptions(compression=codec)


class ArrowShardFile:
    """One Arrow shard written a record batch at a time: each batch is compressed and written as soon as
    it is added, so a writer holds one record batch, not a shard, and no compression is left for the end.

    The layout (documents and tokens per batch) and each batch's byte range and sha256 (`arrow_ranges.py`)
    belong in the schema metadata, which Arrow writes before the first batch and again in the footer; they
    are only known at the end. The schema therefore carries fixed-width placeholders, sized for the most
    batches a shard can hold, that `commit()` overwrites in both places, padded by spaces (still plain
    JSON). The file is written under a temp name and renamed once complete, so a reader never sees half of it.

    Compression and writing run on a thread of their own, a record batch or two behind `add()` (Arrow
    releases the GIL while it compresses), so the process that produces the documents does not wait for
    zstd; an error there is raised by the next `add()` or by `commit()`.
    """

    def __init__(self, path: str, dtype: str, compression: str, zstd_level: int | None, max_batches: int):
        self.path = path
        self.dtype = dtype
        self.layout: list[list[int]] = []
        self.ranges: list[list] = []  # [offset, length, sha256] of each record batch written
        # "[[docs, tokens], ...]": at most 48 bytes an entry
        self._widths = {LAYOUT_KEY: 2 + 48 * max(max_batches, 1), RANGES_KEY: ranges_width(max_batches)}
        pending = {k: b'"dataflow: ' + k + b' pending"' for k in self._widths}
        self._placeholders = {k: p + b" " * (self._widths[k] - len(p)) for k, p in pending.items()}
        self._schema = pa.schema([("tokens", pa.list_(arrow_type(dtype))), ("id", pa.string())],
                                 metadata=self._placeholders)
        fd, self._tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp",
                                         dir=os.path.dirname(os.path.abspath(path)))
        os.close(fd)
        self._fd = os.open(self._tmp, os.O_RDONLY)  # reads back each batch written, for its sha256
        try:
            self._sink = pa.OSFile(self._tmp, "wb")
            self._writer = pa.ipc.new_file(self._sink, self._schema, options=_ipc_options(compression, zstd_level))
        except BaseException:
            os.close(self._fd)
            os.unlink(self._tmp)
            raise
        self._queue: queue.Queue = queue.Queue(maxsize=2)  # bounded: at most two batches wait for zstd
        self._error: BaseException | None = None
        self._written = (0, 0)  # record batches on disk, and the file's bytes after the last of them
        self._thread = threading.Thread(target=self._write_batches, name="dataflow-shard-writer", daemon=True)
        self._thread.start()

    def add(self, values: np.ndarray, offsets: np.ndarray, ids: pa.Array) -> None:
        """Write documents `values[offsets[i]:offsets[i+1]]` (offsets from 0) with their ids as one record batch.
        The batch keeps references to `values` and `ids` until it is written: they must not change."""
        self._raise_error()
        tokens = pa.ListArray.from_arrays(arrays.numbers(np.asarray(offsets, dtype=np.int32)),
                                          arrays.numbers(values.astype(self.dtype, copy=False)))
        self._queue.put(pa.record_batch([tokens, ids], schema=self._schema))
        self.layout.append([len(ids), int(offsets[-1])])

    def _write_batches(self) -> None:
        while (batch := self._queue.get()) is not None:
            if self._error is None:  # after an error, only drain: add() and commit() raise it
                try:
                    start = self._sink.tell()
                    self._writer.write_batch(batch)
                    end = self._sink.tell()
                    if start == 0:  # the magic and schema message came first
                        start = head_length(os.pread(self._fd, HEAD_PREFIX, 0))
                    data = os.pread(self._fd, end - start, start)
                    self.ranges.append([start, end - start, hashlib.sha256(data).hexdigest()])
                    self._written = (self._written[0] + 1, end)
                except BaseException as e:
                    self._error = e
            self._queue.task_done()

    @property
    def temp_path(self) -> str:
        return self._tmp

    def sync(self) -> tuple[int, int]:
        """Wait until every batch added is written, make the file durable, and return (record batches, bytes)
        on disk: `read_batches(path, bytes)` gives those batches back after a crash."""
        self._queue.join()
        self._raise_error()
        fd = os.open(self._tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return self._written

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    def _finish_writing(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def commit(self) -> tuple[int, str]:
        """Finish the file, fill in the layout, make it durable and rename it into place: (bytes, sha256)."""
        self._finish_writing()
        self._raise_error()
        self._writer.close()
        self._sink.close()
        os.close(self._fd)
        layout = json.dumps(self.layout, separators=(",", ":")).encode()
        fields = {LAYOUT_KEY: layout, RANGES_KEY: ranges_text(layout, self.ranges)}
        for key, text in fields.items():
            if len(text) > self._widths[key]:
                raise RuntimeError(f"{self.path}: {len(self.layout)} record batches overflow the {key.decode()} field")
        with open(self._tmp, "r+b") as f:
            size = os.fstat(f.fileno()).st_size
            # the schema message follows the 8-byte magic and its 8-byte prefix; the footer ends 10 bytes
            # before the end of the file, its length stored just before the closing magic
            head = os.pread(f.fileno(), head_length(os.pread(f.fileno(), HEAD_PREFIX, 0)), 0)
            footer_len = int.from_bytes(os.pread(f.fileno(), 4, size - 10), "little")
            footer_at = size - 10 - footer_len
            footer = os.pread(f.fileno(), footer_len, footer_at)
            for key, text in fields.items():
                placeholder = self._placeholders[key]
                for region, base in ((head, 0), (footer, footer_at)):
                    at = region.find(placeholder)
                    if at < 0 or region.find(placeholder, at + 1) >= 0:
                        raise RuntimeError(f"{self.path}: cannot find the {key.decode()} placeholder of the shard")
                    os.pwrite(f.fileno(), text + b" " * (len(placeholder) - len(text)), base + at)
        size, digest = sha256_local(self._tmp, sync=True)  # the filled-in file, made durable before the rename
        os.chmod(self._tmp, 0o644)  # mkstemp makes 0600; a dataset is meant to be shared
        os.replace(self._tmp, self.path)
        return size, digest

    def abort(self, remove: bool = True) -> None:
        """Stop writing; drop the unfinished file unless `remove` is False."""
        self._finish_writing()
        with contextlib.suppress(Exception):
            self._writer.close()
        with contextlib.suppress(Exception):
            self._sink.close()
        with contextlib.suppress(OSError):
            os.close(self._fd)
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._tmp)


def read_batches(path: str, size: int) -> Iterator[pa.RecordBatch]:
    """The record batches in the first `size` bytes of an Arrow shard, finished or not (`ArrowShardFile.sync`)."""
    with open(path, "rb") as f:
        data = f.read(size)
    if len(data) < size or data[:6] != b"ARROW1":
        raise FormatError(f"{path}: shorter than the {size} bytes recorded, or not an Arrow file")
    # the file format is the stream format after its 8-byte magic; the end of stream marks where to stop
    stream = pa.py_buffer(data[8:] + b"\xff\xff\xff\xff\x00\x00\x00\x00")
    try:
        yield from pa.ipc.open_stream(stream)
    except (pa.ArrowInvalid, OSError) as e:
        raise FormatError(f"{path}: its first {size} bytes are not whole record batches ({e})") from None


class ArrowShard:
    """Random access to one Arrow shard, one record batch at a time.

    Uncompressed shards are memory-mapped and their token arrays are zero-copy views of the file;
    zstd shards decompress one record batch per `batch()` call.
    """

    def __init__(self, path: str, name: str | None = None):
        self.path, self.name = path, name or path  # the file read; the shard as errors name it
        try:
            self._reader = pa.ipc.open_file(pa.memory_map(path, "r"),
                                            options=pa.ipc.IpcReadOptions(use_threads=False))
        except (pa.ArrowException, OSError) as e:
            raise FormatError(f"{self.name}: not a readable Arrow IPC file ({one_line(e)})") from None
        schema = self._reader.schema
        if schema.names[:2] != ["tokens", "id"] or not pa.types.is_list(schema.field(0).type) or not (
                pa.types.is_string(schema.field(1).type) or pa.types.is_large_string(schema.field(1).type)):
            raise FormatError(f"{self.name}: expected columns tokens: list<uint16|uint32> and id: string, found "
                              f"{one_line(schema)}")
        layout = self._layout()
        self.batch_docs = np.array([d for d, _ in layout], dtype=np.int64)
        self.batch_tokens = np.array([t for _, t in layout], dtype=np.int64)
        # token_starts[i] is the offset of batch i's first token in the shard's token stream
        self.token_starts = np.concatenate([[0], np.cumsum(self.batch_tokens)])
        self.doc_starts = np.concatenate([[0], np.cumsum(self.batch_docs)])

    def _layout(self) -> list[list[int]]:
        meta = self._reader.schema.metadata or {}
        if LAYOUT_KEY in meta:
            return checked_layout(meta[LAYOUT_KEY], self._reader.num_record_batches, self.name)
        # Written by another tool: learn the layout the slow way, once.
        out = []
        for i in range(self._reader.num_record_batches):
            _, offsets, _ = self._read(i)
            out.append([len(offsets) - 1, int(offsets[-1])])
        return out

    def metadata(self, key: bytes) -> str | None:
        value = (self._reader.schema.metadata or {}).get(key)
        return value.decode() if value is not None else None

    @property
    def num_batches(self) -> int:
        return len(self.batch_tokens)

    @property
    def num_tokens(self) -> int:
        return int(self.token_starts[-1])

    @property
    def num_documents(self) -> int:
        return int(self.doc_starts[-1])

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """Record batch `i` as (flat tokens, document offsets into them, ids), checked against the layout."""
        values, offsets, ids = self._read(i)
        if (len(offsets) - 1, len(values)) != (self.batch_docs[i], self.batch_tokens[i]):
            raise FormatError(f"{self.name}: record batch {i} holds {len(offsets) - 1} documents / {len(values)} "
                              f"tokens, its layout says {self.batch_docs[i]} / {self.batch_tokens[i]}; the shard "
                              "is damaged (run `dataflow verify`, then re-create it)")
        return values, offsets, ids

    def _read(self, i: int) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        try:
            rb = self._reader.get_batch(i)
        except (pa.ArrowException, OSError) as e:
            raise FormatError(f"{self.name}: record batch {i} is unreadable ({one_line(e)})") from None
        return checked_columns(rb, self.name, i)

    def where(self, i: int) -> str:
        """Record batch `i` in words, for errors."""
        return f"record batch {i}"

    def documents(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every (id, tokens) in stored order."""
        for i in range(self.num_batches):
            values, offsets, ids = self.batch(i)
            for j, doc_id in enumerate(ids.to_pylist()):
                yield doc_id, values[offsets[j]:offsets[j + 1]]


def decode_arrow_shard(src: str, dst: str, source_sha256: str, name: str | None = None) -> int:
    """Write an uncompressed copy of the Arrow shard `src` to `dst`: the same schema, record batches and
    layout (not the source's byte ranges), plus the source's sha256 in the schema metadata (so a reader can tell whose copy it is).
    Readers memory-map the copy, so every process of a machine shares its pages. Returns its size; `name`
    is the shard in errors (default `src`)."""
    try:
        # the system allocator gives each decompressed batch back to the OS at once, where Arrow's default
        # pool would keep it: a loader worker that decodes ahead must not grow by what it decoded
        reader = pa.ipc.open_file(pa.memory_map(src, "r"), options=pa.ipc.IpcReadOptions(use_threads=False),
                                  memory_pool=pa.system_memory_pool())
        meta = {k: v for k, v in (reader.schema.metadata or {}).items() if k != RANGES_KEY}  # the source's ranges
        schema = reader.schema.with_metadata({**meta, SOURCE_KEY: source_sha256.encode()})
        with pa.OSFile(dst, "wb") as sink:
            with pa.ipc.new_file(sink, schema) as writer:
                for i in range(reader.num_record_batches):
                    writer.write_batch(reader.get_batch(i))
    except (pa.ArrowException, OSError) as e:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise  # the disk of the copy is full: the shard is sound
        raise FormatError(f"{name or src}: cannot decode this Arrow shard ({one_line(e)}); run `dataflow verify`") \
            from None
    finally:
        pa.system_memory_pool().release_unused()  # glibc keeps freed memory in its arenas otherwise
    return os.path.getsize(dst)


class ArrowFormat:
    """Arrow IPC shards as a `ShardFormat` (`shard_formats.py`): written a record batch at a time, read one
    record batch at a time from the footer's layout, decoded into an uncompressed copy that names its source."""

    name = "arrow"

    def extension(self, compression: str) -> str:
        return ".arrow"

    def batch_tokens(self) -> int:
        return RECORD_BATCH_TOKENS

    def create(self, path: str, dtype: str, compression: str, zstd_level: int | None,
               shard_size: int) -> ArrowShardFile:
        most = shard_size // (np.dtype(dtype).itemsize * RECORD_BATCH_TOKENS) + 2  # record batches
        return ArrowShardFile(path, dtype, compression, zstd_level, most)

    def open(self, path: str, info: ShardInfo, dtype: np.dtype, name: str,
             decoded_from: str | None = None) -> ArrowShard:
        shard = ArrowShard(path, name)
        if decoded_from is not None and shard.metadata(SOURCE_KEY) != decoded_from:
            raise FormatError(f"{path}: this decoded copy is not of the shard the manifest names ({name}, "
                              f"sha256 {decoded_from[:12]}...); delete it and it is decoded again")
        info.check_holds(name, shard.num_documents, shard.num_tokens)
        return shard

    def decode(self, src: str, dst: str, info: ShardInfo, itemsize: int, name: str | None = None) -> int:
        return decode_arrow_shard(src, dst, info.sha256, name=name)

    def decoded_bound(self, info: ShardInfo) -> int:
        return 2 * info.tokens * 4 + info.documents * 64 + (1 << 20)

    def decoded_estimate(self, info: ShardInfo, itemsize: int) -> int:
        # tokens; per document its offsets and an id of up to ~48 bytes; per record batch its metadata; the
        # file's schema and footer. Measured: 29-34 bytes a document beyond the tokens for ids of ~20
        # characters, and ~1.5 KB a file.
        return itemsize * info.tokens + 56 * info.documents + 1024 * (info.tokens // RECORD_BATCH_TOKENS + 1) + 8192


ARROW = ArrowFormat()
