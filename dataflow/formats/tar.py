"""WebDataset tar shards: members `<key>.tokens.npy` and `<key>.json` ({"id": ...}).

A `.tar` shard is readable by `webdataset.WebDataset` as it is; `.tar.zst` is the same tar stream
compressed with zstd. Member headers are normalised (mtime 0, root owner) so bytes are reproducible.

Every reader of tar shards (the loader, `verify`, `decode`/`inspect --decode`, the decoded cache's copies)
goes through `read_tar_stream` (bytes bounded by the manifest entry) and `parse_tar_shard` (the one
definition of a valid shard), so they all accept and refuse the same shards.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import mmap
import os
import re
import struct
import tarfile
from typing import IO, Any, Iterator, Sequence

import fsspec
import numpy as np
import zstandard

from dataflow.errors import FormatError
from dataflow.formats.atomic import atomic_open
from dataflow.formats.manifest import ShardInfo

# "block" means tokenize's input blocks in dataflow/; here it is the POSIX tar term (512 bytes), kept as a
# named exception (tests/architecture/test_words.py) so that the code reads like the standard it parses.
BLOCK = 512
_ZERO_BLOCK = bytes(BLOCK)
_NPY_HEADER = re.compile(rb"\{'descr': '([<>|=][a-z]\d{1,2})', 'fortran_order': False, 'shape': \((\d{1,19}),\), \}")
EXTENSIONS = ("tokens.npy", "json")
# name, size, chksum, typeflag, magic and prefix of a ustar header (mode, owner, mtime, link... skipped)
_HEADER = struct.Struct("100s24x12s12x8s1s100x6s82x155s")


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
    """(name, key, extension, body) of each member, up to the end-of-archive block; the headers' checksums
    are checked together at the end (one numpy pass instead of a Python sum per header)."""
    pos, end = 0, len(buf)
    at: list[int] = []
    stored: list[int] = []
    while True:
        if pos + BLOCK > end:
            raise _Damaged(f"no end-of-archive block: the stream stops at byte {end:,}"
                           + (f", {end - pos} bytes into a header" if pos < end else "") + " (truncated?)")
        raw_name, size_field, chksum, flag, magic, prefix = _HEADER.unpack_from(buf, pos)
        if raw_name[:1] == b"\0" and buf[pos:pos + BLOCK] == _ZERO_BLOCK:
            if np.frombuffer(buf, np.uint8, offset=pos).any():
                raise _Damaged(f"data follows the end-of-archive block at byte {pos:,}")
            _check_checksums(buf, at, stored)
            return
        if magic[:5] != b"ustar":
            raise _Damaged(f"no ustar header at byte {pos:,}")
        at.append(pos)
        stored.append(_octal(chksum))
        name = _name(raw_name, prefix, pos)
        if flag not in (b"0", b"\0"):
            raise _Damaged(f"member {name!r} is not a regular file (type {flag.decode('latin-1')!r})")
        size = _octal(size_field)
        if size < 0:
            raise _Damaged(f"member {name!r} has a size field that is not an octal number")
        body = pos + BLOCK
        if size > end - body:
            raise _Damaged(f"member {name!r} at byte {pos:,} declares {size:,} bytes, {end - body:,} are left "
                           "(truncated?)")
        key, ext = _split_name(name)
        yield name, key, ext, buf[body:body + size]
        pos = body + -(-size // BLOCK) * BLOCK  # size >= 0: at least one block further


def _name(raw_name: bytes, prefix: bytes, pos: int) -> str:
    try:
        name = raw_name.split(b"\0", 1)[0].decode()
        prefix_str = prefix.split(b"\0", 1)[0].decode()
    except UnicodeDecodeError:
        raise _Damaged(f"the member name at byte {pos:,} is not UTF-8") from None
    if not name:
        raise _Damaged(f"the member at byte {pos:,} has no name")
    return f"{prefix_str}/{name}" if prefix_str else name


def _octal(field: bytes) -> int:
    """A numeric header field: octal digits, maybe space-led, ended by NUL or space; -1 for anything else
    (a sign, `_`, a base-256 number, garbage)."""
    digits = field.lstrip(b" ").rstrip(b" \0")
    if not digits or len(digits) > 12 or digits.translate(None, b"01234567"):
        return -1
    return int(digits, 8)


def _check_checksums(buf: memoryview, at: list[int], stored: list[int]) -> None:
    """Every header's checksum: the sum of its bytes with the checksum field as spaces (unsigned, or signed
    as some old tars summed them)."""
    blocks, cols = np.frombuffer(buf, np.uint8), np.arange(BLOCK)
    for i in range(0, len(at), 1024):
        want = np.array(stored[i:i + 1024], dtype=np.int64)
        rows = blocks[np.array(at[i:i + 1024], dtype=np.int64)[:, None] + cols]
        rows[:, 148:156] = 32
        bad = rows.sum(axis=1, dtype=np.int64) != want
        if bad.any():
            bad &= rows.view(np.int8).sum(axis=1, dtype=np.int64) != want
        if bad.any():
            raise _Damaged(f"the header at byte {at[i + int(np.argmax(bad))]:,} fails its checksum")


def _split_name(name: str) -> tuple[str, str]:
    slash = name.rfind("/")
    dot = name.find(".", slash + 1)
    key, ext = (name[:dot], name[dot + 1:]) if dot > slash + 1 else (name, "")
    if ext not in EXTENSIONS:
        raise _Damaged(f"member {name!r} is neither <key>.tokens.npy nor <key>.json")
    return key, ext


def _npy_view(member: str, body: memoryview, dtype: np.dtype) -> np.ndarray:
    """The 1-D token array of an .npy payload (format versions 1-3), as a view of `body`."""
    major = body[6] if len(body) >= 10 and body[:6] == b"\x93NUMPY" else 0
    if major not in (1, 2, 3) or (major > 1 and len(body) < 12):
        raise _Damaged(f"member {member!r} is not an .npy payload")
    first = 10 if major == 1 else 12
    start = first + int.from_bytes(body[8:first], "little")
    m = _NPY_HEADER.match(body, first, start) if start <= len(body) else None
    tail = body[m.end():start].tobytes() if m is not None else b""
    if m is None or not tail.endswith(b"\n") or tail[:-1].strip(b" "):
        raise _Damaged(f"member {member!r} is not a 1-D C-ordered token array")
    found = _dtype(m.group(1))
    if found != dtype:
        raise _Damaged(f"member {member!r} holds {found} tokens, the manifest says {dtype}")
    count = int(m.group(2))
    if len(body) - start != count * dtype.itemsize:
        raise _Damaged(f"member {member!r} holds {len(body) - start:,} bytes of tokens, its header says {count:,} "
                       f"{dtype} tokens")
    return np.frombuffer(body, dtype=dtype, count=count, offset=start)


@functools.lru_cache(maxsize=64)
def _dtype(descr: bytes) -> np.dtype:
    try:
        return np.dtype(descr.decode())
    except TypeError:
        raise _Damaged(f"tokens of no known type ({descr.decode()!r})") from None


_PLAIN_ID = re.compile(rb'\{"id": "([^"\\\x00-\x1f]*)"\}')  # what json.dumps writes for an id needing no escape


def _doc_id(member: str, body: memoryview) -> str:
    m = _PLAIN_ID.fullmatch(body)
    if m is not None and m.group(1).isascii():
        return m.group(1).decode()
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


def _too_big(name: str, limit: int, info: ShardInfo, what: str = "decompresses beyond") -> FormatError:
    return FormatError(f"{name}: {what} the {limit:,} bytes its manifest entry allows ({info.documents} "
                       f"documents, {info.tokens} tokens); the shard is damaged or hostile")


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
                raise _too_big(name, limit, info)
            yield chunk
    except zstandard.ZstdError as e:
        raise FormatError(f"{name}: not a readable zstd stream ({e}); run `dataflow verify`") from None


def read_tar_stream(path: str, info: ShardInfo, itemsize: int,
                    name: str | None = None) -> bytes | bytearray | memoryview:
    """The whole tar stream of a shard, for `parse_tar_shard`, never more than the manifest's counts allow:
    a local plain `.tar` memory-mapped (every process reading it shares its pages), a `.tar.zst`
    decompressed into memory, a remote `.tar` read. `name` is the shard in errors (default: `path`)."""
    name = name or _shard_name(path, info)
    limit = tar_size_bound(info, itemsize)
    if path.endswith(".zst"):
        with fsspec.open(path, "rb") as f:
            out = bytearray()
            for chunk in _decompressed(f, name, info, itemsize):
                out += chunk
            return out
    if "://" in path:
        with fsspec.open(path, "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise _too_big(name, limit, info, "is larger than")
        return data
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise _too_big(name, limit, info, "is larger than")
        return memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)) if size else b""


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


class TarShard:
    """A tar shard read whole (`read_tar_stream`) and parsed (`parse_tar_shard`), its counts checked against its
    manifest entry: each document is a batch, a view into the (memory-mapped, when plain) stream."""

    def __init__(self, path: str, info: ShardInfo, dtype: np.dtype, name: str):
        self.ids, self.docs = parse_tar_shard(read_tar_stream(path, info, dtype.itemsize, name), name, info, dtype)
        lengths = np.array([len(d) for d in self.docs], dtype=np.int64)
        self.token_starts = np.concatenate([[0], np.cumsum(lengths)])
        self.doc_starts = np.arange(len(self.docs) + 1, dtype=np.int64)

    def batch(self, i: int) -> tuple[np.ndarray, np.ndarray, list[str]]:
        doc = self.docs[i]
        return doc, np.array([0, len(doc)], dtype=np.int64), self.ids[i:i + 1]

    def where(self, i: int) -> str:
        return f"document {self.ids[i]!r}"


class TarShardFile:
    """One tar shard being written: its documents gathered, then encoded and written whole, atomically, by
    `commit` (a tar stream has no record batches to write ahead)."""

    def __init__(self, path: str, compression: str, zstd_level: int | None):
        self.path, self.compression, self.zstd_level = path, compression, zstd_level
        self._docs: list[np.ndarray] = []
        self._ids: list[str] = []

    def add(self, values: np.ndarray, offsets: np.ndarray, ids: Any) -> None:
        self._docs += [values[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]
        self._ids += ids.to_pylist()

    def commit(self) -> tuple[int, str]:
        data = encode_tar_shard(self._docs, self._ids, self.compression, self.zstd_level)
        with atomic_open(self.path) as f:
            f.write(data)
        return len(data), hashlib.sha256(data).hexdigest()

    def abort(self, remove: bool = True) -> None:
        self._docs, self._ids = [], []  # nothing is on disk before `commit`


class TarFormat:
    """WebDataset tar shards as a `ShardFormat` (`shard_formats.py`): written and read whole, each document a
    batch; the decoded copy of a `.tar.zst` is its plain tar stream."""

    name = "tar"

    def extension(self, compression: str) -> str:
        return ".tar.zst" if compression == "zstd" else ".tar"

    def batch_tokens(self) -> int:
        return WHOLE_SHARD

    def create(self, path: str, dtype: str, compression: str, zstd_level: int | None,
               shard_size: int) -> TarShardFile:
        return TarShardFile(path, compression, zstd_level)

    def open(self, path: str, info: ShardInfo, dtype: np.dtype, name: str,
             decoded_from: str | None = None) -> TarShard:
        return TarShard(path, info, np.dtype(dtype), name)  # a decoded copy is parsed and counted like the shard

    def decode(self, src: str, dst: str, info: ShardInfo, itemsize: int, name: str | None = None) -> int:
        return decode_tar_stream(src, dst, info, itemsize, name=name)

    def decoded_bound(self, info: ShardInfo) -> int:
        return tar_size_bound(info, 4)

    def decoded_estimate(self, info: ShardInfo, itemsize: int) -> int:
        return tar_size_bound(info, itemsize)


WHOLE_SHARD = 1 << 62  # a writer hands a tar shard's documents over when the shard is complete, never sooner
TAR = TarFormat()
