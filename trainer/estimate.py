"""Before the first step: will one step of this config fit this machine, and finish in reasonable time?

A config meant for a GPU node, run on a laptop (or `data.seq_len=100000` on a CPU), would otherwise compute
for hours without a word. The estimates are rough on purpose (a factor of two either way): they only have to
tell "fine" from "far out of reach".
"""

from __future__ import annotations

import time
from typing import Callable

import torch

from trainer.config import Config
from trainer.model import GPT

SLOW_STEP_S = 120.0  # a step estimated above this is worth a warning (real ones take seconds)


def measured_flops(device: torch.device) -> float:
    """Matmul FLOP/s this device reaches now (best of three 1024^3 products, after one warm-up)."""
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    a = torch.randn(1024, 1024, device=device, dtype=dtype)
    best = float("inf")
    for _ in range(4):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        a @ a
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * 1024**3 / max(best, 1e-9)


def step_memory_bytes(cfg: Config, gpt: GPT, world_size: int) -> int:
    """Weights, gradients and AdamW moments (fp32), plus one micro-batch's activations and logits."""
    c, B, T = cfg.model, cfg.data.batch_size, cfg.data.seq_len
    shards = world_size if cfg.train.parallel in ("fsdp", "hsdp") else 1
    states = 16 * gpt.num_params() // shards
    act_bytes = 2 if cfg.train.precision == "bf16" else 4
    activations = B * T * c.d_model * c.n_layer * 16 * act_bytes
    logits = 3 * B * T * gpt.padded_vocab * 4  # logits, their fp32 copy for the loss, the gradient
    attention = B * c.n_head * T * T * 4 * c.n_layer if cfg.data.doc_mask else 0  # a mask: no fused kernel
    return states + activations + logits + attention


def available_memory(device: torch.device) -> int | None:
    """Bytes free for this process: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def warn_if_out_of_reach(cfg: Config, device: torch.device, world_size: int, gpt: GPT, tokens_per_step: int,
                         say: Callable[[str], None]) -> None:
    """One warning line when a step is estimated far beyond this machine's time or memory."""
    flops = gpt.flops_per_token(cfg.data.seq_len) * tokens_per_step / world_size
    seconds = flops / measured_flops(device)
    need, have = step_memory_bytes(cfg, gpt, world_size), available_memory(device)
    problems = []
    if seconds > SLOW_STEP_S:
        problems.append(f"one step is about {flops / 1e12:,.0f} TFLOP, roughly {seconds / 60:,.0f} minutes on this "
                        f"{device.type}")
    if have is not None and need > have:
        problems.append(f"it needs roughly {need / 2**30:,.1f} GiB where {have / 2**30:,.1f} GiB are free")
    if problems:
        say(f"warning: {'; '.join(problems)}: lower data.seq_len ({cfg.data.seq_len}), data.batch_size "
            f"({cfg.data.batch_size}) or the model, or run on a larger machine (SIGTERM or Ctrl-C stops after "
            f"the current step, twice stops at once)")
