"""Work units: the deterministic cut of the inputs into pieces that workers tokenize independently.

Units are numbered in input order. Uncompressed JSONL is cut into byte ranges aligned to line ends
(so one huge file spreads over all workers), Parquet into row groups; a compressed JSONL file is one unit
here, cut into pieces of its decompressed stream as it is read (`pieces.py`). Consecutive small units
(small files, row groups, the tail of a cut file) are grouped into bundles of at most `unit_bytes`: a
bundle (or a piece) is what one worker tokenizes into finished shards, so shards never span bundles.
The cut depends on the inputs and `unit_bytes` only, never on the number of workers: it fixes the shard
boundaries, so `unit_bytes` is an output setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import fsspec

from dataflow.errors import InputError
from dataflow.preprocess.sources import input_kind, split_compression

DEFAULT_UNIT_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Unit:
    index: int
    file: str
    kind: str  # jsonl | parquet | text
    name: str = ""  # the file's name in derived ids (relative to the inputs' common folder)
    first_row: int = 0  # Parquet: the file's row number of this unit's first row
    start: int = 0  # byte range for uncompressed JSONL; row-group range for Parquet
    end: int | None = None
    size: int = 0  # input bytes this unit covers (for progress)
    # a piece of a compressed JSONL stream (see pieces.py): its number, its decompressed bytes (`start`: where
    # they begin in the decompressed stream), whether it is the stream's last, and how many compressed bytes
    # were read up to its end
    piece: int = -1
    data: bytes | None = field(default=None, repr=False, compare=False)
    last: bool = True
    read: int = 0

    def without_data(self) -> "Unit":
        """This unit without the bytes of a piece (what travels back from a worker)."""
        return replace(self, data=None) if self.data is not None else self

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


def file_sizes(files: list[str]) -> list[int]:
    """Bytes of each input (one metadata request per remote file)."""
    sizes = []
    for file in files:
        fs, path = fsspec.core.url_to_fs(file)
        sizes.append(int(fs.size(path) or 0))
    return sizes


def plan_units(files: list[str], unit_bytes: int = DEFAULT_UNIT_BYTES, sizes: list[int] | None = None,
               names: dict[str, str] | None = None) -> list[Unit]:
    """The units of `files` in input order (`sizes`, when known, saves asking for them again; `names`: each
    file's name in derived ids, by default its base name)."""
    sizes = file_sizes(files) if sizes is None else sizes
    units: list[Unit] = []
    for file, size in zip(files, sizes):
        name = (names or {}).get(file) or file.rstrip("/").rsplit("/", 1)[-1]
        kind = input_kind(file)
        fs, path = fsspec.core.url_to_fs(file)
        _, codec = split_compression(file)
        if kind == "jsonl" and codec is None and size > unit_bytes and _supports_ranges(fs, path):
            for start in range(0, size, unit_bytes):
                end = min(start + unit_bytes, size)
                units.append(Unit(len(units), file, kind, name, 0, start, end, end - start))
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
            groups, row = max(meta.num_row_groups, 1), 0
            for g in range(meta.num_row_groups):
                units.append(Unit(len(units), file, kind, name, row, g, g + 1, size // groups))
                row += meta.row_group(g).num_rows
        else:
            units.append(Unit(len(units), file, kind, name, 0, 0, None, size))
    return units


def cut_into_pieces(unit: Unit) -> bool:
    """A whole compressed JSONL file: read by the coordinator and cut into pieces for the workers."""
    return unit.kind == "jsonl" and unit.data is None and split_compression(unit.file)[1] is not None


def bundle_units(units: list[Unit], unit_bytes: int) -> list[list[Unit]]:
    """`units` grouped, in order, into bundles of at most `unit_bytes` of input (a larger unit alone); a
    compressed JSONL file, cut into pieces as it is read, is always a bundle of its own."""
    bundles: list[list[Unit]] = []
    size = 0
    for unit in units:
        alone = cut_into_pieces(unit)
        if bundles and not alone and not cut_into_pieces(bundles[-1][0]) and size + unit.size <= unit_bytes:
            bundles[-1].append(unit)
            size += unit.size
        else:
            bundles.append([unit])
            size = unit.size
    return bundles
