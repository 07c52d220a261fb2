"""Reading whole documents back out of a dataset, whatever its shard format."""

from __future__ import annotations

import os
from typing import Iterator

import fsspec
import numpy as np

from dataflow.formats.arrow import ArrowShard
from dataflow.formats.manifest import Manifest, ShardInfo
from dataflow.formats.tar import iter_tar_documents


def iter_shard_documents(path: str, manifest: Manifest) -> Iterator[tuple[str, np.ndarray]]:
    """(id, tokens) of every document of one local shard, in stored order."""
    if manifest.format == "arrow":
        yield from ArrowShard(path).documents()
    else:
        with fsspec.open(path, "rb") as f:
            yield from iter_tar_documents(f, path, compressed=path.endswith(".zst"))


def iter_documents(dataset: str, manifest: Manifest,
                   shards: list[ShardInfo] | None = None) -> Iterator[tuple[str, np.ndarray]]:
    """(id, tokens) of every document of a local dataset, shard by shard, in stored order."""
    for shard in manifest.shards if shards is None else shards:
        yield from iter_shard_documents(os.path.join(dataset, shard.path), manifest)
