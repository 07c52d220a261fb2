"""Worker hand-off: a shared slot ring, semaphores, and leases that free a slot only when its batch is dropped.

The main process allocates, once, before the workers start:
- a ring of page-aligned batch buffers in one shared-memory segment (registered as pinned memory
  when asked and CUDA is present); worker `w` owns `per_worker` consecutive slots;
- a small shared table with one row per slot: (job, batch, rows, state, stage seconds...);
- two counting semaphores per worker: `ready` (slots filled, not yet taken) and `free` (free slots).

Per batch, worker `w` (which builds the batches b with b % num_workers == w, in order) takes a `free`
permit, fills a FREE slot of its own with `source.fill` (the `BatchSource` contract, contract.py), marks
it FILLED, writes the slot's number into `fills`, a circular list, and posts `ready`. The main process
waits on `ready`, reads which slot holds batch b, marks it LENT and yields tensors made from fresh numpy
views of that slot; a `_Lease` watches those views with weak references (each tensor, and every view of
it, keeps its view alive). When the last is garbage, the slot is marked FREE and `free` posted, by the
process that lent it and for that lend only. So a yielded batch never changes while anything references
it, without any "valid for N batches" rule. Invariant: a worker's `free` permits = its FREE slots it has
not taken (a failed fill and a cancelled job give their permit back).

When lending a slot would leave its worker none to fill (the consumer keeps many batches), the main
process yields an owned copy instead and frees the slot at once (`copies` in the loader's stats): the
workers always make progress, nothing is overwritten, nothing deadlocks.
Pipes carry only the rare messages: start a job, stop, and a worker's "job ended" (with its error).
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing.connection as mpc
import os
import pickle
import time
import traceback
import weakref
from dataclasses import dataclass
from functools import partial
from typing import Any, Iterator

import torch
import torch.multiprocessing as tmp

from dataflow.errors import DataflowError, WorkerDied
from dataflow.loading.cursor import stale_iterator
from dataflow.loading.plan import BatchPlan
from dataflow.loading.ring import SlotRing, _Lease, slots_per_worker  # noqa: F401  (_Lease: the type of a held lend)
from dataflow.loading.contract import BatchLayout, BatchSource
from dataflow.loading.stages import FIELDS, BatchTiming, Hook, add_report, report_of
from dataflow.loading.worker_exit import how_it_ended, restore_error

POLL_S = 0.05
PARENT_CHECK_S = 1.0  # how often an idle worker checks that its parent is alive
_JOB, _BATCH, _ROWS, _STATE, _STAGES = 0, 1, 2, 3, 4  # columns of the slot table; then its FIELDS
FREE, FILLED, LENT = 0.0, 1.0, 2.0  # slot states
_POOLS: "weakref.WeakSet[WorkerPool]" = weakref.WeakSet()  # open pools, stopped at exit


@dataclass
class _Shared:
    """What the main process and one worker share besides the ring."""

    slots: list[int]  # this worker's slots
    fills: torch.Tensor  # int64 [len(slots)]: the slot of this worker's k-th batch of a job, at k % len(slots)
    table: torch.Tensor  # float64 [all slots, _STAGES + len(FIELDS)], shared memory
    control: torch.Tensor  # int64 [1]: the job the workers should be running (0: none)
    ready: Any  # semaphore: slots filled and not yet taken by the main process
    free: Any  # semaphore: FREE slots not yet taken by the worker


def _worker_main(source: BatchSource, ring: SlotRing, shared: _Shared, worker: int, num_workers: int, hook: Hook,
                 ctrl: mpc.Connection, results: mpc.Connection) -> None:
    """A loader worker: waits for a job, fills its slots with its batches, reports how the job ended.

    It leaves when its parent process is gone (checked while it waits). Not PR_SET_PDEATHSIG: that
    fires when the *thread* that started the pool ends, and a prefetcher's thread often does. Its parent
    is the loader's process under fork and spawn, the fork server under forkserver (which exits
    with the loader's process): whichever it is, a worker whose parent changes has lost it."""
    torch.set_num_threads(1)
    parent = os.getppid()
    try:
        while True:
            while not ctrl.poll(PARENT_CHECK_S):
                if os.getppid() != parent:
                    return
            msg = ctrl.recv()
            if msg[0] == "stop":
                return
            job, plan = msg[1], msg[2]
            try:
                _run_job(source, ring, shared, worker, num_workers, hook, job, plan, parent)
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
    finally:  # a process ends without running finalizers: let go of its cache locks (and their files)
        source.close(wait=False)


def _run_job(source: BatchSource, ring: SlotRing, shared: _Shared, worker: int, num_workers: int, hook: Hook, job: int,
             plan: BatchPlan, parent: int) -> None:
    table, control, fills = shared.table.numpy(), shared.control.numpy(), shared.fills.numpy()
    for k, b in enumerate(range(worker, plan.num_batches, num_workers)):
        while not shared.free.acquire(timeout=POLL_S):
            if control[0] != job or os.getppid() != parent:
                return
        if control[0] != job:  # cancelled: the permit goes back with its slot still free
            shared.free.release()
            return
        slot = next(s for s in shared.slots if table[s, _STATE] == FREE)
        ids = plan.sample_ids(b)
        t0 = time.perf_counter()
        try:
            report = source.fill(ids, ring.numpy_views(slot), plan.epoch)
            if hook is not None:
                hook(BatchTiming.of(report, t0, time.perf_counter(), len(ids)))
        except BaseException:
            shared.free.release()  # the slot stays FREE: its permit goes back with it
            raise
        row = table[slot]
        row[_ROWS] = len(ids)
        fields = report.fields()
        for i, name in enumerate(FIELDS):
            row[_STAGES + i] = fields.get(name, 0.0)
        row[_JOB], row[_BATCH] = job, b
        row[_STATE] = FILLED  # last: the row is this batch's once it reads FILLED with this job and batch
        fills[k % len(fills)] = slot
        shared.ready.release()


class WorkerPool:
    """Worker processes that fill a `SlotRing`; the main side of the protocol."""

    def __init__(self, source: BatchSource, layout: BatchLayout, num_workers: int, ready_ahead: int, held: int,
                 context: Any = None, pin: bool = False, timeout: float = 0, hook: Hook = None):
        self.num_workers, self.timeout = num_workers, timeout
        self.per_worker = slots_per_worker(ready_ahead, held, num_workers)
        self.ring = SlotRing(layout, self.per_worker * num_workers, num_workers)
        if pin:
            self.ring.pin()
        ctx = tmp.get_context(context) if isinstance(context, str) or context is None else context
        if context is None:
            ctx = tmp.get_context("fork" if "fork" in tmp.get_all_start_methods() else "spawn")
        table = torch.zeros((self.ring.slots, _STAGES + len(FIELDS)), dtype=torch.float64).share_memory_()
        table[:, _JOB] = -1
        control = torch.zeros(1, dtype=torch.int64).share_memory_()
        self._table, self._control = table.numpy(), control.numpy()
        self.shared: list[_Shared] = []
        self.ctrl, self.results, self.procs = [], [], []
        for w in range(num_workers):
            shared = _Shared(list(range(w * self.per_worker, (w + 1) * self.per_worker)),
                             torch.zeros(self.per_worker, dtype=torch.int64).share_memory_(), table, control,
                             ctx.Semaphore(0), ctx.Semaphore(self.per_worker))
            ctrl_recv, ctrl_send = ctx.Pipe(duplex=False)
            res_recv, res_send = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker_main, name=f"dataflow-loader-{w}", daemon=True,
                            args=(source, self.ring, shared, w, num_workers, hook, ctrl_recv, res_send))
            p.start()
            ctrl_recv.close()
            res_send.close()
            self.shared.append(shared)
            self.ctrl.append(ctrl_send)
            self.results.append(res_recv)
            self.procs.append(p)
        self.job = 0
        self.closed = False
        self.copies = 0  # batches handed out as owned copies because every slot of their worker was lent
        self._fills = [sh.fills.numpy() for sh in self.shared]
        self._lent: list[set[int]] = [set() for _ in range(num_workers)]  # set ops are atomic across threads
        self._leases: dict[int, tuple[int, _Lease]] = {}  # slot -> (token, lease), until the slot comes back
        self._tokens = itertools.count(1)  # one per lend: a late release of an older lend frees nothing
        self._pid = os.getpid()
        self._running: list[int] = [0] * num_workers  # the job each worker has not yet reported ended
        self.stage_by_worker: list[dict[str, float]] = [{} for _ in range(num_workers)]
        _POOLS.add(self)

    def healthy(self) -> bool:
        """All workers alive (a pool that lost one is replaced, not reused)."""
        return not self.closed and all(p.is_alive() for p in self.procs)

    def death(self) -> WorkerDied | None:
        """The error for the first worker found dead (one that died while the pool was idle), else None."""
        for w, p in enumerate(self.procs):
            if not p.is_alive():
                return self._died(w, "between jobs")
        return None

    def _died(self, w: int, doing: str) -> WorkerDied:
        """WorkerDied for worker w, naming it, its pid and how it ended (signal or exit code)."""
        p = self.procs[w]
        p.join(timeout=2.0)  # its pipes close as it exits, a moment before it can be reaped
        how, hint = how_it_ended(p.exitcode)
        return WorkerDied(f"loader worker {w} (pid {p.pid}) died {doing}: {how}; {hint}. The next iter() "
                          f"starts new workers at the same position")

    def _send(self, w: int, msg: tuple) -> None:
        """A control message to worker w; a worker that is gone is WorkerDied, not a BrokenPipeError."""
        try:
            self.ctrl[w].send(msg)
        except OSError:  # BrokenPipeError, ConnectionResetError: its end of the pipe is closed
            raise self._died(w, "before its job started") from None

    def run(self, plan: BatchPlan) -> Iterator[dict[str, torch.Tensor]]:
        """Yield the plan's batches in order, as leased views of ring slots (or owned copies)."""
        self._control[0] = 0  # a job still running (an iterator left alive) stops at its next slot
        deadline = time.monotonic() + self.timeout if self.timeout else None
        for w in range(self.num_workers):
            self._settle(w, deadline)
        self.job += 1
        job = self.job
        self._control[0] = job
        for w in range(self.num_workers):
            self._send(w, ("run", job, plan))
            self._running[w] = job
        taken = [0] * self.num_workers  # batches taken from each worker in this job
        try:
            for b in range(plan.num_batches):
                w = b % self.num_workers
                slot, rows = self._receive(w, job, b, taken[w])
                taken[w] += 1
                yield self._hand_out(w, slot, rows)
        finally:
            if self._control[0] == job:
                self._control[0] = 0  # stops the workers at their next slot

    def _hand_out(self, w: int, slot: int, rows: int) -> dict[str, torch.Tensor]:
        """Lend the slot, unless that would leave worker w no slot to fill: then copy it and free it."""
        lent = self._lent[w]
        if len(lent) + 1 < self.per_worker:
            self._table[slot, _STATE] = LENT
            lent.add(slot)
            token = next(self._tokens)
            batch, lease = self.ring.lend(slot, rows, partial(self._give_back, w, slot, token))
            self._leases[slot] = (token, lease)
            return batch
        batch = self.ring.copy(slot, rows)
        self.copies += 1
        self._free(w, slot)
        return batch

    def _give_back(self, w: int, slot: int, token: int) -> None:
        """A lent slot's batch is gone: the slot is worker w's to fill again (run in any thread). Not in a
        forked child (it inherited the lease, not the slot), and only for the lease that lent it now."""
        if self.closed or os.getpid() != self._pid:
            return
        held = self._leases.get(slot)
        if held is None or held[0] != token:
            return
        self._leases.pop(slot, None)
        self._lent[w].discard(slot)
        self._free(w, slot)

    def _free(self, w: int, slot: int) -> None:
        self._table[slot, _STATE] = FREE  # before the post: a permit always finds a FREE slot
        self.shared[w].free.release()

    def _receive(self, w: int, job: int, b: int, k: int) -> tuple[int, int]:
        """Wait until worker w has filled a slot with batch b of `job` (its k-th); returns (slot, rows)."""
        waited = 0.0
        while self.job != job or not self.shared[w].ready.acquire(timeout=POLL_S):
            if self.job != job:
                raise stale_iterator()
            waited += POLL_S
            if self.results[w].poll() or not self.procs[w].is_alive():
                if self.shared[w].ready.acquire(False):  # it posted its batch, then ended or died: take it
                    break
                self._ended(w, b)
            if self.timeout and waited >= self.timeout:
                raise DataflowError(f"loader worker {w} produced no batch in {self.timeout:g} s")
        slot = int(self._fills[w][k % self.per_worker])
        row = self._table[slot]
        if row[_STATE] != FILLED or row[_JOB] != job or row[_BATCH] != b:
            self._ended(w, b)  # posted without filling a slot: it failed
            raise DataflowError(f"loader worker {w} posted batch {b} without filling it (protocol error)")
        add_report(self.stage_by_worker[w], report_of(dict(zip(FIELDS, row[_STAGES:].tolist()))))
        return slot, int(row[_ROWS])

    def _ended(self, w: int, b: int) -> None:
        """Worker w ended its job before producing batch b: raise its error, or say it died."""
        if self.results[w].poll():
            try:
                job, payload, text = self.results[w].recv()
            except EOFError:
                job, payload, text = None, None, None
            if job is not None and job == self._running[w]:
                self._running[w] = 0
                if text is not None:
                    raise restore_error(payload, text, w)
                raise DataflowError(f"loader worker {w} ended its job before batch {b} (protocol error)")
        if not self.procs[w].is_alive():
            raise self._died(w, f"while producing batch {b}")

    def _settle(self, w: int, deadline: float | None) -> None:
        """Before a new job: wait until worker w has left its last job, then free what it filled for it."""
        while self._running[w]:
            if not self.procs[w].is_alive():
                raise self._died(w, "between jobs")
            if self.results[w].poll(POLL_S):
                try:
                    job, _, text = self.results[w].recv()
                except EOFError:  # the worker is gone: the liveness check above reports it
                    continue
                if job == self._running[w]:
                    self._running[w] = 0
                    if text is not None:
                        self._take_error_post(w)
            elif deadline is not None and time.monotonic() > deadline:
                raise DataflowError(f"loader worker {w} did not stop its previous job in {self.timeout:g} s")
        shared = self.shared[w]
        while shared.ready.acquire(False):
            pass
        for slot in shared.slots:  # filled for the old job and never taken: free again
            if self._table[slot, _STATE] == FILLED:
                self._free(w, slot)

    def _take_error_post(self, w: int) -> None:
        """Worker w reported a failed job nobody waited for: take the `ready` it posts right after the
        report, or that late post would pass for the next job's first batch."""
        while not self.shared[w].ready.acquire(timeout=POLL_S):
            if not self.procs[w].is_alive():
                return

    def close(self) -> None:
        self.closed = True
        self._control[0] = 0
        for c in self.ctrl:
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


def _stop_all() -> None:
    """At exit, stop open pools' workers the orderly way (before multiprocessing terminates them): they
    let go of their cache locks as they leave."""
    for pool in list(_POOLS):
        if not pool.closed:
            try:
                pool.close()
            except Exception:
                pass


atexit.register(_stop_all)  # runs before multiprocessing's own exit handler (registered earlier)


__all__ = ["SlotRing", "WorkerPool", "WorkerDied", "how_it_ended"]  # SlotRing: from ring.py; how_it_ended: worker_exit.py
