"""Where shard bytes come from: the dataset folder itself when local, else a shared local cache.

Remote shards (any fsspec URL: `s3://`, `gs://`, `http(s)://`, ...) are downloaded once per machine into
`cache_dir` (see `cache.py` for the locking and LRU eviction that let processes share it), retried with
backoff on transient errors, checked against the manifest's sha256 and renamed into place, so no
reader ever sees a partial or wrong file. `fetch_ahead` downloads ahead in background threads.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import logging
import os
import posixpath
import shutil
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import fsspec

from dataflow import env
from dataflow.debug import cause
from dataflow.errors import CacheFullError, FormatError, StorageError
from dataflow.formats import remote
from dataflow.formats.manifest import ShardInfo
from dataflow.formats.remote_errors import explain
from dataflow.loading import cache, decoded
from dataflow.loading.cache import DISK_FULL
from dataflow.loading.download import download_verified
from dataflow.loading.cache import DEFAULT_SHARE, default_cache_dir  # noqa: F401  (part of this module's face)
from dataflow.loading.cache import lock, release, unlock

__all__ = ["Storage", "StorageError", "default_cache_dir", "fetch_ahead"]
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
        fetch_ahead_workers: background downloads at once for `fetch_ahead()`.
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
        self._held: dict[str, list[int]] = {}  # entry -> [fd holding LOCK_SH on .inuse, refcount, bytes]
        self._pending: set[str] = set()  # entries queued or running in the fetch-ahead pool
        self._pool: ThreadPoolExecutor | None = None
        self._fs: Any = None
        self._fs_pid = -1
        _LIVE.add(self)

    def __getstate__(self) -> dict[str, Any]:
        keep = ("root", "remote", "cache_dir", "cache_limit", "storage_options", "fetch_ahead_workers",
                "retries", "cache_root", "_limit_arg")
        return {k: self.__dict__[k] for k in keep}

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
        if not self.remote:
            return self.in_place(shard)
        path = self._entry(shard)
        return self._hold(path, shard.bytes, lambda: cache.verified(path, shard.bytes),
                          lambda: self._fetch(shard, path, wait=True))

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
        until `release`."""
        path = self._entry(shard) + decoded.suffix(fmt)
        decoded_here = [False]

        def decode() -> None:
            decoded_here[0] = self._decode(shard, path, fmt, itemsize)

        out = self._hold(path, 2 * shard.tokens, lambda: os.path.exists(path), decode)
        if not decoded_here[0]:  # found made, by another process or thread (perhaps while waiting for it)
            with self._mu:
                self.decode_hits += 1
        return out

    def release(self, shard: ShardInfo, decoded_copy: bool = True) -> None:
        """The reader is done with the shard: once every `local_path`/`decoded_path` is released, it may be
        evicted."""
        self._release_entry(self._entry(shard))
        if decoded_copy:
            for fmt in decoded.FORMATS:
                self._release_entry(self._entry(shard) + decoded.suffix(fmt))

    def fetch_ahead(self, shards: list[ShardInfo], decode: tuple[str, int] | None = None) -> None:
        """Start downloading these shards (`decode=(format, token itemsize)`: and decoding them, see
        `decoded_path`) in background threads and return at once.

        Ready or already queued shards are skipped; with a cache_limit, shards are taken in order only
        while they fit beside the shards in use, so work ahead never evicts what is about to be read.
        Failures are logged, not raised: `local_path`/`decoded_path` retry and report them.
        """
        if not (self.remote or decode):
            return
        with self._mu:
            budget = None if self.cache_limit is None else \
                self.cache_limit - sum(h[2] for h in self._held.values())
        for shard in shards:
            path = self._entry(shard) + (decoded.suffix(decode[0]) if decode else "")
            with self._mu:
                if path in self._held:
                    continue
                if budget is not None:
                    budget -= 2 * shard.tokens if decode else shard.bytes
                    if budget < 0:
                        return
                ready = os.path.exists(path) if decode else cache.verified(path, shard.bytes)
                if path in self._pending or ready:
                    continue
                self._pending.add(path)
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.fetch_ahead_workers, thread_name_prefix="dataflow-fetch-ahead")
                if decode:
                    self._pool.submit(self._decode_ahead, shard, path, *decode)
                else:
                    self._pool.submit(self._fetch_ahead_one, shard, path)

    def cache_problem(self) -> OSError | None:
        """Why this dataset's cache folder cannot be written (None when it can): read-only, no permission,
        a file in its way, a full disk. Made if missing."""
        return cache.check_writable(self.cache_root)

    def close(self, wait: bool = True) -> None:
        """Stop background downloads (waiting for those running unless `wait=False`: a process about to
        exit) and release every shard held."""
        with self._mu:
            pool, self._pool = self._pool, None
            held, self._held = list(self._held.items()), {}
        if pool is not None:
            pool.shutdown(wait=wait, cancel_futures=True)
        with self._mu:
            self._pending.clear()  # cancelled ones never ran
        for path, (fd, _, _) in held:
            release(fd, path + ".inuse")

    # --- internals --------------------------------------------------------------------------------
    def _entry(self, shard: ShardInfo) -> str:
        folder, name = posixpath.split(shard.path)
        return os.path.join(self.cache_root, *[p for p in folder.split("/") if p],
                            f"{shard.sha256[:16].lower()}-{name}")

    def _hold(self, path: str, size: int, ready: Callable[[], bool], make: Callable[[], None]) -> str:
        """Hold cache entry `path` in use (a shared `.inuse` lock: never evicted meanwhile), making it
        first when it is not `ready()`; a matching release per call."""
        with self._mu:
            held = self._held.get(path)
            if held is not None:
                held[1] += 1
        if held is not None:
            cache.touch(path)
            return path
        fd = lock(path + ".inuse", fcntl.LOCK_SH)  # taken before the check: no eviction after it
        try:
            if not ready():
                make()
            cache.touch(path)
        except BaseException:
            release(fd, path + ".inuse")
            raise
        with self._mu:
            held = self._held.setdefault(path, [fd, 0, size])
            held[1] += 1
        if held[0] != fd:  # another thread of this process got it meanwhile; its lock suffices
            unlock(fd)
        return path

    def _decode(self, shard: ShardInfo, path: str, fmt: str, itemsize: int) -> bool:
        """Decode the shard into `path` unless someone else just did; whether this call decoded it."""
        if self.cache_limit is None and not self.remote and self._limit_arg is None:
            self.cache_limit = cache.resolve_limit(None, self.cache_dir)  # a local dataset's first use of the cache
        self._make_room(decoded.size_bound(shard, fmt))
        try:
            seconds = decoded.decode_into(path, shard, fmt, itemsize, lambda: self.local_path(shard),
                                          check_source=not self.remote, name=self.url(shard))
        except OSError as e:
            if e.errno in DISK_FULL:
                raise self._full(shard, e, needed=decoded.size_bound(shard, fmt), doing="decoding") from cause(e)
            raise
        finally:
            if self.remote:
                self.release(shard, decoded_copy=False)  # the compressed copy may go: the decoded one serves
        if seconds:
            with self._mu:
                self.decodes += 1
                self.decode_s += seconds
        return bool(seconds)

    def _release_entry(self, path: str) -> None:
        with self._mu:
            held = self._held.get(path)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                return
            del self._held[path]
        release(held[0], path + ".inuse")

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

    def _fetch_ahead_one(self, shard: ShardInfo, path: str) -> None:
        try:
            fd = lock(path + ".inuse", fcntl.LOCK_SH)  # not evictable while it downloads
            try:
                if not cache.verified(path, shard.bytes):
                    self._fetch(shard, path, wait=False)
                if cache.verified(path, shard.bytes):
                    cache.touch(path)
            finally:
                release(fd, path + ".inuse")
        except Exception as e:
            log.warning("download-ahead of %s failed (%s); it is retried when read", self.url(shard), e)
        finally:
            with self._mu:
                self._pending.discard(path)

    def _decode_ahead(self, shard: ShardInfo, path: str, fmt: str, itemsize: int) -> None:
        try:
            self.decoded_path(shard, fmt, itemsize)
            self.release(shard)
        except Exception as e:
            log.warning("decode-ahead of %s failed (%s); it is retried when read", self.url(shard), e)
        finally:
            with self._mu:
                self._pending.discard(path)

    def _fetch(self, shard: ShardInfo, path: str, wait: bool) -> None:
        """Download under the shard's `.dl` lock unless another holder completed it; `wait=False`
        leaves a shard that another process or thread is downloading to that one."""
        fd = lock(path + ".dl", fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        if fd is None:
            return
        try:
            if cache.complete(path, shard.bytes) and (cache.stamped(path) or self._checked_again(shard, path)):
                return
            cache.remove(path)  # not the verified download: whatever it is, it is not served
            cache.remove_partials(path)  # left by a downloader that died: we hold `.dl` now
            self._make_room(shard.bytes)
            self._check_space(shard)
            self._download(shard, path)
        finally:
            release(fd, path + ".dl")

    def _checked_again(self, shard: ShardInfo, path: str) -> bool:
        """A cached file of the right size that no download here verified (left by an older version, or put
        there by something else): trusted only if its sha256 matches the manifest."""
        if cache.sha256_and_sync(path) != (shard.bytes, shard.sha256):
            log.warning("%s: the cached copy %s does not match the manifest; downloading it again",
                        self.url(shard), path)
            return False
        cache.stamp(path)
        return True

    def _download(self, shard: ShardInfo, path: str) -> None:
        fs, rroot = self._filesystem()
        download_verified(fs, remote.shard_url(rroot, shard.path), path, shard, self.url(shard),
                          self.retries, self.root, lambda e: self._full(shard, e))
        with self._mu:
            self.downloads += 1

    def _check_space(self, shard: ShardInfo) -> None:
        """Refuse a download that cannot fit on the cache's disk, before writing any of it."""
        free = shutil.disk_usage(self.cache_dir).free
        if free < shard.bytes:
            raise self._full(shard, None, free)

    def _full(self, shard: ShardInfo, e: OSError | None, free: int | None = None, needed: int | None = None,
              doing: str = "caching") -> CacheFullError:
        free = shutil.disk_usage(self.cache_dir).free if free is None else free
        amount = f"{shard.bytes / 1e6:.1f} MB" if needed is None else f"up to {needed / 1e6:.1f} MB"
        limit = "unlimited" if self.cache_limit is None else f"{self.cache_limit / 1e9:.1f} GB"
        local = "" if self.remote else ", or pass decode_once=False to decode in each process instead"
        return CacheFullError(
            f"{self.cache_dir}: disk full while {doing} {self.url(shard)} ({amount} needed, "
            f"{free / 1e6:.1f} MB free{'' if e is None else ': ' + (e.strerror or str(e))}); free space, lower "
            f"cache_limit (now {limit}; DATAFLOW_CACHE_LIMIT) or set DATAFLOW_CACHE to a larger disk{local}")

    def _make_room(self, incoming: int) -> None:
        if self.cache_limit is not None:
            cache.evict(self.cache_dir, self.cache_limit, incoming)


def fetch_ahead(storages: list[Storage], shards: list[tuple[int, ShardInfo]],
                decode: list[tuple[str, int] | None]) -> None:
    """Download (and for sources with `decode[src]`, decode) ahead `(source index, shard)` pairs, as
    `StreamingDataset.shards` lists them."""
    by_source: dict[int, list[ShardInfo]] = {}
    for src, info in shards:
        by_source.setdefault(src, []).append(info)
    for src, infos in by_source.items():
        storages[src].fetch_ahead(infos, decode=decode[src])


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
