"""Lock files (flock): take, give back, tidy away, and ask whether someone else holds one.

flock holds between threads of a process as between processes (each `lock` opens its own fd). A lock
file may be deleted by `release` while another takes it, so `lock` checks after locking that the path
still names the file it locked, and locks the new one otherwise. Forked children inherit copies of
the parent's lock fds, and an inherited copy keeps a lock held as long as the child lives: every fd
`lock` opens is tracked and closed in a forked child (without unlocking the parent's lock).
"""

from __future__ import annotations

import fcntl
import os
import threading
from typing import Callable

from dataflow.debug import cause

_fds: set[int] = set()  # every lock fd this process holds open
_fds_mu = threading.Lock()


def lock(path: str, op: int, unusable: Callable[[OSError], Exception] | None = None) -> int | None:
    """An fd of lock file `path` (made, with its folder, if needed) holding flock `op`; None when
    LOCK_NB finds it taken. `unusable(error)` is raised (chained) when the file cannot be made."""
    while True:
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            fd = _open(path, os.O_CREAT)
        except OSError as e:
            if unusable is None:
                raise
            raise unusable(e) from cause(e)
        try:
            fcntl.flock(fd, op)
        except BlockingIOError:
            unlock(fd)
            return None
        except BaseException:
            unlock(fd)
            raise
        if _names(path, fd):
            return fd
        unlock(fd)  # locked a file that `release` deleted meanwhile: lock the one there now


def unlock(fd: int) -> None:
    """Close a lock fd from `lock` (which releases its flock)."""
    with _fds_mu:
        _fds.discard(fd)
        os.close(fd)


def release(fd: int, path: str) -> None:
    """Unlock `fd` (a lock on `path`), then delete the lock file if nobody else holds or takes it now."""
    unlock(fd)
    try:
        fd = _open(path, 0)
    except OSError:  # already gone (another releaser tidied it)
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _names(path, fd):
            os.remove(path)  # under its exclusive lock: a waiter on it finds it gone and locks a new one
    except OSError:  # held by someone (BlockingIOError), or removed meanwhile
        pass
    finally:
        unlock(fd)


def hold_open(fd: int) -> None:
    """Take an exclusive flock on an open file or folder `fd` (a temp being written: `held_elsewhere` sees it
    while the fd is open, and no longer once its writer is gone, killed or not)."""
    fcntl.flock(fd, fcntl.LOCK_EX)


def held_elsewhere(path: str) -> bool:
    """True when another open file description holds an exclusive flock on `path` (False if no such file)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _open(path: str, create: int) -> int:
    with _fds_mu:  # so that a fork never sees an fd opened but not yet tracked
        fd = os.open(path, os.O_RDWR | create | os.O_CLOEXEC, 0o666)
        _fds.add(fd)
    return fd


def _names(path: str, fd: int) -> bool:
    """Whether `path` still names the file open as `fd` (a lock file may be deleted by `release`)."""
    try:
        st, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (held.st_dev, held.st_ino)


def _close_inherited() -> None:
    """In a forked child: close the parent's lock fds without unlocking (that would unlock the parent's)."""
    for fd in _fds:
        try:
            os.close(fd)
        except OSError:
            pass
    _fds.clear()
    _fds_mu.release()


os.register_at_fork(before=_fds_mu.acquire, after_in_parent=_fds_mu.release, after_in_child=_close_inherited)
