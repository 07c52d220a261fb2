"""WebDataset over S3 for `tools/bench_remote.py`: one gzip tar shard per dataflow shard (`<key>.tokens.npy`, the
benchmark's windows; gzip is the compression WebDataset reads), streamed with its own `http://` gopen (curl)
from presigned URLs of the objects through the proxy (how curl reads a private bucket), `shardshuffle` over
the shards + `shuffle(1000)`, `.batched(8)`, `WebLoader`. It caches nothing and has no resume ("n/a").
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from tools.peers.remote_samples import BATCH, shard_paths, windows

PREFIX = "webdataset"
SEED = 0
BUFFER = 1000  # the sample shuffle buffer (tools/peers/webdataset_peer.py's)


def convert(work: str, out: str) -> str:
    import webdataset as wds

    os.makedirs(out, exist_ok=True)
    for s, path in enumerate(shard_paths(work)):
        with wds.TarWriter(os.path.join(out, f"shard-{s:06d}.tar.gz"), compress=True) as sink:
            for i, row in enumerate(windows(path)):
                sink.write({"__key__": f"{s:04d}-{i:07d}", "tokens.npy": np.array(row)})
    return f"gzip tar, one shard per dataflow shard; shuffle({BUFFER})"


def _to_int64(t):
    import torch

    return torch.from_numpy(t.astype(np.int64))


class Adapter:
    resumes = False
    same_cache_on_resume = True

    def __init__(self, spec: dict):
        import boto3
        import webdataset

        self.wds = webdataset  # imported before the clock
        self.workers, self.shards, self.bucket = spec["workers"], spec["shards"], spec["bucket"]
        self.client = boto3.client("s3", endpoint_url=spec["endpoint"], region_name="us-east-1")

    def make(self, cache: str) -> Any:
        wds = self.wds
        urls = [self.client.generate_presigned_url("get_object", ExpiresIn=3600, Params={
            "Bucket": self.bucket, "Key": f"{PREFIX}/shard-{s:06d}.tar.gz"}) for s in range(self.shards)]
        ds = (wds.WebDataset(urls, shardshuffle=len(urls), seed=SEED).shuffle(BUFFER).decode()
              .to_tuple("tokens.npy").map_tuple(_to_int64).batched(BATCH, partial=False))
        return wds.WebLoader(ds, batch_size=None, num_workers=self.workers)

    def windows(self, batch: Any) -> np.ndarray:
        return batch[0].numpy()

    def close(self, loader: Any) -> None:
        del loader
