"""Checksums of files: the one place a file is hashed (shards, downloads, decoded copies)."""

from __future__ import annotations

import hashlib
import os

import fsspec


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    """sha256 of a file (local path or fsspec URL), streamed in 4 MB chunks."""
    h = hashlib.sha256()
    with fsspec.open(path, "rb") as f:
        while data := f.read(chunk):
            h.update(data)
    return h.hexdigest()


def sha256_local(path: str, sync: bool = False) -> tuple[int, str]:
    """(size, sha256) of a local file, read through one reused buffer (no allocation per chunk);
    `sync` also flushes it to disk (a file about to be renamed into place)."""
    h, size, buf = hashlib.sha256(), 0, bytearray(1 << 20)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buf):
            h.update(view[:n])
            size += n
        if sync:
            os.fsync(f.fileno())
    return size, h.hexdigest()
