"""Where the loader's time goes: stage figures read from the loader and prefetcher upstream of a monitor.

Typed: a `StageFigures` (contract.py; a `StreamingDataLoader`: worker seconds per stage, summed over
workers, and `stage_seconds_by_worker`) or anything with `stats.wait_s` (a `DevicePrefetcher`; its
`copy_s`, host-to-device time from CUDA events, is the `h2d` stage), found along `upstream` links. The
loader's totals may restart with each worker pool (each epoch unless `persistent_workers`), so a
`StageProbe` polls them after every batch and carries what a restart would drop.
"""

from __future__ import annotations

from typing import Any, Iterable

from dataflow.loading.contract import StageFigures
from dataflow.loading.stages import DESCRIPTIONS as LOADER_DESCRIPTIONS
from dataflow.loading.stages import STAGES as LOADER_STAGES
from dataflow.loading.stages import add_seconds

STAGES = (*LOADER_STAGES, "h2d")  # the loader's stages, then the prefetcher's copy
DESCRIPTIONS = {**LOADER_DESCRIPTIONS, "h2d": "host-to-device copy"}
UPSTREAM = "upstream"  # the one attribute by which a wrapper (`DevicePrefetcher`) names what it wraps


def find_sources(batches: Any) -> tuple[Any, Any]:
    """(loader, prefetcher) among `batches` and what it wraps, following `upstream` only; a loader is a
    `StageFigures`, a prefetcher has `stats.wait_s`. Anything else is named with `StarvationMonitor.attach`."""
    loader = prefetcher = None
    obj, seen = batches, set()
    while obj is not None and id(obj) not in seen:
        seen.add(id(obj))
        if loader is None and isinstance(obj, StageFigures):
            loader = obj
        if prefetcher is None and hasattr(getattr(obj, "stats", None), "wait_s"):
            prefetcher = obj
        obj = getattr(obj, UPSTREAM, None)
    return loader, prefetcher


class _Totals:
    """A counter dict that may restart from zero (a new worker pool): keeps what came before."""

    def __init__(self) -> None:
        self.carried: dict[str, float] = {}
        self.last: dict[str, float] = {}
        self.base: dict[str, float] | None = None

    def observe(self, current: dict[str, float]) -> None:
        if any(current.get(k, 0.0) < v - 1e-12 for k, v in self.last.items()):
            for k, v in self.last.items():
                self.carried[k] = self.carried.get(k, 0.0) + v
        self.last = dict(current)
        if self.base is None:
            self.base = self.total()

    def total(self) -> dict[str, float]:
        keys = set(self.carried) | set(self.last)
        return {k: self.carried.get(k, 0.0) + self.last.get(k, 0.0) for k in keys}

    def since_start(self) -> dict[str, float]:
        base = self.base or {}
        return {k: v - base.get(k, 0.0) for k, v in self.total().items()}


def _flat_by_worker(by_worker: Any) -> dict[str, float]:
    if not by_worker:
        return {}
    items = by_worker.items() if isinstance(by_worker, dict) else enumerate(by_worker)
    return {f"{f'worker-{w}' if isinstance(w, int) else w}/{k}": float(v) for w, stages in items
            for k, v in stages.items()}


class StageProbe:
    """Stage seconds of a loader and prefetcher since the probe was created."""

    def __init__(self, loader: Any = None, prefetcher: Any = None):
        self.loader, self.prefetcher = loader, prefetcher
        self._stages, self._workers, self._prefetch = _Totals(), _Totals(), _Totals()
        self.observe()

    def observe(self) -> None:
        """Poll the upstream counters (cheap: a few dict entries); called after each batch."""
        if self.loader is not None:
            self._stages.observe(dict(self.loader.stage_seconds))
            self._workers.observe(_flat_by_worker(getattr(self.loader, "stage_seconds_by_worker", None)))
        if self.prefetcher is not None:
            s = self.prefetcher.stats
            fig = {"batches": float(s.batches), "wait_s": float(s.wait_s)}
            copy = getattr(s, "copy_s", getattr(s, "h2d_s", None))  # CUDA-event copy time, when timed
            if copy is not None and getattr(self.prefetcher, "_cuda", True):
                fig["h2d_s"] = float(copy)
            if getattr(s, "upstream_s", None) is not None:
                fig["upstream_s"] = float(s.upstream_s)
            self._prefetch.observe(fig)

    def summary(self, batches: int) -> dict[str, Any]:
        """Seconds and ms per batch for each stage, which stage dominates, and per-worker figures."""
        seconds = {k: v for k, v in self._stages.since_start().items() if v > 0 or k in STAGES}
        pf = self._prefetch.since_start()
        if "h2d_s" in pf:
            seconds["h2d"] = pf["h2d_s"]
        per_worker: dict[str, dict[str, float]] = {}
        for key, v in self._workers.since_start().items():
            w, _, stage = key.partition("/")
            per_worker.setdefault(w, {})[stage] = v
        return breakdown(seconds, batches, per_worker or None, sources={
            "loader": type(self.loader).__name__ if self.loader is not None else None,
            "prefetcher": type(self.prefetcher).__name__ if self.prefetcher is not None else None,
            "prefetch_wait_s": pf.get("wait_s"), "prefetch_upstream_s": pf.get("upstream_s")})


def breakdown(seconds: dict[str, float], batches: int, per_worker: dict[str, dict[str, float]] | None = None,
              sources: dict[str, Any] | None = None) -> dict[str, Any]:
    """The report's stage section from stage seconds (summed over workers) over `batches` batches."""
    order = [s for s in STAGES if s in seconds] + sorted(k for k in seconds if k not in STAGES)
    total = sum(seconds.values())
    rows = [{"stage": k, "what": DESCRIPTIONS.get(k, k), "seconds": seconds[k],
             "ms_per_batch": 1e3 * seconds[k] / batches if batches else 0.0,
             "share_pct": 100.0 * seconds[k] / total if total > 0 else 0.0} for k in order]
    dominant = max(rows, key=lambda r: r["seconds"])["stage"] if rows and total > 0 else None
    return {"stages": rows, "total_s": total, "dominant": dominant, "per_worker": per_worker,
            "recorded": bool(rows) and total > 0, **({"sources": sources} if sources else {})}


def merge_seconds(parts: Iterable[dict[str, float]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for p in parts:
        add_seconds(out, p)
    return out
