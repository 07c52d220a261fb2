"""WebDataset tar shards: members `<key>.tokens.npy` and `<key>.json` ({"id": ...}).

A `.tar` shard is readable by `webdataset.WebDataset` as it is; `.tar.zst` is the same tar stream
compressed with zstd. Member headers are normalised (mtime 0, root owner) so bytes are reproducible.

Every reader of tar shards (the loader, `verify`, `decode`/`inspect --decode`, the decoded cache's copies)
goes through `read_tar_stream` (bytes bounded by the manifest entry) and `parse_tar_shard` (the one
definition of a valid shard), so they all accept and refuse the same shards.
"""

from __future__ import annotations

import io
import json
import mmap
import os
import re
import tarfile
from typing import IO, Iterator, Sequence

import fsspec
import numpy as np
import zstandard

from dataflow.errors import FormatError
from dataflow.formats.manifest import ShardInfo

BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_OCTAL = re.compile(rb" *([0-7]{1,12})[ \0]*")
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=][a-z]\d{1,2})', 'fortran_order': False, 'shape': \((\d{1,19}),\), \}")
EXTENSIONS = ("tokens.npy", "json")


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


class _Damaged(Exception):
    """What is wrong with the tar stream; `parse_tar_shard` turns it into a `FormatError` naming the shard."""


def parse_tar_shard(data: bytes | bytearray | memoryview, name: str, info: ShardInfo,
                    dtype: np.dtype | str) -> tuple[list[str], list[np.ndarray]]:
    """(ids, tokens) of a whole tar stream held in memory, or a one-line `FormatError` naming `name`.

    A valid tar shard is exactly what `encode_tar_shard` writes, give or take header fields no reader
    uses (mtime, owner, mode):
    - a POSIX ustar stream of 512-byte blocks: every header has the `ustar` magic, a correct checksum and
      a size of octal digits whose body lies inside the stream; it ends with a zero block and only zeros
      follow (the padding `tar` writes);
    - every member is a regular file `<key>.tokens.npy` or `<key>.json` (the key is the name up to the
      first dot of its last path part, as WebDataset reads it); each document is those two members, in
      that order, next to each other, and consecutive documents have different keys;
    - `.tokens.npy` is an .npy (versions 1-3) of a 1-D C-ordered array of the manifest's token type and
      nothing else; `.json` is a JSON object whose "id" is a string;
    - it holds the documents and tokens its manifest entry `info` says.
    Anything else is refused, never skipped. Every header moves the read position forward by at least
    one block, so any input ends in bounded time; tokens are views into `data` (no copy).
    """
    dtype = np.dtype(dtype)
    try:
        ids, docs = _documents(memoryview(data).cast("B"), dtype)
    except _Damaged as e:
        raise FormatError(f"{name}: damaged tar shard ({e}); re-create or re-download it") from None
    info.check_holds(name, len(ids), sum(len(d) for d in docs))
    return ids, docs


def _documents(buf: memoryview, dtype: np.dtype) -> tuple[list[str], list[np.ndarray]]:
    ids: list[str] = []
    docs: list[np.ndarray] = []
    tokens: tuple[str, str, memoryview] | None = None  # (member, key, body) of the document's .tokens.npy
    last_key = None
    for member, key, ext, body in _members(buf):
        if tokens is None:
            if ext != "tokens.npy":
                raise _Damaged(f"member {member!r} does not follow its .tokens.npy: a document is "
                               "<key>.tokens.npy, then <key>.json")
            if key == last_key:
                raise _Damaged(f"member {member!r} repeats the key of the document before it")
            tokens = (member, key, body)
            continue
        if ext != "json" or key != tokens[1]:
            raise _Damaged(f"member {member!r} follows {tokens[0]!r}: a document is <key>.tokens.npy, then "
                           "<key>.json")
        docs.append(_npy_view(tokens[0], tokens[2], dtype))
        ids.append(_doc_id(member, body))
        last_key, tokens = key, None
    if tokens is not None:
        raise _Damaged(f"the stream ends after {tokens[0]!r}, half a document")
    return ids, docs


def _members(buf: memoryview) -> Iterator[tuple[str, str, str, memoryview]]:
    """(name, key, extension, body) of each member, up to the end-of-archive block."""
    pos, end = 0, len(buf)
    while True:
        if pos + BLOCK > end:
            raise _Damaged(f"no end-of-archive block: the stream stops at byte {end:,}"
                           + (f", {end - pos} bytes into a header" if pos < end else "") + " (truncated?)")
        header = bytes(buf[pos:pos + BLOCK])
        if header == _ZERO_BLOCK:
            if np.frombuffer(buf, np.uint8, offset=pos).any():
                raise _Damaged(f"data follows the end-of-archive block at byte {pos:,}")
            return
        name, size = _header(header, pos)
        body = pos + BLOCK
        if size > end - body:
            raise _Damaged(f"member {name!r} at byte {pos:,} declares {size:,} bytes, {end - body:,} are left "
                           "(truncated?)")
        key, ext = _split_name(name)
        yield name, key, ext, buf[body:body + size]
        pos = body + -(-size // BLOCK) * BLOCK  # size >= 0: at least one block further


def _header(header: bytes, pos: int) -> tuple[str, int]:
    """(name, size) of a regular file's ustar header at byte `pos`."""
    if header[257:262] != b"ustar":
        raise _Damaged(f"no ustar header at byte {pos:,}")
    stored = _octal(header[148:156])
    unsigned = sum(header) - sum(header[148:156]) + 8 * 32
    if stored != unsigned and stored != _signed_checksum(header):
        raise _Damaged(f"the header at byte {pos:,} fails its checksum")
    try:
        name = header[:100].split(b"\0", 1)[0].decode()
        prefix = header[345:500].split(b"\0", 1)[0].decode()
    except UnicodeDecodeError:
        raise _Damaged(f"the member name at byte {pos:,} is not UTF-8") from None
    name = f"{prefix}/{name}" if prefix else name
    if header[156:157] not in (b"0", b"\0"):
        raise _Damaged(f"member {name!r} is not a regular file (type {header[156:157].decode('latin-1')!r})")
    size = _octal(header[124:136])
    if size is None:
        raise _Damaged(f"member {name!r} has a size field that is not an octal number")
    return name, size


def _signed_checksum(header: bytes) -> int:
    """The checksum as some old tars computed it: bytes summed as signed chars."""
    return sum(b - 256 if b >= 128 else b for b in header[:148] + header[156:]) + 8 * 32


def _octal(field: bytes) -> int | None:
    m = _OCTAL.fullmatch(field)
    return int(m.group(1), 8) if m else None


def _split_name(name: str) -> tuple[str, str]:
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    key, ext = (name[:dot], name[dot + 1:]) if dot > slash + 1 else (name, "")
    if ext not in EXTENSIONS:
        raise _Damaged(f"member {name!r} is neither <key>.tokens.npy nor <key>.json")
    return key, ext


def _npy_view(member: str, body: memoryview, dtype: np.dtype) -> np.ndarray:
    """The 1-D token array of an .npy payload (format versions 1-3), as a view of `body`."""
    major = body[6] if len(body) >= 10 and bytes(body[:6]) == b"\x93NUMPY" else 0
    if major not in (1, 2, 3) or (major > 1 and len(body) < 12):
        raise _Damaged(f"member {member!r} is not an .npy payload")
    start = 10 + int.from_bytes(body[8:10], "little") if major == 1 else 12 + int.from_bytes(body[8:12], "little")
    m = _NPY_HEADER.match(bytes(body[10 if major == 1 else 12:start])) if start <= len(body) else None
    if m is None:
        raise _Damaged(f"member {member!r} is not a 1-D C-ordered token array")
    try:
        found = np.dtype(m.group(1).decode())
    except TypeError:
        raise _Damaged(f"member {member!r} holds tokens of no known type ({m.group(1).decode()!r})") from None
    if found != dtype:
        raise _Damaged(f"member {member!r} holds {found} tokens, the manifest says {dtype}")
    count = int(m.group(2))
    if len(body) - start != count * dtype.itemsize:
        raise _Damaged(f"member {member!r} holds {len(body) - start:,} bytes of tokens, its header says {count:,} "
                       f"{dtype} tokens")
    return np.frombuffer(body, dtype=dtype, count=count, offset=start)


def _doc_id(member: str, body: memoryview) -> str:
    try:
        obj = json.loads(bytes(body))
    except (ValueError, RecursionError) as e:
        raise _Damaged(f"member {member!r} is not JSON ({type(e).__name__}: {e})") from None
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        raise _Damaged(f'member {member!r} is not a JSON object with a string "id"')
    return obj["id"]


TAR_BYTES_PER_DOCUMENT = 8192  # headers, .npy header, padding and a generous .json, per document


def tar_size_bound(info: ShardInfo, itemsize: int) -> int:
    """At most the bytes of a shard's tar stream, by its manifest counts: a decompression stops there."""
    return info.tokens * itemsize + info.documents * TAR_BYTES_PER_DOCUMENT + (1 << 20)


def _shard_name(path: str, info: ShardInfo) -> str:
    """`path` as an error names it: a file that is not the dataset's own (a cache entry) says which shard."""
    own = ("/" + path.replace("\\", "/")).endswith("/" + info.path)
    return path if own else f"{info.path} ({path})"


def _decompressed(f: IO[bytes], name: str, info: ShardInfo, itemsize: int) -> Iterator[bytes]:
    """The tar stream of the `.tar.zst` open in `f`, in chunks, refused once it grows past what the manifest
    entry allows. A zstd frame cut short ends the stream early: the tar parser then finds it truncated."""
    limit = tar_size_bound(info, itemsize)
    size = 0
    try:
        reader = zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)
        while chunk := reader.read(min(limit + 1 - size, 1 << 22)):
            size += len(chunk)
            if size > limit:
                raise FormatError(f"{name}: decompresses beyond the {limit:,} bytes its manifest entry allows "
                                  f"({info.documents} documents, {info.tokens} tokens); the shard is damaged or "
                                  "hostile")
            yield chunk
    except zstandard.ZstdError as e:
        raise FormatError(f"{name}: not a readable zstd stream ({e}); run `dataflow verify`") from None


def read_tar_stream(path: str, info: ShardInfo, itemsize: int,
                    name: str | None = None) -> bytes | bytearray | memoryview:
    """The whole tar stream of a shard, for `parse_tar_shard`: a local plain `.tar` memory-mapped (every
    process reading it shares its pages), a `.tar.zst` decompressed no further than the manifest's counts
    allow, a remote `.tar` read when its size is within them. `name` is the shard in errors."""
    name = name or _shard_name(path, info)
    if path.endswith(".zst"):
        with fsspec.open(path, "rb") as f:
            out = bytearray()
            for chunk in _decompressed(f, name, info, itemsize):
                out += chunk
            return out
    if "://" not in path:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return b""
            return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    limit = tar_size_bound(info, itemsize)
    with fsspec.open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise FormatError(f"{name}: larger than the {limit:,} bytes its manifest entry allows; the shard is "
                          "damaged or hostile")
    return data


def decode_tar_stream(src: str, dst: str, info: ShardInfo, itemsize: int, name: str | None = None) -> int:
    """Decompress the `.tar.zst` shard `src` into the plain tar `dst`, no further than its manifest counts
    allow; returns its size. `name` is the shard in errors (default: `src`, with the shard's name when
    `src` is a cache entry). The copy is parsed (`parse_tar_shard`) when it is opened."""
    name = name or _shard_name(src, info)
    size = 0
    with open(src, "rb") as f, open(dst, "wb") as out:
        for chunk in _decompressed(f, name, info, itemsize):
            out.write(chunk)
            size += len(chunk)
    return size
