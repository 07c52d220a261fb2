"""A bounded producer thread: work done on a daemon thread at most `depth` items ahead of its consumer.

`Producer` is the one helper for it (the device prefetcher's thread); `Ahead`/`produced_ahead` run an iterable
on one (tokenize's feeder). The consumer stops it with `stop()`, which joins the thread (bounded) and then
returns, in order, what was produced and never taken, so a caller can keep it (the prefetcher serves
it first on the next iteration) or drop it.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterable, Iterator

PUT_POLL_S = 0.05  # how often a producer blocked on a full queue checks whether it was stopped
_END = object()


class Producer:
    """One producer thread, its bounded queue, and the item it had in hand when told to stop."""

    def __init__(self, depth: int, name: str):
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self.name = name
        self._stop = threading.Event()
        self._carry: list[Any] = []
        self.thread: threading.Thread | None = None

    def start(self, work: Callable[..., None], *args: Any) -> None:
        """Run `work(*args, self)` on a daemon thread; it hands items over with `put`."""
        self.thread = threading.Thread(target=work, args=(*args, self), name=self.name, daemon=True)
        self.thread.start()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def put(self, item: Any) -> bool:
        """Queue `item`; once the consumer has stopped, keep it for `stop()` instead (returns False)."""
        while not self._stop.is_set():
            try:
                self.queue.put(item, timeout=PUT_POLL_S)
                return True
            except queue.Full:
                continue
        self._carry.append(item)
        return False

    def get(self) -> Any:
        return self.queue.get()

    def stop(self, join_s: float) -> list[Any] | None:
        """Stop the thread; the items produced and never taken, in order. None when the thread is still
        busy after `join_s` (stuck in its work: what it holds is abandoned); [] when called from it."""
        self._stop.set()
        if self.thread is None or self.thread is threading.current_thread():
            return []
        self.thread.join(timeout=join_s)
        if self.thread.is_alive():
            return None
        left = []
        while True:
            try:
                left.append(self.queue.get_nowait())
            except queue.Empty:
                break
        return left + self._carry


class Ahead:
    """`items`, produced on a thread started at once, at most `depth` ahead of whoever iterates; an exception
    there is raised to the consumer. `close()` stops the thread (bounded) and `drop` gets each item produced
    but never taken. Eager on purpose: tokenize's feeder submits bundles while the coordinator still checks."""

    def __init__(self, items: Iterable[Any], depth: int, name: str,
                 drop: Callable[[Any], None] = lambda item: None) -> None:
        self._drop = drop
        self._producer = Producer(depth, name)
        self._producer.start(_produce, iter(items))

    def __iter__(self) -> Iterator[Any]:
        while (item := self._producer.get()) is not _END:
            if isinstance(item, _Failed):
                raise item.exc
            yield item

    def close(self, join_s: float = 5.0) -> None:
        """Stop the thread, waiting at most `join_s` for it, and drop what it produced ahead."""
        for item in self._producer.stop(join_s) or []:
            if item is not _END and not isinstance(item, _Failed):
                self._drop(item)


def _produce(items: Iterator[Any], p: Producer) -> None:
    try:
        for item in items:
            if not p.put(item):
                return
        p.put(_END)
    except BaseException as e:
        p.put(_Failed(e))


def produced_ahead(items: Iterable[Any], depth: int, name: str, drop: Callable[[Any], None] = lambda item: None,
                   join_s: float = 5.0) -> Iterator[Any]:
    """`items` through an `Ahead` started at the first `next()`, closed when the caller stops or finishes."""
    ahead = Ahead(items, depth, name, drop)
    try:
        yield from ahead
    finally:
        ahead.close(join_s)


class _Failed:
    def __init__(self, exc: BaseException):
        self.exc = exc
