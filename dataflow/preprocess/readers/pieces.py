"""One compressed JSONL file split across workers: its decompressed stream cut into line-aligned pieces.

A `.jsonl.zst/.gz/.bz2/.xz` file cannot be entered in the middle, so the process that owns the run reads
it as one stream and cuts it into pieces of about `piece_bytes` of decompressed text, each ending at a
line end; the pieces travel to the workers with their bytes (`Unit.data`) and are committed in order.
The cut depends only on the decompressed bytes and `piece_bytes`, so a resumed run (which skips the
pieces it committed) and any number of workers see the same pieces.
"""

from __future__ import annotations

import dataclasses
from typing import IO, TYPE_CHECKING, Iterable, Iterator

import fsspec

from dataflow.preprocess.readers.compressed import decompressed, read_errors
from dataflow.preprocess.readers.listing import split_compression

if TYPE_CHECKING:
    from dataflow.preprocess.plan import Unit

READ_SIZE = 8 << 20  # compressed bytes per read of the source


def splits_into_pieces(unit: "Unit") -> bool:
    """A whole compressed JSONL file: read by the coordinator and cut into pieces for the workers."""
    return unit.kind == "jsonl" and unit.data is None and split_compression(unit.file)[1] is not None


def expand(bundles: Iterable[list["Unit"]], piece_bytes: int, first_piece: int = 0) -> Iterator[list["Unit"]]:
    """`bundles` with each compressed JSONL file replaced by its pieces, each a bundle of its own (the first
    bundle resumes at `first_piece`)."""
    for n, bundle in enumerate(bundles):
        if len(bundle) == 1 and splits_into_pieces(bundle[0]):
            yield from ([piece] for piece in pieces(bundle[0], piece_bytes, first_piece if n == 0 else 0))
        else:
            yield bundle


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


def pieces(unit: "Unit", piece_bytes: int, skip: int = 0) -> Iterator["Unit"]:
    """The pieces of one compressed JSONL unit from piece `skip` on; the last has `last=True`.

    Each piece carries its number, its decompressed bytes (`data`, `size`), where they start in the
    decompressed stream (`start`, for ids derived from it) and how far into the compressed file the reading
    has come (`read`, for the progress estimate)."""
    _, codec = split_compression(unit.file)
    # large reads of the source (zstd): each one takes the GIL back from the thread that commits, and at the
    # default 128 KB a busy main thread made decompression 8x slower
    with read_errors(unit.file), fsspec.open(unit.file, "rb") as raw, \
            decompressed(raw, codec, unit.file, read_size=READ_SIZE) as f:
        held: "Unit | None" = None
        start = 0
        for number, data in enumerate(_cut(f, piece_bytes)):
            if held is not None:
                yield held
                held = None
            if number >= skip:
                held = dataclasses.replace(unit, piece=number, data=data, start=start, size=len(data),
                                           read=raw.tell(), last=False)
            start += len(data)
        if held is not None:
            yield dataclasses.replace(held, last=True)
        elif skip == 0:  # an empty stream: one empty piece, so the unit is still committed
            yield dataclasses.replace(unit, piece=0, data=b"", size=0, read=raw.tell(), last=True)


def _cut(f: IO[bytes], piece_bytes: int) -> Iterator[bytes]:
    """The stream in pieces of whole lines: piece k holds the lines whose first byte lies in
    [k * piece_bytes, (k + 1) * piece_bytes), as an uncompressed file's byte ranges are cut (`jsonl.spans`), so
    a file and its compressed copy give the same shards. A range in which no line starts gives no piece."""
    data, pos, ended = b"", 0, False  # pos: where data starts in the stream
    while True:
        boundary = (pos // piece_bytes + 1) * piece_bytes
        cut = data.find(b"\n", max(boundary - 1 - pos, 0))  # the end of the line holding byte boundary - 1
        if cut >= 0:
            yield data[:cut + 1]
            pos, data = pos + cut + 1, data[cut + 1:]
        elif ended:
            if data:
                yield data
            return
        else:
            block = _read_full(f, piece_bytes)
            ended = not block
            data = data + block if data else block
