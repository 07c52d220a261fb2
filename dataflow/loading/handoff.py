"""Worker hand-off without per-batch allocation: a shared-memory slot ring and a tiny protocol.

The main process allocates the ring once, before the workers start: `slots` page-aligned batch
buffers in one shared-memory segment (registered as pinned memory when CUDA is present). Worker `w`
owns a fixed set of slots; it collates its batches (those with `b % num_workers == w`) straight into a
free slot and sends only `(job, b, slot, stage times)` through a pipe. The main process yields tensors
that are views of the slot, and hands the slot back once the consumer has taken `lifetime` more
batches. Nothing is allocated per batch, on either side; only a few integers cross the process boundary.
"""

from __future__ import annotations

import math
import multiprocessing.connection as mpc
import pickle
import traceback
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import torch
import torch.multiprocessing as tmp

from dataflow.errors import DataflowError
from dataflow.lifetime import die_with_parent

PAGE = 4096
POLL_S = 0.1


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


def _worker_main(dataset: Any, ring: SlotRing, worker: int, num_workers: int, slots: list[int],
                 ctrl: mpc.Connection, results: mpc.Connection) -> None:
    """A loader worker: waits for jobs, collates its batches into its own free slots."""
    die_with_parent()
    torch.set_num_threads(1)
    try:
        while True:
            msg = ctrl.recv()
            if msg[0] == "stop":
                return
            if msg[0] == "run":
                _run_job(dataset, ring, worker, num_workers, slots, ctrl, results, *msg[1:])
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        return


def _run_job(dataset: Any, ring: SlotRing, worker: int, num_workers: int, slots: list[int],
             ctrl: mpc.Connection, results: mpc.Connection, job: int, epoch: int, consumed: int,
             num_batches: int, batch_size: int) -> None:
    free = list(slots)  # a new job starts with all slots free: the previous job's batches are done
    dataset.epoch, dataset.consumed = epoch, consumed
    per_rank = dataset.samples_per_rank(consumed)
    try:
        for b in range(worker, num_batches, num_workers):
            while not free or ctrl.poll():
                msg = ctrl.recv()
                if msg[0] == "free":
                    free.append(msg[1])
                elif msg[0] == "cancel" or msg[0] == "stop":
                    if msg[0] == "stop":
                        raise EOFError
                    return
            slot = free.pop(0)
            ids = dataset.rank_sample_ids(b * batch_size, min((b + 1) * batch_size, per_rank), consumed)
            stats = dataset.collate_into(ids, ring.numpy_views(slot))
            results.send((job, b, slot, stats, len(ids)))
        results.send((job, "done", None, None, 0))
    except EOFError:
        raise
    except BaseException as e:  # reported to the main process, raised there with its message
        try:
            payload = pickle.dumps(e)
        except Exception:
            payload = None
        results.send((job, "error", payload, traceback.format_exc(), 0))


class WorkerPool:
    """Worker processes that fill a `SlotRing`; the main side of the protocol."""

    def __init__(self, dataset: Any, layout: dict[str, tuple[tuple[int, ...], Any]], num_workers: int,
                 prefetch: int, lifetime: int, context: Any = None, pin: bool = False, timeout: float = 0):
        self.num_workers, self.lifetime, self.timeout = num_workers, lifetime, timeout
        per_worker = prefetch + math.ceil(lifetime / num_workers)
        self.ring = SlotRing(layout, per_worker * num_workers)
        if pin:
            self.ring.pin()
        ctx = tmp.get_context(context) if isinstance(context, str) or context is None else context
        if context is None:
            ctx = tmp.get_context("fork" if "fork" in tmp.get_all_start_methods() else "spawn")
        self.ctrl, self.results, self.procs = [], [], []
        for w in range(num_workers):
            ctrl_recv, ctrl_send = ctx.Pipe(duplex=False)
            res_recv, res_send = ctx.Pipe(duplex=False)
            slots = list(range(w * per_worker, (w + 1) * per_worker))
            p = ctx.Process(target=_worker_main, name=f"dataflow-loader-{w}", daemon=True,
                            args=(dataset, self.ring, w, num_workers, slots, ctrl_recv, res_send))
            p.start()
            ctrl_recv.close()
            res_send.close()
            self.ctrl.append(ctrl_send)
            self.results.append(res_recv)
            self.procs.append(p)
        self.job = 0
        self.stage_totals: dict[str, float] = {}
        self.stage_by_worker: list[dict[str, float]] = [{} for _ in range(num_workers)]

    def run(self, epoch: int, consumed: int, num_batches: int, batch_size: int) -> Iterator[dict[str, Any]]:
        """Yield the job's batches in order as views of ring slots."""
        self.job += 1
        job = self.job
        for c in self.ctrl:
            c.send(("run", job, epoch, consumed, num_batches, batch_size))
        held: list[tuple[int, int]] = []  # (worker, slot) yielded, not yet handed back
        finished = False
        try:
            for b in range(num_batches):
                w = b % self.num_workers
                slot, stats, rows = self._receive(w, job, b)
                mine = self.stage_by_worker[w]
                for k, v in stats.items():
                    self.stage_totals[k] = self.stage_totals.get(k, 0.0) + v
                    mine[k] = mine.get(k, 0.0) + v
                views = self.ring.tensor_views(slot)
                first = next(iter(views.values()))
                yield {k: v[:rows] for k, v in views.items()} if rows < len(first) else dict(views)
                held.append((w, slot))
                if len(held) > self.lifetime:
                    w0, s0 = held.pop(0)
                    self.ctrl[w0].send(("free", s0))
            finished = True
        finally:
            if not finished:
                for c in self.ctrl:
                    try:
                        c.send(("cancel", job))
                    except (BrokenPipeError, OSError):
                        pass

    def _receive(self, w: int, job: int, b: int) -> tuple[int, dict[str, float], int]:
        waited = 0.0
        while True:
            if self.results[w].poll(POLL_S):
                try:
                    msg = self.results[w].recv()
                except EOFError:
                    msg = None
                if msg is not None:
                    if msg[0] != job:
                        continue  # a late message of a cancelled job
                    if msg[1] == "error":
                        raise _restore(msg[2], msg[3], w)
                    if msg[1] == "done":
                        continue
                    if msg[1] != b:
                        raise DataflowError(f"loader worker {w} sent batch {msg[1]}, expected {b} (protocol error)")
                    return msg[2], msg[3], msg[4]
            waited += POLL_S
            if not self.procs[w].is_alive():
                code = self.procs[w].exitcode
                raise WorkerDied(f"loader worker {w} (pid {self.procs[w].pid}) died with exit code {code} "
                                 f"while producing batch {b}; killed or out of memory?")
            if self.timeout and waited >= self.timeout:
                raise DataflowError(f"loader worker {w} produced no batch in {self.timeout} s")

    def close(self) -> None:
        for c in self.ctrl:
            try:
                c.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        for p in self.procs:
            p.join(timeout=2)
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
