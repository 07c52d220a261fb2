"""A remote shard served a record batch at a time, before its download completes.

The first batch of an epoch draws samples from every shard of its shuffle window; waiting for those shards
whole costs the window's size over the link before anything is served. A reader that needs a record batch of
a remote Arrow shard instead asks for its bytes here (`RangedReads.read`): from the verified cache entry when
it is there, from this process's download of the shard when that range has arrived (`Part`), else one
ranged GET on the link ahead of every fetch-ahead request, whose bytes the download then keeps instead of
fetching them again. The range's sha256 (from the shard's head, `formats/arrow_ranges.py`) is checked before
the bytes are used; the download still checks the whole shard before it is renamed into place and decoded.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from dataflow.errors import FormatError
from dataflow.formats import remote
from dataflow.formats.arrow import RECORD_BATCH_TOKENS
from dataflow.formats.arrow_ranges import HEAD_PREFIX, head_length
from dataflow.formats.manifest import ShardInfo
from dataflow.loading import cache
from dataflow.loading.link import READER_STREAMS, Link, object_store

HEAD_BASE, HEAD_PER_BATCH = 4096, 160  # a head's first request: its schema, then its layout and ranges fields


class Part:
    """One download in flight in this process: its part file (`tmp`, made at its full size) and the byte ranges
    of it that hold the object's bytes, written by the download's ranged GETs or by a reader's. `close()` when
    the download ends: reads then find nothing, writes are dropped."""

    def __init__(self, tmp: str):
        self.tmp = tmp
        self._mu = threading.Lock()
        self._fd = os.open(tmp, os.O_RDWR)
        self._have: list[tuple[int, int]] = []  # sorted, disjoint [start, end)

    def gaps(self, start: int, end: int) -> list[tuple[int, int]]:
        """The pieces of [start, end) not written yet."""
        out, at = [], start
        with self._mu:
            for a, b in self._have:
                if b <= at or a >= end:
                    continue
                if a > at:
                    out.append((at, a))
                at = max(at, b)
        if at < end:
            out.append((at, end))
        return out

    def write(self, start: int, data: bytes) -> None:
        """`data` is the object's bytes at `start`: written, and known to be there."""
        with self._mu:
            if self._fd < 0:
                return
            os.pwrite(self._fd, data, start)
            spans = sorted(self._have + [(start, start + len(data))])
            merged = [spans[0]]
            for a, b in spans[1:]:
                if a <= merged[-1][1]:
                    merged[-1] = (merged[-1][0], max(merged[-1][1], b))
                else:
                    merged.append((a, b))
            self._have = merged

    def read(self, start: int, length: int) -> bytes | None:
        """The bytes at [start, start+length) when all of them are written, else None."""
        if self.gaps(start, start + length):
            return None
        with self._mu:
            return os.pread(self._fd, length, start) if self._fd >= 0 else None

    def close(self) -> None:
        with self._mu:
            fd, self._fd, self._have = self._fd, -1, []
        if fd >= 0:
            os.close(fd)


class RangedReads:
    """One Storage's reads of byte ranges (per process, like its `Link`, which `link()` gives): `parts` are its
    downloads in flight, by cache entry; `fs_path(shard)` gives the filesystem and the object's path, `entry(shard)`
    its cache entry, `url(shard)` its name in messages."""

    RETRIES = 3  # attempts at a range whose bytes are unlike their sha256

    def __init__(self, link: Callable[[], Link], fs_path: Callable[[ShardInfo], tuple[Any, str]],
                 entry: Callable[[ShardInfo], str], url: Callable[[ShardInfo], str]):
        self._link, self._fs_path, self._entry, self._url = link, fs_path, entry, url
        self._retries = self.RETRIES
        self._mu = threading.Lock()
        self.parts: dict[str, Part] = {}
        self.requests = 0  # ranged GETs this process made for readers
        self.bytes = 0  # and their bytes

    def started(self, entry: str, part: Part) -> None:
        """A download of `entry` into `part` starts here: readers' ranges are kept in it."""
        with self._mu:
            self.parts[entry] = part

    def ended(self, entry: str, part: Part) -> None:
        """That download ended (written or not)."""
        with self._mu:
            if self.parts.get(entry) is part:
                del self.parts[entry]

    def head(self, shard: ShardInfo) -> bytes:
        """The shard's head: its magic and schema message (one request, two when the schema is larger than
        guessed). Raises `NoRanges` when the server answers a ranged request with the whole object."""
        link = self._link()
        if link.honours_range is None and object_store(self._fs_path(shard)[0]):
            link.honours_range = True
        if not link.honours_range:  # ignored, or not known before a download's first ranged answer says
            raise NoRanges(self._url(shard))
        guess = HEAD_BASE + HEAD_PER_BATCH * (shard.tokens // RECORD_BATCH_TOKENS + 3)  # sized as the writer sizes them
        first = self._bytes(shard, 0, min(shard.bytes, guess), None)
        end = head_length(first[:HEAD_PREFIX])
        if end > shard.bytes:
            raise FormatError(f"{self._url(shard)}: its schema message reaches past the file's end")
        return first if end <= len(first) else first + self._bytes(shard, len(first), end - len(first), None)

    def read(self, shard: ShardInfo, offset: int, length: int, sha256: str) -> bytes:
        """The shard's bytes at [offset, offset+length), checked against `sha256` (fetched again while they fail)."""
        return self._bytes(shard, offset, length, sha256)

    def _bytes(self, shard: ShardInfo, offset: int, length: int, sha256: str | None) -> bytes:
        entry = self._entry(shard)
        for attempt in range(1, self._retries + 1):
            with self._mu:
                part = self.parts.get(entry)
            data = _local(entry, shard, offset, length)
            if data is None and part is not None:
                data = part.read(offset, length)
            fetched = data is None
            if fetched:
                data = self._get(shard, offset, length)
            if sha256 is None or hashlib.sha256(data).hexdigest() == sha256:
                with self._mu:
                    part = self.parts.get(entry)  # a download may have started meanwhile
                if fetched and part is not None and sha256 is not None:  # checked bytes only (not a head)
                    part.write(offset, data)  # the download keeps them instead of fetching them again
                return data
            if attempt < self._retries:
                remote.backoff(self._url(shard), attempt, FormatError("bytes unlike their sha256"))
        raise FormatError(f"{self._url(shard)}: bytes {offset}-{offset + length - 1} do not match their sha256 after "
                          f"{self._retries} attempts; the remote shard is damaged: run `dataflow verify`")

    def _get(self, shard: ShardInfo, offset: int, length: int) -> bytes:
        """One ranged GET on the link, ahead of the fetch-ahead's; errors are raised as they come (the reader
        then waits for the whole shard, whose download retries and says what went wrong)."""
        fs, path = self._fs_path(shard)
        data = self._link().run([lambda: fs.cat_file(path, start=offset, end=offset + length)])[0]
        with self._mu:
            self.requests += 1
            self.bytes += len(data)
        if len(data) != length:
            if offset == 0 and len(data) == shard.bytes:
                self._link().honours_range = False  # all of it came: this server ignores Range
                raise NoRanges(self._url(shard))
            raise FormatError(f"{self._url(shard)}: bytes {offset}-{offset + length - 1} came back as {len(data)} "
                              "bytes")
        return data


class NoRanges(Exception):
    """The server answers ranged requests with the whole object: shards are read whole from it."""


def _local(entry: str, shard: ShardInfo, offset: int, length: int) -> bytes | None:
    """The range from the cache's verified copy of the shard, when it is there."""
    if not cache.verified(entry, shard.bytes):
        return None
    try:
        with open(entry, "rb") as f:
            return os.pread(f.fileno(), length, offset)
    except FileNotFoundError:  # evicted, or replaced by its decoded copy, just now
        return None


_POOL: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked worker makes its own
_POOL_MU = threading.Lock()


def at_once(fn: Callable[[Any], Any], items: list) -> list:
    """`fn` of each item on the reader's request threads, together; each result, or the exception it raised."""
    global _POOL
    if len(items) <= 1:
        return [_outcome(fn, x) for x in items]
    with _POOL_MU:
        if _POOL is None or _POOL[0] != os.getpid():
            _POOL = (os.getpid(), ThreadPoolExecutor(READER_STREAMS, thread_name_prefix="dataflow-ranges"))
        pool = _POOL[1]
    return list(pool.map(functools.partial(_outcome, fn), items))


def _outcome(fn: Callable[[Any], Any], x: Any) -> Any:
    try:
        return fn(x)
    except Exception as e:
        return e
