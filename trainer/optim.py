"""AdamW with decoupled weight decay on matrices only, the LR schedule (continued across resumes), and global-norm
clipping."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any, Callable

import torch
from torch import nn

from trainer.config import TrainConfig


def build_optimizer(model: nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW; weight decay applies to matrices (embeddings, linear weights), not to norms. Fused on CUDA."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.dim() >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
                             fused=device.type == "cuda")


@dataclass(frozen=True)
class Schedule:
    """The learning rate of each optimizer step (1-based): linear warmup to `lr`, then `decay` from `start_lr` at
    `start_step` down to `min_lr` at `steps`.

    A run's decay starts at the warmup's end from `lr`. A run trained on from a checkpoint with another horizon
    (train.steps raised, or min_lr or decay changed) starts it at the resume step from the learning rate the
    checkpoint's run had there (`resumed`), so the rate goes on where it was instead of jumping to what a
    longer schedule would have had at that step. Checkpoints record the schedule (`record`)."""

    lr: float
    min_lr: float
    warmup_steps: int
    steps: int
    decay: str
    start_step: int
    start_lr: float

    @classmethod
    def of(cls, cfg: TrainConfig) -> "Schedule":
        """The schedule `cfg` describes, for a run from step 0."""
        return cls(cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.steps, cfg.decay, cfg.warmup_steps, cfg.lr)

    def at(self, step: int) -> float:
        if self.warmup_steps and step <= self.warmup_steps:
            return self.lr * step / self.warmup_steps
        if self.decay == "constant" or self.steps <= self.start_step:
            return self.start_lr
        progress = min(max(step - self.start_step, 0) / (self.steps - self.start_step), 1.0)
        if self.decay == "linear":
            factor = 1.0 - progress
        else:
            factor = 0.5 * (1.0 + math.cos(math.pi * progress))
        return self.min_lr + factor * (self.start_lr - self.min_lr)

    def record(self, step: int) -> dict[str, Any]:
        """What a checkpoint of `step` saves: the schedule, and its learning rate at that step."""
        return {**asdict(self), "step": step, "lr": self.at(max(step, 1)), "peak_lr": self.lr}

    @classmethod
    def saved(cls, state: dict[str, Any]) -> "Schedule | None":
        """The schedule a checkpoint's trainer state records; from its config for one saved before schedules
        were recorded; None when neither reads."""
        rec, train = state.get("scheduler") or {}, (state.get("config") or {}).get("train") or {}
        try:
            if "start_step" in rec:
                return cls(float(rec["peak_lr"]), float(rec["min_lr"]), int(rec["warmup_steps"]), int(rec["steps"]),
                           str(rec["decay"]), int(rec["start_step"]), float(rec["start_lr"]))
            return cls.of(TrainConfig(**{k: train[k] for k in ("lr", "min_lr", "warmup_steps", "steps", "decay")}))
        except (KeyError, TypeError, ValueError):
            return None

    def resumed(self, state: dict[str, Any], step: int, say: Callable[[str], None]) -> "Schedule":
        """This (the config's) schedule for a run resumed at `step` from a checkpoint's trainer `state`: the
        checkpoint's when nothing changed; continued from its learning rate at `step` when only the horizon
        did; else this one, and `say` tells the jump."""
        old = self.saved(state)
        if old is None or step >= self.steps:  # nothing to train, or a state that does not say its schedule
            return self
        keys = ("lr", "min_lr", "warmup_steps", "steps", "decay")
        changed = [k for k in keys if getattr(old, k) != getattr(self, k)]
        if not changed:
            return old
        what = ", ".join(f"train.{k} {getattr(old, k):g} -> {getattr(self, k):g}" if k != "decay" else
                         f"train.decay {old.decay} -> {self.decay}" for k in changed)
        if set(changed) <= {"steps", "min_lr", "decay"}:
            if step <= self.warmup_steps:
                say(f"schedule: {what} since the checkpoint: still in warmup, the decay after it follows them")
                return self
            new = replace(self, start_step=step, start_lr=old.at(step))
            say(f"schedule: {what} since the checkpoint: the learning rate goes on from {new.start_lr:.2e} at "
                f"step {step} and decays ({self.decay}) to {self.min_lr:.2e} at step {self.steps}")
            return new
        say(f"schedule: {what} since the checkpoint: the learning rate is {self.at(step + 1):.2e} at step "
            f"{step + 1}, where the checkpoint's schedule has {old.at(step + 1):.2e}")
        return self


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR of optimizer step `step` (1-based): linear warmup to lr, then decay to min_lr at `steps`."""
    return Schedule.of(cfg).at(step)


@torch.no_grad()
def clip_grad_norm(model: nn.Module, max_norm: float) -> torch.Tensor:
    """The global gradient norm (across ranks, also for FSDP2's sharded DTensor grads); clips when max_norm > 0."""
    params = [p for p in model.parameters() if p.grad is not None]
    if not params:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm([p.grad for p in params], 2.0)
    if hasattr(norm, "full_tensor"):  # DTensor: partial per-shard norms -> the full norm
        norm = norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
