"""The ceiling: nanoGPT's `get_batch`, random windows straight from a flat uint16 `np.memmap`."""

from __future__ import annotations

import os

import numpy as np
import torch

from tools.peers.common import B, W, SEED, Ctx

SETTINGS = ("get_batch",)


def prepare(ctx: Ctx) -> None:  # the flat file is written by bench_loader.py itself
    assert os.path.exists(ctx.bin)


def describe(setting: str, workers: int) -> str:
    return "nanoGPT get_batch: 8 random offsets, np.stack of memmap slices, astype int64 (in-process only)"


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return os.path.getsize(ctx.bin)


def make(ctx: Ctx, setting: str, workers: int):
    if workers:
        raise ValueError("get_batch runs in the training process")
    data = np.memmap(ctx.bin, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(SEED)

    def batches():
        while True:
            ix = rng.integers(0, len(data) - W, B)
            yield torch.from_numpy(np.stack([data[i:i + W].astype(np.int64) for i in ix]))

    return batches()
