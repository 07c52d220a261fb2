"""The loading runtime's doors, as types: what a transport may ask of the data, and what it gets back.

`BatchSource` is all a transport knows (the in-process loop in `loader.py`, `WorkerPool` and its
workers in `handoff.py`): the layout of a packed batch, `fill` (one batch's samples into a given
buffer, returning a `FillReport`), `documents` (whole-document batches) and `close`.
`SampleSource` adds what `StreamingDataLoader` needs to plan batches and resume: the sample count,
the rank, and the `Cursor` (cursor.py) that owns the position. `StreamingDataset` implements both;
so can a test double or another backend, and the loader drives it unchanged.
`LendingLoader` is what `DevicePrefetcher` may ask of its upstream (it never imports the loader):
whether batches are page-locked, and room for the batches it holds at once. `StageFigures` is all
the profiler reads of a pipeline it is handed: one `StageSnapshot` of running figures (a wrapper
such as `DevicePrefetcher` lays its own over its upstream's). Per-batch timings leave through the
loader's `stage_hook` (stages.py).

Which process runs what: `fill`/`documents` run in the process that builds the batch (the main
process without workers, else a worker holding its own copy of the source); the cursor lives in
the main process and only `Cursor.follow` moves it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

from dataflow.loading.cursor import Cursor

BatchLayout = dict[str, tuple[tuple[int, ...], Any]]  # field -> (shape, numpy dtype) of a packed batch


@dataclass(frozen=True)
class FillReport:
    """What filling one batch cost: `seconds` per stage (`stages.STAGES`, they add up over batches) and
    `counts`, the filling process's running totals (`stages.TOTALS`: the latest replaces the previous)."""

    seconds: dict[str, float] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)

    def fields(self) -> dict[str, float]:
        """Both, flat (a row of the worker pool's shared table)."""
        return {**self.seconds, **self.counts}


@runtime_checkable
class BatchSource(Protocol):
    """What a transport may ask of the data (and nothing else)."""

    def batch_layout(self, batch_size: int) -> BatchLayout:
        """Shapes and dtypes of a packed batch of `batch_size` rows (what `fill` writes)."""
        ...

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray], epoch: int) -> FillReport:
        """Write the samples of global `ids` of `epoch` into the first rows of `out` (arrays of `batch_layout`)."""
        ...

    def documents(self, ids: np.ndarray, epoch: int) -> dict[str, Any]:
        """Whole documents of global `ids` (no fixed layout): {"tokens": [LongTensor], "id": [str]}."""
        ...

    def close(self, wait: bool = True) -> None:
        """Let go of this process's open files and locks (`wait=False`: a worker about to exit)."""
        ...


@runtime_checkable
class SampleSource(BatchSource, Protocol):
    """A `BatchSource` that `StreamingDataLoader` can plan and resume: samples, ranks and the position."""

    seq_len: int | None  # None: whole documents (`documents`), else packed batches (`fill`)
    cursor: Cursor

    @property
    def num_samples(self) -> int:
        """Samples in one epoch, all ranks together."""
        ...

    def rank_world(self) -> tuple[int, int]:
        """(this rank, number of ranks)."""
        ...

    def describe(self) -> str:
        """A short name for messages (the dataset's first path)."""
        ...


@runtime_checkable
class LendingLoader(Protocol):
    """An upstream that lends its batches from a fixed ring (`StreamingDataLoader`): a consumer that
    holds several batches at once says how many, before the ring is made, so it is sized for them."""

    @property
    def pinned(self) -> bool:
        """Whether yielded batches are page-locked (a direct host-to-device copy)."""
        ...

    def reserve_held(self, batches: int) -> None:
        """Room for `batches` yielded batches held at once (taken when the ring is next made)."""
        ...


@runtime_checkable
class AuditedLoader(Protocol):
    """An upstream whose data-order audit a consumer that reads ahead (`DevicePrefetcher`) tells as each batch
    reaches the user, so read-ahead is never counted as served (`StreamingDataLoader`)."""

    def audit_on_yield(self) -> Callable[[], None] | None:
        """A callable to call as each batch reaches the user (None: the loader keeps no audit)."""
        ...


@runtime_checkable
class Resumable(Protocol):
    """A loader whose position can be saved and restored exactly (`StreamingDataLoader`, `StreamingDataset`,
    `DevicePrefetcher`): what a checkpoint stores beside the model (torchtitan's `Stateful`)."""

    def state_dict(self) -> dict[str, Any]:
        """The position after the last batch yielded (a plain, JSON-able dict)."""
        ...

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Go on from `state`; an unfinished iterator is stale from now on."""
        ...


@dataclass(frozen=True)
class StageSnapshot:
    """A pipeline's running figures since it was made (they may restart with a new worker pool).

    `stages`: loader seconds per stage (`stages.STAGES`), summed over workers; `by_worker`: the same per
    worker ("worker-N"); `transfer`: the device prefetcher's `batches`, `wait_s`, `upstream_s`, and
    `h2d_s` when its copies are timed (CUDA events); `sources`: role ("loader", "prefetcher") -> class
    name; `device`: where the batches arrive, when a prefetcher says so.
    """

    stages: dict[str, float] = field(default_factory=dict)
    by_worker: dict[str, dict[str, float]] = field(default_factory=dict)
    transfer: dict[str, float] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    device: str | None = None

    def over(self, below: "StageSnapshot") -> "StageSnapshot":
        """This snapshot with what it lacks taken from `below` (a wrapper's figures over its upstream's)."""
        return StageSnapshot(self.stages or below.stages, self.by_worker or below.by_worker,
                             self.transfer or below.transfer, {**below.sources, **self.sources},
                             self.device if self.device is not None else below.device)


@runtime_checkable
class StageFigures(Protocol):
    """A pipeline part that keeps running stage figures (`StreamingDataLoader`, `DevicePrefetcher`):
    all the profiler's `StarvationMonitor` reads of what it wraps."""

    def stage_figures(self) -> StageSnapshot:
        """The figures now (cheap: a few dict entries; polled after every batch)."""
        ...
