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

The first `warmup_steps` batches (default 5) and their steps are the warm-up: worker start-up, the first
shards fetched and decoded, queues filling, a first step that compiles. Their cost is paid once, however
long the run, so a fixed count (not a share of the run, whose end nobody knows while it runs, and which would
hide a long run's early starvation) marks it. `summary()` gives the whole run's figures (the contract's
`steps`, `wall_s`, `data_wait_s`, `data_wait_pct`, `step_s`), the `warmup`'s and the `steady` state's apart,
and judges the steady state.
Everything is kept in bounded arrays; the cost is a few microseconds per step (`overhead.py`).
"""

from __future__ import annotations

import os
import time
import warnings
from collections import deque
from dataclasses import dataclass
from itertools import islice
from types import TracebackType
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from dataflow.profiling import gpu
from dataflow.errors import ConfigError
from dataflow.loading.contract import StageFigures
from dataflow.profiling.breakdown import StageProbe
from dataflow.profiling.fleet_log import EVERY_S, RankLog

INPUT_BOUND_PCT = 10.0  # data wait above this share of wall time: input-bound
BALANCED_PCT = 1.0  # below this: compute-bound
WARMUP_STEPS = 5  # default: the first batches and steps reported apart, not judged


def verdict(pct: float) -> str:
    """input-bound / balanced / compute-bound from the data-wait share of wall time."""
    return "input-bound" if pct > INPUT_BOUND_PCT else "balanced" if pct > BALANCED_PCT else "compute-bound"


VERDICT_RULE = (f"input-bound above {INPUT_BOUND_PCT:g}% data wait, compute-bound below {BALANCED_PCT:g}%, "
                f"balanced between")


def judged(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures a summary's verdict judges: its `steady` state when it has one, else the whole run."""
    return summary.get("steady") or summary


@dataclass(frozen=True)
class _WarmupEnd:
    """The monitor's running totals at one moment: where the warm-up ends."""

    at: float
    wait: float
    step: float
    steps: int
    batches: int
    tokens: int


class StarvationMonitor:
    """Times the batches a loop takes (`wrap`) and its steps (`step`); `summary()` says if it is input-bound.

    Args:
        history: per-step figures kept for percentiles, the trace and the plot (older ones drop out).
        device: "auto" (CUDA timing when the loop already uses CUDA), "cpu", or a CUDA device.
        nvml: sample GPU utilisation through NVML (`nvidia-ml-py`) while on CUDA.
        clock, cpu_clock: the wall clock and the process CPU clock, in seconds (default `time.perf_counter`
            and `time.process_time`); a test or a simulator may pass its own.
        warmup_steps: the first batches (and their steps) reported as the warm-up, apart from the steady
            state the verdict judges (0: judge the whole run).
        run_dir: a folder: this rank (torch.distributed's, else $RANK, else 0) appends its figures every
            `log_every_s` seconds to `run_dir/rank-R.jsonl` (`fleet_log.py`); `dataflow profile --fleet
            run_dir` reads every rank's. None: nothing is written.
    """

    def __init__(self, history: int = 100_000, device: Any = "auto", nvml: bool = True,
                 clock: Callable[[], float] = time.perf_counter, cpu_clock: Callable[[], float] = time.process_time,
                 warmup_steps: int = WARMUP_STEPS, run_dir: str | os.PathLike | None = None,
                 log_every_s: float = EVERY_S):
        if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
            raise ConfigError(f"StarvationMonitor: warmup_steps must be an integer >= 0, got {warmup_steps!r}")
        self.warmup_steps = warmup_steps
        self._warm: _WarmupEnd | None = None  # the totals when the warm-up ended (None: not yet)
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
        self.fleet = None if run_dir is None else RankLog(run_dir, warmup_steps, log_every_s)

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
                self.cuda.warmup = self.warmup_steps
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
            if self._warm is None and self.batches == self.warmup_steps:  # asking for the first steady batch
                self._warm = _WarmupEnd(t0, self.total_wait, self.total_step, self.count, self.batches, self.tokens)
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

    def name_stragglers(self, k: float = 2.0) -> list[str]:
        """At a log interval, on every rank at the same step (a collective: one all-gather of a few numbers
        under torch.distributed): this rank's steady wait share and slowest stage, gathered; rank 0 gets a
        `STRAGGLER ...` line for each straggler (see `fleet.py`), logs it and returns them ([] elsewhere)."""
        import logging

        import torch.distributed as dist

        from dataflow.profiling.stragglers import straggler_line, stragglers_of

        mine = self.rank_figures()
        ranks = [mine]
        if dist.is_available() and dist.is_initialized():
            ranks = [None] * dist.get_world_size()
            dist.all_gather_object(ranks, mine)
            if dist.get_rank() != 0:
                return []
        by_rank = {r["rank"]: r for r in ranks}
        lines = [straggler_line(by_rank[s]) for s in stragglers_of(ranks, k)]
        for line in lines:
            logging.getLogger("dataflow.profiling").warning(line)
        return lines

    def rank_figures(self) -> dict[str, Any]:
        """This rank's `rank`, `host`, steady `wait_share` and `slowest_stage` (what the fleet view judges)."""
        import socket

        from dataflow.profiling.fleet_log import rank_world

        s = self.summary()
        return {"rank": rank_world()[0], "host": socket.gethostname(), "wait_share": judged(s)["data_wait_pct"] / 100,
                "steps": s["steps"], "slowest_stage": (s.get("stages") or {}).get("dominant")}

    def close(self) -> None:
        """Stop NVML sampling and write the last interval to `run_dir` (the figures stay readable)."""
        if self.nvml is not None:
            self.nvml.stop()
        if self.fleet is not None:
            self.fleet.record(self, self.clock())

    # --- reporting ------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """Steps, wall time, data wait (s, % of wall, p50/p90/p99), step time, throughput, fetch CPU over the
        whole run; the same figures for the `warmup` and the `steady` state (None while every step is warm-up);
        the verdict on the steady state with its rule, GPU figures (or why absent) and the stage breakdown."""
        if self.cuda is not None:
            self.cuda.poll(wait=True)
        now = self.clock()
        start, end = (now if self._start is None else self._start), (now if self._end is None else self._end)
        copy_wait = self.cuda.copy_wait_total if self.cuda is not None else 0.0
        host_step = self.total_step / max(self.count, 1)
        gpu_step = self.cuda.step_total / self.cuda.steps if self.cuda is not None and self.cuda.steps else None
        whole = _figures(self.count, self.batches, end - start, self.total_wait + copy_wait, self._waits(0),
                         self.tokens, gpu_step if gpu_step is not None else host_step, host_step)
        warmup, steady = self._phases(start, end, whole)
        basis = (f"steady state, after the first {self.warmup_steps} steps (warmup_steps)" if steady is not None
                 else f"whole run: all {self.count} steps are warm-up (warmup_steps={self.warmup_steps})")
        out = {
            **{k: whole[k] for k in ("steps", "batches", "wall_s", "data_wait_s", "data_wait_pct")},
            "host_wait_s": self.total_wait,
            "copy_wait_s": copy_wait if self.cuda is not None else None,
            "step_s": whole["step_s"],
            "step_host_s": host_step,
            "step_timing": "cuda events (GPU time)" if gpu_step is not None else "host clock",
            **{k: whole[k] for k in ("wait_p50_ms", "wait_p90_ms", "wait_p99_ms", "batches_per_s")},
            "tokens": self.tokens,
            "tokens_per_s": whole["tokens_per_s"],
            "fetch_cpu_s": self.total_fetch_cpu,
            "fetch_cpu_ms_per_batch": 1e3 * self.total_fetch_cpu / max(self.batches, 1),
            "warmup_steps": self.warmup_steps,
            "warmup": warmup,
            "steady": steady,
            "verdict": verdict((steady or whole)["data_wait_pct"]),
            "verdict_basis": basis,
            "verdict_rule": VERDICT_RULE,
            "gpu": self._gpu_summary(),
            "stages": self.probe.summary(self.batches) if self.probe is not None else None,
        }
        return out

    def _phases(self, start: float, end: float, whole: dict[str, Any]
                ) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The warm-up's figures and the steady state's (None before a batch past the warm-up)."""
        w = self._warm
        if w is None or self.batches <= w.batches:
            return whole, None
        cuda = self.cuda
        warm_copy = cuda.warmup_copy_wait if cuda is not None else 0.0
        warm_host_step = w.step / max(w.steps, 1)
        timed = min(cuda.steps, self.warmup_steps) if cuda is not None else 0  # warm-up steps timed on the GPU
        warm_gpu = cuda.warmup_step_total / timed if timed else None
        warmup = _figures(w.steps, w.batches, w.at - start, w.wait + warm_copy, self._waits(0, w.batches),
                          w.tokens, warm_gpu if warm_gpu is not None else warm_host_step, warm_host_step)
        steps = self.count - w.steps
        host_step = (self.total_step - w.step) / max(steps, 1)
        gpu_steps = cuda.steps - timed if cuda is not None else 0
        gpu_step = (cuda.step_total - cuda.warmup_step_total) / gpu_steps if gpu_steps else None
        steady = _figures(steps, self.batches - w.batches, end - w.at, whole["data_wait_s"] - warmup["data_wait_s"],
                          self._waits(w.batches), self.tokens - w.tokens,
                          gpu_step if gpu_step is not None else host_step, host_step)
        steady["verdict"] = verdict(steady["data_wait_pct"])
        return warmup, steady

    def _waits(self, first: int, stop: int | None = None) -> np.ndarray:
        """Per-batch waits (the GPU's idle gap where longer) of batches first..stop-1 still in the history."""
        dropped = self.batches - len(self.waits)  # the oldest batches, out of the bounded history
        lo, hi = max(first - dropped, 0), (None if stop is None else max(stop - dropped, 0))
        waits = np.fromiter(islice(self.waits, lo, hi), dtype=np.float64)
        if self.cuda is not None and len(self.cuda.gap_s) == len(self.waits):
            waits = np.maximum(waits, np.fromiter(islice(self.cuda.gap_s, lo, hi), dtype=np.float64))
        return waits

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
        w, st = s["warmup"], s["steady"]
        if st is None:
            phases = (f"warm-up only ({w['steps']} steps: no steady state after warmup_steps={s['warmup_steps']}); "
                      f"verdict: {s['verdict']} on the whole run")
        else:
            phases = (f"warm-up (first {w['steps']} steps) {w['wall_s']:.2f} s, data wait {w['data_wait_pct']:.1f}%; "
                      f"steady state ({st['steps']} steps) data wait {st['data_wait_pct']:.1f}% (p99 "
                      f"{st['wait_p99_ms']:.2f} ms), step {1e3 * st['step_s']:.1f} ms; verdict: {s['verdict']} on "
                      f"the steady state")
        return (f"starvation: {s['steps']} steps in {s['wall_s']:.2f} s; data wait {s['data_wait_s']:.3f} s "
                f"= {s['data_wait_pct']:.1f}% of wall time (p50 {s['wait_p50_ms']:.2f} ms, p90 "
                f"{s['wait_p90_ms']:.2f} ms, p99 {s['wait_p99_ms']:.2f} ms per batch); step "
                f"{1e3 * s['step_s']:.1f} ms; {tput}; fetch CPU {s['fetch_cpu_ms_per_batch']:.2f} ms/batch; "
                f"{phases} ({s['verdict_rule']})")

    def __str__(self) -> str:
        """The one-line summary (`print(monitor)`); `summary()` is the dict."""
        return self.format_summary()


def _figures(steps: int, batches: int, wall: float, wait: float, waits: np.ndarray, tokens: int, step_s: float,
             step_host_s: float) -> dict[str, Any]:
    """One stretch of the run: data wait (s, % of its wall time, per-batch percentiles), step, throughput."""
    wait = max(wait, 0.0)
    p50, p90, p99 = (1e3 * float(v) for v in np.percentile(waits if len(waits) else np.zeros(1), [50, 90, 99]))
    return {"steps": steps, "batches": batches, "wall_s": wall, "data_wait_s": wait,
            "data_wait_pct": 100.0 * wait / wall if wall > 0 else 0.0, "step_s": step_s, "step_host_s": step_host_s,
            "wait_p50_ms": p50, "wait_p90_ms": p90, "wait_p99_ms": p99,
            "batches_per_s": batches / wall if wall > 0 else 0.0,
            "tokens_per_s": tokens / wall if wall > 0 and tokens else None}


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
        if mon.fleet is not None and (t1 >= mon.fleet.next_t or mon.count == mon.warmup_steps):
            mon.fleet.record(mon, t1)  # an interval ends at the warm-up's end too: steady ones start there
