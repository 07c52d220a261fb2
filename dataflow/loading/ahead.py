"""Fetch-ahead in the order of need: one Storage's background downloads and decodes, a bounded number at once.

A task is queued under a key (its cache entry) with a priority, `(tier, call, position)`: tier 0 is what
the reader's current shuffle window needs, tier 1 the next window. Tasks start lowest priority first,
and a task of a later tier starts only once no task of an earlier tier is queued or running, so the
shards the next samples need get the link first and the window after only fills what is left.

Each task first claims its room in the cache (`claim`, run one at a time in queue order, so a later
shard never takes the room an earlier one needs); without room the queue waits, in order, until
`wake()` (a shard was released, or a task finished) and tries its head again.
"""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

log = logging.getLogger(__name__)

Fetch = Callable[[], None]  # one claimed download (and decode), ready to run
Claim = Callable[[], Optional[Fetch]]  # None: no room in the cache now; else the work to do


class FetchAhead:
    """Queued fetch-ahead tasks of one process's Storage and the threads (at most `workers`) that run them."""

    def __init__(self, workers: int, name: str):
        self.workers, self.name = max(1, workers), name
        self._mu = threading.Lock()
        self._queue: dict[str, tuple[tuple[int, int, int], Claim]] = {}
        self._running: dict[str, int] = {}  # key -> its tier
        self._active = 0  # threads working through the queue
        self._waiting = False  # the head found no room: wait for `wake`
        self._closed = False
        self._pool: ThreadPoolExecutor | None = None

    def submit(self, key: str, priority: tuple[int, int, int], claim: Claim) -> None:
        """Queue `claim` under `key` unless it runs already; a queued key takes the better priority."""
        with self._mu:
            if self._closed or key in self._running:
                return
            old = self._queue.get(key)
            if old is None or priority < old[0]:
                self._queue[key] = (priority, claim)
                self._waiting = False  # something new at the front, perhaps: try again
        self._dispatch()

    def keep_only(self, keys: set[str]) -> None:
        """Forget queued tasks whose key is not in `keys` (the reader has moved past them)."""
        with self._mu:
            for key in [k for k in self._queue if k not in keys]:
                del self._queue[key]

    def pending(self, key: str) -> bool:
        with self._mu:
            return key in self._queue or key in self._running

    def wake(self) -> None:
        """Room may have been freed in the cache: let the head of the queue try again."""
        with self._mu:
            self._waiting = False
        self._dispatch()

    def close(self, wait: bool = True) -> None:
        """Start nothing more, and wait for the tasks under way unless `wait=False`: each thread already
        started runs one task at most (like a pool's started futures), the rest of the queue is dropped."""
        with self._mu:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:  # waiting: every thread dispatched gets its one task, whenever it starts
            pool.shutdown(wait=wait, cancel_futures=not wait)
        with self._mu:
            self._queue.clear()

    def _dispatch(self) -> None:
        with self._mu:
            while not (self._closed or self._waiting) and self._queue and self._active < self.workers:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix=self.name)
                self._active += 1
                self._pool.submit(self._work)

    def _next(self, first: bool) -> tuple[str, int, Fetch] | None:
        """Under the lock: claim the head of the queue, or None (empty, waiting, a later tier, or closed
        and this thread has had its task)."""
        if (self._closed and not first) or self._waiting or not self._queue:
            return None
        key = min(self._queue, key=lambda k: self._queue[k][0])
        priority, claim = self._queue[key]
        if self._running and priority[0] > min(self._running.values()):
            return None  # the next window waits for the current one
        del self._queue[key]
        try:
            run = claim()
        except Exception as e:
            log.warning("fetch-ahead of %s failed (%s); it is retried when read", key, e)
            return key, priority[0], lambda: None
        if run is None:  # no room: back at the head, in order, until something is released
            self._queue[key] = (priority, claim)
            self._waiting = True
            return None
        return key, priority[0], run

    def _work(self) -> None:
        """Run tasks from the head of the queue until none can start now (a thread that finds none exits
        without dispatching again: no spinning while a later tier waits)."""
        first = True
        while True:
            with self._mu:
                got = None
                try:
                    got = self._next(first)
                    first = False
                finally:
                    if got is None:
                        self._active -= 1
                if got is None:
                    return
                key, tier, run = got
                self._running[key] = tier
            try:
                run()
            except Exception as e:
                log.warning("fetch-ahead of %s failed (%s); it is retried when read", key, e)
            finally:
                with self._mu:
                    self._running.pop(key, None)
                    self._waiting = False  # its room is settled now
            self._dispatch()  # a later tier may start now, on the threads left
