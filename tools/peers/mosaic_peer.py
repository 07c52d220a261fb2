"""MosaicML Streaming: `MDSWriter` (fixed-shape uint16 ndarray column, uncompressed) + `StreamingDataset` from a local
folder (shuffle=True), int64 per sample, torch DataLoader.

Streaming 0.13 pins numpy<2.2 and pulls transformers, cloud SDKs and a torchvision built for another torch; it is
installed with --no-deps plus the few packages it imports (tools/peers/requirements-nodeps.txt). Its package
imports modules this benchmark never runs: torchvision (streaming.vision) and transformers (streaming.text,
and two isinstance checks in its DataLoader subclass, which is not used here). They are stubbed in sys.modules in
this benchmark process only.
"""

from __future__ import annotations

import shutil

import numpy as np

from tools.peers.common import B, W, SEED, Ctx, dir_bytes, done, mark_done, stub_modules, windows

SETTINGS = ("mds",)
PREDOWNLOAD = 8 * 64  # samples prepared ahead per worker (default 8 * batch_size = 64): a fairer, larger setting


def _import():
    class _Unused:
        def __init__(self, *a, **k):
            raise RuntimeError("stubbed for the benchmark")

    stub_modules({
        "torchvision": {}, "torchvision.datasets": {"VisionDataset": _Unused, "CIFAR10": _Unused},
        "torchvision.transforms": {}, "torchvision.transforms.functional": {"to_tensor": None},
        "transformers": {}, "transformers.feature_extraction_utils": {"BatchFeature": _Unused},
        "transformers.tokenization_utils_base": {"BatchEncoding": _Unused},
        "transformers.models": {}, "transformers.models.auto": {},
        "transformers.models.auto.tokenization_auto": {"AutoTokenizer": _Unused},
    })
    import streaming

    return streaming


def prepare(ctx: Ctx) -> None:
    out = ctx.path("mosaic")
    if done(out):
        return
    shutil.rmtree(out, ignore_errors=True)
    streaming = _import()
    with streaming.MDSWriter(out=out, columns={"tokens": f"ndarray:uint16:{W}"}, compression=None,
                             size_limit="64mb") as w:
        for _, win in windows(ctx.bin):
            w.write({"tokens": win})
    mark_done(out)


def describe(setting: str, workers: int) -> str:
    return (f"MDS, uncompressed, 64 MB shards; StreamingDataset(local, shuffle=True, shuffle_seed=0, batch_size=8, "
            f"predownload={PREDOWNLOAD}), int64 per sample; torch DataLoader(batch_size=8, num_workers={workers}); "
            f"torchvision/transformers stubbed (unused)")


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return dir_bytes(ctx.path("mosaic"))


def make(ctx: Ctx, setting: str, workers: int):
    import torch

    streaming = _import()
    streaming.base.util.clean_stale_shared_memory()

    class Int64Tokens(streaming.StreamingDataset):
        def __getitem__(self, index):
            return torch.from_numpy(super().__getitem__(index)["tokens"].astype(np.int64))

    ds = Int64Tokens(local=ctx.path("mosaic"), shuffle=True, shuffle_seed=SEED, batch_size=B, predownload=PREDOWNLOAD)
    return torch.utils.data.DataLoader(ds, batch_size=B, num_workers=workers)
