"""One shard's download: to a part file, checked against the manifest's size and sha256, renamed into place.

Transient failures (5xx, resets, timeouts, a damaged transfer, a transfer below the progress floor) are
retried with backoff (`formats/remote.py`), within the same `retries` attempts: a trickle costs at most
`retries` spans of DATAFLOW_SLOW_TRANSFER_S. A refusal is one line that says what to do; a full disk is not
retried. A large shard comes as ranged GETs through the Storage's `Link` (`link.py`: a few at once, the
shard a reader waits for first, then in the order of need), so it arrives at the link's speed instead of
sharing it with every shard fetched ahead.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import threading
from typing import Any, Callable

from dataflow import env
from dataflow.debug import cause
from dataflow.errors import CacheFullError, FormatError, StorageError
from dataflow.formats import remote
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.remote_errors import explain
from dataflow.loading import cache
from dataflow.loading.cache import DISK_FULL  # no retry: waiting frees no space
from dataflow.loading.link import Link, Order, object_store
from dataflow.loading.ranged import Part, RangedReads

RANGE_BYTES = 8 << 20  # a ranged GET's size, for shards over twice as large (DATAFLOW_RANGE_BYTES)

log = logging.getLogger(__name__)


class _Corrupt(Exception):
    """Downloaded bytes differ from the manifest: retried, as it is often a damaged transfer."""


def download_verified(fs: Any, rpath: str, path: str, shard: ShardInfo, url: str, retries: int, dataset: str,
                      disk_full: Callable[[OSError], BaseException], done: Callable[[], None] = lambda: None,
                      link: Link | None = None, order: Order | None = None, ranged: RangedReads | None = None) -> None:
    """`fs:rpath` into `path` (the cache entry), whole and verified, stamped as such, or an error. `done()` is
    called once it is in place, before its stamp makes it visible to readers (so a count of downloads is never
    behind what a reader sees). With a `link`, a shard over twice DATAFLOW_RANGE_BYTES comes as ranged GETs
    on it (`order`: the fetch-ahead's place in the order of need; None: a reader waits for it), and what
    `ranged` readers of this process fetched of it meanwhile is kept, not fetched again."""
    tmp = cache.part_path(path, shard.bytes)
    floor = remote.ProgressFloor(url)  # one per shard: it warns once, whatever the attempts
    step = range_bytes()
    for attempt in range(1, retries + 1):
        try:
            floor.restart()
            if link is not None and step is not None and shard.bytes > 2 * step:
                get_ranges(fs, rpath, tmp, shard.bytes, step, floor, link, order, ranged, path)
            else:
                fs.get_file(rpath, tmp, callback=floor, **_one_get(fs))
            size, digest = cache.sha256_and_sync(tmp)
            if (size, digest) != (shard.bytes, shard.sha256):
                raise _Corrupt(f"got {size} bytes with sha256 {digest[:12]}..., the manifest says "
                               f"{shard.bytes} bytes with sha256 {shard.sha256[:12]}...")
            os.replace(tmp, path)
        except OSError as e:
            if e.errno in DISK_FULL:
                raise disk_full(e) from cause(e)
            if isinstance(e, FileNotFoundError):
                raise FormatError(f"{url}: shard listed in the manifest is not there (not found); "
                                  "re-upload it or check the dataset URL") from None
            _retry_or_raise(url, e, attempt, retries, dataset)
        except Exception as e:
            _retry_or_raise(url, e, attempt, retries, dataset)
        else:
            done()
            cache.stamp(path)  # the download is in place: only its stamp is left to write
            return
        finally:
            cache.remove(tmp)


def range_bytes() -> int | None:
    """DATAFLOW_RANGE_BYTES (default 8 MB), or None for one GET per shard ("none")."""
    value = env.size("DATAFLOW_RANGE_BYTES")
    return None if value == "none" else max(1 << 16, int(value)) if value is not None else RANGE_BYTES


def get_ranges(fs: Any, rpath: str, tmp: str, size: int, step: int, floor: remote.ProgressFloor, link: Link,
               order: Order | None, ranged: RangedReads | None = None, entry: str = "") -> None:
    """The object as ranged GETs of `step` bytes on `link`, each written in place into `tmp` (made at its full
    size first), leaving out what a reader of `ranged` wrote there meanwhile (the download of `entry`); the
    transfer floor is checked as each range ends. Object stores honour `Range`; another
    server's first ranged answer says whether it does (the other downloads wait for it): one that ignores it
    answers with the whole object, which is then the download, and later shards are one GET each."""
    spans = [(start, min(start + step, size)) for start in range(0, size, step)]
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)
    floor.set_size(size)
    counted = threading.Lock()  # the floor is one callback; the ranges end on several threads

    def arrived(n: int) -> None:
        with counted:
            floor.relative_update(n)

    def get(span: tuple[int, int]) -> bool:
        gaps = part.gaps(*span)
        arrived(span[1] - span[0] - sum(b - a for a, b in gaps))  # a reader fetched the rest
        for start, end in gaps:
            data = fs.cat_file(rpath, start=start, end=end)
            if start == 0 and len(data) == size:  # Range ignored: this is all of it
                part.write(0, data)
                arrived(size)
                return True
            if len(data) != end - start:
                raise _Corrupt(f"bytes {start}-{end - 1} came back as {len(data)} bytes")
            part.write(start, data)
            arrived(len(data))
        return False

    part = Part(tmp)
    if ranged is not None:
        ranged.started(entry, part)
    try:
        if link.honours_range is None and object_store(fs):
            link.honours_range = True
        first, rest = 0, None
        if link.honours_range is None:
            with link.probing:  # the rest queued before another download may queue its own
                if link.honours_range is None:
                    whole = link.run([functools.partial(get, spans[0])], order)[0]
                    link.honours_range, first = not whole, 1
                    if not whole:
                        rest = link.submit([functools.partial(get, span) for span in spans[1:]], order, first=1)
        if rest is not None:
            link.wait(rest)
        elif link.honours_range:
            link.run([functools.partial(get, span) for span in spans[first:]], order, first=first)
        elif not first:  # known to ignore Range: one GET, as for a small shard
            _ended(ranged, entry, part)
            fs.get_file(rpath, tmp, callback=floor)
    finally:
        _ended(ranged, entry, part)


def _ended(ranged: RangedReads | None, entry: str, part: Part) -> None:
    """The download's part file is no longer written by ranges: readers find nothing more in it."""
    if ranged is not None:
        ranged.ended(entry, part)
    part.close()


def _one_get(fs: Any) -> dict[str, Any]:
    """`get_file` options for one GET per shard: s3fs opens a whole GET, then drops it for concurrent ranged
    GETs when the object is larger than its block size (50 MB); the fetch-ahead downloads several shards at
    once already, so those ranges only add requests (13 GETs instead of 5 an epoch of 65 MB shards)."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return {"max_concurrency": 1} if "s3" in protocols else {}


def _retry_or_raise(url: str, e: Exception, attempt: int, retries: int, dataset: str) -> None:
    """Sleep before the next attempt when `e` is transient and attempts are left, else raise."""
    if not (isinstance(e, (_Corrupt, remote.TooSlow)) or remote.transient(e)):
        raise (explain(url, e) or StorageError(f"{url}: download refused ({remote.describe(e)}); check the URL, "
                                               "credentials and storage_options")) from cause(e)
    if attempt == retries:
        if isinstance(e, _Corrupt):
            raise FormatError(f"{url}: downloaded bytes do not match the manifest after {_attempts(attempt)} ({e}); "
                              f"the remote shard is damaged or was rewritten: run `dataflow verify {dataset}`") from None
        if isinstance(e, remote.TooSlow):  # a fresh connection each attempt; as slow on every one
            raise StorageError(f"{url}: download too slow on {_attempts(attempt)} ({e}); check the network and the "
                               "server, or lower DATAFLOW_MIN_TRANSFER_BPS / raise DATAFLOW_SLOW_TRANSFER_S") from None
        raise StorageError(f"{url}: download failed after {_attempts(attempt)} ({remote.describe(e)}); check the "
                           "network and the server, then retry") from cause(e)
    remote.backoff(url, attempt, e)


def _attempts(n: int) -> str:
    return "1 attempt" if n == 1 else f"{n} attempts"


def checked_again(shard: ShardInfo, path: str, url: str) -> bool:
    """A cached file of the right size that no download here verified (left by an older version, or put
    there by something else): trusted only if its sha256 matches the manifest (then stamped)."""
    if cache.sha256_and_sync(path) != (shard.bytes, shard.sha256):
        log.warning("%s: the cached copy %s does not match the manifest; downloading it again", url, path)
        return False
    cache.stamp(path)
    return True


def cache_full(cache_dir: str, url: str, shard: ShardInfo, e: OSError | None, limit: int | None, remote_data: bool,
               free: int | None = None, needed: int | None = None, doing: str = "caching") -> CacheFullError:
    """The one-line error for a full cache disk while `doing` (caching, decoding) the shard at `url`."""
    free = shutil.disk_usage(cache_dir).free if free is None else free
    amount = f"{shard.bytes / 1e6:.1f} MB" if needed is None else f"up to {needed / 1e6:.1f} MB"
    shown = "unlimited" if limit is None else f"{limit / 1e9:.1f} GB"
    local = "" if remote_data else ", or pass decode_once=False to decode in each process instead"
    return CacheFullError(
        f"{cache_dir}: disk full while {doing} {url} ({amount} needed, "
        f"{free / 1e6:.1f} MB free{'' if e is None else ': ' + (e.strerror or str(e))}); free space, lower "
        f"cache_limit (now {shown}; DATAFLOW_CACHE_LIMIT) or set DATAFLOW_CACHE to a larger disk{local}")
