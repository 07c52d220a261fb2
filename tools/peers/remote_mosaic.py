"""MosaicML Streaming over S3 for `tools/bench_remote.py`: MDS shards (as many as dataflow's, zstd: Mosaic's
compression of a whole shard file) written from the benchmark's windows; `StreamingDataset(remote="s3://...",
local=cache, shuffle=True, batch_size=8)` (its defaults otherwise) and its `StreamingDataLoader`, which resumes
from `state_dict()`. Its S3 client takes the endpoint from `S3_ENDPOINT_URL` (the proxy on 127.0.0.1).

Imported the way tools/peers/mosaic_peer.py imports it (torchvision and transformers stubbed: unused).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tools.peers.mosaic_peer import _import
from tools.peers.remote_samples import BATCH, W, shard_paths, windows

PREFIX = "mosaic"
SEED = 0


def convert(work: str, out: str) -> str:
    """MDS shards of the benchmark's windows, as many as dataflow's (each holds as many windows as dataflow's
    largest shard: a size limit of that many samples), zstd-compressed."""
    streaming = _import()
    paths = shard_paths(work)
    per_shard = max(len(windows(p)) for p in paths)
    sample = W * 2 + 4  # its bytes and its offset in the shard's header
    with streaming.MDSWriter(out=out, columns={"tokens": f"ndarray:uint16:{W}"}, compression="zstd",
                             size_limit=per_shard * sample + sample // 2) as writer:
        for path in paths:
            for row in windows(path):
                writer.write({"tokens": np.array(row)})
    return f"MDS, zstd (whole shard), {per_shard} windows a shard"


class Adapter:
    resumes = True
    same_cache_on_resume = False

    def __init__(self, spec: dict):
        import torch

        os.environ["S3_ENDPOINT_URL"] = spec["endpoint"]
        streaming = _import()

        class Int64Tokens(streaming.StreamingDataset):
            def __getitem__(self, index):
                return torch.from_numpy(super().__getitem__(index)["tokens"].astype(np.int64))

        self.streaming, self.dataset = streaming, Int64Tokens  # imported before the clock
        self.workers, self.remote = spec["workers"], f"s3://{spec['bucket']}/{PREFIX}"

    def make(self, cache: str) -> Any:
        self.streaming.base.util.clean_stale_shared_memory()
        ds = self.dataset(remote=self.remote, local=cache, shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
        return self.streaming.StreamingDataLoader(ds, batch_size=BATCH, num_workers=self.workers)

    def windows(self, batch: Any) -> np.ndarray:
        return batch.numpy()

    def state_dict(self, loader: Any) -> Any:
        return loader.state_dict()

    def load_state_dict(self, loader: Any, state: Any) -> None:
        loader.load_state_dict(state)

    def close(self, loader: Any) -> None:
        loader._iterator = None  # its workers end with the epoch; drop the dataset's shared memory with it
        del loader
