"""torchdata's StatefulDataLoader over a map-style dataset of memmap windows (shuffle=True)."""

from __future__ import annotations

import os

import numpy as np
import torch

from tools.peers.common import B, L, W, SEED, Ctx, n_windows


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


SETTINGS = ("memmap",)


def prepare(ctx: Ctx) -> None:
    assert os.path.exists(ctx.bin)


def describe(setting: str, workers: int) -> str:
    return f"StatefulDataLoader(map-style memmap windows, batch_size=8, shuffle=True, num_workers={workers})"


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return os.path.getsize(ctx.bin)


def make(ctx: Ctx, setting: str, workers: int):
    from torchdata.stateful_dataloader import StatefulDataLoader

    return StatefulDataLoader(MemmapWindows(ctx.bin), batch_size=B, shuffle=True, num_workers=workers,
                              generator=torch.Generator().manual_seed(SEED))
