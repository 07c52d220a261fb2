"""The fleet's figures drawn: one Chrome trace with a track per rank, and a heat map of data wait by rank and time.

Both read the ranks' interval records (`fleet.read_intervals`): each interval is a slice of its rank's track
(its steps, wall, data wait and step time) and a point of the rank's `data wait %` counter; the heat map bins
the run's wall time and colours each rank's wait share in each bin.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dataflow.profiling.fleet import read_intervals

BINS = 100


def fleet_trace(run_dir: str) -> dict[str, Any]:
    """Chrome trace / Perfetto JSON: process `rank R on HOST`, one slice and one counter point per interval."""
    ranks = read_intervals(run_dir)
    starts = [i["t"] - i["wall_s"] for _, intervals in ranks for i in intervals]
    origin = min(starts) if starts else 0.0
    events: list[dict[str, Any]] = []
    for header, intervals in ranks:
        pid = header["rank"] + 1
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 1, "ts": 0,
                       "args": {"name": f"rank {header['rank']} on {header['host']}"}})
        for i in intervals:
            share = i["wait_s"] / i["wall_s"] if i["wall_s"] > 0 else 0.0
            start = round((i["t"] - i["wall_s"] - origin) * 1e6, 3)
            events.append({"name": f"steps {i['steps'][0]}-{i['steps'][1]}" + (" (warm-up)" if i["warmup"] else ""),
                           "cat": "fleet", "ph": "X", "pid": pid, "tid": 1, "ts": start,
                           "dur": round(i["wall_s"] * 1e6, 3),
                           "args": {"wait_s": i["wait_s"], "step_s": i["step_s"], "wait_pct": round(100 * share, 2)}})
            events.append({"name": "data wait %", "ph": "C", "pid": pid, "ts": start,
                           "args": {"wait": round(100 * share, 2)}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"run_dir": run_dir}}


def fleet_plot(run_dir: str, path: str) -> str:
    """A PNG heat map: data-wait share by rank (rows) and wall time (columns)."""
    from dataflow.profiling.plot import _pyplot

    plt = _pyplot()
    ranks = read_intervals(run_dir)
    ends = [i["t"] for _, intervals in ranks for i in intervals]
    t0 = min(i["t"] - i["wall_s"] for _, intervals in ranks for i in intervals) if ends else 0.0
    span = max(max(ends, default=t0) - t0, 1e-9)
    grid = np.full((len(ranks), BINS), np.nan)
    for row, (_, intervals) in enumerate(ranks):
        for i in intervals:
            col = min(int((i["t"] - t0) / span * BINS), BINS - 1)
            grid[row, col] = 100 * i["wait_s"] / i["wall_s"] if i["wall_s"] > 0 else 0.0
    fig, ax = plt.subplots(figsize=(10, 1.5 + 0.3 * len(ranks)))
    image = ax.imshow(grid, aspect="auto", cmap="magma_r", vmin=0, vmax=100, extent=(0, span, len(ranks) - 0.5, -0.5))
    ax.set_yticks(range(len(ranks)), [f"rank {h['rank']} ({h['host']})" for h, _ in ranks])
    ax.set_xlabel("seconds since the first interval")
    fig.colorbar(image, ax=ax, label="data wait, % of wall time")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
