"""Where shard bytes come from: the dataset folder itself when local, else a shared local cache.

Remote shards (any fsspec URL: `s3://`, `gs://`, `http(s)://`, ...) are downloaded once per machine into
`cache_dir` (see `cache.py` for the locking and LRU eviction that let processes share it), retried with
backoff on transient errors, checked against the manifest's sha256 and renamed into place, so no
reader ever sees a partial or wrong file. `fetch_ahead`/`work_ahead` download (and decode) ahead in
background threads, in the order of need (`ahead.py`), each claiming its room in the cache first; what is
in use is held (`holds.py`). A remote zstd shard's compressed copy leaves the cache once decoded.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import hashlib
import logging
import os
import posixpath
import shutil
import threading
import weakref
from typing import Any, Callable

import fsspec

from dataflow import env
from dataflow.debug import cause
from dataflow.errors import CacheFullError, FormatError, StorageError
from dataflow.formats import remote
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.remote_errors import explain
from dataflow.loading import cache, decoded
from dataflow.loading.ahead import Fetch, FetchAhead
from dataflow.loading.cache import lock, release
from dataflow.loading.holds import Holds
from dataflow.loading.link import Link, Order
from dataflow.loading.ranged import RangedReads
from dataflow.loading.cache import DISK_FULL
from dataflow.loading.download import cache_full, checked_again, download_verified
from dataflow.loading.cache import DEFAULT_SHARE, default_cache_dir  # noqa: F401  (part of this module's face)

__all__ = ["Storage", "StorageError", "default_cache_dir"]
log = logging.getLogger(__name__)

RETRIES = remote.RETRIES  # attempts per download
FETCH_AHEAD_WORKERS = 4  # concurrent background downloads per process
_LIVE: "weakref.WeakSet[Storage]" = weakref.WeakSet()


class Storage:
    """Resolves a manifest's shard to a complete local file, through the shared cache when remote.

    Args:
        root: the dataset folder or URL.
        cache_dir: the cache shared by all processes on this machine (default `default_cache_dir()`:
            `$DATAFLOW_CACHE`, else `$XDG_CACHE_HOME/dataflow`, else `~/.cache/dataflow`).
        cache_limit: bytes or a size like "10GB" (default `$DATAFLOW_CACHE_LIMIT`, else half of the disk
            space that is free or already used by the cache, measured when this Storage is made; copies
            sent to loader workers keep it; "none" for unlimited).
        storage_options: passed to fsspec (e.g. `{"client_kwargs": {"endpoint_url": ...}}` for S3).
        fetch_ahead_workers: background downloads at once for `fetch_ahead()`, and GETs in flight at once for
            the ranges of large shards (DATAFLOW_RANGE_BYTES), the reader's own first.
        retries: attempts per download on transient errors (5xx, resets, timeouts, bad checksums).
    """

    def __init__(self, root: str, cache_dir: str | None = None, *, cache_limit: int | str | None = None,
                 storage_options: dict[str, Any] | None = None, fetch_ahead_workers: int = FETCH_AHEAD_WORKERS,
                 retries: int = RETRIES):
        self.root = root[len("file://"):] if root.startswith("file://") else root
        self.remote = remote.is_remote(self.root)
        if self.root.endswith(".json"):  # the manifest itself was named: shards are beside it
            self.root = posixpath.dirname(self.root) if self.remote else os.path.dirname(self.root)
        self.cache_dir = os.path.abspath(cache_dir or default_cache_dir())
        limit = cache_limit if cache_limit is not None else env.size("DATAFLOW_CACHE_LIMIT")
        self.storage_options = dict(storage_options or {})
        self.fetch_ahead_workers, self.retries = max(1, fetch_ahead_workers), max(1, retries)
        # remote shards, and decoded copies of local or remote zstd shards, live under this folder
        key = self.root.rstrip("/") if self.remote else os.path.abspath(self.root)
        self.cache_root = os.path.join(self.cache_dir, hashlib.sha256(key.encode()).hexdigest()[:16])
        self._limit_arg = limit
        # a local dataset's default limit is measured on its first decode (most never touch the cache)
        self.cache_limit = cache.resolve_limit(limit, self.cache_dir) if self.remote or limit is not None else None
        self._reset()

    def _reset(self) -> None:
        """Per-process state: a fresh start after fork or unpickling (threads and locks do not carry)."""
        self.downloads = 0  # shards this process downloaded
        self.decodes = 0  # zstd shards this process decoded into the cache (once per machine, all processes)
        self.decode_hits = 0  # decoded copies this process found already there
        self.decode_s = 0.0  # seconds this process spent decoding
        self._mu = threading.Lock()
        self._holds = Holds(on_release=self._wake)  # the entries in use here (reading, or fetched ahead)
        self._ahead = FetchAhead(self.fetch_ahead_workers, "dataflow-fetch-ahead")
        self._link = Link(self.fetch_ahead_workers)  # the ranged GETs of large shards, in the order of need
        self.ranged = RangedReads(lambda: self._link, self._remote_path, self._entry, self.url)  # a batch alone
        self._calls = 0  # work_ahead calls: the order of need between them
        self._fs: Any = None
        self._fs_pid = -1
        _LIVE.add(self)

    def __getstate__(self) -> dict[str, Any]:
        keep = ("root", "remote", "cache_dir", "cache_limit", "storage_options", "fetch_ahead_workers",
                "retries", "cache_root", "_limit_arg")
        state = {k: self.__dict__[k] for k in keep}
        if not self.remote and self._limit_arg is None:  # measured at a first decode, perhaps by a fetch-ahead
            state["cache_limit"] = None  # thread just now: each copy measures its own, never a moment's value
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._reset()

    def __enter__(self) -> "Storage":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # a dataset dropped without close(): its lock fds must not leak
        try:  # never wait here: the cyclic GC may run this inside threading's own locks (a join deadlocks)
            self.close(wait=False)
        except Exception:
            pass

    # --- public -----------------------------------------------------------------------------------
    def url(self, shard: ShardInfo) -> str:
        """Where the shard is read from (as requested: quoted for http(s)); a path refused by
        `remote.shard_url` is shown as the manifest has it (messages name it, reads refuse it)."""
        if not self.remote:
            return os.path.join(self.root, shard.path)
        try:
            return remote.shard_url(self.root, shard.path)
        except FormatError:
            return posixpath.join(self.root.rstrip("/"), shard.path)

    def local_path(self, shard: ShardInfo) -> str:
        """Blocking: a complete, verified local file of the shard. Remote shards stay in use (never
        evicted) until a matching `release(shard)`; local ones are returned in place."""
        return self._local(shard)

    def in_place(self, shard: ShardInfo) -> str:
        """A local dataset's shard file, or a one-line `FormatError` when the manifest lists it and it is missing."""
        path = os.path.join(self.root, shard.path)
        if not os.path.isfile(path):
            raise FormatError(f"{path}: the manifest lists this shard but the file is missing (an incomplete "
                              f"copy?); copy the dataset again, then run `dataflow verify {self.root}`")
        return path

    def decoded_path(self, shard: ShardInfo, fmt: str = "arrow", itemsize: int = 2) -> str:
        """Blocking: an uncompressed copy of a zstd shard (`fmt`: arrow or tar) in the shared cache, decoded
        once per machine (the first reader decodes under a lock, the others wait and then map it), held
        until `release`. A remote shard's compressed copy leaves the cache once its decoded copy is made."""
        path = self._entry(shard) + decoded.suffix(fmt)
        decoded_here = [False]

        def decode() -> None:
            decoded_here[0] = self._decode(shard, path, fmt, itemsize)

        self._holds.hold(path, self.cache_bytes(shard, (fmt, itemsize)), lambda: os.path.exists(path), decode)
        if not decoded_here[0]:  # found made, by another process or thread (perhaps while waiting for it)
            with self._mu:
                self.decode_hits += 1
        return path

    def decoded_ready(self, shard: ShardInfo, fmt: str) -> bool:
        """Whether the shard's decoded copy is in the cache now (`decoded_path` would not wait for it)."""
        return os.path.exists(self._entry(shard) + decoded.suffix(fmt))

    def cache_bytes(self, shard: ShardInfo, decode: tuple[str, int] | None) -> int:
        """The bytes the shard takes in the cache once ready: its decoded copy (estimated from the manifest's
        counts) when `decode`, else the shard itself."""
        return decoded.size_estimate(shard, *decode) if decode else shard.bytes

    def release(self, shard: ShardInfo, decoded_copy: bool = True) -> None:
        """The reader is done with the shard: once every `local_path`/`decoded_path` is released (and the
        fetch-ahead's hold, which this drops too), it may be evicted."""
        paths = [self._entry(shard)] + ([self._entry(shard) + decoded.suffix(f) for f in decoded.FORMATS]
                                        if decoded_copy else [])
        for path in paths:
            self._holds.release(path, ahead_too=True)

    def fetch_ahead(self, shards: list[ShardInfo], decode: tuple[str, int] | None = None, tier: int = 0) -> None:
        """Start downloading these shards (`decode=(format, token itemsize)`: and decoding them, see
        `decoded_path`) in background threads, in this order (`ahead.py`), and return at once.

        With a cache_limit, each shard first claims its room: shards are taken in order only while they fit
        beside what is held, and each one fetched is held (never evicted) until `release(shard)` or `close`,
        so work ahead never evicts what it fetched for the reader (the queue waits for a release instead).
        Failures are logged, not raised: `local_path`/`decoded_path` retry and report them.
        """
        self._queue_ahead([shards], decode, first_tier=tier)

    def work_ahead(self, tiers: list[list[ShardInfo]], decode: tuple[str, int] | None = None) -> None:
        """What the reader needs next, in the order of need, by tier (0: the current shuffle windows, 1: the
        next ones): queued as `fetch_ahead`, and each shard fetched is held (never evicted) until `release(shard)`,
        a later call leaves it out, or `close`; queued tasks and held shards that no tier names are let go."""
        keys = self._queue_ahead(tiers, decode)
        if keys is None:
            return
        self._ahead.keep_only(keys)
        self._holds.keep_ahead(keys)

    def _queue_ahead(self, tiers: list[list[ShardInfo]], decode: tuple[str, int] | None,
                     first_tier: int = 0) -> set[str] | None:
        if not (self.remote or decode):
            return None
        with self._mu:
            self._calls += 1
            call = self._calls
        keys: set[str] = set()
        for t, shards in enumerate(tiers):
            for i, shard in enumerate(shards):
                path = self._entry(shard) + (decoded.suffix(decode[0]) if decode else "")
                keys.add(path)
                order = (first_tier + t, call, i)
                self._ahead.submit(path, order, functools.partial(self._claim_ahead, shard, path, decode, order))
        return keys

    def cache_problem(self) -> OSError | None:
        """Why this dataset's cache folder cannot be written (None when it can): read-only, no permission,
        a file in its way, a full disk. Made if missing."""
        return cache.check_writable(self.cache_root)

    def close(self, wait: bool = True) -> None:
        """Stop background downloads (waiting for those running unless `wait=False`: a process about to
        exit) and release every shard held."""
        ahead, self._ahead = self._ahead, FetchAhead(self.fetch_ahead_workers, "dataflow-fetch-ahead")
        ahead.close(wait)
        link, self._link = self._link, Link(self.fetch_ahead_workers)
        link.close()
        self._holds.close()

    def _wake(self) -> None:
        self._ahead.wake()

    _pool = property(lambda self: self._ahead._pool, doc="The fetch-ahead's thread pool (None when it has none).")
    _held = property(lambda self: self._holds._held, doc="The entries held here: path -> [fd, refcount, bytes].")

    # --- internals --------------------------------------------------------------------------------
    def _entry(self, shard: ShardInfo) -> str:
        folder, name = posixpath.split(shard.path)
        return os.path.join(self.cache_root, *[p for p in folder.split("/") if p],
                            f"{shard.sha256[:16].lower()}-{name}")

    def _local(self, shard: ShardInfo, room: cache.Room | None = None, order: Order | None = None) -> str:
        """`local_path`; `room`: the fetch-ahead's claim, which the download takes its room from; `order`: its
        place in the order of need (None: a reader waits for it)."""
        if not self.remote:
            return self.in_place(shard)
        path = self._entry(shard)
        self._holds.hold(path, shard.bytes, lambda: cache.verified(path, shard.bytes),
                         lambda: self._fetch(shard, path, wait=True, room=room, order=order))
        return path

    def _claim_ahead(self, shard: ShardInfo, path: str, decode: tuple[str, int] | None, order: Order) -> Fetch | None:
        """A fetch-ahead task's first step (in queue order): claim the room its download and decode need,
        or None when that does not fit beside what is held; then the work, which holds the shard after."""
        if self._holds.held_ahead(path):
            return lambda: None
        ready = os.path.exists(path) if decode else cache.verified(path, shard.bytes)
        room = cache.Room(self.cache_dir, self.cache_limit, path)
        if not ready:
            size = self.cache_bytes(shard, decode)
            if decode and self.remote and not cache.verified(self._entry(shard), shard.bytes):
                size += shard.bytes  # the compressed copy too, until its decoded copy replaces it
            if not room.claim(size):
                return None
        return functools.partial(self._hold_ahead, shard, path, decode, room, order)

    def _hold_ahead(self, shard: ShardInfo, path: str, decode: tuple[str, int] | None, room: cache.Room,
                    order: Order) -> None:
        """Make the shard ready (its room claimed), and hold it for the reader."""
        try:
            if decode:
                make = functools.partial(self._decode, shard, path, *decode, room=room, order=order)
                ready: Callable[[], bool] = functools.partial(os.path.exists, path)
            else:
                make = functools.partial(self._fetch, shard, path, wait=False, room=room, order=order)
                ready = functools.partial(cache.verified, path, shard.bytes)
            self._holds.hold(path, self.cache_bytes(shard, decode), ready, make, ahead=True)
        finally:
            room.free()

    def _decode(self, shard: ShardInfo, path: str, fmt: str, itemsize: int, room: cache.Room | None = None,
                order: Order | None = None) -> bool:
        """Decode the shard into `path` unless someone else just did; whether this call decoded it. `room`:
        the fetch-ahead's claim, kept for the decoded copy once the compressed one is here."""
        if self.cache_limit is None and not self.remote and self._limit_arg is None:
            self.cache_limit = cache.resolve_limit(None, self.cache_dir)  # a local dataset's first use of the cache

        def claim(tmp: str, size: int) -> None:
            if room is None:
                self._make_room(size)
            else:
                room.hand_over(size)

        try:
            seconds = decoded.decode_into(path, shard, fmt, itemsize, functools.partial(self._local, shard, room, order),
                                          check_source=not self.remote,
                                          name=self.url(shard), claim=claim)
        except OSError as e:
            if e.errno in DISK_FULL:
                raise self._full(shard, e, needed=decoded.size_bound(shard, fmt), doing="decoding") from cause(e)
            raise
        finally:
            if self.remote:
                self.release(shard, decoded_copy=False)  # the compressed copy may go: the decoded one serves
                if os.path.exists(path):
                    cache.drop(self._entry(shard))  # one copy in the cache (unless a reader still has it open)
        if seconds:
            with self._mu:
                self.decodes += 1
                self.decode_s += seconds
        return bool(seconds)

    def _filesystem(self) -> tuple[Any, str]:
        if self._fs is None or self._fs_pid != os.getpid():
            try:
                self._fs, self._rroot = fsspec.core.url_to_fs(self.root,
                                                              **remote.with_timeouts(self.root, self.storage_options))
            except (ImportError, ValueError, TypeError) as e:
                raise (explain(self.root, e) or StorageError(
                    f"{self.root}: cannot open this URL ({e}); fix the URL or storage_options")) from cause(e)
            self._fs_pid = os.getpid()
        return self._fs, self._rroot

    def _fetch(self, shard: ShardInfo, path: str, wait: bool, room: cache.Room | None = None,
               order: Order | None = None) -> None:
        """Download under the shard's `.dl` lock unless another holder completed it; `wait=False`
        leaves a shard that another process or thread is downloading to that one. The download claims its
        room first (evicting what is not in use), or takes it from the fetch-ahead's `room`."""
        fd = lock(path + ".dl", fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return
        try:
            if cache.complete(path, shard.bytes) and (cache.stamped(path) or checked_again(shard, path, self.url(shard))):
                return
            cache.remove(path)  # not the verified download: whatever it is, it is not served
            cache.remove_partials(path)  # left by a downloader that died: we hold `.dl` now
            self._check_space(shard)
            if room is None:
                self._make_room(shard.bytes)
            else:  # the download's own part file, counted at its size from now
                room.hand_over(shard.bytes, cache.part_path(path, shard.bytes))
            self._download(shard, path, order)
        finally:
            release(fd, path + ".dl")

    def _download(self, shard: ShardInfo, path: str, order: Order | None) -> None:
        fs, rroot = self._filesystem()
        download_verified(fs, remote.shard_url(rroot, shard.path), path, shard, self.url(shard),
                          self.retries, self.root, lambda e: self._full(shard, e), done=self._downloaded,
                          link=self._link, order=order, ranged=self.ranged)

    def _remote_path(self, shard: ShardInfo) -> tuple[Any, str]:
        fs, rroot = self._filesystem()
        return fs, remote.shard_url(rroot, shard.path)

    def _downloaded(self) -> None:
        with self._mu:
            self.downloads += 1

    def _check_space(self, shard: ShardInfo) -> None:
        """Refuse a download that cannot fit on the cache's disk, before writing any of it."""
        free = shutil.disk_usage(self.cache_dir).free
        if free < shard.bytes:
            raise self._full(shard, None, free)

    def _full(self, shard: ShardInfo, e: OSError | None, free: int | None = None, needed: int | None = None,
              doing: str = "caching") -> CacheFullError:
        return cache_full(self.cache_dir, self.url(shard), shard, e, self.cache_limit, self.remote, free, needed,
                          doing)

    def _make_room(self, incoming: int) -> None:
        """For what a reader waits for: evict what is not in use; the limit is passed only by what is."""
        if self.cache_limit is not None:
            cache.evict(self.cache_dir, self.cache_limit, incoming)


def _reset_after_fork() -> None:
    """A forked child (a DataLoader worker) starts afresh: its parent's threads do not exist in it and
    `cache` has already closed the inherited lock fds."""
    for storage in list(_LIVE):
        storage._reset()


def _close_all() -> None:
    """At exit, release what every Storage still holds (finalizers may not run then): no lock files left."""
    for storage in list(_LIVE):
        try:
            storage.close()
        except Exception:
            pass


os.register_at_fork(after_in_child=_reset_after_fork)
atexit.register(_close_all)
