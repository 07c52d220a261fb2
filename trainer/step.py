"""One optimizer step: micro-batches forward and backward, the step's one host sync, and the optimizer.

One host sync per optimizer step (the all-reduced loss and the grad norm) decides whether the step is applied: a
non-finite loss or norm skips it on every rank at once. Every `train.batch_check_every` steps (and at the first)
the ranks of each tensor-parallel group also compare a hash of their batch: they must compute on the same one.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
import torch.distributed as dist

from dataflow.errors import TrainingAborted
from trainer.checkpoint import complete_checkpoints
from trainer.config import Config
from trainer.optim import clip_grad_norm
from trainer.parallelize import Dist, grad_sync, tensor_parallel_group, uses_fsdp
from trainer.signals import StopFlag

HASH_SEED = 0x5EED  # the fixed weights of the batch hash: equal batches give equal hashes on every rank


@dataclass
class StepResult:
    """One optimizer step as every rank agreed on it (after the step's one host sync)."""

    lr: float
    loss: float
    grad_norm: float
    finite: bool
    spike: bool
    rollback_to: str | None
    stop_votes: float


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world_size > 1:
        dist.all_reduce(t)
    return t


def autocast(cfg: Config, d: Dist, model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """bf16 autocast, except under FSDP2 whose MixedPrecisionPolicy already runs the blocks in bf16."""
    if cfg.train.precision == "bf16" and not uses_fsdp(model):
        return torch.autocast(d.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def batch_hash(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """An int64 hash of a batch's tensors (a weighted sum with fixed pseudo-random weights, on their device)."""
    total = torch.zeros((), dtype=torch.int64, device=batch["input_ids"].device)
    for key in sorted(batch):
        values = batch[key].reshape(-1).long()
        gen = torch.Generator().manual_seed(HASH_SEED + len(key))
        weights = torch.randint(1, 2**31 - 1, (values.numel(),), generator=gen, dtype=torch.int64)
        total += (values * weights.to(values.device)).sum()
    return total


def check_same_batch(batch: dict[str, torch.Tensor], group: "dist.ProcessGroup", step: int) -> None:
    """Every rank of `group` (a tensor-parallel group) must hold the same batch: a TrainingAborted naming the ranks
    whose batch differs from the group's first rank's, raised on every rank of the group alike."""
    mine = batch_hash(batch).reshape(1)
    size = dist.get_world_size(group)
    hashes = [torch.zeros_like(mine) for _ in range(size)]
    dist.all_gather(hashes, mine, group=group)
    ranks = dist.get_process_group_ranks(group)
    values = [int(h.item()) for h in hashes]
    odd = [r for r, v in zip(ranks, values) if v != values[0]]
    if odd:
        raise TrainingAborted(f"step {step}: tensor-parallel ranks {', '.join(map(str, ranks))} must compute on one "
                              f"batch, but rank(s) {', '.join(map(str, odd))} read another than rank {ranks[0]}: "
                              f"feed StreamingDataset the data-parallel coordinate (rank=, world_size= from "
                              f"dataflow.distributed.data_parallel_coordinates)")


def check_due(cfg: Config, step: int) -> bool:
    every = cfg.train.batch_check_every
    return every > 0 and (step == 1 or step % every == 0)


def train_step(run: Any, batches: Iterator[Any], mon: Any, stop: StopFlag) -> StepResult:
    """One optimizer step over the layout's micro-batches, applied unless it is non-finite or a rollback."""
    t, model, accum = run.cfg.train, run.model, run.grad_accum
    lr = run.schedule.at(run.step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=run.d.device)
    tp_group = tensor_parallel_group(run.d) if check_due(run.cfg, run.step) else None
    for micro in range(accum):
        batch = next(batches)
        last = micro == accum - 1
        if tp_group is not None and micro == 0:
            check_same_batch(batch, tp_group, run.step)
        with mon.step(), grad_sync(model, last):
            with autocast(run.cfg, run.d, model):
                loss = model(batch["input_ids"], batch["labels"], batch.get("position_ids"))
            if run.step == t.inject_nan_step:
                loss = loss * float("nan")
            # each micro-batch's mean loss is scaled so the accumulated gradient is the full batch's mean
            (loss / accum).backward()
            loss_sum += loss.detach().float()
            if last:
                result = apply_step(run, loss_sum, stop, lr)
    return result


@torch.no_grad()
def clip_grads(model: torch.nn.Module, max_norm: float, pipeline: Any = None) -> torch.Tensor:
    """The global gradient norm, clipped to `max_norm` (> 0), over every shard of every parameter.

    Under FSDP2 x tensor parallelism the gradients live on two meshes ((dp, tp) for split matrices, dp for the
    replicated norms) that one norm cannot mix: each mesh's norm is taken whole, then they combine. Under pipeline
    parallelism the stages' squares are summed, the tied matrix counted once (on the first stage)."""
    groups: dict[Any, list[torch.nn.Parameter]] = {}
    for p in model.parameters():
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p)
    if len(groups) <= 1 and pipeline is None:
        return clip_grad_norm(model, max_norm)
    duplicate = pipeline.tied if pipeline is not None and pipeline.last and not pipeline.first else None
    squares = [torch.zeros((), device=next(model.parameters()).device)]
    for params in groups.values():
        grads = [p.grad for p in params if p is not duplicate]
        if grads:
            norm = torch.nn.utils.get_total_norm(grads, 2.0)
            squares.append((norm.full_tensor() if hasattr(norm, "full_tensor") else norm).float() ** 2)
    total = torch.stack(squares).sum()
    if pipeline is not None:
        dist.all_reduce(total, group=pipeline.pp_group)
    total = total.sqrt()
    if max_norm > 0:
        for params in groups.values():
            torch.nn.utils.clip_grads_with_norm_(params, max_norm, total)
    return total


def sum_tied_gradient(tied: torch.nn.Parameter, group: "dist.ProcessGroup") -> None:
    """Sum the tied matrix's gradient over the first and last stage. Under tensor parallelism the embedding's own
    gradient comes out replicated while its weight is split by rows: it is laid out as the weight first (a local
    slice, no communication), so both stages add the same rows."""
    grad = tied.grad
    if hasattr(grad, "placements") and grad.placements != tied.placements:
        grad = tied.grad = grad.redistribute(tied.device_mesh, tied.placements)
    dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)


def pipeline_step(run: Any, batches: Iterator[Any], mon: Any, stop: StopFlag) -> StepResult:
    """One optimizer step of a pipeline stage: the layout's micro-batches through the schedule (the first stage
    feeds the inputs, the last the labels and gets the losses, a stage between reads nothing), then the tied
    matrix's gradient summed over the first and last stage, then the step's one host sync."""
    p, accum = run.pipeline, run.grad_accum
    lr = run.schedule.at(run.step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    micro = [next(batches) for _ in range(accum)] if p.first or p.last else []
    tp_group = tensor_parallel_group(run.d) if micro and check_due(run.cfg, run.step) else None
    if tp_group is not None:
        check_same_batch(micro[0], tp_group, run.step)
    losses: list[torch.Tensor] = []
    with mon.step():
        inputs = (torch.cat([b["input_ids"] for b in micro]),) if p.first else ()
        target = torch.cat([b["labels"] for b in micro]) if p.last else None
        p.schedule.step(*inputs, target=target, losses=losses if p.last else None)
    loss_sum = torch.stack([x.detach().float() for x in losses]).sum() if losses else \
        torch.zeros((), device=run.d.device)
    if p.tied_group is not None and p.tied is not None and p.tied.grad is not None:
        sum_tied_gradient(p.tied, p.tied_group)
    return apply_step(run, loss_sum, stop, lr)


def is_spike(loss: float, ema: float | None, factor: float) -> bool:
    """A loss above `factor` x its running average (`factor` 0: never)."""
    return factor > 0 and ema is not None and loss > factor * ema


def apply_step(run: Any, loss_sum: torch.Tensor, stop: StopFlag, lr: float) -> StepResult:
    """The one host sync of the step: global loss, grad norm and stop votes, equal on every rank; then
    the optimizer steps unless the step is non-finite or a spike to roll back from."""
    t, d = run.cfg.train, run.d
    grad_norm = clip_grads(run.model, t.clip, run.pipeline)
    stats = all_reduce_sum(torch.stack([loss_sum / run.grad_accum, torch.tensor(float(stop.set), device=d.device)]),
                           d)
    # every rank of a tensor-parallel group holds its group's loss (of the last pipeline stages, the others add 0):
    # the mean over those ranks is the global batch's
    loss, stop_votes = stats[0].item() / (d.layout.dp * d.layout.tp if d.world_size > 1 else 1), stats[1].item()
    gnorm = float(grad_norm)
    finite = math.isfinite(loss) and math.isfinite(gnorm)
    spike = finite and is_spike(loss, run.counters.loss_ema, t.spike_factor)
    target = rollback_target(run) if spike and t.spike_rollback else None
    if finite and target is None:
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return StepResult(lr, loss, gnorm, finite, spike, target, stop_votes)


def rollback_target(run: Any) -> str | None:
    """The newest checkpoint, unless a rollback to it already happened (then spikes are only logged)."""
    found = complete_checkpoints(run.ckpt.root) if run.ckpt else []
    return found[-1][1] if found and found[-1][1] != run.rolled_back_to else None
