"""The loader's written contract, part 1: which samples each batch holds.

Everything here is a pure function of small integers, so every transport (in-process, worker pool,
torch's DataLoader) computes the same batches, and a resume needs nothing but the cursor's
saved position (`LoaderState`, cursor.py):

- the epoch's global sample order is fixed by (seed, epoch, manifest) (see `shuffle.py`);
- `consumed` global samples of the epoch are already served (all ranks together);
- rank r serves the remaining global samples `consumed + r + world * j`, j = 0, 1, ...; batch b holds
  this rank's j in [b*B, (b+1)*B). Any number of ranks or workers can continue from (epoch, consumed).

Part 2 (`StreamingDataset.fill`) turns one batch's sample ids into tensors in a given buffer; the
transports (`loader.py`, `handoff.py`) know only these two things.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

import torch

from dataflow.errors import ConfigError


@dataclass(frozen=True)
class BatchPlan:
    """This rank's batches of one epoch from position `consumed`: (plan, b) -> the global sample ids."""

    epoch: int
    consumed: int  # global samples of the epoch served before batch 0
    total: int  # global samples in the epoch
    rank: int
    world: int
    batch_size: int
    drop_last: bool = True

    @property
    def samples_per_rank(self) -> int:
        """Samples this rank serves from `consumed` to the end of the epoch (equal on every rank)."""
        return max(self.total - self.consumed, 0) // self.world

    @property
    def num_batches(self) -> int:
        n, b = self.samples_per_rank, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def sample_ids(self, b: int) -> np.ndarray:
        """Global ids of the samples of batch b (fewer than batch_size only for a last partial batch)."""
        j0 = b * self.batch_size
        j1 = min(j0 + self.batch_size, self.samples_per_rank)
        return self.consumed + self.rank + self.world * np.arange(j0, j1, dtype=np.int64)

    def consumed_after(self, batches: int) -> int:
        """The epoch position once this rank (and, in lockstep, every rank) has taken `batches` batches."""
        return min(self.consumed + batches * self.batch_size * self.world, self.total)


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """(rank, world size): the arguments when given, else torch.distributed's when initialised, else (0, 1)."""
    if rank is not None or world_size is not None:
        rank, world_size = rank or 0, world_size or 1
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world_size = 0, 1
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size
