"""Work units: the deterministic cut of the inputs into pieces that workers tokenize independently.

Units are numbered in input order. Each input kind's reader says how its files are cut (`dataflow/sources/`):
uncompressed JSONL into byte ranges aligned to line ends (so one huge file spreads over all workers),
Parquet into row groups; a compressed JSONL file is one unit here, cut into pieces of its decompressed
stream as it is read (`sources/pieces.py`: by the coordinator, or by the worker that reads the file whole
when there are enough such files to keep every worker busy; the same pieces either way). Consecutive small
units (small files, row groups, the tail of a cut file) are grouped into bundles of at most `unit_bytes`: a
bundle (or a piece) is what one worker tokenizes into finished shards, so shards never span bundles.
The cut depends on the inputs and `unit_bytes` only, never on the number of workers: it fixes the shard
boundaries, so `unit_bytes` is an output setting.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec

from dataflow.sources import input_kind, read_ahead, spans, splits_into_pieces
from dataflow.sources.records import Unit

DEFAULT_UNIT_BYTES = 32 * 1024 * 1024


# what an object store or HTTP server says changes when an object is written again, first found first taken
_VERSION_KEYS = ("ETag", "etag", "generation", "md5Hash", "LastModified", "last_modified", "updated", "mtime")


def file_sizes(files: list[str]) -> list[int]:
    """Bytes of each input (one metadata request per remote file)."""
    return [size for size, _ in file_facts(files)]


def file_facts(files: list[str]) -> list[tuple[int, str | None]]:
    """(bytes, version) of each input, from one metadata request per remote file. The version is what changes
    when the file is written again, even to the same size: a local file's modification time in nanoseconds, an
    object's ETag (or generation, or last-modified time); None where the store tells none."""
    facts = []
    for file in files:
        fs, path = fsspec.core.url_to_fs(file)
        if "file" in (fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)):
            st = os.stat(path)
            facts.append((st.st_size, f"mtime_ns={st.st_mtime_ns}"))
            continue
        info: dict[str, Any] = fs.info(path)
        key = next((k for k in _VERSION_KEYS if info.get(k) not in (None, "")), None)
        facts.append((int(info.get("size") or 0), None if key is None else f"{key}={info[key]}"))
    return facts


def plan_units(files: list[str], unit_bytes: int = DEFAULT_UNIT_BYTES, sizes: list[int] | None = None,
               names: dict[str, str] | None = None) -> list[Unit]:
    """The units of `files` in input order, each file cut by its kind's reader (`sources.spans`); `sizes`,
    when known, saves asking for them again; `names`: each file's name in derived ids, by default its base
    name."""
    sizes = file_sizes(files) if sizes is None else sizes
    kinds = [input_kind(f) for f in files]
    read_ahead(files, kinds, sizes)  # many Parquet footers at once, not one after another
    units: list[Unit] = []
    for file, kind, size in zip(files, kinds, sizes):
        name = (names or {}).get(file) or file.rstrip("/").rsplit("/", 1)[-1]
        for span in spans(file, kind, size, unit_bytes):
            units.append(Unit(len(units), file, kind, name, span.first_row, span.start, span.end, span.size))
    return units


def bundle_units(units: list[Unit], unit_bytes: int) -> list[list[Unit]]:
    """`units` grouped, in order, into bundles of at most `unit_bytes` of input (a larger unit alone); a
    compressed JSONL file, cut into pieces as it is read, is always a bundle of its own."""
    bundles: list[list[Unit]] = []
    size = 0
    for unit in units:
        alone = splits_into_pieces(unit)
        if bundles and not alone and not splits_into_pieces(bundles[-1][0]) and size + unit.size <= unit_bytes:
            bundles[-1].append(unit)
            size += unit.size
        else:
            bundles.append([unit])
            size = unit.size
    return bundles
