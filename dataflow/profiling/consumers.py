"""What `dataflow profile` runs as the training step: nothing (capacity), a sleep, or the trainer's model step.

The model step (`--config TRAINER.toml`) builds the bundled trainer's `GPT` from the config's
[model] section and runs forward, backward and an AdamW step on each batch, single process, so the
loader is measured against the compute it will really have to keep up with.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Any, Callable

from dataflow.errors import ConfigError


@dataclass
class Consumer:
    """A step function over a batch, and how to describe it in the report."""

    step: Callable[[Any], None]
    description: str
    step_ms: float | None  # the nominal step time, when known in advance


def idle() -> Consumer:
    return Consumer(lambda batch: None, "no consumer", 0.0)


def sleeper(step_ms: float) -> Consumer:
    """A consumer busy `step_ms` per step (a sleep: it holds no CPU, like a step waiting on its GPU)."""
    if step_ms < 0:
        raise ConfigError(f"--step-ms must be >= 0, got {step_ms:g}")
    seconds = step_ms / 1e3
    return Consumer(lambda batch: time.sleep(seconds) if seconds else None, f"{step_ms:g} ms sleep per step",
                    step_ms)


def load_trainer_config(path: str) -> Any:
    """The trainer's config at `path` (data.path may stay empty: the profile names its dataset)."""
    try:
        from trainer.config import load_config
        from trainer.model import GPT  # noqa: F401  (checked here so the error names the trainer)
    except ImportError as e:
        raise ConfigError(f"--config needs the bundled trainer package (trainer.config.load_config, "
                          f"trainer.model.GPT), which does not import here: {e}") from None
    return load_config(path, check=False)


def model_step(cfg: Any, vocab_size: int, seq_len: int, device: str) -> Consumer:
    """Forward, backward and optimizer step of the trainer's GPT (the config's [model]) on `device`."""
    import torch
    from trainer.model import GPT

    dev = torch.device(device)
    model = GPT(cfg.model, vocab_size, seq_len).to(dev)
    if hasattr(model, "init_weights"):
        model.init_weights(cfg.train.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    bf16 = cfg.train.precision == "bf16" and (dev.type == "cuda" or dev.type == "cpu")
    amp = (lambda: torch.autocast(dev.type, dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext

    def step(batch: Any) -> None:
        with amp():
            loss = model(batch["input_ids"].to(dev, non_blocking=True), batch["labels"].to(dev, non_blocking=True),
                         batch["position_ids"].to(dev) if "position_ids" in batch else None)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    params = sum(p.numel() for p in model.parameters())
    c = cfg.model
    return Consumer(step, f"trainer GPT step ({c.n_layer} layers, d_model {c.d_model}, {params / 1e6:.1f} M "
                          f"params, {cfg.train.precision}, {dev})", None)
