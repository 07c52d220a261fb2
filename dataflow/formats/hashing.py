"""Checksums of shard files."""

from __future__ import annotations

import hashlib

import fsspec


def sha256_file(path: str, chunk: int = 1 << 22) -> str:
    """sha256 of a file (local path or fsspec URL), streamed in 4 MB chunks."""
    h = hashlib.sha256()
    with fsspec.open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
