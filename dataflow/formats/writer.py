"""`ShardWriter`: the one writer that both `dataflow tokenize` and users' own pipelines call.

Documents are buffered until a shard holds `shard_size` bytes of tokens, then the shard is encoded,
checksummed and written atomically. Shard boundaries depend only on the documents written, never on
timing, so the same documents always give the same bytes.
"""

from __future__ import annotations

import array
import hashlib
import os
from typing import Any, Iterable

import numpy as np
import pyarrow as pa

from dataflow.errors import ConfigError
from dataflow.formats.arrow import encode_arrow_shard
from dataflow.formats.atomic import atomic_open
from dataflow.formats.manifest import COMPRESSIONS, FORMATS, Manifest, ShardInfo, TokenizerMeta, write_manifest

DEFAULT_SHARD_SIZE = 128 * 1024 * 1024


def parse_size(text: str | int) -> int:
    """'256MB' -> 268435456; plain integers are bytes."""
    if isinstance(text, int):
        return text
    s = text.strip().upper().replace("IB", "B")
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30, "TB": 1 << 40, "B": 1}
    for unit, mult in units.items():
        if s.endswith(unit):
            number = s[: -len(unit)].strip()
            break
    else:
        number, mult = s, 1
    try:
        value = int(float(number) * mult)
    except ValueError:
        raise ConfigError(f"cannot read size {text!r}; write it like 256MB, 1GB or 1048576") from None
    if value <= 0:
        raise ConfigError(f"size {text!r} must be positive")
    return value


def shard_extension(format: str, compression: str) -> str:
    if format == "arrow":
        return ".arrow"
    return ".tar.zst" if compression == "zstd" else ".tar"


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
    def nbytes(self) -> int:
        return len(self.tokens)

    def values(self) -> np.ndarray:
        return np.frombuffer(self.tokens, dtype=self.dtype)

    def offsets(self) -> np.ndarray:
        return np.concatenate([[0], np.cumsum(np.frombuffer(self.token_lengths, dtype=np.int64))])

    def id_array(self) -> pa.Array:
        offsets = np.concatenate([[0], np.cumsum(np.frombuffer(self.id_lengths, dtype=np.int64))])
        return pa.LargeStringArray.from_buffers(len(self), pa.py_buffer(offsets.astype(np.int64)),
                                                pa.py_buffer(bytes(self.ids))).cast(pa.string())


class ShardWriter:
    """Write token documents into shards plus `index.json`.

    >>> with ShardWriter("out", tokenizer_meta=meta) as w:
    ...     w.write([72, 105, 256], id="doc-0")

    The manifest is written when the context exits cleanly (or on `close()`); after an exception
    the finished shards stay on disk but no manifest claims them.
    """

    def __init__(self, out: str, *, tokenizer_meta: TokenizerMeta, format: str = "arrow",
                 compression: str = "zstd", shard_size: int | str = DEFAULT_SHARD_SIZE,
                 zstd_level: int | None = None, provenance: dict[str, Any] | None = None,
                 prefix: str = "shard-", first_index: int = 0):
        if format not in FORMATS:
            raise ConfigError(f"unknown shard format {format!r}; choose one of {', '.join(FORMATS)}")
        if compression not in COMPRESSIONS:
            raise ConfigError(f"unknown compression {compression!r}; choose one of {', '.join(COMPRESSIONS)}")
        self.out = out
        self.meta = tokenizer_meta
        self.dtype = np.dtype(tokenizer_meta.dtype)
        self._max_id = int(np.iinfo(self.dtype).max)  # an array already of `dtype` is in range by construction
        self.format = format
        self.compression = compression
        self.shard_size = parse_size(shard_size)
        self.zstd_level = zstd_level
        self.provenance = provenance or {}
        self.prefix = prefix
        self.next_index = first_index
        self.shards: list[ShardInfo] = []
        self._open = _ShardBuffer(self.dtype)
        self._written_docs = 0
        self._closed = False
        os.makedirs(out, exist_ok=True)

    def write(self, tokens: Iterable[int] | np.ndarray, id: str | None = None) -> ShardInfo | None:
        """Add one document; returns the shard it completed, if this document completed one."""
        arr = np.asarray(tokens)
        if arr.ndim != 1:
            raise ConfigError(f"document {id!r}: tokens must be one-dimensional, got shape {arr.shape}")
        if arr.dtype != self.dtype and arr.size and (arr.min() < 0 or arr.max() > self._max_id):
            raise ConfigError(f"document {id!r}: token ids must lie in [0, {self._max_id}]")
        self._open.add(arr, str(self._written_docs) if id is None else str(id))
        self._written_docs += 1
        if self._open.nbytes >= self.shard_size:
            return self.flush()
        return None

    def fill_count(self, lengths: np.ndarray) -> int:
        """How many of these documents (token counts, in order) go into the open shard: up to and
        including the one that completes it, or all of them."""
        cum = np.cumsum(lengths, dtype=np.int64) * self.dtype.itemsize
        k = int(np.searchsorted(cum, self.shard_size - self._open.nbytes, side="left"))
        return min(k + 1, len(lengths))

    def write_batch(self, values: np.ndarray, offsets: np.ndarray, ids: DocIds) -> list[ShardInfo]:
        """Add many documents at once (`values[offsets[i]:offsets[i+1]]` with `ids` i); the shards are
        exactly those that writing them one by one gives. Returns the shards completed."""
        values = np.asarray(values)
        offsets = np.asarray(offsets, dtype=np.int64)
        if len(offsets) != len(ids) + 1:
            raise ConfigError(f"{len(ids)} ids for {len(offsets) - 1} documents")
        if values.dtype != self.dtype and values.size and (values.min() < 0 or values.max() > self._max_id):
            raise ConfigError(f"token ids must lie in [0, {self._max_id}]")
        lengths = np.diff(offsets)
        done, i = [], 0
        while i < len(lengths):
            end = i + self.fill_count(lengths[i:])
            self._open.add_many(values[offsets[i]:offsets[end]], lengths[i:end], ids.slice(i, end))
            self._written_docs += end - i
            if self._open.nbytes >= self.shard_size:
                done.append(self.flush())
            i = end
        return done

    def flush(self) -> ShardInfo | None:
        """Write the buffered documents as a shard now (no-op when nothing is buffered)."""
        shard = self._open
        if not len(shard):
            return None
        name = f"{self.prefix}{self.next_index:05d}{shard_extension(self.format, self.compression)}"
        values, offsets = shard.values(), shard.offsets()
        if self.format == "arrow":
            data = encode_arrow_shard(values, offsets, shard.id_array(), self.dtype.name, self.compression,
                                      self.zstd_level)
        else:
            from dataflow.formats.tar import encode_tar_shard
            docs = [values[offsets[i]:offsets[i + 1]] for i in range(len(shard))]
            data = encode_tar_shard(docs, shard.id_array().to_pylist(), self.compression, self.zstd_level)
        path = os.path.join(self.out, name)
        with atomic_open(path) as f:
            f.write(data)
        info = ShardInfo(path=name, documents=len(shard), tokens=int(values.size), bytes=len(data),
                         sha256=hashlib.sha256(data).hexdigest())
        self.shards.append(info)
        self.next_index += 1
        del values
        self._open = _ShardBuffer(self.dtype)
        return info

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
