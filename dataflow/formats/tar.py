"""WebDataset tar shards: members `<key>.tokens.npy` and `<key>.json` ({"id": ...}).

A `.tar` shard is readable by `webdataset.WebDataset` as it is; `.tar.zst` is the same tar stream
compressed with zstd. Member headers are normalised (mtime 0, root owner) so bytes are reproducible.
"""

from __future__ import annotations

import io
import json
import re
import tarfile
from typing import IO, Iterator, Sequence

import numpy as np
import zstandard

from dataflow.errors import FormatError
from dataflow.formats.manifest import ShardInfo


def _member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = 0
    info.mode = 0o644
    info.uname = info.gname = "root"
    tar.addfile(info, io.BytesIO(data))


def _npy_bytes(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def encode_tar_shard(docs: Sequence[np.ndarray], ids: Sequence[str], compression: str,
                     zstd_level: int | None = None, key_prefix: str = "") -> bytes:
    """Serialise documents into the bytes of one tar (or tar.zst) shard."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for j, (doc, doc_id) in enumerate(zip(docs, ids)):
            key = f"{key_prefix}{j:09d}"
            _member(tar, f"{key}.tokens.npy", _npy_bytes(doc))
            _member(tar, f"{key}.json", json.dumps({"id": doc_id}).encode())
    data = raw.getvalue()
    if compression == "zstd":
        data = zstandard.ZstdCompressor(level=zstd_level if zstd_level is not None else 3).compress(data)
    return data


def iter_tar_documents(f: IO[bytes], path: str, compressed: bool) -> Iterator[tuple[str, np.ndarray]]:
    """Stream (id, tokens) from an open tar or tar.zst shard without unpacking it to disk."""
    stream = zstandard.ZstdDecompressor().stream_reader(f) if compressed else f
    pending: dict[str, dict[str, bytes]] = {}
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                key, _, ext = member.name.partition(".")
                data = tar.extractfile(member).read() if member.isfile() else b""
                entry = pending.setdefault(key, {})
                entry[ext] = data
                if "tokens.npy" in entry and "json" in entry:
                    del pending[key]
                    tokens = np.load(io.BytesIO(entry["tokens.npy"]), allow_pickle=False)
                    yield json.loads(entry["json"])["id"], tokens
    except (tarfile.TarError, zstandard.ZstdError, ValueError, KeyError, EOFError) as e:
        raise FormatError(f"{path}: damaged tar shard ({type(e).__name__}: {e})") from None
    if pending:
        raise FormatError(f"{path}: tar shard ends with incomplete samples {sorted(pending)[:3]}")


_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=][a-z]\d+)', 'fortran_order': False, 'shape': \((\d+),\), \}")


def parse_tar_documents(data: bytes | memoryview, path: str) -> tuple[list[str], list[np.ndarray]]:
    """(ids, tokens) of a whole uncompressed tar shard held in memory, parsed without `tarfile`.

    The loader's fast path: walks the 512-byte headers directly and views each `.npy` payload with
    `np.frombuffer` (no copy). Falls back to `tarfile` for anything but plain regular members.
    """
    buf = memoryview(data)
    ids: list[str] = []
    docs: list[np.ndarray] = []
    pending: dict[str, np.ndarray] = {}
    pos = 0
    try:
        while pos + 512 <= len(buf):
            header = bytes(buf[pos:pos + 512])
            if header == b"\0" * 512:
                break
            name = header[:100].split(b"\0", 1)[0].decode()
            prefix = header[345:500].split(b"\0", 1)[0].decode()
            if prefix:
                name = prefix + "/" + name
            size = int(header[124:136].split(b"\0", 1)[0].strip() or b"0", 8)
            if header[156:157] not in (b"0", b"\0"):
                raise ValueError(f"member {name!r} is not a regular file")
            body = buf[pos + 512:pos + 512 + size]
            pos += 512 + (size + 511) // 512 * 512
            key, _, ext = name.partition(".")
            if ext == "tokens.npy":
                pending[key] = _npy_view(body)
            elif ext == "json":
                ids.append(json.loads(bytes(body))["id"])
                docs.append(pending.pop(key))
    except (ValueError, KeyError, UnicodeDecodeError) as e:
        raise FormatError(f"{path}: damaged tar shard ({e})") from None
    if pending:
        raise FormatError(f"{path}: tar shard ends with incomplete samples {sorted(pending)[:3]}")
    return ids, docs


def _npy_view(body: memoryview) -> np.ndarray:
    """A 1-D array over an .npy payload without copying (format versions 1-3)."""
    if bytes(body[:6]) != b"\x93NUMPY":
        raise ValueError("not an .npy payload")
    major = body[6]
    hlen = int.from_bytes(body[8:10], "little") if major == 1 else int.from_bytes(body[8:12], "little")
    start = (10 if major == 1 else 12) + hlen
    m = _NPY_HEADER.match(bytes(body[start - hlen:start]))
    if m is None:
        raise ValueError("expected a 1-D C-ordered token array in the .npy payload")
    return np.frombuffer(body, dtype=np.dtype(m.group(1).decode()), count=int(m.group(2)), offset=start)


TAR_BYTES_PER_DOCUMENT = 8192  # headers, .npy header, padding and a generous .json, per document


def tar_size_bound(info: ShardInfo, itemsize: int) -> int:
    """At most the bytes of a shard's tar stream, by its manifest counts: a decompression stops there."""
    return info.tokens * itemsize + info.documents * TAR_BYTES_PER_DOCUMENT + (1 << 20)


def decode_tar_stream(src: str, dst: str, info: ShardInfo, itemsize: int) -> int:
    """Decompress the `.tar.zst` shard `src` into the plain tar `dst`, no further than its manifest
    counts allow; returns its size."""
    limit = tar_size_bound(info, itemsize)
    try:
        with open(src, "rb") as f, open(dst, "wb") as out:
            reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
            size = 0
            while chunk := reader.read(1 << 22):
                size += len(chunk)
                if size > limit:
                    raise FormatError(f"{src}: decompresses beyond the {limit:,} bytes its manifest entry allows "
                                      f"({info.documents} documents, {info.tokens} tokens); the shard is damaged "
                                      f"or hostile")
                out.write(chunk)
    except zstandard.ZstdError as e:
        raise FormatError(f"{src}: not a readable zstd stream ({e}); run `dataflow verify`") from None
    return size


def read_tar_stream(path: str, info: ShardInfo, itemsize: int) -> bytes:
    """The whole tar stream, decompressed (`.tar.zst`) no further than the manifest's counts allow."""
    with open(path, "rb") as f:
        if not path.endswith(".zst"):
            return f.read()
        limit = tar_size_bound(info, itemsize)
        try:
            reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
            chunks, size = [], 0
            while size <= limit:
                chunk = reader.read(min(limit + 1 - size, 1 << 24))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
            raw = b"".join(chunks)
        except zstandard.ZstdError as e:
            raise FormatError(f"{path}: not a readable zstd stream ({e}); run `dataflow verify`") from None
    if len(raw) > limit:
        raise FormatError(f"{path}: decompresses beyond the {limit:,} bytes its manifest entry allows "
                          f"({info.documents} documents, {info.tokens} tokens); the shard is damaged or hostile")
    return raw
