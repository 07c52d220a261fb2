"""GPU-side measurements for the monitor: CUDA-event step and copy-wait timing, NVML utilisation sampling.

Both are optional and never synchronise the training step: CUDA events are recorded on the current
stream and read back lazily once they have completed; NVML is sampled from a daemon thread. On a
machine without CUDA (or without `nvidia-ml-py`) they report why they are absent instead of zeros.
"""

from __future__ import annotations

import os
import sys
import threading
from collections import deque
from typing import Any

MAX_PENDING = 256  # unresolved event pairs before the oldest is waited for (bounds memory, rarely hit)


def cuda_in_use(device: Any = None) -> bool:
    """True when the training loop already uses CUDA; never imports torch nor creates a CUDA context."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    if device is not None:
        return str(getattr(device, "type", device)).startswith("cuda")
    try:
        return bool(torch.cuda.is_available() and torch.cuda.is_initialized())
    except Exception:
        return False


class CudaTimer:
    """Per-step GPU time and per-batch copy wait from CUDA events, resolved without synchronising.

    `before_fetch()`/`after_fetch()` bracket `next()`: the events complete when the stream finished
    the previous step and when the batch's copy was done, so their distance is how long the GPU sat
    idle for this batch. `step_start()`/`step_end()` bracket the step: GPU execution time, not launch.
    """

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self._free: list[Any] = []
        self._pending: deque[tuple[str, Any, Any, float]] = deque()
        self.gap_s: deque[float] = deque(maxlen=100_000)
        self.step_s: deque[float] = deque(maxlen=100_000)
        self.copy_wait_total = 0.0
        self.step_total = 0.0
        self.steps = 0
        self.warmup = 0  # the first this many batches and steps are also summed apart (the monitor's warm-up)
        self.gaps = 0
        self.warmup_copy_wait = 0.0
        self.warmup_step_total = 0.0
        self._fetch0: Any = None
        self._step0: Any = None

    def _event(self) -> Any:
        ev = self._free.pop() if self._free else self._torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def before_fetch(self) -> None:
        self._fetch0 = self._event()

    def after_fetch(self, host_wait: float) -> None:
        if self._fetch0 is not None:
            self._pending.append(("gap", self._fetch0, self._event(), host_wait))
            self._fetch0 = None

    def step_start(self) -> None:
        self._step0 = self._event()

    def step_end(self) -> None:
        if self._step0 is not None:
            self._pending.append(("step", self._step0, self._event(), 0.0))
            self._step0 = None
        self.poll()

    def poll(self, wait: bool = False) -> None:
        """Read back every completed pair, oldest first; `wait` synchronises on the rest."""
        while self._pending:
            kind, a, b, host_wait = self._pending[0]
            if not (wait or len(self._pending) > MAX_PENDING or b.query()):
                return
            b.synchronize()
            self._pending.popleft()
            dt = a.elapsed_time(b) / 1e3
            if kind == "gap":  # pairs resolve in order: the first `warmup` gaps are the warm-up batches'
                idle = max(0.0, dt - host_wait)  # GPU idle beyond the host's own wait
                self.gap_s.append(dt)
                self.copy_wait_total += idle
                self.warmup_copy_wait += idle if self.gaps < self.warmup else 0.0
                self.gaps += 1
            else:
                self.step_s.append(dt)
                self.step_total += dt
                self.warmup_step_total += dt if self.steps < self.warmup else 0.0
                self.steps += 1
            self._free += [a, b]


class NvmlSampler:
    """GPU utilisation (%) and memory sampled every `interval` s by a daemon thread through NVML."""

    def __init__(self, device_index: int = 0, interval: float = 0.1):
        self.samples: deque[tuple[float, float]] = deque(maxlen=100_000)  # (util %, memory used GiB)
        self.reason = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml  # from the optional `nvidia-ml-py`

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self.name = pynvml.nvmlDeviceGetName(self._handle)
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
        except Exception as e:  # no driver, no device
            self.reason = f"NVML unavailable ({e})"
        if not self.reason:
            self._thread = threading.Thread(target=self._run, args=(interval,), name="dataflow-nvml", daemon=True)
            self._thread.start()

    def _run(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
                mem = self._nvml.nvmlDeviceGetMemoryInfo(self._handle)
                self.samples.append((float(util.gpu), mem.used / 2**30))
            except Exception as e:
                self.reason = f"NVML sampling failed ({e})"
                return

    def stop(self) -> None:
        self._stop.set()

    def summary(self) -> dict[str, Any]:
        if not self.samples:
            return {"available": False, "reason": self.reason or "no NVML sample taken yet"}
        util = sorted(u for u, _ in self.samples)
        return {"available": True, "device": str(self.name), "samples": len(util),
                "util_mean_pct": sum(util) / len(util), "util_p50_pct": util[len(util) // 2],
                "util_min_pct": util[0], "memory_used_gib": max(m for _, m in self.samples)}


def gpu_absent(reason: str) -> dict[str, Any]:
    """The GPU section of a report on a machine (or loop) without CUDA."""
    return {"available": False, "reason": reason}


def nvml_index(device: Any = None) -> int:
    """NVML's index of the CUDA device in use (NVML ignores CUDA_VISIBLE_DEVICES, CUDA does not)."""
    torch = sys.modules.get("torch")
    idx = getattr(device, "index", None)
    if idx is None and torch is not None:
        try:
            idx = torch.cuda.current_device()
        except Exception:
            idx = 0
    idx = int(idx or 0)
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if idx < len(visible) and visible[idx].isdigit():
        return int(visible[idx])
    return idx
