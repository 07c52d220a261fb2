"""The training loop, top to bottom: layout, data, model, optimizer, resume, steps, checkpoints, summary.

What a run is built from is `build.py`'s; one optimizer step is `step.py`'s; this module moves the run from step
to step: the guards, the log, evaluation and checkpoints.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch
import torch.distributed as dist

import dataflow
from dataflow.distributed import data_parallel_coordinates
from dataflow.errors import TrainingAborted
from dataflow.sizes import count
from trainer.build import (
    Counters,
    TrainRun,
    build_data,
    open_dataset,
    seed_everything,
    setup,
)
from trainer.checkpoint import Checkpointer
from trainer.config import Config, rank_figures_dir
from trainer.estimate import warn_if_out_of_reach
from trainer.layout import check_vocab, plan_layout, torchrun_world
from trainer.metrics import Interval, MetricsLogger, peak_memory_gib
from trainer.model import GPT
from trainer.parallelize import Dist, build_mesh, init_distributed, set_cpu_threads
from trainer.signals import StopFlag
from trainer.step import (
    StepResult,
    all_reduce_sum,
    autocast,
    is_spike,
    pipeline_step,
    train_step,
)

__all__ = ["train", "build_data", "Counters", "TrainRun", "StepResult", "TrainingAborted", "is_spike", "guard",
           "SPIKE_PATIENCE"]

EMA_BETA = 0.9  # running loss average for spike detection
SPIKE_PATIENCE = 20  # spikes in a row after which the loss is taken to have moved for good (new data, say)


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


def train(cfg: Config) -> dict[str, Any]:
    """Run training as configured; returns a small summary (final step, losses, skipped steps, ...).

    The layout and the dataset (its vocabulary decides whether tensor parallelism can split the embedding) are
    checked before any process group exists: a layout that cannot work is one line on every rank, not a hang."""
    layout = plan_layout(cfg, *torchrun_world())
    ds = open_dataset(cfg, layout)
    check_vocab(layout, cfg.model, ds.vocab_size)
    d = init_distributed(cfg.train.device, layout)
    d.mesh = build_mesh(cfg, d)
    if d.mesh is not None and data_parallel_coordinates(d.mesh) != ds.rank_world():  # the env's order is the mesh's
        raise TrainingAborted(f"rank {d.rank}: the loader's data-parallel coordinate {ds.rank_world()} is not the "
                              f"mesh's {data_parallel_coordinates(d.mesh)}")
    log = MetricsLogger(cfg.log.jsonl, cfg.log.tensorboard, enabled=d.is_main)
    threads = set_cpu_threads(d, cfg.data.num_workers)
    try:
        return _train(cfg, d, log, ds)
    finally:
        log.close()
        torch.set_num_threads(threads)
        if d.world_size > 1 and dist.is_initialized():
            dist.destroy_process_group()


def _train(cfg: Config, d: Dist, log: MetricsLogger, ds: Any) -> dict[str, Any]:
    """Top to bottom: set up, resume, the steps (each: step, guard, log, evaluate, checkpoint), the end."""
    seed_everything(cfg.train.seed + d.rank)
    run = setup(cfg, d, log, ds)
    resume(run)
    mon = dataflow.StarvationMonitor(run_dir=rank_figures_dir(cfg))
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


def resume(run: TrainRun) -> None:
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
                  f"{loader_state['consumed']:,} samples consumed, world size {state['world_size']} -> {d.world_size}"
                  f"{layout_change(run, state)})")
    run.schedule = run.schedule.resumed(state, run.step, run.log.print)
    run.last_saved = run.step


def layout_change(run: TrainRun, state: dict[str, Any]) -> str:
    """What changed since the checkpoint's run: its layout and its tokens per step (say, fewer processes without
    train.global_batch_tokens); empty when nothing did or the checkpoint does not say."""
    said = []
    old, new = state.get("layout"), run.d.layout.record()
    if isinstance(old, dict) and old != new:
        said.append("layout " + ", ".join(f"{k} {old.get(k)} -> {v}" for k, v in new.items() if old.get(k) != v))
    tokens = state.get("tokens_per_step")
    if isinstance(tokens, int) and tokens != run.tokens_per_step:
        said.append(f"global batch {tokens:,} -> {run.tokens_per_step:,} tokens per step (train.global_batch_tokens "
                    f"keeps it across layouts)")
    return "".join("; " + s for s in said)


def say_what_is_ahead(run: TrainRun, stop_at: int) -> None:
    """Nothing to do (the checkpoint is at the end), or a warning when the run looks out of reach."""
    t, step = run.cfg.train, run.step
    if step >= stop_at:
        run.log.print(f"nothing to do: the checkpoint is at step {step} and train.steps = {t.steps}"
                      + (f", train.stop_at = {t.stop_at}" if t.stop_at else "")
                      + f"; to train on, raise it (--set train.steps={2 * max(step, 1)}); to start afresh, "
                        f"--set checkpoint.resume=none --set checkpoint.replace=true, or another checkpoint.dir")
    else:
        gpt = run.gpt
        if run.pipeline is not None:  # the estimate reads the whole model (its embedding): a stage holds a part
            with torch.device("meta"):
                gpt = GPT(run.cfg.model, run.ds.vocab_size, run.cfg.data.seq_len)
        warn_if_out_of_reach(run.cfg, run.d.device, run.d.world_size, gpt, run.tokens_per_step, run.log.print)


def steps(run: TrainRun, batches: Iterator[Any], mon: Any, stop: StopFlag, stop_at: int) -> tuple[float, float | None]:
    """Train until `stop_at` or a stop signal; returns the last step's loss and the last validation loss."""
    cfg, t = run.cfg, run.cfg.train
    loss, val_loss, interval = float("nan"), None, Interval()
    while run.step < stop_at:
        run.step += 1
        r = (pipeline_step if run.pipeline is not None else train_step)(run, batches, mon, stop)
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


def guard(run: TrainRun, r: StepResult) -> bool:
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


def log_interval(run: TrainRun, r: StepResult, mon: Any, interval: Interval) -> None:
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
    if d.world_size > 1 and mon.fleet is not None:  # a collective: every rank, at the same step
        for line in mon.name_stragglers():
            run.log.event(run.step, "straggler", line)


def run_eval(run: TrainRun) -> float | None:
    """The validation loss, logged."""
    loss = evaluate(run.model, run.val_loader, run.cfg, run.d)
    if loss is not None:
        run.log.event(run.step, "eval", f"val loss {loss:.4f} | val ppl {math.exp(loss):.2f}",
                      val_loss=loss, val_ppl=math.exp(loss))
    return loss


def save(run: TrainRun) -> None:
    """A checkpoint of this step; the data position is the prefetcher's: after the last batch the
    optimizer took, not the read-ahead."""
    path = run.ckpt.save(run.step, run.model, run.optimizer, {
        "loader": run.prefetcher.state_dict(), "counters": run.counters.to_dict(), "model": run.model_meta,
        "config": run.cfg.to_dict(), "scheduler": run.schedule.record(run.step), "layout": run.d.layout.record(),
        "tokens_per_step": run.tokens_per_step})
    run.last_saved = run.step
    run.log.event(run.step, "checkpoint", f"saved {path}")


def finish(run: TrainRun, mon: Any, loss: float, val_loss: float | None) -> dict[str, Any]:
    """The last checkpoint and evaluation, the summary lines, and what `train` returns."""
    cfg, t, step = run.cfg, run.cfg.train, run.step
    if run.ckpt and cfg.checkpoint.save_at_exit and run.last_saved != step:
        save(run)
    if run.val_loader is not None and (not t.eval_every or step % t.eval_every) and step == t.steps:
        val_loss = run_eval(run)
    run.log.print(mon.format_summary() + (f" [{run.grad_accum} micro-steps per step]" if run.grad_accum > 1 else ""))
    say_fleet(run, mon)
    ps, loader = run.prefetcher.stats, run.loader
    run.log.print(f"data path: StreamingDataLoader({count(cfg.data.num_workers, 'worker')}, pinned={loader.pinned}) "
                  f"-> DevicePrefetcher({run.d.device.type}, depth {cfg.data.prefetch_depth}); {ps.direct_copies}/"
                  f"{ps.batches} batches copied to the device straight from loader memory, {loader.stats.copies} "
                  f"owned copies")
    return {"step": step, "loss": loss, "skipped_steps": run.counters.skipped, "val_loss": val_loss,
            "resumed_from": run.resume_path, "summary": mon.summary()}


def say_fleet(run: TrainRun, mon: Any) -> None:
    """Under torch.distributed, rank 0 sums up every rank's figures (`dataflow profile --fleet`'s view)."""
    folder = rank_figures_dir(run.cfg)
    if folder is None or run.d.world_size == 1:
        return
    from dataflow.profiling.fleet import fleet_report, format_fleet

    mon.close()  # this rank's last interval, written
    if dist.is_initialized():
        dist.barrier()  # every rank's
    if run.d.is_main:
        run.log.print(format_fleet(fleet_report(folder)))
