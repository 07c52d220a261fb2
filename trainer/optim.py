"""AdamW with decoupled weight decay on matrices only, the LR schedule, and global-norm clipping."""

from __future__ import annotations

import math

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


def lr_at(step: int, cfg: TrainConfig) -> float:
    """LR of optimizer step `step` (1-based): linear warmup to lr, then decay to min_lr at `steps`."""
    if cfg.warmup_steps and step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    if cfg.decay == "constant" or cfg.steps <= cfg.warmup_steps:
        return cfg.lr
    progress = min((step - cfg.warmup_steps) / (cfg.steps - cfg.warmup_steps), 1.0)
    if cfg.decay == "linear":
        factor = 1.0 - progress
    else:
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + factor * (cfg.lr - cfg.min_lr)


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
