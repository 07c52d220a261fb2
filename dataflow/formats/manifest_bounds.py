"""How far a manifest is read: at most `DATAFLOW_MANIFEST_MAX_BYTES` bytes and `MAX_DEPTH` levels of nesting, so that
an endless answer from a server, a link to /dev/zero or a hostile file fails fast in bounded memory."""

from __future__ import annotations

import os
import stat
from typing import Any

import fsspec

from dataflow import env
from dataflow.errors import FormatError

# The most bytes a manifest is read to (DATAFLOW_MANIFEST_MAX_BYTES moves it): a million shards take about 200 MB,
# so this is generous, and it stops a server's endless answer (or a link to /dev/zero) before memory runs out.
MANIFEST_MAX_BYTES = 1 << 30

# The deepest nesting a manifest may have outside its shard list (whose entries are typed fields): a manifest
# needs a few levels; its provenance is written back out (merge, `inspect --json`) by recursive encoders.
MAX_DEPTH = 32

# An object store's manifest up to this size is read in one ranged GET: one round trip, where opening the object
# first asks for its size (a HEAD, then the GET: about 0.25 s more at a 100 ms round trip, before any shard).
FIRST_READ_BYTES = 1 << 20
_RANGED = ("s3", "s3a", "gs", "gcs")  # object stores answer a Range; an HTTP server may send the whole body


def manifest_max_bytes() -> int | None:
    """The most bytes a manifest is read to: DATAFLOW_MANIFEST_MAX_BYTES, else `MANIFEST_MAX_BYTES`; None: no bound."""
    chosen = env.size("DATAFLOW_MANIFEST_MAX_BYTES")
    return MANIFEST_MAX_BYTES if chosen is None else None if chosen == "none" else int(chosen)


def read_manifest_bytes(url: str, options: dict[str, Any]) -> bytes:
    """The manifest file at `url` (fsspec `options`), bounded as `read_bounded`: on an object store, its first
    `FIRST_READ_BYTES` in one ranged GET, which is the whole of it when shorter; otherwise opened and read."""
    if url.split("://", 1)[0] in _RANGED:
        fs, path = fsspec.core.url_to_fs(url, **options)
        head = fs.cat_file(path, start=0, end=FIRST_READ_BYTES)
        if len(head) < FIRST_READ_BYTES:
            limit = manifest_max_bytes()
            if limit is not None and len(head) > limit:
                raise too_large(url, limit, len(head))
            return head
    with fsspec.open(url, "rb", **options) as f:
        return read_bounded(f, url)


def read_bounded(f: Any, url: str) -> bytes:
    """The whole of open file `f`, refused once it is longer than a manifest may be (before it is all read: a
    server's endless answer, a link to /dev/zero); a size the file declares beyond the bound, before a byte."""
    limit = manifest_max_bytes()
    if limit is None:
        return f.read()
    declared = declared_size(f)
    if isinstance(declared, int) and declared > limit:
        raise too_large(url, limit, declared)
    chunks, total = [], 0
    want = declared + 1 if isinstance(declared, int) else 1 << 20  # the end is seen in one read, when known
    while total <= limit:
        chunk = f.read(min(want, limit + 1 - total))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        want = 1 << 20  # read(n) allocates n bytes up front, even when the file has ended
    raise too_large(url, limit)


def declared_size(f: Any) -> int | None:
    """The size an fsspec file reports, or a local regular file's; None for a pipe, a device, a stream."""
    size = getattr(f, "size", None)
    if isinstance(size, int):
        return size
    try:
        st = os.fstat(f.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return st.st_size if stat.S_ISREG(st.st_mode) else None


def too_large(url: str, limit: int, declared: int | None = None) -> FormatError:
    size = "" if declared is None else f"{declared:,} bytes, "
    return FormatError(f"{url}: is {size}more than {limit:,} bytes, the most a manifest is read to (a million "
                       "shards take about 200 MB); it is not a dataflow manifest (check the URL and the server), or "
                       "raise DATAFLOW_MANIFEST_MAX_BYTES")


def too_deep(url: str) -> FormatError:
    return FormatError(f"{url}: manifest is nested more than {MAX_DEPTH} levels deep (a dataflow manifest needs a "
                       "few); it is damaged or hostile: restore its index.json, or re-create the dataset")


def nested_deeper(obj: Any, limit: int) -> bool:
    """Whether parsed JSON `obj` nests lists and objects more than `limit` levels deep (level by level, no
    recursion)."""
    level, depth = [obj], 0
    while level:
        depth += 1
        if depth > limit:
            return True
        level = [v for o in level for v in (o.values() if isinstance(o, dict) else o) if isinstance(v, (dict, list))]
    return False
