"""One compressed JSONL file split across workers: its decompressed stream cut into line-aligned pieces.

A `.jsonl.zst/.gz/.bz2/.xz` file cannot be entered in the middle, so the process that owns the run reads
it as one stream and cuts it into pieces of about `piece_bytes` of decompressed text, each ending at a
line end; the pieces travel to the workers with their bytes (`Unit.data`) and are committed in order.
The cut depends only on the decompressed bytes and `piece_bytes`, so a resumed run (which skips the
pieces it committed) and any number of workers see the same pieces.
"""

from __future__ import annotations

import dataclasses
from typing import IO, Iterable, Iterator

import fsspec

from dataflow.preprocess.compressed import decompressed, read_errors
from dataflow.preprocess.plan import Unit
from dataflow.preprocess.sources import split_compression


READ_SIZE = 8 << 20  # compressed bytes per read of the source


def splits_into_pieces(unit: Unit) -> bool:
    """A whole compressed JSONL file: read by this process and cut into pieces for the workers."""
    return unit.kind == "jsonl" and unit.data is None and split_compression(unit.file)[1] is not None


def expand(units: Iterable[Unit], piece_bytes: int, first_piece: int = 0) -> Iterator[Unit]:
    """`units` with each compressed JSONL file replaced by its pieces (the first unit resumes at `first_piece`)."""
    for n, unit in enumerate(units):
        if splits_into_pieces(unit):
            yield from pieces(unit, piece_bytes, first_piece if n == 0 else 0)
        else:
            yield unit


def _read_full(f: IO[bytes], n: int) -> bytes:
    """n bytes, fewer only at the end of the stream (decompressors may return short reads)."""
    parts, got = [], 0
    while got < n:
        block = f.read(n - got)
        if not block:
            break
        parts.append(block)
        got += len(block)
    return b"".join(parts)


def pieces(unit: Unit, piece_bytes: int, skip: int = 0) -> Iterator[Unit]:
    """The pieces of one compressed JSONL unit from piece `skip` on; the last has `last=True`.

    Each piece carries its number, its decompressed bytes (`data`, `size`) and how far into the
    compressed file the reading has come (`read`, for the progress estimate)."""
    _, codec = split_compression(unit.file)
    # large reads of the source (zstd): each one takes the GIL back from the thread that commits, and at the
    # default 128 KB a busy main thread made decompression 8x slower
    with read_errors(unit.file), fsspec.open(unit.file, "rb") as raw, \
            decompressed(raw, codec, unit.file, read_size=READ_SIZE) as f:
        held: Unit | None = None
        for number, data in enumerate(_cut(f, piece_bytes)):
            if held is not None:
                yield held
                held = None
            if number >= skip:
                held = dataclasses.replace(unit, piece=number, data=data, size=len(data), read=raw.tell(), last=False)
        if held is not None:
            yield dataclasses.replace(held, last=True)
        elif skip == 0:  # an empty stream: one empty piece, so the unit is still committed
            yield dataclasses.replace(unit, piece=0, data=b"", size=0, read=raw.tell(), last=True)


def _cut(f: IO[bytes], piece_bytes: int) -> Iterator[bytes]:
    """The stream in pieces of about `piece_bytes` that end at a line end (the last one: at the end)."""
    rest = b""
    while True:
        block = _read_full(f, piece_bytes)
        data = rest + block if rest else block
        if not block:
            if data:
                yield data
            return
        cut = data.rfind(b"\n") + 1
        if cut == 0:  # no line end yet: a line longer than a piece
            rest = data
            continue
        rest = data[cut:]
        yield data[:cut]
