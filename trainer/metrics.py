"""Per-interval metrics: one console line and one JSONL record (optionally TensorBoard scalars).

MFU is reported only where the accelerator's dense bf16 peak is known; on CPU it is None.
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from typing import Any, TextIO

import torch

from dataflow.errors import ConfigError

# dense bf16 tensor-core peak FLOP/s per GPU, matched against torch.cuda.get_device_name()
PEAK_BF16_FLOPS = {"A100": 312e12, "H100": 989e12, "H200": 989e12, "B200": 2.25e15, "B300": 2.25e15}


def peak_flops(device: torch.device) -> float | None:
    """The device's dense bf16 peak FLOP/s, or None when unknown (CPU, unlisted GPUs)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    for key, flops in PEAK_BF16_FLOPS.items():
        if key in name:
            return flops
    return None


def peak_memory_gib(device: torch.device) -> tuple[str, float]:
    """('peak_mem_gib', CUDA max allocated) on GPU, ('peak_rss_gib', process max RSS) on CPU."""
    if device.type == "cuda":
        return "peak_mem_gib", torch.cuda.max_memory_allocated(device) / 2**30
    rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return "peak_rss_gib", rss_kib / 2**20


class MetricsLogger:
    """Writes what rank 0 sees; every other rank's logger is silent."""

    def __init__(self, jsonl: str, tensorboard: str, enabled: bool, stream: TextIO | None = None):
        self.enabled, self.stream = enabled, stream or sys.stdout  # the stdout of now, not of import time
        self.file = None
        self.tb = None
        if not enabled:
            return
        if jsonl:
            try:
                os.makedirs(os.path.dirname(os.path.abspath(jsonl)), exist_ok=True)
                self.file = open(jsonl, "a", buffering=1)
            except OSError as e:
                raise ConfigError(f"log.jsonl = {jsonl!r}: cannot write there ({e.strerror or e}); choose another "
                                  f"file") from None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                self.print(f"log.tensorboard = {tensorboard!r} ignored: tensorboard is not installed")
            else:
                self.tb = SummaryWriter(tensorboard)

    def print(self, line: str) -> None:
        if self.enabled:
            print(line, file=self.stream, flush=True)

    def record(self, rec: dict[str, Any]) -> None:
        """One JSONL record (non-finite floats become null so the file stays valid JSON)."""
        if not self.enabled:
            return
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
        if self.file:
            self.file.write(json.dumps(clean) + "\n")
        if self.tb:
            for k, v in clean.items():
                if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool):
                    self.tb.add_scalar(k, v, rec["step"])

    def train(self, rec: dict[str, Any], total_steps: int) -> None:
        """The console line and JSONL record of one log interval."""
        mem = next((f" | mem {rec[k]:.2f} GiB" for k in ("peak_mem_gib", "peak_rss_gib") if k in rec), "")
        mfu = f" | mfu {100 * rec['mfu']:.1f}%" if rec.get("mfu") is not None else ""
        skipped = f" | skipped {rec['skipped_steps']}" if rec.get("skipped_steps") else ""
        self.print(f"step {rec['step']:>6}/{total_steps} | loss {rec['loss']:.4f} | lr {rec['lr']:.2e} | "
                   f"gnorm {rec['grad_norm']:.3f} | {rec['tokens_per_s']:,.0f} tok/s | "
                   f"data wait {rec['data_wait_pct']:.1f}%{mfu}{mem} | {1e3 * rec['step_s']:.1f} ms/step{skipped}")
        self.record(rec)

    def event(self, step: int, kind: str, message: str, **extra: Any) -> None:
        """A notable event (skipped step, spike, rollback, checkpoint): console and JSONL."""
        self.print(f"step {step:>6}: {message}")
        self.record({"step": step, "event": kind, "message": message, "time": time.time(), **extra})

    def close(self) -> None:
        if self.file:
            self.file.close()
            self.file = None
        if self.tb:
            self.tb.close()
            self.tb = None


class Interval:
    """Accumulates one log interval's steps, tokens and losses."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.steps = 0
        self.tokens = 0
        self.loss_sum = 0.0
        self.loss_steps = 0

    def add(self, tokens: int, loss: float | None) -> None:
        self.steps += 1
        self.tokens += tokens
        if loss is not None:
            self.loss_sum += loss
            self.loss_steps += 1

    def mean_loss(self) -> float:
        return self.loss_sum / self.loss_steps if self.loss_steps else float("nan")

    def elapsed(self) -> float:
        return max(time.perf_counter() - self.start, 1e-9)
