"""`ShardWriter`: the one writer that both `dataflow tokenize` and users' own pipelines call.

Documents are buffered until a shard holds `shard_size` bytes of tokens, then the shard is encoded,
checksummed and written atomically. Shard boundaries depend only on the documents written, never on
timing, so the same documents always give the same bytes.
"""

from __future__ import annotations

import array
import os
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from dataflow.errors import ConfigError, FormatError
from dataflow.formats.manifest import COMPRESSIONS, FORMATS, Manifest, ShardInfo, TokenizerMeta, write_manifest
from dataflow.formats.shard_formats import ShardSink, shard_format
from dataflow.sizes import parse_size  # noqa: F401  (callers import it from here too)

DEFAULT_SHARD_SIZE = 128 * 1024 * 1024
MAX_SHARD_SIZE = 8 << 30  # the layout of an Arrow shard is a fixed-width field sized for its record batches
ZSTD_LEVELS = range(-(1 << 17), 23)  # zstd's own range, ZSTD_minCLevel() to ZSTD_maxCLevel(); 0 means its default, 3


def check_zstd_level(level: int | None, name: str = "zstd_level") -> None:
    """Refuse a zstd level zstd does not have (`name`: the argument or flag as the caller knows it); None is
    the default level. The one check behind both `ShardWriter` and `dataflow tokenize --zstd-level`."""
    if level is None:
        return
    if isinstance(level, bool) or not isinstance(level, int) or level not in ZSTD_LEVELS:
        raise ConfigError(f"{name} {level!r}: zstd levels run from 1 (fast) to 22 (small), and down to "
                          f"{ZSTD_LEVELS.start} (faster still, larger); pass one of those")


def check_shard_size(shard_size: int | str, name: str = "shard_size") -> int:
    """`shard_size` in bytes (an int, or text like '256MB'), or a `ConfigError` naming `name` and the range."""
    if isinstance(shard_size, bool) or not isinstance(shard_size, (int, str)):
        raise ConfigError(f"{name} {shard_size!r}: pass a number of bytes, or a size like 256MB")
    try:
        size = parse_size(shard_size)
    except ConfigError as e:
        hint = "" if "write it like" in str(e) else "; pass a size like 128MB"
        raise ConfigError(f"{name}: {e}{hint}") from None
    if size > MAX_SHARD_SIZE:
        raise ConfigError(f"{name} {shard_size}: above the {MAX_SHARD_SIZE >> 30}GB a shard may hold; pass a "
                          f"smaller size (shards of a few hundred MB stream and resume best)")
    return size


def shard_extension(format: str, compression: str) -> str:
    """The end of a shard's file name in this format and compression (".arrow", ".tar.zst")."""
    return shard_format(format).extension(compression)


def _string_array(offsets: np.ndarray, data: bytes) -> pa.Array:
    """A pyarrow string array from offsets (from 0) into UTF-8 bytes."""
    if len(data) < 1 << 31:
        return pa.StringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data))
    return pa.LargeStringArray.from_buffers(len(offsets) - 1, pa.py_buffer(offsets.astype(np.int64)),
                                            pa.py_buffer(data)).cast(pa.string())


class DocIds:
    """Document ids as UTF-8 bytes laid end to end plus offsets: many ids without a Python object each."""

    def __init__(self, data: bytes, offsets: np.ndarray):
        self.data, self.offsets = data, offsets

    @classmethod
    def from_arrow(cls, ids: pa.Array) -> "DocIds":
        """From a pyarrow string array without nulls (sliced or not)."""
        if ids.null_count:
            raise ValueError("document ids must not be null")
        ids = ids.cast(pa.string())
        offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32)[ids.offset:ids.offset + len(ids) + 1]
        data = ids.buffers()[2]
        return cls(data[int(offsets[0]):int(offsets[-1])].to_pybytes() if len(ids) else b"",
                   (offsets - offsets[0]).astype(np.int64))

    @classmethod
    def from_list(cls, ids: list[str]) -> "DocIds":
        return cls.from_arrow(pa.array(ids, pa.string()))

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def arrow(self) -> pa.Array:
        """As a pyarrow string array."""
        return _string_array(self.offsets, self.data)

    def slice(self, start: int, stop: int) -> "DocIds":
        lo, hi = int(self.offsets[start]), int(self.offsets[stop])
        return DocIds(self.data[lo:hi], self.offsets[start:stop + 1] - lo)


class _ShardBuffer:
    """The documents of the shard being filled, packed into four flat buffers.

    A list of small arrays and strings costs ~150 bytes of Python objects per document on top of its
    tokens; for short documents that, not `shard_size`, would set the memory of a run.
    """

    def __init__(self, dtype: np.dtype):
        self.dtype = dtype
        self.tokens, self.ids = bytearray(), bytearray()
        self.token_lengths, self.id_lengths = array.array("q"), array.array("q")

    def add(self, tokens: np.ndarray, doc_id: str) -> None:
        self.tokens += memoryview(np.ascontiguousarray(tokens, dtype=self.dtype)).cast("B")
        key = doc_id.encode()
        self.ids += key
        self.token_lengths.append(len(tokens))
        self.id_lengths.append(len(key))

    def add_many(self, values: np.ndarray, lengths: np.ndarray, ids: "DocIds") -> None:
        """Append documents laid end to end in `values` (`lengths` tokens each) in one go."""
        self.tokens += memoryview(np.ascontiguousarray(values, dtype=self.dtype)).cast("B")
        self.ids += ids.data
        self.token_lengths.frombytes(np.ascontiguousarray(lengths, dtype=np.int64).tobytes())
        self.id_lengths.frombytes(np.diff(ids.offsets).astype(np.int64).tobytes())

    def __len__(self) -> int:
        return len(self.token_lengths)

    @property
    def ntokens(self) -> int:
        return len(self.tokens) // self.dtype.itemsize

    def values(self) -> np.ndarray:
        return np.frombuffer(self.tokens, dtype=self.dtype)

    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(np.frombuffer(self.token_lengths, dtype=np.int64))])

    def id_array(self) -> pa.Array:
        offsets = np.concatenate([[0], np.cumsum(np.frombuffer(self.id_lengths, dtype=np.int64))])
        return _string_array(offsets, bytes(self.ids))


def _check_arguments(meta: TokenizerMeta, format: str, compression: str, zstd_level: int | None, prefix: str,
                     first_index: int) -> None:
    """Refuse `ShardWriter` arguments that cannot work now, one `ConfigError` line each, rather than an
    error from deep inside a shard write later (or a manifest no reader accepts)."""
    if format not in FORMATS:
        raise ConfigError(f"format {format!r}: unknown shard format; choose one of {', '.join(FORMATS)}")
    if compression not in COMPRESSIONS:
        raise ConfigError(f"compression {compression!r}: unknown; choose one of {', '.join(COMPRESSIONS)}")
    check_zstd_level(zstd_level)
    if zstd_level is not None and compression != "zstd":
        raise ConfigError(f"zstd_level {zstd_level} goes with compression='zstd', not {compression!r}; drop one "
                          f"of the two")
    if not isinstance(meta, TokenizerMeta):
        raise ConfigError(f"tokenizer_meta: a {type(meta).__name__}, not a TokenizerMeta; pass the tokenizer's "
                          f"own (e.g. load_tokenizer(...).meta)")
    try:  # the checks every reader makes of a manifest: a writer must not produce one they refuse
        Manifest(tokenizer=meta, format=format, compression=compression, dtype=meta.dtype).validate("tokenizer_meta")
    except FormatError as e:
        raise ConfigError(f"{e}; pass the metadata of the tokenizer that made the tokens") from None
    if not isinstance(prefix, str) or "/" in prefix or os.sep in prefix:
        raise ConfigError(f"prefix {prefix!r}: shard names start with it, so it must be text without a path "
                          f"separator; pass the folder as `out`")
    if isinstance(first_index, bool) or not isinstance(first_index, int) or first_index < 0:
        raise ConfigError(f"first_index {first_index!r}: the number of the first shard must be an integer >= 0")


class ShardWriter:
    """Write token documents into shards plus `index.json`.

    >>> with ShardWriter("out", tokenizer_meta=meta) as w:
    ...     w.write([72, 105, 256], id="doc-0")

    Documents go to the shard's format (`ShardFormat.create`) a record batch at a time: the writer holds the
    documents of one record batch (`batch_tokens()` of them), and an Arrow shard compresses each batch as soon
    as it is full. A tar shard is one batch: its documents are encoded whole when it is complete.
    The manifest is written when the context exits cleanly (or on `close()`); after an exception
    the finished shards stay on disk but no manifest claims them.
    """

    def __init__(self, out: str, *, tokenizer_meta: TokenizerMeta, format: str = "arrow",
                 compression: str = "zstd", shard_size: int | str = DEFAULT_SHARD_SIZE,
                 zstd_level: int | None = None, provenance: dict[str, Any] | None = None,
                 prefix: str = "shard-", first_index: int = 0):
        _check_arguments(tokenizer_meta, format, compression, zstd_level, prefix, first_index)
        self.out = out
        self.meta = tokenizer_meta
        self.dtype = np.dtype(tokenizer_meta.dtype)
        self._vocab_size = int(tokenizer_meta.vocab_size)  # every id below it, refused here and not at read time
        self.format = format
        self._format = shard_format(format)
        self.compression = compression
        self.shard_size = check_shard_size(shard_size)
        self.zstd_level = zstd_level
        self.provenance = provenance or {}
        self.prefix = prefix
        self.next_index = first_index
        self.shards: list[ShardInfo] = []
        self._pending = _ShardBuffer(self.dtype)  # the record batch being filled (tar: the whole shard)
        self._file: ShardSink | None = None  # the shard being written
        self._shard_docs = self._shard_tokens = 0  # documents and tokens of the open shard, written or pending
        self._written_docs = 0
        self._closed = False
        os.makedirs(out, exist_ok=True)

    def write(self, tokens: Iterable[int] | np.ndarray, id: str | None = None) -> ShardInfo | None:
        """Add one document; returns the shard it completed, if this document completed one."""
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ConfigError(f"document {id!r}: tokens must be one-dimensional, got shape {arr.shape}")
        self._check_ids(arr, f"document {self._written_docs if id is None else id!r}")
        self._pending.add(arr, str(self._written_docs) if id is None else str(id))
        self._added(1, arr.size)
        if self._shard_tokens * self.dtype.itemsize >= self.shard_size:
            return self.flush()
        if self._pending.ntokens >= self._format.batch_tokens():
            self._write_pending()
        return None

    def _check_ids(self, arr: np.ndarray, what: str) -> None:
        """Refuse ids that are not integers in [0, vocab_size): they would be stored (a float cut to an integer,
        an id past the vocabulary) and every reader would then call the shard damaged."""
        if not arr.size:
            return
        if arr.dtype.kind not in "iu":
            raise ConfigError(f"{what}: token ids must be integers, got an array of {arr.dtype}; pass the ids the "
                              f"tokenizer gave (e.g. numpy uint16/uint32 or a list of int)")
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high >= self._vocab_size:
            bad = low if low < 0 else high
            raise ConfigError(f"{what}: token ids must lie in [0, {self._vocab_size}) (the vocabulary of "
                              f"tokenizer_meta {self.meta.name!r}), got {bad}; pass the metadata of the tokenizer "
                              f"that made the ids")

    def fill_count(self, cum: np.ndarray, i: int) -> int:
        """How many documents from the i-th on go into the open shard: up to and including the one that completes
        it, or all of them. `cum[j]`: the tokens of the documents before the j-th (one cumulative sum a call of
        `write_batch`, searched here, instead of a sum of the rest at every shard and record batch)."""
        room = self.shard_size - self._shard_tokens * self.dtype.itemsize  # bytes
        need = -(-room // self.dtype.itemsize)  # the tokens that reach the room: cum * itemsize >= room
        k = int(np.searchsorted(cum[i + 1:], cum[i] + need, side="left"))
        return min(k + 1, len(cum) - 1 - i)

    def write_batch(self, values: np.ndarray, offsets: np.ndarray, ids: DocIds) -> list[ShardInfo]:
        """Add many documents at once (`values[offsets[i]:offsets[i+1]]` with `ids` i); the shards are
        exactly those that writing them one by one gives. Returns the shards completed."""
        values = np.asarray(values)
        offsets = np.asarray(offsets, dtype=np.int64)
        if len(offsets) != len(ids) + 1:
            raise ConfigError(f"{len(ids)} ids for {len(offsets) - 1} documents")
        self._check_ids(values, "write_batch")
        lengths = np.diff(offsets)
        cum = np.concatenate([np.zeros(1, np.int64), np.cumsum(lengths, dtype=np.int64)])
        done, i = [], 0
        while i < len(lengths):
            end = i + self.fill_count(cum, i)  # or sooner, where a record batch fills up
            k = int(np.searchsorted(cum[i + 1:end + 1], cum[i] + self._format.batch_tokens() - self._pending.ntokens,
                                    side="left"))
            end = min(end, i + k + 1)
            part = values[offsets[i]:offsets[end]]
            if not len(self._pending) and self._pending_would_fill(lengths[i:end]):
                # a copy: the batch is compressed on the writer's thread, after the caller may reuse its array
                self._open_file().add(np.array(part, dtype=self.dtype), offsets[i:end + 1] - offsets[i],
                                      ids.slice(i, end).arrow())
            else:  # pending: copied into the buffer until its record batch (or tar shard) is complete
                self._pending.add_many(part, lengths[i:end], ids.slice(i, end))
                if self._pending.ntokens >= self._format.batch_tokens():
                    self._write_pending()
            self._added(end - i, int(offsets[end] - offsets[i]))
            if self._shard_tokens * self.dtype.itemsize >= self.shard_size:
                done.append(self.flush())
            i = end
        return done

    def _pending_would_fill(self, lengths: np.ndarray) -> bool:
        """Whether these documents complete a record batch by themselves (then they skip the buffer)."""
        return int(lengths.sum()) >= self._format.batch_tokens()

    def _added(self, docs: int, tokens: int) -> None:
        self._written_docs += docs
        self._shard_docs += docs
        self._shard_tokens += tokens

    def _open_file(self) -> ShardSink:
        if self._file is None:
            self._file = self._format.create(os.path.join(self.out, self._next_name()), self.dtype.name,
                                             self.compression, self.zstd_level, self.shard_size)
        return self._file

    def _write_pending(self) -> None:
        """The buffered documents as the next record batch of the open shard."""
        self._open_file().add(self._pending.values(), self._pending.offsets(), self._pending.id_array())
        self._new_pending()

    def _new_pending(self) -> None:
        self._pending = _ShardBuffer(self.dtype)

    def _next_name(self) -> str:
        return f"{self.prefix}{self.next_index:05d}{shard_extension(self.format, self.compression)}"

    def flush(self) -> ShardInfo | None:
        """Finish the open shard now (no-op when it holds nothing)."""
        if not self._shard_docs:
            return None
        name = self._next_name()
        if len(self._pending):
            self._write_pending()
        size, sha256 = self._file.commit()
        self._file = None
        info = ShardInfo(path=name, documents=self._shard_docs, tokens=self._shard_tokens, bytes=size, sha256=sha256)
        self.shards.append(info)
        self.next_index += 1
        self._shard_docs = self._shard_tokens = 0
        return info

    def abort(self, remove: bool = True) -> None:
        """Drop the unfinished shard (its temp file, unless `remove` is False: a journal may name it); finished
        shards stay."""
        if self._file is not None:
            self._file.abort(remove)
            self._file = None
        self._new_pending()
        self._shard_docs = self._shard_tokens = 0

    def manifest(self) -> Manifest:
        return Manifest(tokenizer=self.meta, format=self.format, compression=self.compression,
                        dtype=self.dtype.name, shards=list(self.shards), provenance=self.provenance)

    def close(self) -> Manifest:
        """Flush the last shard and write the manifest atomically."""
        if not self._closed:
            self.flush()
            write_manifest(self.out, self.manifest())
            self._closed = True
        return self.manifest()

    def __enter__(self) -> "ShardWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()
