"""`StreamingDataLoader`: this rank's batches in a fixed order, with exact, elastic resume.

Batch b of an epoch holds this rank's samples [b*B, (b+1)*B). With workers, worker w builds the
batches b with b % num_workers == w and the loader yields them back in order, so the batches do not
depend on `num_workers`. Packed batches travel from the workers through a shared-memory slot ring
(`handoff.py`): no per-batch allocation, only slot numbers cross processes. The state is the dataset's
(epoch, global samples consumed): small, JSON-serialisable, valid for any number of workers or ranks.
"""

from __future__ import annotations

from typing import Any, Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataflow.errors import ConfigError
from dataflow.loading.dataset import STAGES, StreamingDataset
from dataflow.loading.handoff import WorkerPool


def _add(into: dict[str, float], more: dict[str, float]) -> None:
    """Add stage seconds into a running total."""
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v


class _BatchStream(IterableDataset):
    """Whole-document batches through torch's DataLoader (variable sizes do not fit a fixed ring)."""

    def __init__(self, dataset: StreamingDataset, batch_size: int, num_batches: int, consumed: int,
                 stats: dict[str, float] | None = None):
        self.dataset, self.batch_size, self.num_batches, self.consumed = dataset, batch_size, num_batches, consumed
        self.stats = stats  # stage seconds, accumulated where the batches are built

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        per_rank = self.dataset.samples_per_rank(self.consumed)
        for b in range(worker, self.num_batches, workers):
            stop = min((b + 1) * self.batch_size, per_rank)
            yield self.dataset.collate(self.dataset.rank_sample_ids(b * self.batch_size, stop, self.consumed),
                                       stats=self.stats)


class StreamingDataLoader:
    """Iterates a `StreamingDataset` in batches like a DataLoader, with `state_dict()` that resumes exactly.

    Each `iter()` serves the rest of the current epoch; once an epoch is finished the next `iter()`
    starts the next one. Takes DataLoader's `num_workers`, `pin_memory`, `persistent_workers`,
    `prefetch_factor`, `timeout` and `multiprocessing_context`.

    With workers, a yielded packed batch is a view of a shared slot: it stays valid until the consumer
    has taken `lifetime` more batches (default 4, enough for a `DevicePrefetcher` of depth 2). Pass
    `copy=True` for batches you own. `pin_memory=True` page-locks the slot ring when CUDA is present.
    """

    def __init__(self, dataset: StreamingDataset, batch_size: int = 1, num_workers: int = 0,
                 drop_last: bool = True, pin_memory: bool = False, persistent_workers: bool = False,
                 prefetch_factor: int | None = None, timeout: float = 0, multiprocessing_context: Any = None,
                 lifetime: int = 4, copy: bool = False):
        if not isinstance(dataset, StreamingDataset):
            raise ConfigError("StreamingDataLoader takes a StreamingDataset")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be positive, got {batch_size}")
        if num_workers < 0 or lifetime < 1:
            raise ConfigError("num_workers must be >= 0 and lifetime >= 1")
        self.dataset, self.batch_size, self.num_workers = dataset, batch_size, num_workers
        self.drop_last, self.pin_memory, self.persistent_workers = drop_last, pin_memory, persistent_workers
        self.prefetch_factor = prefetch_factor or 2
        self.timeout, self.context = timeout, multiprocessing_context
        self.lifetime, self.copy = lifetime, copy
        self.batches_yielded = 0  # in the current iteration
        self._pool: WorkerPool | None = None
        self._stages: dict[str, float] = {}  # stages run in this process (num_workers=0)
        self._stages_by_worker: dict[int, dict[str, float]] = {}  # those of closed worker pools

    def __len__(self) -> int:
        """Batches left in the current epoch for this rank (the same on every rank)."""
        per_rank = self.dataset.samples_per_rank()
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def _batches(self, start: int, num_batches: int) -> Iterator[dict[str, Any]]:
        ds = self.dataset
        if self.num_workers == 0:
            return iter(_BatchStream(ds, self.batch_size, num_batches, start, self._stages))
        if ds.seq_len is None:
            loader = DataLoader(_BatchStream(ds, self.batch_size, num_batches, start), batch_size=None,
                                num_workers=self.num_workers, pin_memory=self.pin_memory, timeout=self.timeout,
                                prefetch_factor=self.prefetch_factor, multiprocessing_context=self.context)
            return iter(loader)
        if self._pool is None:
            self._pool = WorkerPool(ds, ds.batch_layout(self.batch_size), self.num_workers, self.prefetch_factor,
                                    self.lifetime, self.context, pin=self.pin_memory, timeout=self.timeout,
                                    stages=STAGES)
        return self._pool.run(ds.epoch, start, num_batches, self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ds = self.dataset
        start, num_batches = ds.consumed, len(self)
        _, world = ds.rank_world()
        total = ds.num_samples
        self.batches_yielded = 0
        source = self._batches(start, num_batches)
        try:
            for batch in source:
                self.batches_yielded += 1
                ds.consumed = min(start + self.batches_yielded * self.batch_size * world, total)
                yield {k: v.clone() for k, v in batch.items()} if self.copy else batch
            ds.epoch, ds.consumed = ds.epoch + 1, 0
        finally:
            close = getattr(source, "close", None)
            if close is not None:
                close()
            if not self.persistent_workers:
                self.close()

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Time per pipeline stage since the loader was made (fetch, read/decompress, shuffle, collate),
        summed over workers (or spent in the main process without workers); kept across epochs."""
        out = dict(self._stages)
        for d in self.stage_seconds_by_worker.values():
            _add(out, d)
        return out

    @property
    def stage_seconds_by_worker(self) -> dict[int, dict[str, float]]:
        """`stage_seconds` of each worker process (a slow or starved worker stands out)."""
        out = {w: dict(d) for w, d in self._stages_by_worker.items()}
        for w, d in enumerate(self._pool.stage_by_worker if self._pool else []):
            _add(out.setdefault(w, {}), d)
        return out

    def close(self) -> None:
        """Stop the worker processes (also done at the end of each epoch unless persistent_workers)."""
        if self._pool is not None:
            for w, d in enumerate(self._pool.stage_by_worker):
                _add(self._stages_by_worker.setdefault(w, {}), d)
            self._pool.close()
            self._pool = None

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: resume with `load_state_dict` in a new process."""
        return {**self.dataset.state_dict(), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
