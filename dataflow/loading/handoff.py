"""Worker hand-off without per-batch allocation or per-batch messages: a shared slot ring and semaphores.

The main process allocates, once, before the workers start:
- a ring of page-aligned batch buffers in one shared-memory segment (registered as pinned memory
  when CUDA is present); worker `w` owns `per_worker` consecutive slots and fills them in turn;
- a small shared table with one row per slot: (job, batch, rows, stage seconds...), written by the
  worker before it announces the slot;
- two counting semaphores per worker: `ready` (slots filled, not yet taken) and `free` (slots the
  main process has handed back).

Per batch, worker `w` waits on `free`, collates batch b (those with `b % num_workers == w`) straight
into its next slot, writes the slot's row and posts `ready`; the main process waits on `ready`, reads
the row and yields tensors that are views of the slot, then posts `free` once the consumer has taken
`lifetime` more batches. Slots are freed in the order they were filled, so the slot of each batch is
implied and nothing else crosses the process boundary. A semaphore post or wait is an atomic
operation in shared memory; the kernel is entered only to wake a side that is actually asleep.
Pipes carry only the rare messages: start a job, stop, and a worker's "job ended" (with its error).
"""

from __future__ import annotations

import math
import multiprocessing.connection as mpc
import pickle
import time
import traceback
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np
import torch
import torch.multiprocessing as tmp

from dataflow.errors import DataflowError
from dataflow.lifetime import die_with_parent

PAGE = 4096
POLL_S = 0.1
_JOB, _BATCH, _ROWS, _STAGES = 0, 1, 2, 3  # columns of the slot table: stage seconds from _STAGES on


class WorkerDied(DataflowError):
    """A loader worker process exited without reporting an error (killed, out of memory, segfault)."""


@dataclass(frozen=True)
class Field:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # within a slot


class SlotRing:
    """`slots` buffers of one batch layout in a single shared, page-aligned segment."""

    def __init__(self, layout: dict[str, tuple[tuple[int, ...], Any]], slots: int):
        fields, offset = [], 0
        for name, (shape, dtype) in layout.items():
            dtype = np.dtype(dtype)
            fields.append(Field(name, tuple(shape), dtype, offset))
            offset += _round_up(int(np.prod(shape)) * dtype.itemsize, PAGE)
        self.fields = fields
        self.slot_bytes = max(offset, PAGE)
        self.slots = slots
        self.buffer = torch.empty(self.slot_bytes * slots, dtype=torch.uint8).share_memory_()
        self.pinned = False
        self._numpy: list[dict[str, np.ndarray]] | None = None
        self._torch: list[dict[str, torch.Tensor]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_numpy"] = state["_torch"] = None
        state["pinned"] = False
        return state

    def numpy_views(self, slot: int) -> dict[str, np.ndarray]:
        if self._numpy is None:
            flat = self.buffer.numpy()
            self._numpy = [{f.name: flat[s * self.slot_bytes + f.offset:][:int(np.prod(f.shape)) * f.dtype.itemsize]
                            .view(f.dtype).reshape(f.shape) for f in self.fields} for s in range(self.slots)]
        return self._numpy[slot]

    def tensor_views(self, slot: int) -> dict[str, torch.Tensor]:
        if self._torch is None:
            self._torch = [{k: torch.from_numpy(v) for k, v in self.numpy_views(s).items()}
                           for s in range(self.slots)]
        return self._torch[slot]

    def pin(self) -> None:
        """Page-lock the ring so host-to-device copies from it are truly asynchronous."""
        if not self.pinned and torch.cuda.is_available():
            err = torch.cuda.cudart().cudaHostRegister(self.buffer.data_ptr(), self.buffer.numel(), 0)
            self.pinned = int(getattr(err, "value", err)) == 0

    def unpin(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.buffer.data_ptr())
            self.pinned = False


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to


@dataclass
class _Shared:
    """What the main process and one worker share besides the ring."""

    slots: list[int]  # this worker's slots, filled in turn
    table: torch.Tensor  # float64 [all slots, _STAGES + stages], shared memory
    control: torch.Tensor  # int64 [1]: the job the workers should be running (0: none)
    ready: Any  # semaphore: slots filled and not yet taken by the main process
    free: Any  # semaphore: slots handed back by the main process


def _worker_main(dataset: Any, ring: SlotRing, shared: _Shared, stages: Sequence[str], worker: int,
                 num_workers: int, ctrl: mpc.Connection, results: mpc.Connection) -> None:
    """A loader worker: waits for a job, fills its slots with its batches, reports how the job ended."""
    die_with_parent()
    torch.set_num_threads(1)
    try:
        while True:
            msg = ctrl.recv()
            if msg[0] == "stop":
                return
            job = msg[1]
            try:
                _run_job(dataset, ring, shared, stages, worker, num_workers, *msg[1:])
                results.send((job, None, None))
            except BaseException as e:  # reported to the main process, raised there with its message
                try:
                    payload = pickle.dumps(e)
                except Exception:
                    payload = None
                results.send((job, payload, traceback.format_exc()))
                shared.ready.release()  # wakes the main process, which then finds the error
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        return


def _run_job(dataset: Any, ring: SlotRing, shared: _Shared, stages: Sequence[str], worker: int,
             num_workers: int, job: int, epoch: int, consumed: int, num_batches: int, batch_size: int) -> None:
    table, control = shared.table.numpy(), shared.control.numpy()
    dataset.epoch, dataset.consumed = epoch, consumed
    per_rank = dataset.samples_per_rank(consumed)
    for k, b in enumerate(range(worker, num_batches, num_workers)):
        while not shared.free.acquire(timeout=POLL_S):
            if control[0] != job:
                return
        if control[0] != job:  # cancelled: the main process woke us to stop
            return
        slot = shared.slots[k % len(shared.slots)]
        ids = dataset.rank_sample_ids(b * batch_size, min((b + 1) * batch_size, per_rank), consumed)
        times = dataset.collate_into(ids, ring.numpy_views(slot))
        row = table[slot]
        row[_ROWS] = len(ids)
        for i, name in enumerate(stages):
            row[_STAGES + i] = times.get(name, 0.0)
        row[_JOB], row[_BATCH] = job, b  # last: the row is this batch's once these match
        shared.ready.release()


class WorkerPool:
    """Worker processes that fill a `SlotRing`; the main side of the protocol."""

    def __init__(self, dataset: Any, layout: dict[str, tuple[tuple[int, ...], Any]], num_workers: int,
                 prefetch: int, lifetime: int, context: Any = None, pin: bool = False, timeout: float = 0,
                 stages: Sequence[str] = ()):
        self.num_workers, self.lifetime, self.timeout = num_workers, lifetime, timeout
        self.stages = tuple(stages)
        self.per_worker = prefetch + math.ceil(lifetime / num_workers)
        self.ring = SlotRing(layout, self.per_worker * num_workers)
        if pin:
            self.ring.pin()
        ctx = tmp.get_context(context) if isinstance(context, str) or context is None else context
        if context is None:
            ctx = tmp.get_context("fork" if "fork" in tmp.get_all_start_methods() else "spawn")
        table = torch.full((self.ring.slots, _STAGES + len(self.stages)), -1.0, dtype=torch.float64).share_memory_()
        control = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._table, self._control = table.numpy(), control.numpy()
        self.shared: list[_Shared] = []
        self.ctrl, self.results, self.procs = [], [], []
        for w in range(num_workers):
            shared = _Shared(list(range(w * self.per_worker, (w + 1) * self.per_worker)), table, control,
                             ctx.Semaphore(0), ctx.Semaphore(self.per_worker))
            ctrl_recv, ctrl_send = ctx.Pipe(duplex=False)
            res_recv, res_send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_main, name=f"dataflow-loader-{w}", daemon=True,
                            args=(dataset, self.ring, shared, self.stages, w, num_workers, ctrl_recv, res_send))
            p.start()
            ctrl_recv.close()
            res_send.close()
            self.shared.append(shared)
            self.ctrl.append(ctrl_send)
            self.results.append(res_recv)
            self.procs.append(p)
        self.job = 0
        self._running: list[int] = [0] * num_workers  # the job each worker has not yet reported ended
        self.stage_by_worker: list[dict[str, float]] = [{} for _ in range(num_workers)]

    def run(self, epoch: int, consumed: int, num_batches: int, batch_size: int) -> Iterator[dict[str, Any]]:
        """Yield the job's batches in order as views of ring slots."""
        for w in range(self.num_workers):
            self._settle(w)
        self.job += 1
        job = self.job
        self._control[0] = job
        for w, c in enumerate(self.ctrl):
            c.send(("run", job, epoch, consumed, num_batches, batch_size))
            self._running[w] = job
        taken = [0] * self.num_workers  # batches taken from each worker in this job
        held: list[int] = []  # workers of the batches yielded and not yet handed back, oldest first
        try:
            for b in range(num_batches):
                w = b % self.num_workers
                shared = self.shared[w]
                slot = shared.slots[taken[w] % self.per_worker]
                row = self._receive(w, slot, job, b)
                taken[w] += 1
                self._add_stages(w, row)
                views = self.ring.tensor_views(slot)
                rows = int(row[_ROWS])
                yield dict(views) if rows == self.ring.fields[0].shape[0] else {k: v[:rows] for k, v in views.items()}
                held.append(w)
                if len(held) > self.lifetime:
                    self.shared[held.pop(0)].free.release()
        finally:
            if self._control[0] == job:
                self._control[0] = 0  # stops the workers at their next slot
                for shared in self.shared:
                    shared.free.release()  # wakes a worker waiting for a slot

    def _receive(self, w: int, slot: int, job: int, b: int) -> list[float]:
        """Wait until worker w has filled `slot` with batch b; returns the slot's row."""
        waited = 0.0
        while not self.shared[w].ready.acquire(timeout=POLL_S):
            waited += POLL_S
            if self.results[w].poll() or not self.procs[w].is_alive():
                self._ended(w, b)
            if self.timeout and waited >= self.timeout:
                raise DataflowError(f"loader worker {w} produced no batch in {self.timeout} s")
        row = self._table[slot].tolist()
        if row[_JOB] != job or row[_BATCH] != b:
            self._ended(w, b)  # posted without filling the slot: it failed
        return row

    def _ended(self, w: int, b: int) -> None:
        """Worker w ended its job before producing batch b: raise its error, or say it died."""
        if self.results[w].poll():
            try:
                job, payload, text = self.results[w].recv()
            except EOFError:
                job, payload, text = None, None, None
            if job == self._running[w]:
                self._running[w] = 0
                if text is not None:
                    raise _restore(payload, text, w)
                raise DataflowError(f"loader worker {w} ended its job before batch {b} (protocol error)")
        if not self.procs[w].is_alive():
            code = self.procs[w].exitcode
            raise WorkerDied(f"loader worker {w} (pid {self.procs[w].pid}) died with exit code {code} "
                             f"while producing batch {b}; killed or out of memory?")

    def _settle(self, w: int) -> None:
        """Before a new job: wait until worker w has left its last job, then reset its semaphores."""
        while self._running[w]:
            if self.results[w].poll(POLL_S):
                try:
                    job, _, _ = self.results[w].recv()
                except EOFError:
                    job = None
                if job == self._running[w]:
                    self._running[w] = 0
            elif not self.procs[w].is_alive():
                raise WorkerDied(f"loader worker {w} (pid {self.procs[w].pid}) died with exit code "
                                 f"{self.procs[w].exitcode}")
        shared = self.shared[w]
        while shared.ready.acquire(False):
            pass
        while shared.free.acquire(False):
            pass
        for _ in range(self.per_worker):
            shared.free.release()

    def _add_stages(self, w: int, row: list[float]) -> None:
        mine = self.stage_by_worker[w]
        for name, v in zip(self.stages, row[_STAGES:]):
            mine[name] = mine.get(name, 0.0) + v

    def close(self) -> None:
        self._control[0] = 0
        for c, shared in zip(self.ctrl, self.shared):
            shared.free.release()
            try:
                c.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 2  # one grace period for all: a stalled worker is then terminated
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            if p.is_alive():
                p.terminate()
                p.join(timeout=2)
        for c in self.ctrl + self.results:
            c.close()
        self.ring.unpin()
        self.procs = []

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]


def _restore(payload: bytes | None, text: str, worker: int) -> BaseException:
    if payload is not None:
        try:
            exc = pickle.loads(payload)
            if isinstance(exc, BaseException):
                return exc
        except Exception:
            pass
    return DataflowError(f"loader worker {worker} failed:\n{text}")


__all__ = ["SlotRing", "WorkerPool", "WorkerDied"]
