"""The training loop, top to bottom: data, model, optimizer, resume, steps, checkpoints, summary.

One host sync per optimizer step (the all-reduced loss and the grad norm) decides whether the step is
applied: a non-finite loss or norm skips it on every rank at once.
"""

from __future__ import annotations

import contextlib
import math
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import numpy as np
import torch
import torch.distributed as dist

import dataflow
from dataflow.errors import ConfigError, TrainingAborted
from dataflow.units import count
from trainer.checkpoint import Checkpointer, complete_checkpoints
from trainer.config import Config
from trainer.estimate import warn_if_out_of_reach
from trainer.metrics import Interval, MetricsLogger, peak_flops, peak_memory_gib
from trainer.model import GPT
from trainer.optim import Schedule, build_optimizer, clip_grad_norm
from trainer.parallelize import Dist, grad_sync, init_distributed, parallelize, set_cpu_threads, uses_fsdp
from trainer.signals import StopFlag

EMA_BETA = 0.9  # running loss average for spike detection
SPIKE_PATIENCE = 20  # spikes in a row after which the loss is taken to have moved for good (new data, say)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_data(cfg: Config, d: Dist, **loader_options: Any) -> tuple[Any, Any, Any]:
    """Train dataset and loader (`loader_options` override StreamingDataLoader's), and the validation
    loader (or None)."""
    ds = dataflow.StreamingDataset(cfg.data.path, seq_len=cfg.data.seq_len, seed=cfg.train.seed,
                                   shuffle_window=cfg.data.shuffle_window, position_ids=cfg.data.doc_mask)
    if ds.num_samples // d.world_size < cfg.data.batch_size:
        raise ConfigError(f"{cfg.data.path} has {ds.num_samples} samples of {cfg.data.seq_len + 1} tokens: too few "
                          f"for data.batch_size = {cfg.data.batch_size} on {d.world_size} process(es)")
    # the product's path: workers fill page-locked slots that the prefetcher copies to the GPU directly;
    # cycle: epoch after epoch, so the loop counts steps, not epochs
    options = {"pin_memory": d.device.type == "cuda", "cycle": True, **loader_options}
    loader = dataflow.StreamingDataLoader(ds, batch_size=cfg.data.batch_size, num_workers=cfg.data.num_workers,
                                          **options)
    val_loader = None
    if cfg.data.val_path:
        val = dataflow.StreamingDataset(cfg.data.val_path, seq_len=cfg.data.seq_len, shuffle=False,
                                        seed=cfg.train.seed, position_ids=cfg.data.doc_mask)
        if val.vocab_size != ds.vocab_size:
            raise ConfigError(f"{cfg.data.val_path} was tokenized with a different vocabulary than {cfg.data.path}")
        val_loader = dataflow.StreamingDataLoader(val, batch_size=cfg.data.batch_size, num_workers=0)
        val_loader.start_state = val_loader.state_dict()
    return ds, loader, val_loader


def build_model(cfg: Config, d: Dist, vocab_size: int) -> tuple[torch.nn.Module, GPT]:
    """The parallel model and the GPT inside it. Sharded runs build on `meta` and materialise only shards."""
    with torch.device("meta"):
        gpt = GPT(cfg.model, vocab_size, cfg.data.seq_len)
    try:
        return _materialise(gpt, cfg, d)
    except (RuntimeError, MemoryError) as e:  # the allocator's own words: "can't allocate memory", CUDA OOM
        if not isinstance(e, MemoryError) and "alloc" not in str(e).lower() and "out of memory" not in str(e):
            raise
        raise ConfigError(f"the model ({gpt.num_params() / 1e6:,.0f}M parameters) does not fit in the memory of "
                          f"{d.device}; make it smaller (model.d_model, model.n_layer) or shard it "
                          f"(train.parallel = \"fsdp\" over more processes)") from None


def _materialise(gpt: GPT, cfg: Config, d: Dist) -> tuple[torch.nn.Module, GPT]:
    if d.world_size > 1 and cfg.train.parallel in ("fsdp", "hsdp"):
        model = parallelize(gpt, cfg, d)
        gpt.to_empty(device=d.device)
        gpt.tie_weights()
        gpt.init_weights(cfg.train.seed)
    else:
        gpt.to_empty(device=d.device)
        gpt.tie_weights()
        gpt.init_weights(cfg.train.seed)
        model = parallelize(gpt, cfg, d)
    return model, gpt


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world_size > 1:
        dist.all_reduce(t)
    return t


@torch.no_grad()
def evaluate(model: torch.nn.Module, val_loader: Any, cfg: Config, d: Dist) -> float | None:
    """Mean validation loss over the first `eval_batches` batches of the validation set (same every time)."""
    val_loader.load_state_dict(val_loader.start_state)
    n = min(cfg.train.eval_batches, len(val_loader))
    if n == 0:
        return None
    model.eval()
    total = torch.zeros((), device=d.device)
    for i, batch in enumerate(val_loader):
        if i == n:
            break
        batch = {k: v.to(d.device) for k, v in batch.items()}
        with autocast(cfg, d, model):
            total += model(batch["input_ids"], batch["labels"], batch.get("position_ids")).float()
    model.train()
    return all_reduce_sum(total, d).item() / (n * d.world_size)


def autocast(cfg: Config, d: Dist, model: torch.nn.Module) -> contextlib.AbstractContextManager:
    """bf16 autocast, except under FSDP2 whose MixedPrecisionPolicy already runs the blocks in bf16."""
    if cfg.train.precision == "bf16" and not uses_fsdp(model):
        return torch.autocast(d.device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def train(cfg: Config) -> dict[str, Any]:
    """Run training as configured; returns a small summary (final step, losses, skipped steps, ...)."""
    d = init_distributed(cfg.train.device)
    log = MetricsLogger(cfg.log.jsonl, cfg.log.tensorboard, enabled=d.is_main)
    threads = set_cpu_threads(d, cfg.data.num_workers)
    try:
        return _train(cfg, d, log)
    finally:
        log.close()
        torch.set_num_threads(threads)
        if d.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg: Config, d: Dist, log: MetricsLogger) -> dict[str, Any]:
    """Top to bottom: set up, resume, the steps (each: step, guard, log, evaluate, checkpoint), the end."""
    seed_everything(cfg.train.seed + d.rank)
    run = setup(cfg, d, log)
    resume(run)
    mon = dataflow.StarvationMonitor()
    batches = mon.wrap(run.prefetcher)
    stop = StopFlag(announce=d.is_main)
    stop_at = min(cfg.train.stop_at or cfg.train.steps, cfg.train.steps)
    say_what_is_ahead(run, stop_at)
    mon.reset_interval()
    try:
        loss, val_loss = steps(run, batches, mon, stop, stop_at)
    finally:
        run.prefetcher.close()
        run.loader.close()
        stop.restore()
    return finish(run, mon, loss, val_loss)


@dataclass
class Counters:
    """The guards' running figures, saved in each checkpoint."""

    skipped: int = 0  # non-finite steps skipped in all
    bad_in_row: int = 0  # non-finite steps in a row
    loss_ema: float | None = None  # running loss average for spike detection
    tokens: int = 0  # tokens trained on

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Run:
    """What one training run holds: built by `setup`, moved on by `steps`."""

    cfg: Config
    d: Dist
    log: MetricsLogger
    ds: Any
    loader: Any
    val_loader: Any
    model: torch.nn.Module
    gpt: GPT
    optimizer: torch.optim.Optimizer
    prefetcher: Any
    ckpt: Checkpointer | None
    model_meta: dict[str, Any]  # what the saved weights' shapes and meaning depend on: a resume must match
    tokens_per_step: int
    flops_per_token: float
    peak_flops: float | None
    schedule: Schedule  # the learning rate of each step: the config's, or as continued from the checkpoint's
    step: int = 0
    counters: Counters = field(default_factory=Counters)
    last_saved: int = -1
    rolled_back_to: str | None = None
    resume_path: str | None = None
    spikes_in_row: int = 0  # spike steps in a row: SPIKE_PATIENCE of them make the loss's new level the average


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


def setup(cfg: Config, d: Dist, log: MetricsLogger) -> Run:
    """Data, model, optimizer, the device prefetcher, and one line saying what runs where."""
    t = cfg.train
    ds, loader, val_loader = build_data(cfg, d)
    model, gpt = build_model(cfg, d, ds.vocab_size)
    optimizer = build_optimizer(model, t, d.device)
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * t.grad_accum * d.world_size
    n = torch.get_num_threads()
    where = f"cpu ({n} thread{'s' if n > 1 else ''})" if d.device.type == "cpu" else str(d.device)
    log.print(f"model: {gpt.num_params() / 1e6:.2f}M parameters, vocab {ds.vocab_size} (eos {ds.eos_id}); "
              f"{d.world_size} process(es) on {where}, parallel={t.parallel if d.world_size > 1 else 'none'}, "
              f"precision={t.precision}; {tokens_per_step:,} tokens per step; data {cfg.data.path} "
              f"({ds.num_samples:,} samples per epoch)")
    ckpt = Checkpointer(cfg.checkpoint.dir, cfg.checkpoint.keep, d) if cfg.checkpoint.dir else None
    model_meta = {k: getattr(cfg.model, k) for k in ("n_layer", "n_head", "d_model", "mlp_ratio", "vocab_multiple")}
    model_meta["vocab_size"] = ds.vocab_size
    prefetcher = dataflow.DevicePrefetcher(loader, device=d.device, depth=cfg.data.prefetch_depth)
    return Run(cfg, d, log, ds, loader, val_loader, model, gpt, optimizer, prefetcher, ckpt, model_meta,
               tokens_per_step, gpt.flops_per_token(cfg.data.seq_len), peak_flops(d.device), Schedule.of(t))


def resume(run: Run) -> None:
    """Continue from the configured checkpoint, if any: weights, optimizer, counters, data position, RNG, schedule."""
    cfg, d, t = run.cfg, run.d, run.cfg.train
    ckpt = run.ckpt or Checkpointer("", 1, d)
    run.resume_path = ckpt.begin(cfg.checkpoint.resume, cfg.checkpoint.replace, run.log.print)
    if not run.resume_path:
        return
    state = ckpt.load(run.resume_path, run.model, run.optimizer, expect_model=run.model_meta)
    run.step, loader_state = state["step"], state["loader"]
    c = state["counters"]
    run.counters = Counters(c["skipped"], c["bad_in_row"], c["loss_ema"], c["tokens"])
    run.prefetcher.load_state_dict(loader_state)
    if not state["rng_restored"]:
        seed_everything(t.seed + d.rank + 1_000_003 * run.step)
    run.log.event(run.step, "resume", f"resumed from {run.resume_path} (epoch {loader_state['epoch']}, "
                  f"{loader_state['consumed']:,} samples consumed, world size {state['world_size']} -> {d.world_size})")
    run.schedule = run.schedule.resumed(state, run.step, run.log.print)
    run.last_saved = run.step


def say_what_is_ahead(run: Run, stop_at: int) -> None:
    """Nothing to do (the checkpoint is at the end), or a warning when the run looks out of reach."""
    t, step = run.cfg.train, run.step
    if step >= stop_at:
        run.log.print(f"nothing to do: the checkpoint is at step {step} and train.steps = {t.steps}"
                      + (f", train.stop_at = {t.stop_at}" if t.stop_at else "")
                      + f"; to train on, raise it (--set train.steps={2 * max(step, 1)}); to start afresh, "
                        f"--set checkpoint.resume=none --set checkpoint.replace=true, or another checkpoint.dir")
    else:
        warn_if_out_of_reach(run.cfg, run.d.device, run.d.world_size, run.gpt, run.tokens_per_step, run.log.print)


def steps(run: Run, batches: Iterator[Any], mon: Any, stop: StopFlag, stop_at: int) -> tuple[float, float | None]:
    """Train until `stop_at` or a stop signal; returns the last step's loss and the last validation loss."""
    cfg, t = run.cfg, run.cfg.train
    loss, val_loss, interval = float("nan"), None, Interval()
    while run.step < stop_at:
        run.step += 1
        r = train_step(run, batches, mon, stop)
        run.counters.tokens += run.tokens_per_step
        loss = r.loss
        if guard(run, r):  # rolled back to a checkpoint: its step, the data stream goes on
            continue
        interval.add(run.tokens_per_step, r.loss if r.finite else None)
        if run.step % cfg.log.every == 0 or run.step == stop_at:
            log_interval(run, r, mon, interval)
            interval = Interval()
        if run.val_loader is not None and t.eval_every and run.step % t.eval_every == 0:
            val_loss = run_eval(run)
        if run.ckpt and run.step % cfg.checkpoint.every == 0:
            save(run)
        if r.stop_votes > 0:
            run.log.event(run.step, "stop", "stop requested by a signal: leaving" +
                          (" after a checkpoint" if run.ckpt and cfg.checkpoint.save_at_exit else ""))
            break
    return loss, val_loss


def train_step(run: Run, batches: Iterator[Any], mon: Any, stop: StopFlag) -> StepResult:
    """One optimizer step over `grad_accum` micro-batches, applied unless it is non-finite or a rollback."""
    t, model = run.cfg.train, run.model
    lr = run.schedule.at(run.step)
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    loss_sum = torch.zeros((), device=run.d.device)
    for micro in range(t.grad_accum):
        batch = next(batches)
        last = micro == t.grad_accum - 1
        with mon.step(), grad_sync(model, last):
            with autocast(run.cfg, run.d, model):
                loss = model(batch["input_ids"], batch["labels"], batch.get("position_ids"))
            if run.step == t.inject_nan_step:
                loss = loss * float("nan")
            # each micro-batch's mean loss is scaled so the accumulated gradient is the full batch's mean
            (loss / t.grad_accum).backward()
            loss_sum += loss.detach().float()
            if last:
                result = apply_step(run, loss_sum, stop, lr)
    return result


def is_spike(loss: float, ema: float | None, factor: float) -> bool:
    """A loss above `factor` x its running average (`factor` 0: never)."""
    return factor > 0 and ema is not None and loss > factor * ema


def apply_step(run: Run, loss_sum: torch.Tensor, stop: StopFlag, lr: float) -> StepResult:
    """The one host sync of the step: global loss, grad norm and stop votes, equal on every rank; then
    the optimizer steps unless the step is non-finite or a spike to roll back from."""
    t, d = run.cfg.train, run.d
    grad_norm = clip_grad_norm(run.model, t.clip)
    stats = all_reduce_sum(torch.stack([loss_sum / t.grad_accum, torch.tensor(float(stop.set), device=d.device)]), d)
    loss, stop_votes = stats[0].item() / d.world_size, stats[1].item()
    gnorm = float(grad_norm)
    finite = math.isfinite(loss) and math.isfinite(gnorm)
    spike = finite and is_spike(loss, run.counters.loss_ema, t.spike_factor)
    target = rollback_target(run) if spike and t.spike_rollback else None
    if finite and target is None:
        run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    return StepResult(lr, loss, gnorm, finite, spike, target, stop_votes)


def guard(run: Run, r: StepResult) -> bool:
    """Non-finite steps (counted; too many in a row abort) and loss spikes (logged, or rolled back from).
    True when the run rolled back to a checkpoint."""
    t, c, log = run.cfg.train, run.counters, run.log
    if not r.finite:
        c.skipped, c.bad_in_row = c.skipped + 1, c.bad_in_row + 1
        log.event(run.step, "nonfinite", f"non-finite loss {r.loss} or grad norm {r.grad_norm}: step skipped "
                  f"({c.bad_in_row} in a row, {c.skipped} in total)", skipped_steps=c.skipped)
        if c.bad_in_row >= t.max_bad_steps:
            raise TrainingAborted(f"{c.bad_in_row} non-finite steps in a row (train.max_bad_steps = "
                                  f"{t.max_bad_steps}); lower train.lr, check the data, or resume from "
                                  f"an earlier checkpoint")
        return False
    c.bad_in_row = 0
    run.spikes_in_row = run.spikes_in_row + 1 if r.spike else 0
    if r.spike:
        log.event(run.step, "spike", f"loss {r.loss:.4f} is above {t.spike_factor:g} x its running "
                  f"average {c.loss_ema:.4f}" + ("; rolling back" if r.rollback_to else ""))
    if r.rollback_to:
        run.rolled_back_to = r.rollback_to
        state = run.ckpt.load(r.rollback_to, run.model, run.optimizer, expect_model=run.model_meta)
        run.step, saved = state["step"], state["counters"]
        c.skipped, c.bad_in_row, c.loss_ema = saved["skipped"], saved["bad_in_row"], saved["loss_ema"]
        # the loader is not rewound: the batches that caused the spike are skipped
        log.event(run.step, "rollback", f"rolled back to {run.rolled_back_to}; the data stream goes on")
        return True
    if r.spike and run.spikes_in_row >= SPIKE_PATIENCE:  # not a spike but a new level: the average follows it
        log.event(run.step, "spike", f"the loss stayed above {t.spike_factor:g} x its running average for "
                  f"{run.spikes_in_row} steps: {r.loss:.4f} is taken as its new level")
        c.loss_ema, run.spikes_in_row = r.loss, 0
    elif not r.spike:
        c.loss_ema = r.loss if c.loss_ema is None else EMA_BETA * c.loss_ema + (1 - EMA_BETA) * r.loss
    return False


def rollback_target(run: Run) -> str | None:
    """The newest checkpoint, unless a rollback to it already happened (then spikes are only logged)."""
    found = complete_checkpoints(run.ckpt.root) if run.ckpt else []
    return found[-1][1] if found and found[-1][1] != run.rolled_back_to else None


def log_interval(run: Run, r: StepResult, mon: Any, interval: Interval) -> None:
    """One metrics record for the steps since the last one."""
    d = run.d
    wait_s, wall_s = mon.reset_interval()
    tps = interval.tokens / interval.elapsed()
    peak = run.peak_flops
    rec = {"step": run.step, "loss": interval.mean_loss(), "lr": r.lr, "grad_norm": r.grad_norm,
           "tokens_per_s": tps, "data_wait_pct": 100.0 * wait_s / wall_s if wall_s > 0 else 0.0,
           "mfu": tps / d.world_size * run.flops_per_token / peak if peak else None,
           "step_s": interval.elapsed() / interval.steps, "epoch": run.prefetcher.state_dict()["epoch"],
           "tokens": run.counters.tokens, "skipped_steps": run.counters.skipped}
    key, gib = peak_memory_gib(d.device)
    rec[key] = gib
    run.log.train(rec, run.cfg.train.steps)


def run_eval(run: Run) -> float | None:
    """The validation loss, logged."""
    loss = evaluate(run.model, run.val_loader, run.cfg, run.d)
    if loss is not None:
        run.log.event(run.step, "eval", f"val loss {loss:.4f} | val ppl {math.exp(loss):.2f}",
                      val_loss=loss, val_ppl=math.exp(loss))
    return loss


def save(run: Run) -> None:
    """A checkpoint of this step; the data position is the prefetcher's: after the last batch the
    optimizer took, not the read-ahead."""
    path = run.ckpt.save(run.step, run.model, run.optimizer, {
        "loader": run.prefetcher.state_dict(), "counters": run.counters.to_dict(), "model": run.model_meta,
        "config": run.cfg.to_dict(), "scheduler": run.schedule.record(run.step)})
    run.last_saved = run.step
    run.log.event(run.step, "checkpoint", f"saved {path}")


def finish(run: Run, mon: Any, loss: float, val_loss: float | None) -> dict[str, Any]:
    """The last checkpoint and evaluation, the summary lines, and what `train` returns."""
    cfg, t, step = run.cfg, run.cfg.train, run.step
    if run.ckpt and cfg.checkpoint.save_at_exit and run.last_saved != step:
        save(run)
    if run.val_loader is not None and (not t.eval_every or step % t.eval_every) and step == t.steps:
        val_loss = run_eval(run)
    run.log.print(mon.format_summary() + (f" [{t.grad_accum} micro-steps per step]" if t.grad_accum > 1 else ""))
    ps, loader = run.prefetcher.stats, run.loader
    run.log.print(f"data path: StreamingDataLoader({count(cfg.data.num_workers, 'worker')}, pinned={loader.pinned}) "
                  f"-> DevicePrefetcher({run.d.device.type}, depth {cfg.data.prefetch_depth}); {ps.direct_copies}/"
                  f"{ps.batches} batches copied to the device straight from loader memory, {loader.stats.copies} "
                  f"owned copies")
    return {"step": step, "loss": loss, "skipped_steps": run.counters.skipped, "val_loss": val_loss,
            "resumed_from": run.resume_path, "summary": mon.summary()}
