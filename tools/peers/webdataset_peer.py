"""WebDataset: tar shards of windows (`<key>.tokens.npy`), `shardshuffle` + `shuffle(1000)`, `WebLoader`."""

from __future__ import annotations

import glob
import os
import shutil

import numpy as np

from tools.peers.common import B, Ctx, dir_bytes, done, mark_done, windows

SETTINGS = ("tar",)
PER_SHARD = 1000  # windows per tar shard (~4 MB): enough shards for shard shuffling and 2 workers


def prepare(ctx: Ctx) -> None:
    out = ctx.path("webdataset")
    if done(out):
        return
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    import webdataset as wds

    with wds.ShardWriter(os.path.join(out, "shard-%06d.tar"), maxcount=PER_SHARD, verbose=0) as sink:
        for i, w in windows(ctx.bin):
            sink.write({"__key__": f"{i:09d}", "tokens.npy": w})
    mark_done(out)


def describe(setting: str, workers: int) -> str:
    return (f"uncompressed tar shards of {PER_SHARD} windows (uint16 .npy); WebDataset(shardshuffle=True)"
            f".shuffle(1000).decode() -> int64, .batched(8); WebLoader(batch_size=None, num_workers={workers})")


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return dir_bytes(ctx.path("webdataset"))


def _to_int64(t):
    import torch

    return torch.from_numpy(t.astype(np.int64))


def make(ctx: Ctx, setting: str, workers: int):
    import webdataset as wds

    urls = sorted(glob.glob(os.path.join(ctx.path("webdataset"), "shard-*.tar")))
    ds = (wds.WebDataset(urls, shardshuffle=True, seed=0).shuffle(1000).decode()
          .to_tuple("tokens.npy").map_tuple(_to_int64).batched(B, partial=False))
    return wds.WebLoader(ds, batch_size=None, num_workers=workers)
