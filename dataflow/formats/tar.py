"""WebDataset tar shards: members `<key>.tokens.npy` and `<key>.json` ({"id": ...}).

A `.tar` shard is readable by `webdataset.WebDataset` as it is; `.tar.zst` is the same tar stream
compressed with zstd. Member headers are normalised (mtime 0, root owner) so bytes are reproducible.
"""

from __future__ import annotations

import io
import json
import tarfile
from typing import IO, Iterator, Sequence

import numpy as np
import zstandard

from dataflow.errors import FormatError


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
