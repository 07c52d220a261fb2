"""`DevicePrefetcher`: batches onto the device while the previous step computes.

A background thread pulls batches from upstream (so host-side loading overlaps the step) into a
bounded queue. On CUDA it copies each batch into one of a ring of pinned, reused host slots, launches
the host-to-device copy with `non_blocking=True` on a side stream and records an event; the consumer's
stream waits on that event and the tensors are `record_stream`-ed, so the caching allocator never
hands their memory out early. A slot is refilled only after its copy has finished. On CPU the same
thread gives the overlap without pinning.
"""

from __future__ import annotations

import queue
from collections import deque
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from dataflow.errors import ConfigError

_DONE = object()


@dataclass
class PrefetchStats:
    batches: int = 0
    wait_s: float = 0.0  # consumer time blocked on the next batch
    last_wait_s: float = 0.0
    host_allocations: int = 0  # pinned slots allocated (stops growing after warm-up)
    upstream_s: float = 0.0  # producer-thread time blocked on the upstream iterator (host-side loading)
    copy_s: float = 0.0  # host-to-device copy time, from CUDA events (0 on CPU)
    direct_copies: int = 0  # batches copied straight from the loader's pinned ring (no staging copy)
    waits: deque = field(default_factory=lambda: deque(maxlen=100_000))  # recent waits, bounded


class _TimedEvent:
    """The start and end CUDA events of one batch's host-to-device copy."""

    def __init__(self, start: Any, end: Any):
        self.start, self.end = start, end

    def synchronize(self) -> None:
        self.end.synchronize()


def _all_pinned(batch: Any) -> bool:
    tensors = [batch] if torch.is_tensor(batch) else list(batch.values()) if isinstance(batch, dict) else []
    return bool(tensors) and all(torch.is_tensor(t) and t.is_pinned() for t in tensors)


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class _PinnedRing:
    """`size` pinned host copies of one batch layout, reused round-robin."""

    def __init__(self, size: int, stats: PrefetchStats):
        self.size, self.stats = size, stats
        self.slots: list[dict[str, torch.Tensor] | None] = [None] * size
        self.events: list[Any] = [None] * size
        self.next = 0

    def take(self, batch: dict[str, Any]) -> tuple[int, dict[str, torch.Tensor]]:
        i = self.next
        self.next = (i + 1) % self.size
        if self.events[i] is not None:
            self.events[i].synchronize()  # the previous copy out of this slot has finished
        slot = self.slots[i]
        if slot is None or any(k not in slot or slot[k].shape != v.shape or slot[k].dtype != v.dtype
                               for k, v in batch.items() if torch.is_tensor(v)):
            slot = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=True)
                    for k, v in batch.items() if torch.is_tensor(v)}
            self.slots[i] = slot
            self.stats.host_allocations += 1
        return i, slot


class DevicePrefetcher:
    """Iterate `batches` (dicts of tensors, or tensors) on `device`, `depth` batches ahead.

    A yielded CPU batch is the upstream's own object (for a `StreamingDataLoader` with workers: a view
    of its slot ring, valid while fewer than `lifetime - depth - 1` further batches have been taken).
    CUDA batches are device tensors owned by the consumer. When the upstream is a loader whose slot
    ring is pinned (`pin_memory=True`), the copy goes straight from the ring to the device, with no
    staging copy; the producer then waits for a copy to finish before its slot can come round again.
    """

    def __init__(self, batches: Iterable[Any], device: str | torch.device = "cpu", depth: int = 2):
        if depth < 1:
            raise ValueError("depth must be at least 1")
        self.upstream = batches
        lifetime = getattr(batches, "lifetime", None)
        if lifetime is not None and getattr(batches, "num_workers", 0) and lifetime < depth + 2:
            raise ConfigError(f"the loader's batches live for {lifetime} batches; a prefetcher of depth {depth} "
                              f"needs at least {depth + 2}: raise StreamingDataLoader(lifetime=...)")
        self.device = torch.device(device)
        self.depth = depth
        self.stats = PrefetchStats()
        self._cuda = self.device.type == "cuda"
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._last_event: _TimedEvent | None = None
        self._state: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        """The upstream loader's state after the last batch this prefetcher *yielded* (not what its
        thread has read ahead): checkpoint this, and `load_state_dict` it into the loader to resume."""
        if self._state is not None:
            return self._state
        state_of = getattr(self.upstream, "state_dict", None)
        if state_of is None:
            raise TypeError("the upstream iterable has no state_dict()")
        return state_of()

    # --- producer thread ------------------------------------------------------------------------
    def _produce(self, it: Iterator[Any]) -> None:
        stream = torch.cuda.Stream(device=self.device) if self._cuda else None
        ring = _PinnedRing(self.depth + 1, self.stats) if self._cuda else None
        lifetime = getattr(self.upstream, "lifetime", None)
        state_of = getattr(self.upstream, "state_dict", None)
        in_flight: deque = deque()  # events of direct copies whose source slot the loader may reuse
        try:
            while True:
                t0 = time.perf_counter()
                batch = next(it, _DONE)
                self.stats.upstream_s += time.perf_counter() - t0
                if batch is _DONE:
                    break
                if self._stop.is_set():
                    return
                if not self._cuda:
                    item = (batch, None)
                elif lifetime and _all_pinned(batch):
                    item = self._copy_direct(batch, stream)
                    in_flight.append(item[1])
                    if len(in_flight) >= lifetime - 1:  # the slot of that batch comes round next
                        in_flight.popleft().synchronize()
                else:
                    item = self._to_device(batch, stream, ring)
                if state_of is not None:  # the upstream's resume point right after this batch
                    item = (*item, state_of())
                self._put(item)
            self._put(_DONE)
        except BaseException as e:  # handed to the consumer, raised there with its message
            self._put(_Failure(e))

    def _put(self, item: Any) -> None:
        """Queue `item`, giving up when the consumer has stopped (never blocks a shutdown)."""
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def _copy_direct(self, batch: dict[str, torch.Tensor], stream: Any) -> tuple[Any, Any]:
        out = dict(batch)
        with torch.cuda.stream(stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for k, v in batch.items():
                if torch.is_tensor(v):
                    out[k] = v.to(self.device, non_blocking=True)
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
        self.stats.direct_copies += 1
        out_event = _TimedEvent(start, event)
        return out, out_event

    def _to_device(self, batch: Any, stream: Any, ring: _PinnedRing) -> tuple[Any, Any]:
        single = torch.is_tensor(batch)
        b = {"_": batch} if single else batch
        i, slot = ring.take(b)
        out = dict(b)
        with torch.cuda.stream(stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for k, host in slot.items():
                host.copy_(b[k])
                out[k] = host.to(self.device, non_blocking=True)
            event = torch.cuda.Event(enable_timing=True)
            event.record(stream)
        ring.events[i] = event
        return (out["_"] if single else out), _TimedEvent(start, event)

    # --- consumer -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self.close()
        self._stop.clear()
        self._queue = queue.Queue(maxsize=self.depth)
        self._thread = threading.Thread(target=self._produce, args=(iter(self.upstream),),
                                        name="dataflow-prefetch", daemon=True)
        self._thread.start()
        try:
            while True:
                t0 = time.perf_counter()
                item = self._queue.get()
                wait = time.perf_counter() - t0
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                batch, event = item[0], item[1]
                if len(item) > 2:
                    self._state = item[2]
                if event is not None:
                    current = torch.cuda.current_stream(self.device)
                    current.wait_event(event.end)
                    if self._last_event is not None and self._last_event.end.query():
                        self.stats.copy_s += self._last_event.start.elapsed_time(self._last_event.end) / 1e3
                    self._last_event = event
                    for t in (batch.values() if isinstance(batch, dict) else [batch]):
                        if torch.is_tensor(t) and t.is_cuda:
                            t.record_stream(current)
                self.stats.batches += 1
                self.stats.wait_s += wait
                self.stats.last_wait_s = wait
                self.stats.waits.append(wait)
                yield batch
        finally:
            self.close()

    def close(self) -> None:
        """Stop the producer thread (called on exhaustion, `break`, garbage collection)."""
        self._stop.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join(timeout=5)
        self._thread = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
