"""torchdata's StatefulDataLoader over a map-style dataset of memmap windows (shuffle=True)."""

from __future__ import annotations

import os

import torch

from tools.peers.common import B, SEED, Ctx
from tools.peers.memmap_peer import MemmapWindows


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
