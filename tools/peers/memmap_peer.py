"""The ceiling, nanoGPT's `get_batch` (random windows straight from a flat uint16 `np.memmap`), and the plain
torch `DataLoader` over the same memmap windows: what most training scripts with workers do."""

from __future__ import annotations

import os

import numpy as np
import torch

from tools.peers.common import B, L, W, SEED, Ctx, n_windows

SETTINGS = ("get_batch", "dataloader")


class MemmapWindows(torch.utils.data.Dataset):
    """Window i = tokens [i*L, i*L + L + 1) of the flat file, as int64; the memmap opens in each worker."""

    def __init__(self, path: str):
        self.path, self.data, self.n = path, None, n_windows(path)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.data is None:
            self.data = np.memmap(self.path, dtype=np.uint16, mode="r")
        return torch.from_numpy(self.data[i * L:i * L + W].astype(np.int64))


def prepare(ctx: Ctx) -> None:  # the flat file is written by bench_loader.py itself
    assert os.path.exists(ctx.bin)


def describe(setting: str, workers: int) -> str:
    if setting == "dataloader":
        return f"torch DataLoader(map-style memmap windows, batch_size=8, shuffle=True, num_workers={workers})"
    return "nanoGPT get_batch: 8 random offsets, np.stack of memmap slices, astype int64 (in-process only)"


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return os.path.getsize(ctx.bin)


def make(ctx: Ctx, setting: str, workers: int):
    if setting == "dataloader":
        return torch.utils.data.DataLoader(MemmapWindows(ctx.bin), batch_size=B, shuffle=True, num_workers=workers,
                                           generator=torch.Generator().manual_seed(SEED))
    if workers:
        raise ValueError("get_batch runs in the training process")
    data = np.memmap(ctx.bin, dtype=np.uint16, mode="r")
    rng = np.random.default_rng(SEED)

    def batches():
        while True:
            ix = rng.integers(0, len(data) - W, B)
            yield torch.from_numpy(np.stack([data[i:i + W].astype(np.int64) for i in ix]))

    return batches()
