"""`StarvationMonitor`: how long the training loop waited for data, measured from inside it.

    mon = StarvationMonitor()
    for batch in mon.wrap(loader):
        with mon.step():
            train_step(batch)
    print(mon.summary())

The wait of a step is the host time blocked in `next()` on the batch iterator; the step time is the
time inside `step()`. Both are kept per step in bounded arrays, cheap enough to leave on.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Any, Iterable, Iterator

import numpy as np

INPUT_BOUND_PCT = 10.0  # data wait above this share of wall time: input-bound
BALANCED_PCT = 1.0  # below this: compute-bound


class StarvationMonitor:
    def __init__(self, history: int = 100_000):
        self.waits: deque[float] = deque(maxlen=history)
        self.steps: deque[float] = deque(maxlen=history)
        self.total_wait = 0.0
        self.total_step = 0.0
        self.count = 0
        self._start: float | None = None
        self._end: float | None = None
        self._window: tuple[float, float] | None = None  # (time, total_wait) at the last reset_window

    def wrap(self, batches: Iterable[Any]) -> Iterator[Any]:
        """Yield the batches of `batches`, timing how long each `next()` blocks."""
        it = iter(batches)
        if self._start is None:
            self._start = time.perf_counter()
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self._end = time.perf_counter()
                return
            wait = time.perf_counter() - t0
            self.waits.append(wait)
            self.total_wait += wait
            self._end = time.perf_counter()
            yield batch

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Time one training step (the consumer's compute)."""
        if self._start is None:
            self._start = time.perf_counter()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.steps.append(dt)
            self.total_step += dt
            self.count += 1
            self._end = time.perf_counter()

    def reset_window(self) -> tuple[float, float]:
        """(wait seconds, wall seconds) since the last call: for per-interval data-wait %."""
        now = time.perf_counter()
        last = self._window or (now if self._start is None else self._start, 0.0)
        wait = self.total_wait - last[1]
        self._window = (now, self.total_wait)
        return wait, now - last[0]

    def summary(self) -> dict[str, Any]:
        wall = (self._end or time.perf_counter()) - (self._start or time.perf_counter())
        waits = np.fromiter(self.waits, dtype=np.float64) if self.waits else np.zeros(1)
        pct = 100.0 * self.total_wait / wall if wall > 0 else 0.0
        verdict = "input-bound" if pct > INPUT_BOUND_PCT else "balanced" if pct > BALANCED_PCT else "compute-bound"
        return {
            "steps": self.count,
            "wall_s": wall,
            "data_wait_s": self.total_wait,
            "data_wait_pct": pct,
            "step_s": self.total_step / max(self.count, 1),
            "wait_p50_ms": 1e3 * float(np.percentile(waits, 50)),
            "wait_p90_ms": 1e3 * float(np.percentile(waits, 90)),
            "wait_p99_ms": 1e3 * float(np.percentile(waits, 99)),
            "verdict": verdict,
            "verdict_rule": f"input-bound above {INPUT_BOUND_PCT:g}% data wait, compute-bound below "
                            f"{BALANCED_PCT:g}%, balanced between",
        }

    def format_summary(self) -> str:
        s = self.summary()
        return (f"starvation: {s['steps']} steps in {s['wall_s']:.2f} s; data wait {s['data_wait_s']:.3f} s "
                f"= {s['data_wait_pct']:.1f}% of wall time (p50 {s['wait_p50_ms']:.2f} ms, p99 "
                f"{s['wait_p99_ms']:.2f} ms per batch); step {1e3 * s['step_s']:.1f} ms; verdict: {s['verdict']} "
                f"({s['verdict_rule']})")
