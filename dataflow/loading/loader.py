"""`StreamingDataLoader`: this rank's batches in a fixed order, with exact, elastic resume.

Batch b of an epoch holds this rank's samples [b*B, (b+1)*B). With workers, worker w builds the
batches b with b % num_workers == w and the loader yields them back in order, so the batches do not
depend on `num_workers`. The state is the dataset's (epoch, global samples consumed): small,
JSON-serialisable, and valid for any number of workers or ranks.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from dataflow.errors import ConfigError
from dataflow.loading.dataset import StreamingDataset


class _BatchStream(IterableDataset):
    """What each torch worker runs: its share of the epoch's batches, already collated."""

    def __init__(self, dataset: StreamingDataset, batch_size: int, num_batches: int, consumed: int):
        self.dataset, self.batch_size, self.num_batches, self.consumed = dataset, batch_size, num_batches, consumed

    def __iter__(self) -> Iterator[dict[str, Any]]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        per_rank = self.dataset.samples_per_rank(self.consumed)
        for b in range(worker, self.num_batches, workers):
            stop = min((b + 1) * self.batch_size, per_rank)
            yield self.dataset.collate(self.dataset.rank_sample_ids(b * self.batch_size, stop, self.consumed))


class StreamingDataLoader:
    """Iterates a `StreamingDataset` in batches like a DataLoader, with `state_dict()` that resumes exactly.

    Each `iter()` serves the rest of the current epoch; once an epoch is finished the next `iter()`
    starts the next one. Takes DataLoader's `num_workers`, `pin_memory`, `persistent_workers`,
    `prefetch_factor`, `timeout` and `multiprocessing_context`.
    """

    def __init__(self, dataset: StreamingDataset, batch_size: int = 1, num_workers: int = 0,
                 drop_last: bool = True, pin_memory: bool = False, persistent_workers: bool = False,
                 prefetch_factor: int | None = None, timeout: float = 0, multiprocessing_context: Any = None):
        if not isinstance(dataset, StreamingDataset):
            raise ConfigError("StreamingDataLoader takes a StreamingDataset")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be positive, got {batch_size}")
        self.dataset, self.batch_size, self.num_workers = dataset, batch_size, num_workers
        self.drop_last = drop_last
        self._loader_kwargs = dict(num_workers=num_workers, pin_memory=pin_memory, timeout=timeout,
                                   multiprocessing_context=multiprocessing_context)
        if num_workers > 0:
            self._loader_kwargs.update(persistent_workers=False, prefetch_factor=prefetch_factor or 2)
        self.batches_yielded = 0  # in the current iteration

    def __len__(self) -> int:
        """Batches left in the current epoch for this rank (the same on every rank)."""
        per_rank = self.dataset.samples_per_rank()
        return per_rank // self.batch_size if self.drop_last else -(-per_rank // self.batch_size)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        ds = self.dataset
        start, num_batches = ds.consumed, len(self)
        _, world = ds.rank_world()
        stream = _BatchStream(ds, self.batch_size, num_batches, start)
        source = iter(stream) if self.num_workers == 0 else \
            iter(DataLoader(stream, batch_size=None, **self._loader_kwargs))
        self.batches_yielded = 0
        for batch in source:
            self.batches_yielded += 1
            ds.consumed = min(start + self.batches_yielded * self.batch_size * world, ds.num_samples)
            yield batch
        ds.epoch, ds.consumed = ds.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        self.dataset.set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """Where the next batch starts: resume with `load_state_dict` in a new process."""
        return {**self.dataset.state_dict(), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
