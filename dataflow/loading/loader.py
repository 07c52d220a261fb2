"""`StreamingDataLoader`: this rank's batches in a fixed order, batches the user owns, exact and elastic resume.

The batches come from `BatchPlan` (plan.py): batch b of an epoch holds this rank's samples
[b*B, (b+1)*B), whatever the transport. Without workers they are filled in this process into fresh
tensors; with workers, worker w builds the batches b with b % num_workers == w into a shared slot ring
(`handoff.py`) and the loader yields them back in order as leased views, so the batches do not depend
on `num_workers`. The loader walks the source's `Cursor` (cursor.py) as it yields: its position
(epoch, consumed) is the whole resume state, valid for any number of workers or ranks. The loader
knows its source only through the `SampleSource` contract (contract.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
from functools import partial
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.multiprocessing as tmp
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataflow import env
from dataflow.audit.log import AuditLog
from dataflow.debug import cause
from dataflow.errors import ConfigError, WorkerDied
from dataflow.loading.contract import SampleSource, StageSnapshot
from dataflow.loading.handoff import WorkerPool, how_it_ended
from dataflow.loading.plan import BatchPlan
from dataflow.loading.stages import STAGES, TOTALS, BatchTiming, Hook, add_report, add_seconds
from dataflow.loading.watchdog import Watchdog

HELD_BATCHES = 4  # yielded batches a consumer may hold at once before it gets copies (default held_batches)


@dataclass
class LoaderStats:
    batches: int = 0  # yielded since the loader was made
    copies: int = 0  # yielded as owned copies because the consumer held every slot of a worker


class _Documents(IterableDataset):
    """Whole-document batches through torch's DataLoader (variable sizes do not fit a fixed ring)."""

    def __init__(self, dataset: SampleSource, plan: BatchPlan):
        self.dataset, self.plan = dataset, plan

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        for b in range(worker, self.plan.num_batches, workers):
            yield self.dataset.documents(self.plan.sample_ids(b), self.plan.epoch)


def _int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _flag(v: Any) -> bool:
    return isinstance(v, (bool, np.bool_))


_ARGUMENTS: dict[str, tuple[Any, str]] = {  # StreamingDataLoader's arguments: (acceptable?, what they must be)
    "batch_size": (lambda v: _int(v) and v >= 1, "an integer >= 1"),
    "num_workers": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "drop_last": (_flag, "True or False"),
    "pin_memory": (_flag, "True or False"),
    "persistent_workers": (_flag, "True or False"),
    "prefetch_factor": (lambda v: v is None or _int(v) and v >= 1, "an integer >= 1, or None (2)"),
    "timeout": (lambda v: (_int(v) or isinstance(v, (float, np.floating))) and 0 <= v < float("inf"),
                "a number of seconds >= 0 (0: no limit)"),
    "multiprocessing_context": (lambda v: v is None or hasattr(v, "Process") or v in tmp.get_all_start_methods(),
                                f"one of {tmp.get_all_start_methods()}, a multiprocessing context, or None"),
    "cycle": (_flag, "True or False"),
    "held_batches": (lambda v: _int(v) and v >= 0, "an integer >= 0"),
    "stage_hook": (lambda v: v is None or callable(v), "a callable taking a BatchTiming, or None"),
    "audit": (lambda v: v is None or isinstance(v, (str, os.PathLike)) and str(v).strip() != "",
              "a folder for the data-order audit, or None"),
    "watchdog_s": (lambda v: v is None or (_int(v) or isinstance(v, (float, np.floating))) and 0 <= v < float("inf"),
                   "a number of seconds >= 0 (0: off), or None ($DATAFLOW_WATCHDOG_S, else 300)"),
}


def _check_arguments(given: dict[str, Any]) -> None:
    """One `ConfigError` line for a StreamingDataLoader argument that cannot work."""
    for name, (acceptable, want) in _ARGUMENTS.items():
        if not acceptable(given[name]):
            raise ConfigError(f"StreamingDataLoader: {name} must be {want}, got {given[name]!r}")


def held_after_reserve(held_batches: int, reserved: int) -> int:
    """A loader's `held_batches` once a consumer reserved room for `reserved` held batches (`reserve_held`): the
    larger, so a prefetcher never lowers what the user asked for (the profiler's memory estimate uses this rule)."""
    return max(int(held_batches), int(reserved))


def _start_method(context: Any) -> str | None:
    """How worker processes start under `multiprocessing_context` (None: torch's default)."""
    if context is None or isinstance(context, str):
        return tmp.get_context(context).get_start_method()
    return context.get_start_method()


def _torch_workers(loader: DataLoader) -> Iterator[dict[str, Any]]:
    """torch's DataLoader's batches, with a dead worker reported as `WorkerDied` (torch raises a RuntimeError)."""
    it = iter(loader)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return
        except RuntimeError as e:
            if not str(e).startswith("DataLoader worker"):
                raise
            raise _torch_worker_died(it, e) from cause(e)
        yield batch


def _torch_worker_died(it: Any, e: RuntimeError) -> WorkerDied:
    """WorkerDied naming the first dead worker of torch's DataLoader iterator `it` and how it ended."""
    workers = list(getattr(it, "_workers", []))  # torch's own list of its worker processes
    for w, p in enumerate(workers):
        if p.exitcode not in (None, 0):
            how, hint = how_it_ended(p.exitcode)
            return WorkerDied(f"loader worker {w} (pid {p.pid}) died while producing whole-document batches: "
                              f"{how}; {hint}. The next iter() starts new workers at the same position")
    return WorkerDied(f"loader {str(e).strip()[len('DataLoader '):].rstrip('. ')}; killed by another process or "
                      "out of memory? The next iter() starts new workers at the same position")


class StreamingDataLoader:
    """Iterates a `StreamingDataset` in batches like a DataLoader, with `state_dict()` that resumes exactly.

    Each `iter()` serves the rest of the current epoch (a new `iter()` replaces an unfinished one and
    continues where it stopped); once an epoch is finished the next `iter()` starts the next one.
    `cycle=True` goes on epoch after epoch (for step-based training). Takes DataLoader's
    `num_workers`, `pin_memory`, `persistent_workers`, `prefetch_factor`, `timeout` and
    `multiprocessing_context`.

    A yielded batch is yours: its values never change while anything references it. With workers it
    is a view of a shared slot that goes back to the workers when you drop it; if you keep so many
    that a worker would have no slot left, you get owned copies instead (counted in `stats.copies`).
    `pin_memory=True` page-locks the batches when CUDA is present, so `DevicePrefetcher` copies them
    to the GPU directly. `stage_hook(BatchTiming)` is called for each batch in the process that built
    it (it must be picklable to reach workers): `dataflow profile` records through it.
    `audit=DIR` appends the global sample positions each batch holds, as it is yielded, to
    `DIR/audit-rank-R.jsonl` (default: the dataset's own `audit`); `dataflow audit DIR` checks that
    every sample of each epoch was served once across ranks and resumes (`dataflow/audit/`).
    A wait of `watchdog_s` seconds for one batch (default `$DATAFLOW_WATCHDOG_S`, else 300; 0: never)
    logs a warning saying what each worker is doing: its state, CPU and bytes read since, the shard
    files it holds open, its Python stack and stage (`watchdog.py`); again every `watchdog_s` it lasts.
    """

    def __init__(self, dataset: SampleSource, batch_size: int = 1, num_workers: int = 0,
                 drop_last: bool = True, pin_memory: bool = False, persistent_workers: bool = False,
                 prefetch_factor: int | None = None, timeout: float = 0, multiprocessing_context: Any = None,
                 cycle: bool = False, held_batches: int = HELD_BATCHES, stage_hook: Hook = None,
                 audit: str | os.PathLike | None = None, watchdog_s: float | None = None):
        if not isinstance(dataset, SampleSource):
            raise ConfigError(f"StreamingDataLoader takes a StreamingDataset, got {type(dataset).__name__} (or any "
                              f"dataflow.loading.contract.SampleSource)")
        _check_arguments(locals())
        self.dataset, self.batch_size, self.num_workers = dataset, int(batch_size), int(num_workers)
        self.drop_last, self.pin_memory = bool(drop_last), bool(pin_memory)
        self.persistent_workers, self.cycle = bool(persistent_workers), bool(cycle)
        self.prefetch_factor = 2 if prefetch_factor is None else int(prefetch_factor)
        self.timeout, self.context = float(timeout), multiprocessing_context
        self.held_batches, self.stage_hook = int(held_batches), stage_hook
        if len(self) == 0:
            per_rank = dataset.num_samples // dataset.rank_world()[1]
            raise ConfigError(f"{dataset.describe()}: {per_rank} samples per rank and epoch, fewer than one batch "
                              f"of {self.batch_size}; lower batch_size or pass drop_last=False")
        self._pool: WorkerPool | None = None
        self._walk = 0  # the cursor token of this loader's newest iterator
        self._batches = 0
        self._copies = 0  # of closed worker pools
        self._stages: dict[str, float] = {}  # stages run in this process (num_workers=0)
        self._stages_by_worker: dict[int, dict[str, float]] = {}  # those of closed worker pools
        folder = audit if audit is not None else getattr(dataset, "audit", None)
        self._audit = None if folder is None else AuditLog(
            folder, dataset.cursor.state().to_dict(), (*dataset.rank_world(), self.num_workers),
            batch_size=self.batch_size, drop_last=self.drop_last, source=type(self).__name__)
        self._via = "start"  # how the next walk got to its position (the audit's record of resumes)
        after = env.number("DATAFLOW_WATCHDOG_S", 300.0) if watchdog_s is None else float(watchdog_s)
        rank, world = dataset.rank_world()
        self._watchdog = Watchdog(after, f"StreamingDataLoader({dataset.describe()}, rank {rank} of {world})",
                                  lambda: self._pool.pids() if self._pool is not None else []) if after > 0 else None

    def __len__(self) -> int:
        """Batches of one epoch for this rank (the same on every rank)."""
        return dataclasses.replace(self._plan(), consumed=0).num_batches

    def _plan(self) -> BatchPlan:
        return self.dataset.cursor.plan(*self.dataset.rank_world(), self.batch_size, self.drop_last)

    @property
    def pinned(self) -> bool:
        """Whether yielded batches are page-locked (what `DevicePrefetcher` needs for a direct copy)."""
        return bool(self.pin_memory and self.dataset.seq_len is not None and torch.cuda.is_available())

    def reserve_held(self, batches: int) -> None:
        """Room for `batches` yielded batches held at once (`DevicePrefetcher` holds `held_upstream(depth)`); the
        worker ring is sized when it is made, at the next `iter()` that starts workers."""
        self.held_batches = held_after_reserve(self.held_batches, batches)

    @property
    def stats(self) -> LoaderStats:
        return LoaderStats(self._batches, self._copies + (self._pool.copies if self._pool else 0))

    # --- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, Any]]:
        self._walk = self.dataset.cursor.begin()  # an older iterator raises if it is resumed
        return self._iterate(self._walk)

    def _iterate(self, walk: int) -> Iterator[dict[str, Any]]:
        cursor = self.dataset.cursor
        while True:
            plan = self._plan()
            source = self._source(plan)
            audit, via, self._via = self._audit, self._via, None
            audited = audit.walk(plan, via) if audit is not None else 0
            batches = source if self._watchdog is None else self._watchdog.watch(source, partial(self._awaited, plan))
            try:
                for batch in cursor.follow(plan, batches, walk):  # records each batch before it is yielded
                    self._batches += 1
                    if audit is not None:
                        audit.step()
                    yield batch
            except GeneratorExit:  # the consumer stopped early (break, or the iterator was dropped)
                if self._newest(walk) and not self.persistent_workers:
                    self.close()
                raise
            except BaseException:
                if self._newest(walk):
                    self.close()  # a failed or killed pool is not reused: the next iter() starts afresh
                raise
            finally:
                for it in {id(batches): batches, id(source): source}.values():  # the watch first, then its source
                    close = getattr(it, "close", None)
                    if close is not None:
                        close()
                if audit is not None:
                    audit.end_walk(audited)
            if not self.cycle:
                break
        if self._newest(walk) and not self.persistent_workers:
            self.close()

    def _awaited(self, plan: BatchPlan, b: int) -> str:
        """The watchdog's name for batch b of `plan` (and the worker that builds it)."""
        who = f", built by worker {b % self.num_workers}" if self.num_workers and self.dataset.seq_len else ""
        return f"batch {b} of {plan.num_batches} of epoch {plan.epoch}{who}"

    def _newest(self, walk: int) -> bool:
        """Whether `walk` is the source's newest walk (a stale iterator leaves the pool alone)."""
        return self.dataset.cursor.is_current(walk)

    def _source(self, plan: BatchPlan) -> Iterator[dict[str, Any]]:
        ds = self.dataset
        if ds.seq_len is None:
            if self.num_workers == 0:
                return (ds.documents(plan.sample_ids(b), plan.epoch) for b in range(plan.num_batches))
            return _torch_workers(DataLoader(_Documents(ds, plan), batch_size=None, num_workers=self.num_workers,
                                             pin_memory=self.pin_memory, timeout=self.timeout,
                                             prefetch_factor=self.prefetch_factor,
                                             multiprocessing_context=self.context))
        if self.num_workers == 0:
            return self._in_process(plan)
        if self._pool is not None and not self._pool.healthy():
            died = self._pool.death()  # a persistent worker that died while idle: said, then replaced
            self.close()
            if died is not None:
                raise died
        if self._pool is None:
            if self._watchdog is not None and _start_method(self.context) == "fork":
                self._watchdog.prepare_fork()  # the workers inherit the stack dump the watchdog asks for
            self._pool = WorkerPool(ds, ds.batch_layout(self.batch_size), self.num_workers, self.prefetch_factor,
                                    self.held_batches, self.context, pin=self.pin_memory, timeout=self.timeout,
                                    hook=self.stage_hook)
        return self._pool.run(plan)

    def _in_process(self, plan: BatchPlan) -> Iterator[dict[str, torch.Tensor]]:
        """Batches filled in this process into fresh tensors (pinned ones come from torch's host cache)."""
        layout = {k: (shape[1:], torch.from_numpy(np.empty(0, dtype)).dtype)
                  for k, (shape, dtype) in self.dataset.batch_layout(self.batch_size).items()}
        pin = self.pinned
        for b in range(plan.num_batches):
            ids = plan.sample_ids(b)
            out = {k: torch.empty((len(ids), *row), dtype=dtype, pin_memory=pin) for k, (row, dtype) in layout.items()}
            t0 = time.perf_counter()
            report = self.dataset.fill(ids, {k: v.numpy() for k, v in out.items()}, plan.epoch)
            add_report(self._stages, report)
            if self.stage_hook is not None:
                self.stage_hook(BatchTiming.of(report, t0, time.perf_counter(), len(ids)))
            yield out

    # --- stage figures, shutdown, state -----------------------------------------------------------
    @property
    def stage_seconds(self) -> dict[str, float]:
        """Time per pipeline stage since the loader was made (shuffle, fetch, decode, read, collate),
        summed over workers (or spent in the main process without workers); kept across epochs."""
        return {k: v for k, v in self._totals().items() if k in STAGES}

    @property
    def stage_seconds_by_worker(self) -> dict[int, dict[str, float]]:
        """`stage_seconds` of each worker process (a slow or starved worker stands out)."""
        return {w: {k: v for k, v in d.items() if k in STAGES} for w, d in self._by_worker().items()}

    def stage_figures(self) -> StageSnapshot:
        """The `StageFigures` contract: stage seconds, all workers and per worker (what a monitor polls)."""
        return StageSnapshot(self.stage_seconds, {f"worker-{w}": d for w, d in self.stage_seconds_by_worker.items()},
                             sources={"loader": type(self).__name__})

    @property
    def counts(self) -> dict[str, float]:
        """The decoded cache as this loader's processes used it, all together: zstd shards they decoded
        (`shards_decoded`, in a batch's path or ahead of it), decoded copies they found (`decode_hits`),
        and the CPU seconds decoding took (`decode_cpu_s`)."""
        totals = self._totals()
        return {k: (totals.get(k, 0.0) if k == "decode_cpu_s" else int(totals.get(k, 0))) for k in TOTALS}

    def _totals(self) -> dict[str, float]:
        out = dict(self._stages)
        for d in self._by_worker().values():
            add_seconds(out, d)
        return out

    def _by_worker(self) -> dict[int, dict[str, float]]:
        out = {w: dict(d) for w, d in self._stages_by_worker.items()}
        for w, d in enumerate(self._pool.stage_by_worker if self._pool else []):
            add_seconds(out.setdefault(w, {}), d)
        return out

    def close(self) -> None:
        """Stop the worker processes (also done at the end of each epoch unless persistent_workers); the
        audit's records are written, with a clean stop at the current position."""
        if self._audit is not None:
            self._audit.close()
        if self._watchdog is not None:
            self._watchdog.stop()
        if self._pool is not None:
            for w, d in enumerate(self._pool.stage_by_worker):
                add_seconds(self._stages_by_worker.setdefault(w, {}), d)
            self._copies += self._pool.copies
            self._pool.close()
            self._pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` at its beginning (an unfinished iterator is stale from now on)."""
        self.dataset.cursor.set_epoch(epoch)
        self._via = "set_epoch"

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: resume with `load_state_dict` in a new process, any worker count.
        The audit's records up to here are written first (a checkpoint of this state finds them on disk;
        not after `audit_on_yield()`: a downstream that asks at each batch would write a line each time)."""
        if self._audit is not None and not self._audit.deferred:
            self._audit.flush()
        return self.dataset.cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at a saved position (an unfinished iterator is stale from now on)."""
        self.dataset.cursor.load_state_dict(state)
        self._via = "load_state_dict"
        if self._audit is not None:
            self._audit.drop_pending()  # batches read ahead by a downstream were never served

    def audit_on_yield(self) -> Callable[[], None] | None:
        """For a downstream that reads batches ahead and yields them later (`DevicePrefetcher`): from now on
        the audit records a batch when the returned callable is called (once per batch, in order, as the
        downstream yields it to the user), so its read-ahead is never counted as served. None: no audit."""
        if self._audit is None:
            return None
        self._audit.defer()
        return self._audit.yielded
