"""LitData over S3 for `tools/bench_remote.py`: `litdata.optimize(item_loader=TokensLoader(), compression="zstd")`
of the benchmark's windows laid end to end (so its blocks of 2049 tokens are exactly those windows), one chunk
per dataflow shard; `StreamingDataset("s3://...", cache_dir=cache,
item_loader=TokensLoader(block_size=2049), shuffle=True, storage_options={"endpoint_url": proxy})` and its
`StreamingDataLoader`, which resumes from `state_dict()` (LitGPT's pretraining recipe, read remotely).

Its chunk GETs go through obstore, which refuses a plain-http endpoint unless told `allow_http`, and LitData
passes no option of ours to it: the one change to LitData here adds `allow_http` to its obstore client
options (in this benchmark process only), so that it reads the local server the way it reads S3.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tools.peers.remote_samples import BATCH, W, shard_paths, windows

PREFIX = "litdata"
SEED = 0


def _shard(path: str):
    import torch

    yield torch.from_numpy(np.ascontiguousarray(windows(path)).reshape(-1))  # one item: the shard's windows, uint16


def convert(work: str, out: str) -> str:
    """One chunk per dataflow shard: an item is one shard's windows end to end, a chunk holds the largest."""
    from litdata import TokensLoader, optimize

    paths = shard_paths(work)
    per_chunk = max(len(windows(p)) for p in paths)
    optimize(fn=_shard, inputs=paths, output_dir=out, chunk_size=W * per_chunk, item_loader=TokensLoader(),
             compression="zstd", compression_level="chunk", num_workers=1, reorder_files=False, verbose=False)
    return "optimize(TokensLoader(), compression='zstd' of whole chunks), one chunk per dataflow shard"


class Adapter:
    resumes = True
    same_cache_on_resume = True  # its state names the cache folder

    def __init__(self, spec: dict):
        import litdata
        from litdata.streaming import downloader

        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

        class Int64Tokens(litdata.StreamingDataset):
            def __getitem__(self, index):
                return super().__getitem__(index).long()

        self.litdata, self.dataset = litdata, Int64Tokens  # imported before the clock
        self.workers, self.endpoint = spec["workers"], spec["endpoint"]
        self.url = f"s3://{spec['bucket']}/{PREFIX}"

    def make(self, cache: str) -> Any:
        ds = self.dataset(self.url, cache_dir=cache, item_loader=self.litdata.TokensLoader(block_size=W), shuffle=True,
                          seed=SEED, storage_options={"endpoint_url": self.endpoint})
        return self.litdata.StreamingDataLoader(ds, batch_size=BATCH, num_workers=self.workers)

    def windows(self, batch: Any) -> np.ndarray:
        return batch.numpy()

    def state_dict(self, loader: Any) -> Any:
        return loader.state_dict()

    def load_state_dict(self, loader: Any, state: Any) -> None:
        loader.load_state_dict(state)

    def close(self, loader: Any) -> None:
        del loader
