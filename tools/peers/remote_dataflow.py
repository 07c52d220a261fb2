"""dataflow over S3 for `tools/bench_remote.py`: `StreamingDataset("s3://...", seq_len=2048, seed=1,
shuffle_window, cache_dir, cache_limit, storage_options={endpoint: proxy})` and `StreamingDataLoader(batch_size=8)`,
from this checkout or, with `spec["src"]`, another one (the baseline)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from tools.peers.remote_samples import BATCH, SEQ

PREFIX = "ds"


class Adapter:
    resumes = True
    same_cache_on_resume = False

    def __init__(self, spec: dict):
        if spec.get("src"):
            sys.path.insert(0, spec["src"])  # before this checkout: its dataflow is imported
        from dataflow import StreamingDataLoader, StreamingDataset  # imported (torch with them) before the clock

        self.dataset, self.loader = StreamingDataset, StreamingDataLoader
        self.spec, self.url = spec, f"s3://{spec['bucket']}/{PREFIX}"

    def make(self, cache: str) -> Any:
        s = self.spec
        opts = {"client_kwargs": {"endpoint_url": s["endpoint"]}}
        ds = self.dataset(self.url, seq_len=SEQ, seed=1, shuffle_window=s["window"], cache_dir=cache,
                          cache_limit=s["limit"], storage_options=opts)
        return self.loader(ds, batch_size=BATCH, num_workers=s["workers"])

    def windows(self, batch: Any) -> np.ndarray:
        ids, labels = batch["input_ids"].numpy(), batch["labels"].numpy()
        return np.concatenate([ids, labels[:, -1:]], axis=1)

    def state_dict(self, loader: Any) -> Any:
        return loader.state_dict()

    def load_state_dict(self, loader: Any, state: Any) -> None:
        loader.load_state_dict(state)

    def close(self, loader: Any) -> None:
        loader.close()
