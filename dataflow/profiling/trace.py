"""Chrome trace / Perfetto JSON of a profiled run: open it in chrome://tracing or ui.perfetto.dev.

Tracks: the consumer (main thread: `wait` and `step` slices), the prefetch thread (`load`: its
`next()` on the loader), and one per loader worker (a `batch` slice holding `shuffle`, `fetch`,
`read` and `collate`, laid out in the order `StreamingDataset.fill` runs them). Times are microseconds from the
start of the run.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from dataflow.errors import ConfigError
from dataflow.loading.stages import STAGES

CONSUMER_TID, PREFETCH_TID = 1, 2


def _meta(pid: int, tid: int, kind: str, name: str) -> dict[str, Any]:
    return {"name": kind, "ph": "M", "pid": pid, "tid": tid, "ts": 0, "args": {"name": name}}


def _slice(name: str, pid: int, tid: int, t: float, dur: float, origin: float, **args: Any) -> dict[str, Any]:
    ev = {"name": name, "cat": "dataflow", "ph": "X", "pid": pid, "tid": tid,
          "ts": round((t - origin) * 1e6, 3), "dur": round(max(dur, 0.0) * 1e6, 3)}
    if args:
        ev["args"] = args
    return ev


def build_trace(timeline: dict[str, np.ndarray], stage_events: list[dict[str, Any]] | None = None,
                upstream_slices: list[tuple[str, float, float]] | None = None,
                meta: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace dict from a monitor's `timeline()`, recorded stage events and prefetch-thread slices."""
    pid = os.getpid()
    starts = [timeline["wait_start"][:1], timeline["step_start"][:1]]
    starts += [np.array([e["t0"] for e in (stage_events or [])[:1]])]
    starts += [np.array([s[1] for s in (upstream_slices or [])[:1]])]
    origin = float(min((float(a.min()) for a in starts if a.size), default=0.0))
    events: list[dict[str, Any]] = [_meta(pid, CONSUMER_TID, "process_name", "main process"),
                                    _meta(pid, CONSUMER_TID, "thread_name", "consumer (training loop)")]
    for i, (t, d) in enumerate(zip(timeline["wait_start"].tolist(), timeline["wait"].tolist())):
        events.append(_slice("wait", pid, CONSUMER_TID, t, d, origin, batch=i))
    for i, (t, d) in enumerate(zip(timeline["step_start"].tolist(), timeline["step"].tolist())):
        events.append(_slice("step", pid, CONSUMER_TID, t, d, origin, step=i))
    if upstream_slices:
        events.append(_meta(pid, PREFETCH_TID, "thread_name", "prefetch thread"))
        for i, (_, t0, t1) in enumerate(upstream_slices):
            events.append(_slice("load", pid, PREFETCH_TID, t0, t1 - t0, origin, batch=i))
    named: set[tuple[int, int]] = set()
    for e in stage_events or []:
        in_main = e["pid"] == pid
        tid = PREFETCH_TID if in_main else 1
        if (e["pid"], tid) not in named:
            named.add((e["pid"], tid))
            if not in_main:
                events.append(_meta(e["pid"], tid, "process_name", f"loader {e['track']} (pid {e['pid']})"))
            if not (in_main and upstream_slices):  # the prefetch thread is named already
                events.append(_meta(e["pid"], tid, "thread_name", e["track"]))
        events.append(_slice("batch", e["pid"], tid, e["t0"], e["t1"] - e["t0"], origin, rows=e["rows"]))
        t = e["t0"]
        for stage in STAGES:  # their order of work: locate, open, read, pack
            d = e["stages"].get(stage, 0.0)
            if d > 0:
                events.append(_slice(stage, e["pid"], tid, t, d, origin))
                t += d
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": dict(meta or {})}


def write_trace(path: str, trace: dict[str, Any]) -> str:
    """Write the trace JSON to `path`; a clear error when the folder does not exist."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--trace {path}: folder {folder} does not exist")
    with open(path, "w") as f:
        json.dump(trace, f, separators=(",", ":"))
    return path

