"""Where the loader's time goes: stage figures of the pipeline a monitor wraps, through the contract only.

What the monitor is handed, if it keeps the `StageFigures` contract (contract.py: a `StreamingDataLoader`,
or a `DevicePrefetcher`, which lays its own figures over its upstream's), is polled for one
`StageSnapshot` after every batch; nothing is looked up by attribute name. The prefetcher's timed copy
(`h2d_s`, from CUDA events) is the `h2d` stage. The loader's totals may restart with each worker pool
(each epoch unless `persistent_workers`), so `StageProbe` carries what a restart would drop.
"""

from __future__ import annotations

from typing import Any, Iterable

from dataflow.loading.contract import StageFigures, StageSnapshot
from dataflow.loading.stages import DESCRIPTIONS as LOADER_DESCRIPTIONS
from dataflow.loading.stages import STAGES as LOADER_STAGES
from dataflow.loading.stages import add_seconds

STAGES = (*LOADER_STAGES, "h2d")  # the loader's stages, then the prefetcher's copy
DESCRIPTIONS = {**LOADER_DESCRIPTIONS, "h2d": "host-to-device copy"}


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


def _flat_by_worker(by_worker: dict[str, dict[str, float]]) -> dict[str, float]:
    return {f"{w}/{k}": float(v) for w, stages in by_worker.items() for k, v in stages.items()}


class StageProbe:
    """Stage seconds of a pipeline (`StageFigures` parts, the outermost first) since the probe was created."""

    def __init__(self, *parts: StageFigures):
        self.parts = parts
        self._stages, self._workers, self._transfer = _Totals(), _Totals(), _Totals()
        self.last = StageSnapshot()
        self.observe()

    def snapshot(self) -> StageSnapshot:
        """The parts' figures now, each laid over the ones after it."""
        snap = StageSnapshot()
        for part in reversed(self.parts):
            snap = part.stage_figures().over(snap)
        return snap

    @property
    def device(self) -> str | None:
        """Where the batches arrive, when a prefetcher among the parts says so."""
        return self.last.device

    def observe(self) -> None:
        """Poll the figures (cheap: a few dict entries); called after each batch."""
        self.last = snap = self.snapshot()
        self._stages.observe(dict(snap.stages))
        self._workers.observe(_flat_by_worker(snap.by_worker))
        self._transfer.observe(dict(snap.transfer))

    def totals(self) -> dict[str, float]:
        """Running stage seconds since the probe was made (across worker-pool restarts), the h2d copy too."""
        out = self._stages.since_start()
        moved = self._transfer.since_start()
        if "h2d_s" in moved:
            out["h2d"] = moved["h2d_s"]
        return out

    def summary(self, batches: int) -> dict[str, Any]:
        """Seconds and ms per batch for each stage, which stage dominates, and per-worker figures."""
        seconds = {k: v for k, v in self._stages.since_start().items() if v > 0 or k in STAGES}
        moved = self._transfer.since_start()
        if "h2d_s" in moved:
            seconds["h2d"] = moved["h2d_s"]
        per_worker: dict[str, dict[str, float]] = {}
        for key, v in self._workers.since_start().items():
            w, _, stage = key.partition("/")
            per_worker.setdefault(w, {})[stage] = v
        names = self.last.sources
        return breakdown(seconds, batches, per_worker or None, sources={
            "loader": names.get("loader"), "prefetcher": names.get("prefetcher"),
            "prefetch_wait_s": moved.get("wait_s"), "prefetch_upstream_s": moved.get("upstream_s")})


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
