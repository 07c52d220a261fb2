"""Hugging Face datasets: windows saved as Arrow (`save_to_disk`), read back memory-mapped (`load_from_disk`) in
torch format; map-style through torch's DataLoader(shuffle=True), and `to_iterable_dataset().shuffle(1000)`."""

from __future__ import annotations

import shutil

from tools.peers.common import B, W, SEED, Ctx, dir_bytes, done, mark_done, windows

SETTINGS = ("map", "iterable")
SHARDS = 64  # to_iterable_dataset(num_shards=...): shards are shuffled and split between workers


def prepare(ctx: Ctx) -> None:
    out = ctx.path("hf-datasets")
    if done(out):
        return
    shutil.rmtree(out, ignore_errors=True)
    import datasets

    seq = getattr(datasets, "List", None) or datasets.Sequence
    features = datasets.Features({"input_ids": seq(datasets.Value("uint16"), length=W)})
    ds = datasets.Dataset.from_generator(lambda: ({"input_ids": w} for _, w in windows(ctx.bin)), features=features,
                                         cache_dir=ctx.path("hf-cache"))
    ds.save_to_disk(out, max_shard_size="64MB")
    shutil.rmtree(ctx.path("hf-cache"), ignore_errors=True)
    mark_done(out)


def describe(setting: str, workers: int) -> str:
    if setting == "map":
        return (f"load_from_disk (uint16 fixed-length lists).with_format('torch'); torch DataLoader(batch_size=8, "
                f"shuffle=True, num_workers={workers})")
    return (f"load_from_disk.to_iterable_dataset(num_shards={SHARDS}).shuffle(seed=0, buffer_size=1000)"
            f".with_format('torch'); torch DataLoader(batch_size=8, num_workers={workers})")


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return dir_bytes(ctx.path("hf-datasets"))


def make(ctx: Ctx, setting: str, workers: int):
    import datasets
    import torch

    ds = datasets.load_from_disk(ctx.path("hf-datasets"))
    if setting == "map":
        return torch.utils.data.DataLoader(ds.with_format("torch"), batch_size=B, shuffle=True, num_workers=workers,
                                           generator=torch.Generator().manual_seed(SEED))
    it = ds.to_iterable_dataset(num_shards=SHARDS).shuffle(seed=SEED, buffer_size=1000).with_format("torch")
    return torch.utils.data.DataLoader(it, batch_size=B, num_workers=workers)
