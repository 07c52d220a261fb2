"""The bundled trainer as a `dataflow profile --config X.toml` target (the `dataflow.profile` entry point).

The profile then measures the loader `build_data` really builds (its shuffle window, document
masking, pinning) against this trainer's real model step: forward, backward and an AdamW step of the
config's GPT, in one process.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from dataflow.profiling.consumers import Consumer, ProfileTarget
from trainer.config import Config, load_config
from trainer.loop import build_data
from trainer.model import GPT
from trainer.parallelize import Dist


def target(config_path: str) -> ProfileTarget:
    """What `dataflow profile` needs from the config at `config_path` (data.path may stay empty)."""
    cfg = load_config(config_path, check=False)
    d = cfg.data
    defaults = {"data": d.path or None, "batch_size": d.batch_size, "seq_len": d.seq_len,
                "num_workers": d.num_workers, "depth": d.prefetch_depth, "seed": cfg.train.seed,
                "shuffle_window": d.shuffle_window,
                "device": None if cfg.train.device == "auto" else cfg.train.device}

    def make_loader(s: Any, **loader_options: Any) -> Any:
        data = dataclasses.replace(cfg.data, path=s.data, batch_size=s.batch_size, seq_len=s.seq_len,
                                   num_workers=s.num_workers, val_path="",
                                   shuffle_window=s.shuffle_window or cfg.data.shuffle_window)
        run = dataclasses.replace(cfg, data=data, train=dataclasses.replace(cfg.train, seed=s.seed))
        _, loader, _ = build_data(run, Dist(device=torch.device(s.device)), **loader_options)
        return loader

    return ProfileTarget(defaults, make_loader, lambda vocab, seq_len, device: model_step(cfg, vocab, seq_len, device))


def model_step(cfg: Config, vocab_size: int, seq_len: int, device: str) -> Consumer:
    """Forward, backward and optimizer step of the trainer's GPT (the config's [model]) on `device`."""
    dev = torch.device(device)
    model = GPT(cfg.model, vocab_size, seq_len).to(dev)
    model.init_weights(cfg.train.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.train.lr)
    bf16 = cfg.train.precision == "bf16"
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
