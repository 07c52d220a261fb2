"""A zstd shard decoded once per machine: an uncompressed copy in the shared cache.

Without it, every loader worker of every rank decompresses the record batches of the shards it reads,
so decoded memory and decompression CPU grow with the number of processes. The copy sits in the
cache as `<entry>.decoded.arrow` (an Arrow IPC file without compression) or `<entry>.decoded.tar` (the
plain tar stream); readers memory-map it, so the page cache holds one copy for all.
The first reader decodes under the entry's `.dl` lock while the others wait; the copy appears by an
atomic rename, so a decode killed midway leaves only a partial file, which nobody reads and the next
decoder (or the evictor) removes. An Arrow copy also records the sha256 of the shard it came from.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from typing import Any, Callable

from dataflow.debug import cause
from dataflow.errors import FormatError
from dataflow.formats.hashing import sha256_local
from dataflow.formats.manifest import FORMATS as SHARD_FORMATS
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.remote_errors import chain
from dataflow.formats.shard_formats import shard_format
from dataflow.loading import cache
from dataflow.memory import release_freed_memory

log = logging.getLogger(__name__)
FORMATS = SHARD_FORMATS  # zstd shards of every shard format are decoded once per machine


def suffix(fmt: str) -> str:
    return f".decoded.{fmt}"


def size_bound(shard: ShardInfo, fmt: str) -> int:
    """At most the bytes a decoded copy takes (uint32 tokens; offsets, ids and headers besides)."""
    return shard_format(fmt).decoded_bound(shard)


def size_estimate(shard: ShardInfo, fmt: str, itemsize: int) -> int:
    """About the bytes a decoded copy takes, from the manifest's counts: what the cache's limit counts for it
    before it exists (`ShardFormat.decoded_estimate`)."""
    return shard_format(fmt).decoded_estimate(shard, itemsize)


def decode_into(path: str, shard: ShardInfo, fmt: str, itemsize: int, source: Callable[[], str],
                check_source: bool, name: str | None = None,
                claim: Callable[[str, int], Any] | None = None) -> float:
    """Make `path` the decoded copy of `shard` unless another process already has; returns the CPU
    seconds this thread spent checking and decoding (0.0 when it found the copy made). `source()` gives
    the compressed file, held by the caller; `check_source` hashes it first (a local file nobody has
    checked against the manifest). A full disk is the OSError (ENOSPC/EDQUOT), never a damaged shard.
    `name` is the shard as the user knows it (its dataset path or URL), for errors. `claim(part file, bytes)`
    makes room in the cache for the copy once the source is here (`cache.reserve`)."""
    fd = cache.lock(path + ".dl", fcntl.LOCK_EX)
    try:
        if os.path.exists(path):
            return 0.0
        cache.remove_partials(path)
        src = source()
        tmp = cache.part_path(path, size_estimate(shard, fmt, itemsize))  # counted at its estimate meanwhile
        if claim is not None:
            claim(tmp, size_estimate(shard, fmt, itemsize))
        try:
            t0 = time.thread_time()
            if check_source and sha256_local(src)[1] != shard.sha256:
                raise FormatError(f"{src}: its sha256 does not match the manifest; the shard is damaged or was "
                                  "replaced: run `dataflow verify` on the dataset")
            try:
                shard_format(fmt).decode(src, tmp, shard, itemsize, name=name)
            except FormatError as e:  # the reader reports a failed write as a damaged shard
                full = _disk_full(e)
                if full is not None:
                    raise full from None  # the caller says CacheFullError; the shard is sound
                raise
            os.replace(tmp, path)
            return max(time.thread_time() - t0, 1e-9)
        finally:
            cache.remove(tmp)
            release_freed_memory()  # the decode's buffers: a worker must not grow by what it decoded
    finally:
        cache.release(fd, path + ".dl")


def usable(storages: list[Any], decode: list[tuple[str, int] | None]) -> list[tuple[str, int] | None]:
    """`decode` (per source: decode its zstd shards once per machine into the cache, or None), with None for
    the local sources whose cache folder cannot be written: those are decoded in each process, said once.
    A remote source needs its cache: one that cannot be written is raised (one line naming DATAFLOW_CACHE)."""
    out, fallen = list(decode), []
    for i, storage in enumerate(storages):
        if not (storage.remote or decode[i]):
            continue
        problem = storage.cache_problem()
        if problem is None:
            continue
        if storage.remote:
            raise cache.unusable(storage.cache_dir, problem) from cause(problem)
        out[i] = None
        fallen.append((storage, problem))
    if fallen:
        storage, problem = fallen[0]
        _warn_here([s.root for s, _ in fallen], storage.cache_dir, problem.strerror or str(problem))
    return out


def _warn_here(roots: list[str], cache_dir: str, why: str) -> None:
    log.warning("%s: the shard cache %s cannot be written (%s); decoding zstd shards in each loader process instead "
                "(more memory and CPU): set DATAFLOW_CACHE to a writable folder to decode them once per machine",
                ", ".join(roots), cache_dir, why)


def path_to_read(storage: Any, shard: ShardInfo, decode: tuple[str, int] | None,
                 compressed: bool = False) -> tuple[str, tuple | None]:
    """(the file to read `shard` from, `decode` as it stands): its decoded copy when `decode` says so, held
    until `storage.release`, else the shard itself. A local dataset whose cache became unwritable since
    `usable` decodes in the process from then on (said once); a remote one cannot do without it.
    A `compressed` local shard read in place is checked against its sha256 first (once per process): zstd
    decodes many damaged buffers without complaint, and this reader would serve their tokens."""
    try:
        if decode:
            return storage.decoded_path(shard, *decode), decode
    except cache.CacheUnwritable as e:
        if storage.remote:
            raise
        _warn_here([storage.root], storage.cache_dir, e.reason)
    path = storage.local_path(shard)
    if compressed and not storage.remote:  # a remote shard was checked when it was downloaded
        _check_in_place(path, shard, storage.url(shard))
    return path, None


_CHECKED: set[tuple[str, int, int]] = set()  # (path, size, mtime) of the local shards this process has hashed


def _check_in_place(path: str, shard: ShardInfo, name: str) -> None:
    st = os.stat(path)
    key = (path, st.st_size, st.st_mtime_ns)
    if key in _CHECKED:
        return
    if sha256_local(path) != (shard.bytes, shard.sha256):
        raise FormatError(f"{name}: its sha256 does not match the manifest; the shard is damaged or was replaced: "
                          f"run `dataflow verify` on the dataset")
    _CHECKED.add(key)


def _disk_full(e: BaseException) -> OSError | None:
    """The ENOSPC/EDQUOT behind `e` (raised, or being handled, when it was raised), if there is one."""
    return next((err for err in chain(e) if isinstance(err, OSError) and err.errno in cache.DISK_FULL), None)
