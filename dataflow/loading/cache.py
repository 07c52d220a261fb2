"""The on-disk shard cache shared by the processes of one machine: lock files, LRU, eviction.

Layout: `<cache_dir>/<16 hex: the dataset URL>/<folders of the shard path>/<sha256[:16]>-<name>` is a
complete, verified shard (an *entry*); beside it, `<entry>.part-<pid>-<thread>-<bytes>` is a download in
progress, and `<entry>.inuse` / `<entry>.dl` are lock files (empty; deleted by whoever releases one that
nobody else holds, see below). `<entry>.ok` stamps the very file a download verified
(device, inode, size): an entry without a matching stamp is hashed again before it is served.
`<entry>.decoded.arrow` is a zstd shard's uncompressed copy (`decoded.py`), an entry like the others.

Protocol (flock, so it holds between threads of a process as between processes):
- `.dl`, exclusive: the one download of an entry; the others wait for it, then find the entry there.
- `.inuse`, shared while a reader uses the entry (taken before checking the entry exists). The evictor
  deletes an entry only with an exclusive `.inuse` lock taken without waiting: never one in use.
- A lock file is deleted only under an exclusive lock on it, and `lock` checks after locking that the path
  still names the file it locked (else it locks the new one): so a lock taken on a file being deleted is
  never trusted, and lock files do not pile up once nothing uses them (`release`).
- LRU: an entry's mtime is its last access (`touch`). `evict` deletes least recently used entries until
  the incoming bytes fit; what is in use stays, so the cache exceeds the limit by at most that.

Forked children (DataLoader workers) inherit copies of their parent's lock fds, and an inherited copy
keeps a lock held for as long as the child lives: every lock fd is tracked and closed in the child.
"""

from __future__ import annotations

import errno
import fcntl
import glob
import os
import re
import shutil
import threading
import time

from dataflow import env, locks
from dataflow.errors import CacheFullError, CacheUnwritable, DataflowError
from dataflow.formats.hashing import sha256_local
from dataflow.locks import release, unlock  # noqa: F401  (the cache's lock protocol, with `lock` below)
from dataflow.sizes import parse_size

_TAG = re.compile(r"[0-9a-f]{16}")
_ENTRY = re.compile(r"[0-9a-f]{16}-.+")
_PART = ".part-"
_ROOM = ".room"  # `Room` claims: <entry>.room-<pid>-<thread>-<bytes>, their lock <entry>.room.dl
_LOCK_SUFFIXES = (".inuse", ".dl", ".ok")  # lock files, and the stamp of a verified entry

DEFAULT_SHARE = 0.5  # default cache limit: this share of the disk space free or used by the cache
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)  # a full disk or an exhausted quota: waiting or retrying frees nothing


def unusable(folder: str, e: OSError) -> DataflowError:
    """The one-line error for a cache folder that cannot be written (`e`: what the system said)."""
    why = e.strerror or str(e)
    if e.errno in DISK_FULL:
        return CacheFullError(f"{folder}: the disk of the shard cache is full ({why}); free space, lower cache_limit "
                              f"(DATAFLOW_CACHE_LIMIT) or set DATAFLOW_CACHE to a larger disk")
    err = CacheUnwritable(f"{folder}: the shard cache cannot be written here ({why}); set DATAFLOW_CACHE (or "
                          f"cache_dir=) to a writable folder")
    err.reason = why
    return err


def check_writable(folder: str) -> OSError | None:
    """None when files can be made in `folder` (made if needed), else the error that says why not."""
    try:
        os.makedirs(folder, exist_ok=True)
        probe = os.path.join(folder, f".probe-{os.getpid()}-{threading.get_ident()}")
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))
        os.remove(probe)
    except OSError as e:
        return e
    return None


def lock(path: str, op: int) -> int | None:
    """`locks.lock` for a cache lock file: a folder where it cannot be made is `CacheUnwritable` (or
    `CacheFullError`), not a raw OSError."""
    return locks.lock(path, op, unusable=lambda e: unusable(os.path.dirname(path), e))


def part_path(entry: str, size: int) -> str:
    """Where this thread downloads `entry` (of `size` bytes) before renaming it into place; the size in
    the name lets `evict` count a download in flight at its full size."""
    return f"{entry}{_PART}{os.getpid()}-{threading.get_ident()}-{size}"


def remove_partials(entry: str) -> None:
    """Delete `entry`'s partial downloads; only for the holder of its `.dl` lock (no one else writes them)."""
    for path in glob.glob(glob.escape(entry) + _PART + "*"):
        remove(path)


def reserve(cache_dir: str, limit: int | None, placeholder: str, size: int) -> bool:
    """Make room for `size` bytes under `limit` (evicting least recently used entries not in use) and
    claim it: an empty `placeholder` (a `Room`'s file, its size in its name) that every later `evict` or
    `reserve` counts at `size` until it is renamed or removed. Under the evictor's lock, so two claims
    never count the same room. Without room nothing is claimed and False is returned."""
    if limit is None:
        return True
    guard = lock(os.path.join(cache_dir, ".evict.lock"), fcntl.LOCK_EX)
    try:
        if _evict_locked(cache_dir, limit, size) > limit:
            return False
        os.makedirs(os.path.dirname(placeholder), exist_ok=True)
        os.close(os.open(placeholder, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))
        return True
    finally:
        unlock(guard)


class Room:
    """Bytes claimed ahead for one entry's work (its download, its decode): an empty placeholder
    `<entry>.room-<pid>-<thread>-<bytes>`, counted like a download in flight and kept from `evict` by an
    exclusive `<entry>.room.dl` lock while it lives (a claim whose process died is cleared like a partial)."""

    def __init__(self, cache_dir: str, limit: int | None, entry: str):
        self.cache_dir, self.limit, self.base = cache_dir, limit, entry + _ROOM
        self.fd: int | None = None
        self.path: str | None = None
        self.size = 0

    def _name(self, size: int) -> str:
        return f"{self.base}-{os.getpid()}-{threading.get_ident()}-{size}"

    def claim(self, size: int) -> bool:
        """Claim `size` bytes (see `reserve`); False, holding nothing, when they do not fit. True without a
        claim when another process claimed this entry's room already (it is doing the work; never waited for)."""
        if self.limit is None:
            return True
        self.fd = lock(self.base + ".dl", fcntl.LOCK_EX | fcntl.LOCK_NB)
        if self.fd is None:
            return True
        if not reserve(self.cache_dir, self.limit, self._name(size), size):
            self.free()
            return False
        self.path, self.size = self._name(size), size
        return True

    def hand_over(self, size: int, part: str | None = None) -> None:
        """`size` of the claimed bytes go to a part file being written now (a download or a decode, counted
        there from its name): the claim keeps only the rest, so nothing is counted twice. `part`: made here
        when its writer opens it only later (a download, after the server's first answer)."""
        if self.path is None:
            return
        if part is not None and not os.path.exists(part):
            os.close(os.open(part, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o666))
        self.size -= size
        if self.size > 0:
            os.replace(self.path, self._name(self.size))
            self.path = self._name(self.size)
        else:
            remove(self.path)
            self.path = None

    def free(self) -> None:
        if self.path is not None:
            remove(self.path)
            self.path = None
        if self.fd is not None:
            release(self.fd, self.base + ".dl")
            self.fd = None


def drop(entry: str) -> bool:
    """Delete `entry` now unless some process has it in use (its `.inuse` lock); whether it went."""
    return _delete_if_free(entry + ".inuse", entry)


def complete(entry: str, size: int) -> bool:
    """Entries appear only by rename after the checksum, so the expected size means complete."""
    try:
        return os.path.getsize(entry) == size
    except OSError:
        return False


def stamp(entry: str) -> None:
    """Record that `entry`, as it is now (this file: device, inode, size), was checked against its sha256."""
    st = os.stat(entry)
    # written in place, by the holder of the entry's `.dl` lock only: a torn stamp matches nothing, so the
    # entry is hashed again (a temp file beside it would look like an entry to `evict`)
    with open(entry + ".ok", "w") as f:
        f.write(f"{st.st_dev}:{st.st_ino}:{st.st_size}")


def stamped(entry: str) -> bool:
    """Whether `entry` is the very file `stamp` recorded (a file put there otherwise has another inode)."""
    try:
        st = os.stat(entry)
        with open(entry + ".ok") as f:
            return f.read() == f"{st.st_dev}:{st.st_ino}:{st.st_size}"
    except OSError:
        return False


def touch(entry: str) -> None:
    """Record an access for LRU (explicit ns: the kernel's `now` for utime is too coarse)."""
    now = time.time_ns()
    try:
        os.utime(entry, ns=(now, now))
    except OSError:
        pass


def remove(path: str) -> None:
    try:
        os.remove(path)
    except FileNotFoundError:
        pass


def evict(cache_dir: str, limit: int, incoming: int) -> None:
    """Delete least recently used entries not in use (and abandoned partial downloads) until
    `incoming` more bytes fit under `limit`, or nothing more can go."""
    guard = lock(os.path.join(cache_dir, ".evict.lock"), fcntl.LOCK_EX)  # one evictor at a time
    try:
        _evict_locked(cache_dir, limit, incoming)
    finally:
        unlock(guard)


def _evict_locked(cache_dir: str, limit: int, incoming: int) -> int:
    """`evict` under the evictor's lock; the bytes the cache then holds, `incoming` included."""
    entries, partials, total = _scan(cache_dir)
    total += incoming
    for size, path in partials:
        owner = path.split(_PART)[0] + ".dl" if _PART in path else path.rsplit(_ROOM + "-", 1)[0] + _ROOM + ".dl"
        if total > limit and _delete_if_free(owner, path):
            total -= size  # its downloader died (else it would hold `.dl`)
    for _, size, path in sorted(entries):
        if total <= limit:
            break
        if _delete_if_free(path + ".inuse", path):
            total -= size
    return total


def usage(cache_dir: str) -> int:
    """Bytes the cache holds: complete entries and downloads in flight (at their full size)."""
    return _scan(cache_dir)[2]


def default_limit(cache_dir: str, share: float) -> int:
    """`share` of the disk space that is free or already used by the cache: the cache can grow to it
    whatever it holds now, and leaves the rest of the free space to everything else."""
    folder = cache_dir
    while not os.path.isdir(folder) and os.path.dirname(folder) != folder:  # not made yet: its disk
        folder = os.path.dirname(folder)
    return int(share * (shutil.disk_usage(folder).free + usage(cache_dir)))


def _delete_if_free(lock_path: str, path: str) -> bool:
    fd = lock(lock_path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        return False
    try:
        os.remove(path)
        remove(path + ".ok")
        return True
    except FileNotFoundError:
        return False
    finally:
        remove(lock_path)  # under its exclusive lock (see `release`): the entry is gone, so is its lock
        unlock(fd)


def _scan(cache_dir: str) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]], int]:
    """Entries as (last access ns, bytes, path), partial downloads as (bytes, path), and all their bytes."""
    entries: list[tuple[int, int, str]] = []
    partials: list[tuple[int, str]] = []
    try:
        tags = [d.path for d in os.scandir(cache_dir) if d.is_dir() and _TAG.fullmatch(d.name)]
    except OSError:  # not made yet, or not a folder we can read: it holds nothing of ours
        return entries, partials, 0
    for tag in tags:
        for folder, _, _ in os.walk(tag):
            got = _scan_folder(folder)
            entries += got[0]
            partials += got[1]
    return entries, partials, sum(e[1] for e in entries) + sum(p[0] for p in partials)


def _scan_folder(folder: str, attempts: int = 20) -> tuple[list[tuple[int, int, str]], list[tuple[int, str]]]:
    """`_scan` of one folder. A file that goes between the listing and its stat was renamed (a download or
    a claim put in place: a new name the listing missed) or deleted: the folder is listed again, or the
    bytes of a download in flight would be counted nowhere for that moment (and a claim would take them)."""
    for _ in range(attempts):
        entries: list[tuple[int, int, str]] = []
        partials: list[tuple[int, str]] = []
        try:
            names = os.listdir(folder)
        except FileNotFoundError:
            return entries, partials
        vanished = False
        for name in names:
            if name.endswith(_LOCK_SUFFIXES) or not _ENTRY.fullmatch(name):
                continue
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except FileNotFoundError:
                vanished = True
                break
            if _PART in name or _ROOM + "-" in name:
                tail = name.rsplit("-", 1)[-1]
                partials.append((max(st.st_size, int(tail)) if tail.isdigit() else st.st_size, path))
            else:
                entries.append((st.st_mtime_ns, st.st_size, path))
        if not vanished:
            break
    return entries, partials


default_cache_dir = env.cache_dir  # where the cache lives is the environment's to say


def resolve_limit(limit: int | str | None, cache_dir: str | None) -> int | None:
    """Bytes the cache may hold: `limit` as given ("none": unlimited), else for a remote dataset
    `DEFAULT_SHARE` of the disk space free or already used by the cache."""
    if isinstance(limit, str) and limit.strip().lower() in ("none", "unlimited", "0"):
        return None
    if limit is not None:
        return parse_size(limit)
    if cache_dir is None:
        return None
    return default_limit(cache_dir, DEFAULT_SHARE)


def verified(entry: str, size: int) -> bool:
    """A cached shard that a download (or a re-check) verified against the manifest, unchanged since."""
    return complete(entry, size) and stamped(entry)


def sha256_and_sync(path: str) -> tuple[int, str]:
    """sha256 and size of a file, flushed to disk (a download about to be renamed into place)."""
    return sha256_local(path, sync=True)
