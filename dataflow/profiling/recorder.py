"""Per-batch stage timestamps from inside the loader's workers, for the profile's trace and per-worker figures.

`StageRecorder(folder)` is a loader `stage_hook`: called for each batch in the process that built it
(a worker, or the main process without workers), it appends one line
`pid track t0 t1 rows <stage seconds> <counts>` (`loading.stages.FIELDS`) to `folder/stages-<pid>.txt` with a single
`os.write`. Timestamps are `time.perf_counter()`: a system-wide monotonic clock on Linux, so the
workers' slices line up with the main process's. Used by `dataflow profile`, not in production loops.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from typing import Any, Iterable, Iterator

from dataflow.loading.stages import FIELDS, STAGES, TOTALS, BatchTiming


class StageRecorder:
    """A picklable `stage_hook` that writes one line per batch into `folder` (one file per process)."""

    def __init__(self, folder: str):
        self.folder = folder
        self._fd: tuple[int, int] | None = None  # (pid, fd): a forked worker opens its own file

    def __getstate__(self) -> dict[str, Any]:
        return {"folder": self.folder, "_fd": None}

    def __call__(self, t: BatchTiming) -> None:
        if self._fd is None or self._fd[0] != os.getpid():
            path = os.path.join(self.folder, f"stages-{os.getpid()}.txt")
            self._fd = (os.getpid(), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        fields = {**t.seconds, **t.counts}
        line = (f"{os.getpid()} {t.track} {t.t0:.9f} {t.t1:.9f} {t.rows} "
                + " ".join(f"{fields.get(k, 0.0):.9f}" for k in FIELDS) + "\n")
        os.write(self._fd[1], line.encode())


def read_stage_events(folder: str, since: float = 0.0) -> list[dict[str, Any]]:
    """The recorded batches (pid, track, t0, t1, rows, stage seconds) that started at or after `since`."""
    events = []
    for path in sorted(glob.glob(os.path.join(folder, "stages-*.txt"))):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) != 5 + len(FIELDS):
                    continue  # a line cut short by a killed worker
                t0 = float(parts[2])
                if t0 >= since:
                    events.append({"pid": int(parts[0]), "track": parts[1], "t0": t0, "t1": float(parts[3]),
                                   "rows": int(parts[4]),
                                   "stages": {k: float(v) for k, v in zip(STAGES, parts[5:])},
                                   "totals": {k: float(v) for k, v in zip(TOTALS, parts[5 + len(STAGES):])}})
    events.sort(key=lambda e: e["t0"])
    return events


def per_track_seconds(events: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Stage seconds per track (worker-0, worker-1, ... or main:<thread>)."""
    out: dict[str, dict[str, float]] = {}
    for e in events:
        d = out.setdefault(e["track"], {})
        for k, v in e["stages"].items():
            d[k] = d.get(k, 0.0) + v
    return dict(sorted(out.items()))


def decode_counts(events: list[dict[str, Any]]) -> dict[str, float]:
    """The decoded cache as the recorded processes used it, all together (`loading.stages.TOTALS`): each
    process's running totals as of its latest batch, summed over processes."""
    latest: dict[int, dict[str, float]] = {}
    for e in sorted(events, key=lambda e: e["t0"]):
        latest[e["pid"]] = e["totals"]
    out = {k: sum(t.get(k, 0.0) for t in latest.values()) for k in TOTALS}
    return {k: (v if k == "decode_cpu_s" else int(round(v))) for k, v in out.items()}


class TimedUpstream:
    """Wraps the iterator a prefetcher pulls from, recording each `next()` as a `load` slice on its thread."""

    def __init__(self, batches: Iterable[Any], limit: int = 100_000):
        self.upstream = batches
        self.slices: list[tuple[str, float, float]] = []  # (thread name, start, end)
        self.limit = limit

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.upstream)
        name = threading.current_thread().name
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                return
            if len(self.slices) < self.limit:
                self.slices.append((name, t0, time.perf_counter()))
            yield batch
            del batch
