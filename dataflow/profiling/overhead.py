"""What the monitor costs per step: the same loop over ready batches with and without it (for tools/ and docs)."""

from __future__ import annotations

import time
from typing import Any

from dataflow.profiling.monitor import StarvationMonitor


def _loop(batches: list[Any], monitor: StarvationMonitor | None) -> float:
    t0 = time.perf_counter()
    if monitor is None:
        for batch in batches:
            if batch is None:
                raise AssertionError
    else:
        for batch in monitor.wrap(batches):
            with monitor.step():
                if batch is None:
                    raise AssertionError
    return time.perf_counter() - t0


def measure_overhead(steps: int = 20_000, repeats: int = 5) -> dict[str, Any]:
    """Microseconds the monitor adds per step (wrap + step + token count), best of `repeats`.

    Batches are ready dicts with an `input_ids` tensor, so only the monitor's own work is timed; a
    training step takes milliseconds, so the share is this figure over the step time.
    """
    import torch

    batch = {"input_ids": torch.zeros(8, 1024, dtype=torch.long)}
    batches = [batch] * steps
    bare = min(_loop(batches, None) for _ in range(repeats))
    monitored = min(_loop(batches, StarvationMonitor()) for _ in range(repeats))
    per_step_us = max(monitored - bare, 0.0) / steps * 1e6
    return {"steps": steps, "bare_us_per_step": bare / steps * 1e6, "monitored_us_per_step": monitored / steps * 1e6,
            "overhead_us_per_step": per_step_us,
            "share_of_100ms_step_pct": per_step_us / 1e5 * 100, "share_of_10ms_step_pct": per_step_us / 1e4 * 100}
