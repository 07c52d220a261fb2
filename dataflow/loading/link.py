"""One process's requests to object storage, a bounded number in flight, in the order of need.

A large remote shard is downloaded as ranged GETs (`download.py`). They all go through one `Link` per
Storage: at most `streams` requests at once, the reader's own wait first, then fetch-ahead downloads in the
order of need (the fetch-ahead's priority), each one's ranges front to back. So the shard the next sample needs gets the whole
link and arrives first, instead of every shard of the window sharing it and arriving together; the
requests after it keep the link full.
"""

from __future__ import annotations

import heapq
import itertools
import threading
from concurrent.futures import Future, wait
from typing import Any, Callable, TypeVar

T = TypeVar("T")

Order = tuple  # a fetch-ahead download's place in the order of need, `(tier, call, position)`; () for a reader's


READER_STREAMS = 8  # a reader's own requests in flight beyond `streams`: a batch's few ranges never queue


class Link:
    """At most `streams` fetch-ahead requests in flight, by their `Order` (within a download, by position), and
    a reader's own requests first, in the order asked, up to `READER_STREAMS` more: what a reader waits for
    never waits behind the fetch-ahead's requests. `honours_range` is what this storage's
    server was found to do with `Range` (None: not known yet; `probing` is held while one request finds out)."""

    def __init__(self, streams: int, name: str = "dataflow-link"):
        self.streams, self.name = max(1, streams), name
        self._cv = threading.Condition()
        self._heap: list[tuple[tuple, Future, Callable[[], object]]] = []
        self._threads = 0
        self._idle = 0
        self._ahead_running = 0  # fetch-ahead requests in flight
        self._closed = False
        self._asked = itertools.count()
        self.honours_range: bool | None = None
        self.probing = threading.Lock()

    def run(self, jobs: list[Callable[[], T]], order: Order | None = None, first: int = 0) -> list[T]:
        """`submit` the jobs, then `wait` for them."""
        return self.wait(self.submit(jobs, order, first))

    def submit(self, jobs: list[Callable[[], T]], order: Order | None = None, first: int = 0) -> list[Future]:
        """Queue `jobs` (one download's requests, in the order wanted); their futures. `order`: a fetch-ahead
        download's place in the order of need (None: a reader waits for it); `first`: the position of the
        first job in the download."""
        place = (0, (), next(self._asked)) if order is None else (1, tuple(order), 0)
        futures: list[Future] = []
        with self._cv:
            if self._closed:
                raise RuntimeError("the link is closed")
            for i, job in enumerate(jobs):
                future: Future = Future()
                heapq.heappush(self._heap, ((*place, first + i, next(self._asked)), future, job))
                futures.append(future)
            self._start_threads()
            self._cv.notify_all()
        return futures

    @staticmethod
    def wait(futures: list[Future]) -> list:
        """The results in order, or the first exception once every job started has ended (those not started
        are dropped): when this returns, none of them runs, so the caller may close what they write to."""
        try:
            return [f.result() for f in futures]
        finally:
            for f in futures:
                f.cancel()  # those still queued after a failure: never started
            wait(futures)

    def close(self) -> None:
        """Start nothing more; queued requests fail with `RuntimeError`, running ones finish."""
        with self._cv:
            self._closed = True
            queued, self._heap = self._heap, []
            self._cv.notify_all()
        for _, future, _ in queued:
            if future.set_running_or_notify_cancel():
                future.set_exception(RuntimeError("the link is closed"))

    def _start_threads(self) -> None:
        """Under the lock: a thread for each queued request that no idle thread will take, at most
        `streams + READER_STREAMS` in all (an idle thread may not have taken an earlier request yet)."""
        while self._threads < self.streams + READER_STREAMS and self._idle < len(self._heap):
            self._threads += 1
            self._idle += 1
            threading.Thread(target=self._serve, name=f"{self.name}-{self._threads}", daemon=True).start()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._closed and not self._startable():
                    self._cv.wait()
                if not self._heap:
                    self._threads -= 1
                    self._idle -= 1
                    return
                place, future, job = heapq.heappop(self._heap)
                ahead = place[0] == 1
                self._idle -= 1
                self._ahead_running += ahead
            try:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(job())
                    except BaseException as e:
                        future.set_exception(e)
            finally:
                with self._cv:
                    self._idle += 1
                    self._ahead_running -= ahead
                    self._cv.notify_all()

    def _startable(self) -> bool:
        """Under the lock: the first queued request may start (a reader's always; a fetch-ahead one within `streams`)."""
        return bool(self._heap) and (self._heap[0][0][0] == 0 or self._ahead_running < self.streams)


def object_store(fs: Any) -> bool:
    """S3, GCS and Azure answer `Range` by their API's contract: no probe needed."""
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(p in ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss") for p in protocols)
