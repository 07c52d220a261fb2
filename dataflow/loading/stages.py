"""The loader's stages, their one adder, and the one hook through which per-batch timings leave the loader.

`fill` (the `BatchSource` contract, contract.py) returns a `FillReport` for one batch: the seconds of
each stage and, apart, the filling process's running counts. The transport that ran it
(the main process, or a worker) adds them to the loader's running totals and, when the user passed a
`stage_hook`, calls it with a `BatchTiming` in the process that built the batch (so it must be
picklable to reach workers). `dataflow profile` subscribes through that hook; nothing is patched.
"""

from __future__ import annotations

import multiprocessing
import threading
from dataclasses import dataclass, field
from typing import Callable, Optional

from dataflow.loading.contract import FillReport

STAGES = ("shuffle", "fetch", "decode", "read", "collate")  # what `fill` times, in order
# running totals of the process that built the batch (the latest value counts, not a sum): zstd shards it
# decoded into the shared cache (in the batch's path or ahead of it), decoded copies it found, its decode CPU
TOTALS = ("shards_decoded", "decode_hits", "decode_cpu_s")
FIELDS = STAGES + TOTALS  # what a batch reports
DESCRIPTIONS = {
    "shuffle": "epoch order: locate samples",
    "fetch": "download and open shards",
    "decode": "wait for zstd shards decoded into the shared cache",
    "read": "read and decompress record batches",
    "collate": "pack samples into the batch",
}


@dataclass(frozen=True)
class BatchTiming:
    """One batch as built: where (`track`: worker-N or main:<thread>), when (perf_counter, a clock shared
    by the machine's processes on Linux), how many rows, `seconds` of each stage (`STAGES`) and
    `counts`, the process's running `TOTALS`."""

    track: str
    t0: float
    t1: float
    rows: int
    seconds: dict[str, float]
    counts: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def of(report: FillReport, t0: float, t1: float, rows: int) -> "BatchTiming":
        """The timing of a batch this process/thread just filled."""
        return BatchTiming(track_name(), t0, t1, rows, dict(report.seconds), dict(report.counts))


StageHook = Callable[[BatchTiming], None]
Hook = Optional[StageHook]


def add_seconds(into: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Add stage seconds into a running total (in place; returns it)."""
    for k, v in more.items():
        into[k] = into.get(k, 0.0) + v
    return into


def add_report(into: dict[str, float], report: FillReport) -> dict[str, float]:
    """Fold one batch's report into a process's running figures: stage seconds add up, counts are the
    process's own running totals and replace the previous ones (in place; returns it)."""
    add_seconds(into, report.seconds)
    into.update(report.counts)
    return into


def report_of(fields: dict[str, float]) -> FillReport:
    """A `FillReport` from its flat `FIELDS` (a row of the worker pool's shared table)."""
    return FillReport({k: fields.get(k, 0.0) for k in STAGES}, {k: fields.get(k, 0.0) for k in TOTALS})


def track_name() -> str:
    """The timeline track of the calling process/thread: worker-N inside a loader worker, else main:<thread>."""
    name = multiprocessing.current_process().name  # the pool names its workers dataflow-loader-<w>
    if name.startswith("dataflow-loader-"):
        return "worker-" + name.rsplit("-", 1)[1]
    return "main:" + threading.current_thread().name.replace(" ", "_")
