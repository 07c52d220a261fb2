"""The training loop, top to bottom: data, model, optimizer, resume, steps, checkpoints, summary.

One host sync per optimizer step (the all-reduced loss and the grad norm) decides whether the step is
applied: a non-finite loss or norm skips it on every rank at once.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import threading
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

import dataflow
from dataflow.errors import ConfigError, TrainingAborted
from dataflow.units import count
from trainer.checkpoint import Checkpointer, complete_checkpoints, resolve_resume
from trainer.config import Config
from trainer.estimate import warn_if_out_of_reach
from trainer.metrics import Interval, MetricsLogger, peak_flops, peak_memory_gib
from trainer.model import GPT
from trainer.optim import build_optimizer, clip_grad_norm, lr_at
from trainer.parallelize import Dist, grad_sync, init_distributed, parallelize, set_cpu_threads, uses_fsdp

EMA_BETA = 0.9  # running loss average for spike detection


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


class StopFlag:
    """SIGTERM/SIGINT: the first finishes the current step, saves a checkpoint and leaves; a second one stops at
    once, without a checkpoint.

    A step is mostly long C++ operations, during which Python signal handlers cannot run (a step of a config far
    beyond the machine may take an hour). So the signal also wakes a watcher thread through the wakeup fd, which
    answers at once: it says what will happen, and on the second signal ends the process (loader workers leave
    when their parent is gone).
    """

    def __init__(self, announce: bool = True) -> None:
        self.set = False
        self.announce = announce
        self.previous: dict[int, Any] = {}
        self._wakeup: tuple[int, int] | None = None
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGINT):
            self.previous[sig] = signal.signal(sig, self._handle)
        read, write = os.pipe()
        os.set_blocking(write, False)
        self._old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        self._wakeup = (read, write)
        self._watcher = threading.Thread(target=self._watch, args=(read,), name="trainer-signals", daemon=True)
        self._watcher.start()

    def _handle(self, signum: int, frame: Any) -> None:
        self.set = True

    def _say(self, text: str) -> None:
        if self.announce:
            os.write(2, f"{text}\n".encode())

    def _watch(self, read: int) -> None:
        seen = 0
        while True:
            try:
                data = os.read(read, 64)
            except OSError:
                return
            if not data or 0 in data:  # restore() is done with us
                return
            for signum in data:
                if signum not in (signal.SIGTERM, signal.SIGINT):
                    continue
                seen += 1
                self.set = True
                name = signal.Signals(signum).name
                if seen == 1:
                    self._say(f"{name}: stopping after the current step (with a checkpoint when checkpoint.dir "
                              f"is set); send it again to stop at once")
                else:
                    self._say(f"{name} again: stopped at once, without a checkpoint")
                    os._exit(128 + signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        if self._wakeup is not None:
            signal.set_wakeup_fd(self._old_fd)
            os.write(self._wakeup[1], b"\0")  # wake the watcher so that it ends before its fd is closed
            self._watcher.join()
            for fd in self._wakeup:
                os.close(fd)
            self._wakeup = None


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
    t = cfg.train
    seed_everything(t.seed + d.rank)

    # --- data, model, optimizer ---
    ds, loader, val_loader = build_data(cfg, d)
    model, gpt = build_model(cfg, d, ds.vocab_size)
    optimizer = build_optimizer(model, t, d.device)
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * t.grad_accum * d.world_size
    flops_per_token, peak = gpt.flops_per_token(cfg.data.seq_len), peak_flops(d.device)
    n = torch.get_num_threads()
    where = f"cpu ({n} thread{'s' if n > 1 else ''})" if d.device.type == "cpu" else str(d.device)
    log.print(f"model: {gpt.num_params() / 1e6:.2f}M parameters, vocab {ds.vocab_size} (eos {ds.eos_id}); "
              f"{d.world_size} process(es) on {where}, parallel={t.parallel if d.world_size > 1 else 'none'}, "
              f"precision={t.precision}; {tokens_per_step:,} tokens per step; data {cfg.data.path} "
              f"({ds.num_samples:,} samples per epoch)")

    # --- resume ---
    ckpt = Checkpointer(cfg.checkpoint.dir, cfg.checkpoint.keep, d) if cfg.checkpoint.dir else None
    # what the saved weights' shapes and meaning depend on: a resume must match these
    model_meta = {k: getattr(cfg.model, k) for k in ("n_layer", "n_head", "d_model", "mlp_ratio", "vocab_multiple")}
    model_meta["vocab_size"] = ds.vocab_size
    step, skipped, bad_in_row, loss_ema, tokens_seen = 0, 0, 0, None, 0
    prefetcher = dataflow.DevicePrefetcher(loader, device=d.device, depth=cfg.data.prefetch_depth)
    resume_path = resolve_resume(cfg.checkpoint.dir, cfg.checkpoint.resume)
    if resume_path:
        state = (ckpt or Checkpointer("", 1, d)).load(resume_path, model, optimizer, expect_model=model_meta)
        step, loader_state = state["step"], state["loader"]
        c = state["counters"]
        skipped, bad_in_row, loss_ema, tokens_seen = c["skipped"], c["bad_in_row"], c["loss_ema"], c["tokens"]
        prefetcher.load_state_dict(loader_state)
        if not state["rng_restored"]:
            seed_everything(t.seed + d.rank + 1_000_003 * step)
        log.event(step, "resume", f"resumed from {resume_path} (epoch {loader_state['epoch']}, "
                  f"{loader_state['consumed']:,} samples consumed, world size {state['world_size']} -> {d.world_size})")
    last_saved = step if resume_path else -1
    rolled_back_to = None

    def rollback_target() -> str | None:
        """The newest checkpoint, unless a rollback to it already happened (then spikes are only logged)."""
        found = complete_checkpoints(ckpt.root) if ckpt else []
        return found[-1][1] if found and found[-1][1] != rolled_back_to else None

    def run_eval() -> float | None:
        loss = evaluate(model, val_loader, cfg, d)
        if loss is not None:
            log.event(step, "eval", f"val loss {loss:.4f} | val ppl {math.exp(loss):.2f}",
                      val_loss=loss, val_ppl=math.exp(loss))
        return loss

    def save() -> None:
        nonlocal last_saved
        counters = {"skipped": skipped, "bad_in_row": bad_in_row, "loss_ema": loss_ema, "tokens": tokens_seen}
        path = ckpt.save(step, model, optimizer, {
            "loader": prefetcher.state_dict(),  # after the last batch the optimizer took, not the read-ahead
            "counters": counters, "model": model_meta, "config": cfg.to_dict(),
            "scheduler": {"decay": t.decay, "step": step, "lr": lr_at(max(step, 1), t)}})
        last_saved = step
        log.event(step, "checkpoint", f"saved {path}")

    # --- the loop ---
    mon = dataflow.StarvationMonitor()
    batches = mon.wrap(prefetcher)
    stop, interval, loss_val, val_loss = StopFlag(announce=d.is_main), Interval(), float("nan"), None
    stop_at = min(t.stop_at or t.steps, t.steps)
    if step >= stop_at:
        log.print(f"nothing to do: the checkpoint is at step {step} and train.steps = {t.steps}"
                  + (f", train.stop_at = {t.stop_at}" if t.stop_at else "")
                  + f"; to train on, raise it (--set train.steps={2 * max(step, 1)}); to start afresh, "
                    f"--set checkpoint.resume=none or another checkpoint.dir")
    else:
        warn_if_out_of_reach(cfg, d.device, d.world_size, gpt, tokens_per_step, log.print)
    mon.reset_window()
    try:
        while step < stop_at:
            step += 1
            lr = lr_at(step, t)
            for group in optimizer.param_groups:
                group["lr"] = lr
            loss_sum = torch.zeros((), device=d.device)
            for micro in range(t.grad_accum):
                batch = next(batches)
                last = micro == t.grad_accum - 1
                with mon.step(), grad_sync(model, last):
                    with autocast(cfg, d, model):
                        loss = model(batch["input_ids"], batch["labels"], batch.get("position_ids"))
                    if step == t.inject_nan_step:
                        loss = loss * float("nan")
                    # each micro-batch's mean loss is scaled so the accumulated gradient is the full batch's mean
                    (loss / t.grad_accum).backward()
                    loss_sum += loss.detach().float()
                    if not last:
                        continue
                    # the one host sync of the step: global loss, grad norm and stop votes, equal on every rank
                    grad_norm = clip_grad_norm(model, t.clip)
                    stats = all_reduce_sum(torch.stack([loss_sum / t.grad_accum,
                                                        torch.tensor(float(stop.set), device=d.device)]), d)
                    loss_val, stop_votes = stats[0].item() / d.world_size, stats[1].item()
                    gnorm_val = float(grad_norm)
                    finite = math.isfinite(loss_val) and math.isfinite(gnorm_val)
                    spike = finite and t.spike_factor > 0 and loss_ema is not None and \
                        loss_val > t.spike_factor * loss_ema
                    target = rollback_target() if spike and t.spike_rollback else None
                    if finite and target is None:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            tokens_seen += tokens_per_step

            # --- guards: non-finite steps, loss spikes ---
            if not finite:
                skipped, bad_in_row = skipped + 1, bad_in_row + 1
                log.event(step, "nonfinite", f"non-finite loss {loss_val} or grad norm {gnorm_val}: step skipped "
                          f"({bad_in_row} in a row, {skipped} in total)", skipped_steps=skipped)
                if bad_in_row >= t.max_bad_steps:
                    raise TrainingAborted(f"{bad_in_row} non-finite steps in a row (train.max_bad_steps = "
                                          f"{t.max_bad_steps}); lower train.lr, check the data, or resume from "
                                          f"an earlier checkpoint")
            else:
                bad_in_row = 0
                if spike:
                    log.event(step, "spike", f"loss {loss_val:.4f} is above {t.spike_factor:g} x its running "
                              f"average {loss_ema:.4f}" + ("; rolling back" if target else ""))
                if target:
                    rolled_back_to = target
                    state = ckpt.load(target, model, optimizer, expect_model=model_meta)
                    step, c = state["step"], state["counters"]
                    skipped, bad_in_row, loss_ema = c["skipped"], c["bad_in_row"], c["loss_ema"]
                    # the loader is not rewound: the batches that caused the spike are skipped
                    log.event(step, "rollback", f"rolled back to {rolled_back_to}; the data stream goes on")
                    continue
                if not spike:
                    loss_ema = loss_val if loss_ema is None else EMA_BETA * loss_ema + (1 - EMA_BETA) * loss_val
            interval.add(tokens_per_step, loss_val if finite else None)

            # --- log, evaluate, checkpoint ---
            if step % cfg.log.every == 0 or step == stop_at:
                wait_s, wall_s = mon.reset_window()
                tps = interval.tokens / interval.elapsed()
                rec = {"step": step, "loss": interval.mean_loss(), "lr": lr, "grad_norm": gnorm_val,
                       "tokens_per_s": tps, "data_wait_pct": 100.0 * wait_s / wall_s if wall_s > 0 else 0.0,
                       "mfu": tps / d.world_size * flops_per_token / peak if peak else None,
                       "step_s": interval.elapsed() / interval.steps, "epoch": prefetcher.state_dict()["epoch"],
                       "tokens": tokens_seen, "skipped_steps": skipped}
                key, gib = peak_memory_gib(d.device)
                rec[key] = gib
                log.train(rec, t.steps)
                interval = Interval()
            if val_loader is not None and t.eval_every and step % t.eval_every == 0:
                val_loss = run_eval()
            if ckpt and step % cfg.checkpoint.every == 0:
                save()
            if stop_votes > 0:
                log.event(step, "stop", "stop requested by a signal: leaving" +
                          (" after a checkpoint" if ckpt and cfg.checkpoint.save_at_exit else ""))
                break
    finally:
        prefetcher.close()
        loader.close()
        stop.restore()

    # --- the end ---
    if ckpt and cfg.checkpoint.save_at_exit and last_saved != step:
        save()
    if val_loader is not None and (not t.eval_every or step % t.eval_every) and step == t.steps:
        val_loss = run_eval()
    log.print(mon.format_summary() + (f" [{t.grad_accum} micro-steps per step]" if t.grad_accum > 1 else ""))
    ps = prefetcher.stats
    log.print(f"data path: StreamingDataLoader({count(cfg.data.num_workers, 'worker')}, pinned={loader.pinned}) -> "
              f"DevicePrefetcher({d.device.type}, depth {cfg.data.prefetch_depth}); {ps.direct_copies}/{ps.batches} "
              f"batches copied to the device straight from loader memory, {loader.stats.copies} owned copies")
    return {"step": step, "loss": loss_val, "skipped_steps": skipped, "val_loss": val_loss,
            "resumed_from": resume_path, "summary": mon.summary()}
