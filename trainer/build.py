"""What a training run is built from: the layout, the data (fed by the data-parallel coordinate), the parallel model,
the optimizer and the device prefetcher, held in one `TrainRun`.
"""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
import torch

import dataflow
from dataflow.distributed import data_parallel_coordinates
from dataflow.errors import ConfigError
from trainer.checkpoint import Checkpointer
from trainer.config import Config
from trainer.layout import ParallelLayout
from trainer.metrics import MetricsLogger, peak_flops
from trainer.model import GPT, QKV_LAYOUT
from trainer.optim import Schedule, build_optimizer
from trainer.parallelize import Dist, build_pipeline, parallelize, stage_index


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def open_dataset(cfg: Config, layout: ParallelLayout) -> Any:
    """The train dataset as this process's data-parallel rank reads it: every tensor-parallel rank of a group gets
    the same coordinate, so the same batches. Needs no process group (torchrun's environment says the rank)."""
    rank, world = data_parallel_coordinates(tensor_parallel=layout.tp, pipeline_parallel=layout.pp)
    ds = dataflow.StreamingDataset(cfg.data.path, seq_len=cfg.data.seq_len, seed=cfg.train.seed,
                                   shuffle_window=cfg.data.shuffle_window, position_ids=cfg.data.doc_mask,
                                   rank=rank, world_size=world)
    if ds.num_samples // world < cfg.data.batch_size:
        raise ConfigError(f"{cfg.data.path} has {ds.num_samples} samples of {cfg.data.seq_len + 1} tokens: too few "
                          f"for data.batch_size = {cfg.data.batch_size} on {world} data-parallel rank(s)")
    return ds


def build_data(cfg: Config, d: Dist, ds: Any = None, **loader_options: Any) -> tuple[Any, Any, Any]:
    """Train dataset (opened here unless given) and loader (`loader_options` override StreamingDataLoader's), and
    the validation loader (or None)."""
    ds = ds if ds is not None else open_dataset(cfg, d.layout)
    # the product's path: workers fill page-locked slots that the prefetcher copies to the GPU directly;
    # cycle: epoch after epoch, so the loop counts steps, not epochs
    options = {"pin_memory": d.device.type == "cuda", "cycle": True, **loader_options}
    # a pipeline stage between the first (inputs) and the last (labels) reads no data: no workers, never iterated
    reads = stage_index(d) in (0, d.layout.pp - 1)
    # the audit records what each data-parallel replica consumed: once, by its first stage's first tp rank (the
    # other tp ranks and the last stage read the same batches)
    audits = stage_index(d) == 0 and (d.mesh is None or d.layout.tp == 1 or d.mesh.get_local_rank("tp") == 0)
    loader = dataflow.StreamingDataLoader(ds, batch_size=cfg.data.batch_size,
                                          num_workers=cfg.data.num_workers if reads else 0,
                                          audit=(cfg.data.audit or None) if audits else None, **options)
    val_loader = None
    if cfg.data.val_path:
        rank, world = ds.rank_world()
        val = dataflow.StreamingDataset(cfg.data.val_path, seq_len=cfg.data.seq_len, shuffle=False,
                                        seed=cfg.train.seed, position_ids=cfg.data.doc_mask, rank=rank,
                                        world_size=world)
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
                          f"(train.parallel = \"fsdp\" over more processes, train.tensor_parallel)") from None


def _materialise(gpt: GPT, cfg: Config, d: Dist) -> tuple[torch.nn.Module, GPT]:
    if d.layout.pp > 1:
        gpt.keep_stage(stage_index(d), d.layout.pp)
    if d.world_size > 1 and cfg.train.parallel in ("fsdp", "hsdp"):
        model = parallelize(gpt, cfg, d)  # on meta: each rank then allocates and initialises its shards only
        gpt.to_empty(device=d.device)
        gpt.tie_weights()
        gpt.init_weights(cfg.train.seed)
    else:
        gpt.to_empty(device=d.device)
        gpt.tie_weights()
        gpt.init_weights(cfg.train.seed)
        model = parallelize(gpt, cfg, d)
    return model, gpt


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
class TrainRun:
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
    pipeline: Any = None  # this rank's pipeline stage (trainer.parallelize.Pipeline) under pipeline parallelism

    @property
    def grad_accum(self) -> int:
        return self.d.layout.grad_accum


def say_layout(cfg: Config, d: Dist, log: MetricsLogger, tokens_per_step: int) -> None:
    """The layout's record (the first of log.jsonl) and start-up line, and the note when global_batch_tokens
    overrides grad_accum."""
    lay, t = d.layout, cfg.train
    log.record({"step": 0, "event": "layout", **lay.record(), "world_size": d.world_size,
                "grad_accum": lay.grad_accum, "tokens_per_step": tokens_per_step})
    log.print(f"layout: {lay.describe()} = {d.world_size} process(es); {lay.grad_accum} micro-batch(es) of "
              f"{cfg.data.batch_size} x {cfg.data.seq_len} tokens on each data-parallel rank: {tokens_per_step:,} "
              f"tokens per step")
    if t.global_batch_tokens and t.grad_accum != lay.grad_accum:
        log.print(f"train.grad_accum = {t.grad_accum} ignored: train.global_batch_tokens = "
                  f"{t.global_batch_tokens:,} gives {lay.grad_accum} micro-batch(es) per step at this layout")


def setup(cfg: Config, d: Dist, log: MetricsLogger, ds: Any = None) -> TrainRun:
    """Data, model, optimizer, the device prefetcher, and the lines saying what runs where."""
    t = cfg.train
    ds, loader, val_loader = build_data(cfg, d, ds)
    model, gpt = build_model(cfg, d, ds.vocab_size)
    optimizer = build_optimizer(model, t, d.device)
    tokens_per_step = cfg.data.batch_size * cfg.data.seq_len * d.layout.grad_accum * d.layout.dp
    say_layout(cfg, d, log, tokens_per_step)
    n = torch.get_num_threads()
    where = f"cpu ({n} thread{'s' if n > 1 else ''})" if d.device.type == "cpu" else str(d.device)
    log.print(f"model: {gpt.num_params() / 1e6:.2f}M parameters, vocab {ds.vocab_size} (eos {ds.eos_id}); "
              f"{d.world_size} process(es) on {where}, parallel={t.parallel if d.world_size > 1 else 'none'}, "
              f"precision={t.precision}; {tokens_per_step:,} tokens per step; data {cfg.data.path} "
              f"({ds.num_samples:,} samples per epoch)")
    ckpt = Checkpointer(cfg.checkpoint.dir, cfg.checkpoint.keep, d) if cfg.checkpoint.dir else None
    model_meta = {k: getattr(cfg.model, k) for k in ("n_layer", "n_head", "d_model", "mlp_ratio", "vocab_multiple")}
    model_meta.update(vocab_size=ds.vocab_size, qkv=QKV_LAYOUT)
    prefetcher = dataflow.DevicePrefetcher(loader, device=d.device, depth=cfg.data.prefetch_depth)
    run = TrainRun(cfg, d, log, ds, loader, val_loader, model, gpt, optimizer, prefetcher, ckpt, model_meta,
              tokens_per_step, gpt.flops_per_token(cfg.data.seq_len), peak_flops(d.device), Schedule.of(t))
    if d.layout.pp > 1:
        run.pipeline = build_pipeline(model, gpt, d.layout.grad_accum, d)
        if val_loader is not None:
            log.print("data.val_path: validation is not run under pipeline parallelism (train.pipeline_parallel > 1)")
            run.val_loader = None
    return run
