"""The cache entries one process holds in use: a shared `.inuse` lock each (never evicted meanwhile), counted.

A reader holds the shards it has open; the fetch-ahead holds what it fetched until the reader has read and
released it (or has moved past it), so the evictor never deletes work done ahead for the reader. Every
release that lets an entry go calls `on_release` (the fetch-ahead may have room now).
"""

from __future__ import annotations

import fcntl
import threading
from typing import Callable

from dataflow.loading import cache
from dataflow.loading.cache import lock, release, unlock


class Holds:
    """Entry -> [fd holding LOCK_SH on `.inuse`, refcount, bytes]; the entries held for the fetch-ahead."""

    def __init__(self, on_release: Callable[[], None]):
        self._mu = threading.Lock()
        self._held: dict[str, list[int]] = {}
        self._ahead: set[str] = set()
        self._on_release = on_release

    def __contains__(self, path: str) -> bool:
        with self._mu:
            return path in self._held

    def held_ahead(self, path: str) -> bool:
        with self._mu:
            return path in self._ahead

    def hold(self, path: str, size: int, ready: Callable[[], bool], make: Callable[[], None],
             ahead: bool = False) -> bool:
        """Hold entry `path`, making it first when it is not `ready()`; a matching `release` per call that
        returns True. `ahead`: for the fetch-ahead, which holds it once (False: held ahead already, or `make`
        left the entry to another process)."""
        with self._mu:
            held = self._held.get(path)
            if ahead and path in self._ahead:
                return False
            if held is not None:
                held[1] += 1
                self._ahead.update([path] if ahead else [])
        if held is not None:
            cache.touch(path)
            return True
        fd = lock(path + ".inuse", fcntl.LOCK_SH)  # taken before the check: no eviction after it
        try:
            if not ready():
                make()
                if ahead and not ready():
                    release(fd, path + ".inuse")
                    return False
            cache.touch(path)
        except BaseException:
            release(fd, path + ".inuse")
            raise
        with self._mu:
            held = self._held.setdefault(path, [fd, 0, size])
            if ahead and path in self._ahead:  # another thread held it ahead meanwhile
                mine = False
            else:
                held[1] += 1
                mine = True
                if ahead:
                    self._ahead.add(path)
        if held[0] != fd:  # another thread of this process got it meanwhile; its lock suffices
            unlock(fd)
        return mine

    def release(self, path: str, ahead_too: bool = False) -> None:
        """One release of `path`; `ahead_too`: and the fetch-ahead's hold of it."""
        with self._mu:
            n = 1 + (ahead_too and path in self._ahead)
            if ahead_too:
                self._ahead.discard(path)
        for _ in range(n):
            self._release_one(path)

    def keep_ahead(self, keep: set[str]) -> None:
        """Let go of the fetch-ahead's holds outside `keep`."""
        with self._mu:
            gone = [p for p in self._ahead if p not in keep]
            self._ahead.difference_update(gone)
        for path in gone:
            self._release_one(path)

    def close(self) -> None:
        """Release every entry held."""
        with self._mu:
            held, self._held = list(self._held.items()), {}
            self._ahead.clear()
        for path, (fd, _, _) in held:
            release(fd, path + ".inuse")

    def _release_one(self, path: str) -> None:
        with self._mu:
            held = self._held.get(path)
            if held is None:
                return
            held[1] -= 1
            if held[1] > 0:
                return
            del self._held[path]
        release(held[0], path + ".inuse")
        self._on_release()
