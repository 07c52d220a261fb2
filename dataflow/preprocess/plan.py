"""Work units: the deterministic cut of the inputs into pieces that workers tokenize independently.

Units are numbered in input order. Uncompressed JSONL is cut into byte ranges aligned to line ends
(so one huge file spreads over all workers), Parquet into row groups; a compressed JSONL file is one unit
here, cut into pieces of its decompressed stream as it is read (`pieces.py`).
The cut depends on the inputs and `unit_bytes` only; by default `unit_bytes` is sized so that every
worker gets several units (tail imbalance stays small), and a resumed run reuses the cut it started with.
The cut never changes the output: documents are committed in input order whatever the units.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import fsspec

from dataflow.errors import InputError
from dataflow.preprocess.sources import input_kind, split_compression

DEFAULT_UNIT_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Unit:
    index: int
    file: str
    kind: str  # jsonl | parquet | text
    start: int = 0  # byte range for uncompressed JSONL; row-group range for Parquet
    end: int | None = None
    size: int = 0  # input bytes this unit covers (for progress)
    # a piece of a compressed JSONL stream (see pieces.py): its number, its decompressed bytes, whether it
    # is the stream's last, and how many compressed bytes were read up to its end
    piece: int = -1
    data: bytes | None = field(default=None, repr=False, compare=False)
    last: bool = True
    read: int = 0

    def to_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "data"}


def _supports_ranges(fs, path: str) -> bool:
    """Local and object stores seek; a plain HTTP server may not answer range requests."""
    if "http" not in fs.protocol:
        return True
    try:
        with fs.open(path, "rb", block_size=2) as f:
            f.seek(1)
            return len(f.read(1)) == 1
    except (ValueError, OSError):
        return False


MIN_UNIT_BYTES = 1 << 20


def file_sizes(files: list[str]) -> list[int]:
    """Bytes of each input (one metadata request per remote file)."""
    sizes = []
    for file in files:
        fs, path = fsspec.core.url_to_fs(file)
        sizes.append(int(fs.size(path) or 0))
    return sizes


COMPRESSION_GUESS = 4  # decompressed / compressed bytes of JSONL, to size pieces before reading any


def input_bytes(files: list[str], sizes: list[int]) -> int:
    """About how many bytes the inputs hold decompressed (compressed JSONL guessed at COMPRESSION_GUESS x)."""
    return sum(size * (COMPRESSION_GUESS if input_kind(f) == "jsonl" and split_compression(f)[1] else 1)
               for f, size in zip(files, sizes))


def auto_unit_bytes(total_bytes: int, workers: int) -> int:
    """About 4 units per worker for small inputs, DEFAULT_UNIT_BYTES for large ones."""
    return max(MIN_UNIT_BYTES, min(DEFAULT_UNIT_BYTES, total_bytes // (4 * max(workers, 1))))


def plan_units(files: list[str], unit_bytes: int = DEFAULT_UNIT_BYTES, sizes: list[int] | None = None) -> list[Unit]:
    """The units of `files` in input order (`sizes`, when known, saves asking for them again)."""
    sizes = file_sizes(files) if sizes is None else sizes
    units: list[Unit] = []
    for file, size in zip(files, sizes):
        kind = input_kind(file)
        fs, path = fsspec.core.url_to_fs(file)
        _, codec = split_compression(file)
        if kind == "jsonl" and codec is None and size > unit_bytes and _supports_ranges(fs, path):
            for start in range(0, size, unit_bytes):
                end = min(start + unit_bytes, size)
                units.append(Unit(len(units), file, kind, start, end, end - start))
        elif kind == "parquet":
            import pyarrow as pa
            import pyarrow.parquet as pq

            try:
                with fs.open(path, "rb") as f:
                    meta = pq.ParquetFile(f).metadata
            except (pa.ArrowInvalid, OSError) as e:
                if isinstance(e, FileNotFoundError):
                    raise
                raise InputError(f"{file}: not a readable Parquet file ({e}); check the file, or give it the "
                                 f"extension of what it holds (.jsonl, .txt)") from None
            groups = max(meta.num_row_groups, 1)
            for g in range(meta.num_row_groups):
                units.append(Unit(len(units), file, kind, g, g + 1, size // groups))
        else:
            units.append(Unit(len(units), file, kind, 0, None, size))
    return units
