"""Per-batch stage timestamps from inside the loader's workers, for the profile's trace and per-worker figures.

`record_stages(dataset, folder)` turns a `StreamingDataset` (or a subclass) into a recording one: each
`collate_into` (run in a worker, or in the main process without workers) appends one line
`pid name t0 t1 rows fetch read shuffle collate` to `folder/stages-<pid>.txt` with a single
`os.write`, and also returns a `fetch` stage (time opening/downloading shards, taken out of `read`).
Timestamps are `time.perf_counter()`: a system-wide monotonic clock on Linux, so the workers' slices
line up with the main process's. Used by `dataflow profile`, not in production loops.
"""

from __future__ import annotations

import glob
import multiprocessing
import os
import threading
import time
from typing import Any, Iterable, Iterator

import numpy as np

_CLASSES: dict[type, type] = {}
FIELDS = ("fetch", "read", "shuffle", "collate")


class _Recording:
    """Methods over a StreamingDataset class: times `_shard` opens and writes one line per batch.

    Not a mixin base (a second base would change the instance layout and forbid the `__class__`
    swap): `_recording_class` copies these methods into a direct subclass of the dataset's class.
    """

    _stage_dir: str
    _traced_base: type

    def _shard(self, k: int) -> Any:
        base = self._traced_base
        if k in self._open:  # type: ignore[attr-defined]
            return base._shard(self, k)  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        shard = base._shard(self, k)  # type: ignore[attr-defined]
        self._fetch_s = getattr(self, "_fetch_s", 0.0) + time.perf_counter() - t0
        return shard

    def collate_into(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> dict[str, float]:
        self._fetch_s = 0.0
        t0 = time.perf_counter()
        stats = dict(self._traced_base.collate_into(self, ids, out))
        t1 = time.perf_counter()
        if "fetch" not in stats:  # the dataset does not split shard opening out of `read` itself
            stats["read"] = max(0.0, stats.get("read", 0.0) - self._fetch_s)
            stats["fetch"] = self._fetch_s
        line = (f"{os.getpid()} {_track_name()} {t0:.9f} {t1:.9f} {len(ids)} "
                + " ".join(f"{stats.get(k, 0.0):.9f}" for k in FIELDS) + "\n")
        fd = getattr(self, "_stage_fd", None)
        if fd is None or fd[0] != os.getpid():
            path = os.path.join(self._stage_dir, f"stages-{os.getpid()}.txt")
            fd = self._stage_fd = (os.getpid(), os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644))
        os.write(fd[1], line.encode())
        return stats

    def __getstate__(self) -> dict[str, Any]:
        state = self._traced_base.__getstate__(self)
        state.pop("_stage_fd", None)
        return state

    def __reduce__(self) -> Any:
        return _rebuild, (self._traced_base, self.__getstate__())


def _track_name() -> str:
    name = multiprocessing.current_process().name  # the loader names its workers dataflow-loader-<w>
    if name.startswith("dataflow-loader-"):
        return "worker-" + name.rsplit("-", 1)[1]
    return "main:" + threading.current_thread().name.replace(" ", "_")


def _recording_class(base: type) -> type:
    cls = _CLASSES.get(base)
    if cls is None:
        methods = {k: v for k, v in vars(_Recording).items() if callable(v)}
        cls = _CLASSES[base] = type(base)(f"Recording{base.__name__}", (base,), {**methods, "_traced_base": base,
                                                                               "__module__": __name__})
    return cls


def _rebuild(base: type, state: dict[str, Any]) -> Any:
    obj = base.__new__(_recording_class(base))
    obj.__dict__.update(state)
    return obj


def record_stages(dataset: Any, folder: str) -> Any:
    """Make `dataset` record per-batch stage timestamps into `folder` (in place; returns it)."""
    base = getattr(type(dataset), "_traced_base", type(dataset))
    dataset.__class__ = _recording_class(base)
    dataset._stage_dir = folder
    return dataset


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
                                   "stages": {k: float(v) for k, v in zip(FIELDS, parts[5:])}})
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


class TimedUpstream:
    """Wraps the iterator a prefetcher pulls from, recording each `next()` as a `load` slice on its thread."""

    def __init__(self, batches: Iterable[Any], like: Any = None, limit: int = 100_000):
        self.batches = batches
        self.slices: list[tuple[str, float, float]] = []  # (thread name, start, end)
        self.limit = limit
        # what a DevicePrefetcher reads off a StreamingDataLoader (copy straight from its pinned ring)
        self.lifetime = getattr(like, "lifetime", None)
        self.num_workers = getattr(like, "num_workers", 0)

    def __iter__(self) -> Iterator[Any]:
        it = iter(self.batches)
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
