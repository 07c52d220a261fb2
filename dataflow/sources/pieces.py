"""One compressed JSONL file split across workers: its decompressed stream cut into line-aligned pieces.

A `.jsonl.zst/.gz/.bz2/.xz` file cannot be entered in the middle, so one process of the run (the coordinator's
cut process, `cut_process.py`) reads it as one stream and cuts it into pieces of about `piece_bytes` of
decompressed text, each ending at a line end; the pieces are committed in order. A piece reaches its worker
as a spill file: the stream is decompressed into one reused buffer and each piece written from it to a file
in the run's scratch folder, which the worker maps and deletes once read (one copy of each byte, and no
allocation per piece: sending the bytes through the pool's pipe copied each byte about eight times). Without
a spill folder (workers on other machines) a piece carries its bytes (`Unit.data`).
The cut depends only on the decompressed bytes and `piece_bytes`, so a resumed run (which skips the
pieces it committed) and any number of workers see the same pieces.

Cutting in the coordinator makes it the one process that decompresses every byte: right for a few large
files (it is the only way to spread one over the workers), a serial ceiling for many (a corpus shipped as
thousands of `.jsonl.zst` files), and with Ray a funnel through the driver. So when there are at least
WHOLE_FILES_PER_WORKER compressed files per worker, each goes to a worker whole, which cuts it into the
same pieces itself (`worker.tokenize_bundle`) and tokenizes each into the shards the coordinator's cut
would have given: the same bytes either way, and the decompression spread over the workers.
"""

from __future__ import annotations

import dataclasses
import os
from typing import IO, TYPE_CHECKING, Iterable, Iterator

import fsspec

from dataflow.sources.compressed import decompressed, read_errors
from dataflow.sources.kind import JSONL
from dataflow.sources.listing import split_compression

if TYPE_CHECKING:
    from dataflow.sources.records import Unit

READ_SIZE = 8 << 20  # compressed bytes per read of the source
SLACK = 1 << 20  # decompressed bytes read past a piece's boundary, to find the end of its line
WHOLE_FILES_PER_WORKER = 2  # compressed files per worker from which each worker reads its own files whole


def splits_into_pieces(unit: "Unit") -> bool:
    """A whole compressed JSONL file: read by the coordinator and cut into pieces for the workers."""
    return unit.kind == JSONL and unit.piece < 0 and split_compression(unit.file)[1] is not None


def compressed_file(bundle: list["Unit"]) -> bool:
    """A bundle that is one whole compressed JSONL file (such a file is always a bundle of its own)."""
    return len(bundle) == 1 and splits_into_pieces(bundle[0])


def workers_read_whole(bundles: list[list["Unit"]], workers: int) -> bool:
    """Whether each compressed JSONL file of `bundles` goes to a worker whole (see the module): when there
    are at least WHOLE_FILES_PER_WORKER of them per worker."""
    files = sum(1 for bundle in bundles if compressed_file(bundle))
    return files >= WHOLE_FILES_PER_WORKER * max(workers, 1)


def expand(bundles: Iterable[list["Unit"]], piece_bytes: int, first_piece: int = 0,
           spill_dir: str | None = None, whole: bool = False) -> Iterator[list["Unit"]]:
    """`bundles` with each compressed JSONL file replaced by its pieces, each a bundle of its own (the first
    bundle resumes at `first_piece`); `spill_dir`: where the pieces' bytes go (else they travel in the unit).
    `whole`: the files stay whole instead, for their workers to cut (the first one's `skip` set to resume)."""
    for n, bundle in enumerate(bundles):
        if compressed_file(bundle):
            skip = first_piece if n == 0 else 0
            if whole:
                yield [dataclasses.replace(bundle[0], skip=skip)]
            else:
                yield from ([piece] for piece in pieces(bundle[0], piece_bytes, skip, spill_dir))
        else:
            yield bundle


def pieces(unit: "Unit", piece_bytes: int, skip: int = 0, spill_dir: str | None = None) -> Iterator["Unit"]:
    """The pieces of one compressed JSONL unit from piece `skip` on; the last has `last=True`.

    Each piece carries its number, its decompressed bytes (in a file of `spill_dir`, `spill`, or else as
    `data`) and their count (`size`), where they start in the decompressed stream (`start`, for ids derived
    from it) and how far into the compressed file the reading has come (`read`, for the progress estimate)."""
    _, codec = split_compression(unit.file)
    # large reads of the source (zstd): each one takes the GIL back from the thread that commits, and at the
    # default 128 KB a busy main thread made decompression 8x slower
    with read_errors(unit.file), fsspec.open(unit.file, "rb") as raw, \
            decompressed(raw, codec, unit.file, read_size=READ_SIZE) as f:
        held: "Unit | None" = None
        start = 0
        for number, view in enumerate(_cut(f, piece_bytes)):
            if held is not None:
                yield held
                held = None
            with view:  # released before the buffer under it is read into again
                if number >= skip:
                    held = dataclasses.replace(unit, piece=number, start=start, size=len(view), read=raw.tell(),
                                               last=False, **_stored(view, unit, number, spill_dir))
                start += len(view)
        if held is not None:
            yield dataclasses.replace(held, last=True)
        elif skip == 0:  # an empty stream: one empty piece, so the unit is still committed
            yield dataclasses.replace(unit, piece=0, data=b"", size=0, read=raw.tell(), last=True)


def _stored(view: memoryview, unit: "Unit", number: int, spill_dir: str | None) -> dict:
    """Where a piece's bytes go: a spill file the worker deletes (`spill`), or the unit itself (`data`)."""
    if spill_dir is None:
        return {"data": bytes(view)}
    path = os.path.join(spill_dir, f"piece-{unit.index:08d}-{number:06d}.jsonl")
    with open(path, "wb") as f:
        f.write(view)
    return {"spill": path}


def _cut(f: IO[bytes], piece_bytes: int) -> Iterator[memoryview]:
    """The stream in pieces of whole lines: piece k holds the lines whose first byte lies in
    [k * piece_bytes, (k + 1) * piece_bytes), as an uncompressed file's byte ranges are cut (`jsonl.spans`), so
    a file and its compressed copy give the same shards. A range in which no line starts gives no piece.

    The stream is decompressed into one buffer, reused: each view is valid until the next is asked for."""
    buf = bytearray(piece_bytes + SLACK)
    have, pos, ended = 0, 0, False  # bytes in buf, and where buf starts in the stream
    while True:
        boundary = (pos // piece_bytes + 1) * piece_bytes
        cut = buf.find(b"\n", max(boundary - 1 - pos, 0), have)  # the end of the line holding byte boundary - 1
        if cut >= 0:
            yield memoryview(buf)[:cut + 1]
            buf[:have - cut - 1] = buf[cut + 1:have]  # the rest (at most a read past the line end) to the front
            pos, have = pos + cut + 1, have - cut - 1
        elif ended:
            if have:
                yield memoryview(buf)[:have]
            return
        else:
            if have == len(buf):  # a line longer than the buffer: make room
                buf.extend(bytes(len(buf)))
            want = min(len(buf), max(boundary - pos, have) + SLACK)
            got = _read_into(f, memoryview(buf)[have:want])
            ended = got == 0
            have += got


def _read_into(f: IO[bytes], view: memoryview) -> int:
    """Fill `view` from the stream; fewer bytes only at its end (decompressors may return short reads)."""
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])
        if not n:
            break
        got += n
    return got
