"""Which files a tokenize reads, and what kind each one is: paths, globs, folders and URLs -> input files.

The kind of a file comes from its name (`input_kind`): JSONL, Parquet or text, each optionally compressed.
"""

from __future__ import annotations

import glob
import os

import fsspec

from dataflow.errors import ConfigError, InputError, InputNotFoundError

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
INPUT_TYPES = ".jsonl/.json/.ndjson or .txt, optionally .gz/.zst/.bz2/.xz, or .parquet"


def split_compression(url: str) -> tuple[str, str | None]:
    """('data.jsonl', 'zstd') for 'data.jsonl.zst'."""
    for suffix, codec in COMPRESSION_SUFFIXES.items():
        if url.endswith(suffix):
            return url[: -len(suffix)], codec
    return url, None


def input_kind(url: str) -> str:
    """'jsonl', 'parquet' or 'text', from the file's name; an `InputNotFoundError` for any other name."""
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
    return list(dict.fromkeys(files))


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
