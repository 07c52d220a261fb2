"""`Cursor`: the one owner of the loading position (epoch, consumed) and of its saved form.

The position moves in exactly one place, `Cursor.follow`, which walks a `BatchPlan` and records each
batch *before* it is handed on (so `state_dict()` taken while a batch is held includes it), then turns
the epoch. `StreamingDataLoader` walks it; iterating a `StreamingDataset` directly walks it with batches
of one sample. Jumps (`set_epoch`, `load_state_dict`) start a new generation: an iteration that was
walking an older one stops with an error instead of overwriting the new position.

Under torch's `DataLoader` with workers the position lives in those workers; `mark_untracked` (a flag
in shared memory, so a worker can set it for the main process) makes `state_dict()` refuse then.
The saved form is `LoaderState` (here, beside its owner), unchanged since STATE_VERSION 2: old states still load.
An epoch is counted in 64 bits: a sample's position in the stream, epoch x samples per epoch + i, is an int64
(a mix locates its sources by it), so an epoch past `last_epoch` is refused in one line, never an overflow.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Iterable, Iterator, TypeVar

import numpy as np
import torch

from dataflow.errors import ConfigError, DataflowError
from dataflow.loading.plan import BatchPlan

T = TypeVar("T")
POSITIONS = 2**63  # sample positions (epoch x samples per epoch + i) are int64
STATE_VERSION = 2


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


def last_epoch(num_samples: int) -> int:
    """The last epoch whose every sample position fits in int64."""
    return POSITIONS // max(num_samples, 1) - 1


class Cursor:
    """Where the next sample of this rank starts, and what a saved position must match to be valid here.

    `seed`, `num_samples`, `seq_len` and `fingerprint` identify the data and sampling settings; a saved
    state from other ones is refused (see `LoaderState.check_matches`)."""

    def __init__(self, seed: int, num_samples: int, seq_len: int | None, fingerprint: str):
        self.seed, self.num_samples, self.seq_len, self.fingerprint = seed, num_samples, seq_len, fingerprint
        self.epoch = 0
        self.consumed = 0  # global samples of the epoch already served (all ranks together)
        self.generation = 0  # bumped by every jump and every new walk
        self._untracked = torch.zeros(1, dtype=torch.uint8).share_memory_()

    # --- reading ----------------------------------------------------------------------------------
    def plan(self, rank: int, world: int, batch_size: int = 1, drop_last: bool = True) -> BatchPlan:
        """This rank's batches from the current position to the end of the epoch."""
        self._check_epoch(self.epoch, "the next epoch")
        return BatchPlan(self.epoch, self.consumed, self.num_samples, rank, world, batch_size, drop_last)

    def state(self) -> LoaderState:
        return LoaderState(self.epoch, self.consumed, self.seed, self.num_samples, self.seq_len, self.fingerprint)

    # --- moving -----------------------------------------------------------------------------------
    def begin(self) -> int:
        """A new walk: returns its token; any walk begun earlier is stale from now on."""
        self.generation += 1
        return self.generation

    def is_current(self, token: int) -> bool:
        return token == self.generation

    def follow(self, plan: BatchPlan, batches: Iterable[T], token: int | None = None) -> Iterator[T]:
        """Yield `batches` (the plan's, in order), recording each as consumed before it is yielded, and
        start the next epoch after the last. With the `token` of `begin()`, a jump or a newer walk made
        meanwhile stops this one with a `DataflowError` instead of letting it overwrite the position."""
        for b, batch in enumerate(batches):
            if token is not None and token != self.generation:
                raise stale_iterator()
            self.consumed = plan.consumed_after(b + 1)
            yield batch
        if token is None or token == self.generation:
            self.epoch, self.consumed = plan.epoch + 1, 0

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of `epoch` (nothing moves if it is the current epoch)."""
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"set_epoch takes an integer >= 0, got {epoch!r}")
        self._check_epoch(int(epoch), "set_epoch")
        self.generation += 1
        if epoch != self.epoch:
            self.epoch, self.consumed = int(epoch), 0

    # --- saving -----------------------------------------------------------------------------------
    def mark_untracked(self) -> None:
        """Called in a torch DataLoader worker: the position now lives where state_dict() cannot see it."""
        self._untracked[0] = 1

    def state_dict(self) -> dict[str, Any]:
        """The position and what it is valid for: small, JSON-serialisable."""
        if self._untracked[0]:
            raise ConfigError("this StreamingDataset was iterated by torch DataLoader workers, which keep its "
                              "position to themselves: state_dict() cannot say where to resume. Use "
                              "dataflow.StreamingDataLoader (it takes batch_size, num_workers, pin_memory, ...)")
        return self.state().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Jump to a saved position, after checking it belongs to this data and these settings."""
        saved = LoaderState.from_dict(state)
        saved.check_matches(self.state())
        self._check_epoch(saved.epoch, "cannot resume")
        self.generation += 1
        self.epoch, self.consumed = saved.epoch, saved.consumed

    def _check_epoch(self, epoch: int, what: str) -> None:
        last = last_epoch(self.num_samples)
        if epoch > last:
            raise ConfigError(f"{what}: epoch {epoch} is past the last one that can be counted: at most {last:,} "
                              f"with {self.num_samples:,} samples per epoch (sample positions are 64-bit); a "
                              f"damaged state? start from a state_dict() or a smaller epoch")


def stale_iterator(what: str = "loader", newer: str = "a newer iter(loader), set_epoch() or load_state_dict()"
                   ) -> DataflowError:
    """The one error of an iterator used after a jump or a newer walk made it stale (the cursor's, the worker
    pool's and the prefetcher's): it never moves the position."""
    return DataflowError(f"this {what} iterator was replaced by {newer}; iterate the new one")
