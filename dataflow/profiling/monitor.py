"""`StarvationMonitor`: is the training loop waiting for data, by how much, and where? Measured from inside it.

    mon = StarvationMonitor()
    for batch in mon.wrap(loader):          # a StreamingDataLoader, a DevicePrefetcher, any iterator
        with mon.step():
            train_step(batch)
    print(mon.format_summary())

The wait of a batch is the host time blocked in `next()`; on a GPU, plus the time the stream then sat
idle until the batch's copy was done (CUDA events, read back lazily). The step time is the time
inside `step()`, GPU time from CUDA events when the loop runs on CUDA. The main process's CPU time
inside `next()` (`time.process_time`) shows what loading takes from the training process even when
nobody waits. Wrapping a `StreamingDataLoader` or a `DevicePrefetcher` (anything that keeps the
`StageFigures` contract) adds the stage breakdown.
Everything is kept in bounded arrays; the cost is a few microseconds per step (`overhead.py`).
"""

from __future__ import annotations

import time
import warnings
from collections import deque
from types import TracebackType
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from dataflow.profiling import gpu
from dataflow.errors import ConfigError
from dataflow.loading.contract import StageFigures
from dataflow.profiling.breakdown import StageProbe

INPUT_BOUND_PCT = 10.0  # data wait above this share of wall time: input-bound
BALANCED_PCT = 1.0  # below this: compute-bound


def verdict(pct: float) -> str:
    """input-bound / balanced / compute-bound from the data-wait share of wall time."""
    return "input-bound" if pct > INPUT_BOUND_PCT else "balanced" if pct > BALANCED_PCT else "compute-bound"


VERDICT_RULE = (f"input-bound above {INPUT_BOUND_PCT:g}% data wait, compute-bound below {BALANCED_PCT:g}%, "
                f"balanced between")


class StarvationMonitor:
    """Times the batches a loop takes (`wrap`) and its steps (`step`); `summary()` says if it is input-bound.

    Args:
        history: per-step figures kept for percentiles, the trace and the plot (older ones drop out).
        device: "auto" (CUDA timing when the loop already uses CUDA), "cpu", or a CUDA device.
        nvml: sample GPU utilisation through NVML (`nvidia-ml-py`) while on CUDA.
        clock, cpu_clock: the wall clock and the process CPU clock, in seconds (default `time.perf_counter`
            and `time.process_time`); a test or a simulator may pass its own.
    """

    def __init__(self, history: int = 100_000, device: Any = "auto", nvml: bool = True,
                 clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.process_time):
        self.clock, self.cpu_clock = clock, cpu_clock
        self.waits: deque[float] = deque(maxlen=history)
        self.steps: deque[float] = deque(maxlen=history)
        self.fetch_cpu: deque[float] = deque(maxlen=history)
        self.wait_starts: deque[float] = deque(maxlen=history)
        self.step_starts: deque[float] = deque(maxlen=history)
        self.total_wait = 0.0
        self.total_step = 0.0
        self.total_fetch_cpu = 0.0
        self.count = 0
        self.batches = 0
        self.tokens = 0
        self._start: float | None = None
        self._end: float | None = None
        self._interval: tuple[float, float] | None = None  # (time, total wait) at the last reset_interval
        self._device, self._nvml_wanted = device, nvml
        self.cuda: gpu.CudaTimer | None = None
        self.nvml: gpu.NvmlSampler | None = None
        self.probe: StageProbe | None = None
        self._step = _Step(self)

    # --- measuring ------------------------------------------------------------------------------
    def attach(self, loader: StageFigures | None = None, prefetcher: StageFigures | None = None) -> None:
        """Name the loader/prefetcher whose stage figures to report when `wrap` is handed something else
        (e.g. a generator of your own); each must keep the `StageFigures` contract."""
        for role, part in (("loader", loader), ("prefetcher", prefetcher)):
            if part is not None and not isinstance(part, StageFigures):
                raise ConfigError(f"StarvationMonitor.attach: the {role} {type(part).__name__} has no stage_figures() "
                                  f"(the StageFigures contract); pass a StreamingDataLoader or DevicePrefetcher")
        self.probe = StageProbe(*(p for p in (prefetcher, loader) if p is not None))

    def _setup(self, batches: Any) -> None:
        if self._start is None:
            self._start = self.clock()
        if self.probe is None and isinstance(batches, StageFigures):
            self.probe = StageProbe(batches)
        if self.cuda is None and self._device != "cpu":
            auto = self.probe.device if self.probe is not None else None  # a prefetcher's device
            target = auto if self._device == "auto" else self._device
            if gpu.cuda_in_use(target):
                self.cuda = gpu.CudaTimer()
                if self._nvml_wanted and self.nvml is None:
                    self.nvml = gpu.NvmlSampler(gpu.nvml_index(target))

    def wrap(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Yield the batches of `batches`, timing how long each `next()` blocks."""
        self._setup(batches)
        it = iter(batches)
        perf, cpu, cuda, probe = self.clock, self.cpu_clock, self.cuda, self.probe
        while True:
            if cuda is not None:
                cuda.before_fetch()
            c0, t0 = cpu(), perf()
            try:
                batch = next(it)
            except StopIteration:
                self._end = perf()
                return
            t1 = perf()
            c1 = cpu()
            wait = t1 - t0
            self.waits.append(wait)
            self.wait_starts.append(t0)
            self.fetch_cpu.append(c1 - c0)
            self.total_wait += wait
            self.total_fetch_cpu += c1 - c0
            self.batches += 1
            if cuda is not None:
                cuda.after_fetch(wait)
            if probe is not None:
                probe.observe()
            if isinstance(batch, dict):
                ids = batch.get("input_ids")
                if ids is not None and hasattr(ids, "numel"):
                    self.tokens += ids.numel()
            self._end = t1
            yield batch

    def step(self) -> "_Step":
        """Time one training step (the consumer's compute): `with mon.step(): ...`."""
        return self._step

    def reset_interval(self) -> tuple[float, float]:
        """(wait seconds, wall seconds) since the last call: for per-interval data-wait %."""
        now = self.clock()
        total = self.total_wait + (self.cuda.copy_wait_total if self.cuda is not None else 0.0)
        last = self._interval or (now if self._start is None else self._start, 0.0)
        self._interval = (now, total)
        return total - last[1], now - last[0]

    def reset_window(self) -> tuple[float, float]:
        """Deprecated name of `reset_interval` ("window" is the shuffle window's word)."""
        warnings.warn("StarvationMonitor.reset_window() is deprecated: call reset_interval()", DeprecationWarning,
                      stacklevel=2)
        return self.reset_interval()

    def close(self) -> None:
        """Stop NVML sampling (the figures stay readable)."""
        if self.nvml is not None:
            self.nvml.stop()

    # --- reporting ------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Steps, wall time, data wait (s, % of wall, p50/p90/p99), step time, throughput, fetch CPU,
        verdict with its rule, GPU figures (or why absent) and the stage breakdown."""
        if self.cuda is not None:
            self.cuda.poll(wait=True)
        now = self.clock()
        wall = (now if self._end is None else self._end) - (now if self._start is None else self._start)
        copy_wait = self.cuda.copy_wait_total if self.cuda is not None else 0.0
        data_wait = self.total_wait + copy_wait
        waits = np.fromiter(self.waits, dtype=np.float64) if self.waits else np.zeros(1)
        if self.cuda is not None and len(self.cuda.gap_s) == len(self.waits):
            waits = np.maximum(waits, np.fromiter(self.cuda.gap_s, dtype=np.float64))
        pct = 100.0 * data_wait / wall if wall > 0 else 0.0
        p50, p90, p99 = (1e3 * float(v) for v in np.percentile(waits, [50, 90, 99]))
        host_step = self.total_step / max(self.count, 1)
        gpu_step = self.cuda.step_total / self.cuda.steps if self.cuda is not None and self.cuda.steps else None
        out = {
            "steps": self.count,
            "batches": self.batches,
            "wall_s": wall,
            "data_wait_s": data_wait,
            "data_wait_pct": pct,
            "host_wait_s": self.total_wait,
            "copy_wait_s": copy_wait if self.cuda is not None else None,
            "step_s": gpu_step if gpu_step is not None else host_step,
            "step_host_s": host_step,
            "step_timing": "cuda events (GPU time)" if gpu_step is not None else "host clock",
            "wait_p50_ms": p50, "wait_p90_ms": p90, "wait_p99_ms": p99,
            "batches_per_s": self.batches / wall if wall > 0 else 0.0,
            "tokens": self.tokens,
            "tokens_per_s": self.tokens / wall if wall > 0 and self.tokens else None,
            "fetch_cpu_s": self.total_fetch_cpu,
            "fetch_cpu_ms_per_batch": 1e3 * self.total_fetch_cpu / max(self.batches, 1),
            "verdict": verdict(pct),
            "verdict_rule": VERDICT_RULE,
            "gpu": self._gpu_summary(),
            "stages": self.probe.summary(self.batches) if self.probe is not None else None,
        }
        return out

    def _gpu_summary(self) -> dict[str, Any]:
        if self.cuda is None:
            return gpu.gpu_absent("no CUDA device in use by this loop")
        if self.nvml is None:
            return gpu.gpu_absent("NVML sampling is off")
        return self.nvml.summary()

    def timeline(self) -> dict[str, np.ndarray]:
        """Per-step start times (s, the monitor's clock) and durations of waits and steps, for trace and plot."""
        def arr(d: deque) -> np.ndarray:
            return np.fromiter(d, dtype=np.float64, count=len(d))
        return {"wait_start": arr(self.wait_starts), "wait": arr(self.waits), "step_start": arr(self.step_starts),
                "step": arr(self.steps), "fetch_cpu": arr(self.fetch_cpu), "origin": np.array([self._start or 0.0])}

    def format_summary(self) -> str:
        s = self.summary()
        if s["steps"] == 0 and s["batches"] == 0:
            return "starvation: no steps measured (nothing to judge)"
        tput = f"{s['batches_per_s']:.1f} batches/s" + (f", {s['tokens_per_s']:,.0f} tokens/s" if s["tokens_per_s"]
                                                         else "")
        return (f"starvation: {s['steps']} steps in {s['wall_s']:.2f} s; data wait {s['data_wait_s']:.3f} s "
                f"= {s['data_wait_pct']:.1f}% of wall time (p50 {s['wait_p50_ms']:.2f} ms, p90 "
                f"{s['wait_p90_ms']:.2f} ms, p99 {s['wait_p99_ms']:.2f} ms per batch); step "
                f"{1e3 * s['step_s']:.1f} ms; {tput}; fetch CPU {s['fetch_cpu_ms_per_batch']:.2f} ms/batch; "
                f"verdict: {s['verdict']} ({s['verdict_rule']})")

    def __str__(self) -> str:
        """The one-line summary (`print(monitor)`); `summary()` is the dict."""
        return self.format_summary()


class _Step:
    """The reusable context manager `step()` returns (cheaper than a generator-based one)."""

    __slots__ = ("mon", "t0")

    def __init__(self, mon: StarvationMonitor):
        self.mon, self.t0 = mon, 0.0

    def __enter__(self) -> None:
        mon = self.mon
        if mon._start is None:
            mon._start = mon.clock()
        if mon.cuda is not None:
            mon.cuda.step_start()
        self.t0 = mon.clock()

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        mon = self.mon
        if mon.cuda is not None:
            mon.cuda.step_end()
        t1 = mon.clock()
        dt = t1 - self.t0
        mon.steps.append(dt)
        mon.step_starts.append(self.t0)
        mon.total_step += dt
        mon.count += 1
        mon._end = t1
