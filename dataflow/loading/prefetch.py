"""`DevicePrefetcher`: batches onto the device while the previous step computes.

A background thread pulls batches from upstream (so host-side loading overlaps the step) into a
bounded queue. On CUDA:
- upstream batches that are page-locked (a `StreamingDataLoader` with `pin_memory=True`, or
  `pinned=True`) are copied straight to the device with `non_blocking=True` on a side stream; the
  thread keeps the host batch referenced until its copy has finished, then drops it, which hands a
  loader slot back to the workers;
- other batches are first copied into one of a few pinned staging slots, reused in turn (a slot is
  refilled only after its previous copy finished), then to the device the same way.
The consumer's stream waits on each batch's event and the device tensors are `record_stream`-ed, so
the caching allocator never hands their memory out early. On CPU the thread gives the overlap alone.

Batches read ahead are never lost: after a `break`, the next `iter()` serves them first and goes on
with the same upstream iterator, so the consumer sees the stream without a gap.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

import torch

from dataflow.errors import ConfigError
from dataflow.threads import Producer
from dataflow.loading.contract import AuditedLoader, LendingLoader, Resumable, StageFigures, StageSnapshot
from dataflow.loading.cursor import stale_iterator

_DONE = object()
JOIN_S = 60.0  # how long close() waits for an upstream `next()` in progress


def held_upstream(depth: int) -> int:
    """Batches of its upstream a `DevicePrefetcher` of `depth` holds at once: its queue of `depth`, the one its
    thread is copying and the one the consumer has (what it asks a `LendingLoader` to make room for)."""
    return depth + 2


def staging_slots(depth: int) -> int:
    """Pinned staging copies a `DevicePrefetcher` of `depth` allocates for an upstream that is not page-locked."""
    return depth + 1


@dataclass
class PrefetchStats:
    batches: int = 0
    wait_s: float = 0.0  # consumer time blocked on the next batch
    last_wait_s: float = 0.0
    host_allocations: int = 0  # pinned staging slots allocated (stops growing after warm-up)
    upstream_s: float = 0.0  # producer-thread time blocked on the upstream iterator (host-side loading)
    copy_s: float = 0.0  # host-to-device copy time, from CUDA events (0 on CPU)
    direct_copies: int = 0  # batches copied straight from page-locked upstream memory (no staging copy)
    waits: deque = field(default_factory=lambda: deque(maxlen=100_000))  # recent waits, bounded


class _TimedEvent:
    """The start and end CUDA events of one batch's host-to-device copy."""

    def __init__(self, start: Any, end: Any):
        self.start, self.end = start, end

    def synchronize(self) -> None:
        self.end.synchronize()


class _Failure:
    def __init__(self, exc: BaseException):
        self.exc = exc


class _StagingSlots:
    """`size` pinned host copies of one batch layout, reused round-robin (a batch is staged in one before its
    copy to the device)."""

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

    `pinned` says whether upstream batches are page-locked, so they can be copied to the GPU directly;
    by default it is the loader's own `StreamingDataLoader.pinned` (its `pin_memory=True` on a CUDA
    machine), and False for any other iterable (batches go through a pinned staging copy).
    CPU batches are the upstream's own (yours: a loader never reuses one you hold); CUDA batches
    are fresh device tensors. `state_dict()` is the upstream loader's state after the last batch
    *yielded* here (not what was read ahead): checkpoint it, resume with `load_state_dict`.
    """

    def __init__(self, batches: Iterable[Any], device: str | torch.device = "cpu", depth: int = 2,
                 pinned: bool | None = None):
        if isinstance(depth, bool) or not isinstance(depth, int) or depth < 1:
            raise ConfigError(f"DevicePrefetcher depth must be an integer >= 1, got {depth!r}")
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError) as e:
            raise ConfigError(f"DevicePrefetcher: {device!r} is not a device ({e}); use 'cpu' or 'cuda[:N]'") from None
        self._cuda = self.device.type == "cuda"
        if self._cuda and not torch.cuda.is_available():
            raise ConfigError(f"DevicePrefetcher(device={str(device)!r}): CUDA is not available here (torch "
                              f"{torch.__version__}, {torch.cuda.device_count()} GPUs visible); use device='cpu'")
        if isinstance(batches, LendingLoader):  # it sizes its `SlotRing` for what this queue holds
            batches.reserve_held(held_upstream(depth))
            if pinned is None:
                pinned = batches.pinned
        # the upstream's audit, told as each batch reaches the user (not when it is read ahead)
        self._yielded = batches.audit_on_yield() if isinstance(batches, AuditedLoader) else None
        self.upstream, self.depth, self.pinned = batches, depth, bool(pinned)
        self.stats = PrefetchStats()
        self._resumable = batches if isinstance(batches, Resumable) else None
        self._it: Iterator[Any] | None = None  # the upstream iterator, kept across a break
        self._pending: deque = deque()  # items read ahead and not yet yielded (after a break)
        self._producer: Producer | None = None  # the thread of the current iteration
        self._generation = 0  # the newest iterator; an older one raises if it is resumed
        self._staging: _StagingSlots | None = None
        self._last_event: _TimedEvent | None = None
        self._state: dict[str, Any] | None = None

    # --- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """The upstream loader's state after the last batch this prefetcher *yielded*."""
        if self._state is not None:
            return self._state
        if self._resumable is None:
            raise ConfigError("the upstream iterable has no state_dict(); pass a StreamingDataLoader")
        return self._resumable.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume the upstream loader at `state`; batches read ahead are dropped."""
        if self._resumable is None:
            raise ConfigError("the upstream iterable has no load_state_dict(); pass a StreamingDataLoader")
        self.close()
        self._generation += 1  # an unfinished iterator must not go on from the old position
        self._pending.clear()
        self._it = None
        self._resumable.load_state_dict(state)
        self._state = self._resumable.state_dict()

    def stage_figures(self) -> StageSnapshot:
        """The `StageFigures` contract: this prefetcher's wait and copy figures over its upstream's own
        (when the upstream keeps any): what a `StarvationMonitor` wrapping it reports."""
        s = self.stats
        transfer = {"batches": float(s.batches), "wait_s": s.wait_s, "upstream_s": s.upstream_s}
        if self._cuda:
            transfer["h2d_s"] = s.copy_s  # CUDA-event copy time
        own = StageSnapshot(transfer=transfer, sources={"prefetcher": type(self).__name__}, device=str(self.device))
        return own.over(self.upstream.stage_figures()) if isinstance(self.upstream, StageFigures) else own

    # --- producer thread ------------------------------------------------------------------------
    def _produce(self, it: Iterator[Any], p: Producer) -> None:
        in_flight: deque = deque()  # (event, host batch) of direct copies: the host memory stays referenced
        try:
            stream = torch.cuda.Stream(device=self.device) if self._cuda else None
            if self._cuda and not self.pinned and self._staging is None:
                self._staging = _StagingSlots(staging_slots(self.depth), self.stats)
            while not p.stopped:
                t0 = time.perf_counter()
                batch = next(it, _DONE)
                self.stats.upstream_s += time.perf_counter() - t0
                if batch is _DONE:
                    p.put(_DONE)
                    return
                while in_flight and (len(in_flight) > self.depth or in_flight[0][0].end.query()):
                    in_flight.popleft()[0].synchronize()  # its copy is done: the host batch may go
                if not self._cuda:
                    item = (batch, None)
                elif self.pinned:
                    item = self._copy(batch, stream)
                    in_flight.append((item[1], batch))
                    self.stats.direct_copies += 1
                else:
                    item = self._stage_and_copy(batch, stream)
                del batch
                p.put((*item, self._resumable.state_dict() if self._resumable else None))
                del item
        except BaseException as e:  # handed to the consumer, raised there with its message
            p.put(_Failure(e))
        finally:
            for event, _ in in_flight:  # the host memory may go back to the loader only once copied
                event.synchronize()

    def _copy(self, batch: Any, stream: Any) -> tuple[Any, _TimedEvent]:
        """Launch the host-to-device copies of `batch` on `stream`; the event marks their end."""
        single = torch.is_tensor(batch)
        b = {"_": batch} if single else batch
        out = dict(b)
        with torch.cuda.stream(stream):
            start = torch.cuda.Event(enable_timing=True)
            start.record(stream)
            for k, v in b.items():
                if torch.is_tensor(v):
                    out[k] = v.to(self.device, non_blocking=True)
            end = torch.cuda.Event(enable_timing=True)
            end.record(stream)
        return (out["_"] if single else out), _TimedEvent(start, end)

    def _stage_and_copy(self, batch: Any, stream: Any) -> tuple[Any, _TimedEvent]:
        """Copy `batch` into a pinned staging slot, then launch its copy to the device."""
        single = torch.is_tensor(batch)
        b = {"_": batch} if single else batch
        i, slot = self._staging.take(b)
        for k, host in slot.items():
            host.copy_(b[k])
        out, event = self._copy({**b, **slot}, stream)
        self._staging.events[i] = event
        return (out["_"] if single else out), event

    # --- consumer -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[Any]:
        self.close()  # an unfinished iteration's read-ahead is kept, and served first
        self._generation += 1
        return self._iterate(self._generation)

    def _iterate(self, generation: int) -> Iterator[Any]:
        if self._it is None:
            if self._state is None and self._resumable is not None:
                self._state = self._resumable.state_dict()  # what state_dict() says before the first batch arrives
            self._it = iter(self.upstream)
        ended = any(item is _DONE or isinstance(item, _Failure) for item in self._pending)
        if not ended:  # (read-ahead that holds the upstream's end needs no thread: it is all there is)
            self._producer = Producer(self.depth, "dataflow-prefetch")
            self._producer.start(self._produce, self._it)
        producer = self._producer
        try:
            while True:
                if generation != self._generation:
                    raise stale_iterator("prefetcher", "a newer iter(prefetcher)")
                t0 = time.perf_counter()
                item = self._pending.popleft() if self._pending else producer.get()
                wait = time.perf_counter() - t0
                if item is _DONE:
                    self._it = None
                    return
                if isinstance(item, _Failure):
                    self._it = None
                    raise item.exc
                batch, event, state = item
                if state is not None:
                    self._state = state
                if event is not None:
                    self._wait_for(event, batch)
                self.stats.batches += 1
                self.stats.wait_s += wait
                self.stats.last_wait_s = wait
                self.stats.waits.append(wait)
                del item
                if self._yielded is not None:
                    self._yielded()
                yield batch
        finally:
            if generation == self._generation:
                self.close()

    def _wait_for(self, event: _TimedEvent, batch: Any) -> None:
        current = torch.cuda.current_stream(self.device)
        current.wait_event(event.end)
        if self._last_event is not None and self._last_event.end.query():
            self.stats.copy_s += self._last_event.start.elapsed_time(self._last_event.end) / 1e3
        self._last_event = event
        for t in (batch.values() if isinstance(batch, dict) else [batch]):
            if torch.is_tensor(t) and t.is_cuda:
                t.record_stream(current)

    def close(self) -> None:
        """Stop the producer thread, keeping what it read ahead for the next iteration (called on
        exhaustion, `break`, garbage collection)."""
        p, self._producer = self._producer, None
        if p is None:
            return
        left = p.stop(JOIN_S)
        if left is None:  # stuck in the upstream: abandon that iterator, the next iter() starts a new one
            self._it = None
            self._pending.clear()
            return
        self._pending.extend(left)

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass
