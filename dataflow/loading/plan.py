"""The loader's written contract, part 1: which samples each batch holds, and the resume state.

Everything here is a pure function of small integers, so every transport (in-process, worker pool,
torch's DataLoader) computes the same batches, and a resume needs nothing but `LoaderState`:

- the epoch's global sample order is fixed by (seed, epoch, manifest) (see `shuffle.py`);
- `consumed` global samples of the epoch are already served (all ranks together);
- rank r serves the remaining global samples `consumed + r + world * j`, j = 0, 1, ...; batch b holds
  this rank's j in [b*B, (b+1)*B). Any number of ranks or workers can continue from (epoch, consumed).

Part 2 (`StreamingDataset.fill`) turns one batch's sample ids into tensors in a given buffer; the
transports (`loader.py`, `handoff.py`) know only these two things.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

import torch

from dataflow.errors import ConfigError

STATE_VERSION = 2


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


@dataclass(frozen=True)
class LoaderState:
    """Where the next batch starts: small and JSON-serialisable, valid for any number of ranks or workers.

    `dataset` is a fingerprint of the data and the sampling settings: a state saved on other data (even
    with the same sample count) is refused instead of silently serving the wrong samples.
    """

    epoch: int
    consumed: int
    seed: int
    num_samples: int
    seq_len: int | None
    dataset: str

    def to_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, **asdict(self)}

    @staticmethod
    def from_dict(state: Any) -> "LoaderState":
        """Parse a saved state, with one clear error for anything malformed."""
        if not isinstance(state, dict):
            raise ConfigError(f"cannot resume: a loader state is a dict (from state_dict()), got {type(state).__name__}")
        if "version" not in state:
            keys = ", ".join(map(str, state)) or "none"
            raise ConfigError(f"cannot resume: this is not a loader state (its keys: {keys}); pass what "
                              f"StreamingDataLoader.state_dict() returned")
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"cannot resume: loader state version {state.get('version')!r} is not {STATE_VERSION} "
                              f"(saved by another dataflow version); start the epoch afresh")
        fields = {"epoch": int, "consumed": int, "seed": int, "num_samples": int, "seq_len": (int, type(None)),
                  "dataset": str}
        for key, kind in fields.items():
            value = state.get(key, ...)
            if value is ... or isinstance(value, bool) or not isinstance(value, kind):
                raise ConfigError(f"cannot resume: loader state field {key!r} is {value if value is not ... else 'missing'!r}; "
                                  f"pass a dict saved by state_dict()")
        if state["epoch"] < 0 or state["consumed"] < 0:
            raise ConfigError(f"cannot resume: epoch {state['epoch']} and consumed {state['consumed']} must be >= 0")
        return LoaderState(**{k: state[k] for k in fields})

    def check_matches(self, current: "LoaderState") -> None:
        """Raise unless this saved state belongs to the same data and settings as `current`."""
        for key in ("seq_len", "seed", "num_samples", "dataset"):
            if getattr(self, key) != getattr(current, key):
                what = "dataset fingerprint" if key == "dataset" else key
                raise ConfigError(f"cannot resume: the state was saved with {what}={getattr(self, key)}, this "
                                  f"dataset has {getattr(current, key)} (different data or settings)")
        if self.consumed > self.num_samples:
            raise ConfigError(f"cannot resume: consumed={self.consumed} is beyond the epoch's {self.num_samples} samples")


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
